/*
 * gather_fused.cu - the kernels of the tensor-parallel gather over peer
 * memory (internal): ONESHOT and TWOSHOT, the kernel of a rank that
 * rejected its arguments, the in-process all-gather of UNFUSED, and the
 * record kernels of UNFUSED over NCCL. The flag protocol is
 * gather_proto.cuh's; the arithmetic is the row stages of
 * gpu/row_ops.cuh, the same functions every single-device kernel
 * composes, so a change of arithmetic there reaches the gather too.
 *
 * One fused kernel per call on every rank, same grid G on every rank (it
 * depends on T, hidden and the caps agreed at workspace creation only).
 * Block b of rank r takes r's owned local rows i = b, b+G, ... and, for
 * every peer s, s's rows with the same local indices. So block b depends
 * only on block b of each peer: no grid-wide barrier.
 *
 *   start    claim the workspace for this grid, announce the call's
 *            signature at every peer (block 0: and its arrival at E);
 *            before its first write into a peer, a block waits until every
 *            peer's arr >= E-1 (the parity rule of gather_impl.h).
 *   phase 1  own rows: finalize (+ post-norm) and
 *              ONESHOT: push the finalized BF16 row to every peer, then
 *                       residual add + next norm locally;
 *              TWOSHOT: residual add + next norm, write both locally and
 *                       push both to every peer.
 *   ONESHOT, decode sizes (L <= BM_TP_LL_MAX_L): the pushed rows are LL
 *            words (epoch tag beside every 32 data bits); phase 2 polls the
 *            words themselves; the peers' signatures are compared at the
 *            end (a mismatch is recorded, the outputs are then undefined).
 *   otherwise: signal (release the block's flag at every peer) and wait for
 *            block b of every peer, whose signature is compared before any
 *            of its rows is used.
 *   Every wait is bounded by the workspace timeout (%globaltimer) and ends
 *   early when the peer rejected its arguments or passed different ones.
 *   A failure goes to the host-mapped record; the block still runs the
 *   rest (its cluster exchanges) but stores nothing.
 *   phase 2  peers' rows: ONESHOT: residual add + next norm of the pushed
 *            finalized row; TWOSHOT: copy the pushed hidden/normalized rows.
 *   end      advance the epoch copies, release the claim.
 *
 * Decode sizes spread each row over a cluster of CS blocks (as the row
 * kernel does): block B = b*CS + q takes chunk slice q of the rows of group
 * b; flags are per block B, so a block still waits only for the same block
 * of each peer, which pushed exactly the slice it reads. The norm's tree
 * crosses the cluster by the exchange of row_ops.cuh. Rows pushed by peers
 * are read with ld.global.cg (L2, never a stale L1 line).
 */
#include <stdint.h>

#include "agree.h"
#include "tp_launch.cuh"
#include "tp_shape.h"

template <int NT, int J, int CS, bool VEC, bool TWO, int Q>
__global__ void __launch_bounds__(NT) bm_tp_kernel(const typename bm_tp_kparams<Q>::type p)
{
    __shared__ float red[2][NT];
    __shared__ bm_xchg<NT, CS> xc[1];
    constexpr int STRIDE = CS * NT;
    const int C = p.hidden >> 3;
    const int H = p.hidden;
    const int fb = (int)blockIdx.x;                     /* flag index */
    const int b = CS > 1 ? fb / CS : fb;                /* row group */
    const int G = CS > 1 ? (int)gridDim.x / CS : (int)gridDim.x;
    const int g0 = (CS > 1 ? (fb % CS) * NT : 0) + (int)threadIdx.x;
    /* the number of norms of a row is the same in every block of a cluster */
    const bool xchg = CS > 1 && (p.normA || p.normB);
    bm_tree_ctx<NT, CS> tc = {red, xc, 0, 0u, 0, 0, -1};

    if constexpr (CS > 1)
        if (xchg)
            bm_xchg_start<NT, CS>(xc[0]);
    /* Programmatic dependent launch: this grid may be scheduled while the
     * preceding kernel of the stream finishes; wait for it (its writes, the
     * epoch included, are then visible) before touching memory. Let the
     * next kernel be scheduled early only where no peer shares this device:
     * its blocks would sit on multiprocessors that a peer's kernel, which
     * this one waits for, may need. */
    bm_pdl_wait();
    if (p.early)
        bm_pdl_trigger();
    bm_prefetch_weights<J, STRIDE>(p.normA ? p.wA : NULL, p.normB ? p.wB : NULL, C, g0);
    /* Every thread reads the epoch itself; it changes only at the end of
     * this kernel, after every thread has used it (bm_tp_finish). */
    const unsigned long long E = bm_tp_epoch(p, fb);
    const int par = (int)(E & 1ull);
    const uint32_t tag = (uint32_t)E;
    const bool ll = !TWO && p.ll && !bm_tp_ll_clearing(E);
    int dead;
    const int conc = bm_tp_begin(p, E, bm_tp_claim_send(p), fb, dead);
    int bad = conc | dead;
    int arrived = p.nranks < 2;

    /* ---- phase 1: own rows ---- */
    const int64_t own_lo = (int64_t)p.rank * p.L;
    int64_t owned = p.rows - own_lo;
    owned = owned < 0 ? 0 : (owned > p.L ? p.L : owned);
    for (int64_t i = b; i < owned; i += G) {
        const int64_t g = own_lo + i;
        float v[J][8];
        bm_pack8 pk[J], res[J];
        bm_tp_load_res<J, STRIDE, VEC>(p, res, g, C, g0);
        bm_tp_finalize_row<NT, J, CS, VEC>(p, p.experts + (size_t)i * (size_t)p.top_k * H,
                                           p.weights + (size_t)i * p.top_k, v, pk, C, g0);
        if (p.normA)
            bm_norm_stage<NT, J, CS, VEC, STRIDE>(v, pk, p.wA, p.epsA, H, C, g0, tc, false);
        if (!arrived) {
            bad = bm_tp_wait_arrivals(p, E - 1ull, E, bad);
            arrived = 1;
        }
        if (!TWO && !bad) {
            if (ll)
                bm_tp_push_ll<J, STRIDE>(p, par, g, pk, C, g0, tag);
            else
                bm_tp_push<J, STRIDE>(p, par, 0, g, pk, C, g0);
        }
        bm_tp_stage_b<NT, J, CS, VEC, TWO, Q>(p, v, pk, res, g, par, C, g0, tc, !bad, !bad);
    }

    if (!ll) {
        /* a flag of parity par is written only after every peer left E-2 */
        if (!arrived) {
            bad = bm_tp_wait_arrivals(p, E - 1ull, E, bad);
            arrived = 1;
        }
        bad = bm_tp_signal_wait(p, E, fb, bad, conc);
    }

    /* ---- phase 2: the peers' rows. Every block of a cluster runs the same
     * rows and exchanges; a failed block computes but stores nothing. ---- */
    for (int s = 0; s < p.nranks; ++s) {
        if (s == p.rank)
            continue;
        const int64_t lo = (int64_t)s * p.L;
        int64_t n = p.rows - lo;
        n = n < 0 ? 0 : (n > p.L ? p.L : n);
        for (int64_t i = b; i < n; i += G) {
            const int64_t g = lo + i;
            if (TWO) {
                bm_tp_copy_pushed<NT, J, CS, VEC, Q>(p, g, par, C, g0, tc, !bad);
            } else {
                float v[J][8];
                bm_pack8 pk[J], res[J];
                bm_tp_load_res<J, STRIDE, VEC>(p, res, g, C, g0);
                int tbad = 0;
#pragma unroll
                for (int j = 0; j < J; ++j) {
                    const int c = g0 + j * STRIDE;
                    bm_pack8 q = {{0u, 0u, 0u, 0u}};
                    if (c < C && !bad) {
                        if (ll) {
                            tbad = bm_tp_poll_ll(p, bm_tp_ll_row(p.peer[p.rank], p, par, g) + (size_t)c * 4, tag,
                                                 s, E, q);
                            if (tbad)
                                bm_tp_fail(p, tbad, s, E);
                        } else {
                            q = bm_tp_load8_cg(bm_tp_slot(p.peer[p.rank], p, par, 0, g) + (size_t)c * 8);
                        }
                    }
                    bm_unpack8(q, v[j]);
                }
                if (ll)
                    bad = __syncthreads_or(bad | tbad);
                bm_tp_stage_b<NT, J, CS, VEC, false, Q>(p, v, pk, res, g, par, C, g0, tc, !bad, false);
            }
        }
    }

    /* LL: the rows came without a fence; now that they are used, compare
     * every peer's signature of this call (bounded wait until it shows) */
    if (ll) {
        int tb = 0;
        if (!bad && (int)threadIdx.x < p.nranks && (int)threadIdx.x != p.rank) {
            tb = bm_tp_wait_sig(p, (int)threadIdx.x, E);
            if (tb)
                bm_tp_fail(p, tb, (int)threadIdx.x, E);
        }
        bad = __syncthreads_or(bad | tb);
    }

    /* no block of a cluster may exit while a sibling can still read its
     * shared memory */
    if (xchg)
        tc.finish();
    if (!conc)
        bm_tp_finish(p, E, fb, (int)gridDim.x);
}

/* A rank that rejected its arguments: its arrival at every peer, then a
 * bounded wait until every peer has started this epoch E, then errf[r] = E
 * and every flags[E & 1][r][b] = E at every peer, so that the peers'
 * blocks of this epoch stop waiting and see the rejection (LL pollers
 * check errf); then the epoch advances as after a normal call. The wait is
 * for E, not E-1 as the fused kernel's: flags of parity E & 1 are safe
 * once a peer started E-1, but errf[r] = E reads as "rejected" to every
 * wait of an epoch <= E, so a peer still in E-1 would take r's valid call
 * E-1 for a rejected one. A peer that started E has finished E-1 (stream
 * order); it stores its arrival before any wait of its own, so two
 * rejecting ranks never wait for each other. A timeout is recorded and
 * then nothing is written into the peers: the workspace is dead either
 * way. No signature is announced (p.sig == 0 compares with nothing). */
__global__ void bm_tp_reject_kernel(const bm_tp_params p)
{
    bm_pdl_wait();
    const unsigned long long E = bm_tp_epoch(p, 0);
    const int par = (int)(E & 1ull);
    int dead;
    const int conc = bm_tp_claim(p, E, dead);
    if (!conc) {
        bm_tp_ll_clear(p, E);
        if (threadIdx.x == 0)
            for (int s = 0; s < p.nranks; ++s)
                if (s != p.rank)
                    *(volatile unsigned long long *)bm_tp_word(p.peer[s], p.arr_off, p.rank) = E;
    }
    __syncthreads();
    int tb = 0;
    if (!conc && !dead && (int)threadIdx.x < p.nranks && (int)threadIdx.x != p.rank) {
        const int s = (int)threadIdx.x;
        tb = bm_tp_wait_ge(p, bm_tp_word(p.peer[p.rank], p.arr_off, s), E, s, E, 0, 0);
        /* PEER_REJECTED: s rejected E too, so it started E; no failure */
        if (tb == BM_TP_PEER_REJECTED)
            tb = 0;
        if (tb)
            bm_tp_fail(p, tb, s, E);
    }
    const int late = __syncthreads_or(conc | dead | (tb == BM_TP_TIMEOUT));
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
    if (!conc)
        bm_tp_finish(p, E, 0, 1);
}

/* UNFUSED in an in-process group: this rank's finalized rows (its slice
 * [r*L, r*L + owned) of p.ag, written by the finalize kernel before) into
 * the same rows of every peer's ag, then the flags as the fused kernels
 * have them. A peer's ag is read by that peer's norm_residual_norm kernel
 * of the previous call, so the pushes wait until every peer arrived at E
 * (it started this call, so that kernel is done). Block b copies rows
 * b, b + G, ... of every rank, as the fused kernels do. */
__global__ void __launch_bounds__(256) bm_tp_allgather_kernel(const bm_tp_params p)
{
    const int fb = (int)blockIdx.x, G = (int)gridDim.x;
    const int C = p.hidden >> 3;
    bm_pdl_wait();
    const unsigned long long E = bm_tp_epoch(p, fb);
    int dead;
    const int conc = bm_tp_begin(p, E, bm_tp_claim_send(p), fb, dead);
    int bad = conc | dead;
    bad = bm_tp_wait_arrivals(p, E, E, bad);
    const int64_t lo = (int64_t)p.rank * p.L;
    int64_t owned = p.rows - lo;
    owned = owned < 0 ? 0 : (owned > p.L ? p.L : owned);
    if (!bad)
        for (int64_t i = fb; i < owned; i += G) {
            const size_t row = (size_t)(lo + i) * p.hidden;
            for (int c = (int)threadIdx.x; c < C; c += (int)blockDim.x) {
                const bm_pack8 q = bm_load8<true>(p.ag + row + (size_t)c * 8);
                for (int s = 0; s < p.nranks; ++s)
                    if (s != p.rank)
                        bm_store8<true>(p.peer_ag[s] + row + (size_t)c * 8, q);
            }
        }
    bad = bm_tp_signal_wait(p, E, fb, bad, conc);
    if (!conc)
        bm_tp_finish(p, E, fb, G);
}

/* UNFUSED over NCCL: this rank's record (status, signature) into its slot
 * of the records that the all-gather replicates, and after it the check of
 * every rank's record: a rank that rejected its arguments or passed other
 * ones fails the call on every rank (recorded; reported by the next call). */
/* NCCL UNFUSED: this rank's record before the all-gathers, and the check
 * of every rank's after them; the two count the all-gathers begun and
 * ended into host-mapped words for the watchdog (gather_watch.cu).
 * count_only: a rank that rejected its arguments only counts. */
__global__ void bm_tp_record_kernel(uint32_t *rec, int rank, uint32_t status, uint32_t sig, bm_tp_err *err,
                                    unsigned long long *state)
{
    bm_pdl_wait();
    if (threadIdx.x == 0) {
        rec[2 * rank] = status;
        rec[2 * rank + 1] = sig;
        const unsigned long long n = state[BM_TP_AG] + 1;
        state[BM_TP_AG] = n;
        err->ag_begun = n;
        __threadfence_system();
    }
}

__global__ void bm_tp_check_kernel(const uint32_t *rec, int nranks, uint32_t sig, bm_tp_err *err,
                                   unsigned long long *state, int count_only)
{
    bm_pdl_wait();
    const int s = (int)threadIdx.x;
    if (s < nranks && !count_only) {
        const int why = rec[2 * s] != 0u ? BM_TP_PEER_REJECTED : rec[2 * s + 1] != sig ? BM_TP_MISMATCH : 0;
        if (why)
            bm_tp_put_err(err, state, why, s, 0ull);
    }
    if (s == 0) {
        err->ag_ended = state[BM_TP_AG];
        __threadfence_system();
    }
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
 * spread over a cluster (gpu/tp_shape.h). Larger: two chunks per thread,
 * one block per row group; also where the one-chunk shape would be a
 * block of 1024 threads beyond LL sizes, whose kernels spill at the 64
 * registers a thread that such a block allows
 * [2026-12-07-tp-kernels: spills]. Depends on L, hidden and the
 * workspace's agreed multiprocessor count only, so every rank picks the
 * same shape. */
int bm_tp_shape_index(int64_t L, int hidden, int qkind, int sms)
{
    const int n2 = bm_tp_next_pow2(hidden / 8); /* 32 .. 1024 */
    const int cs = bm_tp_cluster_size(L, n2, qkind == BEAM_QUANT_FP8_TOKEN, sms);
    if (n2 >= 256 && (L > 128 || (n2 == 1024 && cs == 1 && L > BM_TP_LL_MAX_L)))
        return n2 == 1024 ? 17 : (n2 == 512 ? 16 : 15);
    const int nt = n2 / cs;
#define BM_PICK(I, NT, J, CS) \
    if (J == 1 && NT == nt && CS == cs) return I;
    BM_TP_SHAPES(BM_PICK)
#undef BM_PICK
    return 5; /* not reached: every (nt, cs) above is listed */
}

/* Blocks of a launch shape (cap index: BM_TP_NCAPS) that are resident at
 * once on this device, every fused kernel (the gather's and the
 * all-reduce's, ONESHOT and TWOSHOT) counted. */
struct bm_tp_family {
    static constexpr int NV = 2; /* ONESHOT, TWOSHOT */
    template <int NT, int J, int CS, bool VEC, int V, int Q>
    static auto kernel()
    {
        return &bm_tp_kernel<NT, J, CS, VEC, V != 0, Q>;
    }
};

/* share ranks run their kernels on this device at once (an in-process
 * group may put several ranks on one device). One rank per device: what is
 * resident. Several: a block waiting for a peer must never keep the peer's
 * own kernels from running, and those need whole multiprocessors (a
 * multiprocessor's shared-memory carveout changes only when it is idle, so
 * a pipelined kernel cannot start beside a gather block). Each rank then
 * gets at most one block per multiprocessor of 1/(2 share) of them, so that
 * at least half the multiprocessors hold no gather block. The arithmetic
 * does not depend on the grid. Cap `index`: groups (clusters) per launch on
 * a device of sms multiprocessors. */
static int bm_tp_cap(int index, int sms, int share)
{
    int per = 0, q, ar;
    const int shape = bm_tp_cap_shape(BM_TP_NSHAPES, index, &q, &ar);
    const int cs = shape < BM_TP_NSHAPES ? bm_tp_cs(shape) : 1;
    if (shape == BM_TP_NSHAPES) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, bm_tp_allgather_kernel, 256, 0) != cudaSuccess)
            per = 0;
        cudaGetLastError();
    } else {
        /* the fewest of every kernel of the shape and family, ONESHOT and
         * TWOSHOT, of every form (a grid larger than what is resident
         * would wait on itself) */
        per = ar ? bm_ar_occupancy(shape, q) : bm_tp_family_occupancy<bm_tp_family>(shape, q != 0);
    }
    if (per < 1)
        per = 1;
    long cap = (long)sms * per / cs;
    if (cap * cs > BM_TP_MAX_BLOCKS)
        cap = BM_TP_MAX_BLOCKS / cs;
    if (share > 1 && cap > sms / (2 * share * cs))
        cap = sms / (2 * share * cs);
    return (int)(cap < 1 ? 1 : cap);
}

void bm_tp_caps(int share, int32_t *caps)
{
    const int sms = bm_tp_device_sms();
    for (int i = 0; i < BM_TP_NCAPS; ++i)
        caps[i] = bm_tp_cap(i, sms, share);
}

int bm_tp_device_sms(void)
{
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        sms = 1;
    cudaGetLastError();
    return sms < 1 ? 1 : sms;
}

/* Load every kernel a gather call can launch (see bm_preload_rows). */
cudaError_t bm_tp_preload(void)
{
    cudaError_t e = bm_preload_rows();
    auto pre = [&](auto kernel) { bm_preload(e, kernel); };
    bm_tp_preload_family<bm_tp_family>(e);
    pre(bm_tp_reject_kernel);
    pre(bm_tp_allgather_kernel);
    pre(bm_tp_record_kernel);
    pre(bm_tp_check_kernel);
    const cudaError_t ar = bm_ar_preload();
    return e != cudaSuccess ? e : ar;
}

void bm_tp_fill(const bm_tp_ws *w, bm_tp_params *p)
{
    p->nranks = w->nranks;
    p->rank = w->rank;
    for (int s = 0; s < BM_TP_MAX_RANKS; ++s)
        p->peer[s] = s < w->nranks ? w->peer[s] : nullptr;
    p->flags_off = w->flags_off;
    p->errf_off = w->errf_off;
    p->arr_off = w->arr_off;
    p->sig_off = w->sig_off;
    p->fail_off = w->fail_off;
    p->ll_off = w->ll_off;
    p->ll_rows = w->ll_rows;
    p->data_off = w->data_off;
    p->slot_bytes = w->slot_bytes;
    p->epoch = w->epoch;
    p->err = w->err_d;
    p->timeout_ns = (unsigned long long)w->timeout_ms * 1000000ull;
    p->hidden = w->hidden;
    p->early = !w->shared;
}

cudaError_t bm_tp_launch_fused(const bm_tp_ws *w, const bm_args *a, int twoshot, uint32_t sig,
                               cudaStream_t stream)
{
    bm_tp_params_q pq = {};
    static_cast<bm_row_params &>(pq) = bm_params_of(a, BM_PART_FIN | BM_PART_RES);
    bm_tp_fill(w, &pq);
    pq.sig = sig;
    pq.normalized = a->normalized;
    pq.L = (a->tokens + w->nranks - 1) / w->nranks;
    /* LL for decode sizes of ONESHOT (rows fit the LL buffers) */
    pq.ll = !twoshot && pq.L <= BM_TP_LL_MAX_L && pq.rows <= w->ll_rows;
    pq.q = a->q;
    const int shape = bm_tp_shape_index(pq.L, w->hidden, pq.q.kind, w->sms);
    const int cap = w->gcap[pq.q.kind ? BM_TP_QCAP(shape) : shape];
    const int64_t want = pq.L < 1 ? 1 : pq.L;
    return bm_tp_launch_family<bm_tp_family>(shape, pq, twoshot, (unsigned)(want < cap ? want : cap), stream);
}

cudaError_t bm_tp_launch_reject(const bm_tp_ws *w, cudaStream_t stream)
{
    bm_tp_params p = {};
    bm_tp_fill(w, &p);
    bm_tp_reject_kernel<<<1, 256, 0, stream>>>(p);
    return cudaGetLastError();
}

cudaError_t bm_tp_launch_allgather(const bm_tp_ws *w, int64_t T, uint32_t sig, cudaStream_t stream)
{
    bm_tp_params p = {};
    bm_tp_fill(w, &p);
    p.sig = sig;
    p.rows = T;
    p.L = (T + w->nranks - 1) / w->nranks;
    p.ag = w->ag;
    for (int s = 0; s < BM_TP_MAX_RANKS; ++s)
        p.peer_ag[s] = s < w->nranks ? w->peer_ag[s] : nullptr;
    const int64_t want = p.L < 1 ? 1 : p.L;
    const unsigned grid = (unsigned)(want < w->gcap[BM_TP_NSHAPES] ? want : w->gcap[BM_TP_NSHAPES]);
    bm_tp_allgather_kernel<<<grid, 256, 0, stream>>>(p);
    return cudaGetLastError();
}

cudaError_t bm_tp_launch_record(const bm_tp_ws *w, uint32_t status, uint32_t sig, cudaStream_t stream)
{
    bm_tp_record_kernel<<<1, 32, 0, stream>>>(w->rec, w->rank, status, sig, w->err_d, w->epoch);
    return cudaGetLastError();
}

cudaError_t bm_tp_launch_check(const bm_tp_ws *w, uint32_t sig, int count_only, cudaStream_t stream)
{
    bm_tp_check_kernel<<<1, BM_TP_MAX_RANKS, 0, stream>>>(w->rec, w->nranks, sig, w->err_d, w->epoch, count_only);
    return cudaGetLastError();
}

/* FNV-1a over what every rank must pass alike (lib/agree.h); 0 is kept
 * for "none". */
uint32_t bm_tp_signature(const bm_args *a, int strategy_word)
{
    uint64_t words[BM_AGREE_N];
    bm_agree_words(a, strategy_word, words);
    uint32_t h = 2166136261u;
    const unsigned char *c = (const unsigned char *)words;
    for (size_t i = 0; i < sizeof words; ++i)
        h = (h ^ c[i]) * 16777619u;
    return h ? h : 1u;
}
