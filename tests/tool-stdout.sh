#!/bin/sh
# tool-stdout.sh - a write error on the standard output fails the tool.
#
# Every command of `beammoe` whose report cannot be written (stdout on a
# full device, /dev/full, or closed, >&-) must exit 1 with a message on
# stderr: a table or a checksum that never reached its reader is not a
# success. The tool once exited 0 there, with no message, for every command.
# With stdout closed it must also not let a file it opens take descriptor 1
# (`run --output F` would then print its report into F): it refuses before
# doing anything, so F is not created. A closed stderr is not an error (the
# caller asked for no messages): the run goes on and its status is kept.
. "$(dirname "$0")/tool-lib.sh"

# expect HOW CMD...: with stdout HOW (full: /dev/full, closed: >&-), exit 1
# and "write error" on stderr
expect() {
    how=$1
    shift
    case $how in
    full) timeout 120 "$tool" "$@" >/dev/full 2>"$tmp/err" ;;
    closed) timeout 120 "$tool" "$@" >&- 2>"$tmp/err" ;;
    esac
    rc=$?
    [ "$rc" = 1 ] && grep -q "write error on the standard output" "$tmp/err"
    check "beammoe $* (stdout $how): exit $rc, 1 expected with 'write error on the standard output'"
}

if [ ! -c /dev/full ]; then
    echo "note: no /dev/full here: only the closed stdout is tried"
fi
RUN="run --iters 1 --tokens 3 --top-k 2 --hidden 256"
for how in full closed; do
    [ $how = full ] && [ ! -c /dev/full ] && continue
    expect $how --version
    expect $how --help
    expect $how audit --help
    expect $how run --help
    expect $how bench --help
    expect $how $RUN
    expect $how $RUN --json
    expect $how audit --quick
    expect $how audit --quick --json
done

# an --input audit, and run --input: the report is the output
"$tool" $RUN --output "$tmp/case.safetensors" >/dev/null 2>"$tmp/err"
if [ $? = 0 ]; then
    [ -c /dev/full ] && expect full audit --input "$tmp/case.safetensors" --quick
    expect closed audit --input "$tmp/case.safetensors" --quick
    [ -c /dev/full ] && expect full run --iters 1 --input "$tmp/case.safetensors"
    expect closed run --iters 1 --input "$tmp/case.safetensors" --json
elif grep -q "built without json-c" "$tmp/err"; then
    echo "note: built without json-c: the --input and --output cases were not tried"
else
    fail "run --output"
fi

# stdout closed: nothing is done, so no file takes descriptor 1
if [ -s "$tmp/case.safetensors" ]; then
    expect closed $RUN --output "$tmp/new.safetensors"
    [ ! -e "$tmp/new.safetensors" ] && ! ls -A "$tmp" | grep -q '^\.new'
    check "run --output with stdout closed: nothing created"
fi

# usage errors keep their status (2): the report was never due
"$tool" run --bogus >/dev/full 2>"$tmp/err"
[ $? = 2 ]
check "a usage error with stdout on /dev/full: exit 2"

# stderr closed, stdout fine: done, exit 0
"$tool" $RUN >"$tmp/out" 2>&- && grep -q "^checksum:" "$tmp/out"
check "stderr closed: exit 0, the report written"

finish
