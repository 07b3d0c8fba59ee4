#!/bin/sh
# cross-check.sh - build the CPU library, the tool and the CUnit suite for
# another CPU (default: aarch64, as on Grace hosts) with a cross compiler,
# and run them under a user-mode emulator (qemu-user): `make check` (every
# test but the Python suite), `beammoe audit --quick`, and, given a build of
# this host, its results audited bit for bit by the cross-built tool.
#
#   scripts/cross-check.sh [BUILD_DIR]        (default: build-aarch64)
#
# Run from the source directory after `autoreconf -fi`; BUILD_DIR is
# configured (VPATH, --without-cuda) unless it already holds a Makefile, so
# a second run only rebuilds what changed. Debian packages it needs:
# gcc-aarch64-linux-gnu qemu-user, and with `dpkg --add-architecture arm64`
# libcunit1-dev:arm64 libjson-c-dev:arm64 (without them configure builds no
# CUnit tests or no safetensors support, and says so).
#
# Environment:
#   HOST               the cross target triplet (default aarch64-linux-gnu)
#   BEAM_EMULATOR      its emulator (default qemu-aarch64)
#   SYSROOT            where the cross C library lives (default /usr/$HOST):
#                      the emulator's QEMU_LD_PREFIX
#   JOBS               make -j (default: nproc)
#   BEAM_NATIVE_BUILD  a build directory of this host's CPU (e.g. `.`): its
#                      tools/beammoe writes cases with their results
#                      (run --output), the cross-built tool must reproduce
#                      every bit (audit --input), and `run` checksums of both
#                      must agree
#   CONFIGURE_FLAGS    more arguments for configure
#
# Without binfmt_misc the host cannot execute a foreign program: every test
# runs through scripts/emulate-test.sh (the LOG_COMPILER), which puts the
# emulator in front of the programs and of the tool the shell tests call.
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build-aarch64}
host=${HOST:-aarch64-linux-gnu}
emu=${BEAM_EMULATOR:-qemu-aarch64}
sysroot=${SYSROOT:-/usr/$host}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
native=
if test -n "${BEAM_NATIVE_BUILD:-}"; then
    native=$(cd "$BEAM_NATIVE_BUILD" && pwd)/tools/beammoe
    test -x "$native" || { echo "cross-check.sh: no $native (BEAM_NATIVE_BUILD)" >&2; exit 1; }
fi

for tool in "$host-gcc" "$emu"; do
    command -v "$tool" >/dev/null 2>&1 || { echo "cross-check.sh: $tool not found" >&2; exit 1; }
done
test -x "$src/configure" || { echo "cross-check.sh: run autoreconf -fi in $src first" >&2; exit 1; }

# The emulator loads the cross C library (ld.so and libc.so.6 from one
# package: with Debian's multiarch libc6:$arch installed too, an ld.so of one
# and a libc.so.6 of the other hang in pthread_create), then the multiarch
# libraries (CUnit, json-c).
QEMU_LD_PREFIX=$sysroot
LD_LIBRARY_PATH=$sysroot/lib:/usr/lib/$host${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
BEAM_EMULATOR=$emu
export QEMU_LD_PREFIX LD_LIBRARY_PATH BEAM_EMULATOR

mkdir -p "$build"
cd "$build"
build=$(pwd)
if ! test -f Makefile; then
    # pkg-config of this host, looking at the target's multiarch .pc files
    # (configure warns that it is not prefixed with the triplet)
    if ! command -v "$host-pkg-config" >/dev/null 2>&1 && test -z "${PKG_CONFIG_LIBDIR:-}"; then
        PKG_CONFIG_LIBDIR=/usr/lib/$host/pkgconfig:/usr/share/pkgconfig
        export PKG_CONFIG_LIBDIR
    fi
    # shellcheck disable=SC2086
    "$src/configure" --host="$host" --without-cuda ${CONFIGURE_FLAGS:-}
fi
make -j"$jobs"
file -L .libs/libbeammoe_cpu.so tools/.libs/beammoe 2>/dev/null || true

status=0
echo "== make check under $emu"
make -j"$jobs" check LOG_COMPILER="$src/scripts/emulate-test.sh" || status=1

# the auditor's promise, with a seed of its own (make check's tests/audit-quick.sh runs seed 1)
echo "== beammoe audit --quick --seed 2 under $emu"
./libtool --mode=execute "$emu" tools/beammoe audit --quick --seed 2 >audit-quick.out 2>&1 || status=1
head -2 audit-quick.out
tail -1 audit-quick.out

if test -n "$native"; then
    echo "== results of $native (this host) reproduced under $emu"
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/beammoe-cross.XXXXXX")
    n=0
    while read -r name args; do
        n=$((n + 1))
        # shellcheck disable=SC2086
        if ! "$native" run --iters 1 $args --output "$tmp/$name.safetensors" >"$tmp/native.out" 2>&1; then
            echo "FAIL: $name: the native tool could not write the case"; cat "$tmp/native.out"; status=1; continue
        fi
        # shellcheck disable=SC2086
        ./libtool --mode=execute "$emu" tools/beammoe run --iters 1 $args >"$tmp/cross.out" 2>&1 || true
        a=$(sed -n 's/^checksum: *//p' "$tmp/native.out")
        b=$(sed -n 's/^checksum: *//p' "$tmp/cross.out")
        if ./libtool --mode=execute "$emu" tools/beammoe audit --input "$tmp/$name.safetensors" >"$tmp/audit.out" 2>&1 &&
            test -n "$a" && test "$a" = "$b"; then
            echo "ok:   $name: checksum $a on both, $(tail -1 "$tmp/audit.out")"
        else
            echo "FAIL: $name: checksum $a here, ${b:-none} emulated"; cat "$tmp/audit.out"; status=1
        fi
    done <<EOF
fused-7168 --tokens 64 --top-k 8 --hidden 7168 --next-norm --routed-scale 2.5
fused-all --tokens 33 --top-k 6 --hidden 4096 --post-norm --next-norm --scales 0.5,2 --eps 1e-5
finalize-post --op finalize --tokens 17 --top-k 32 --hidden 8192 --post-norm --routed-scale 0.75
finalize-256 --op finalize --tokens 5 --top-k 1 --hidden 256
EOF
    rm -rf "$tmp"
    echo "$n cases"
fi
exit $status
