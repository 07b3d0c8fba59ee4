#!/bin/sh
# input-special.sh - `beammoe audit --input PATH` on what is not a regular
# file: exit status 2 with "not a regular file (a FIFO)" and the like, at
# once. A FIFO with no writer once blocked the tool forever (it opened the
# path before it checked what it was); every run here is under `timeout`, so
# a hang is a failure, not a stuck suite.
# Exit 77 (skip) when the tool was built without json-c.
set -u
tool="${builddir:-.}/tools/beammoe"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/beammoe-in-test.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM
fails=0
checks=0

"$tool" audit --input "$tmp/none.safetensors" >/dev/null 2>"$tmp/probe.err"
if grep -q "built without json-c" "$tmp/probe.err"; then
    echo "SKIP: beammoe was built without json-c"
    exit 77
fi

# expect PATH WORDS: audit --input PATH exits 2 within 10 s, stderr has WORDS
expect() {
    path=$1 words=$2
    checks=$((checks + 1))
    timeout 10 "$tool" audit --quick --input "$path" >/dev/null 2>"$tmp/err"
    rc=$?
    if [ "$rc" = 124 ]; then
        echo "FAIL: audit --input $path: still running after 10 s (a hang)"
        fails=$((fails + 1))
    elif [ "$rc" != 2 ] || ! grep -q -- "$words" "$tmp/err"; then
        echo "FAIL: audit --input $path: exit $rc (expected 2 with '$words'):"
        sed 's/^/    /' "$tmp/err" | head -3
        fails=$((fails + 1))
    else
        echo "ok:   $(head -1 "$tmp/err")"
    fi
}

mkfifo "$tmp/fifo"
expect "$tmp/fifo" "not a regular file (a FIFO)"
ln -s fifo "$tmp/fifo-link"
expect "$tmp/fifo-link" "not a regular file (a FIFO)"
expect "$tmp" "not a regular file (a directory)"
if [ -c /dev/null ]; then expect /dev/null "not a regular file (a character device)"; fi
expect "$tmp/absent.safetensors" "cannot open: No such file or directory"
# the FIFO is still a FIFO, and nothing was written into the folder
checks=$((checks + 1))
if [ -p "$tmp/fifo" ] && [ "$(ls -A "$tmp" | sort | tr '\n' ' ')" = "err fifo fifo-link probe.err " ]; then
    echo "ok:   the FIFO and its folder are as they were"
else
    echo "FAIL: the folder changed: $(ls -A "$tmp" | tr '\n' ' ')"
    fails=$((fails + 1))
fi

echo "$checks checks, $fails failed"
[ "$fails" = 0 ]
