/*
 * launch.cu - the compiled launch shapes of the row kernel and the choice
 * among them (internal).
 */
#include <limits.h>

#include "launch.h"

/* Every (NT, J, U, CS) instantiated, each in a vector and a scalar version:
 * the shapes bm_pick_shape returns (decode: one chunk per thread, clusters of
 * 1 to 8; prefill: the row kernel for hidden <= 4096) and the row-kernel
 * twins of the pipelined shapes (bases not 16-byte aligned). To try another
 * shape, add it here and sweep it with scripts/dev/harness.cu. */
#define BM_SHAPES(X)                                                          \
    X(32, 1, 8, 1) X(64, 1, 8, 1) X(128, 1, 8, 1)                              \
    X(64, 1, 8, 2) X(64, 1, 8, 4) X(64, 1, 8, 8) X(128, 1, 8, 2)               \
    X(128, 1, 8, 4) X(128, 1, 8, 8) X(256, 1, 8, 2) X(256, 1, 8, 4)            \
    X(512, 1, 8, 2)                                                            \
    X(128, 2, 4, 1) X(256, 2, 4, 1) X(256, 4, 2, 1) X(512, 2, 2, 1)

/* Pipelined shapes (NT, J, D): prefill with hidden > 4096, vector path. */
#define BM_PIPES(X) X(256, 4, 3) X(256, 4, 4) X(512, 2, 3) X(512, 2, 4)

static int next_pow2(int c)
{
    int n = 1;
    while (n < c)
        n *= 2;
    return n;
}

bm_shape bm_pick_shape(int64_t rows, int hidden)
{
    const int n2 = next_pow2(hidden / 8); /* 32 .. 1024 */
    bm_shape s;
    s.pdl = 0;
    s.cs = 1;
    s.d = 0;
    if (rows <= 64) {
        /* decode: one chunk per thread, the whole row loaded at once, the
         * row spread over a cluster of up to 8 multiprocessors as long as
         * the grid stays within one wave (132 on an H200) */
        int cs = 8;
        while (cs > 1 && (rows * cs > 132 || n2 / cs < 64))
            cs /= 2;
        s.cs = cs;
        s.nt = n2 / cs;
        s.j = 1;
        s.u = 8;
        s.pdl = 1;
    } else if (n2 >= 1024) {
        /* prefill, hidden > 4096: the pipelined kernel (pipe_kernel.cuh);
         * wider blocks while there are few rows per block */
        s.d = rows < 2048 ? 3 : 4;
        s.j = rows < 2048 ? 2 : 4;
        s.nt = n2 / s.j;
        s.u = 0;
    } else if (n2 == 512) {
        /* hidden 2304 .. 4096: the row kernel measured faster than the
         * pipeline (119 vs 125 us, T = 4096, H = 4096, fused) */
        s.nt = 256; s.j = 2; s.u = 4;
    } else if (n2 == 256) {
        s.nt = 128; s.j = 2; s.u = 4;
    } else {
        s.nt = n2; s.j = 1; s.u = 8;
    }
    return s;
}

bm_shape bm_row_twin(bm_shape s)
{
    if (s.d > 0) {
        s.d = 0;
        s.u = s.j >= 4 ? 2 : s.j == 2 ? (s.nt >= 512 ? 2 : 4) : 8;
    }
    return s;
}

int bm_shape_ok(bm_shape s, int hidden)
{
    if ((long)s.cs * s.nt * s.j < hidden / 8)
        return 0;
    if (s.d > 0) {
        if (s.cs != 1)
            return 0;
#define BM_POK(NT, J, D) \
    if (s.nt == NT && s.j == J && s.d == D) return 1;
        BM_PIPES(BM_POK)
#undef BM_POK
        return 0;
    }
#define BM_OK(NT, J, U, CS) \
    if (s.nt == NT && s.j == J && s.u == U && s.cs == CS) return 1;
    BM_SHAPES(BM_OK)
#undef BM_OK
    return 0;
}

static int aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

int bm_params_vec_ok(const bm_row_params &p)
{
    const void *ptrs[] = {p.experts, p.x, p.wA, p.residual, p.wB, p.out, p.normalized};
    for (const void *q : ptrs)
        if (q && !aligned16(q))
            return 0;
    return 1;
}

template <int NT, int J, int U, int CS, bool VEC>
static cudaError_t bm_go(const bm_row_params &p, unsigned rows_grid, int pdl,
                         cudaStream_t stream)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[2];
    int n = 0;
    cfg.gridDim = dim3(rows_grid * CS, 1, 1);
    cfg.blockDim = dim3(NT, 1, 1);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = stream;
    if (CS > 1) {
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = CS;
        at[n].val.clusterDim.y = 1;
        at[n].val.clusterDim.z = 1;
        ++n;
    }
    if (pdl) {
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n].val.programmaticStreamSerializationAllowed = 1;
        ++n;
    }
    cfg.attrs = at;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, bm_row_kernel<NT, J, U, CS, VEC>, p);
}

/* The pipelined kernel: dynamic shared memory raised once per kernel, and a
 * persistent grid of one wave (multiprocessors x resident blocks), both
 * computed at the kernel's first launch on a device and cached (host-side
 * attribute calls, not stream work: legal during graph capture). */
template <int NT, int J, int D>
static cudaError_t bm_go_pipe(const bm_row_params &p, int pdl, cudaStream_t stream)
{
    static int cached_dev = -1, cached_wave = 0;
    const size_t smem = (size_t)D * J * NT * 16;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess)
        return e;
    if (dev != cached_dev) {
        int sms = 0, per_sm = 0;
        e = cudaFuncSetAttribute(bm_pipe_kernel<NT, J, D>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e == cudaSuccess)
            e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (e == cudaSuccess)
            e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, bm_pipe_kernel<NT, J, D>,
                                                              NT, smem);
        if (e != cudaSuccess)
            return e;
        cached_wave = sms * (per_sm > 0 ? per_sm : 1);
        cached_dev = dev;
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    const int64_t grid = p.rows < (int64_t)cached_wave ? p.rows : (int64_t)cached_wave;
    cfg.gridDim = dim3((unsigned)grid, 1, 1);
    cfg.blockDim = dim3(NT, 1, 1);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, bm_pipe_kernel<NT, J, D>, p);
}

cudaError_t bm_launch_rows(const bm_row_params &p, bm_shape s, int vec,
                           cudaStream_t stream)
{
    if (p.rows <= 0)
        return cudaSuccess;
    if (s.d > 0 && vec && s.cs == 1) {
#define BM_PGO(NT, J, D)                                                          \
        if (s.nt == NT && s.j == J && s.d == D) {                                 \
            cudaError_t e_ = bm_go_pipe<NT, J, D>(p, s.pdl, stream);              \
            return e_ != cudaSuccess ? e_ : cudaGetLastError();                   \
        }
        BM_PIPES(BM_PGO)
#undef BM_PGO
        return cudaErrorInvalidConfiguration;
    }
    if (s.d > 0)
        s = bm_row_twin(s); /* a base not 16-byte aligned */
    /* Rows beyond the grid are taken by a grid-stride loop. */
    const int64_t cap = (int64_t)(INT_MAX / 8);
    const unsigned rows_grid = (unsigned)(p.rows < cap ? p.rows : cap);
#define BM_GO(NT, J, U, CS)                                                       \
    if (s.nt == NT && s.j == J && s.u == U && s.cs == CS) {                       \
        cudaError_t e_ = vec ? bm_go<NT, J, U, CS, true>(p, rows_grid, s.pdl, stream)  \
                             : bm_go<NT, J, U, CS, false>(p, rows_grid, s.pdl, stream); \
        return e_ != cudaSuccess ? e_ : cudaGetLastError();                       \
    }
    BM_SHAPES(BM_GO)
#undef BM_GO
    return cudaErrorInvalidConfiguration;
}
