#!/bin/sh
# gather-run.sh - the NCCL gather's half of the GPU run: run on a GPU host
# with two or more GPUs, from the repository root, with the .devbuild/ bundle
# that scripts/gpu-check.sh made (it holds tests/test_gather_nccl and
# bench/gather_bench as the makefiles built them, and the libraries). Builds
# nothing.
#
# Runs, logging into $OUT (default .devbuild/out):
#   topo.txt         nvidia-smi topo -m (how the GPUs are linked)
#   gather-test.log  tests/test_gather_nccl, each part (sweep, large, stress,
#                    arstress, bad, mismatch, concurrent, wrap, timeout, hosts) in
#                    processes of its own, so that one failure hides no
#                    other; the program runs one process per GPU
#   gather-bench.log bench/gather_bench: every strategy side by side, for
#                    the gather, both all-reduce forms (beside NCCL's
#                    all-reduce and a separate norm) and the all-reduce
#                    with the FP8 output, at the test's ranks
# Exit status: 0 when every part and the benchmark passed.
#
# Environment: OUT, GATHER_PARTS (the parts to run, default all of them),
# GATHER_RANKS (ranks, default 2; at most the GPUs), GATHER_DEADLINE
# (seconds each part may take, default 180),
# GATHER_NO_BENCH (set: leave the benchmark out).
# NVLink multicast stays off: NCCL_NVLS_ENABLE=0 (the programs set it too).
B=${B:-.devbuild}
OUT=${OUT:-$B/out}
mkdir -p "$OUT"
NCCL_NVLS_ENABLE=0
TORCH_SYMM_MEM_DISABLE_MULTICAST=1
NVSHMEM_DISABLE_NVLS=1
export NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS
# the bundle's libraries first; libnccl.so.2 from the bundle, else the
# toolkit's, else the one PyTorch's wheels bring
CUDA=${CUDA_HOME:-/usr/local/cuda}
LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for d in "$CUDA/lib64" "$CUDA/lib" /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib; do
    test -d "$d" && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
BEAM_BACKEND_DIR="$B/lib"
export LD_LIBRARY_PATH BEAM_BACKEND_DIR

for p in test_gather_nccl gather_bench; do
    if ! test -x "$B/bin/$p"; then
        echo "gather-run.sh: $B/bin/$p is missing: run scripts/gpu-check.sh first" >&2
        exit 1
    fi
done
if ldd "$B/bin/test_gather_nccl" | grep -q "not found"; then
    echo "missing libraries:"; ldd "$B/bin/test_gather_nccl" | grep "not found"; exit 1
fi
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1 || true
st=0
: > "$OUT/gather-test.log"
for part in ${GATHER_PARTS:-sweep large stress arstress bad mismatch concurrent wrap timeout hosts}; do
    pst=0
    BEAM_TEST_RANKS=${GATHER_RANKS:-2} BEAM_TEST_ONLY=$part BEAM_TEST_DEADLINE=${GATHER_DEADLINE:-180} \
        "$B/bin/test_gather_nccl" >> "$OUT/gather-test.log" 2>&1 || pst=$?
    echo "test_gather_nccl $part: exit $pst"
    test $pst -eq 0 || st=1
done
grep -v '^ *$' "$OUT/gather-test.log" | tail -n 30
bst=0
if test -z "$GATHER_NO_BENCH"; then
    : > "$OUT/gather-bench.log"
    for run in gather allreduce allreduce-moe allreduce-fp8; do
        coll=${run%-fp8} fp8=0 ts=
        test "$run" = allreduce-fp8 && fp8=1
        test "$coll" = gather || ts=1,8,64,128,512,4096,16384
        BEAM_BENCH_COLL=$coll BEAM_BENCH_FP8=$fp8 BEAM_BENCH_RANKS=${GATHER_RANKS:-2} BEAM_BENCH_T=$ts \
            "$B/bin/gather_bench" >> "$OUT/gather-bench.log" 2>&1 || bst=$?
    done
    echo "gather_bench exit $bst"
    cat "$OUT/gather-bench.log"
fi
test $st -eq 0 && test $bst -eq 0
