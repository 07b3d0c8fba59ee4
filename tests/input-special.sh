#!/bin/sh
# input-special.sh - `beammoe audit --input PATH` on what is not a regular
# file: exit status 2 with "not a regular file (a FIFO)" and the like, at
# once. A FIFO with no writer once blocked the tool forever (it opened the
# path before it checked what it was); every run here is under `timeout`, so
# a hang is a failure, not a stuck suite.
# Exit 77 (skip) when the tool was built without json-c.
. "$(dirname "$0")/tool-lib.sh"
need_json_c audit --input "$tmp/none.safetensors"

# expect PATH WORDS: audit --input PATH exits 2 within 10 s, stderr has WORDS
expect() {
    path=$1 words=$2
    timeout 10 "$tool" audit --quick --input "$path" >/dev/null 2>"$tmp/err"
    rc=$?
    if [ "$rc" = 124 ]; then
        fail "audit --input $path: still running after 10 s (a hang)"
    elif [ "$rc" != 2 ] || ! grep -q -- "$words" "$tmp/err"; then
        fail "audit --input $path: exit $rc (expected 2 with '$words'):"
    else
        pass "$(head -1 "$tmp/err")"
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
left=$(ls -A "$tmp" | sort | tr '\n' ' ')
[ -p "$tmp/fifo" ] && [ "$left" = "err fifo fifo-link probe.err " ]
check "the FIFO and its folder are as they were (the folder holds: $left)"

finish
