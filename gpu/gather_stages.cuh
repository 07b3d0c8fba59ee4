/*
 * gather_stages.cuh - the pieces of a row that both peer-memory kernel
 * families compose (internal, C++): the gather's (gather_fused.cu) and
 * the all-reduce's (allreduce_fused.cu). The finalize of a row's slots,
 * stage B with its pushes, the normalized outputs, the copy of a row a
 * peer pushed, and a block's start. The arithmetic itself is
 * row_ops.cuh's; the flag protocol gather_proto.cuh's.
 */
#ifndef BEAMMOE_GPU_GATHER_STAGES_CUH
#define BEAMMOE_GPU_GATHER_STAGES_CUH

#include <stdint.h>

#include "gather_proto.cuh"
#include "params.cuh"
#include "quant_row.cuh"
#include "row_ops.cuh"

#define BM_TP_U 4 /* expert slots loaded ahead (two chunks per thread) */

/* The parameters of the kernels compiled with the quantized output of
 * normalized (Q), as the row kernel's (row_kernel.cuh): the plain kernels
 * keep the smaller block. */
struct bm_tp_params_q : bm_tp_params {
    bm_quant q;
};
template <int Q>
struct bm_tp_kparams : bm_params_for<bm_tp_params, bm_tp_params_q, Q> {
};

/* Normalized rows out (st: this block stores): the BF16 row where the call
 * has one, and with Q the quantized form. Every thread of the block calls
 * it (the quantization's maxima are shuffles and block reductions). */
template <int NT, int J, int CS, bool VEC, int STRIDE, int Q>
__device__ __forceinline__ void bm_tp_out_normalized(const typename bm_tp_kparams<Q>::type &p, int64_t g,
                                                     const bm_pack8 (&pk)[J], const float (&v)[J][8], int C,
                                                     int g0, bm_tree_ctx<NT, CS> &tc, bool st)
{
    if (st && p.normalized)
        bm_store_row<J, VEC, STRIDE>(p.normalized + (size_t)g * p.hidden, pk, C, g0);
    if constexpr (Q)
        bm_quant_row<NT, J, CS, VEC, STRIDE, Q>(p.q, p.hidden, g, v, C, g0, tc, false, st);
}

/* Stage B and norm B of docs/numerics.md on the thread's chunks of row g
 * (v: f(finalized row) in; pk: its bits out, hidden then normalized):
 * stores hidden and normalized when st, and pushes both to every peer when
 * PUSH && push (TWOSHOT). wB: norm B's weight chunks held in registers
 * (bm_weight_chunks), or NULL to load them after the reduction. */
template <int NT, int J, int CS, bool VEC, bool PUSH, int Q>
__device__ __forceinline__ void bm_tp_stage_b(const typename bm_tp_kparams<Q>::type &p, float (&v)[J][8],
                                              bm_pack8 (&pk)[J],
                                              const bm_pack8 (&res)[J], int64_t g, int par, int C, int g0,
                                              bm_tree_ctx<NT, CS> &tc, bool st, bool push,
                                              const bm_pack8 (*wB)[J] = nullptr)
{
    constexpr int STRIDE = CS * NT;
    const int H = p.hidden;
#pragma unroll
    for (int j = 0; j < J; ++j)
        if (g0 + j * STRIDE < C)
            pk[j] = bm_residual8(v[j], res[j], p.has_scales, p.scale_x, p.scale_r);
    if (st)
        bm_store_row<J, VEC, STRIDE>(p.out + (size_t)g * H, pk, C, g0);
    if (PUSH && push)
        bm_tp_push<J, STRIDE>(p, par, 0, g, pk, C, g0);
    if (p.normB) {
        bm_norm_stage<NT, J, CS, VEC, STRIDE>(v, pk, p.wB, p.epsB, H, C, g0, tc, false, wB);
        bm_tp_out_normalized<NT, J, CS, VEC, STRIDE, Q>(p, g, pk, v, C, g0, tc, st);
        if (PUSH && push)
            bm_tp_push<J, STRIDE>(p, par, 1, g, pk, C, g0);
    }
}

/* The residual chunks of row g (loaded before the row source, so that both
 * latencies overlap). */
template <int J, int STRIDE, bool VEC>
__device__ __forceinline__ void bm_tp_load_res(const bm_tp_params &p, bm_pack8 (&res)[J], int64_t g, int C,
                                               int g0)
{
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int c = g0 + j * STRIDE;
        if (c < C)
            res[j] = bm_load8<VEC>(p.residual + (size_t)g * p.hidden + (size_t)c * 8);
    }
}

/* A block's start: take the answer to its claim of the workspace (q, sent
 * by bm_tp_claim_send; returns 1 when another call holds it; dead: a peer
 * died) and, when it is ours, clear the LL rows of two epochs ago and
 * announce the call at every peer. */
__device__ __forceinline__ int bm_tp_begin(const bm_tp_params &p, unsigned long long E, const bm_tp_claim_req &q,
                                           int fb, int &dead)
{
    const int conc = bm_tp_claim_take(p, E, q, dead);
    if (!conc) {
        bm_tp_ll_clear(p, E);
        bm_tp_announce(p, E, fb);
    }
    return conc;
}

/* Where a block of a peer-memory kernel sits: flag index fb (its index in
 * the grid), row group b of G (a group: a cluster of CS blocks), and g0,
 * its first chunk of a row. The gather's kernel spells this and
 * bm_tp_open out itself, so that its start stays as it was timed
 * (docs/PERF.md); its end is bm_tp_finish, as the all-reduce's. */
template <int NT, int CS>
struct bm_tp_place {
    int fb, b, G, g0;
    __device__ __forceinline__ bm_tp_place()
        : fb((int)blockIdx.x), b(CS > 1 ? (int)blockIdx.x / CS : (int)blockIdx.x),
          G(CS > 1 ? (int)gridDim.x / CS : (int)gridDim.x),
          g0((CS > 1 ? ((int)blockIdx.x % CS) * NT : 0) + (int)threadIdx.x)
    {
    }
};

/* The first half of a block's start, before its first row: the cluster's
 * exchange (xchg: the row has a norm), the wait for the stream's previous
 * kernel, the weights' prefetch, the epoch E, and the claim's request,
 * whose answer bm_tp_begin takes. Between them the caller may request its
 * first row's inputs, which then travel beside the claim's round trip. */
template <int NT, int J, int CS>
__device__ __forceinline__ bm_tp_claim_req bm_tp_open(const bm_tp_params &p, const bm_tp_place<NT, CS> &at,
                                                      bm_xchg<NT, CS> &xc, bool xchg, unsigned long long &E)
{
    if constexpr (CS > 1)
        if (xchg)
            bm_xchg_start<NT, CS>(xc);
    /* Programmatic dependent launch: this grid may be scheduled while the
     * preceding kernel of the stream finishes; wait for it (its writes, the
     * epoch included, are then visible) before touching memory. Let the
     * next kernel be scheduled early only where no peer shares this device:
     * its blocks would sit on multiprocessors that a peer's kernel, which
     * this one waits for, may need. */
    bm_pdl_wait();
    if (p.early)
        bm_pdl_trigger();
    bm_prefetch_weights<J, CS * NT>(p.normA ? p.wA : NULL, p.normB ? p.wB : NULL, p.hidden >> 3, at.g0);
    /* Every thread reads the epoch itself; it changes only at the end of
     * the kernel, after every thread has used it (bm_tp_finish). */
    E = bm_tp_epoch(p, at.fb);
    return bm_tp_claim_send(p);
}

/* a = +0; a = a + w[k] * f(x[k]) over the K slots of one row (xr, wr: the
 * row's slots and weights), then s = finalize(a) into pk (v: f(s)).
 * Decode shapes (one chunk per thread): all 8 slots' loads in flight at
 * once; two chunks per thread: 4 slots. */
template <int NT, int J, int CS, bool VEC>
__device__ __forceinline__ void bm_tp_finalize_row(const bm_row_params &p, const uint16_t *xr, const float *wr,
                                                   float (&v)[J][8], bm_pack8 (&pk)[J], int C, int g0)
{
    constexpr int STRIDE = CS * NT;
    const int K = p.top_k, H = p.hidden;
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
        for (int e = 0; e < 8; ++e)
            v[j][e] = 0.0f; /* a = +0.0 */
    constexpr int U = J == 1 ? 8 : BM_TP_U;
    int k = 0;
    for (; k + U <= K; k += U)
        bm_finalize_slots<NT, J, U, CS, VEC>(v, xr, wr, k, H, C, g0);
    if (U > BM_TP_U && k + BM_TP_U <= K) {
        bm_finalize_slots<NT, J, BM_TP_U, CS, VEC>(v, xr, wr, k, H, C, g0);
        k += BM_TP_U;
    }
    for (; k < K; ++k)
        bm_finalize_slots<NT, J, 1, CS, VEC>(v, xr, wr, k, H, C, g0);
#pragma unroll
    for (int j = 0; j < J; ++j) {
        pk[j] = bm_pack8{{0u, 0u, 0u, 0u}};
        if (g0 + j * STRIDE < C)
            pk[j] = bm_finalize8(v[j], p.routed_scale);
    }
}

/* TWOSHOT's second half for row g, which its owner pushed: copy hidden
 * (array 0) and normalized (array 1) from this rank's region into the
 * outputs, with the quantized form made from the pushed BF16 row (the same
 * bits as the owner's: a function of that row). Every thread of the block
 * calls it; st: this block stores. */
template <int NT, int J, int CS, bool VEC, int Q>
__device__ __forceinline__ void bm_tp_copy_pushed(const typename bm_tp_kparams<Q>::type &p, int64_t g, int par,
                                                  int C, int g0, bm_tree_ctx<NT, CS> &tc, bool st)
{
    constexpr int STRIDE = CS * NT;
    const uint16_t *hs = bm_tp_slot(p.peer[p.rank], p, par, 0, g);
    const uint16_t *ns = bm_tp_slot(p.peer[p.rank], p, par, 1, g);
    bm_pack8 hv[J], nv[J];
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int c = g0 + j * STRIDE;
        if (c < C && st) {
            hv[j] = bm_tp_load8_cg(hs + (size_t)c * 8);
            if (p.normB)
                nv[j] = bm_tp_load8_cg(ns + (size_t)c * 8);
        }
    }
    if (st)
        bm_store_row<J, VEC, STRIDE>(p.out + (size_t)g * p.hidden, hv, C, g0);
    if (p.normB) {
        float nf[J][8];
#pragma unroll
        for (int j = 0; j < J; ++j) {
            if (g0 + j * STRIDE >= C || !st)
                nv[j] = bm_pack8{{0u, 0u, 0u, 0u}};
            bm_unpack8(nv[j], nf[j]);
        }
        bm_tp_out_normalized<NT, J, CS, VEC, STRIDE, Q>(p, g, nv, nf, C, g0, tc, st);
    }
}

#endif
