/*
 * launch.cu - the compiled launch shapes of the row kernel and the choice
 * among them (internal).
 */
#include <limits.h>

#include "launch.h"

/* Every (NT, J, U, CS) instantiated, each in a vector and a scalar version.
 * bm_pick_shape must only return listed shapes (bm_shape_ok says). */
#define BM_SHAPES(X)                                                         \
    X(32, 1, 8, 1) X(64, 1, 8, 1) X(128, 1, 8, 1) X(256, 1, 8, 1)             \
    X(512, 1, 8, 1) X(1024, 1, 8, 1) X(256, 1, 4, 1) X(512, 1, 4, 1)          \
    X(64, 2, 4, 1) X(128, 2, 4, 1) X(256, 2, 4, 1) X(128, 2, 8, 1)            \
    X(256, 2, 8, 1) X(512, 2, 2, 1) X(512, 2, 4, 1)                           \
    X(128, 4, 2, 1) X(256, 4, 2, 1) X(256, 4, 1, 1) X(128, 8, 1, 1)           \
    X(64, 1, 8, 2) X(64, 1, 8, 4) X(64, 1, 8, 8) X(128, 1, 8, 2)              \
    X(128, 1, 8, 4) X(128, 1, 8, 8) X(256, 1, 8, 2) X(256, 1, 8, 4)           \
    X(512, 1, 8, 2)

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
        s.nt = 512; s.j = 2; s.u = 2;
    } else if (n2 == 512) {
        s.nt = 256; s.j = 2; s.u = 4;
    } else if (n2 == 256) {
        s.nt = 128; s.j = 2; s.u = 4;
    } else {
        s.nt = n2; s.j = 1; s.u = 8;
    }
    return s;
}

int bm_shape_ok(bm_shape s, int hidden)
{
    if ((long)s.cs * s.nt * s.j < hidden / 8)
        return 0;
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

cudaError_t bm_launch_rows(const bm_row_params &p, bm_shape s, int vec,
                           cudaStream_t stream)
{
    if (p.rows <= 0)
        return cudaSuccess;
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
