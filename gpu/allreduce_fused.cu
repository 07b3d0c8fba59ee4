/*
 * allreduce_fused.cu - the kernels of the tensor-parallel all-reduce over
 * peer memory (internal): ONESHOT and TWOSHOT, and the ordered sum of the
 * UNFUSED path. docs/numerics.md#all-reduce is the arithmetic: each rank's
 * BF16 partial of a token (the dense form's row, or the finalize of the
 * rank's slots), a = f(p_0), a = a + f(p_r) for r = 1..R-1 in FP32,
 * rounded to BF16 once, then the row stages with the pre-norm. The flag
 * protocol is the gather's (gather_impl.h, gather_proto.cuh), the row
 * stages gather_stages.cuh's and row_ops.cuh's.
 *
 * One kernel per call on every rank, the same grid on every rank. Block b
 * serves a fixed set of rows S_b (ONESHOT: rows b, b+G, ... of all T;
 * TWOSHOT: the rows of local index b, b+G, ... of every rank's slice of
 * L = ceil(T / R) tokens, as the gather's), so that block b depends only
 * on block b of each peer:
 *
 *   phase 0  once every peer left E-2: this rank's partials of S_b into
 *            its own region (parity E & 1, array 0); signal, and wait for
 *            block b of every peer (flag fb).
 *            ONESHOT at decode sizes (R * T rows fit the LL buffers): the
 *            partials are pushed instead, as LL words (the gather's: an
 *            epoch tag beside every 32 data bits) into LL row r * T + g of
 *            every rank, this one included; no flag, and phase 1 polls
 *            the words themselves, then the peers' signatures are compared
 *            at the end (as the gather's LL path: a mismatch is recorded,
 *            the outputs are then undefined). One NVLink crossing, a
 *            posted write, instead of a flag's and a read's round trip.
 *   phase 1  the rows this rank finishes (ONESHOT: S_b; TWOSHOT: S_b in
 *            its own slice): every rank's partial read from that rank's
 *            region in rank order, summed, rounded once, then the pre-norm,
 *            the residual add and the next norm, stored; TWOSHOT pushes
 *            hidden and normalized into array 0 and 1 of every peer. The
 *            push over a peer's array 0 row overwrites that peer's partial
 *            of the same row, which this block was its only reader of, and
 *            has read (the pushed values depend on it).
 *   phase 2  TWOSHOT: signal the pushes (flag fb + BM_AR_FLAG2, which is
 *            why its grid is at most BM_AR_FLAG2 blocks) and wait for
 *            every peer's, then copy the pushed rows of the other slices.
 *
 * Beyond LL sizes partials are pulled (each rank writes its own once,
 * every peer reads it), so a region holds T rows of one rank, not R. A
 * region's array 0 or LL rows of parity p are written only after every
 * peer arrived at E-1, so their last reader (epoch E-2) is done: the
 * gather's parity rule. A group of one rank keeps the partial in
 * registers.
 */
#include <stdint.h>

#include "tp_launch.cuh"

/* TWOSHOT's second flag of block fb is fb + BM_AR_FLAG2 */
#define BM_AR_FLAG2 (BM_TP_MAX_BLOCKS / 2)

/* The kernel's paths: the partials pulled (ONESHOT and TWOSHOT), pushed
 * as LL words (ONESHOT at decode sizes), or a group of one rank (no
 * exchange). A variant (bm_ar_family) is a path and a form, the dense
 * one or the MoE one (BM_AR_MOE): each kernel holds one form's code. */
enum { BM_AR_PULL = 0, BM_AR_LL = 1, BM_AR_ONE = 2, BM_AR_PATHS = 3 };
enum { BM_AR_MOE = BM_AR_PATHS, BM_AR_NV = 2 * BM_AR_PATHS };

/* This rank's BF16 partial of row g (pk; v: its values widened): the
 * dense form's row of x, or the finalize of its slots (no post-norm). */
template <int NT, int J, int CS, bool VEC, bool MOE>
__device__ __forceinline__ void bm_ar_partial(const bm_tp_params &p, int64_t g, float (&v)[J][8],
                                              bm_pack8 (&pk)[J], int C, int g0)
{
    constexpr int STRIDE = CS * NT;
    if constexpr (MOE) {
        bm_tp_finalize_row<NT, J, CS, VEC>(p, p.experts + (size_t)g * (size_t)p.top_k * p.hidden,
                                           p.weights + (size_t)g * p.top_k, v, pk, C, g0);
    } else {
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = g0 + j * STRIDE;
            pk[j] = bm_pack8{{0u, 0u, 0u, 0u}};
            if (c < C)
                pk[j] = bm_load8<VEC>(p.x + (size_t)g * p.hidden + (size_t)c * 8);
            bm_unpack8(pk[j], v[j]);
        }
    }
}

/* The row requested before the claim's answer (bm_ar_kernel), once. */
template <int J>
__device__ __forceinline__ void bm_ar_take(const float (&hv)[J][8], const bm_pack8 (&hpk)[J], float (&v)[J][8],
                                           bm_pack8 (&pk)[J], bool &held)
{
#pragma unroll
    for (int j = 0; j < J; ++j) {
        pk[j] = hpk[j];
#pragma unroll
        for (int e = 0; e < 8; ++e)
            v[j][e] = hv[j][e];
    }
    held = false;
}

/* A block holds one row at a time: its next row's inputs (row g, below
 * end) are requested into L2 as a row starts, so that memory stays busy
 * through the row's reductions and the next row's loads find them there
 * [2026-12-06-allreduce-local: prefetch]. part: the dense form's row of x
 * (not the MoE form's slots, whose prefetch measured slower); res: the
 * residual. One next row, not two (measured slower too). The row group's
 * first thread, when the arrays are 16-byte aligned (VEC; every row is
 * then, hidden being a multiple of 256). */
template <bool VEC, bool MOE>
__device__ __forceinline__ void bm_ar_prefetch(const bm_tp_params &p, int64_t g, int64_t end, int g0, bool part,
                                               bool res)
{
    if (!VEC || g0 != 0 || g >= end)
        return;
    const uint32_t row = (uint32_t)p.hidden * 2u;
    if (part && !MOE)
        bm_prefetch_l2(p.x + (size_t)g * p.hidden, row);
    if (res)
        bm_prefetch_l2(p.residual + (size_t)g * p.hidden, row);
}

/* LL: rank s's partial of row g is LL row s * T + g of every region it
 * pushes to; the words of chunk c of it in this rank's region. */
__device__ __forceinline__ int64_t bm_ar_ll_index(const bm_tp_params &p, int s, int64_t g)
{
    return (int64_t)s * p.rows + g;
}

__device__ __forceinline__ const unsigned long long *bm_ar_ll_chunk(const bm_tp_params &p, int par, int s,
                                                                    int64_t g, int c)
{
    return bm_tp_ll_row(p.peer[p.rank], p, par, bm_ar_ll_index(p, s, g)) + (size_t)c * 4;
}

/* v = the FP32 sum of every rank's partial of row g in rank order
 * (a = f(p_0), then a + f(p_s)), not yet rounded; up to 4 ranks' loads in
 * flight at once. With ll the partials are LL words whose tags
 * bm_ar_ll_wait has seen (they stay until this rank arrives at E + 1).
 * A failed block (bad) loads nothing and sums zeros. */
template <int J, int STRIDE>
__device__ __forceinline__ void bm_ar_sum(const bm_tp_params &p, bool ll, int par, int64_t g, float (&v)[J][8],
                                          int C, int g0, int bad)
{
    for (int s0 = 0; s0 < p.nranks; s0 += 4) {
        bm_pack8 ld[4][J];
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
            for (int j = 0; j < J; ++j) {
                const int c = g0 + j * STRIDE;
                ld[u][j] = bm_pack8{{0u, 0u, 0u, 0u}};
                if (s0 + u >= p.nranks || c >= C || bad)
                    continue;
                if (ll)
                    ld[u][j] = bm_tp_ll_bits(bm_tp_ll_load(bm_ar_ll_chunk(p, par, s0 + u, g, c)));
                else
                    ld[u][j] = bm_tp_load8_cg(bm_tp_slot(p.peer[s0 + u], p, par, 0, g) + (size_t)c * 8);
            }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            if (s0 + u >= p.nranks)
                break;
#pragma unroll
            for (int j = 0; j < J; ++j) {
                float f[8];
                bm_unpack8(ld[u][j], f);
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    v[j][e] = s0 + u == 0 ? f[e] : __fadd_rn(v[j][e], f[e]);
            }
        }
    }
}

/* LL (ONESHOT at decode sizes): wait until every rank's words of the rows
 * of S_b (rows b, b + G, ...) that this thread sums carry epoch E's tag, a
 * bounded wait for each chunk as the gather's polls; up to 8 ranks' loads
 * in flight. Kept apart from the sum, outside the loop over rows, so that
 * the waits hold no row's values (registers). 0, or the failure that
 * stopped a wait (recorded). */
template <int NT, int J, int STRIDE>
__device__ __forceinline__ int bm_ar_ll_wait(const bm_tp_params &p, int par, int b, int G, int C, int g0,
                                             uint32_t tag, unsigned long long E)
{
    /* ranks a step: 8 chunks' words are 64 registers, all that 1024
     * threads a block may have */
    constexpr int U = NT >= 1024 ? 2 : (J == 1 ? 8 : 4);
    for (int64_t g = b; g < p.rows; g += G)
        for (int s0 = 0; s0 < p.nranks; s0 += U) {
            bm_tp_ll4 w[U][J];
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int j = 0; j < J; ++j)
                    if (s0 + u < p.nranks && g0 + j * STRIDE < C)
                        w[u][j] = bm_tp_ll_load(bm_ar_ll_chunk(p, par, s0 + u, g, g0 + j * STRIDE));
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int j = 0; j < J; ++j) {
                    const int s = s0 + u, c = g0 + j * STRIDE;
                    bm_pack8 q;
                    if (s >= p.nranks || c >= C || bm_tp_ll_ready(w[u][j], tag))
                        continue;
                    const int why = bm_tp_poll_ll(p, bm_ar_ll_chunk(p, par, s, g, c), tag, s, E, q);
                    if (why) {
                        bm_tp_fail(p, why, s, E);
                        return why;
                    }
                }
        }
    return 0;
}

/* The rows of rank s's slice (TWOSHOT) or, with s < 0, all T rows: [lo, lo + n). */
__device__ __forceinline__ int64_t bm_ar_rows(const bm_tp_params &p, int s, int64_t &lo)
{
    if (s < 0) {
        lo = 0;
        return p.rows;
    }
    lo = (int64_t)s * p.L;
    const int64_t n = p.rows - lo;
    return n < 0 ? 0 : (n > p.L ? p.L : n);
}

/* ONESHOT and TWOSHOT are one kernel (V = BM_AR_PULL, p.twoshot); LL:
 * ONESHOT's kernel for decode sizes, with the LL path, a kernel of its own
 * because its waits and loads would cost the other paths registers
 * (docs/strategies.md#all-reduce); it takes the flags at the epochs that
 * clear the LL rows. ONE: a group of one rank, a kernel without the
 * exchange's code, whose paths (four times a row kernel's instructions)
 * kept a decode launch waiting on instruction fetch
 * [2026-12-06-allreduce-local: finish] and, compiled into the others,
 * made the LL kernels of 512 threads spill [2026-12-07-tp-kernels: spills]. */
template <int NT, int J, int CS, bool VEC, int V, int Q>
__global__ void __launch_bounds__(NT) bm_ar_kernel(const typename bm_tp_kparams<Q>::type p)
{
    constexpr bool LL = V % BM_AR_PATHS == BM_AR_LL;
    constexpr bool one = V % BM_AR_PATHS == BM_AR_ONE; /* p.nranks == 1 */
    constexpr bool MOE = V >= BM_AR_MOE; /* p.experts != NULL */
    __shared__ float red[2][NT];
    __shared__ bm_xchg<NT, CS> xc[1];
    constexpr int STRIDE = CS * NT;
    const int C = p.hidden >> 3;
    const int H = p.hidden;
    const bm_tp_place<NT, CS> at;
    const int b = at.b, G = at.G, g0 = at.g0;
    const bool xchg = CS > 1 && (p.normA || p.normB);
    const bool two = !LL && !one && p.twoshot != 0;
    bm_tree_ctx<NT, CS> tc = {red, xc, 0, 0u, 0, 0, -1};
    unsigned long long E;
    int dead;
    const bm_tp_claim_req rq = bm_tp_open<NT, J, CS>(p, at, xc[0], xchg, E);
    /* Decode shapes: the block's first row (row b: the first of phase 0,
     * or of phase 1 in a group of one) has its inputs requested now, so
     * that their loads and the claim's round trip overlap; nothing is
     * written before the claim's answer. Prefill blocks have many rows to
     * hide one round trip behind. */
    constexpr bool PRE = J == 1;
    bool held = PRE && b < (two ? (p.L < p.rows ? p.L : p.rows) : p.rows);
    float hv[J][8];
    bm_pack8 hpk[J], hres[J];
    if (held) {
        if (one)
            bm_tp_load_res<J, STRIDE, VEC>(p, hres, b, C, g0);
        bm_ar_partial<NT, J, CS, VEC, MOE>(p, b, hv, hpk, C, g0);
    }
    const int conc = bm_tp_begin(p, E, rq, at.fb, dead);
    int bad = conc | dead;
    const int par = (int)(E & 1ull);
    const uint32_t tag = (uint32_t)E;
    const bool ll = LL && p.ll && !bm_tp_ll_clearing(E);
    int64_t lo, n;

    /* ---- phase 0: this rank's partials of S_b ---- */
    if (!one) {
        bad = bm_tp_wait_arrivals(p, E - 1ull, E, bad);
        for (int s = two ? 0 : -1; s < (two ? p.nranks : 0); ++s) {
            n = bm_ar_rows(p, s, lo);
            for (int64_t i = b; i < n; i += G) {
                float v[J][8];
                bm_pack8 pk[J];
                bm_ar_prefetch<VEC, MOE>(p, lo + i + G, lo + n, g0, true, false);
                if (held)
                    bm_ar_take<J>(hv, hpk, v, pk, held);
                else
                    bm_ar_partial<NT, J, CS, VEC, MOE>(p, lo + i, v, pk, C, g0);
                if (bad)
                    continue;
                if (ll)
                    bm_tp_push_ll<J, STRIDE>(p, par, bm_ar_ll_index(p, p.rank, lo + i), pk, C, g0, tag, true);
                else
                    bm_store_row<J, true, STRIDE>(bm_tp_slot(p.peer[p.rank], p, par, 0, lo + i), pk, C, g0);
            }
        }
        if (ll)
            bad = __syncthreads_or(bad | (bad ? 0 : bm_ar_ll_wait<NT, J, STRIDE>(p, par, b, G, C, g0, tag, E)));
        else
            bad = bm_tp_signal_wait(p, E, at.fb, bad, conc);
    }

    /* ---- phase 1: the sum and the row stages of the rows finished here ---- */
    n = bm_ar_rows(p, two ? p.rank : -1, lo);
    /* ONESHOT: the block's last access to the workspace is its last row's
     * sum (with LL words, then the peers' signatures); it finishes there
     * (bm_tp_finish_send), and the count's round trip runs beside that
     * row's stages, which write only the call's own arrays. TWOSHOT pushes
     * and copies after. */
    const bool early = !two && !conc;
    uint32_t done = 0u;
    /* The dense group of one at prefill's widest shape holds the norms'
     * weight chunks for all its rows, loaded once, instead of loading them
     * after each reduction: faster with the pre-norm, level without it; the
     * narrower shapes and the MoE form measured slower, the quantized
     * outputs and the unaligned path were not timed
     * [2026-12-07-allreduce-prefill: weights]. */
    constexpr bool HW = one && !MOE && NT == 512 && J == 2 && VEC && Q == BM_QF_NONE;
    bm_pack8 wpA[J], wpB[J];
    if constexpr (HW) {
        bm_weight_chunks<J, VEC, STRIDE>(wpA, p.normA ? p.wA : NULL, C, g0);
        bm_weight_chunks<J, VEC, STRIDE>(wpB, p.normB ? p.wB : NULL, C, g0);
    }
    for (int64_t i = b; i < n; i += G) {
        const int64_t g = lo + i;
        float v[J][8];
        bm_pack8 pk[J], res[J];
        bm_ar_prefetch<VEC, MOE>(p, g + G, lo + n, g0, one, true);
        if (held) {
#pragma unroll
            for (int j = 0; j < J; ++j)
                res[j] = hres[j];
            bm_ar_take<J>(hv, hpk, v, pk, held);
        } else if (one) {
            bm_tp_load_res<J, STRIDE, VEC>(p, res, g, C, g0);
            bm_ar_partial<NT, J, CS, VEC, MOE>(p, g, v, pk, C, g0);
        } else {
            bm_tp_load_res<J, STRIDE, VEC>(p, res, g, C, g0);
        }
        if (!one)
            bm_ar_sum<J, STRIDE>(p, ll, par, g, v, C, g0, bad);
#pragma unroll
        for (int j = 0; j < J; ++j)
            pk[j] = bm_rnd8(v[j]); /* the sum's one rounding */
        if (early && i + G >= n) {
            if (ll)
                bad = bm_tp_ll_sigs(p, E, bad);
            done = bm_tp_finish_send(p, E, at.fb, (int)gridDim.x);
        }
        /* written out, not through bm_norm_stage's held argument, which
         * compiles the HW kernel to another schedule than the one timed */
        if (p.normA && HW)
            bm_norm_stage_held<NT, J, CS, STRIDE>(v, pk, wpA, p.wA != NULL, p.epsA, H, C, g0, tc, false);
        else if (p.normA)
            bm_norm_stage<NT, J, CS, VEC, STRIDE>(v, pk, p.wA, p.epsA, H, C, g0, tc, false);
        bm_tp_stage_b<NT, J, CS, VEC, true, Q>(p, v, pk, res, g, par, C, g0, tc, !bad, two && !bad,
                                               HW ? &wpB : nullptr);
    }

    /* ---- phase 2 (TWOSHOT): the rows the peers finished ---- */
    if (two) {
        bad = bm_tp_signal_wait(p, E, at.fb + BM_AR_FLAG2, bad, conc);
        for (int s = 0; s < p.nranks; ++s) {
            if (s == p.rank)
                continue;
            n = bm_ar_rows(p, s, lo);
            for (int64_t i = b; i < n; i += G)
                bm_tp_copy_pushed<NT, J, CS, VEC, Q>(p, lo + i, par, C, g0, tc, !bad);
        }
    }

    if (ll && !(early && b < n))
        bad = bm_tp_ll_sigs(p, E, bad);
    if (xchg)
        tc.finish();
    if (early && b < n)
        bm_tp_finish_take(p, done, (int)gridDim.x);
    else if (!conc)
        bm_tp_finish(p, E, at.fb, (int)gridDim.x);
}

/* UNFUSED: dst[i] = bf16(sum over s of f(src[s * stride + i])) in rank
 * order, for n chunks of 8 values (src: the all-gathered blocks). dst may
 * be this rank's own block (each value is read before it is written by
 * the same thread). Every address is 16-byte aligned: src and dst are the
 * workspace's (its all-gather buffer, its region), hidden a multiple of 256. */
struct bm_ar_sum_args {
    const uint16_t *src;
    size_t stride;
    int nranks;
    uint16_t *dst;
    size_t n;
};

__global__ void __launch_bounds__(256) bm_ar_sum_kernel(const bm_ar_sum_args a)
{
    bm_pdl_wait();
    for (size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x; c < a.n; c += (size_t)gridDim.x * blockDim.x) {
        float v[8], f[8];
        bm_unpack8(bm_load8<true>(a.src + c * 8), v);
        for (int s = 1; s < a.nranks; ++s) {
            bm_unpack8(bm_load8<true>(a.src + (size_t)s * a.stride + c * 8), f);
#pragma unroll
            for (int e = 0; e < 8; ++e)
                v[e] = __fadd_rn(v[e], f[e]);
        }
        bm_store8<true>(a.dst + c * 8, bm_rnd8(v));
    }
}

/* ---- host side ----------------------------------------------------------- */

/* The variants of bm_ar_kernel; the two-chunk shapes (L > 128 only) have
 * no LL path. */
struct bm_ar_family {
    static constexpr int NV = BM_AR_NV;
    template <int NT, int J, int CS, bool VEC, int V, int Q>
    static auto kernel()
    {
        constexpr int path = V % BM_AR_PATHS == BM_AR_LL && J != 1 ? BM_AR_PULL : V % BM_AR_PATHS;
        return &bm_ar_kernel<NT, J, CS, VEC, path + (V >= BM_AR_MOE ? BM_AR_MOE : 0), Q>;
    }
};

int bm_ar_occupancy(int shape, int q)
{
    return bm_tp_family_occupancy<bm_ar_family>(shape, q != 0);
}

cudaError_t bm_ar_preload(void)
{
    cudaError_t e = cudaSuccess;
    bm_tp_preload_family<bm_ar_family>(e);
    bm_preload(e, bm_ar_sum_kernel);
    return e;
}

cudaError_t bm_ar_launch_fused(const bm_tp_ws *w, const bm_args *a, int twoshot, uint32_t sig,
                               cudaStream_t stream)
{
    bm_tp_params_q pq = {};
    static_cast<bm_row_params &>(pq) = bm_params_of(a, BM_PART_FIN | BM_PART_X | BM_PART_RES);
    bm_tp_fill(w, &pq);
    pq.sig = sig;
    pq.L = (a->tokens + w->nranks - 1) / w->nranks;
    pq.q = a->q;
    pq.twoshot = twoshot;
    /* LL words for ONESHOT at decode sizes: every rank's T rows fit the LL buffers */
    pq.ll = !twoshot && (int64_t)w->nranks * pq.rows <= w->ll_rows;
    /* the rows a rank finishes: all T (ONESHOT), its slice (TWOSHOT) */
    const int64_t rows = twoshot ? pq.L : pq.rows;
    const int shape = bm_tp_shape_index(rows, w->hidden, pq.q.kind, w->sms);
    const int cs = bm_tp_cs(shape);
    int64_t cap = w->gcap[BM_TP_ACAP(shape, pq.q.kind != 0)];
    if (twoshot && cap * cs > BM_AR_FLAG2)
        cap = BM_AR_FLAG2 / cs;
    const int64_t want = rows < 1 ? 1 : rows;
    const int variant = (w->nranks == 1 ? BM_AR_ONE : pq.ll ? BM_AR_LL : BM_AR_PULL) + (pq.experts ? BM_AR_MOE : 0);
    return bm_tp_launch_family<bm_ar_family>(shape, pq, variant, (unsigned)(want < cap ? want : cap), stream);
}

cudaError_t bm_ar_launch_sum(const uint16_t *blocks, size_t stride, int nranks, uint16_t *dst, size_t values,
                             cudaStream_t stream)
{
    const bm_ar_sum_args a = {blocks, stride, nranks, dst, values / 8};
    if (a.n == 0)
        return cudaSuccess;
    const unsigned grid = (unsigned)(a.n / 256 + 1 < 4096 ? a.n / 256 + 1 : 4096);
    return bm_launch(bm_ar_sum_kernel, a, grid, 256, 1, 0, 1, stream);
}
