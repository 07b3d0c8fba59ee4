/*
 * group.c - the CPU backend's tensor-parallel gather over an in-process
 * group of ranks (one thread per rank).
 *
 * The ranks meet at barriers with a timeout (a rank that never arrives turns
 * into BEAM_ERR_COMM, never a hang). Every call starts with an agreement:
 * each rank posts its checked status and the collective arguments, and if any
 * rank failed or the ranks disagree, every rank returns an error before
 * anything is written. The posted slots alternate between two banks, so a
 * fast rank starting the next call never overwrites what a slow rank still
 * reads.
 *
 * Strategies (same bits by construction, docs/strategies.md):
 *   ONESHOT: finalize owned rows into the shared stage, then every rank runs
 *            norm_residual_norm over all T rows itself.
 *   TWOSHOT: each rank runs the fused pass over its owned rows into shared
 *            hidden/normalized stages; every rank copies all rows out.
 *   UNFUSED: finalize into a rank-local buffer, all-gather it (copy in,
 *            barrier, copy out), then norm_residual_norm over all rows.
 * The all-reduce (docs/numerics.md#all-reduce): each rank puts its partial
 * of all T rows in its shared stage (the dense form's rows, or the finalize
 * of its slots), then
 *   ONESHOT, UNFUSED: every rank sums all T rows over the stages in rank
 *            order into rows of its own and runs norm_residual_norm on them;
 *   TWOSHOT: each rank sums its L rows, runs norm_residual_norm on them into
 *            the shared hidden/normalized stages; every rank copies all out.
 * With a quantized output (a->q), every strategy writes all T normalized
 * rows on every rank (the caller's array, or one of the call's own), and
 * the rank then quantizes them (cpu/quant.c): the same bits as quantizing
 * the plain gather's normalized.
 *
 * Threads. A barrier counts arrivals, not ranks: it is only right while each
 * rank has at most one thread in it. Two threads of one rank would complete
 * a barrier between themselves, read a peer's slot or rows before the peer
 * posted them, and return BEAM_OK with wrong bits. So:
 *   - a workspace admits one call at a time (bm_cpu_ws.busy, taken with an
 *     atomic compare-and-swap): a call that finds another in progress is
 *     refused before it posts, allocates or waits, and writes nothing; the
 *     same flag makes a destroy during a call a refusal, not a free under
 *     the call's feet;
 *   - one rank holds at most one live workspace of the group (joined[]),
 *     and at most one thread of a rank is inside workspace creation
 *     (making[]): a second one is refused without joining;
 *   - creation and the gathers meet at separate rendezvous (make_rdv,
 *     call_rdv), so a creation on one rank can never complete a barrier of
 *     a gather in progress on another (and the other way round).
 * With that, the k-th call that joins on each rank meets the k-th call that
 * joins on every other rank: every call of an agreed pair passes the same
 * number of barriers (the agreement's verdict is computed from the same
 * slots on every rank), so the generations stay aligned, one arrival per
 * rank each. A call refused on one rank does not shift its peers: their
 * call meets whichever call of that rank joins next. If the two carry
 * different collective arguments the agreement fails every rank with
 * nothing written; if they carry the same ones the result is computed from
 * the rows of the calls that met, like ranks that pass different residual
 * contents (docs/contract.md: calls of one rank must come in the same order
 * as on its peers). No interleaving of the library's own state yields
 * BEAM_OK with bits other than those of the calls that met.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "agree.h"
#include "bf16.h"
#include "error.h"
#include "group.h"
#include "meet.h"
#include "ops.h"

/* What a rank posts at a rendezvous; compared word by word. A gather's
 * words are its agreement (lib/agree.h); a creation's max_tokens, hidden
 * and timeout_ms. */
typedef struct bm_slot {
    beam_status status;
    uint64_t w[BM_AGREE_N];
} bm_slot;

/* Buffers of one set of workspaces (one per rank), allocated by rank 0. */
typedef struct bm_shared {
    int32_t nranks, refs;
    uint16_t *fin; /* [max_tokens, hidden] finalized rows of every rank    */
    uint16_t *hid; /* [max_tokens, hidden] TWOSHOT: hidden rows            */
    uint16_t *nrm; /* [max_tokens, hidden] TWOSHOT: normalized rows        */
    uint16_t **local;    /* [nranks][ceil(max_tokens/R), hidden] UNFUSED send */
    uint16_t **gathered; /* [nranks][max_tokens, hidden] UNFUSED receive;
                          * the all-reduce's partials */
} bm_shared;

struct beam_cpu_group {
    int32_t nranks;
    bm_host host;     /* the lock of everything below; meetings (lib/meet.h) */
    bm_meet call_rdv; /* the gathers' barriers (BM_MEET_BREAK) */
    bm_meet make_rdv; /* workspace creation's barriers */
    int32_t live_ws;
    int32_t making_n; /* creations in progress (the group cannot go then) */
    char *joined;     /* [nranks]: the rank holds a workspace */
    char *making;     /* [nranks]: a thread of the rank is creating one */
    bm_slot *slots;   /* [3][nranks]: two banks for calls, one for creation */
    bm_shared *shared;
    beam_status create_status;
};

typedef struct bm_cpu_ws {
    beam_cpu_group *g;
    bm_shared *sh;
    /* Calls that joined, each on every rank alike: its parity picks the
     * slot bank. 64-bit for the same reason as bm_meet.gen (and 2^64 is even,
     * so even a wrap would keep the ranks' parities equal). Only the thread
     * holding busy touches it. */
    uint64_t calls;
    /* 1 while a call (or a destroy) holds the workspace; taken with an
     * acquire compare-and-swap, given back with a release store, so the
     * next holder, on any thread, sees calls as the last one left it. */
    int busy;
} bm_cpu_ws;

/* ---- group ------------------------------------------------------------- */

beam_status bm_cpu_group_create(int32_t nranks, beam_cpu_group **group)
{
    beam_cpu_group *g = (beam_cpu_group *)calloc(1, sizeof *g);
    if (g) {
        g->joined = (char *)calloc((size_t)nranks, 1);
        g->making = (char *)calloc((size_t)nranks, 1);
        g->slots = (bm_slot *)calloc(3 * (size_t)nranks, sizeof *g->slots);
    }
    if (!g || !g->joined || !g->making || !g->slots) {
        if (g) {
            free(g->joined);
            free(g->making);
            free(g->slots);
        }
        free(g);
        return bm_fail(BEAM_ERR_OUT_OF_MEMORY, "beam_cpu_group_create: out of host memory");
    }
    g->nranks = nranks;
    bm_host_init(&g->host, nranks);
    *group = g;
    return BEAM_OK;
}

beam_status bm_cpu_group_destroy(beam_cpu_group *g)
{
    int32_t live, making;
    pthread_mutex_lock(&g->host.mu);
    live = g->live_ws;
    making = g->making_n;
    pthread_mutex_unlock(&g->host.mu);
    if (live)
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "beam_cpu_group_destroy: group still has %d live "
                       "workspaces: destroy them first", (int)live);
    /* A creation waiting at the rendezvous would wake on freed memory. */
    if (making)
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "beam_cpu_group_destroy: a beam_workspace_create_cpu call "
                       "on this group is in progress on another thread: destroy the group after it returns");
    bm_host_fini(&g->host);
    free(g->joined);
    free(g->making);
    free(g->slots);
    free(g);
    return BEAM_OK;
}

/* ---- workspace --------------------------------------------------------- */

static void bm_shared_free(bm_shared *sh)
{
    int32_t r;
    if (!sh) return;
    free(sh->fin);
    free(sh->hid);
    free(sh->nrm);
    for (r = 0; sh->local && r < sh->nranks; r++) free(sh->local[r]);
    for (r = 0; sh->gathered && r < sh->nranks; r++) free(sh->gathered[r]);
    free(sh->local);
    free(sh->gathered);
    free(sh);
}

static bm_shared *bm_shared_alloc(int32_t nranks, int64_t max_tokens, int32_t hidden)
{
    size_t all = (size_t)(max_tokens ? max_tokens : 1) * (size_t)hidden * sizeof(uint16_t);
    size_t part = (size_t)((max_tokens + nranks - 1) / nranks + 1) * (size_t)hidden * sizeof(uint16_t);
    int32_t r, ok;
    bm_shared *sh = (bm_shared *)calloc(1, sizeof *sh);
    if (!sh) return NULL;
    sh->nranks = nranks;
    sh->fin = (uint16_t *)malloc(all);
    sh->hid = (uint16_t *)malloc(all);
    sh->nrm = (uint16_t *)malloc(all);
    sh->local = (uint16_t **)calloc((size_t)nranks, sizeof *sh->local);
    sh->gathered = (uint16_t **)calloc((size_t)nranks, sizeof *sh->gathered);
    ok = sh->fin && sh->hid && sh->nrm && sh->local && sh->gathered;
    for (r = 0; ok && r < nranks; r++) {
        sh->local[r] = (uint16_t *)malloc(part);
        sh->gathered[r] = (uint16_t *)malloc(all);
        ok = sh->local[r] && sh->gathered[r];
    }
    if (!ok) {
        bm_shared_free(sh);
        return NULL;
    }
    sh->refs = nranks;
    return sh;
}

/* This thread no longer stands for its rank in a creation. */
static void bm_make_leave(beam_cpu_group *g, int32_t rank)
{
    pthread_mutex_lock(&g->host.mu);
    g->making[rank] = 0;
    g->making_n--;
    pthread_mutex_unlock(&g->host.mu);
}

beam_status bm_cpu_ws_create(beam_cpu_group *g, int32_t rank, bm_ws *ws, beam_status local)
{
    static const char fn[] = "beam_workspace_create_cpu";
    bm_slot *mine, *all, s_bad, s_0;
    bm_cpu_ws *impl = NULL;
    bm_shared *made = NULL; /* rank 0: the buffers it allocated in this round */
    beam_status st;
    int32_t r, bad = -1, tmo;

    /* Out of range, the rank cannot stand in the rendezvous for any rank:
     * its peers wait for the rank they lack and time out. */
    if (rank < 0 || rank >= g->nranks)
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: rank=%d must be in [0, %d) of the group", fn,
                       (int)rank, (int)g->nranks);
    all = g->slots + 2 * (size_t)g->nranks;
    mine = all + rank;
    pthread_mutex_lock(&g->host.mu);
    st = bm_meet_claim_locked(&g->host, &g->make_rdv, g->joined, g->making, &g->making_n, rank, fn);
    if (st != BEAM_OK) {
        pthread_mutex_unlock(&g->host.mu);
        return st;
    }
    memset(mine, 0, sizeof *mine);
    mine->status = local;
    mine->w[0] = (uint64_t)ws->max_tokens;
    mine->w[1] = (uint64_t)(uint32_t)ws->hidden;
    mine->w[2] = (uint64_t)(uint32_t)ws->cfg.timeout_ms;
    pthread_mutex_unlock(&g->host.mu);
    if (local == BEAM_OK) {
        impl = (bm_cpu_ws *)calloc(1, sizeof *impl);
        if (!impl) local = mine->status = bm_fail(BEAM_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    }
    tmo = bm_meet_timeout(local, ws->cfg.timeout_ms);

    st = bm_meet_wait(&g->host, &g->make_rdv, rank, tmo, fn, BM_MEET_WITHDRAW);
    if (st != BEAM_OK) goto fail;
    for (r = 0; r < g->nranks && bad < 0; r++)
        if (all[r].status != BEAM_OK || memcmp(all[r].w, all[0].w, 3 * sizeof all[0].w[0]) != 0)
            bad = r;
    /* The slots are read only before the second barrier: after it, a fast
     * rank may already post its slot for the next creation. */
    if (bad >= 0) {
        s_bad = all[bad];
        s_0 = all[0];
    }
    /* No rank holds a workspace here (it would have failed the round), so
     * the buffers of any earlier set are gone and g->shared is free. */
    if (bad < 0 && rank == 0) {
        made = bm_shared_alloc(g->nranks, ws->max_tokens, ws->hidden);
        g->shared = made;
        g->create_status = made ? BEAM_OK : BEAM_ERR_OUT_OF_MEMORY;
    }
    /* Second barrier: nobody re-posts a creation slot before all have read,
     * and rank 0's allocation is visible to all. */
    st = bm_meet_wait(&g->host, &g->make_rdv, rank, tmo, fn, BM_MEET_BREAK);
    if (st != BEAM_OK) {
        /* A generation completes for every rank or for none, and after a
         * failure it never completes: no rank took these buffers. */
        if (made) {
            pthread_mutex_lock(&g->host.mu);
            if (g->shared == made) g->shared = NULL;
            pthread_mutex_unlock(&g->host.mu);
            bm_shared_free(made);
        }
        goto fail;
    }
    if (bad >= 0) {
        st = local != BEAM_OK ? local
             : s_bad.status != BEAM_OK
                 ? bm_fail(s_bad.status, "%s: rank %d failed its own checks; no workspace was created",
                           fn, (int)bad)
                 : bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: rank %d passed max_tokens=%lld, hidden=%d, "
                           "timeout_ms=%d but rank 0 passed %lld, %d, %d: every rank must pass the same", fn,
                           (int)bad, (long long)s_bad.w[0], (int)s_bad.w[1], (int)s_bad.w[2],
                           (long long)s_0.w[0], (int)s_0.w[1], (int)s_0.w[2]);
        goto fail;
    }
    if (g->create_status != BEAM_OK) {
        st = bm_fail(BEAM_ERR_OUT_OF_MEMORY, "%s: out of host memory for the shared buffers of "
                     "max_tokens=%lld x hidden=%d", fn, (long long)ws->max_tokens, (int)ws->hidden);
        goto fail;
    }
    pthread_mutex_lock(&g->host.mu);
    g->joined[rank] = 1;
    g->live_ws++;
    g->making[rank] = 0;
    g->making_n--;
    impl->sh = g->shared;
    pthread_mutex_unlock(&g->host.mu);
    impl->g = g;
    ws->rank = rank;
    ws->nranks = g->nranks;
    ws->impl = impl;
    return BEAM_OK;
fail:
    bm_make_leave(g, rank);
    free(impl);
    return st;
}

beam_status bm_cpu_ws_destroy(bm_ws *ws)
{
    bm_cpu_ws *impl = (bm_cpu_ws *)ws->impl;
    beam_cpu_group *g = impl->g;
    bm_shared *drop = NULL;
    int idle = 0;
    /* Taken for good: the workspace goes. A call in progress on another
     * thread still uses it (and the shared buffers), so that is a refusal
     * that changes nothing; lib/ keeps the handle on an argument error. */
    if (!__atomic_compare_exchange_n(&impl->busy, &idle, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "beam_workspace_destroy: a call on this workspace is in "
                       "progress on another thread (calls on one workspace must not overlap): nothing was "
                       "destroyed; destroy it after that call returns");
    pthread_mutex_lock(&g->host.mu);
    g->joined[ws->rank] = 0;
    g->live_ws--;
    if (--impl->sh->refs == 0) {
        drop = impl->sh;
        if (g->shared == drop) g->shared = NULL;
    }
    pthread_mutex_unlock(&g->host.mu);
    bm_shared_free(drop);
    free(impl);
    return BEAM_OK;
}

/* ---- gather ------------------------------------------------------------ */

static void bm_post(bm_slot *s, const bm_args *a, int strategy, beam_status local)
{
    s->status = local;
    bm_agree_words(a, strategy, s->w);
}

/* The first collective argument on which slot s differs from slot 0, or
 * -1 when they agree. */
static int bm_disagree(const bm_slot *s, const bm_slot *s0)
{
    int i;
    for (i = 0; i < BM_AGREE_N; i++)
        if (s->w[i] != s0->w[i]) return i;
    return -1;
}

/* The first of this rank's rows of a call of T tokens (L = ceil(T / R)
 * from rank * L), and in *owned how many it has (0 past T). */
static int64_t bm_owned(const bm_ws *ws, int64_t T, int64_t *owned)
{
    const int64_t L = (T + ws->nranks - 1) / ws->nranks, start = (int64_t)ws->rank * L, n = T - start;
    *owned = n < 0 ? 0 : (n > L ? L : n);
    return start;
}

/* TWOSHOT: b's rows, from row start of the call a, written into the
 * shared hidden and normalized stages instead of the call's outputs. */
static void bm_twoshot_window(bm_args *b, const bm_args *a, const bm_shared *sh, int64_t start)
{
    const size_t o = (size_t)start * (size_t)a->hidden;
    b->residual = a->residual + o;
    b->hidden_out = sh->hid + o;
    b->normalized = a->next.on ? sh->nrm + o : NULL;
}

/* TWOSHOT: once every rank has written its rows, all of them out. */
static beam_status bm_twoshot_out(bm_ws *ws, const bm_args *a, const char *fn)
{
    bm_cpu_ws *impl = (bm_cpu_ws *)ws->impl;
    const size_t n = (size_t)a->tokens * (size_t)a->hidden * sizeof(uint16_t);
    BM_CHECK(bm_meet_wait(&impl->g->host, &impl->g->call_rdv, ws->rank, ws->cfg.timeout_ms, fn, BM_MEET_BREAK));
    memcpy(a->hidden_out, impl->sh->hid, n);
    if (a->next.on) memcpy(a->normalized, impl->sh->nrm, n);
    return BEAM_OK;
}

static beam_status bm_gather_run(bm_ws *ws, const bm_args *a, beam_strategy strategy, const char *fn,
                                 const bm_scratch *scr)
{
    int64_t owned;
    bm_cpu_ws *impl = (bm_cpu_ws *)ws->impl;
    bm_shared *sh = impl->sh;
    const int32_t r = ws->rank, tmo = ws->cfg.timeout_ms;
    const int64_t T = a->tokens, start = bm_owned(ws, T, &owned);
    const size_t H = (size_t)a->hidden, row = H * sizeof(uint16_t);
    bm_args b = *a;

    b.tokens = owned;
    switch (strategy) {
    case BEAM_STRATEGY_ONESHOT:
        b.output = sh->fin + (size_t)start * H;
        if (owned) bm_cpu_run(&b, BM_OP_FINALIZE, scr);
        BM_CHECK(bm_meet_wait(&impl->g->host, &impl->g->call_rdv, r, tmo, fn, BM_MEET_BREAK));
        b = *a;
        b.x = sh->fin;
        b.pre.on = 0;
        bm_cpu_run(&b, BM_OP_NRN, scr);
        break;
    case BEAM_STRATEGY_TWOSHOT:
        bm_twoshot_window(&b, a, sh, start);
        if (owned) bm_cpu_run(&b, BM_OP_FUSED, scr);
        BM_CHECK(bm_twoshot_out(ws, a, fn));
        break;
    default: /* UNFUSED */
        b.output = sh->local[r];
        if (owned) {
            bm_cpu_run(&b, BM_OP_FINALIZE, scr);
            memcpy(sh->fin + (size_t)start * H, sh->local[r], (size_t)owned * row);
        }
        BM_CHECK(bm_meet_wait(&impl->g->host, &impl->g->call_rdv, r, tmo, fn, BM_MEET_BREAK));
        memcpy(sh->gathered[r], sh->fin, (size_t)T * row);
        b = *a;
        b.x = sh->gathered[r];
        b.pre.on = 0;
        BM_CHECK(bm_meet_wait(&impl->g->host, &impl->g->call_rdv, r, tmo, fn, BM_MEET_BREAK)); /* the stage is free again */
        bm_cpu_run(&b, BM_OP_NRN, scr);
        return BEAM_OK;
    }
    /* Nobody may refill the stages for the next call before all have read. */
    return bm_meet_wait(&impl->g->host, &impl->g->call_rdv, r, tmo, fn, BM_MEET_BREAK);
}

/* out[t] = the sum over the ranks' stages of rows [t0, t1), in rank order
 * from rank 0's value (docs/numerics.md#all-reduce); each element on its
 * own, so the thread count cannot change a bit. */
static void bm_sum_ranks(uint16_t *const *part, int32_t R, int64_t t0, int64_t t1, int32_t hidden,
                         uint16_t *out)
{
    const int64_t n = (t1 - t0) * (int64_t)hidden, base = t0 * (int64_t)hidden;
    int64_t i;
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (i = 0; i < n; i++) {
        float acc = bm_f(part[0][base + i]);
        int32_t r;
        for (r = 1; r < R; r++) acc = acc + bm_f(part[r][base + i]);
        out[i] = bm_bf16(acc);
    }
}

/* The all-reduce's stages (cpu/group.c's head); sum: [T, hidden] rows of
 * this rank's own (ONESHOT, UNFUSED). */
static beam_status bm_allreduce_run(bm_ws *ws, const bm_args *a, beam_strategy strategy, const char *fn,
                                    const bm_scratch *scr, uint16_t *sum)
{
    int64_t owned;
    bm_cpu_ws *impl = (bm_cpu_ws *)ws->impl;
    bm_shared *sh = impl->sh;
    const int32_t R = ws->nranks, r = ws->rank, tmo = ws->cfg.timeout_ms;
    const int64_t T = a->tokens, start = bm_owned(ws, T, &owned);
    const size_t H = (size_t)a->hidden, row = H * sizeof(uint16_t);
    bm_args b = *a;

    if (a->experts) {
        b.output = sh->gathered[r];
        bm_cpu_run(&b, BM_OP_FINALIZE, scr); /* a->post is off: the partial */
    } else {
        memcpy(sh->gathered[r], a->x, (size_t)T * row);
    }
    BM_CHECK(bm_meet_wait(&impl->g->host, &impl->g->call_rdv, r, tmo, fn, BM_MEET_BREAK));
    b = *a;
    if (strategy == BEAM_STRATEGY_TWOSHOT) {
        bm_twoshot_window(&b, a, sh, start);
        b.x = sh->fin + (size_t)start * H;
        b.tokens = owned;
        if (owned) {
            bm_sum_ranks(sh->gathered, R, start, start + owned, a->hidden, (uint16_t *)b.x);
            bm_cpu_run(&b, BM_OP_NRN, scr);
        }
        BM_CHECK(bm_twoshot_out(ws, a, fn));
    } else {
        bm_sum_ranks(sh->gathered, R, 0, T, a->hidden, sum);
        b.x = sum;
        bm_cpu_run(&b, BM_OP_NRN, scr);
    }
    /* Nobody may refill the stages for the next call before all have read. */
    return bm_meet_wait(&impl->g->host, &impl->g->call_rdv, r, tmo, fn, BM_MEET_BREAK);
}

/* What a call allocates before the agreement, so that a rank without
 * memory fails its peers' calls too and nobody writes anything: the rows'
 * scratch, and when only the quantized form of normalized is asked for, a
 * [T, hidden] normalized of its own to quantize from (b: the call with
 * it). */
static beam_status bm_gather_alloc(const bm_args *a, bm_args *b, bm_scratch *scr, uint16_t **tmp,
                                   const char *fn)
{
    if (a->tokens == 0) return BEAM_OK;
    BM_CHECK(bm_cpu_scratch_alloc(scr, bm_cpu_max_team(), a->hidden, fn));
    return bm_cpu_quant_target(a, b, tmp);
}

/* One call that holds the workspace (busy): a gather, or with coll
 * BM_COLL_ALLREDUCE an all-reduce. */
static beam_status bm_collective_held(bm_ws *ws, const bm_args *a, beam_strategy strategy, int coll,
                                      beam_status local, const char *fn)
{
    bm_cpu_ws *impl = (bm_cpu_ws *)ws->impl;
    beam_cpu_group *g = impl->g;
    const int32_t R = ws->nranks;
    bm_slot *bank = g->slots + (size_t)(impl->calls++ & 1u) * (size_t)R;
    bm_scratch scr = {NULL, NULL, 0, 0};
    bm_args b = *a;
    uint16_t *tmp = NULL, *sum = NULL;
    beam_status st;
    int32_t r;

    if (local == BEAM_OK) local = bm_gather_alloc(a, &b, &scr, &tmp, fn);
    if (local == BEAM_OK && coll == BM_COLL_ALLREDUCE && strategy != BEAM_STRATEGY_TWOSHOT && a->tokens > 0) {
        sum = (uint16_t *)malloc((size_t)a->tokens * (size_t)a->hidden * sizeof *sum);
        if (!sum)
            local = bm_fail(BEAM_ERR_OUT_OF_MEMORY, "%s: no host memory for the %lld x %d summed rows", fn,
                            (long long)a->tokens, (int)a->hidden);
    }
    bm_post(&bank[ws->rank], a, bm_agree_coll(strategy, coll), local);
    st = bm_meet_wait(&g->host, &g->call_rdv, ws->rank, ws->cfg.timeout_ms, fn, BM_MEET_BREAK);
    for (r = 0; r < R && st == BEAM_OK; r++) {
        if (bank[r].status != BEAM_OK) {
            st = local != BEAM_OK ? local /* this rank's own message is set */
                 : bm_fail(bank[r].status, "%s: rank %d failed its argument checks or had no memory, so "
                           "no rank wrote anything (see that rank's message)", fn, (int)r);
        }
    }
    for (r = 1; r < R && st == BEAM_OK; r++) {
        const int i = bm_disagree(&bank[r], &bank[0]);
        if (i >= 0) {
            char mine[96], first[96];
            bm_agree_text(i, bank[r].w[i], mine, sizeof mine);
            bm_agree_text(i, bank[0].w[i], first, sizeof first);
            st = bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: rank %d and rank 0 passed different %s (%s and %s): "
                         "every rank must pass the same", fn, (int)r, bm_agree_arg(i, a), mine, first);
        }
    }
    if (st == BEAM_OK && a->tokens > 0) {
        /* the stages' rows without the quantized output (a TWOSHOT rank's
         * rows are a window of the call's): it is made below */
        bm_args rows = b;
        rows.q.kind = 0;
        st = coll == BM_COLL_ALLREDUCE ? bm_allreduce_run(ws, &rows, strategy, fn, &scr, sum)
                                       : bm_gather_run(ws, &rows, strategy, fn, &scr);
    }
    /* normalized is this rank's own now (the stages may already hold the
     * next call's rows): quantize it after the last barrier */
    if (st == BEAM_OK && a->tokens > 0 && a->q.kind) bm_cpu_quant_rows(&b, b.normalized);
    bm_cpu_scratch_free(&scr);
    free(tmp);
    free(sum);
    return st;
}

static beam_status bm_cpu_collective(bm_ws *ws, const bm_args *a, beam_strategy strategy, int coll,
                                     beam_status local)
{
    const char *fn = a->fn;
    bm_cpu_ws *impl = (bm_cpu_ws *)ws->impl;
    beam_status st;
    int idle = 0;
    /* Refused before anything: this call neither allocates, posts nor
     * waits, so the call in progress and its peers go on as if it had never
     * been made, and its outputs are untouched. (Its own argument errors,
     * if any, are not reported: it did not take part.) */
    if (!__atomic_compare_exchange_n(&impl->busy, &idle, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: another call on this workspace is in progress on "
                       "another thread (calls on one workspace must not overlap)", fn);
    st = bm_collective_held(ws, a, strategy, coll, local, fn);
    __atomic_store_n(&impl->busy, 0, __ATOMIC_RELEASE);
    return st;
}

beam_status bm_cpu_gather(bm_ws *ws, const bm_args *a, beam_strategy strategy, beam_status local)
{
    return bm_cpu_collective(ws, a, strategy, BM_COLL_GATHER, local);
}

beam_status bm_cpu_allreduce(bm_ws *ws, const bm_args *a, beam_strategy strategy, beam_status local)
{
    return bm_cpu_collective(ws, a, strategy, BM_COLL_ALLREDUCE, local);
}
