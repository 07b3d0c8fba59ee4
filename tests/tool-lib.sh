# tool-lib.sh - what the shell tests of the `beammoe` tool share; sourced,
# never run: . "$(dirname "$0")/tool-lib.sh"
#   $tool      tools/beammoe of the build tree, as an absolute path
#   $tmp       a new folder (beammoe-<the test's name>.XXXXXX), removed on exit
#   checks, fails, and the helpers below that count and report each check
set -u
tool="${builddir:-.}/tools/beammoe"
case $tool in /*) ;; *) tool="$(pwd)/$tool" ;; esac
tmp=$(mktemp -d "${TMPDIR:-/tmp}/beammoe-${0##*/}.XXXXXX") || exit 99
# (a test may have taken the write permission away from a folder in $tmp)
trap 'chmod -R u+rwx "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT INT TERM
fails=0
checks=0

# pass WHAT, fail WHAT: one check passed or failed; a failure shows the
# start of $tmp/err, the last command's messages
pass() { checks=$((checks + 1)); echo "ok:   $1"; }
fail() {
    checks=$((checks + 1))
    fails=$((fails + 1))
    echo "FAIL: $1"
    [ -s "$tmp/err" ] && sed 's/^/    /' "$tmp/err" | head -5
    return 0
}

# check WHAT: pass or fail by the status of the command just before it
check() {
    if [ $? = 0 ]; then pass "$1"; else fail "$1"; fi
}

# need_json_c ARGS...: run the tool with ARGS; exit 77 (skip) when it says it
# was built without json-c, which the files it reads and writes need
need_json_c() {
    "$tool" "$@" >/dev/null 2>"$tmp/probe.err"
    if grep -q "built without json-c" "$tmp/probe.err"; then
        echo "SKIP: beammoe was built without json-c"
        exit 77
    fi
}

# expect_input CODE FILE [WORDS]: `audit --quick --input FILE` exits CODE
# within $limit seconds (default 60; a hang is a failure, not a stuck suite)
# and its messages hold WORDS
expect_input() {
    code=$1 file=$2 words=${3:-}
    timeout "${limit:-60}" "$tool" audit --quick --input "$file" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ "$rc" = 124 ]; then
        fail "audit --input $file: still running after ${limit:-60} s (a hang)"
    elif [ "$rc" != "$code" ]; then
        fail "${file##*/}: exit $rc, expected $code"
        tail -3 "$tmp/out" | sed 's/^/    /'
    elif [ -n "$words" ] && ! grep -q -- "$words" "$tmp/err"; then
        fail "${file##*/}: message lacks '$words':"
    else
        pass "${file##*/}: exit $rc $(head -1 "$tmp/err")"
    fi
}

# finish: the counts; the test's status is 0 when nothing failed
finish() {
    echo "$checks checks, $fails failed"
    [ "$fails" = 0 ]
}
