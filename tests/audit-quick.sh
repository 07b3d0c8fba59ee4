#!/bin/sh
# audit-quick.sh - the quick audit for `make check`: exit status 0 when
# every row matches, 1 on a mismatch (the status is the test's).
#
# Its report as docs/tool.md describes it: by default the backends line and
# one line per backend and strategy (no row per case: the full audit once
# printed 1,700 lines), the rounding-ties note and the summary last;
# --verbose adds every row of every case. The JSON form of the same run is
# checked in tests/tool-json.sh.
. "$(dirname "$0")/tool-lib.sh"

timeout 600 "$tool" audit --quick >"$tmp/out" 2>"$tmp/err"
rc=$?
cat "$tmp/out" "$tmp/err"
if [ "$rc" != 0 ]; then
    echo "FAIL: beammoe audit --quick: exit $rc"
    exit "$rc"
fi

grep -q '^backends: cpu' "$tmp/out"
check "the backends line"
grep -q '^backend  *strategy  *cases  *compared  *mismatch  *maxulp$' "$tmp/out" &&
    grep -q '^cpu  *reference  *[0-9][0-9]*  *[0-9][0-9]*  *0  *0$' "$tmp/out"
check "the table per backend and strategy, with the CPU against the reference"
lines=$(wc -l <"$tmp/out")
! grep -q '^case ' "$tmp/out" && [ "$lines" -lt 60 ]
check "no row per case by default ($lines lines)"
grep -q '^rounding ties: [0-9]* results of the naive reference' "$tmp/out"
check "the rounding ties are explained"
tail -1 "$tmp/out" | grep -q '^summary: [0-9]* cases, [0-9]* rows, .*: PASS$'
check "the summary is the last line"
cases=$(sed -n 's/^summary: \([0-9]*\) cases.*/\1/p' "$tmp/out")
# a host without the CUDA backend says so in plain words, never in the
# CUDA runtime's ("driver version is insufficient" on a host with no GPU)
! grep -q 'insufficient' "$tmp/out"
check "no CUDA runtime jargon in the backends lines"

timeout 600 "$tool" audit --quick --verbose >"$tmp/verbose" 2>&1
[ $? = 0 ] && grep -q '^case  *backend  *strategy' "$tmp/verbose" &&
    [ "$(grep -c '  cpu  *reference  ' "$tmp/verbose")" = "$cases" ] &&
    grep -q "^cpu  *reference  *$cases " "$tmp/verbose"
check "--verbose: a row per case ($cases reference rows) and the same table"
rows=$(sed -n 's/^summary: [0-9]* cases, \([0-9]*\) rows.*/\1/p' "$tmp/out")
n=$(grep -c '  \(cpu\|cuda\)  *[a-z0-9=+/-]' "$tmp/verbose")
[ -n "$rows" ] && [ "$n" -ge "$rows" ]
check "--verbose: every one of the $rows rows is shown ($n lines)"

finish
