#!/bin/sh
# input-special.sh - `beammoe audit --input PATH` on what is not a regular
# file: exit status 2 with "not a regular file (a FIFO)" and the like, at
# once. A FIFO with no writer once blocked the tool forever (it opened the
# path before it checked what it was); every run here is under `timeout`, so
# a hang is a failure, not a stuck suite.
# Exit 77 (skip) when the tool was built without json-c.
. "$(dirname "$0")/tool-lib.sh"
need_json_c audit --input "$tmp/none.safetensors"
limit=10 # seconds: the tool refuses these at once

mkfifo "$tmp/fifo"
expect_input 2 "$tmp/fifo" "not a regular file (a FIFO)"
ln -s fifo "$tmp/fifo-link"
expect_input 2 "$tmp/fifo-link" "not a regular file (a FIFO)"
expect_input 2 "$tmp" "not a regular file (a directory)"
if [ -c /dev/null ]; then expect_input 2 /dev/null "not a regular file (a character device)"; fi
expect_input 2 "$tmp/absent.safetensors" "cannot open: No such file or directory"
# the FIFO is still a FIFO, and nothing was written into the folder
left=$(ls -A "$tmp" | sort | tr '\n' ' ')
[ -p "$tmp/fifo" ] && [ "$left" = "err fifo fifo-link out probe.err " ]
check "the FIFO and its folder are as they were (the folder holds: $left)"

finish
