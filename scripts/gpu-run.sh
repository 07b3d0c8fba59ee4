#!/bin/sh
# gpu-run.sh - the GPU half of scripts/gpu-check.sh: run on the GPU host, from
# the repository root, with the .devbuild/ bundle that gpu-check.sh made.
#
# Runs, each with a time limit, logging into $OUT (default .devbuild/out):
#   test_cuda.log   tests/test_backends: every backend that runs here against
#                   the CPU bit for bit (full sweep), then tests/test_cuda:
#                   the CUDA contract and graph replays, then
#                   tests/test_quant: the quantized output of normalized
#   shapes.log      bench/shape_sweep check: the hardware BF16 conversion for
#                   every FP32 value, every compiled launch shape against the
#                   naive reference
#   memcheck.log    the same tests (BEAM_TEST_QUICK=1) under compute-sanitizer
#                   --tool memcheck
#   racecheck.log   ... under --tool racecheck (shared-memory hazards)
#   group.log       tests/test_gather_group: the tensor-parallel gather at
#                   R = 2, 3, 4, 5, 8 ranks on this one GPU (every part,
#                   2,000 stress calls each)
#   group-stress.log  its 10,000-call stress at R = 8
#   allreduce.log   tests/test_allreduce: both all-reduces on every backend,
#                   R = 1..8 ranks on this one GPU, against the CPU group
#   group-memcheck.log, group-racecheck.log
#                   parts of it at R = 2 under compute-sanitizer memcheck /
#                   racecheck
#   bench.txt       bench/cuda_bench: copy bandwidth, each op per shape
#   python.log      the Python suite (python/tests) on the GPU: CUDA tensors,
#                   torch.ops.beammoe under torch.compile and CUDA graphs
#   compare.txt     bench/torch_compare.py --modes cold: beammoe beside
#                   torch.compile of the reference, every operation and
#                   configuration, same process, same method (its own
#                   timeout, COMPARE_TIMEOUT, default 900 s)
#   gemm.txt        bench/gemm_pair.py: [expert GEMM, step] layers in a graph
#   overhead.txt    bench/python_overhead.py --device cuda
#   fp8.txt         bench/fp8_compare.py: the FP8 output beside the BF16 one
#                   and beside quantizing normalized afterwards
#   fp8-all.txt     the same for every configuration with a next norm
#                   (pre-norm, scales, no weights, in place), FP8 group 128
#                   and NVFP4, T = 1 and 4096 at H = 7168
#   vllm.txt        bench/fp8_vllm_diff.py: where vLLM's FP8 formulas give
#                   other bits (the GPU's log2f)
# (the Python steps run when python3 imports torch)
#   summary.txt     one line per step: status and duration
# Exit status: 0 when every step passed.
#
# Environment: OUT, STEP_TIMEOUT (seconds per step, default 240),
# GROUP_TIMEOUT (seconds for each of the two long gather steps, default
# 600), SKIP (a space-separated list of steps to leave out: test shapes
# memcheck racecheck group group-stress allreduce group-memcheck group-racecheck bench
# python compare gemm overhead fp8 fp8-all vllm).
#
# QUICK=1: what matters most in under ten minutes, for a GPU host held
# briefly (STEP_TIMEOUT default 150). At once, each its own process on the
# shared GPU: test_backends, test_cuda, test_quant (test_backends.log, ...),
# shapes, allreduce (three times STEP_TIMEOUT) and the Python suite's GPU
# tests; then group (BEAM_TEST_STRESS=50) beside memcheck and racecheck; then
# alone on the GPU bench (cuda_bench --quick, its JSON in bench.json), the
# decode rows of torch_compare.py and the FP8 rows of fp8_compare.py that
# docs/PERF.md's targets name (compare.txt, fp8.txt; when python3 imports
# torch) and, with BASE set to another build's bench/shape_sweep,
# `shape_sweep perf --summary --picked` of BASE and of this build
# (perf-base.txt, perf.txt: the picked shapes' times).
B=${B:-.devbuild}
OUT=${OUT:-$B/out}
T=${STEP_TIMEOUT:-240}
test -n "$QUICK" && T=${STEP_TIMEOUT:-150}
mkdir -p "$OUT"
LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
BEAM_BACKEND_DIR="$B/lib"
export LD_LIBRARY_PATH BEAM_BACKEND_DIR
# never NVLink multicast (shared hosts), whatever runs here
NCCL_NVLS_ENABLE=0
export NCCL_NVLS_ENABLE
SAN=compute-sanitizer
command -v "$SAN" >/dev/null 2>&1 || SAN=/usr/local/cuda/bin/compute-sanitizer

: > "$OUT/summary.txt"
fail=0
step() { # name log command...
    name=$1; log=$2; shift 2
    case " $SKIP " in *" $name "*) echo "$name: skipped" >> "$OUT/summary.txt"; return 0 ;; esac
    t0=$(date +%s)
    timeout "$T" "$@" > "$OUT/$log" 2>&1
    rc=$?
    t1=$(date +%s)
    if test $rc = 0; then s=PASS; else s="FAIL (exit $rc)"; fail=1; fi
    test $rc = 124 && s="FAIL (timed out after ${T}s)"
    echo "$name: $s in $((t1 - t0)) s" >> "$OUT/summary.txt"
    echo "$name: $s in $((t1 - t0)) s"
}

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; \
  "$SAN" --version | tail -1; } > "$OUT/device.txt" 2>&1
# the bit-exact tests; each run below as a script string (step runs its
# command under timeout): in turn, and under a sanitizer
tests="test_backends test_cuda test_quant"
both='for t in $tests; do "$B/bin/$t" || exit; done'
sanitize='for t in $tests; do
    BEAM_TEST_QUICK=1 "$SAN" "$@" --error-exitcode 1 "$B/bin/$t" || exit 1
done'
export B SAN tests
gpu_python= # the Python suite's GPU tests, when python3 imports torch
if python3 -c 'import torch' >/dev/null 2>&1; then
    BEAMMOE_LIBRARY=$B/lib/libbeammoe.so
    PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH}
    export BEAMMOE_LIBRARY PYTHONPATH
    gpu_python=yes
fi
if test -n "$QUICK"; then
    for t in $tests; do step $t $t.log "$B/bin/$t" & done
    step shapes shapes.log "$B/bin/shape_sweep" check &
    # the longest of them: R = 1 .. 8, each with the T = 16384 line
    (T=$((T * 3)); step allreduce allreduce.log "$B/bin/test_allreduce") &
    test -n "$gpu_python" && step python python.log python3 -m pytest -q -rs -p no:cacheprovider \
        python/tests/test_cuda.py python/tests/test_torch_ops.py python/tests/test_gather_process_group.py \
        -k "cuda or gpus" &
    wait
    step group group.log env BEAM_TEST_STRESS=50 "$B/bin/test_gather_group" &
    step memcheck memcheck.log sh -c "$sanitize" sh --tool memcheck --leak-check full &
    step racecheck racecheck.log sh -c "$sanitize" sh --tool racecheck &
    wait
    step bench bench.txt "$B/bin/cuda_bench" --quick --json "$OUT/bench.json"
    if test -n "$gpu_python"; then
        step compare compare.txt python3 bench/torch_compare.py --device cuda --modes cold --no-unfused \
            --ops fused,nrn --configs post+next,pre+next+scales,pre+next --shapes 1:7168,64:7168,64:4096
        step fp8 fp8.txt python3 bench/fp8_compare.py --device cuda --modes cold --ops fused,nrn \
            --forms group128 --shapes 64:7168,4096:2048,4096:4096,16384:7168
    fi
    if test -n "$BASE"; then
        step perf-base perf-base.txt "$BASE" perf --summary --picked
        step perf perf.txt "$B/bin/shape_sweep" perf --summary --picked
    fi
    # (the steps ran in subshells: their summary lines hold the outcome)
    ! grep -q FAIL "$OUT/summary.txt"
    exit
fi
step test test_cuda.log sh -c "$both"
step shapes shapes.log "$B/bin/shape_sweep" check
step memcheck memcheck.log sh -c "$sanitize" sh --tool memcheck --leak-check full
step racecheck racecheck.log sh -c "$sanitize" sh --tool racecheck
# the gather at every world size (2,000 stress calls each), then the
# 10,000-call stress at eight ranks; longer steps (GROUP_TIMEOUT seconds)
t_step=$T
T=${GROUP_TIMEOUT:-600}
step group group.log env BEAM_TEST_STRESS=2000 "$B/bin/test_gather_group"
step group-stress group-stress.log env BEAM_TEST_RANKS=8 BEAM_TEST_ONLY=stress BEAM_TEST_STRESS=10000 \
    "$B/bin/test_gather_group"
step allreduce allreduce.log "$B/bin/test_allreduce"
T=$t_step
# under the sanitizers: two ranks, the parts whose kernels are each
# launched first while no peer kernel runs. The tools instrument a kernel
# at its first launch and wait for the device meanwhile; with both ranks on
# one device a peer's waiting kernel then holds that launch until the
# timeout (the sweep launches many kernels for the first time: docs/PERF.md)
# (a script string, not a function: step runs it under timeout)
sanitize_group='tool=$1; shift
for part in "$@"; do
    BEAM_TEST_RANKS=2 BEAM_TEST_ONLY=$part "$SAN" --tool "$tool" --error-exitcode 1 \
        "$B/bin/test_gather_group" || exit 1
done'
step group-memcheck group-memcheck.log sh -c "$sanitize_group" sh memcheck bad mismatch concurrent wrap
step group-racecheck group-racecheck.log sh -c "$sanitize_group" sh racecheck bad mismatch concurrent wrap
step bench bench.txt "$B/bin/cuda_bench"
if test -n "$gpu_python"; then
    step python python.log python3 -m pytest -q -rs -p no:cacheprovider python/tests
    t_step=$T
    T=${COMPARE_TIMEOUT:-900}
    step compare compare.txt python3 bench/torch_compare.py --device cuda --modes cold
    T=$t_step
    step gemm gemm.txt python3 bench/gemm_pair.py
    step overhead overhead.txt python3 bench/python_overhead.py --device cuda
    step fp8 fp8.txt python3 bench/fp8_compare.py --device cuda
    step fp8-all fp8-all.txt python3 bench/fp8_compare.py --device cuda --ops all --forms group128,nvfp4 \
        --shapes 1:7168,4096:7168
    step vllm vllm.txt python3 bench/fp8_vllm_diff.py --device cuda
else
    echo "python: skipped (python3 cannot import torch)" >> "$OUT/summary.txt"
fi
tail -4 "$OUT/test_cuda.log" 2>/dev/null
tail -2 "$OUT/shapes.log" 2>/dev/null
tail -2 "$OUT/group.log" "$OUT/allreduce.log" 2>/dev/null
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$OUT/memcheck.log" "$OUT/racecheck.log" "$OUT/group-memcheck.log" \
    "$OUT/group-racecheck.log" 2>/dev/null | sort | uniq -c
cat "$OUT/bench.txt" 2>/dev/null
tail -3 "$OUT/python.log" 2>/dev/null
cat "$OUT/compare.txt" "$OUT/gemm.txt" "$OUT/overhead.txt" "$OUT/fp8.txt" "$OUT/vllm.txt" 2>/dev/null
exit $fail
