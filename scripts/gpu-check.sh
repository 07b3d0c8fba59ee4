#!/bin/sh
# gpu-check.sh - build here (no GPU needed), bundle what a GPU host needs.
#
# Part 1 of the GPU run; part 2 is scripts/gpu-run.sh, run on the GPU host
# from the repository root. Here:
#   1. configure (if the tree is not configured yet) with --with-cuda, build
#      the libraries, the test programs and the benchmark;
#   2. copy into .devbuild/ (git-ignored): lib/ with libbeammoe.so,
#      libbeammoe_cpu.so, libbeammoe_cuda.so, libcunit.so.1 (GPU hosts often
#      lack CUnit), libcudart and libgomp (not NCCL: 200 MiB, and a GPU host
#      that runs the gather has it); bin/ with the real
#      executables of tests/test_cuda, bench/cuda_bench, bench/shape_sweep,
#      tests/test_gather_group, tests/test_gather_nccl, tests/test_allreduce
#      and bench/gather_bench
#      (libtool's .libs/
#      binaries, not its wrapper scripts; tests/test_backends and
#      tests/test_quant too); the GPU
#      host needs no libtool,
#      CUnit or build. Every program is built by the makefiles; this script
#      compiles nothing itself.
# Then on the GPU host, from the repository root with .devbuild/ beside it:
#   sh scripts/gpu-run.sh            one GPU: logs and a summary land in $OUT
#                                    (default .devbuild/out)
#   QUICK=1 sh scripts/gpu-run.sh    the checks that matter most, in under
#                                    ten minutes
#   sh scripts/gather-run.sh         two or more GPUs: the NCCL gather's test
#                                    and benchmark
#
# usage: scripts/gpu-check.sh [configure arguments ...]
set -e
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
jobs=${JOBS:-2}

if test ! -f Makefile; then
    test -x configure || autoreconf -fi
    ./configure --with-cuda "$@"
fi
if ! grep -q '^libbeammoe_cuda_la' Makefile; then
    echo "gpu-check.sh: this build has no CUDA backend (configure found no CUDA toolkit?)" >&2
    exit 1
fi
make -j"$jobs"
# ptxas's allocation of the kernels against the recorded list: a change of
# it alone can move their speed (scripts/ptxas-regs.sh)
make ptxas-regs || echo "gpu-check.sh: time the kernels listed above before recording them"
progs="tests/test_backends tests/test_cuda tests/test_quant tests/test_allreduce bench/cuda_bench bench/shape_sweep tests/test_gather_group tests/test_gather_nccl bench/gather_bench"
make -j"$jobs" $progs

rm -rf .devbuild/lib .devbuild/bin
mkdir -p .devbuild/lib .devbuild/bin
# the sonames (the programs' and the dispatcher's): the ABI of configure.ac
so=$(sed -n 's/^#define BEAM_SO_SUFFIX "\(.*\)"$/\1/p' config.h)
if test -z "$so"; then
    echo "gpu-check.sh: config.h has no BEAM_SO_SUFFIX (configure again)" >&2
    exit 1
fi
for l in libbeammoe libbeammoe_cpu libbeammoe_cuda; do
    cp -L ".libs/$l.so" ".devbuild/lib/$l.so"
    cp -L ".libs/$l.so" ".devbuild/lib/$l$so"
done
# shared libraries the binaries need that a bare GPU host may lack
for so in libcunit.so.1 libcudart.so.13 libgomp.so.1 libjson-c.so.5; do
    p=$(ldd tests/.libs/test_cuda tests/.libs/test_gather_nccl .libs/libbeammoe_cuda.so \
        .libs/libbeammoe_cpu.so 2>/dev/null |
        awk -v so="$so" '$1 == so { print $3; exit }')
    if test -n "$p" && test -f "$p"; then cp -L "$p" ".devbuild/lib/$so"; fi
done
for b in $progs; do
    d=$(dirname "$b")
    n=$(basename "$b")
    if test -f "$d/.libs/$n"; then cp "$d/.libs/$n" .devbuild/bin/; else cp "$b" .devbuild/bin/; fi
done
cp scripts/gpu-run.sh scripts/gather-run.sh .devbuild/
echo "gpu-check.sh: bundle ready in .devbuild/ ($(du -sh .devbuild | cut -f1)):"
ls -l .devbuild/lib .devbuild/bin
echo "next, on the GPU host from the repository root: sh scripts/gpu-run.sh (one GPU)," \
    "sh scripts/gather-run.sh (two or more)"
