#!/bin/sh
# tool-signals.sh - a signal that ends `beammoe run --output F` while it
# writes F leaves nothing behind: no temporary file (.F.XXXXXX beside F),
# F as it was, and the tool's exit status is the signal's (128 + its
# number), so the caller still sees how it died.
#
# The tool writes a large case (about 85 MB); as soon as its temporary file
# appears the test stops it (SIGSTOP), sends the signal and lets it go on
# (SIGCONT), so the signal always lands while the file exists. SIGQUIT and
# SIGPIPE once left the file behind (only SIGINT, SIGTERM and SIGHUP were
# caught). A signal the caller ignores stays ignored: the run finishes. The tool starts with every signal at its default action (env
# --default-signal): a background job of a script would otherwise start
# with SIGINT and SIGQUIT ignored, which the tool respects.
# Exit 77 (skip) when the tool was built without json-c.
. "$(dirname "$0")/tool-lib.sh"
BIG="run --iters 1 --tokens 1024 --top-k 8 --hidden 4096 --post-norm --next-norm"

need_json_c run --iters 1 --tokens 1 --top-k 1 --hidden 256 --output "$tmp/probe.safetensors"
rm -f "$tmp/probe.safetensors"
if ! env --default-signal true 2>/dev/null; then
    echo "SKIP: this env has no --default-signal (coreutils 8.31 or later)"
    exit 77
fi

# temp DIR: the temporary file beside DIR/F, or nothing
temp() {
    for f in "$1"/.F.*; do
        [ -e "$f" ] && { echo "$f"; return 0; }
    done
    return 1
}

# one SIG NUM [ignored]: signal SIG (number NUM) while the temporary file
# exists; "ignored": the caller ignores SIG (nohup), so the run must finish
one() {
    sig=$1 num=$2 how=${3:-}
    d="$tmp/$sig$how"
    mkdir -p "$d"
    printf 'the previous F: it must survive\n' >"$d/F"
    cp "$d/F" "$tmp/keep"
    (
        ulimit -c 0 # SIGQUIT's default action dumps core
        if [ "$how" = ignored ]; then
            exec env --default-signal --ignore-signal="$sig" "$tool" $BIG --output "$d/F" \
                >/dev/null 2>"$d.err"
        fi
        exec env --default-signal "$tool" $BIG --output "$d/F" >/dev/null 2>"$d.err"
    ) &
    pid=$!
    # wait for the temporary file (busy, no process per try): at most 60 s
    found=""
    t0=$(date +%s)
    while [ -z "$found" ]; do
        found=$(temp "$d") && break
        kill -0 "$pid" 2>/dev/null || break
        [ $(($(date +%s) - t0)) -gt 60 ] && break
    done
    if [ -z "$found" ]; then
        kill -KILL "$pid" 2>/dev/null
        wait "$pid"
        fail "SIG$sig: the temporary file never appeared (the run ended or took over 60 s)"
        sed 's/^/    /' "$d.err" | head -3
        return
    fi
    kill -STOP "$pid"
    kill -"$sig" "$pid"
    kill -CONT "$pid"
    wait "$pid"
    rc=$?
    left=$(ls -A "$d" | tr '\n' ' ')
    if [ "$how" = ignored ]; then
        [ "$rc" = 0 ] && [ "$left" = "F " ] && "$tool" audit --quick --input "$d/F" >/dev/null 2>&1
        check "SIG$sig ignored by the caller: the run finished (exit $rc), F written and audits clean ($left)"
        return
    fi
    if [ "$rc" != $((128 + num)) ]; then
        fail "SIG$sig while writing: exit $rc, expected $((128 + num)) (killed by SIG$sig)"
    elif [ "$left" != "F " ]; then
        fail "SIG$sig while writing left files behind: $left"
    elif ! cmp -s "$d/F" "$tmp/keep"; then
        fail "SIG$sig while writing changed the previous F"
    else
        pass "SIG$sig while writing: exit $rc, no temporary file, F as it was"
    fi
}

one HUP 1
one INT 2
one QUIT 3
one PIPE 13
one TERM 15
one USR1 10
one ALRM 14
one HUP 1 ignored

finish
