#!/bin/sh
# test_isa.sh - the CPU suite's bit-exact tests once more on each narrower
# set of row kernels than this CPU picks by itself (BEAM_CPU_ISA=avx512,
# avx2, then portable; lib/cpu_isa.h), so that the AVX-512 kernels without the
# BF16 conversion, the AVX2 kernels and the portable loops are tested on a
# machine that has AVX512-BF16 too. Every result must still equal the naive
# reference and the golden digests. Where the build has no vector kernels
# (-DBEAM_SCALAR_ROWS, other compilers) every run is the portable path.
#
# Run from the top build directory (make check does).
top=${top_builddir:-.}
# A foreign build under a user-mode emulator (scripts/emulate-test.sh sets
# BEAM_TEST_EXEC_WRAPPER) has the portable rows only, which the suite's own
# run of these programs covers.
if test -n "${BEAM_TEST_EXEC_WRAPPER:-}"; then
  echo "test_isa.sh: a foreign build under an emulator has one path: skipped"
  exit 77
fi
fail=0
isas="avx512 avx2 portable"
for isa in $isas; do
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
