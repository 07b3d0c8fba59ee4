#!/bin/sh
# output-safety.sh - `beammoe run --output PATH` never destroys what PATH
# names. The tool writes a new temporary file in PATH's folder and renames it
# onto PATH only when it is complete, so:
#   - a directory, a device, a FIFO, a dangling symbolic link, a read-only
#     file, a folder it may not write: exit status 2 at once, PATH untouched
#     (the tool once deleted an empty directory, unlinked a device, deleted a
#     read-only file, and waited forever on a FIFO);
#   - a write that fails half way (here: the file size limit) leaves the
#     user's file byte for byte as it was, and no temporary file behind;
#   - a symbolic link to a file replaces that file and keeps the link; a
#     replaced file keeps its permission bits; a new one gets 0666 & ~umask.
# Every command runs under `timeout`, so a hang is a failure, not a stuck
# suite. The read-only cases need a user other than root: as root they run
# as nobody through setpriv when it is there, else they are skipped.
# Exit 77 (skip) when the tool was built without json-c.
. "$(dirname "$0")/tool-lib.sh"
RUN="run --iters 1 --tokens 3 --top-k 2 --hidden 256"

# skip when built without json-c; this first run also lets libtool's
# wrapper finish any relinking before the size-limited run below
need_json_c $RUN --output "$tmp/probe.safetensors"
rm -f "$tmp/probe.safetensors"

# out CODE PATH: run --output PATH (under timeout) must exit CODE
out() {
    want=$1 path=$2
    timeout 10 "$tool" $RUN --output "$path" >/dev/null 2>"$tmp/err"
    got=$?
    if [ "$got" = 124 ]; then
        fail "--output $path: still running after 10 s (a hang)"
        return 1
    fi
    if [ "$got" != "$want" ]; then
        fail "--output $path: exit $got, expected $want"
        return 1
    fi
    return 0
}

# only DIR NAMES...: DIR holds exactly NAMES (no temporary file left behind)
only() {
    dir=$1
    shift
    have=$(ls -A "$dir" | sort | tr '\n' ' ')
    want=$(if [ $# -gt 0 ]; then printf '%s\n' "$@" | sort | tr '\n' ' '; fi)
    [ "$have" = "$want" ] || { echo "    $dir holds: $have (expected: $want)"; return 1; }
}

# ---- things that are not a regular file ----
d="$tmp/dir"
dnames="emptydir fifo dangling"
mkdir -p "$d/emptydir"
if out 2 "$d/emptydir"; then
    [ -d "$d/emptydir" ] && grep -q "a directory, not a regular file" "$tmp/err" &&
        only "$d" emptydir
    check "an empty directory as --output: exit 2, the directory is still there"
fi
if out 2 "$d/emptydir/"; then pass "a path ending in /: exit 2"; fi

mkfifo "$d/fifo"
if out 2 "$d/fifo"; then
    [ -p "$d/fifo" ] && grep -q "a FIFO" "$tmp/err"
    check "a FIFO as --output: exit 2 at once, the FIFO is still there"
fi

# a device that fails every write (/dev/full), under our own name when
# mknod is allowed, and through a symbolic link always
if mknod "$d/full" c 1 7 2>/dev/null; then
    dnames="$dnames full"
    if out 2 "$d/full"; then
        [ -c "$d/full" ] && grep -q "a character device" "$tmp/err"
        check "a character device as --output: exit 2, the device is still there"
    fi
else
    echo "note: mknod not allowed here; the device is tried through a link only"
fi
if [ -c /dev/full ]; then
    ln -s /dev/full "$d/full-link"
    dnames="$dnames full-link"
    if out 2 "$d/full-link"; then
        [ -L "$d/full-link" ] && [ "$(readlink "$d/full-link")" = /dev/full ] &&
            [ -c /dev/full ]
        check "a link to /dev/full as --output: exit 2, link and device untouched"
    fi
fi

ln -s "$d/nowhere/file" "$d/dangling"
if out 2 "$d/dangling"; then
    [ -L "$d/dangling" ] && [ ! -e "$d/nowhere" ]
    check "a dangling symbolic link as --output: exit 2, nothing created"
fi

if out 2 "$tmp/missing-folder/x.safetensors"; then
    [ ! -e "$tmp/missing-folder" ] && grep -q "No such file or directory" "$tmp/err"
    check "a path in a folder that does not exist: exit 2"
fi
# shellcheck disable=SC2086
only "$d" $dnames
check "no temporary file left beside the refused paths"

# ---- a write that fails half way: the user's file stays as it was ----
w="$tmp/write"
mkdir -p "$w" "$tmp/keep"
printf 'the user file: these bytes must survive a failed write\n' >"$w/precious.safetensors"
chmod 640 "$w/precious.safetensors"
cp -p "$w/precious.safetensors" "$tmp/keep/precious.safetensors"
# files of at most 1 KiB: the write (about 6.5 KiB) fails half way. With
# SIGXFSZ as it usually is (it would kill the tool: the tool ignores it
# while it writes, so write() fails with EFBIG) and with SIGXFSZ ignored by
# the caller. Not less than 1 KiB: LLVM's OpenMP runtime (clang builds)
# sizes a 1 KiB shared-memory file when it starts and dies when it cannot.
for how in default ignored; do
    (
        [ $how = ignored ] && trap '' XFSZ
        ulimit -f 2
        exec timeout 10 "$tool" $RUN --output "$w/precious.safetensors" >/dev/null 2>"$tmp/err"
    )
    got=$?
    if [ "$got" != 2 ] || ! grep -q "write error" "$tmp/err"; then
        fail "a write past the file size limit (SIGXFSZ $how): exit $got, expected 2 with 'write error'"
    elif ! cmp -s "$w/precious.safetensors" "$tmp/keep/precious.safetensors"; then
        fail "a failed write (SIGXFSZ $how) changed the user's file"
    elif [ "$(stat -c %a "$w/precious.safetensors")" != 640 ]; then
        fail "a failed write (SIGXFSZ $how) changed the user's file's mode"
    elif ! only "$w" precious.safetensors; then
        fail "a failed write (SIGXFSZ $how) left a temporary file behind"
    else
        pass "a failed write (SIGXFSZ $how): exit 2, the user's file byte-identical, no temporary file left"
    fi
    # the next case starts from the user's file as it was
    cp -p "$tmp/keep/precious.safetensors" "$w/precious.safetensors" 2>/dev/null
    rm -f "$w"/.precious.safetensors.*
done

# ---- what works: replace, create, through a link ----
chmod 604 "$w/precious.safetensors" 2>/dev/null
if out 0 "$w/precious.safetensors"; then
    [ "$(stat -c %a "$w/precious.safetensors")" = 604 ] &&
        "$tool" audit --quick --input "$w/precious.safetensors" >/dev/null 2>"$tmp/err" &&
        only "$w" precious.safetensors
    check "replacing a file: complete, audits clean, its mode 604 kept"
fi
( umask 027 && exec "$tool" $RUN --output "$w/new.safetensors" >/dev/null 2>"$tmp/err" )
[ $? = 0 ] && [ "$(stat -c %a "$w/new.safetensors")" = 640 ]
check "a new file under umask 027: exit 0, mode 640"
mkdir -p "$w/real"
: >"$w/real/target.safetensors"
ln -s real/target.safetensors "$w/link.safetensors"
if out 0 "$w/link.safetensors"; then
    [ -L "$w/link.safetensors" ] && [ -s "$w/real/target.safetensors" ] &&
        "$tool" audit --quick --input "$w/link.safetensors" >/dev/null 2>"$tmp/err" &&
        only "$w/real" target.safetensors
    check "a link to a file: the file is replaced, the link kept"
fi

# ---- a user who may not write: read-only file, read-only folder ----
as_user=""
if [ "$(id -u)" != 0 ]; then
    as_user=" "
elif command -v setpriv >/dev/null 2>&1 &&
    setpriv --reuid=65534 --regid=65534 --clear-groups "$tool" --version >/dev/null 2>&1; then
    as_user="setpriv --reuid=65534 --regid=65534 --clear-groups"
fi
if [ -n "$as_user" ]; then
    u="$tmp/user"
    mkdir -p "$u/ro-folder"
    printf 'read-only: the tool may not touch this\n' >"$u/ro.safetensors"
    cp "$u/ro.safetensors" "$tmp/keep/ro.safetensors"
    chmod 444 "$u/ro.safetensors"
    [ "$(id -u)" = 0 ] && chown -R 65534:65534 "$u"
    chmod 755 "$tmp"
    chmod 555 "$u/ro-folder"
fi
if [ -n "$as_user" ] && ! $as_user test -x "$u/ro-folder"; then
    echo "note: $u is out of reach of the other user (a private TMPDIR?)"
    as_user=""
fi
if [ -n "$as_user" ]; then
    $as_user timeout 10 "$tool" $RUN --output "$u/ro.safetensors" >/dev/null 2>"$tmp/err"
    got=$?
    [ "$got" = 2 ] && grep -q "Permission denied" "$tmp/err" &&
        cmp -s "$u/ro.safetensors" "$tmp/keep/ro.safetensors" && only "$u" ro-folder ro.safetensors
    check "a read-only file: exit $got, 2 expected (Permission denied), the file untouched"
    $as_user timeout 10 "$tool" $RUN --output "$u/ro-folder/x.safetensors" >/dev/null 2>"$tmp/err"
    got=$?
    [ "$got" = 2 ] && grep -q "Permission denied" "$tmp/err" && only "$u/ro-folder"
    check "a folder this user may not write: exit $got, 2 expected, nothing created"
else
    echo "note: the read-only file and folder cases need a user other than root (setpriv,"
    echo "      and a build tree and TMPDIR that user can reach): not run here"
fi

finish
