/*
 * gather_fused.cu - the ONESHOT and TWOSHOT kernels of the tensor-parallel
 * gather over peer memory (internal).
 *
 * One kernel per call on every rank, same grid G on every rank (it depends
 * on T, hidden and the caps agreed at workspace creation only). Block b of
 * rank r takes r's owned local rows i = b, b+G, ... and, for every peer s,
 * s's rows with the same local indices. So block b depends only on block b
 * of each peer: no grid-wide barrier, no co-residency requirement.
 *
 *   arrival  block 0 stores E into arr[r] of every peer; before its first
 *            write into a peer, a block waits until every peer's arr >= E-1
 *            (the parity rule of gather_impl.h; normally true at once).
 *   phase 1  own rows: finalize (+ post-norm) and
 *              ONESHOT: push the finalized BF16 row to every peer, then
 *                       residual add + next norm locally;
 *              TWOSHOT: residual add + next norm, write both locally and
 *                       push both to every peer.
 *   ONESHOT, decode sizes (L <= BM_TP_LL_MAX_L): the pushed rows are LL
 *            words (epoch tag beside every 32 data bits); phase 2 polls the
 *            words themselves: no fence, no flag, no wait for a peer that
 *            has no rows for this rank.
 *   otherwise:
 *   signal   __syncthreads, then thread 0: a release store (sys scope) of
 *            epoch E into flags[E & 1][r][b] of every peer.
 *   wait     thread s (s != r) polls its own flags[E & 1][s][b] == E
 *            (relaxed sys-scope loads, then one acquire fence).
 *   Every wait is bounded by the workspace timeout (%globaltimer) and ends
 *   early when errf[s] >= E (s rejected its arguments and pushed nothing).
 *   A failure goes to the host-mapped record; the block still runs phase 2
 *   (its cluster barriers) but stores nothing.
 *   phase 2  peers' rows: ONESHOT: residual add + next norm of the pushed
 *            finalized row; TWOSHOT: copy the pushed hidden/normalized rows.
 *   epoch    every block advances its copies of the epoch (gather_impl.h).
 *
 * Decode sizes spread each row over a cluster of CS blocks (as the row
 * kernel does): block B = b*CS + q takes chunk slice q of the rows of
 * group b; flags are per block B, so a block still waits only for the
 * same block of each peer, which pushed exactly the slice it reads. The
 * RMSNorm sum crosses the cluster through distributed shared memory.
 *
 * The arithmetic is the row kernel's (gpu/numerics.cuh and the block tree
 * of gpu/row_kernel.cuh; the two row stages are restated here so that the
 * row kernel's tuning cannot break this file): same finalize order, same
 * RMSNorm tree, so the bits are those of docs/numerics.md
 * whatever the block shape. Rows pushed by peers are read with ld.global.cg
 * (L2, never a stale L1 line).
 */
#include <stdint.h>

#include "gather_impl.h"
#include "row_kernel.cuh"

#define BM_TP_U 4 /* expert slots loaded ahead */

/* The two row stages of docs/numerics.md in the row kernel's thread layout
 * (thread t owns chunks t, t+NT, ...), written against numerics.cuh and the
 * row kernel's block tree (bm_block_tree) so that the bits are the same;
 * kept here so that the row kernel's own tuning cannot change this file's
 * interface. */

/* v <- f(N(v, w, eps)); padding chunks (c >= C) must hold +0; wk: the
 * thread's chunks of the weight, loaded at kernel start (w: there is one).
 * With CS > 1
 * the tree runs over the thread's chunks, then across the cluster's blocks
 * for the same thread index (xred: NT floats of shared memory), then over
 * the block: the halving order of docs/numerics.md, high index bits first. */
template <int NT, int J, int CS, bool VEC>
__device__ __forceinline__ void bm_tp_norm(float (&v)[J][8], const bm_pack8 (&wk)[J], bool w, float eps,
                                           int hidden, int C, int g0, float *red, float *xred)
{
    float P[J];
#pragma unroll
    for (int j = 0; j < J; ++j)
        P[j] = bm_chunk_sumsq(v[j]);
    bm_halving<J / 2>(P);
    float q = P[0];
    if (CS > 1) {
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
            bm_unpack8(wk[j], wf);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            uint32_t u = bm_bf16(__fmul_rn(v[j][e], inv));
            if (w)
                u = bm_bf16(__fmul_rn(bm_f(u), wf[e]));
            v[j][e] = bm_f(u);
        }
    }
}

/* acc = acc + w[k] * f(x[k]) for U slots k.., every load issued first. */
template <int NT, int J, int U, int CS, bool VEC>
__device__ __forceinline__ void bm_tp_slots(float (&acc)[J][8], const uint16_t *xr, const float *wr,
                                            int k, int hidden, int C, int g0)
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
                ld[u][j] = bm_load8_stream<VEC>(xr + (size_t)(k + u) * hidden + (size_t)c * 8);
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

__device__ __forceinline__ unsigned long long bm_tp_now()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void bm_tp_st_release(unsigned long long *p, unsigned long long v)
{
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ unsigned long long bm_tp_ld_acquire(const unsigned long long *p)
{
    unsigned long long v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

/* Polling: relaxed loads (no fence per poll), then one acquire fence. */
__device__ __forceinline__ unsigned long long bm_tp_ld_relaxed(const unsigned long long *p)
{
    unsigned long long v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void bm_tp_fence_acquire()
{
    asm volatile("fence.acq_rel.sys;" ::: "memory");
}

/* 16-byte load through L2 only (rows written by a peer during this kernel). */
__device__ __forceinline__ bm_pack8 bm_tp_load8_cg(const uint16_t *p)
{
    bm_pack8 r;
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.w[0]), "=r"(r.w[1]), "=r"(r.w[2]), "=r"(r.w[3])
                 : "l"(p)
                 : "memory");
    return r;
}

/* flags[par][src][blk] of a region */
__device__ __forceinline__ unsigned long long *bm_tp_flag(char *region, size_t flags_off, int par, int src,
                                                          int blk)
{
    return reinterpret_cast<unsigned long long *>(region + flags_off) +
           ((size_t)par * BM_TP_MAX_RANKS + (size_t)src) * BM_TP_MAX_BLOCKS + blk;
}

__device__ __forceinline__ unsigned long long *bm_tp_word(char *region, size_t off, int idx)
{
    return reinterpret_cast<unsigned long long *>(region + off) + idx;
}

/* LL row g of parity par: H/2 words of (epoch tag << 32 | two BF16). */
__device__ __forceinline__ unsigned long long *bm_tp_ll_row(char *region, const bm_tp_params &p, int par,
                                                            int64_t g)
{
    return reinterpret_cast<unsigned long long *>(region + p.ll_off) +
           ((size_t)par * (size_t)p.ll_rows + (size_t)g) * (size_t)(p.hidden / 2);
}

/* Record a failure in the host-mapped record (any one of several racing
 * writers wins; all describe a real failure of this call). */
__device__ __forceinline__ void bm_tp_record(const bm_tp_params &p, int code, int peer, unsigned long long E)
{
    p.err->peer = peer;
    p.err->epoch = E;
    p.err->code = (uint32_t)code;
    __threadfence_system();
}

/* Wait until *f >= want (relaxed polls, then an acquire fence), bounded by
 * the timeout; a peer that rejected its arguments in this epoch (errf[s]
 * >= E) ends the wait too. 0, BM_TP_TIMEOUT or BM_TP_PEER_REJECTED. */
__device__ __forceinline__ int bm_tp_wait_ge(const bm_tp_params &p, const unsigned long long *f,
                                             unsigned long long want, int s, unsigned long long E, int exact,
                                             int acquire)
{
    const unsigned long long *ef = bm_tp_word(p.peer[p.rank], p.errf_off, s);
    unsigned long long t0 = 0;
    unsigned spins = 0;
    for (;;) {
        const unsigned long long v = bm_tp_ld_relaxed(f);
        if (exact ? v == want : v >= want)
            break;
        if ((++spins & 255u) == 0) {
            if (bm_tp_ld_relaxed(ef) >= E)
                return BM_TP_PEER_REJECTED;
            const unsigned long long now = bm_tp_now();
            if (t0 == 0)
                t0 = now;
            else if (now - t0 > p.timeout_ns)
                return BM_TP_TIMEOUT;
        }
    }
    if (!acquire)
        return bm_tp_ld_relaxed(ef) >= E ? BM_TP_PEER_REJECTED : 0;
    bm_tp_fence_acquire();
    return bm_tp_ld_acquire(ef) >= E ? BM_TP_PEER_REJECTED : 0;
}

/* Row g of array a (0, 1) of parity par in a region. */
__device__ __forceinline__ uint16_t *bm_tp_slot(char *region, const bm_tp_params &p, int par, int a,
                                                int64_t g)
{
    return reinterpret_cast<uint16_t *>(region + p.data_off + (size_t)(2 * par + a) * p.slot_bytes) +
           (size_t)g * p.hidden;
}

/* Store 8 values of chunk c of row g into array a of every peer's region. */
template <int NT, int J, int CS>
__device__ __forceinline__ void bm_tp_push(const bm_tp_params &p, int par, int a, int64_t g,
                                           const float (&v)[J][8], int C, int g0)
{
    for (int s = 0; s < p.nranks; ++s) {
        if (s == p.rank)
            continue;
        uint16_t *dst = bm_tp_slot(p.peer[s], p, par, a, g);
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = g0 + j * CS * NT;
            if (c < C)
                bm_store8<true>(dst + (size_t)c * 8, bm_round8(v[j]));
        }
    }
}

/* LL push of the finalized row: each 8-byte word holds 32 bits of data and
 * the epoch tag; an aligned 8-byte store is single-copy atomic, so a
 * reader that sees the tag sees the data (no fence, no separate flag). */
template <int NT, int J, int CS>
__device__ __forceinline__ void bm_tp_push_ll(const bm_tp_params &p, int par, int64_t g,
                                              const float (&v)[J][8], int C, int g0, uint32_t tag)
{
    for (int s = 0; s < p.nranks; ++s) {
        if (s == p.rank)
            continue;
        unsigned long long *dst = bm_tp_ll_row(p.peer[s], p, par, g);
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = g0 + j * CS * NT;
            if (c >= C)
                continue;
            const bm_pack8 q = bm_round8(v[j]);
            const unsigned long long t = (unsigned long long)tag << 32;
            asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(dst + (size_t)c * 4),
                         "l"(t | q.w[0]), "l"(t | q.w[1])
                         : "memory");
            asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(dst + (size_t)c * 4 + 2),
                         "l"(t | q.w[2]), "l"(t | q.w[3])
                         : "memory");
        }
    }
}

/* Poll one LL chunk (4 words) until every tag is this epoch's. */
__device__ __forceinline__ int bm_tp_poll_ll(const bm_tp_params &p, const unsigned long long *src, uint32_t tag,
                                             int s, unsigned long long E, bm_pack8 &out)
{
    const unsigned long long *ef = bm_tp_word(p.peer[p.rank], p.errf_off, s);
    unsigned long long t0 = 0;
    unsigned spins = 0;
    for (;;) {
        unsigned long long a0, a1, a2, a3;
        asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a0), "=l"(a1) : "l"(src) : "memory");
        asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a2), "=l"(a3) : "l"(src + 2) : "memory");
        if ((uint32_t)(a0 >> 32) == tag && (uint32_t)(a1 >> 32) == tag && (uint32_t)(a2 >> 32) == tag &&
            (uint32_t)(a3 >> 32) == tag) {
            out.w[0] = (uint32_t)a0;
            out.w[1] = (uint32_t)a1;
            out.w[2] = (uint32_t)a2;
            out.w[3] = (uint32_t)a3;
            return 0;
        }
        if ((++spins & 63u) == 0) {
            if (bm_tp_ld_relaxed(ef) >= E)
                return BM_TP_PEER_REJECTED;
            const unsigned long long now = bm_tp_now();
            if (t0 == 0)
                t0 = now;
            else if (now - t0 > p.timeout_ns)
                return BM_TP_TIMEOUT;
        }
    }
}

/* Stage B and norm B of docs/numerics.md (hidden = bf16(bx + br), normalized = N(hidden))
 * on v in place; stores hidden and normalized of row g locally and, when
 * PUSH, into every peer's arrays 0 and 1. res: the residual chunks. */
template <int NT, int J, int CS, bool VEC, bool PUSH>
__device__ __forceinline__ void bm_tp_stage_b(const bm_tp_params &p, float (&v)[J][8],
                                              const bm_pack8 (&res)[J], int64_t g, int par,
                                              int C, int g0, float (*red)[NT], float (*xred)[CS > 1 ? NT : 1],
                                              int &rp, bool st, bool push, const bm_pack8 (&wb)[J])
{
    const int H = p.hidden;
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int c = g0 + j * CS * NT;
        if (c >= C)
            continue;
        float r[8];
        bm_unpack8(res[j], r);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            float bx = v[j][e], br = r[e];
            if (p.has_scales) {
                bx = bm_f(bm_bf16(__fmul_rn(bx, p.scale_x)));
                br = bm_f(bm_bf16(__fmul_rn(br, p.scale_r)));
            }
            v[j][e] = bm_f(bm_bf16(__fadd_rn(bx, br)));
        }
        if (st)
            bm_store8<VEC>(p.hidden_out + (size_t)g * H + (size_t)c * 8, bm_round8(v[j]));
    }
    if (PUSH && push)
        bm_tp_push<NT, J, CS>(p, par, 0, g, v, C, g0);
    if (p.normB) {
        bm_tp_norm<NT, J, CS, VEC>(v, wb, p.wB != nullptr, p.epsB, H, C, g0, red[rp], xred[rp]);
        rp ^= 1;
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = g0 + j * CS * NT;
            if (c < C && st)
                bm_store8<VEC>(p.normalized + (size_t)g * H + (size_t)c * 8, bm_round8(v[j]));
        }
        if (PUSH && push)
            bm_tp_push<NT, J, CS>(p, par, 1, g, v, C, g0);
    }
}

/* The thread's chunks of a norm weight, loaded once per kernel (before the
 * first row) so that no norm waits for memory after its reduction. */
template <int NT, int J, int CS, bool VEC>
__device__ __forceinline__ void bm_tp_load_w(const uint16_t *w, bm_pack8 (&wk)[J], int C, int g0)
{
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int c = g0 + j * CS * NT;
        wk[j] = bm_pack8{{0u, 0u, 0u, 0u}};
        if (w && c < C)
            wk[j] = bm_load8<VEC>(w + (size_t)c * 8);
    }
}

/* The residual chunks of row g (loaded before the row source, so that both
 * latencies overlap). */
template <int NT, int J, int CS, bool VEC>
__device__ __forceinline__ void bm_tp_load_res_v(const bm_tp_params &p, bm_pack8 (&res)[J], int64_t g,
                                                 int C, int g0)
{
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int c = g0 + j * CS * NT;
        if (c < C)
            res[j] = bm_load8<VEC>(p.residual + (size_t)g * p.hidden + (size_t)c * 8);
    }
}

template <int NT, int J, int CS, bool VEC, bool TWO>
__global__ void __launch_bounds__(NT) bm_tp_kernel(const bm_tp_params p)
{
    __shared__ float red[2][NT];
    __shared__ float xred[2][CS > 1 ? NT : 1];
    int rp = 0;
    const int C = p.hidden >> 3;
    const int H = p.hidden;
    const int fb = (int)blockIdx.x;                     /* flag index */
    const int b = CS > 1 ? fb / CS : fb;                /* row group */
    const int G = CS > 1 ? (int)gridDim.x / CS : (int)gridDim.x;
    const int g0 = (CS > 1 ? (fb % CS) * NT : 0) + (int)threadIdx.x;
    const bool ll = !TWO && p.ll;

    /* Programmatic dependent launch: this grid may be scheduled while the
     * preceding kernel of the stream finishes; wait for it (its writes, the
     * epoch included, are then visible) before touching memory, and let
     * the next kernel's blocks be scheduled once all of ours have started
     * (they wait the same way). No-ops without the launch attribute. */
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    /* Every thread reads the epoch itself (no barrier on the critical
     * path); it changes only at the end of this kernel, after every thread
     * has used it (the barrier before the block's count below). */
    const unsigned long long E = *(volatile unsigned long long *)(p.epoch + fb) + 1ull;
    const int par = (int)(E & 1ull);
    const uint32_t tag = (uint32_t)E;
    bm_pack8 wa[J], wb[J];
    bm_tp_load_w<NT, J, CS, VEC>(p.normA ? p.wA : nullptr, wa, C, g0);
    bm_tp_load_w<NT, J, CS, VEC>(p.normB ? p.wB : nullptr, wb, C, g0);

    /* ---- arrival: this rank finished epoch E-1 (kernel order) ---- */
    if (fb == 0 && threadIdx.x == 0)
        for (int s = 0; s < p.nranks; ++s)
            if (s != p.rank)
                *(volatile unsigned long long *)bm_tp_word(p.peer[s], p.arr_off, p.rank) = E;
    /* Parity par was last read by the peers in epoch E-2: before its first
     * write into a peer, a block waits until every peer arrived at E-1
     * (normally true at once; called at block-uniform points). */
    int bad = 0, arrived = p.nranks < 2;
    auto arrive = [&]() {
        if (arrived)
            return;
        arrived = 1;
        int tb = 0;
        if ((int)threadIdx.x < p.nranks && (int)threadIdx.x != p.rank) {
            const int s = (int)threadIdx.x;
            /* no acquire: nothing is read on the strength of it; the writes
             * that follow depend on it through the barrier */
            tb = bm_tp_wait_ge(p, bm_tp_word(p.peer[p.rank], p.arr_off, s), E - 1, s, E, 0, 0);
            if (tb)
                bm_tp_record(p, tb, s, E);
        }
        bad = __syncthreads_or(bad | tb);
    };

    /* ---- phase 1: own rows ---- */
    const int64_t own_lo = (int64_t)p.rank * p.L;
    int64_t owned = p.T - own_lo;
    owned = owned < 0 ? 0 : (owned > p.L ? p.L : owned);
    for (int64_t i = b; i < owned; i += G) {
        const int64_t g = own_lo + i;
        float v[J][8];
        bm_pack8 res[J];
        bm_tp_load_res_v<NT, J, CS, VEC>(p, res, g, C, g0);
#pragma unroll
        for (int j = 0; j < J; ++j)
#pragma unroll
            for (int e = 0; e < 8; ++e)
                v[j][e] = 0.0f; /* a = +0.0 */
        const int K = p.top_k;
        const uint16_t *xr = p.experts + (size_t)i * (size_t)K * H;
        const float *wr = p.weights + (size_t)i * K;
        /* decode shapes (one chunk per thread): all 8 slots' loads in
         * flight at once; two chunks per thread: 4 slots */
        constexpr int U = J == 1 ? 8 : BM_TP_U;
        int k = 0;
        for (; k + U <= K; k += U)
            bm_tp_slots<NT, J, U, CS, VEC>(v, xr, wr, k, H, C, g0);
        if (U > BM_TP_U && k + BM_TP_U <= K) {
            bm_tp_slots<NT, J, BM_TP_U, CS, VEC>(v, xr, wr, k, H, C, g0);
            k += BM_TP_U;
        }
        for (; k < K; ++k)
            bm_tp_slots<NT, J, 1, CS, VEC>(v, xr, wr, k, H, C, g0);
#pragma unroll
        for (int j = 0; j < J; ++j)
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const uint32_t r = bm_bf16(v[j][e]);
                v[j][e] = g0 + j * CS * NT < C ? bm_f(bm_bf16(__fmul_rn(bm_f(r), p.routed_scale))) : 0.0f;
            }
        if (p.normA) {
            bm_tp_norm<NT, J, CS, VEC>(v, wa, p.wA != nullptr, p.epsA, H, C, g0, red[rp], xred[rp]);
            rp ^= 1;
        }
        arrive();
        if (!TWO && !bad) {
            if (ll)
                bm_tp_push_ll<NT, J, CS>(p, par, g, v, C, g0, tag);
            else
                bm_tp_push<NT, J, CS>(p, par, 0, g, v, C, g0);
        }
        bm_tp_stage_b<NT, J, CS, VEC, TWO>(p, v, res, g, par, C, g0, red, xred, rp, true, !bad, wb);
    }

    if (!ll) {
        /* ---- signal: every row of this block is pushed ---- */
        arrive();
        __syncthreads();
        if (threadIdx.x == 0 && p.nranks > 1 && !bad) {
            /* st.release.sys is cumulative: the block's pushes, ordered
             * before it by the barrier, are visible to a peer that
             * acquires the flag */
            for (int s = 0; s < p.nranks; ++s)
                if (s != p.rank)
                    bm_tp_st_release(bm_tp_flag(p.peer[s], p.flags_off, par, p.rank, fb), E);
        }
        /* ---- wait for block fb of every peer (exactly epoch E: a peer
         * out of step never matches, it times out) ---- */
        if (!bad && (int)threadIdx.x < p.nranks && (int)threadIdx.x != p.rank) {
            const int s = (int)threadIdx.x;
            bad = bm_tp_wait_ge(p, bm_tp_flag(p.peer[p.rank], p.flags_off, par, s, fb), E, s, E, 1, 1);
            if (bad)
                bm_tp_record(p, bad, s, E);
        }
        bad = __syncthreads_or(bad);
    }

    /* ---- phase 2: the peers' rows. Every block of a cluster runs the same
     * rows and barriers; a failed block computes but stores nothing. ---- */
    for (int s = 0; s < p.nranks; ++s) {
        if (s == p.rank)
            continue;
        const int64_t lo = (int64_t)s * p.L;
        int64_t n = p.T - lo;
        n = n < 0 ? 0 : (n > p.L ? p.L : n);
        for (int64_t i = b; i < n; i += G) {
            const int64_t g = lo + i;
            if (TWO) {
                const uint16_t *hs = bm_tp_slot(p.peer[p.rank], p, par, 0, g);
                const uint16_t *ns = bm_tp_slot(p.peer[p.rank], p, par, 1, g);
                bm_pack8 hv[J], nv[J];
#pragma unroll
                for (int j = 0; j < J; ++j) {
                    const int c = g0 + j * CS * NT;
                    if (c < C && !bad) {
                        hv[j] = bm_tp_load8_cg(hs + (size_t)c * 8);
                        if (p.normB)
                            nv[j] = bm_tp_load8_cg(ns + (size_t)c * 8);
                    }
                }
#pragma unroll
                for (int j = 0; j < J; ++j) {
                    const int c = g0 + j * CS * NT;
                    if (c < C && !bad) {
                        bm_store8<VEC>(p.hidden_out + (size_t)g * H + (size_t)c * 8, hv[j]);
                        if (p.normB)
                            bm_store8<VEC>(p.normalized + (size_t)g * H + (size_t)c * 8, nv[j]);
                    }
                }
            } else {
                float v[J][8];
                bm_pack8 res[J];
                bm_tp_load_res_v<NT, J, CS, VEC>(p, res, g, C, g0);
                int tbad = 0;
#pragma unroll
                for (int j = 0; j < J; ++j) {
                    const int c = g0 + j * CS * NT;
                    bm_pack8 q = {{0u, 0u, 0u, 0u}};
                    if (c < C && !bad) {
                        if (ll) {
                            tbad = bm_tp_poll_ll(p, bm_tp_ll_row(p.peer[p.rank], p, par, g) + (size_t)c * 4, tag, s,
                                                 E, q);
                            if (tbad)
                                bm_tp_record(p, tbad, s, E);
                        } else {
                            q = bm_tp_load8_cg(bm_tp_slot(p.peer[p.rank], p, par, 0, g) + (size_t)c * 8);
                        }
                    }
                    bm_unpack8(q, v[j]);
                }
                if (ll)
                    bad = __syncthreads_or(bad | tbad);
                bm_tp_stage_b<NT, J, CS, VEC, false>(p, v, res, g, par, C, g0, red, xred, rp, !bad, false, wb);
            }
        }
    }

    /* no block of a cluster may exit while a sibling can still read its
     * shared memory */
    if (CS > 1)
        cooperative_groups::this_cluster().sync();

    /* ---- advance the epoch copies b, b + G, ...: every thread's read of
     * copy b has returned (E is an operand of this barrier) first ---- */
    __syncthreads_or(E == 0ull);
    for (int k = (int)threadIdx.x; fb + k * (int)gridDim.x < BM_TP_MAX_BLOCKS; k += NT)
        p.epoch[fb + k * (int)gridDim.x] = E;
}

/* A rank that rejected its arguments: its arrival at every peer, then a
 * bounded wait (as arrive() in bm_tp_kernel) until every peer has started
 * this epoch E, then errf[r] = E and every flags[E & 1][r][b] = E at every
 * peer, so that the peers' blocks of this epoch stop waiting and see the
 * rejection (LL pollers check errf); then the epoch advances as after a
 * normal call. The wait is for E, not E-1 as arrive() has it: flags of
 * parity E & 1 are safe once a peer started E-1, but errf[r] = E reads as
 * "rejected" to every wait of an epoch <= E, so a peer still in E-1 would
 * take r's valid call E-1 for a rejected one. A peer that started E has
 * finished E-1 (stream order); it stores its arrival before any wait of
 * its own, so two rejecting ranks never wait for each other. A timeout is
 * recorded and then nothing is written into the peers (as a timed-out
 * block pushes nothing): the workspace is dead either way. */
__global__ void bm_tp_reject_kernel(const bm_tp_params p)
{
    __shared__ unsigned long long s_epoch;
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    if (threadIdx.x == 0) {
        s_epoch = *(volatile unsigned long long *)p.epoch + 1ull;
        for (int s = 0; s < p.nranks; ++s)
            if (s != p.rank)
                bm_tp_st_release(bm_tp_word(p.peer[s], p.arr_off, p.rank), s_epoch);
    }
    __syncthreads();
    const unsigned long long E = s_epoch;
    const int par = (int)(E & 1ull);
    int tb = 0;
    if ((int)threadIdx.x < p.nranks && (int)threadIdx.x != p.rank) {
        const int s = (int)threadIdx.x;
        /* PEER_REJECTED: s rejected E too, so it started E (no harm) */
        tb = bm_tp_wait_ge(p, bm_tp_word(p.peer[p.rank], p.arr_off, s), E, s, E, 0, 0);
        if (tb)
            bm_tp_record(p, tb, s, E);
    }
    const int late = __syncthreads_or(tb == BM_TP_TIMEOUT);
    if (!late) {
        if (threadIdx.x == 0) {
            for (int s = 0; s < p.nranks; ++s)
                if (s != p.rank)
                    bm_tp_st_release(bm_tp_word(p.peer[s], p.errf_off, p.rank), E);
            __threadfence_system(); /* errf before any flag: a peer that sees the flag sees errf */
        }
        __syncthreads();
        for (int idx = (int)threadIdx.x; idx < p.nranks * BM_TP_MAX_BLOCKS; idx += (int)blockDim.x) {
            const int s = idx / BM_TP_MAX_BLOCKS, b = idx % BM_TP_MAX_BLOCKS;
            if (s != p.rank)
                bm_tp_st_release(bm_tp_flag(p.peer[s], p.flags_off, par, p.rank, b), E);
        }
    }
    __syncthreads();
    for (int k = (int)threadIdx.x; k < BM_TP_MAX_BLOCKS; k += (int)blockDim.x)
        p.epoch[k] = E;
}

/* ---- host side ----------------------------------------------------------- */

static int bm_tp_next_pow2(int c)
{
    int n = 1;
    while (n < c)
        n *= 2;
    return n;
}

/* Decode sizes (few rows per rank): one chunk per thread, and the row
 * spread over a cluster of up to 8 blocks while the grid stays within one
 * wave of an H200 (132 multiprocessors), as the row kernel does, so that a
 * row's loads are spread over several multiprocessors. Larger: two chunks
 * per thread, one block per row group. Depends on L and hidden only, so
 * every rank picks the same shape. */
int bm_tp_shape_index(int64_t L, int hidden)
{
    const int n2 = bm_tp_next_pow2(hidden / 8); /* 32 .. 1024 */
    if (L > 128 && n2 >= 256)
        return n2 == 1024 ? 17 : (n2 == 512 ? 16 : 15);
    int cs = 8;
    while (cs > 1 && (L * cs > 132 || n2 / cs < 64))
        cs /= 2;
    const int nt = n2 / cs;
#define BM_PICK(I, NT, J, CS) \
    if (J == 1 && NT == nt && CS == cs) return I;
    BM_TP_SHAPES(BM_PICK)
#undef BM_PICK
    return 5; /* not reached: every (nt, cs) above is listed */
}

int bm_tp_occupancy_cap(int shape)
{
    int dev = 0, sms = 0, per = 0, cs = 1;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess)
        return 1;
#define BM_OCC(I, NT, J, CS)                                                                          \
    if (shape == I) {                                                                                 \
        cs = CS;                                                                                      \
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, bm_tp_kernel<NT, J, CS, true, false>, \
                                                          NT, 0);                                     \
    }
    BM_TP_SHAPES(BM_OCC)
#undef BM_OCC
    cudaGetLastError();
    if (e != cudaSuccess || per < 1)
        per = 1;
    long cap = (long)sms * per / cs;
    if (cap * cs > BM_TP_MAX_BLOCKS)
        cap = BM_TP_MAX_BLOCKS / cs;
    return (int)(cap < 1 ? 1 : cap);
}

template <int NT, int J, int CS, bool VEC, bool TWO>
static cudaError_t bm_tp_go(const bm_tp_params &p, unsigned groups, cudaStream_t stream)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[2];
    unsigned n = 0;
    cfg.gridDim = dim3(groups * CS, 1, 1);
    cfg.blockDim = dim3(NT, 1, 1);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = stream;
    cfg.attrs = at;
    if (CS > 1) {
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = CS;
        at[n].val.clusterDim.y = 1;
        at[n].val.clusterDim.z = 1;
        ++n;
    }
    at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
    cfg.numAttrs = n;
    cudaError_t e = cudaLaunchKernelEx(&cfg, bm_tp_kernel<NT, J, CS, VEC, TWO>, p);
    return e != cudaSuccess ? e : cudaGetLastError();
}

static int bm_tp_aligned16(const void *q)
{
    return ((uintptr_t)q & 15u) == 0;
}

static void bm_tp_fill(const bm_tp_ws *w, bm_tp_params *p)
{
    p->nranks = w->nranks;
    p->rank = w->rank;
    for (int s = 0; s < BM_TP_MAX_RANKS; ++s)
        p->peer[s] = s < w->nranks ? w->peer[s] : nullptr;
    p->flags_off = w->flags_off;
    p->errf_off = w->errf_off;
    p->arr_off = w->arr_off;
    p->ll_off = w->ll_off;
    p->ll_rows = w->ll_rows;
    p->data_off = w->data_off;
    p->slot_bytes = w->slot_bytes;
    p->epoch = w->epoch;
    p->err = w->err_d;
    p->timeout_ns = (unsigned long long)w->timeout_ms * 1000000ull;
    p->hidden = w->hidden;
}

cudaError_t bm_tp_launch_fused(const bm_tp_ws *w, const bm_args *a, int twoshot, cudaStream_t stream)
{
    bm_tp_params p = {};
    bm_tp_fill(w, &p);
    p.experts = a->experts;
    p.weights = a->weights;
    p.top_k = a->top_k;
    p.routed_scale = a->routed_scale;
    p.normA = a->post.on;
    p.wA = a->post.on ? a->post.weight : nullptr;
    p.epsA = a->post.eps;
    p.residual = a->residual;
    p.has_scales = a->has_scales;
    p.scale_x = a->scale_x;
    p.scale_r = a->scale_r;
    p.normB = a->next.on;
    p.wB = a->next.on ? a->next.weight : nullptr;
    p.epsB = a->next.eps;
    p.hidden_out = a->hidden_out;
    p.normalized = a->normalized;
    p.T = a->tokens;
    p.L = (a->tokens + w->nranks - 1) / w->nranks;

    /* LL for decode sizes of ONESHOT (rows fit the LL buffers) */
    p.ll = !twoshot && p.L <= BM_TP_LL_MAX_L && p.T <= w->ll_rows;
    const int shape = bm_tp_shape_index(p.L, w->hidden);
    const int64_t want = p.L < 1 ? 1 : p.L;
    const unsigned grid = (unsigned)(want < w->gcap[shape] ? want : w->gcap[shape]);
    const void *ptrs[] = {p.experts, p.wA, p.residual, p.wB, p.hidden_out, p.normalized};
    int vec = 1;
    for (const void *q : ptrs)
        if (q && !bm_tp_aligned16(q))
            vec = 0;
#define BM_GO(I, NT, J, CS)                                                                  \
    if (shape == I) {                                                                        \
        if (twoshot)                                                                         \
            return vec ? bm_tp_go<NT, J, CS, true, true>(p, grid, stream)                    \
                       : bm_tp_go<NT, J, CS, false, true>(p, grid, stream);                  \
        return vec ? bm_tp_go<NT, J, CS, true, false>(p, grid, stream)                       \
                   : bm_tp_go<NT, J, CS, false, false>(p, grid, stream);                     \
    }
    BM_TP_SHAPES(BM_GO)
#undef BM_GO
    return cudaErrorInvalidConfiguration;
}

cudaError_t bm_tp_launch_reject(const bm_tp_ws *w, cudaStream_t stream)
{
    bm_tp_params p = {};
    bm_tp_fill(w, &p);
    bm_tp_reject_kernel<<<1, 256, 0, stream>>>(p);
    return cudaGetLastError();
}
