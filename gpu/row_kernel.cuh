/*
 * row_kernel.cuh - the register-resident row kernel (internal): decode
 * shapes, and prefill shapes where a row holds few items.
 *
 * A block of NT threads (a power of two) handles one row at a time. The row
 * is split into C = H/8 chunks of eight BF16 values (16 bytes); thread t owns
 * chunks t, t+NT, ..., t+(J-1)*NT, so every access of a warp is coalesced
 * and NT*J >= C (chunks >= C are padding: value +0, never loaded or stored).
 *
 * One pass per row, the row kept in registers between the stages of
 * row_ops.cuh (vector path: the residual row is fetched into shared memory
 * by cp.async at the row's start, so that its latency overlaps the row
 * source's):
 *   stage A  the row source: finalize of the expert results (FIN) or the
 *            input x;
 *   norm A   optional RMSNorm (post-norm of finalize, or pre-norm of
 *            norm_residual_norm);
 *   out      without a residual: store the row and stop (finalize);
 *   stage B  scales, residual add -> hidden (may overwrite the residual:
 *            each thread reads its elements before it writes them);
 *   norm B   optional RMSNorm of hidden -> normalized.
 * So finalize, norm_residual_norm and the fused finalize_norm_residual_norm
 * are the same kernel with different arguments (FIN is a template argument
 * only so that a kernel without expert slots holds no registers for them),
 * and the fused pass reads each input byte once and writes each output byte
 * once.
 *
 * Decode sizes may spread one row over a cluster of CS blocks (CS > 1, on
 * CS multiprocessors): thread t of cluster rank b is the "virtual thread"
 * g that owns chunks g, g + CS*NT, ... (one chunk a thread: the row split
 * evenly, bm_cluster_slot); the norm's tree then runs over the thread's own
 * chunks, across the cluster's blocks (the exchange of row_ops.cuh), then
 * within the block, which is the halving order of docs/numerics.md (high
 * index bits first).
 */
#ifndef BEAMMOE_GPU_ROW_KERNEL_CUH
#define BEAMMOE_GPU_ROW_KERNEL_CUH

#include <stdint.h>

#include <cooperative_groups.h>

#include "params.cuh"
#include "quant_row.cuh"
#include "row_ops.cuh"

template <int NT, int J, int U, int CS, bool VEC, bool FIN, int Q>
__global__ void __launch_bounds__(NT) bm_row_kernel(const typename bm_kparams<Q>::type p)
{
    __shared__ float red[2][NT];
    __shared__ bm_xchg<NT, CS> xc[1];
    /* The residual row of this thread's chunks, fetched with asynchronous
     * copies at the start of the row (vector path): its latency overlaps the
     * row source's and it costs no registers. Each thread copies and later
     * reads only its own slots: no barrier, only the wait for its copies. */
    __shared__ __align__(16) uint16_t rsm[VEC ? NT * J * 8 : 8];
    constexpr int STRIDE = CS * NT;
    const int C = p.hidden >> 3;
    const int H = p.hidden;
    const int b = CS > 1 ? (int)(blockIdx.x % CS) : 0;
    /* The row split evenly over the cluster (bm_cluster_slot) for blocks
     * of 256 threads and more: clusters of 4 and 2 at H = 7168, where it
     * measured faster. With it the compiler allocated the kernels of 128
     * threads differently, and those at T = 1 and 8 ran slower though
     * their split is b * NT + t already (896 chunks on eight blocks of
     * 128); so they keep the code they had [2026-12-04-constants: even]. */
    constexpr bool EVEN = CS > 1 && J == 1 && NT >= 256;
    const int g0 = EVEN ? bm_cluster_slot<NT, CS>(C, b) : b * NT + (int)threadIdx.x;
    /* the norm weights loaded before each reduction (bm_norm_stage): the
     * decode kernels of the forms that ask for it (bm_form::wfirst) */
    constexpr bool WFIRST = bm_wfirst<Q>::value && J == 1;
    /* the number of norms of a row is the same in every block of a cluster */
    const bool xchg = CS > 1 && (p.normA || (p.residual && p.normB));
    bm_tree_ctx<NT, CS> tc = {red, xc, 0, 0u, 0, 0, EVEN ? g0 : -1};

    bm_quant_touch<Q>(p);
    if constexpr (CS > 1)
        if (xchg)
            bm_xchg_start<NT, CS>(xc[0]);
    bm_pdl_wait();
    bm_pdl_trigger();
    bm_prefetch_weights<J, STRIDE>(p.normA ? p.wA : NULL, p.normB ? p.wB : NULL, C, g0);

    const int64_t row0 = CS > 1 ? (int64_t)(blockIdx.x / CS) : (int64_t)blockIdx.x;
    const int64_t rstep = CS > 1 ? (int64_t)(gridDim.x / CS) : (int64_t)gridDim.x;
    for (int64_t row = row0; row < p.rows; row += rstep) {
        float v[J][8];
        bm_pack8 pk[J];

        if (VEC && p.residual) {
#pragma unroll
            for (int j = 0; j < J; ++j) {
                const int c = g0 + j * STRIDE;
                if (c < C)
                    bm_cp_async16(&rsm[(j * NT + threadIdx.x) * 8],
                                  p.residual + (size_t)row * H + (size_t)c * 8);
            }
        }

        /* ---- stage A: the finalized row, or the row of x ---- */
        if (FIN) {
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
                pk[j] = bm_finalize8(v[j], p.routed_scale);
        } else {
#pragma unroll
            for (int j = 0; j < J; ++j) {
                const int c = g0 + j * STRIDE;
                pk[j] = bm_pack8{{0u, 0u, 0u, 0u}};
                if (c < C)
                    pk[j] = bm_load8<VEC>(p.x + (size_t)row * H + (size_t)c * 8);
                bm_unpack8(pk[j], v[j]);
            }
        }
        /* padding chunks must hold +0 for the norm tree */
#pragma unroll
        for (int j = 0; j < J; ++j)
            if (g0 + j * STRIDE >= C)
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    v[j][e] = 0.0f;

        /* ---- norm A ---- */
        const bool last_row = row + rstep >= p.rows;
        if (p.normA)
            bm_norm_stage<NT, J, CS, VEC, STRIDE, WFIRST>(v, pk, p.wA, p.epsA, H, C, g0, tc,
                                                          last_row && !(p.residual && p.normB));

        /* ---- finalize only: store ---- */
        if (!p.residual) {
            bm_store_row<J, VEC, STRIDE>(p.out + (size_t)row * H, pk, C, g0);
            continue;
        }

        /* ---- stage B: hidden = bf16(bx + br) ---- */
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = g0 + j * STRIDE;
            if (c >= C)
                continue;
            bm_pack8 r;
            if (VEC) {
                bm_cp_async_wait();
                r = *reinterpret_cast<const bm_pack8 *>(&rsm[(j * NT + threadIdx.x) * 8]);
            } else {
                r = bm_load8<false>(p.residual + (size_t)row * H + (size_t)c * 8);
            }
            pk[j] = bm_residual8(v[j], r, p.has_scales, p.scale_x, p.scale_r);
            bm_store8<VEC>(p.out + (size_t)row * H + (size_t)c * 8, pk[j]);
        }

        /* ---- norm B ---- */
        if (p.normB) {
            /* the plain kernels' call as it was before Q existed: the
             * constant-false term changed their register allocation */
            if constexpr (Q) {
                bm_norm_stage<NT, J, CS, VEC, STRIDE, WFIRST>(v, pk, p.wB, p.epsB, H, C, g0, tc,
                                                              last_row && !bm_quant_exchanges<Q>(p));
            } else {
                bm_norm_stage<NT, J, CS, VEC, STRIDE>(v, pk, p.wB, p.epsB, H, C, g0, tc, last_row);
            }
            bm_out_normalized<NT, J, CS, VEC, STRIDE, Q>(p, row, pk, v, C, g0, tc, last_row);
        }
    }
    if (xchg)
        tc.finish();
}

#endif
