#!/bin/sh
# gather-run.sh - build and run the NCCL gather test and benchmark without
# Autotools (the GPU host has no libtool and no CUnit).
#
#   scripts/gather-run.sh build [DIR]  compile into DIR (default .devbuild-gather,
#                                      git-ignored through .git/info/exclude):
#                                      test_gather_nccl and gather_bench, each
#                                      linked statically with lib/*.c, gpu/launch.cu
#                                      and gpu/gather*.cu (+ harness/naive_ref.c)
#   scripts/gather-run.sh run [DIR]    NVLink topology, the test, the benchmark;
#                                      logs into $OUT when set (the device tool),
#                                      else into DIR
#   scripts/gather-run.sh all [DIR]    both
#
# The backend table: gpu/backend*.cu when it already points at bm_cuda_gather,
# else a minimal table written here (gather entry points only; enough for
# these two programs, which call nothing else of the CUDA backend).
# NVLink multicast stays off: NCCL_NVLS_ENABLE=0 (the programs set it too).
set -e
cmd=${1:-all}
top=$(cd "$(dirname "$0")/.." && pwd)
dir=${2:-$top/.devbuild-gather}
CUDA=${CUDA_HOME:-/usr/local/cuda}
NVCC=${NVCC:-$CUDA/bin/nvcc}
CC=${CC:-gcc}
NVFLAGS="-O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
 --fmad=false --prec-div=true --prec-sqrt=true --ftz=false -Xcompiler -fvisibility=hidden"
CFLAGS="-std=c99 -O2 -ffp-contract=off -fno-fast-math -Wall -Wextra -fvisibility=hidden"
INC="-I$dir -I$top/include -I$top/lib -I$top/gpu -I$top/harness -I$CUDA/include"

build() {
    mkdir -p "$dir"
    printf '#define PACKAGE_VERSION "0.1.0"\n' > "$dir/config.h"
    pids=""
    for f in launch gather gather_ws gather_fused gather_unfused; do
        "$NVCC" $NVFLAGS $INC -c "$top/gpu/$f.cu" -o "$dir/$f.o" & pids="$pids $!"
    done
    table="$dir/devtable.o"
    if grep -q bm_cuda_gather "$top"/gpu/backend*.cu 2>/dev/null; then
        table=""
        for f in "$top"/gpu/backend*.cu; do
            b=$(basename "$f" .cu)
            "$NVCC" $NVFLAGS $INC -c "$f" -o "$dir/$b.o" & pids="$pids $!"
            table="$table $dir/$b.o"
        done
    else
        cat > "$dir/devtable.c" <<'EOF'
/* Minimal CUDA backend table for the gather programs (generated). */
#include <cuda_runtime.h>
#include "backend.h"
#include "error.h"
#include "gather.h"
static beam_status dev_available(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1)
        return bm_fail(BEAM_ERR_UNSUPPORTED, "beam_set_backend: no CUDA device is visible");
    return BEAM_OK;
}
const bm_backend bm_backend_table = {
    .name = "cuda",
    .available = dev_available,
    .ws_default = bm_cuda_ws_default,
    .ws_create_nccl = bm_cuda_ws_create_nccl,
    .ws_destroy = bm_cuda_ws_destroy,
    .gather = bm_cuda_gather,
};
EOF
        $CC $CFLAGS $INC -c "$dir/devtable.c" -o "$dir/devtable.o"
    fi
    for f in api check error; do $CC $CFLAGS $INC -c "$top/lib/$f.c" -o "$dir/lib_$f.o"; done
    $CC $CFLAGS $INC -c "$top/harness/naive_ref.c" -o "$dir/naive_ref.o"
    $CC $CFLAGS $INC -c "$top/tests/test_gather_nccl.c" -o "$dir/test_gather_nccl.o"
    $CC $CFLAGS $INC -c "$top/bench/gather_bench.c" -o "$dir/gather_bench.o"
    for p in $pids; do wait $p; done
    core="$dir/lib_api.o $dir/lib_check.o $dir/lib_error.o $dir/launch.o $dir/gather.o $dir/gather_ws.o \
 $dir/gather_fused.o $dir/gather_unfused.o $table"
    "$NVCC" -o "$dir/test_gather_nccl" "$dir/test_gather_nccl.o" "$dir/naive_ref.o" $core \
        -L"$CUDA/lib64" -lnccl -lm
    "$NVCC" -o "$dir/gather_bench" "$dir/gather_bench.o" $core -L"$CUDA/lib64" -lnccl
    echo "built $dir/test_gather_nccl and $dir/gather_bench"
}

run() {
    out=${OUT:-$dir}
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    # libnccl.so.2: the toolkit's, else the one PyTorch's wheels bring
    for d in "$CUDA/lib64" "$CUDA/lib" /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib; do
        test -d "$d" && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
    done
    export LD_LIBRARY_PATH
    if ldd "$dir/test_gather_nccl" | grep -q "not found"; then
        echo "missing libraries:"; ldd "$dir/test_gather_nccl" | grep "not found"; return 1
    fi
    nvidia-smi topo -m > "$out/topo.txt" 2>&1 || true
    st=0
    # each part in its own processes, so that one failure hides no other
    for part in ${GATHER_PARTS:-sweep stress bad timeout}; do
        pst=0
        BEAM_TEST_ONLY=$part BEAM_TEST_DEADLINE=${GATHER_DEADLINE:-120} \
            "$dir/test_gather_nccl" >> "$out/test.log" 2>&1 || pst=$?
        echo "test_gather_nccl $part: exit $pst"
        test $pst -eq 0 || st=1
    done
    grep -v '^ *$' "$out/test.log" | tail -n 30
    bst=0
    if test -z "$GATHER_NO_BENCH"; then
        "$dir/gather_bench" > "$out/bench.log" 2>&1 || bst=$?
        echo "gather_bench exit $bst"
        cat "$out/bench.log"
    fi
    test $st -eq 0 && test $bst -eq 0
}

case $cmd in
build) build ;;
run) run ;;
all) build && run ;;
*) echo "usage: $0 build|run|all [DIR]" >&2; exit 2 ;;
esac
