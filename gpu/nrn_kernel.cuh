/*
 * nrn_kernel.cuh - norm_residual_norm's own kernel (internal): prefill at
 * H >= 2048, decode at H > 4096 (gpu/launch.cu, bm_pick_shape).
 *
 * A norm_residual_norm row is two loads (x, residual) and two stores
 * (hidden, normalized) around one or two block reductions: what bounds it
 * is how soon each row's loads are issued and how little waits between
 * them. Differences from the general row kernel (row_kernel.cuh), each
 * measured with bench/shape_sweep [2026-12-04-constants: nrn]:
 *  - x and the residual are loaded into registers together, at the row's
 *    start (both loads in flight at once);
 *  - the norm weights' chunks are loaded into registers beside the row, at
 *    its start, instead of being prefetched into L1 at kernel start and
 *    read after the reduction: a prefetch per block of a grid of one block
 *    per row cost time, and a load after the reduction puts an L2 round
 *    trip on the row's critical path;
 *  - PK shapes hold the row as packed BF16 bits instead (bm_nrn_row_packed):
 *    at two blocks per multiprocessor slower, but it is what lets four
 *    rows of H = 7168 stay resident, which the library
 *    takes in prefill at H > 4096, and at H = 4096 with scales (eight rows
 *    of 128 x 4; gpu/shapes.def names the measurement);
 *  - PF shapes have one thread request the block's next row of the
 *    grid-stride loop (x and the residual) into L2 as a row starts (two
 *    bulk prefetches, no registers). gpu/launch.cu launches one block per
 *    row, so no block has a next row and no prefetch is issued: the PF
 *    kernels run the same loads and arithmetic as their twins (without a
 *    quantized output the same registers and no spills either,
 *    gpu/ptxas-regs.txt): what shape_sweep measured for them is not the
 *    prefetch's. A persistent grid, which gives the prefetch a row to
 *    fetch, measured slower;
 *  - HINT picks an L2 policy for the row loads (0 none, 1 evict_last,
 *    2 evict_first); the library takes evict_last in prefill beyond
 *    T = 512 and evict_first at decode and up to T = 512, and for the FP8
 *    output at H = 2048: gpu/shapes.def says where.
 * The arithmetic is the stages of row_ops.cuh in the same order, so the
 * bits are those of every other kernel. x may be the buffer of hidden or
 * normalized (UNFUSED's second launch) and the residual that of hidden (in
 * place): each thread loads its chunks of a row before it stores them, and
 * no other thread touches them. Vector path only (16-byte loads),
 * rows with a residual, no expert slots; gpu/launch.cu sends every other
 * call to the row kernel of the same NT and J.
 */
#ifndef BEAMMOE_GPU_NRN_KERNEL_CUH
#define BEAMMOE_GPU_NRN_KERNEL_CUH

#include "params.cuh"
#include "quant_row.cuh"
#include "row_ops.cuh"

/* 16-byte load with an L2 eviction policy (HINT 1 evict_last, 2
 * evict_first; 0 a plain load). */
template <int HINT>
__device__ __forceinline__ bm_pack8 bm_load8_hint(const uint16_t *p, uint64_t pol)
{
    bm_pack8 r;
    if (HINT == 0) {
        const uint4 q = *reinterpret_cast<const uint4 *>(p);
        r.w[0] = q.x; r.w[1] = q.y; r.w[2] = q.z; r.w[3] = q.w;
    } else {
        asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                     : "=r"(r.w[0]), "=r"(r.w[1]), "=r"(r.w[2]), "=r"(r.w[3])
                     : "l"(p), "l"(pol));
    }
    return r;
}

template <int HINT>
__device__ __forceinline__ uint64_t bm_l2_policy()
{
    uint64_t pol = 0;
    if (HINT == 1)
        asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
    else if (HINT == 2)
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}

/* One row held as BF16 bits (PK shapes): every value a stage leaves is
 * rounded to BF16 (x, the pre-normed x, hidden), so the packed bits are all
 * the row needs between stages, four registers per chunk instead of eight
 * floats and four. That is what lets four rows of H = 7168 (or eight of
 * 4096, a shape bench/shape_sweep times) stay resident per multiprocessor:
 * a call of a few hundred rows runs in one wave. The norm weights are
 * loaded just before each reduction (their latency behind it; from L1
 * after the first rows). Same stages, same order, same bits as the float
 * rows below. */
template <int NT, int J, int HINT, int Q>
__device__ __forceinline__ void bm_nrn_row_packed(const typename bm_kparams<Q>::type &p, int64_t row, int t,
                                                  uint64_t pol, bm_tree_ctx<NT, 1> &tc)
{
    const int C = p.hidden >> 3;
    const int H = p.hidden;
    bm_pack8 h[J], r[J], w[J];
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int c = t + j * NT;
        h[j] = r[j] = bm_pack8{{0u, 0u, 0u, 0u}}; /* padding chunks: +0 */
        if (c < C) {
            h[j] = bm_load8_hint<HINT>(p.x + (size_t)row * H + (size_t)c * 8, pol);
            r[j] = bm_load8_hint<HINT>(p.residual + (size_t)row * H + (size_t)c * 8, pol);
        }
    }

    /* ---- norm A (pre-norm) of x ---- */
    if (p.normA) {
        bm_weight_chunks<J, true, NT>(w, p.wA, C, t);
        bm_norm_stage_packed<NT, J, 1, NT>(h, w, p.wA != NULL, p.epsA, H, C, t, tc, false,
                                           [&](int j, const bm_pack8 &y) { h[j] = y; });
    }

    /* ---- scales, residual add -> hidden ---- */
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int c = t + j * NT;
        if (c >= C)
            continue;
        float f[8];
        bm_unpack8(h[j], f);
        h[j] = bm_residual8(f, r[j], p.has_scales, p.scale_x, p.scale_r);
        bm_store8<true>(p.out + (size_t)row * H + (size_t)c * 8, h[j]);
    }

    /* ---- norm B of hidden -> normalized ---- */
    if (!p.normB)
        return;
    bm_weight_chunks<J, true, NT>(w, p.wB, C, t);
    if constexpr (Q) {
        float v[J][8] = {};
        bm_pack8 pk[J];
        bm_norm_stage_packed<NT, J, 1, NT>(h, w, p.wB != NULL, p.epsB, H, C, t, tc, false,
                                           [&](int j, const bm_pack8 &y) {
                                               pk[j] = y;
                                               bm_unpack8(y, v[j]);
                                           });
        bm_out_normalized<NT, J, 1, true, NT, Q>(p, row, pk, v, C, t, tc, false);
    } else {
        bm_norm_stage_packed<NT, J, 1, NT>(h, w, p.wB != NULL, p.epsB, H, C, t, tc, false,
                                           [&](int j, const bm_pack8 &y) {
                                               bm_store8<true>(p.normalized + (size_t)row * H +
                                                               (size_t)(t + j * NT) * 8, y);
                                           });
    }
}

/* The block's next row (x and the residual) requested into L2 by one
 * thread's two bulk prefetches, so that memory stays busy while the block
 * reduces the current row and the next row's loads find it in L2. */
__device__ __forceinline__ void bm_prefetch_row_l2(const uint16_t *x, const uint16_t *res, int64_t row,
                                                   int64_t rows, int H)
{
    if (threadIdx.x == 0 && row < rows) {
        bm_prefetch_l2(x + (size_t)row * H, (uint32_t)H * 2u);
        bm_prefetch_l2(res + (size_t)row * H, (uint32_t)H * 2u);
    }
}

template <int NT, int J, int MB, int HINT, int Q, int PK, int PF = 0>
__global__ void __launch_bounds__(NT, MB) bm_nrn_kernel(const typename bm_kparams<Q>::type p)
{
    __shared__ float red[2][NT];
    bm_tree_ctx<NT, 1> tc = {red, nullptr, 0, 0u, 0, 0, -1};
    const int C = p.hidden >> 3;
    const int H = p.hidden;
    const int t = threadIdx.x;
    const uint64_t pol = bm_l2_policy<HINT>();
    const uint16_t *wA = p.normA ? p.wA : NULL;
    const uint16_t *wB = p.normB ? p.wB : NULL;
    const bm_pack8 zero = {{0u, 0u, 0u, 0u}};

    bm_pdl_wait();
    bm_pdl_trigger();

    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
        if constexpr (PF)
            bm_prefetch_row_l2(p.x, p.residual, row + gridDim.x, p.rows, H);
        if constexpr (PK) {
            bm_nrn_row_packed<NT, J, HINT, Q>(p, row, t, pol, tc);
        } else {
            bm_pack8 xr[J], rr[J], wa[J], wb[J];
            float v[J][8];
#pragma unroll
            for (int j = 0; j < J; ++j) {
                const int c = t + j * NT;
                xr[j] = rr[j] = wa[j] = wb[j] = zero;
                if (c < C) {
                    xr[j] = bm_load8_hint<HINT>(p.x + (size_t)row * H + (size_t)c * 8, pol);
                    rr[j] = bm_load8_hint<HINT>(p.residual + (size_t)row * H + (size_t)c * 8, pol);
                    if (wA)
                        wa[j] = bm_load8<true>(wA + (size_t)c * 8);
                    if (wB)
                        wb[j] = bm_load8<true>(wB + (size_t)c * 8);
                }
                bm_unpack8(xr[j], v[j]); /* padding chunks: +0 */
            }

            /* ---- norm A (pre-norm) of x ---- */
            if (p.normA)
                bm_norm_stage_emit<NT, J, 1, NT>(v, wa, wA != NULL, p.epsA, H, C, t, tc, false,
                                                 [](int, const bm_pack8 &) {});

            /* ---- scales, residual add -> hidden ---- */
#pragma unroll
            for (int j = 0; j < J; ++j) {
                const int c = t + j * NT;
                if (c >= C)
                    continue;
                const bm_pack8 pk = bm_residual8(v[j], rr[j], p.has_scales, p.scale_x, p.scale_r);
                bm_store8<true>(p.out + (size_t)row * H + (size_t)c * 8, pk);
            }

            /* ---- norm B of hidden -> normalized ---- */
            if (p.normB) {
                if constexpr (Q) {
                    bm_pack8 pk[J];
                    bm_norm_stage_held<NT, J, 1, NT>(v, pk, wb, wB != NULL, p.epsB, H, C, t, tc, false);
                    bm_out_normalized<NT, J, 1, true, NT, Q>(p, row, pk, v, C, t, tc, false);
                } else {
                    /* each chunk stored as soon as it is normalized:
                     * fewer live registers than collecting the row */
                    bm_norm_stage_emit<NT, J, 1, NT>(v, wb, wB != NULL, p.epsB, H, C, t, tc, false,
                                                     [&](int j, const bm_pack8 &y) {
                                                         bm_store8<true>(p.normalized + (size_t)row * H +
                                                                         (size_t)(t + j * NT) * 8, y);
                                                     });
                }
            }
        }
    }
}

#endif
