#!/bin/sh
# test_symbols.sh - libbeammoe and every backend library of lib/backends.def
# that was built (libbeammoe_cpu always; libbeammoe_cuda when configure found
# CUDA) export exactly the same dynamic symbols, all named beam_*.
#
# A program may link any of the three (ARCHITECTURE.md), so their export
# lists must be identical; -fvisibility=hidden keeps bm_* internals out.
# Linker-defined symbols (_init, _fini, _edata, _end, __bss_start, ...) and
# version nodes are not part of the API and are ignored.
#
# Run from the top build directory (make check does); top_builddir may
# point elsewhere.
top=${top_builddir:-.}
src=${top_srcdir:-$top}
# the backends' names, one BM_BACKEND(name, ...) line each; the first (the
# CPU) is always built
names=$(sed -n 's/^BM_BACKEND(\([a-z0-9_]*\),.*/\1/p' "$src/lib/backends.def")
if test -z "$names"; then
  echo "FAIL: no backend in $src/lib/backends.def" >&2
  exit 1
fi
first=yes
libs="$top/.libs/libbeammoe.so"
for n in $names; do
  if test $first = yes || test -e "$top/.libs/libbeammoe_$n.so"; then
    libs="$libs $top/.libs/libbeammoe_$n.so"
  fi
  first=no
done

if ! command -v nm >/dev/null 2>&1; then
  echo "nm not found: cannot inspect the libraries" >&2
  exit 77
fi

tmp=${TMPDIR:-/tmp}/beam_symbols.$$
mkdir -p "$tmp" || exit 99
trap 'rm -rf "$tmp"' EXIT

fail=0
ref=
for lib in $libs; do
  if ! test -e "$lib"; then
    echo "FAIL: $lib does not exist" >&2
    fail=1
    continue
  fi
  out="$tmp/$(basename "$lib").syms"
  # "ADDR TYPE NAME[@VERSION]": keep NAME, drop linker symbols and version
  # nodes (type A).
  nm -D --defined-only "$lib" |
    awk 'NF >= 3 && $2 != "A" { print $3 }' |
    sed 's/@.*//' |
    grep -v -E '^(_init|_fini|_edata|_end|__bss_start|_DYNAMIC|_GLOBAL_OFFSET_TABLE_|__data_start|__dso_handle|_IO_stdin_used)$' |
    sort -u >"$out"
  n=$(wc -l <"$out")
  echo "$lib: $n exported symbols"
  if test "$n" -eq 0; then
    echo "FAIL: $lib exports nothing" >&2
    fail=1
  fi
  bad=$(grep -v '^beam_' "$out")
  if test -n "$bad"; then
    echo "FAIL: $lib exports names without the beam_ prefix:" >&2
    echo "$bad" | sed 's/^/  /' >&2
    fail=1
  fi
  if test -z "$ref"; then
    ref=$out
  elif ! cmp -s "$ref" "$out"; then
    echo "FAIL: $(basename "$lib") and $(basename "$ref" .syms) export different symbols:" >&2
    diff "$ref" "$out" | sed 's/^/  /' >&2
    fail=1
  fi
done

# every function of the public header is exported: those declared with
# their parameters, and those declared through their function type
# ("BEAM_API beam_x_fn beam_x;", the operations)
hdr=$src/include/beammoe.h
if test -n "$ref" && test -r "$hdr"; then
  for f in $(sed -n -e 's/^BEAM_API [^(]*[ *]\(beam_[a-z_0-9]*\)(.*/\1/p' \
                    -e 's/^BEAM_API beam_[a-z_0-9]*_fn \(beam_[a-z_0-9]*\);.*/\1/p' "$hdr"); do
    if ! grep -qx "$f" "$ref"; then
      echo "FAIL: $f is declared in beammoe.h but not exported" >&2
      fail=1
    fi
  done
fi
exit $fail
