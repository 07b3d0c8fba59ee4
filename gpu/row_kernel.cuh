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

#include "backend.h" /* bm_quant; beammoe.h: BEAM_NVFP4_SCALE_OFFSET */
#include "quant.cuh"
#include "row_ops.cuh"

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
    uint16_t *normalized; /* written when normB (with a quantized output:
                           * when not NULL) */

    int64_t rows;
    int32_t hidden;
};

/* The quantized output of normalized (norm B) is lib/backend.h's bm_quant
 * (bm_args.q as checked). Only the kernels compiled with it (Q) take it, in
 * bm_row_params_q: a larger parameter block changed how the compiler laid
 * out the plain kernels (the nrn kernel at T = 4096, H = 7168: 59 -> 68 us
 * on an H200). */
struct bm_row_params_q : bm_row_params {
    bm_quant q;
};
/* Which quantized output a kernel is compiled with (its template argument
 * Q): none, the FP8 kinds, or NVFP4. Each its own kernels: a kernel holds
 * registers only for the code it can run (NVFP4's code in the FP8 kernels
 * cost norm_residual_norm's FP8 form 6-8% at T >= 4096, H = 7168: spills).
 * bm_qf_of: the form of a kind (0 or BEAM_QUANT_*), the one place that
 * maps them. */
enum { BM_QF_NONE = 0, BM_QF_FP8 = 1, BM_QF_NVFP4 = 2 };
constexpr int bm_qf_of(int kind)
{
    return !kind ? BM_QF_NONE : kind == BEAM_QUANT_NVFP4 ? BM_QF_NVFP4 : BM_QF_FP8;
}
/* whether q's values take the vector stores: 8 bytes a chunk (NVFP4: 4) */
inline bool bm_quant_vec_ok(const bm_quant &q)
{
    return ((uintptr_t)q.values & (bm_qf_of(q.kind) == BM_QF_NVFP4 ? 3u : 7u)) == 0;
}
/* The parameter block of a kernel compiled with (Q) or without the
 * quantized output: Plain, or WithQ (Plain and a bm_quant q). The
 * row kernels' here, the gather kernels' in gather_fused.cu. */
template <class Plain, class WithQ, int Q>
struct bm_params_for {
    typedef WithQ type;
};
template <class Plain, class WithQ>
struct bm_params_for<Plain, WithQ, BM_QF_NONE> {
    typedef Plain type;
};
template <int Q>
struct bm_kparams : bm_params_for<bm_row_params, bm_row_params_q, Q> {
};

/* The NVFP4 output of one row's normalized values (docs/numerics.md#nvfp4),
 * v and its chunks as bm_quant_row's: a block of 16 values is two chunks on
 * adjacent lanes, so its maximum is one shuffle; the even chunk's thread
 * stores the block's scale. os = g * (1 / value(sf)) is a reciprocal and a
 * multiply per chunk, not per value: the definition's own two operations,
 * with no division and no slow-path call. */
template <int J, bool VEC, int STRIDE>
__device__ __forceinline__ void bm_nvfp4_row(const bm_quant &q, int H, int64_t row,
                                             const float (&v)[J][8], int C, int g0, bool st)
{
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int c = g0 + j * STRIDE;
        const uint32_t sf = bm_nvfp4_scale_code_dev(bm_lanes_max(bm_absmax8(v[j]), 2), q.scale);
        if (!st || c >= C)
            continue;
        /* its bm_rcp_rn is RN(1 / v) on [2^-126, 2^126): every nonzero E4M3 value */
        const float os = bm_nvfp4_factor(sf, q.scale);
        const uint32_t codes = bm_nvfp4_pack8(v[j], os);
        if ((c & 1) == 0)
            q.block_scales[BEAM_NVFP4_SCALE_OFFSET(row, c >> 1, H)] = (uint8_t)sf;
        uint8_t *dst = q.values + (size_t)row * (H / 2) + (size_t)c * 4;
        if (VEC) {
            *reinterpret_cast<uint32_t *>(dst) = codes;
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e)
                dst[e] = (uint8_t)(codes >> (8 * e));
        }
    }
}

/* The quantized output of one row's normalized values (docs/numerics.md#fp8;
 * QF: the kernel's form, NVFP4 to bm_nvfp4_row):
 * v holds f(normalized) of the thread's chunks c = g0 + j * STRIDE (c >= C:
 * padding). Groups of 128 or 64 values are 16 or 8 chunks of consecutive
 * lanes, so a group's maximum is a warp reduction among them
 * (bm_groups_max); a token's maximum is
 * the row's, across the cluster (tc; last: no exchange follows in this
 * kernel). Every thread of the block (of every block of the cluster) must
 * call it; st false: compute, store nothing (a gather block that failed). */
template <int NT, int J, int CS, bool VEC, int STRIDE, int QF>
__device__ __forceinline__ void bm_quant_row(const bm_quant &q, int H, int64_t row,
                                             const float (&v)[J][8], int C, int g0,
                                             bm_tree_ctx<NT, CS> &tc, bool last, bool st = true)
{
    if constexpr (QF == BM_QF_NVFP4) {
        bm_nvfp4_row<J, VEC, STRIDE>(q, H, row, v, C, g0, st);
        return;
    }
    float s = q.scale;
    if (q.kind == BEAM_QUANT_FP8_TOKEN) {
        float m = 0.0f;
#pragma unroll
        for (int j = 0; j < J; ++j)
            if (g0 + j * STRIDE < C)
                m = fmaxf(m, bm_absmax8(v[j]));
        s = bm_fp8_token_scale(tc.max(m, last), q.ue8m0);
        if (st && g0 == 0)
            q.scales[row * q.ld_t] = s;
    }
    /* (a group's scale and reciprocal come per chunk, below) */
    float r = q.kind == BEAM_QUANT_FP8_GROUP ? 0.0f : bm_rcp_rn(s);
    /* the dynamic kinds' UE8M0 scales are powers of two: x * (1 / s) exact */
    const bool pow2 = q.ue8m0 != 0;
    /* a group is 16 or 8 chunks: shifts, not a division by a variable */
    const int lg = q.group == 128 ? 4 : 3;
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int c = g0 + j * STRIDE;
        if (q.kind == BEAM_QUANT_FP8_GROUP) {
            const float m = bm_absmax8(v[j]);
            s = bm_fp8_group_scale(lg == 4 ? bm_groups_max<16>(m) : bm_groups_max<8>(m), BM_FP8_GROUP_EPS, q.ue8m0);
            r = bm_rcp_rn(s);
            if (st && c < C && (c & ((1 << lg) - 1)) == 0)
                q.scales[row * q.ld_t + (int64_t)(c >> lg) * q.ld_g] = s;
        }
        if (!st || c >= C)
            continue;
        const uint2 codes = bm_fp8_quant8(v[j], s, r, pow2);
        uint8_t *dst = q.values + (size_t)row * H + (size_t)c * 8;
        if (VEC) {
            *reinterpret_cast<uint2 *>(dst) = codes;
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                dst[e] = (uint8_t)(codes.x >> (8 * e));
                dst[e + 4] = (uint8_t)(codes.y >> (8 * e));
            }
        }
    }
}

/* Whether the quantized output takes a cluster exchange after norm B (a
 * token's maximum): then norm B's exchange is not a kernel's last. */
template <int Q, class P>
__device__ __forceinline__ bool bm_quant_exchanges(const P &p)
{
    if constexpr (Q)
        return p.q.kind == BEAM_QUANT_FP8_TOKEN;
    return false;
}

/* Read the quantized output's parameters at kernel start (Q kernels):
 * they are the end of the parameter block, which the rest of the kernel
 * never reads, so their first read, in the row's tail after norm B, waited
 * for the constant cache each launch (the fused op at T = 1, H = 7168, FP8
 * group, on an H200: 3.78 -> 3.72 us with this). Thread 0 of each block
 * stores a value made of every field into shared memory, so that ptxas
 * keeps the reads; the other warps of the multiprocessor then find them
 * cached. (Measured in the decode row kernel only; the gather kernels do
 * not call it.) */
template <int Q, class P>
__device__ __forceinline__ void bm_quant_touch(const P &p)
{
    if constexpr (Q) {
        __shared__ volatile int sink;
        const bm_quant &q = p.q;
        const int t = q.kind ^ q.group ^ q.ue8m0 ^ __float_as_int(q.scale) ^ (int)(uintptr_t)q.values ^
                      (int)(uintptr_t)q.scales ^ (int)q.ld_t ^ (int)q.ld_g ^ (int)(uintptr_t)q.block_scales;
        if (threadIdx.x == 0)
            sink = t;
    }
}

/* Norm B's output: the BF16 rows (when asked for) and the quantized form
 * (when asked for). pk: the thread's packed chunks, v: the same widened. Q:
 * the kernel was compiled with the quantized output (a kernel without it
 * holds no registers for it: the plain kernels stay as fast as before). */
template <int NT, int J, int CS, bool VEC, int STRIDE, int Q>
__device__ __forceinline__ void bm_out_normalized(const typename bm_kparams<Q>::type &p, int64_t row,
                                                  const bm_pack8 (&pk)[J], const float (&v)[J][8], int C, int g0,
                                                  bm_tree_ctx<NT, CS> &tc, bool last)
{
    if constexpr (Q) {
        if (p.normalized)
            bm_store_row<J, VEC, STRIDE>(p.normalized + (size_t)row * p.hidden, pk, C, g0);
        bm_quant_row<NT, J, CS, VEC, STRIDE, Q>(p.q, p.hidden, row, v, C, g0, tc, last);
    } else {
        bm_store_row<J, VEC, STRIDE>(p.normalized + (size_t)row * p.hidden, pk, C, g0);
    }
}

/* a = +0; a = a + w[k] * f(x[k]) for k in order, for U slots at a time
 * (all U*J loads are issued before the first use). The __syncwarp between
 * the loads and the sums is what keeps them so: ptxas moves a load down to
 * its first use when it judges registers short, and may not move one past
 * a warp barrier (which orders the lanes' memory accesses). Without it the
 * FP8 kernels of decode issued the eighth slot's load and the last weights
 * only after the first seven slots' sums, one more trip to memory (the
 * fused op with FP8 group 128 at T = 1, H = 7168, on an H200: 4.19 us
 * against 3.75 with it). The weights are plain loads: as __ldg
 * (ld.global.nc) ptxas issued them one slot at a time even so (the plain
 * kernel: 3.65 -> 3.39 us). */
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
        wk[u] = wr[k + u];
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = g0 + j * CS * NT;
            if (c < C)
                ld[u][j] = bm_load8_stream<VEC>(xr + (size_t)(k + u) * hidden +
                                                (size_t)c * 8);
        }
    }
    __syncwarp();
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = g0 + j * CS * NT;
            if (c >= C)
                continue;
            bm_slot8(acc[j], ld[u][j], wk[u]);
        }
}

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
     * measured 2-4% faster (docs/PERF.md). With it the compiler allocated
     * the kernels of 128 threads differently, and those at T = 1 and 8 ran
     * 2-4% slower though their split is b * NT + t already (896 chunks on
     * eight blocks of 128); so they keep the code they had. */
    constexpr bool EVEN = CS > 1 && J == 1 && NT >= 256;
    const int g0 = EVEN ? bm_cluster_slot<NT, CS>(C, b) : b * NT + (int)threadIdx.x;
    /* the norm weights loaded before each reduction: the FP8 decode
     * kernels (bm_norm_stage) */
    constexpr bool WFIRST = Q == BM_QF_FP8 && J == 1;
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
