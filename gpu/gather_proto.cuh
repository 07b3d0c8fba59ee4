/*
 * gather_proto.cuh - the device side of the gather's flag protocol
 * (internal): the memory-model primitives, where flags, words, LL rows and
 * pushed rows live in a rank's peer-visible region, bounded waits, the
 * claim of a workspace by one grid, the argument signature and the LL
 * wrap-around clearing. Every kernel that advances the epoch (the fused
 * kernels, the reject kernel, the in-process all-gather) is built from
 * these; gather_impl.h describes the protocol.
 */
#ifndef BEAMMOE_GPU_GATHER_PROTO_CUH
#define BEAMMOE_GPU_GATHER_PROTO_CUH

#include <stdint.h>

#include "gather_impl.h"
#include "numerics.cuh"

/* ---- memory-model primitives ----------------------------------------------- */

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

/* ---- addresses in a region ---------------------------------------------------- */

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

/* Row g of array a (0, 1) of parity par in a region. */
__device__ __forceinline__ uint16_t *bm_tp_slot(char *region, const bm_tp_params &p, int par, int a,
                                                int64_t g)
{
    return reinterpret_cast<uint16_t *>(region + p.data_off + (size_t)(2 * par + a) * p.slot_bytes) +
           (size_t)g * p.hidden;
}

/* ---- failures ------------------------------------------------------------------ */

/* Record a failure in the host-mapped record (any one of several racing
 * writers wins; all describe a real failure of this call), and mark the
 * workspace dead on the device (state: its epoch words) so that the kernels
 * already queued behind this one, eager or in a graph, give up at once
 * instead of each waiting for the timeout. */
__device__ __forceinline__ void bm_tp_put_err(bm_tp_err *err, unsigned long long *state, int code, int peer,
                                              unsigned long long E)
{
    *(volatile unsigned long long *)(state + BM_TP_DEAD) = 1ull;
    err->peer = peer;
    err->epoch = E;
    err->code = (uint32_t)code;
    __threadfence_system();
}

__device__ __forceinline__ void bm_tp_record(const bm_tp_params &p, int code, int peer, unsigned long long E)
{
    bm_tp_put_err(p.err, p.epoch, code, peer, E);
}

/* fail[r] = E at every peer: a peer waiting for this rank's rows or flags
 * in E stops at once instead of at its timeout, and a peer that already has
 * this rank's flag sees that the rows behind it are incomplete. */
__device__ __forceinline__ void bm_tp_publish_fail(const bm_tp_params &p, unsigned long long E)
{
    for (int s = 0; s < p.nranks; ++s)
        if (s != p.rank)
            *(volatile unsigned long long *)bm_tp_word(p.peer[s], p.fail_off, p.rank) = E;
    __threadfence_system();
}

/* A failure this rank found in epoch E (a timeout, a peer's rejection or
 * other arguments): recorded here and published at every peer. */
__device__ __forceinline__ void bm_tp_fail(const bm_tp_params &p, int code, int peer, unsigned long long E)
{
    bm_tp_record(p, code, peer, E);
    bm_tp_publish_fail(p, E);
}

/* The signature word of epoch E: its low 32 bits beside the signature. */
__device__ __forceinline__ unsigned long long bm_tp_sig_word(unsigned long long E, uint32_t sig)
{
    return ((E & 0xFFFFFFFFull) << 32) | sig;
}

/* Peer s's signature in epoch E as this rank sees it: 0 not known yet, 1
 * equal to ours, -1 different (then s passed other arguments). */
__device__ __forceinline__ int bm_tp_sig_seen(const bm_tp_params &p, int s, unsigned long long E, int acquire)
{
    const unsigned long long *w = bm_tp_word(p.peer[p.rank], p.sig_off, (int)(E & 1ull) * BM_TP_MAX_RANKS + s);
    const unsigned long long v = acquire ? bm_tp_ld_acquire(w) : bm_tp_ld_relaxed(w);
    if ((v >> 32) != (E & 0xFFFFFFFFull))
        return 0;
    /* the reject kernel has no signature of its own: it compares nothing */
    return p.sig == 0u || (uint32_t)v == p.sig ? 1 : -1;
}

/* The slow path of every wait for peer s in epoch E: s rejected its
 * arguments (errf[s] >= E), passed different ones, or the wait ran past the
 * timeout. 0 while none of these holds. */
__device__ __forceinline__ int bm_tp_wait_check(const bm_tp_params &p, int s, unsigned long long E,
                                                unsigned long long &t0)
{
    if (bm_tp_ld_relaxed(bm_tp_word(p.peer[p.rank], p.errf_off, s)) >= E)
        return BM_TP_PEER_REJECTED;
    if (bm_tp_ld_relaxed(bm_tp_word(p.peer[p.rank], p.fail_off, s)) >= E)
        return BM_TP_PEER_FAILED;
    if (bm_tp_sig_seen(p, s, E, 0) < 0)
        return BM_TP_MISMATCH;
    const unsigned long long now = bm_tp_now();
    if (t0 == 0)
        t0 = now;
    else if (now - t0 > p.timeout_ns)
        return BM_TP_TIMEOUT;
    return 0;
}

/* Wait until *f >= want (exact: == want), relaxed polls, bounded by the
 * slow path above; acquire: one acquire fence after the wait, and the
 * rejection and signature of s read after it. 0 or a BM_TP_* code. */
__device__ __forceinline__ int bm_tp_wait_ge(const bm_tp_params &p, const unsigned long long *f,
                                             unsigned long long want, int s, unsigned long long E, int exact,
                                             int acquire)
{
    unsigned long long t0 = 0;
    unsigned spins = 0;
    for (;;) {
        const unsigned long long v = bm_tp_ld_relaxed(f);
        if (exact ? v == want : v >= want)
            break;
        if ((++spins & 255u) == 0) {
            const int why = bm_tp_wait_check(p, s, E, t0);
            if (why)
                return why;
        }
    }
    const unsigned long long *ef = bm_tp_word(p.peer[p.rank], p.errf_off, s);
    if (!acquire)
        return bm_tp_ld_relaxed(ef) >= E ? BM_TP_PEER_REJECTED : 0;
    bm_tp_fence_acquire();
    if (bm_tp_ld_acquire(ef) >= E)
        return BM_TP_PEER_REJECTED;
    /* a block of s that failed still releases its flag, after fail[s] */
    if (bm_tp_ld_acquire(bm_tp_word(p.peer[p.rank], p.fail_off, s)) >= E)
        return BM_TP_PEER_FAILED;
    /* s released this flag after it stored its signature of epoch E */
    return bm_tp_sig_seen(p, s, E, 1) == 1 ? 0 : BM_TP_MISMATCH;
}

/* After the LL words of epoch E from s arrived (no fence on that path):
 * wait, bounded, until s's signature of E is visible and compare it. */
__device__ __forceinline__ int bm_tp_wait_sig(const bm_tp_params &p, int s, unsigned long long E)
{
    unsigned long long t0 = 0;
    unsigned spins = 0;
    for (;;) {
        const int seen = bm_tp_sig_seen(p, s, E, (spins & 15u) == 15u);
        if (seen)
            return seen > 0 ? 0 : BM_TP_MISMATCH;
        if ((++spins & 63u) == 0) {
            const int why = bm_tp_wait_check(p, s, E, t0);
            if (why)
                return why;
        }
    }
}

/* ---- pushes --------------------------------------------------------------------- */

/* Store the thread's packed chunks of row g into array a of every peer's
 * region. */
template <int J, int STRIDE>
__device__ __forceinline__ void bm_tp_push(const bm_tp_params &p, int par, int a, int64_t g,
                                           const bm_pack8 (&pk)[J], int C, int g0)
{
    for (int s = 0; s < p.nranks; ++s) {
        if (s == p.rank)
            continue;
        uint16_t *dst = bm_tp_slot(p.peer[s], p, par, a, g);
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = g0 + j * STRIDE;
            if (c < C)
                bm_store8<true>(dst + (size_t)c * 8, pk[j]);
        }
    }
}

/* LL push of row g: each 8-byte word holds 32 bits of data and the epoch
 * tag; an aligned 8-byte store is single-copy atomic, so a reader that
 * sees the tag sees the data (no fence, no separate flag). Into every
 * peer's LL rows, and with self this rank's own too. */
template <int J, int STRIDE>
__device__ __forceinline__ void bm_tp_push_ll(const bm_tp_params &p, int par, int64_t g,
                                              const bm_pack8 (&pk)[J], int C, int g0, uint32_t tag,
                                              bool self = false)
{
    const unsigned long long t = (unsigned long long)tag << 32;
    for (int s = 0; s < p.nranks; ++s) {
        if (s == p.rank && !self)
            continue;
        unsigned long long *dst = bm_tp_ll_row(p.peer[s], p, par, g);
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = g0 + j * STRIDE;
            if (c >= C)
                continue;
            asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(dst + (size_t)c * 4),
                         "l"(t | pk[j].w[0]), "l"(t | pk[j].w[1])
                         : "memory");
            asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(dst + (size_t)c * 4 + 2),
                         "l"(t | pk[j].w[2]), "l"(t | pk[j].w[3])
                         : "memory");
        }
    }
}

/* One LL chunk (4 words) loaded once; whether every tag is this epoch's;
 * its data bits: bm_tp_poll_ll's steps, apart, so that a reader of several
 * chunks issues every load before it looks at any (the all-reduce's LL
 * wait). bm_tp_poll_ll keeps its own copy of them: the gather's kernels
 * stay as they were timed, instruction for instruction. */
struct bm_tp_ll4 {
    unsigned long long a[4];
};

__device__ __forceinline__ bm_tp_ll4 bm_tp_ll_load(const unsigned long long *src)
{
    bm_tp_ll4 w;
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(w.a[0]), "=l"(w.a[1]) : "l"(src) : "memory");
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(w.a[2]), "=l"(w.a[3]) : "l"(src + 2) : "memory");
    return w;
}

__device__ __forceinline__ bool bm_tp_ll_ready(const bm_tp_ll4 &w, uint32_t tag)
{
    return (uint32_t)(w.a[0] >> 32) == tag && (uint32_t)(w.a[1] >> 32) == tag && (uint32_t)(w.a[2] >> 32) == tag &&
           (uint32_t)(w.a[3] >> 32) == tag;
}

__device__ __forceinline__ bm_pack8 bm_tp_ll_bits(const bm_tp_ll4 &w)
{
    bm_pack8 out;
#pragma unroll
    for (int i = 0; i < 4; ++i)
        out.w[i] = (uint32_t)w.a[i];
    return out;
}

/* Poll one LL chunk until every tag is this epoch's. */
__device__ __forceinline__ int bm_tp_poll_ll(const bm_tp_params &p, const unsigned long long *src, uint32_t tag,
                                             int s, unsigned long long E, bm_pack8 &out)
{
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
            const int why = bm_tp_wait_check(p, s, E, t0);
            if (why)
                return why;
        }
    }
}

/* The LL path's end: its rows came without a fence, so once they are
 * used, every peer's signature of this call is compared (a bounded wait
 * until it shows; a mismatch is recorded). Block-uniform; a barrier. The
 * all-reduce's; the gather's kernel spells it out (its code as timed). */
__device__ __forceinline__ int bm_tp_ll_sigs(const bm_tp_params &p, unsigned long long E, int bad)
{
    int tb = 0;
    if (!bad && (int)threadIdx.x < p.nranks && (int)threadIdx.x != p.rank) {
        tb = bm_tp_wait_sig(p, (int)threadIdx.x, E);
        if (tb)
            bm_tp_fail(p, tb, (int)threadIdx.x, E);
    }
    return __syncthreads_or(bad | tb);
}

/* ---- the start and end of every epoch-advancing kernel -------------------------- */

/* This block's epoch: copy fb of the epoch, plus one. */
__device__ __forceinline__ unsigned long long bm_tp_epoch(const bm_tp_params &p, int fb)
{
    return *(volatile unsigned long long *)(p.epoch + fb) + 1ull;
}

/* Claim the workspace for this grid (block-uniform result; a barrier). The
 * claim word holds %gridid + 1 of the grid that runs; the first block of a
 * grid sets it, the others find their own grid's id. Another grid's id
 * means two calls on this workspace overlap on the device (they were not
 * ordered on one stream): this block then computes nothing, and the
 * failure is recorded, which makes the workspace dead. Must follow the
 * programmatic-launch wait (the previous grid has completed).
 * dead (block-uniform): an earlier kernel of this workspace recorded a
 * failure. The block then computes and waits for nothing, and publishes
 * fail[r] = E at every peer, so that a peer's kernel of E stops at once
 * too: after one failure, every queued kernel of every rank ends without
 * waiting (the first failure's record stays).
 * In two halves, so that a kernel may request its first row's inputs
 * while the claim's round trip is under way (bm_ar_kernel): thread 0
 * sends the compare-and-swap and the dead word's read (bm_tp_claim_send),
 * then every thread takes the answer at the barrier (bm_tp_claim_take). */
struct bm_tp_claim_req {
    unsigned long long old, dead, me;
};

__device__ __forceinline__ bm_tp_claim_req bm_tp_claim_send(const bm_tp_params &p)
{
    bm_tp_claim_req q = {0ull, 0ull, 0ull};
    if (threadIdx.x == 0) {
        unsigned long long gid;
        asm volatile("mov.u64 %0, %%gridid;" : "=l"(gid));
        q.me = gid + 1ull;
        /* the dead word read beside the claim, not after it: one round
         * trip to L2 at the kernel's start instead of two (the previous
         * grid's writes are visible to both, bm_pdl_wait)
         * [2026-12-06-allreduce-local: start] */
        q.dead = *(volatile unsigned long long *)(p.epoch + BM_TP_DEAD);
        q.old = atomicCAS(p.epoch + BM_TP_CLAIM, 0ull, q.me);
    }
    return q;
}

__device__ __forceinline__ int bm_tp_claim_take(const bm_tp_params &p, unsigned long long E,
                                                const bm_tp_claim_req &q, int &dead)
{
    int conc = 0, gone = 0;
    if (threadIdx.x == 0) {
        conc = q.old != 0ull && q.old != q.me;
        if (conc)
            bm_tp_record(p, BM_TP_CONCURRENT, p.rank, E);
        else if (q.dead != 0ull) {
            gone = 1;
            bm_tp_publish_fail(p, E);
        }
    }
    dead = __syncthreads_or(gone);
    return __syncthreads_or(conc);
}

__device__ __forceinline__ int bm_tp_claim(const bm_tp_params &p, unsigned long long E, int &dead)
{
    return bm_tp_claim_take(p, E, bm_tp_claim_send(p), dead);
}

/* At the end of a block that claimed, once it has made its last access to
 * the workspace: count the block done, and advance its epoch copies (fb,
 * fb + grid, ...: every copy is advanced by every call whatever its grid);
 * the grid's last block then releases the claim. In two halves, so that
 * the count's round trip can run beside the block's remaining work (its
 * last row's stages, bm_ar_kernel): bm_tp_finish_send counts (thread 0's
 * count before this block, block-uniform otherwise), bm_tp_finish_take
 * releases.
 * The count is the low 32 bits of the done word, and atom.inc returns it
 * to 0 at the last block (it wraps at grid - 1), so that the last block
 * stores nothing but the claim. Each count is a release (cumulative over
 * the block's accesses through the barrier), and the last block's acquire
 * fence after it orders every block's accesses before its store of the
 * claim. Nothing on the way stalls the block: the count's fence finds no
 * store of the block outstanding (the copies follow the count: only the
 * stream's next grid reads them, after this grid completed, bm_pdl_wait),
 * the count waits for its answer only in bm_tp_finish_take (so n stays
 * unused until then: any use of it after the atomic holds thread 0, and
 * the block's next barrier with it, for the round trip), and the acquire
 * fence is an L1 invalidation, not a wait for the block's output stores
 * [2026-12-06-allreduce-local: finish]. */
__device__ __forceinline__ uint32_t bm_tp_finish_send(const bm_tp_params &p, unsigned long long E, int fb, int grid)
{
    /* every thread's read of copy fb has returned (E is an operand) */
    __syncthreads_or(E == 0ull);
    uint32_t n = 0u;
    if (threadIdx.x == 0)
        asm volatile("atom.release.gpu.global.inc.u32 %0, [%1], %2;"
                     : "=r"(n)
                     : "l"(p.epoch + BM_TP_DONE), "r"((uint32_t)grid - 1u)
                     : "memory");
    for (int k = (int)threadIdx.x; fb + k * grid < BM_TP_MAX_BLOCKS; k += (int)blockDim.x)
        p.epoch[fb + k * grid] = E;
    return n;
}

__device__ __forceinline__ void bm_tp_finish_take(const bm_tp_params &p, uint32_t n, int grid)
{
    if (threadIdx.x == 0 && n == (uint32_t)grid - 1u) {
        asm volatile("fence.acquire.gpu;" ::: "memory");
        asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p.epoch + BM_TP_CLAIM), "l"(0ull) : "memory");
    }
}

__device__ __forceinline__ void bm_tp_finish(const bm_tp_params &p, unsigned long long E, int fb, int grid)
{
    bm_tp_finish_take(p, bm_tp_finish_send(p, E, fb, grid), grid);
}

/* LL tags hold the low 32 bits of the epoch. Epochs k * 2^30 and
 * k * 2^30 + 1 (k >= 1) send no LL words and clear this rank's LL rows of
 * their parity: no peer writes them then (every rank is in the same epoch,
 * and a peer reaches the same parity again only in E + 2, after this rank
 * arrived at E + 1), so a tag can survive at most 2^30 + 1 epochs and never
 * equals a later epoch's low 32 bits. */
__device__ __forceinline__ bool bm_tp_ll_clearing(unsigned long long E)
{
    return E >= (1ull << 30) && (E & ((1ull << 30) - 1ull)) <= 1ull;
}

__device__ __forceinline__ void bm_tp_ll_clear(const bm_tp_params &p, unsigned long long E)
{
    if (!bm_tp_ll_clearing(E) || p.ll_rows == 0)
        return;
    unsigned long long *base = bm_tp_ll_row(p.peer[p.rank], p, (int)(E & 1ull), 0);
    const size_t n = (size_t)p.ll_rows * (size_t)(p.hidden / 2);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        base[i] = 0ull;
}

/* Block fb's start, after the claim: its signature of epoch E at every
 * peer (thread 0), and block 0 stores its arrival at E there. The barrier
 * that follows in the caller orders both before any push of the block. */
__device__ __forceinline__ void bm_tp_announce(const bm_tp_params &p, unsigned long long E, int fb)
{
    if (threadIdx.x != 0)
        return;
    const int par = (int)(E & 1ull);
    const unsigned long long sw = bm_tp_sig_word(E, p.sig);
    for (int s = 0; s < p.nranks; ++s)
        if (s != p.rank)
            *(volatile unsigned long long *)bm_tp_word(p.peer[s], p.sig_off, par * BM_TP_MAX_RANKS + p.rank) = sw;
    /* a group of one has no peer to tell: no system-scope fence, which
     * holds block 0, a part of the row at decode
     * [2026-12-06-allreduce-local: start] */
    if (fb == 0 && p.nranks > 1) {
        __threadfence_system(); /* the signature before the arrival */
        for (int s = 0; s < p.nranks; ++s)
            if (s != p.rank)
                *(volatile unsigned long long *)bm_tp_word(p.peer[s], p.arr_off, p.rank) = E;
    }
}

/* Before its first write into a peer, a block waits until every peer
 * arrived at epoch want (block-uniform; a barrier). */
__device__ __forceinline__ int bm_tp_wait_arrivals(const bm_tp_params &p, unsigned long long want,
                                                   unsigned long long E, int bad)
{
    int tb = 0;
    if (!bad && p.nranks > 1 && (int)threadIdx.x < p.nranks && (int)threadIdx.x != p.rank) {
        const int s = (int)threadIdx.x;
        /* no acquire: nothing is read on the strength of it; the writes
         * that follow depend on it through the barrier */
        tb = bm_tp_wait_ge(p, bm_tp_word(p.peer[p.rank], p.arr_off, s), want, s, E, 0, 0);
        if (tb)
            bm_tp_fail(p, tb, s, E);
    }
    return __syncthreads_or(bad | tb);
}

/* Block fb's rows are pushed: release its flag of epoch E at every peer
 * (after the barrier, thread 0), then wait for block fb of every peer
 * (exactly E: a peer out of step never matches, it times out). A block
 * that failed still releases its flag (after its failure was published,
 * bm_tp_fail), so that no peer waits for it; a block of a grid that lost
 * the claim (conc) writes nothing. Block-uniform. */
__device__ __forceinline__ int bm_tp_signal_wait(const bm_tp_params &p, unsigned long long E, int fb, int bad,
                                                 int conc)
{
    const int par = (int)(E & 1ull);
    __syncthreads();
    if (threadIdx.x == 0 && p.nranks > 1 && !conc) {
        /* st.release.sys is cumulative: the block's pushes, ordered before
         * it by the barrier, are visible to a peer that acquires the flag */
        for (int s = 0; s < p.nranks; ++s)
            if (s != p.rank)
                bm_tp_st_release(bm_tp_flag(p.peer[s], p.flags_off, par, p.rank, fb), E);
    }
    int tb = 0;
    if (!bad && (int)threadIdx.x < p.nranks && (int)threadIdx.x != p.rank) {
        const int s = (int)threadIdx.x;
        tb = bm_tp_wait_ge(p, bm_tp_flag(p.peer[p.rank], p.flags_off, par, s, fb), E, s, E, 1, 1);
        if (tb)
            bm_tp_fail(p, tb, s, E);
    }
    return __syncthreads_or(bad | tb);
}

#endif
