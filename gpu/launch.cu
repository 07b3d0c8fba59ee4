/*
 * launch.cu - the compiled launch shapes of the row kernel and the choice
 * among them (internal).
 */
#include <limits.h>

#include "launch.h"

/* Every (NT, J, U) instantiated, each in a vector and a scalar version.
 * Keep in sync with bm_pick_shape: it must only return listed shapes. */
#define BM_SHAPES(X)                                                    \
    X(32, 1, 8) X(64, 1, 8) X(128, 1, 8) X(256, 1, 8) X(512, 1, 8)       \
    X(1024, 1, 8) X(1024, 1, 4) X(512, 1, 4) X(256, 1, 4)               \
    X(64, 2, 4) X(128, 2, 4) X(256, 2, 4) X(512, 2, 4) X(128, 2, 8)     \
    X(256, 2, 8) X(512, 2, 2)                                           \
    X(32, 4, 2) X(64, 4, 2) X(128, 4, 2) X(256, 4, 2) X(128, 4, 4)      \
    X(256, 4, 4) X(256, 4, 1)                                           \
    X(32, 8, 1) X(64, 8, 1) X(128, 8, 1) X(128, 8, 2)

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
    if (rows <= 64) {
        /* decode: one chunk per thread, the whole row loaded at once */
        s.nt = n2;
        s.j = 1;
        s.u = 8;
    } else {
        /* prefill: up to 256 threads, several chunks each */
        s.nt = n2 < 256 ? n2 : 256;
        s.j = n2 / s.nt;
        s.u = s.j == 1 ? 8 : s.j == 2 ? 4 : 2;
    }
    return s;
}

int bm_shape_ok(bm_shape s, int hidden)
{
    if ((long)s.nt * s.j < hidden / 8)
        return 0;
#define BM_OK(NT, J, U) \
    if (s.nt == NT && s.j == J && s.u == U) return 1;
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

cudaError_t bm_launch_rows(const bm_row_params &p, bm_shape s, int vec,
                           cudaStream_t stream)
{
    if (p.rows <= 0)
        return cudaSuccess;
    /* Rows beyond the grid are taken by a grid-stride loop. */
    const unsigned grid = p.rows < (int64_t)INT_MAX ? (unsigned)p.rows : (unsigned)INT_MAX;
#define BM_GO(NT, J, U)                                                          \
    if (s.nt == NT && s.j == J && s.u == U) {                                    \
        if (vec)                                                                 \
            bm_row_kernel<NT, J, U, true><<<grid, NT, 0, stream>>>(p);           \
        else                                                                     \
            bm_row_kernel<NT, J, U, false><<<grid, NT, 0, stream>>>(p);          \
        return cudaGetLastError();                                               \
    }
    BM_SHAPES(BM_GO)
#undef BM_GO
    return cudaErrorInvalidConfiguration;
}
