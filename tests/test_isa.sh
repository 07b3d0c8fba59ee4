#!/bin/sh
# test_isa.sh - the CPU suite's bit-exact tests once more on each narrower
# set of row kernels than this CPU picks by itself (BEAM_CPU_ISA=avx2, then
# portable; cpu/path.h), so that the AVX2 kernels and the portable loops are
# tested on an AVX-512 machine too. Every result must still equal the naive
# reference and the golden digests. Where the build has no vector kernels
# (-DBEAM_SCALAR_ROWS, other compilers) every run is the portable path.
#
# Run from the top build directory (make check does).
top=${top_builddir:-.}
fail=0
for isa in avx2 portable; do
  for t in test_golden test_numerics_cpu test_threads test_edges test_stack; do
    prog=$top/tests/$t
    if ! test -x "$prog"; then
      echo "FAIL: $prog was not built" >&2
      fail=1
      continue
    fi
    if BEAM_CPU_ISA=$isa "$prog" >"$top/tests/test_isa.$isa.$t.out" 2>&1; then
      echo "PASS: BEAM_CPU_ISA=$isa $t"
    else
      echo "FAIL: BEAM_CPU_ISA=$isa $t (see tests/test_isa.$isa.$t.out)" >&2
      sed -n '1,40p' "$top/tests/test_isa.$isa.$t.out" >&2
      fail=1
    fi
  done
done
exit $fail
