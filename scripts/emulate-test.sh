#!/bin/sh
# emulate-test.sh - run one test of a cross build under a user-mode emulator;
# the LOG_COMPILER of `make check` in scripts/cross-check.sh:
#
#   make check LOG_COMPILER=/path/to/scripts/emulate-test.sh
#
# Runs from the top build directory (make check does). Environment:
#   BEAM_EMULATOR   the emulator (default qemu-aarch64); it gets no options:
#                   set QEMU_LD_PREFIX and friends in the environment
#
# What a test is decides how it runs:
#   - a libtool wrapper script (a program linked to this tree's libraries):
#     libtool --mode=execute runs the real program (.libs/) under the
#     emulator with the uninstalled libraries on LD_LIBRARY_PATH;
#   - an ELF program (linked to no library of the tree): the emulator runs it;
#   - a shell script: it runs on this host, with builddir pointing at a
#     folder whose tools/beammoe runs the cross-built tool under the
#     emulator (the tools/*.sh tests call "${builddir:-.}/tools/beammoe");
#   - python/run-pytest.sh: skipped (77), a host python cannot load the
#     cross-built library.
# Programs that run themselves again (tests/test_dispatch) do it through
# BEAM_TEST_EXEC_WRAPPER, here the emulator: without binfmt_misc the host
# cannot execute a foreign program.
set -u
test $# -ge 1 || { echo "usage: $0 TEST [ARGS...]" >&2; exit 99; }
emu=${BEAM_EMULATOR:-qemu-aarch64}
command -v "$emu" >/dev/null 2>&1 || { echo "$0: emulator $emu not found" >&2; exit 99; }
top=$(pwd)
test -x "$top/libtool" || { echo "$0: run from the top build directory (no ./libtool)" >&2; exit 99; }
BEAM_TEST_EXEC_WRAPPER=$emu
export BEAM_TEST_EXEC_WRAPPER
# Every test on the smallest OpenMP stacks aarch64 allows (128 KiB): then
# tests/test_stack finds its setting in place and need not run itself again.
OMP_STACKSIZE=${OMP_STACKSIZE:-128K}
export OMP_STACKSIZE

t=$1
shift
case $t in
*/run-pytest.sh | run-pytest.sh)
    echo "$t: the Python suite loads the library into this host's python, which cannot load a cross-built one: skipped"
    exit 77 ;;
esac
if grep -q 'temporary wrapper script for' "$t" 2>/dev/null; then
    exec "$top/libtool" --mode=execute "$emu" "$t" "$@"
fi
if [ "$(head -c 4 "$t" | od -An -c | tr -d ' ')" = '177ELF' ]; then
    exec "$emu" "$t" "$@"
fi

# a shell test: a tools/beammoe of its own that emulates the real one
shim="$top/.emulate-shim"
mkdir -p "$shim/tools" || exit 99
cat >"$shim/tools/beammoe.tmp.$$" <<EOF
#!/bin/sh
# tools/beammoe of the cross build, run by $emu (scripts/emulate-test.sh)
exec "$top/libtool" --mode=execute "$emu" "$top/tools/beammoe" "\$@"
EOF
chmod 755 "$shim" "$shim/tools" "$shim/tools/beammoe.tmp.$$" &&
    mv -f "$shim/tools/beammoe.tmp.$$" "$shim/tools/beammoe" || exit 99
builddir=$shim
export builddir
exec "$t" "$@"
