#!/bin/sh
# run-errors.sh - `beammoe run` with bad sizes: the library's message and
# exit status 1, never a crash (negative --hidden/--top-k once made the
# input generator run past its buffers). Usage errors are exit status 2.
tool="${builddir:-.}/tools/beammoe"
fail=0

# expect STATUS WORD ARGS...: exit status STATUS and WORD in stderr
expect() {
    want=$1 word=$2
    shift 2
    err=$("$tool" run --iters 1 "$@" 2>&1 >/dev/null)
    got=$?
    if [ "$got" != "$want" ] || ! printf '%s\n' "$err" | grep -q -- "$word"; then
        echo "FAIL: beammoe run $*: exit $got (want $want), stderr: $err"
        fail=1
    else
        echo "ok: beammoe run $*: exit $got"
    fi
}

expect 1 hidden --tokens 4 --top-k 2 --hidden -256
expect 1 hidden --tokens 4 --op nrn --hidden -512
expect 1 hidden --tokens 4 --top-k 2 --hidden 300
expect 1 top_k --tokens 4 --top-k -3 --hidden 256
expect 1 top_k --tokens 4 --top-k 33 --hidden 256
expect 1 live_tokens --tokens -5 --top-k 2 --hidden 256
expect 1 routed_scale --tokens 4 --top-k 2 --hidden 256 --routed-scale inf
expect 1 eps --tokens 4 --top-k 2 --hidden 256 --next-norm --eps -1
expect 2 --top-k --tokens 4 --hidden 256
expect 2 --iters --tokens 4 --top-k 2 --hidden 256 --iters 0
exit $fail
