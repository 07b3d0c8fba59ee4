#!/bin/sh
# exact-fp-check.sh - the exact numerics as the compilers see them
# (m4/beam_exact_fp.m4 and docs/numerics.md):
#
#   scripts/exact-fp-check.sh refuse CC...   configure refuses, with each
#       compiler CC, every flag below that would change the arithmetic
#       (CFLAGS, and -ffast-math in LDFLAGS, which would link crtfastmath.o)
#   scripts/exact-fp-check.sh scan FILE...   no fused multiply-add (or
#       BF16 dot-product) instruction in these built libraries or programs;
#       OBJDUMP names the disassembler (default: objdump; a cross build
#       needs its own, e.g. OBJDUMP=aarch64-linux-gnu-objdump)
#
# Run from the source directory after `autoreconf -fi`; `refuse` configures
# in a temporary folder (VPATH) and leaves the tree as it was.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-}
test $# -ge 2 || { echo "usage: $0 refuse CC... | scan FILE..." >&2; exit 2; }
shift
fail=0

case $mode in
refuse)
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/beammoe-fp.XXXXXX") || exit 1
    trap 'rm -rf "$tmp"' EXIT INT TERM
    for cc in "$@"; do
        flags="-ffast-math -Ofast -ffp-contract=fast -ffp-contract=on -funsafe-math-optimizations
-ffinite-math-only -fassociative-math -freciprocal-math -fno-signed-zeros"
        case $("$cc" --version 2>/dev/null | head -1) in
        *clang*) flags="$flags -ffp-model=fast -ffp-model=precise -fno-honor-nans -fapprox-func
-fdenormal-fp-math=preserve-sign" ;;
        esac
        for f in $flags LDFLAGS=-ffast-math; do
            case $f in
            LDFLAGS=*) cflags="-g -O2" ldflags=${f#LDFLAGS=} ;;
            *) cflags="-g -O2 $f" ldflags= ;;
            esac
            if (cd "$tmp" && "$src/configure" --without-cuda CC="$cc" CFLAGS="$cflags" LDFLAGS="$ldflags") \
                >"$tmp/log" 2>&1; then
                echo "FAIL: $cc: configure accepted $f"
                fail=1
            elif grep -q "exact numerics" "$tmp/log"; then
                echo "ok:   $cc: $f refused"
            else
                echo "FAIL: $cc: configure with $f failed for another reason:"
                grep 'error:' "$tmp/log" | head -3 | sed 's/^/    /'
                fail=1
            fi
            rm -rf "${tmp:?}"/* "$tmp"/.[!.]* 2>/dev/null
        done
    done
    ;;
scan)
    objdump=${OBJDUMP:-objdump}
    for f in "$@"; do
        if ! "$objdump" -d "$f" >/dev/null 2>&1; then
            echo "FAIL: $objdump cannot disassemble $f"
            fail=1
            continue
        fi
        # x86: vfmadd/vfmsub/vfnmadd/vfnmsub*, vdpbf16ps; aarch64: fmadd,
        # fmsub, fnmadd, fnmsub, fmla, fmls, bfmlal*, bfdot
        hits=$("$objdump" -d "$f" | grep -Ei '[[:space:]](v?fn?m(add|sub)[0-9a-z.]*|fml[as]|bfml[a-z]*|bfdot|vdpbf16ps)[[:space:]]')
        if [ -n "$hits" ]; then
            echo "FAIL: $f holds fused multiply-add instructions:"
            echo "$hits" | head -5 | sed 's/^/    /'
            fail=1
        else
            echo "ok:   $f: no fused multiply-add among $("$objdump" -d "$f" | grep -c '^ ') instructions"
        fi
    done
    ;;
*)
    echo "usage: $0 refuse CC... | scan FILE..." >&2
    exit 2 ;;
esac
exit $fail
