/*
 * row_kernel.cuh - the one row kernel behind every local operation (internal).
 *
 * A block of NT threads (a power of two) handles one row at a time. The row
 * is split into C = H/8 chunks of eight BF16 values (16 bytes); thread t owns
 * chunks t, t+NT, ..., t+(J-1)*NT, so every access of a warp is coalesced
 * and NT*J >= C (chunks >= C are padding: value +0, never loaded or stored).
 *
 * One pass per row, the row kept in registers between the stages (vector
 * path: the residual row is fetched into shared memory by cp.async at the
 * row's start, so that its latency overlaps the row source's):
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
 * Decode sizes may spread one row over a cluster of CS blocks (CS > 1, on
 * CS multiprocessors): "virtual thread" g = b*NT + t of cluster rank b owns
 * chunks g, g + CS*NT, ...; the tree then runs over the thread's own chunks,
 * across the cluster's blocks (distributed shared memory), then within the
 * block, which is again the SPEC halving order (high index bits first).
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

#include <cooperative_groups.h>

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

/* v <- f(N(v, w, eps)) for the thread's J chunks (padding chunks stay 0).
 * w: the norm weight row [hidden], or NULL. */
template <int NT, int J, int CS, bool VEC>
__device__ __forceinline__ void bm_norm_row(float (&v)[J][8], const uint16_t *w,
                                            float eps, int hidden,
                                            int C, int g0, float *red, float *xred)
{
    float P[J];
#pragma unroll
    for (int j = 0; j < J; ++j)
        P[j] = bm_chunk_sumsq(v[j]);
    bm_halving<J / 2>(P);
    float q = P[0];
    if (CS > 1) {
        /* across the cluster: Q[b] += Q[b + s] for the same t */
        namespace cg = cooperative_groups;
        cg::cluster_group cl = cg::this_cluster();
        xred[threadIdx.x] = q;
        cl.sync();
        float qb[CS];
#pragma unroll
        for (int b = 0; b < CS; ++b)
            qb[b] = cl.map_shared_rank(xred, b)[threadIdx.x];
        bm_halving<CS / 2>(qb);
        q = qb[0];
    }
    const float inv = bm_inv_rms(bm_block_tree<NT>(q, red), hidden, eps);
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int c = g0 + j * CS * NT;
        if (c >= C)
            continue;
        float wf[8];
        if (w)
            bm_unpack8(bm_load8<VEC>(w + (size_t)c * 8), wf);
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
template <int NT, int J, int U, int CS, bool VEC>
__device__ __forceinline__ void bm_finalize_slots(float (&acc)[J][8],
                                                  const uint16_t *xr,
                                                  const float *wr, int k,
                                                  int hidden, int C, int g0)
{
    bm_pack8 ld[U][J];
    float wk[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        wk[u] = __ldg(wr + k + u);
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = g0 + j * CS * NT;
            if (c < C)
                ld[u][j] = bm_load8_stream<VEC>(xr + (size_t)(k + u) * hidden +
                                                (size_t)c * 8);
        }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = g0 + j * CS * NT;
            if (c >= C)
                continue;
            float f[8];
            bm_unpack8(ld[u][j], f);
#pragma unroll
            for (int e = 0; e < 8; ++e)
                acc[j][e] = __fadd_rn(acc[j][e], __fmul_rn(wk[u], f[e]));
        }
}

/* Programmatic dependent launch: wait until the preceding kernel of the
 * stream has completed (and its writes are visible) before touching global
 * memory, and let the next kernel's blocks be scheduled early. Both are
 * no-ops when the launch did not ask for it. */
__device__ __forceinline__ void bm_pdl_wait()
{
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
__device__ __forceinline__ void bm_pdl_trigger()
{
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

template <int NT, int J, int U, int CS, bool VEC>
__global__ void __launch_bounds__(NT) bm_row_kernel(const bm_row_params p)
{
    __shared__ float red[2][NT];
    __shared__ float xred[2][CS > 1 ? NT : 1];
    /* The norm weights of this thread's slots, copied once per block
     * (vector path): each thread copies and later reads only its own slots,
     * so no barrier is needed, only the wait for its own copies. */
    /* The residual row of this thread's slots, fetched with asynchronous
     * copies at the start of the row (vector path): its latency overlaps the
     * row source's and it costs no registers. Each thread copies and later
     * reads only its own slots: no barrier, only the wait for its copies. */
    __shared__ __align__(16) uint16_t rsm[VEC ? NT * J * 8 : 8];
    int par = 0;
    const int C = p.hidden >> 3;
    const int H = p.hidden;
    const int b = CS > 1 ? (int)(blockIdx.x % CS) : 0;
    const int g0 = b * NT + (int)threadIdx.x;

    bm_pdl_wait();
    bm_pdl_trigger();
    /* The norm weights are the same for every row: pull them into L1 now,
     * while the first row's loads are in flight (no registers held). */
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int c = g0 + j * CS * NT;
        if (c >= C)
            continue;
        if (p.normA && p.wA)
            asm volatile("prefetch.global.L1 [%0];" ::"l"(p.wA + (size_t)c * 8));
        if (p.normB && p.wB)
            asm volatile("prefetch.global.L1 [%0];" ::"l"(p.wB + (size_t)c * 8));
    }

    const int64_t row0 = CS > 1 ? (int64_t)(blockIdx.x / CS) : (int64_t)blockIdx.x;
    const int64_t rstep = CS > 1 ? (int64_t)(gridDim.x / CS) : (int64_t)gridDim.x;
    for (int64_t row = row0; row < p.rows; row += rstep) {
        float v[J][8];

        if (VEC && p.residual) {
#pragma unroll
            for (int j = 0; j < J; ++j) {
                const int c = g0 + j * CS * NT;
                if (c < C)
                    bm_cp_async16(&rsm[(j * NT + threadIdx.x) * 8],
                                  p.residual + (size_t)row * H + (size_t)c * 8);
            }
        }

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
                bm_finalize_slots<NT, J, U, CS, VEC>(v, xr, wr, k, H, C, g0);
            for (; k < K; ++k)
                bm_finalize_slots<NT, J, 1, CS, VEC>(v, xr, wr, k, H, C, g0);
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
                const int c = g0 + j * CS * NT;
                bm_pack8 q = {{0u, 0u, 0u, 0u}};
                if (c < C)
                    q = bm_load8<VEC>(p.x + (size_t)row * H + (size_t)c * 8);
                bm_unpack8(q, v[j]);
            }
        }
        /* padding chunks must hold +0 for the norm tree */
#pragma unroll
        for (int j = 0; j < J; ++j)
            if (g0 + j * CS * NT >= C)
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    v[j][e] = 0.0f;

        /* ---- norm A ---- */
        if (p.normA) {
            bm_norm_row<NT, J, CS, VEC>(v, p.wA, p.epsA, H, C, g0, red[par], xred[par]);
            par ^= 1;
        }

        /* ---- finalize only: store ---- */
        if (!p.residual) {
#pragma unroll
            for (int j = 0; j < J; ++j) {
                const int c = g0 + j * CS * NT;
                if (c < C)
                    bm_store8<VEC>(p.out + (size_t)row * H + (size_t)c * 8,
                                   bm_round8(v[j]));
            }
            continue;
        }

        /* ---- stage B: hidden = bf16(bx + br) ---- */
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = g0 + j * CS * NT;
            if (c >= C)
                continue;
            float r[8];
            if (VEC) {
                bm_cp_async_wait();
                bm_unpack8(*reinterpret_cast<const bm_pack8 *>(&rsm[(j * NT + threadIdx.x) * 8]), r);
            } else {
                bm_unpack8(bm_load8<false>(p.residual + (size_t)row * H + (size_t)c * 8), r);
            }
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                float bx = v[j][e], br = r[e];
                if (p.has_scales) {
                    bx = bm_f(bm_bf16(__fmul_rn(bx, p.scale_x)));
                    br = bm_f(bm_bf16(__fmul_rn(br, p.scale_r)));
                }
                v[j][e] = bm_f(bm_bf16(__fadd_rn(bx, br)));
            }
            bm_store8<VEC>(p.out + (size_t)row * H + (size_t)c * 8, bm_round8(v[j]));
        }

        /* ---- norm B ---- */
        if (p.normB) {
            bm_norm_row<NT, J, CS, VEC>(v, p.wB, p.epsB, H, C, g0, red[par], xred[par]);
            par ^= 1;
#pragma unroll
            for (int j = 0; j < J; ++j) {
                const int c = g0 + j * CS * NT;
                if (c < C)
                    bm_store8<VEC>(p.normalized + (size_t)row * H + (size_t)c * 8,
                                   bm_round8(v[j]));
            }
        }
    }
    /* No block of a cluster may exit while a peer can still read its
     * shared memory. */
    if (CS > 1)
        cooperative_groups::this_cluster().sync();
}

#endif
