/*
 * row_kernel.cuh - the one row kernel behind every local operation (internal).
 *
 * A block of NT threads (a power of two) handles one row at a time. The row
 * is split into C = H/8 chunks of eight BF16 values (16 bytes); thread t owns
 * chunks t, t+NT, ..., t+(J-1)*NT, so every access of a warp is coalesced
 * and NT*J >= C (chunks >= C are padding: value +0, never loaded or stored).
 *
 * One pass per row, everything kept in registers between the stages:
 *   stage A  the row source: finalize of the expert results (experts != NULL)
 *            or the input x;
 *   norm A   optional RMSNorm (post-norm of finalize, or pre-norm of
 *            norm_residual_norm);
 *   out      without a residual: store the row and stop (finalize);
 *   stage B  scales, residual add -> hidden (may overwrite the residual:
 *            each thread reads its elements before it writes them);
 *   norm B   optional RMSNorm of hidden -> normalized.
 * So finalize, norm_residual_norm and the fused finalize_norm_residual_norm
 * are the same kernel with different arguments, and the fused pass reads
 * each input byte once and writes each output byte once.
 *
 * The RMSNorm sum follows SPEC.md's tree exactly: the tree over NT*J leaves
 * (zero padded; adding +0 to a sum of squares never changes it, since such
 * a sum is never -0) first combines chunks that differ in the high index
 * bits. Thread t's chunks all share the low bits t, so each thread first
 * runs the halving tree over its own J chunks, then the block runs it over
 * threads: P[t] += P[t+s] for s = NT/2 .. 32 through shared memory (every
 * warp redoes that part, reading 32-strided values, so that no second
 * barrier is needed), then s = 16 .. 1 with __shfl_down_sync.
 */
#ifndef BEAMMOE_GPU_ROW_KERNEL_CUH
#define BEAMMOE_GPU_ROW_KERNEL_CUH

#include <stdint.h>

#include "numerics.cuh"

/* Arguments of one launch (passed by value). */
struct bm_row_params {
    /* stage A: finalize when experts != NULL, else the rows of x */
    const uint16_t *experts; /* [rows, top_k, hidden] */
    const float *weights;    /* [rows, top_k] */
    int32_t top_k;
    float routed_scale;
    const uint16_t *x;       /* [rows, hidden]; may alias out/normalized */

    int normA;               /* post-norm (finalize) or pre-norm */
    const uint16_t *wA;
    float epsA;

    /* stage B, when residual != NULL */
    const uint16_t *residual; /* may equal out */
    int has_scales;
    float scale_x, scale_r;
    int normB;
    const uint16_t *wB;
    float epsB;

    uint16_t *out;        /* finalize output, or hidden */
    uint16_t *normalized; /* written when normB */

    int64_t rows;
    int32_t hidden;
};

/* The SPEC halving tree over N values held in a register array:
 * v[i] += v[i + s] for s = N/2 .. 1. A template recursion so that every
 * index is a compile-time constant (no local-memory array). */
template <int S>
__device__ __forceinline__ void bm_halving(float *v)
{
    if (S >= 1) {
#pragma unroll
        for (int i = 0; i < S; ++i)
            v[i] = __fadd_rn(v[i], v[i + S]);
        bm_halving<(S > 1 ? S / 2 : 0)>(v);
    }
}
template <>
__device__ __forceinline__ void bm_halving<0>(float *) {}

/* Sum of one value per thread, in SPEC tree order over the thread index;
 * every thread gets the result. red holds NT floats of shared memory; the
 * caller alternates two such buffers between consecutive calls, which is
 * safe because a call's barrier separates a buffer's reads from its next
 * writes two calls later. */
template <int NT>
__device__ __forceinline__ float bm_block_tree(float q, float *red)
{
    constexpr int NW = NT / 32;
    const int lane = threadIdx.x & 31;
    if (NW > 1) {
        red[threadIdx.x] = q;
        __syncthreads();
        float v[NW];
#pragma unroll
        for (int i = 0; i < NW; ++i)
            v[i] = red[lane + 32 * i];
        bm_halving<NW / 2>(v);
        q = v[0];
    }
#pragma unroll
    for (int s = 16; s >= 1; s /= 2)
        q = __fadd_rn(q, __shfl_down_sync(0xFFFFFFFFu, q, s));
    return __shfl_sync(0xFFFFFFFFu, q, 0);
}

/* v <- f(N(v, w, eps)) for the thread's J chunks (padding chunks stay 0). */
template <int NT, int J, bool VEC>
__device__ __forceinline__ void bm_norm_row(float (&v)[J][8], const uint16_t *w,
                                            float eps, int hidden, int C,
                                            float *red)
{
    float P[J];
#pragma unroll
    for (int j = 0; j < J; ++j)
        P[j] = bm_chunk_sumsq(v[j]);
    bm_halving<J / 2>(P);
    const float inv = bm_inv_rms(bm_block_tree<NT>(P[0], red), hidden, eps);
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int c = threadIdx.x + j * NT;
        if (c >= C)
            continue;
        float wf[8];
        if (w) {
            bm_pack8 wp = bm_load8<VEC>(w + (size_t)c * 8);
            bm_unpack8(wp, wf);
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            uint32_t u = bm_bf16(__fmul_rn(v[j][e], inv));
            if (w)
                u = bm_bf16(__fmul_rn(bm_f(u), wf[e]));
            v[j][e] = bm_f(u);
        }
    }
}

/* a = +0; a = a + w[k] * f(x[k]) for k in order, for U slots at a time
 * (all U*J loads are issued before the first use). */
template <int NT, int J, int U, bool VEC>
__device__ __forceinline__ void bm_finalize_slots(float (&acc)[J][8],
                                                  const uint16_t *xr,
                                                  const float *wr, int k,
                                                  int hidden, int C)
{
    bm_pack8 ld[U][J];
    float wk[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        wk[u] = __ldg(wr + k + u);
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = threadIdx.x + j * NT;
            if (c < C)
                ld[u][j] = bm_load8_stream<VEC>(xr + (size_t)(k + u) * hidden +
                                                (size_t)c * 8);
        }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = threadIdx.x + j * NT;
            if (c >= C)
                continue;
            float f[8];
            bm_unpack8(ld[u][j], f);
#pragma unroll
            for (int e = 0; e < 8; ++e)
                acc[j][e] = __fadd_rn(acc[j][e], __fmul_rn(wk[u], f[e]));
        }
}

template <int NT, int J, int U, bool VEC>
__global__ void __launch_bounds__(NT) bm_row_kernel(const bm_row_params p)
{
    __shared__ float red[2][NT];
    int par = 0;
    const int C = p.hidden >> 3;
    const int H = p.hidden;

    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
        float v[J][8];

        /* ---- stage A ---- */
        if (p.experts) {
#pragma unroll
            for (int j = 0; j < J; ++j)
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    v[j][e] = 0.0f; /* a = +0.0 */
            const int K = p.top_k;
            const uint16_t *xr = p.experts + (size_t)row * (size_t)K * H;
            const float *wr = p.weights + (size_t)row * K;
            int k = 0;
            for (; k + U <= K; k += U)
                bm_finalize_slots<NT, J, U, VEC>(v, xr, wr, k, H, C);
            for (; k < K; ++k)
                bm_finalize_slots<NT, J, 1, VEC>(v, xr, wr, k, H, C);
#pragma unroll
            for (int j = 0; j < J; ++j)
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    const uint32_t r = bm_bf16(v[j][e]);
                    v[j][e] = bm_f(bm_bf16(__fmul_rn(bm_f(r), p.routed_scale)));
                }
        } else {
#pragma unroll
            for (int j = 0; j < J; ++j) {
                const int c = threadIdx.x + j * NT;
                bm_pack8 q = {{0u, 0u, 0u, 0u}};
                if (c < C)
                    q = bm_load8<VEC>(p.x + (size_t)row * H + (size_t)c * 8);
                bm_unpack8(q, v[j]);
            }
        }
        /* padding chunks must hold +0 for the norm tree */
#pragma unroll
        for (int j = 0; j < J; ++j)
            if ((int)threadIdx.x + j * NT >= C)
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    v[j][e] = 0.0f;

        /* ---- norm A ---- */
        if (p.normA) {
            bm_norm_row<NT, J, VEC>(v, p.wA, p.epsA, H, C, red[par]);
            par ^= 1;
        }

        /* ---- finalize only: store ---- */
        if (!p.residual) {
#pragma unroll
            for (int j = 0; j < J; ++j) {
                const int c = threadIdx.x + j * NT;
                if (c < C)
                    bm_store8<VEC>(p.out + (size_t)row * H + (size_t)c * 8,
                                   bm_round8(v[j]));
            }
            continue;
        }

        /* ---- stage B: hidden = bf16(bx + br) ---- */
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = threadIdx.x + j * NT;
            if (c >= C)
                continue;
            const size_t off = (size_t)row * H + (size_t)c * 8;
            float r[8];
            bm_unpack8(bm_load8<VEC>(p.residual + off), r);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                float bx = v[j][e], br = r[e];
                if (p.has_scales) {
                    bx = bm_f(bm_bf16(__fmul_rn(bx, p.scale_x)));
                    br = bm_f(bm_bf16(__fmul_rn(br, p.scale_r)));
                }
                v[j][e] = bm_f(bm_bf16(__fadd_rn(bx, br)));
            }
            bm_store8<VEC>(p.out + off, bm_round8(v[j]));
        }

        /* ---- norm B ---- */
        if (p.normB) {
            bm_norm_row<NT, J, VEC>(v, p.wB, p.epsB, H, C, red[par]);
            par ^= 1;
#pragma unroll
            for (int j = 0; j < J; ++j) {
                const int c = threadIdx.x + j * NT;
                if (c < C)
                    bm_store8<VEC>(p.normalized + (size_t)row * H + (size_t)c * 8,
                                   bm_round8(v[j]));
            }
        }
    }
}

#endif
