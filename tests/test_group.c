/*
 * test_group.c - the CPU tensor-parallel gather against the naive reference.
 *
 * For R = 1, 2, 3, 4, 8 ranks: one pthread per rank, a beam_cpu_group, a
 * workspace per rank (beam_workspace_create_cpu, collective). Rank r owns
 * L = ceil(T/R) tokens, rows [r*L, min((r+1)*L, T)), and passes only those
 * rows as its expert buffers (capacity >= L, NaN past its live rows);
 * residual, hidden_out and normalized are full [T, H] arrays on every rank.
 * Every rank's outputs must equal nr_gather() bit for bit, under every
 * strategy (AUTO, ONESHOT, TWOSHOT, UNFUSED), for tokens 0, 1, < R, not
 * divisible by R, a rank owning no rows at all, in place or not.
 *
 * Back-to-back gathers with no sync but the library's own (a fast rank runs
 * ahead into the next call) must all stay exact.
 *
 * Invalid gathers (T > max_tokens, hidden mismatch, capacity < ceil(T/R) on
 * every rank or on one, strategy FUSED or unknown, ranks that disagree on a
 * collective argument, NULL workspace) must fail with
 * BEAM_ERR_INVALID_ARGUMENT on every rank, at once, and write nothing. A
 * rank that never arrives makes its peers return BEAM_ERR_COMM after the
 * workspace's timeout; a hang is caught by alarm().
 *
 * Threads: two caller threads on each of two ranks, calling the gather on
 * their rank's one workspace at once, thousands of times: every call ends
 * with BEAM_OK and the reference's bits, or refused, or failing the
 * agreement, with nothing written. A gather, destroy or creation that
 * overlaps another on the same workspace (rank) is refused with a message
 * that names the rule. A rank whose own creation arguments fail (sizes,
 * cfg, a NULL out-parameter, a workspace it already holds) fails its peers
 * at once; a rank out of range leaves them to time out.
 *
 * The quantized output (beam_moe_finalize_gather_norm_residual_norm_q):
 * every strategy, every form of beam_quant (group 128 row-major, group 64
 * UE8M0 column-major, token, token UE8M0, tensor), normalized kept, NULL,
 * or kept on some ranks only,
 * tokens 1, < R, not divisible by R and near max_tokens: every rank's
 * hidden_out and normalized equal the reference, and its values and
 * scales equal the tests' model of docs/numerics.md#fp8
 * (harness/quant_model.c) applied to the reference's normalized, every byte
 * past them (column-major padding included) untouched. A bad quant on one
 * rank, or ranks that pass different forms, fail every rank at once with
 * nothing written.
 *
 * Links the dispatcher (backend "cpu"). CUnit asserts run on the main
 * thread only; rank threads just record what they got.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <CUnit/Basic.h>

#include "quant_model.h"
#include "suite.h"

#define MAXR 8
#define GUARD 2

static uint64_t g_seed;

typedef enum job_kind {
    JOB_CREATE,
    JOB_GATHER,
    JOB_BURST,
    JOB_INFO,
    JOB_DESTROY,
    JOB_QUIT
} job_kind;

/* What every rank does next, and what it got. */
typedef struct job {
    job_kind kind;
    /* create */
    int64_t max_tokens;
    int32_t ws_hidden;
    const beam_workspace_config *cfg;
    /* gather */
    int64_t T;
    int32_t K, H;
    float rs;
    const beam_norm *post, *next;
    const float *scales;
    beam_strategy strategy;
    int null_ws;
    int absent_rank; /* this rank skips the gather (timeout test); -1: none */
    const uint16_t *ex[MAXR];
    const float *wt[MAXR];
    int64_t cap[MAXR];
    const uint16_t *res[MAXR];
    uint16_t *hid[MAXR], *nrm[MAXR];
    /* use_q: the _q entry, with quant[r] (may be NULL) */
    int use_q;
    const beam_quant *quant[MAXR];
    /* results */
    beam_status st[MAXR];
    char msg[MAXR][256];
    int32_t info_rank[MAXR], info_n[MAXR];
    /* burst: nburst gathers back to back, no sync between them but the
     * library's own */
    int nburst;
    beam_status burst_st[MAXR][64];
} job;

typedef struct group {
    int R;
    beam_cpu_group *g;
    beam_workspace *ws[MAXR];
    pthread_t th[MAXR];
    pthread_barrier_t start, done;
    job j;
} group;

typedef struct rank_arg {
    group *grp;
    int r;
} rank_arg;

/* Rank 0 may be told to disagree with its peers on a collective argument
 * (set by run_disagree, read by the rank threads between barriers). */
typedef struct odd_rank {
    int active;
    beam_strategy strategy;
    int64_t T;
    const float *scales;
} odd_rank;
static odd_rank g_odd;

struct group;
/* One gather of a burst (defined with the burst test below). */
static beam_status burst_call(struct group *G, int r, int i);

static void *rank_main(void *p)
{
    rank_arg *a = (rank_arg *)p;
    group *G = a->grp;
    int r = a->r;
    for (;;) {
        job *j = &G->j;
        beam_status st = BEAM_OK;
        pthread_barrier_wait(&G->start);
        if (j->kind == JOB_QUIT)
            break;
        switch (j->kind) {
        case JOB_CREATE:
            st = beam_workspace_create_cpu(G->g, r, j->max_tokens, j->ws_hidden, j->cfg,
                                           &G->ws[r]);
            break;
        case JOB_GATHER: {
            /* rank 0 may be told to disagree with the others (odd_rank) */
            int odd = r == 0 && g_odd.active;
            if (r == j->absent_rank)
                break;
            if (j->use_q)
                st = beam_moe_finalize_gather_norm_residual_norm_q(
                    j->null_ws ? NULL : G->ws[r], j->ex[r], j->wt[r], j->cap[r],
                    odd ? g_odd.T : j->T, j->K, j->H, j->rs, j->post, j->res[r],
                    odd ? g_odd.scales : j->scales, j->next, j->hid[r], j->nrm[r], j->quant[r],
                    odd ? g_odd.strategy : j->strategy, NULL);
            else
                st = beam_moe_finalize_gather_norm_residual_norm(
                    j->null_ws ? NULL : G->ws[r], j->ex[r], j->wt[r], j->cap[r],
                    odd ? g_odd.T : j->T, j->K, j->H, j->rs, j->post, j->res[r],
                    odd ? g_odd.scales : j->scales, j->next, j->hid[r], j->nrm[r],
                    odd ? g_odd.strategy : j->strategy, NULL);
            break;
        }
        case JOB_BURST: {
            int i;
            for (i = 0; i < j->nburst; i++) {
                j->burst_st[r][i] = burst_call(G, r, i);
                if (j->burst_st[r][i] != BEAM_OK)
                    st = j->burst_st[r][i];
            }
            break;
        }
        case JOB_INFO:
            st = beam_workspace_info(G->ws[r], &j->info_rank[r], &j->info_n[r]);
            break;
        case JOB_DESTROY:
            st = beam_workspace_destroy(G->ws[r]);
            G->ws[r] = NULL;
            break;
        case JOB_QUIT:
            break;
        }
        j->st[r] = st;
        snprintf(j->msg[r], sizeof j->msg[r], "%s", st == BEAM_OK ? "" : beam_last_error());
        pthread_barrier_wait(&G->done);
    }
    return NULL;
}

static rank_arg g_args[MAXR];

/* Run the current job on every rank and wait for all of them. */
static void run_job(group *G)
{
    pthread_barrier_wait(&G->start);
    pthread_barrier_wait(&G->done);
}

static int group_start(group *G, int R)
{
    int r;
    memset(G, 0, sizeof *G);
    G->R = R;
    if (beam_cpu_group_create(R, &G->g) != BEAM_OK) {
        fprintf(stderr, "beam_cpu_group_create(%d): %s\n", R, beam_last_error());
        return 0;
    }
    pthread_barrier_init(&G->start, NULL, (unsigned)R + 1);
    pthread_barrier_init(&G->done, NULL, (unsigned)R + 1);
    for (r = 0; r < R; r++) {
        g_args[r].grp = G;
        g_args[r].r = r;
        pthread_create(&G->th[r], NULL, rank_main, &g_args[r]);
    }
    return 1;
}

static void group_stop(group *G)
{
    int r;
    G->j.kind = JOB_QUIT;
    pthread_barrier_wait(&G->start);
    for (r = 0; r < G->R; r++)
        pthread_join(G->th[r], NULL);
    pthread_barrier_destroy(&G->start);
    pthread_barrier_destroy(&G->done);
    CU_ASSERT_EQUAL(beam_cpu_group_destroy(G->g), BEAM_OK);
}

static int ws_create(group *G, int64_t max_tokens, int32_t H, const beam_workspace_config *cfg)
{
    int r, ok = 1;
    G->j.kind = JOB_CREATE;
    G->j.max_tokens = max_tokens;
    G->j.ws_hidden = H;
    G->j.cfg = cfg;
    run_job(G);
    for (r = 0; r < G->R; r++)
        if (G->j.st[r] != BEAM_OK) {
            fprintf(stderr, "workspace_create_cpu R=%d rank %d: %s\n", G->R, r, G->j.msg[r]);
            ok = 0;
        }
    CU_ASSERT(ok);
    if (!ok)
        return 0;
    G->j.kind = JOB_INFO;
    run_job(G);
    for (r = 0; r < G->R; r++) {
        CU_ASSERT_EQUAL(G->j.st[r], BEAM_OK);
        CU_ASSERT_EQUAL(G->j.info_rank[r], r);
        CU_ASSERT_EQUAL(G->j.info_n[r], G->R);
    }
    return 1;
}

/* A group of R ranks with a workspace each (16 tokens, H = 512, a 5 s
 * timeout: the invalid-argument tests); 0 when either could not be made
 * (the failure is recorded, nothing is left running). */
static int group_small(group *G, int R)
{
    beam_workspace_config cfg = beam_workspace_config_default();
    cfg.timeout_ms = 5000;
    if (!group_start(G, R)) {
        CU_FAIL("group create");
        return 0;
    }
    if (!ws_create(G, 16, 512, &cfg)) {
        group_stop(G);
        return 0;
    }
    return 1;
}

static void ws_destroy(group *G)
{
    int r;
    G->j.kind = JOB_DESTROY;
    run_job(G);
    for (r = 0; r < G->R; r++)
        CU_ASSERT_EQUAL(G->j.st[r], BEAM_OK);
}

/* ---- one gather case ---------------------------------------------------- */

typedef struct gcase {
    int64_t T;
    int32_t K, H;
    int post, next; /* 0 off, 1 plain, 2 weight */
    int scales, rs_one, inplace;
    int64_t pad;    /* NaN rows past L in every rank's expert buffer */
    int nonzero;    /* no +-0 in the expert rows and the residual */
    int rs_set;     /* routed_scale = rs instead of a random one */
    float rs;
} gcase;

/* The case of the invalid-argument tests on group_small's workspaces:
 * T tokens, top_k 4, H = 512, post norm, next norm with weight, scales. */
static void gcase_small(gcase *c, int64_t T)
{
    memset(c, 0, sizeof *c);
    c->T = T;
    c->K = 4;
    c->H = 512;
    c->post = 1;
    c->next = 2;
    c->scales = 1;
}

typedef struct gdata {
    gcase c;
    int R;
    int64_t L;
    uint16_t *ex[MAXR];
    float *wt[MAXR];
    uint16_t *residual;    /* [T, H], shared input contents */
    uint16_t *wpost, *wnext;
    beam_norm post, next;
    nr_norm npost, nnext;
    float scales[2], rs;
    uint16_t *want_h, *want_n; /* the reference */
    /* per rank outputs (T + GUARD rows) and residual copies */
    uint16_t *res[MAXR], *hid[MAXR], *nrm[MAXR];
} gdata;

static uint16_t *rand_norm_w(hu_rng *r, int choice, int32_t H)
{
    uint16_t *w;
    int32_t h;
    if (choice != 2)
        return NULL;
    w = (uint16_t *)hu_alloc(2 * (size_t)H, 0);
    for (h = 0; h < H; h++)
        w[h] = hu_rand_norm_weight(r);
    return w;
}

/* +-0 becomes +-1, so that the inputs are non-zero: a row that a gather
 * took from the wrong call, or never brought, cannot match the reference
 * by both being zero. */
static void no_zeros(uint16_t *p, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++)
        if ((p[i] & 0x7FFFu) == 0)
            p[i] = (uint16_t)(p[i] | 0x3F80u);
}

static void gdata_make(gdata *d, const gcase *c, int R, uint64_t seed)
{
    hu_rng rng;
    size_t KH = (size_t)c->K * (size_t)c->H, TH = (size_t)c->T * (size_t)c->H;
    int r;
    memset(d, 0, sizeof *d);
    d->c = *c;
    d->R = R;
    d->L = (c->T + R - 1) / R;
    hu_rng_init(&rng, seed);
    for (r = 0; r < R; r++) {
        int64_t lo = r * d->L, hi = (r + 1) * d->L, own, cap = d->L + c->pad;
        if (hi > c->T)
            hi = c->T;
        own = hi > lo ? hi - lo : 0;
        d->ex[r] = (uint16_t *)hu_alloc(2 * KH * (size_t)(cap ? cap : 1), 0);
        d->wt[r] = (float *)hu_alloc(4 * (size_t)c->K * (size_t)(cap ? cap : 1), 0);
        hu_fill_bf16(&rng, d->ex[r], KH * (size_t)own);
        if (c->nonzero)
            no_zeros(d->ex[r], KH * (size_t)own);
        hu_fill_weight(&rng, d->wt[r], (size_t)c->K * (size_t)own);
        hu_fill_bf16_nan(d->ex[r] + KH * (size_t)own, KH * (size_t)(cap - own));
        hu_fill_f32_nan(d->wt[r] + (size_t)c->K * (size_t)own, (size_t)c->K * (size_t)(cap - own));
    }
    d->residual = (uint16_t *)hu_alloc(2 * TH, 0);
    hu_fill_bf16(&rng, d->residual, TH);
    if (c->nonzero)
        no_zeros(d->residual, TH);
    d->wpost = rand_norm_w(&rng, c->post, c->H);
    d->wnext = rand_norm_w(&rng, c->next, c->H);
    d->post.weight = d->wpost;
    d->post.eps = 1e-6f;
    d->next.weight = d->wnext;
    d->next.eps = 1e-5f;
    d->npost.on = c->post != 0;
    d->npost.weight = d->wpost;
    d->npost.eps = 1e-6f;
    d->nnext.on = c->next != 0;
    d->nnext.weight = d->wnext;
    d->nnext.eps = 1e-5f;
    d->scales[0] = hu_rand_scale(&rng);
    d->scales[1] = hu_rand_scale(&rng);
    d->rs = c->rs_one ? 1.0f : hu_rand_scale(&rng);
    if (c->rs_set)
        d->rs = c->rs;

    d->want_h = (uint16_t *)hu_alloc(2 * TH, 0);
    d->want_n = (uint16_t *)hu_alloc(2 * TH, 0);
    nr_gather((const uint16_t *const *)d->ex, (const float *const *)d->wt, R, c->T, c->K, c->H,
              d->rs, &d->npost, d->residual, c->scales ? d->scales : NULL, &d->nnext, d->want_h,
              d->want_n);

    for (r = 0; r < R; r++) {
        size_t ob = 2 * (TH + GUARD * (size_t)c->H);
        d->hid[r] = (uint16_t *)hu_alloc(ob, 0);
        hu_poison(d->hid[r], ob);
        if (c->next) {
            d->nrm[r] = (uint16_t *)hu_alloc(ob, 0);
            hu_poison(d->nrm[r], ob);
        }
        if (c->inplace) {
            memcpy(d->hid[r], d->residual, 2 * TH);
            d->res[r] = d->hid[r];
        } else {
            d->res[r] = (uint16_t *)hu_alloc(2 * TH, 0);
            memcpy(d->res[r], d->residual, 2 * TH);
        }
    }
}

static void gdata_free(gdata *d)
{
    int r;
    for (r = 0; r < d->R; r++) {
        hu_free(d->ex[r]);
        hu_free(d->wt[r]);
        if (d->res[r] != d->hid[r])
            hu_free(d->res[r]);
        hu_free(d->hid[r]);
        hu_free(d->nrm[r]);
    }
    hu_free(d->residual);
    hu_free(d->wpost);
    hu_free(d->wnext);
    hu_free(d->want_h);
    hu_free(d->want_n);
}

static void job_from(group *G, gdata *d, beam_strategy s)
{
    job *j = &G->j;
    int r;
    j->kind = JOB_GATHER;
    j->T = d->c.T;
    j->K = d->c.K;
    j->H = d->c.H;
    j->rs = d->rs;
    j->post = d->c.post ? &d->post : NULL;
    j->next = d->c.next ? &d->next : NULL;
    j->scales = d->c.scales ? d->scales : NULL;
    j->strategy = s;
    j->null_ws = 0;
    j->absent_rank = -1;
    j->use_q = 0;
    for (r = 0; r < G->R; r++) {
        j->quant[r] = NULL;
        j->ex[r] = d->ex[r];
        j->wt[r] = d->wt[r];
        j->cap[r] = d->L + d->c.pad;
        j->res[r] = d->res[r];
        j->hid[r] = d->hid[r];
        j->nrm[r] = d->nrm[r];
    }
}

static const char *strat_name(beam_strategy s)
{
    switch (s) {
    case BEAM_STRATEGY_AUTO: return "AUTO";
    case BEAM_STRATEGY_ONESHOT: return "ONESHOT";
    case BEAM_STRATEGY_TWOSHOT: return "TWOSHOT";
    case BEAM_STRATEGY_UNFUSED: return "UNFUSED";
    default: return "?";
    }
}

/* Run one valid case under one strategy and check every rank. */
static void run_valid(group *G, const gcase *c, beam_strategy s, uint64_t seed)
{
    gdata d;
    size_t TH = (size_t)c->T * (size_t)c->H;
    int r;
    char label[300];
    gdata_make(&d, c, G->R, seed);
    job_from(G, &d, s);
    run_job(G);
    for (r = 0; r < G->R; r++) {
        snprintf(label, sizeof label,
                 "seed=%llu R=%d rank=%d T=%lld K=%d H=%d post=%d next=%d scales=%d rs_one=%d "
                 "inplace=%d pad=%lld strategy=%s",
                 (unsigned long long)seed, G->R, r, (long long)c->T, (int)c->K, (int)c->H,
                 c->post, c->next, c->scales, c->rs_one, c->inplace, (long long)c->pad,
                 strat_name(s));
        if (G->j.st[r] != BEAM_OK)
            fprintf(stderr, "FAIL %s: status %d: %s\n", label, (int)G->j.st[r], G->j.msg[r]);
        CU_ASSERT_EQUAL(G->j.st[r], BEAM_OK);
        CU_ASSERT_EQUAL(hu_cmp_bf16(label, d.hid[r], d.want_h, TH), 0);
        CU_ASSERT(hu_is_poison(d.hid[r] + TH, 2 * GUARD * (size_t)c->H));
        if (c->next) {
            CU_ASSERT_EQUAL(hu_cmp_bf16(label, d.nrm[r], d.want_n, TH), 0);
            CU_ASSERT(hu_is_poison(d.nrm[r] + TH, 2 * GUARD * (size_t)c->H));
        }
    }
    gdata_free(&d);
}

static const beam_strategy GSTRATS[4] = {BEAM_STRATEGY_AUTO, BEAM_STRATEGY_ONESHOT,
                                         BEAM_STRATEGY_TWOSHOT, BEAM_STRATEGY_UNFUSED};

/* Token counts for R ranks: 0, 1, < R, R - 1, R + 1, not divisible by R,
 * one where the last rank owns no row (T = 9, R = 4: L = 3), and a larger
 * one. */
static int token_list(int R, int64_t *t)
{
    int n = 0;
    t[n++] = 0;
    t[n++] = 1;
    if (R > 2)
        t[n++] = R - 1;
    if (R > 3)
        t[n++] = 2;
    t[n++] = R + 1;
    t[n++] = 7;
    t[n++] = 9;
    t[n++] = 100;
    return n;
}

static void run_R(int R)
{
    group G;
    beam_workspace_config cfg = beam_workspace_config_default();
    int64_t toks[16];
    int nt = token_list(R, toks), i, k;
    uint64_t n = 0;
    if (!group_start(&G, R)) {
        CU_FAIL("group create");
        return;
    }
    /* AUTO's thresholds low enough that it picks each strategy over the list */
    cfg.oneshot_max_tokens = 2;
    cfg.twoshot_max_tokens = 8;
    cfg.timeout_ms = 20000;
    if (ws_create(&G, 128, 1024, &cfg)) {
        for (i = 0; i < nt; i++)
            for (k = 0; k < 4; k++) {
                gcase c;
                int v = (int)(n % 18);
                memset(&c, 0, sizeof c);
                c.T = toks[i];
                c.K = (int32_t[]){1, 2, 6, 8, 32}[n % 5];
                c.H = 1024;
                c.post = v % 3;
                c.next = (v / 3) % 3;
                c.scales = (int)((n / 2) % 2);
                c.rs_one = (int)((n / 3) % 2);
                c.inplace = (int)((n / 5) % 2);
                c.pad = (int64_t)(n % 3);
                if (hu_quick() && c.T > 9)
                    c.K = 2;
                run_valid(&G, &c, GSTRATS[k], g_seed + 7919u * (uint64_t)R + n);
                n++;
            }
        ws_destroy(&G);
    }
    /* a second workspace on the same group: another hidden, default cfg */
    if (!hu_quick() && ws_create(&G, 64, 7168, NULL)) {
        for (k = 0; k < 4; k++) {
            gcase c;
            memset(&c, 0, sizeof c);
            c.T = 64 - 3;
            c.K = 8;
            c.H = 7168;
            c.post = 2;
            c.next = 2;
            c.scales = k % 2;
            c.rs_one = k / 2;
            c.inplace = k % 2;
            c.pad = 1;
            run_valid(&G, &c, GSTRATS[k], g_seed + 31337u * (uint64_t)R + (uint64_t)k);
        }
        ws_destroy(&G);
    }
    group_stop(&G);
}

static void test_R1(void) { run_R(1); }
static void test_R2(void) { run_R(2); }
static void test_R3(void) { run_R(3); }
static void test_R4(void) { run_R(4); }
static void test_R8(void) { run_R(8); }

/* ---- back-to-back gathers ------------------------------------------- */

/* Each rank runs NBURST gathers in a row without waiting for the main
 * thread: a fast rank starts call i+1 while slow ones still read call i's
 * shared stage. Every result is checked afterwards. */
#define NBURST 24
static gdata g_burst[NBURST];
static beam_strategy g_burst_strat[NBURST];

static beam_status burst_call(struct group *G, int r, int i)
{
    gdata *d = &g_burst[i];
    (void)G;
    return beam_moe_finalize_gather_norm_residual_norm(
        G->ws[r], d->ex[r], d->wt[r], d->L + d->c.pad, d->c.T, d->c.K, d->c.H, d->rs,
        d->c.post ? &d->post : NULL, d->res[r], d->c.scales ? d->scales : NULL,
        d->c.next ? &d->next : NULL, d->hid[r], d->nrm[r], g_burst_strat[i], NULL);
}

static void run_burst(int R)
{
    group G;
    beam_workspace_config cfg = beam_workspace_config_default();
    static const int64_t toks[6] = {5, 1, 40, 0, 13, 64};
    int i, r;
    if (!group_start(&G, R)) {
        CU_FAIL("group create");
        return;
    }
    cfg.oneshot_max_tokens = 4;
    cfg.twoshot_max_tokens = 16;
    cfg.timeout_ms = 20000;
    if (!ws_create(&G, 64, 512, &cfg)) {
        group_stop(&G);
        return;
    }
    for (i = 0; i < NBURST; i++) {
        gcase c;
        memset(&c, 0, sizeof c);
        c.T = toks[i % 6];
        c.K = 1 + i % 8;
        c.H = 512;
        c.post = i % 3;
        c.next = (i / 3) % 3;
        c.scales = i % 2;
        c.rs_one = (i / 2) % 2;
        c.inplace = (i / 4) % 2;
        c.pad = i % 2;
        gdata_make(&g_burst[i], &c, R, g_seed + 555u * (uint64_t)R + (uint64_t)i);
        g_burst_strat[i] = GSTRATS[(i + i / 4) % 4];
    }
    G.j.kind = JOB_BURST;
    G.j.nburst = NBURST;
    run_job(&G);
    for (i = 0; i < NBURST; i++) {
        gdata *d = &g_burst[i];
        size_t TH = (size_t)d->c.T * (size_t)d->c.H;
        for (r = 0; r < R; r++) {
            char label[200];
            snprintf(label, sizeof label, "seed=%llu burst R=%d call=%d rank=%d T=%lld strategy=%s",
                     (unsigned long long)g_seed, R, i, r, (long long)d->c.T,
                     strat_name(g_burst_strat[i]));
            CU_ASSERT_EQUAL(G.j.burst_st[r][i], BEAM_OK);
            CU_ASSERT_EQUAL(hu_cmp_bf16(label, d->hid[r], d->want_h, TH), 0);
            if (d->c.next)
                CU_ASSERT_EQUAL(hu_cmp_bf16(label, d->nrm[r], d->want_n, TH), 0);
        }
        gdata_free(d);
    }
    ws_destroy(&G);
    group_stop(&G);
}

static void test_burst(void)
{
    run_burst(2);
    run_burst(3);
    run_burst(8);
}

/* ---- invalid gathers ---------------------------------------------------- */

/* Every rank must fail; no output byte on any rank may change. */
static void expect_all_fail(group *G, gdata *d, const char *what, const char *arg)
{
    size_t ob = 2 * ((size_t)d->c.T * (size_t)d->c.H + GUARD * (size_t)d->c.H);
    int r;
    run_job(G);
    for (r = 0; r < G->R; r++) {
        if (G->j.st[r] == BEAM_OK)
            fprintf(stderr, "FAIL invalid gather '%s' R=%d rank %d returned OK\n", what, G->R,
                    r);
        /* an argument error, found before any wait: not a peer timeout */
        CU_ASSERT_EQUAL(G->j.st[r], BEAM_ERR_INVALID_ARGUMENT);
        if (G->j.st[r] != BEAM_OK && G->j.st[r] != BEAM_ERR_INVALID_ARGUMENT)
            fprintf(stderr, "invalid gather '%s' R=%d rank %d: status %d (%s)\n", what, G->R, r,
                    (int)G->j.st[r], G->j.msg[r]);
        if (arg && G->j.st[r] == BEAM_ERR_INVALID_ARGUMENT) {
            CU_ASSERT_PTR_NOT_NULL(strstr(G->j.msg[r], "beam_moe_finalize_gather_norm_residual_norm"));
            CU_ASSERT_PTR_NOT_NULL(strstr(G->j.msg[r], arg));
            if (!strstr(G->j.msg[r], arg))
                fprintf(stderr, "message for '%s' does not name %s: %s\n", what, arg,
                        G->j.msg[r]);
        }
        if (d->c.inplace == 0) {
            CU_ASSERT(hu_is_poison(d->hid[r], ob));
            if (d->nrm[r])
                CU_ASSERT(hu_is_poison(d->nrm[r], ob));
            if (!hu_is_poison(d->hid[r], ob))
                fprintf(stderr, "FAIL invalid gather '%s' R=%d rank %d wrote hidden_out\n", what,
                        G->R, r);
        }
    }
}

/* Rank 0 calls with (s, T, scales), the others with the job's values:
 * every rank must refuse. */
static void run_disagree(group *G, gdata *d, const char *what, beam_strategy s, int64_t T,
                         const float *scales)
{
    g_odd.active = 1;
    g_odd.strategy = s;
    g_odd.T = T;
    g_odd.scales = scales;
    expect_all_fail(G, d, what, NULL);
    g_odd.active = 0;
}

static void test_invalid(void)
{
    static const int Rs[3] = {1, 2, 3};
    int ri;
    for (ri = 0; ri < 3; ri++) {
        group G;
        gdata d;
        gcase c;
        int R = Rs[ri], r;
        if (!group_small(&G, R))
            continue;
        gcase_small(&c, 0);

        /* T > max_tokens */
        c.T = 17;
        gdata_make(&d, &c, R, g_seed + 5);
        job_from(&G, &d, BEAM_STRATEGY_AUTO);
        expect_all_fail(&G, &d, "T > max_tokens", "tokens");
        gdata_free(&d);

        /* hidden mismatch: H = 768 on a hidden = 512 workspace */
        c.T = 5;
        c.H = 768;
        gdata_make(&d, &c, R, g_seed + 6);
        job_from(&G, &d, BEAM_STRATEGY_AUTO);
        expect_all_fail(&G, &d, "hidden mismatch", "hidden");
        gdata_free(&d);
        c.H = 512;

        /* capacity < ceil(T/R) on every rank */
        c.T = 7;
        gdata_make(&d, &c, R, g_seed + 7);
        job_from(&G, &d, BEAM_STRATEGY_TWOSHOT);
        for (r = 0; r < R; r++)
            G.j.cap[r] = d.L - 1;
        expect_all_fail(&G, &d, "capacity < ceil(T/R)", "capacity");
        /* ... and on one rank only: its peers must learn it too (no rank
         * writes anything, and nobody waits for a timeout) */
        if (R > 1) {
            job_from(&G, &d, BEAM_STRATEGY_ONESHOT);
            G.j.cap[R - 1] = d.L - 1;
            expect_all_fail(&G, &d, "capacity < ceil(T/R) on the last rank", NULL);
            job_from(&G, &d, BEAM_STRATEGY_TWOSHOT);
            G.j.cap[0] = d.L - 1;
            expect_all_fail(&G, &d, "capacity < ceil(T/R) on rank 0", NULL);
            job_from(&G, &d, BEAM_STRATEGY_UNFUSED);
            G.j.cap[R - 1] = -1;
            expect_all_fail(&G, &d, "capacity -1 on the last rank", NULL);
        }
        gdata_free(&d);

        /* ranks that disagree on a collective argument */
        if (R > 1) {
            static float other[2] = {1.0f, 1.0f};
            gdata_make(&d, &c, R, g_seed + 12);
            job_from(&G, &d, BEAM_STRATEGY_ONESHOT);
            run_disagree(&G, &d, "strategy", BEAM_STRATEGY_TWOSHOT, d.c.T, G.j.scales);
            job_from(&G, &d, BEAM_STRATEGY_TWOSHOT);
            run_disagree(&G, &d, "tokens", BEAM_STRATEGY_TWOSHOT, d.c.T - 1, G.j.scales);
            job_from(&G, &d, BEAM_STRATEGY_UNFUSED);
            run_disagree(&G, &d, "scales", BEAM_STRATEGY_UNFUSED, d.c.T, other);
            gdata_free(&d);
        }

        /* strategies the gather does not take */
        gdata_make(&d, &c, R, g_seed + 8);
        job_from(&G, &d, BEAM_STRATEGY_FUSED);
        expect_all_fail(&G, &d, "strategy FUSED", "strategy");
        job_from(&G, &d, (beam_strategy)99);
        expect_all_fail(&G, &d, "strategy 99", "strategy");
        job_from(&G, &d, (beam_strategy)-1);
        expect_all_fail(&G, &d, "strategy -1", "strategy");
        gdata_free(&d);

        /* NULL workspace */
        gdata_make(&d, &c, R, g_seed + 9);
        job_from(&G, &d, BEAM_STRATEGY_AUTO);
        G.j.null_ws = 1;
        expect_all_fail(&G, &d, "NULL workspace", "workspace");
        gdata_free(&d);

        /* the workspace still works after all that */
        c.T = 7;
        run_valid(&G, &c, BEAM_STRATEGY_AUTO, g_seed + 10);
        run_valid(&G, &c, BEAM_STRATEGY_TWOSHOT, g_seed + 11);
        ws_destroy(&G);
        group_stop(&G);
    }
}

/* A peer that never arrives: the others return BEAM_ERR_COMM after about
 * timeout_ms instead of hanging, and write nothing. The workspace is then
 * only destroyed. */
static void test_timeout(void)
{
    group G;
    gdata d;
    gcase c;
    beam_workspace_config cfg = beam_workspace_config_default();
    struct timespec t0, t1;
    double secs;
    size_t ob;
    int r;
    if (!group_start(&G, 3)) {
        CU_FAIL("group create");
        return;
    }
    cfg.timeout_ms = 1000;
    if (!ws_create(&G, 16, 256, &cfg)) {
        group_stop(&G);
        return;
    }
    memset(&c, 0, sizeof c);
    c.T = 9;
    c.K = 2;
    c.H = 256;
    c.next = 1;
    gdata_make(&d, &c, 3, g_seed + 99);
    ob = 2 * ((size_t)c.T * (size_t)c.H + GUARD * (size_t)c.H);
    job_from(&G, &d, BEAM_STRATEGY_ONESHOT);
    G.j.absent_rank = 2;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    run_job(&G);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    for (r = 0; r < 2; r++) {
        CU_ASSERT_EQUAL(G.j.st[r], BEAM_ERR_COMM);
        if (G.j.st[r] != BEAM_ERR_COMM)
            fprintf(stderr, "timeout: rank %d status %d (%s)\n", r, (int)G.j.st[r], G.j.msg[r]);
        CU_ASSERT(hu_is_poison(d.hid[r], ob));
        CU_ASSERT(hu_is_poison(d.nrm[r], ob));
    }
    fprintf(stderr, "  (peer absent: returned after %.2f s, timeout 1 s)\n", secs);
    CU_ASSERT(secs < 10.0);
    gdata_free(&d);
    ws_destroy(&G);
    group_stop(&G);
}

/* ---- the quantized output (_q) ------------------------------------------ */

#define QGUARD 64              /* values bytes and scales floats checked past the extent */
#define QPOISON8 0x5Au
#define QPOISON32 0xFFFFFFFFu /* a NaN: a scale is never NaN, nor negative */
#define QMAXT 100
#define NQFORMS QM_NFORMS


/* Every rank's quantized output of one form, and the model's over the same
 * extent (poison where nothing may be written). */
typedef struct qout {
    int R;
    beam_quant q[MAXR];
    uint8_t *vals[MAXR], *want_v;
    float *sc[MAXR], *want_s;
    size_t nv, ns; /* bytes of values, floats of scales, guards included */
} qout;

static void q_fill32(float *p, size_t n)
{
    const uint32_t u = QPOISON32;
    size_t i;
    for (i = 0; i < n; i++)
        memcpy(&p[i], &u, 4);
}

static void qout_poison(qout *o)
{
    int r;
    for (r = 0; r < o->R; r++) {
        memset(o->vals[r], QPOISON8, o->nv);
        q_fill32(o->sc[r], o->ns);
    }
}

static void qout_make(qout *o, const beam_quant *form, int R, int64_t T, int32_t H,
                      const uint16_t *want_n)
{
    int r;
    memset(o, 0, sizeof *o);
    o->R = R;
    o->nv = qm_values_bytes(form, T, H) + QGUARD; /* NVFP4: two values a byte */
    o->ns = qm_scale_floats(form, T, H) + QGUARD;
    o->want_v = (uint8_t *)hu_alloc(o->nv, 0);
    o->want_s = (float *)hu_alloc(4 * o->ns, 0);
    memset(o->want_v, QPOISON8, o->nv);
    q_fill32(o->want_s, o->ns);
    qm_quant(form, want_n, T, H, o->want_v, o->want_s);
    for (r = 0; r < R; r++) {
        o->vals[r] = (uint8_t *)hu_alloc(o->nv, 0);
        o->sc[r] = (float *)hu_alloc(4 * o->ns, 0);
        o->q[r] = *form;
        /* NVFP4: the scales array's bytes are the block scales */
        qm_bind(&o->q[r], o->vals[r], o->sc[r]);
    }
    qout_poison(o);
}

static void qout_free(qout *o)
{
    int r;
    for (r = 0; r < o->R; r++) {
        hu_free(o->vals[r]);
        hu_free(o->sc[r]);
    }
    hu_free(o->want_v);
    hu_free(o->want_s);
}

/* Fresh poison in every rank's outputs (d's inputs are never written:
 * no in-place case here). */
static void q_poison_outputs(gdata *d, qout *o)
{
    size_t ob = 2 * ((size_t)d->c.T * (size_t)d->c.H + GUARD * (size_t)d->c.H);
    int r;
    for (r = 0; r < d->R; r++) {
        hu_poison(d->hid[r], ob);
        hu_poison(d->nrm[r], ob);
    }
    if (o)
        qout_poison(o);
}

/* Whether rank r keeps normalized: keep 0 none, 1 every rank, 2 the even
 * ranks (each rank's own choice). */
static int q_keeps(int keep, int r)
{
    return keep == 2 ? r % 2 == 0 : keep;
}

/* The _q gather on every rank: quant o->q[r] (o NULL: quant NULL),
 * normalized kept or NULL (q_keeps). */
static void q_run(group *G, gdata *d, qout *o, beam_strategy s, int keep)
{
    int r;
    job_from(G, d, s);
    G->j.use_q = 1;
    for (r = 0; r < G->R; r++) {
        G->j.quant[r] = o ? &o->q[r] : NULL;
        G->j.nrm[r] = q_keeps(keep, r) ? d->nrm[r] : NULL;
    }
    run_job(G);
}

/* 0 when rank r's outputs are right: hidden and (kept) normalized the
 * reference's, normalized untouched when NULL, values and scales the
 * model's with everything past them untouched; else prints why. */
static int q_bad_rank(group *G, gdata *d, qout *o, int r, int keep, const char *label)
{
    const size_t TH = (size_t)d->c.T * (size_t)d->c.H, gb = 2 * GUARD * (size_t)d->c.H;
    size_t i;
    if (G->j.st[r] != BEAM_OK) {
        fprintf(stderr, "FAIL %s rank %d: status %d: %s\n", label, r, (int)G->j.st[r], G->j.msg[r]);
        return 1;
    }
    if (hu_cmp_bf16(label, d->hid[r], d->want_h, TH) || !hu_is_poison(d->hid[r] + TH, gb)) {
        fprintf(stderr, "FAIL %s rank %d: hidden_out\n", label, r);
        return 1;
    }
    if (keep ? hu_cmp_bf16(label, d->nrm[r], d->want_n, TH) || !hu_is_poison(d->nrm[r] + TH, gb)
             : !hu_is_poison(d->nrm[r], 2 * TH + gb)) {
        fprintf(stderr, "FAIL %s rank %d: normalized (%s)\n", label, r, keep ? "kept" : "NULL: written");
        return 1;
    }
    if (!o)
        return 0;
    for (i = 0; i < o->nv; i++)
        if (o->vals[r][i] != o->want_v[i]) {
            const size_t row = o->q[r].kind == BEAM_QUANT_NVFP4 ? (size_t)d->c.H / 2 : (size_t)d->c.H;
            fprintf(stderr, "FAIL %s rank %d: values[%zu] (row %zu) = 0x%02x, model 0x%02x\n", label, r, i,
                    i / row, o->vals[r][i], o->want_v[i]);
            return 1;
        }
    if (o->q[r].kind == BEAM_QUANT_NVFP4 && memcmp(o->sc[r], o->want_s, 4 * o->ns) != 0) {
        /* the block scales, byte by byte (the global row's tiled place;
         * 0xFF: untouched) */
        const uint8_t *got = (const uint8_t *)o->sc[r], *want = (const uint8_t *)o->want_s;
        for (i = 0; i < 4 * o->ns && got[i] == want[i]; i++)
            continue;
        fprintf(stderr, "FAIL %s rank %d: block_scales[%zu] = 0x%02x, model 0x%02x\n", label, r, i, got[i],
                want[i]);
        return 1;
    }
    if (memcmp(o->sc[r], o->want_s, 4 * o->ns) != 0) {
        for (i = 0; i < o->ns && !memcmp(&o->sc[r][i], &o->want_s[i], 4); i++)
            continue;
        fprintf(stderr, "FAIL %s rank %d: scales[%zu] = %g, model %g\n", label, r, i, (double)o->sc[r][i],
                (double)o->want_s[i]);
        return 1;
    }
    return 0;
}

/* One form (o; NULL: the _q entry with quant NULL) under every strategy,
 * normalized kept, NULL, and kept on the even ranks only (NULL only with a
 * quant). */
static int q_run_form(group *G, gdata *d, qout *o, const char *form, uint64_t seed)
{
    static const char *const kept[3] = {"NULL", "kept", "kept on even ranks"};
    int k, keep, r, bad = 0;
    char label[300];
    for (k = 0; k < 4; k++)
        for (keep = o ? 0 : 1; keep < (o ? 3 : 2); keep++) {
            q_poison_outputs(d, o);
            q_run(G, d, o, GSTRATS[k], keep);
            snprintf(label, sizeof label, "seed=%llu quant R=%d T=%lld form=%s strategy=%s normalized=%s",
                     (unsigned long long)seed, G->R, (long long)d->c.T, form, strat_name(GSTRATS[k]),
                     kept[keep]);
            for (r = 0; r < G->R; r++)
                bad += q_bad_rank(G, d, o, r, q_keeps(keep, r), label);
        }
    return bad;
}

static void run_quant_R(int R)
{
    static const char *const names[NQFORMS + 1] = {"group128", "group64-ue8m0-col", "token", "token-ue8m0",
                                                   "tensor", "nvfp4-g672", "nvfp4-g1", "none"};
    group G;
    beam_workspace_config cfg = beam_workspace_config_default();
    int64_t toks[6];
    int nt = 0, i, f, bad = 0;
    if (!group_start(&G, R)) {
        CU_FAIL("group create");
        return;
    }
    /* AUTO picks each strategy over the list */
    cfg.oneshot_max_tokens = 2;
    cfg.twoshot_max_tokens = 8;
    cfg.timeout_ms = 20000;
    toks[nt++] = 1;
    if (R > 2)
        toks[nt++] = R - 1; /* fewer tokens than ranks: some own none */
    toks[nt++] = R + 1;     /* not divisible by R */
    toks[nt++] = QMAXT - 1; /* near max_tokens */
    if (ws_create(&G, QMAXT, 512, &cfg)) {
        for (i = 0; i < nt; i++) {
            const uint64_t seed = g_seed + 1009u * (uint64_t)R + (uint64_t)i;
            beam_quant forms[NQFORMS];
            gcase c;
            gdata d;
            memset(&c, 0, sizeof c);
            c.T = toks[i];
            c.K = 4;
            c.H = 512;
            c.post = 2;
            c.next = 2;
            c.scales = 1;
            c.pad = 1;
            gdata_make(&d, &c, R, seed);
            qm_forms(forms, c.T);
            for (f = 0; f < NQFORMS; f++) {
                qout o;
                qout_make(&o, &forms[f], R, c.T, c.H, d.want_n);
                bad += q_run_form(&G, &d, &o, names[f], seed);
                qout_free(&o);
            }
            bad += q_run_form(&G, &d, NULL, names[NQFORMS], seed);
            gdata_free(&d);
        }
        ws_destroy(&G);
    }
    group_stop(&G);
    CU_ASSERT_EQUAL(bad, 0);
}

static void test_quant(void)
{
    run_quant_R(1);
    run_quant_R(2);
    run_quant_R(3);
    run_quant_R(8);
}

/* Every rank fails with BEAM_ERR_INVALID_ARGUMENT and writes nothing,
 * values and scales included; rank bad's message names arg (bad < 0:
 * every rank's). */
static void q_expect_all_fail(group *G, gdata *d, qout *o, int bad, const char *arg, const char *what)
{
    int r;
    q_poison_outputs(d, o);
    G->j.use_q = 1;
    expect_all_fail(G, d, what, NULL);
    for (r = 0; r < G->R; r++) {
        int untouched = 1;
        size_t i;
        for (i = 0; i < o->nv; i++)
            untouched &= o->vals[r][i] == QPOISON8;
        for (i = 0; i < o->ns; i++)
            untouched &= !memcmp(&o->sc[r][i], &(uint32_t){QPOISON32}, 4);
        CU_ASSERT(untouched);
        if (!untouched)
            fprintf(stderr, "FAIL invalid _q gather '%s' R=%d rank %d wrote its quantized output\n", what,
                    G->R, r);
        if ((bad < 0 || r == bad) && !strstr(G->j.msg[r], arg)) {
            fprintf(stderr, "invalid _q gather '%s' R=%d rank %d: message does not name %s: %s\n", what,
                    G->R, r, arg, G->j.msg[r]);
            CU_FAIL("message");
        }
    }
}

/* One rank's bad quant (or normalized NULL without one), and ranks that
 * pass different forms: every rank fails at once, nothing written; the
 * workspace works on. */
static void test_quant_invalid(void)
{
    static const int Rs[3] = {1, 2, 3};
    int ri, r;
    for (ri = 0; ri < 3; ri++) {
        const int R = Rs[ri], last = R - 1;
        group G;
        gdata d;
        gcase c;
        qout o;
        beam_quant form, token, odd;
        if (!group_small(&G, R))
            continue;
        gcase_small(&c, 7);
        gdata_make(&d, &c, R, g_seed + 4711u + (uint64_t)R);
        memset(&form, 0, sizeof form);
        form.kind = BEAM_QUANT_FP8_GROUP;
        form.group_size = 128;
        qout_make(&o, &form, R, c.T, c.H, d.want_n);

        /* group_size 96 on the last rank */
        job_from(&G, &d, BEAM_STRATEGY_ONESHOT);
        for (r = 0; r < R; r++)
            G.j.quant[r] = &o.q[r];
        odd = o.q[last];
        odd.group_size = 96;
        G.j.quant[last] = &odd;
        q_expect_all_fail(&G, &d, &o, last, "quant->group_size=96", "group_size 96 on the last rank");

        /* scales NULL on rank 0 */
        job_from(&G, &d, BEAM_STRATEGY_TWOSHOT);
        for (r = 0; r < R; r++)
            G.j.quant[r] = &o.q[r];
        odd = o.q[0];
        odd.scales = NULL;
        G.j.quant[0] = &odd;
        q_expect_all_fail(&G, &d, &o, 0, "quant->scales must not be NULL", "scales NULL on rank 0");

        /* normalized NULL without a quant on the last rank */
        job_from(&G, &d, BEAM_STRATEGY_UNFUSED);
        for (r = 0; r < R; r++)
            G.j.quant[r] = r == last ? NULL : &o.q[r];
        G.j.nrm[last] = NULL;
        q_expect_all_fail(&G, &d, &o, last, "normalized must not be NULL",
                          "normalized NULL without a quant on the last rank");

        if (R > 1) {
            /* rank 0 quantizes per token, the others per group */
            token = o.q[0];
            token.kind = BEAM_QUANT_FP8_TOKEN;
            token.group_size = 0;
            job_from(&G, &d, BEAM_STRATEGY_ONESHOT);
            for (r = 0; r < R; r++)
                G.j.quant[r] = r == 0 ? &token : &o.q[r];
            q_expect_all_fail(&G, &d, &o, -1, "passed different quant", "rank 0 per token, the others per group");
            /* the last rank without a quant (normalized kept), the others with */
            job_from(&G, &d, BEAM_STRATEGY_TWOSHOT);
            for (r = 0; r < R; r++)
                G.j.quant[r] = r == last ? NULL : &o.q[r];
            q_expect_all_fail(&G, &d, &o, -1, "passed different quant", "the last rank without a quant");
        }

        /* NULL workspace: the _q entry's own message */
        job_from(&G, &d, BEAM_STRATEGY_AUTO);
        for (r = 0; r < R; r++)
            G.j.quant[r] = &o.q[r];
        G.j.null_ws = 1;
        q_expect_all_fail(&G, &d, &o, -1, "beam_moe_finalize_gather_norm_residual_norm_q: workspace must not be NULL",
                          "NULL workspace");

        /* NVFP4: block_scales NULL on the last rank; with more ranks, rank
         * 0's global scale not the others' */
        {
            beam_quant nv;
            qout o4;
            memset(&nv, 0, sizeof nv);
            nv.kind = BEAM_QUANT_NVFP4;
            nv.group_size = 16;
            nv.scale = 672.0f;
            qout_make(&o4, &nv, R, c.T, c.H, d.want_n);
            job_from(&G, &d, BEAM_STRATEGY_ONESHOT);
            for (r = 0; r < R; r++)
                G.j.quant[r] = &o4.q[r];
            odd = o4.q[last];
            odd.block_scales = NULL;
            G.j.quant[last] = &odd;
            q_expect_all_fail(&G, &d, &o4, last, "quant->block_scales", "nvfp4 block_scales NULL on the last rank");
            if (R > 1) {
                job_from(&G, &d, BEAM_STRATEGY_TWOSHOT);
                for (r = 0; r < R; r++)
                    G.j.quant[r] = &o4.q[r];
                odd = o4.q[0];
                odd.scale = 1.0f;
                G.j.quant[0] = &odd;
                q_expect_all_fail(&G, &d, &o4, -1, "passed different quant",
                                  "nvfp4 rank 0's global scale 1, the others' 672");
            }
            qout_free(&o4);
        }

        /* the workspace still works after all that */
        q_poison_outputs(&d, &o);
        q_run(&G, &d, &o, BEAM_STRATEGY_AUTO, 0);
        for (r = 0; r < R; r++)
            CU_ASSERT_EQUAL(q_bad_rank(&G, &d, &o, r, 0, "quant after the failures"), 0);
        qout_free(&o);
        gdata_free(&d);
        ws_destroy(&G);
        group_stop(&G);
    }
}

/* ---- two caller threads per rank ---------------------------------------- */

/* Two ranks, two caller threads on each, both threads of a rank calling the
 * gather on that rank's one workspace at the same time. Thread p of rank 0
 * and thread p of rank 1 form "pair p"; iteration i of pair p is one logical
 * call with its own fresh inputs (both ranks generate the same case from the
 * same seed and take their part) and its own routed_scale, which no other
 * logical call uses. Which call of rank 1 a call of rank 0 meets is decided
 * by the order in which they join, so a call of pair 0 may meet one of pair
 * 1: their routed_scale (and often tokens or the strategy) differ and the
 * agreement must fail both. Every call must end as one of:
 *   BEAM_OK:   outputs bit-identical to the naive reference of its own
 *              inputs, guard rows untouched;
 *   refused:   "another call on this workspace is in progress", nothing
 *              written;
 *   disagreed: "passed different ...", nothing written.
 * A refused or disagreed call is made again (after a short random pause,
 * so that neither thread of a rank keeps winning) until it succeeds: pair
 * p's threads then move through their calls in step, every logical call is
 * checked once it succeeds, and no rank is left waiting at the end. A
 * timeout, another status, wrong bits or a written byte is a failure. */
#define TT_THREADS 2
#define TT_STRATS 3

typedef struct tt_stats {
    long ok[TT_STRATS], wrong, refused, disagreed, other, wrote;
    char first[320];
} tt_stats;

typedef struct tt_arg {
    beam_workspace *ws;
    int r, p, n;
    uint64_t seed;
    tt_stats s;
} tt_arg;

static const beam_strategy TT_STRAT[TT_STRATS] = {BEAM_STRATEGY_ONESHOT, BEAM_STRATEGY_TWOSHOT,
                                                  BEAM_STRATEGY_UNFUSED};

static void tt_note(tt_arg *a, const char *what, int64_t i, beam_status st)
{
    if (a->s.first[0] == '\0')
        snprintf(a->s.first, sizeof a->s.first, "rank %d thread %d call %lld: %s (status %d: %s)", a->r,
                 a->p, (long long)i, what, (int)st, st == BEAM_OK ? "" : beam_last_error());
}

static void *tt_main(void *p)
{
    tt_arg *a = (tt_arg *)p;
    const int r = a->r;
    hu_rng pause;
    int i;
    hu_rng_init(&pause, a->seed + 17u * (uint64_t)(2 * a->p + r + 1));
    for (i = 0; i < a->n; i++) {
        /* the same key on both ranks of a pair: the same case */
        uint64_t key = (uint64_t)a->p * (uint64_t)a->n + (uint64_t)i;
        hu_rng rng;
        gcase c;
        gdata d;
        size_t TH, ob;
        uint16_t *keep;
        int si = (i + a->p) % TT_STRATS, tries;
        beam_status st;
        hu_rng_init(&rng, a->seed + 0x9E3779B97F4A7C15ull * (key + 1));
        memset(&c, 0, sizeof c);
        c.T = 1 + (int64_t)hu_below(&rng, 16);
        c.K = 1 + (int32_t)hu_below(&rng, 4);
        c.H = 256;
        c.post = (int)hu_below(&rng, 3);
        c.next = (int)hu_below(&rng, 3);
        c.scales = (int)hu_below(&rng, 2);
        c.inplace = hu_below(&rng, 4) == 0;
        c.pad = hu_below(&rng, 2);
        c.nonzero = 1;
        /* unique per logical call and exact: 1 + k/8192, k < 8192 */
        c.rs_set = 1;
        c.rs = 1.0f + (float)(key + 1) * (1.0f / 8192.0f);
        gdata_make(&d, &c, 2, hu_next(&rng));
        TH = (size_t)c.T * (size_t)c.H;
        ob = 2 * (TH + GUARD * (size_t)c.H);
        /* what a call that fails must leave in hidden_out (poison, or the
         * residual when in place); normalized stays poison */
        keep = (uint16_t *)hu_alloc(ob, 0);
        memcpy(keep, d.hid[r], ob);
        for (tries = 0;; tries++) {
            struct timespec ts = {0, 0};
            int refused;
            st = beam_moe_finalize_gather_norm_residual_norm(
                a->ws, d.ex[r], d.wt[r], d.L + c.pad, c.T, c.K, c.H, d.rs, c.post ? &d.post : NULL,
                d.res[r], c.scales ? d.scales : NULL, c.next ? &d.next : NULL, d.hid[r], d.nrm[r],
                TT_STRAT[si], NULL);
            if (st == BEAM_OK)
                break;
            if (memcmp(keep, d.hid[r], ob) != 0 || (d.nrm[r] && !hu_is_poison(d.nrm[r], ob))) {
                a->s.wrote++;
                tt_note(a, "a failed call wrote its outputs", i, st);
                memcpy(d.hid[r], keep, ob);
                if (d.nrm[r])
                    hu_poison(d.nrm[r], ob);
            }
            refused = strstr(beam_last_error(), "another call on this workspace is in progress") != NULL;
            if (st != BEAM_ERR_INVALID_ARGUMENT ||
                (!refused && !strstr(beam_last_error(), "passed different"))) {
                a->s.other++;
                tt_note(a, "unexpected failure", i, st);
                break;
            }
            if (refused)
                a->s.refused++;
            else
                a->s.disagreed++;
            /* Each try meets the right call about one time in two; a
             * thousand misses in a row means the calls no longer pair up
             * (this thread then stops, and its partner times out). */
            if (tries == 1000) {
                a->s.other++;
                tt_note(a, "a thousand tries without meeting its partner's call", i, st);
                break;
            }
            ts.tv_nsec = 1000L * (1 + (long)hu_below(&pause, 40));
            nanosleep(&ts, NULL);
        }
        if (st == BEAM_OK) {
            a->s.ok[si]++;
            if (memcmp(d.hid[r], d.want_h, 2 * TH) != 0 || !hu_is_poison(d.hid[r] + TH, ob - 2 * TH) ||
                (c.next && (memcmp(d.nrm[r], d.want_n, 2 * TH) != 0 ||
                            !hu_is_poison(d.nrm[r] + TH, ob - 2 * TH)))) {
                a->s.wrong++;
                tt_note(a, "BEAM_OK with wrong bits", i, st);
            }
        }
        hu_free(keep);
        gdata_free(&d);
        if (st != BEAM_OK)
            break;
    }
    return NULL;
}

static void test_two_callers(void)
{
    group G;
    beam_workspace_config cfg = beam_workspace_config_default();
    tt_arg args[2 * TT_THREADS];
    pthread_t th[2 * TT_THREADS];
    tt_stats sum;
    struct timespec t0, t1;
    double secs;
    int k, si;
    if (!group_start(&G, 2)) {
        CU_FAIL("group create");
        return;
    }
    /* no wait may time out when every call is accounted for; a short
     * timeout only bounds how long a broken run takes */
    cfg.timeout_ms = 5000;
    if (!ws_create(&G, 16, 256, &cfg)) {
        group_stop(&G);
        return;
    }
    memset(&sum, 0, sizeof sum);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (k = 0; k < 2 * TT_THREADS; k++) {
        memset(&args[k], 0, sizeof args[k]);
        args[k].r = k % 2;
        args[k].p = k / 2;
        args[k].ws = G.ws[k % 2];
        args[k].n = hu_quick() ? 60 : 1500;
        args[k].seed = g_seed + 4242u;
        pthread_create(&th[k], NULL, tt_main, &args[k]);
    }
    for (k = 0; k < 2 * TT_THREADS; k++) {
        pthread_join(th[k], NULL);
        for (si = 0; si < TT_STRATS; si++)
            sum.ok[si] += args[k].s.ok[si];
        sum.wrong += args[k].s.wrong;
        sum.refused += args[k].s.refused;
        sum.disagreed += args[k].s.disagreed;
        sum.other += args[k].s.other;
        sum.wrote += args[k].s.wrote;
        if (args[k].s.first[0])
            fprintf(stderr, "  first failure: %s\n", args[k].s.first);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    fprintf(stderr,
            "  (%d calls to make: OK %ld ONESHOT, %ld TWOSHOT, %ld UNFUSED; %ld OK with wrong "
            "bits; %ld refused and made again; %ld failed the agreement and made again; %ld other "
            "failures; %ld failed calls wrote; %.2f s)\n",
            2 * TT_THREADS * args[0].n, sum.ok[0], sum.ok[1], sum.ok[2], sum.wrong, sum.refused,
            sum.disagreed, sum.other, sum.wrote, secs);
    CU_ASSERT_EQUAL(sum.wrong, 0);
    CU_ASSERT_EQUAL(sum.wrote, 0);
    CU_ASSERT_EQUAL(sum.other, 0);
    /* every logical call succeeded in the end, on both ranks (each one is
     * counted once per rank) */
    CU_ASSERT_EQUAL(sum.ok[0] + sum.ok[1] + sum.ok[2], 2 * TT_THREADS * args[0].n);
    ws_destroy(&G);
    group_stop(&G);
}

/* ---- refusals and creation failures ------------------------------------- */

/* One beam_workspace_create_cpu call on its own thread. */
typedef struct mk_call {
    beam_cpu_group *g;
    int32_t rank, hidden;
    int64_t max_tokens;
    const beam_workspace_config *cfg;
    int null_out; /* pass NULL as the out-parameter */
    beam_workspace *ws;
    beam_status st;
    char msg[256];
    int done;
} mk_call;

static void *mk_main(void *p)
{
    mk_call *c = (mk_call *)p;
    c->st = beam_workspace_create_cpu(c->g, c->rank, c->max_tokens, c->hidden, c->cfg,
                                      c->null_out ? NULL : &c->ws);
    snprintf(c->msg, sizeof c->msg, "%s", c->st == BEAM_OK ? "" : beam_last_error());
    __atomic_store_n(&c->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* One gather of rank r of case d on its own thread, into its own outputs. */
typedef struct ga_call {
    beam_workspace *ws;
    gdata *d;
    int r;
    beam_strategy s;
    beam_status st;
    char msg[256];
    int done;
} ga_call;

static beam_status ga_run(beam_workspace *ws, gdata *d, int r, beam_strategy s)
{
    return beam_moe_finalize_gather_norm_residual_norm(
        ws, d->ex[r], d->wt[r], d->L + d->c.pad, d->c.T, d->c.K, d->c.H, d->rs,
        d->c.post ? &d->post : NULL, d->res[r], d->c.scales ? d->scales : NULL,
        d->c.next ? &d->next : NULL, d->hid[r], d->nrm[r], s, NULL);
}

static void *ga_main(void *p)
{
    ga_call *c = (ga_call *)p;
    c->st = ga_run(c->ws, c->d, c->r, c->s);
    snprintf(c->msg, sizeof c->msg, "%s", c->st == BEAM_OK ? "" : beam_last_error());
    __atomic_store_n(&c->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Index of the first of n calls whose done flag is set, waiting up to 10 s;
 * -1 if none. */
static int first_done(int *const *done, int n)
{
    int k, t;
    for (t = 0; t < 10000; t++) {
        struct timespec ts = {0, 1000000L};
        for (k = 0; k < n; k++)
            if (__atomic_load_n(done[k], __ATOMIC_ACQUIRE))
                return k;
        nanosleep(&ts, NULL);
    }
    return -1;
}

static int outputs_untouched(const gdata *d, int r)
{
    size_t TH = (size_t)d->c.T * (size_t)d->c.H, ob = 2 * (TH + GUARD * (size_t)d->c.H);
    return hu_is_poison(d->hid[r], ob) && (!d->nrm[r] || hu_is_poison(d->nrm[r], ob));
}

static int outputs_exact(const gdata *d, int r)
{
    size_t TH = (size_t)d->c.T * (size_t)d->c.H, gb = 2 * GUARD * (size_t)d->c.H;
    return memcmp(d->hid[r], d->want_h, 2 * TH) == 0 && hu_is_poison(d->hid[r] + TH, gb) &&
           (!d->c.next ||
            (memcmp(d->nrm[r], d->want_n, 2 * TH) == 0 && hu_is_poison(d->nrm[r] + TH, gb)));
}

/* Two threads call the gather on rank 0's workspace while rank 1 has not
 * called yet: one of them waits for rank 1, the other is refused at once
 * with a message that names the rule, and writes nothing. While the first
 * waits, a gather and a destroy on that workspace from a third thread are
 * refused too (the workspace stays usable); then rank 1 calls and the
 * waiting call completes with the reference's bits. */
static void test_refusal(void)
{
    static const char fn[] = "beam_moe_finalize_gather_norm_residual_norm";
    static const char rule[] = "calls on one workspace must not overlap";
    group G;
    gcase c;
    gdata d[3]; /* the same case three times: two callers on rank 0, one more */
    beam_workspace_config cfg = beam_workspace_config_default();
    ga_call call[2];
    pthread_t th[2];
    int *done[2];
    int k, win, lose;
    int32_t rk = -1, nr = -1;
    beam_status st;
    if (!group_start(&G, 2)) {
        CU_FAIL("group create");
        return;
    }
    cfg.timeout_ms = 20000;
    if (!ws_create(&G, 16, 256, &cfg)) {
        group_stop(&G);
        return;
    }
    memset(&c, 0, sizeof c);
    c.T = 7;
    c.K = 3;
    c.H = 256;
    c.post = 2;
    c.next = 2;
    c.scales = 1;
    c.nonzero = 1;
    for (k = 0; k < 3; k++)
        gdata_make(&d[k], &c, 2, g_seed + 777);
    for (k = 0; k < 2; k++) {
        memset(&call[k], 0, sizeof call[k]);
        call[k].ws = G.ws[0];
        call[k].d = &d[k];
        call[k].r = 0;
        call[k].s = BEAM_STRATEGY_TWOSHOT;
        done[k] = &call[k].done;
        pthread_create(&th[k], NULL, ga_main, &call[k]);
    }
    lose = first_done(done, 2);
    CU_ASSERT(lose >= 0);
    if (lose < 0) {
        fprintf(stderr, "refusal: neither caller on rank 0 returned within 10 s\n");
        lose = 1; /* rank 1's call below lets the waiting ones end */
    }
    win = 1 - lose;
    CU_ASSERT_EQUAL(call[lose].st, BEAM_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(call[lose].msg, fn));
    CU_ASSERT_PTR_NOT_NULL(strstr(call[lose].msg, rule));
    CU_ASSERT_PTR_NOT_NULL(strstr(call[lose].msg, "in progress on another thread"));
    if (!strstr(call[lose].msg, rule))
        fprintf(stderr, "refusal message: status %d: %s\n", (int)call[lose].st, call[lose].msg);
    CU_ASSERT(outputs_untouched(&d[lose], 0));
    /* the winner still waits for rank 1: this thread is a third caller */
    CU_ASSERT_FALSE(__atomic_load_n(done[win], __ATOMIC_ACQUIRE));
    st = ga_run(G.ws[0], &d[2], 0, BEAM_STRATEGY_TWOSHOT);
    CU_ASSERT_EQUAL(st, BEAM_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), rule));
    CU_ASSERT(outputs_untouched(&d[2], 0));
    st = beam_workspace_destroy(G.ws[0]);
    CU_ASSERT_EQUAL(st, BEAM_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "beam_workspace_destroy"));
    CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), rule));
    CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "nothing was destroyed"));
    /* refused: the handle is still valid */
    CU_ASSERT_EQUAL(beam_workspace_info(G.ws[0], &rk, &nr), BEAM_OK);
    CU_ASSERT_EQUAL(rk, 0);
    CU_ASSERT_EQUAL(nr, 2);
    /* rank 1 meets the waiting call */
    st = ga_run(G.ws[1], &d[win], 1, BEAM_STRATEGY_TWOSHOT);
    if (st != BEAM_OK)
        fprintf(stderr, "refusal: rank 1: status %d: %s\n", (int)st, beam_last_error());
    CU_ASSERT_EQUAL(st, BEAM_OK);
    for (k = 0; k < 2; k++)
        pthread_join(th[k], NULL);
    CU_ASSERT_EQUAL(call[win].st, BEAM_OK);
    if (call[win].st != BEAM_OK)
        fprintf(stderr, "refusal: the waiting call: status %d: %s\n", (int)call[win].st, call[win].msg);
    CU_ASSERT(outputs_exact(&d[win], 0));
    CU_ASSERT(outputs_exact(&d[win], 1));
    CU_ASSERT(outputs_untouched(&d[lose], 0));
    /* and the workspace goes on: one more call, from the rank threads */
    gdata_free(&d[2]);
    gdata_make(&d[2], &c, 2, g_seed + 778);
    job_from(&G, &d[2], BEAM_STRATEGY_ONESHOT);
    run_job(&G);
    for (k = 0; k < 2; k++) {
        CU_ASSERT_EQUAL(G.j.st[k], BEAM_OK);
        CU_ASSERT(outputs_exact(&d[2], k));
    }
    for (k = 0; k < 3; k++)
        gdata_free(&d[k]);
    ws_destroy(&G);
    group_stop(&G);
}

/* Two threads create rank 0's workspace at once: one is refused without
 * joining, and the group cannot be destroyed while the other waits; rank
 * 1 then meets the waiting one. */
static void test_create_refusal(void)
{
    beam_cpu_group *g = NULL;
    beam_workspace_config cfg = beam_workspace_config_default();
    mk_call mk[3];
    pthread_t th[2];
    int *done[2];
    int k, win, lose;
    cfg.timeout_ms = 20000;
    CU_ASSERT_EQUAL_FATAL(beam_cpu_group_create(2, &g), BEAM_OK);
    memset(mk, 0, sizeof mk);
    for (k = 0; k < 3; k++) {
        mk[k].g = g;
        mk[k].rank = k == 2 ? 1 : 0;
        mk[k].max_tokens = 8;
        mk[k].hidden = 256;
        mk[k].cfg = &cfg;
    }
    for (k = 0; k < 2; k++) {
        done[k] = &mk[k].done;
        pthread_create(&th[k], NULL, mk_main, &mk[k]);
    }
    lose = first_done(done, 2);
    CU_ASSERT(lose >= 0);
    if (lose < 0)
        lose = 1;
    win = 1 - lose;
    CU_ASSERT_EQUAL(mk[lose].st, BEAM_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NULL(mk[lose].ws);
    CU_ASSERT_PTR_NOT_NULL(strstr(mk[lose].msg, "beam_workspace_create_cpu"));
    CU_ASSERT_PTR_NOT_NULL(strstr(mk[lose].msg, "in progress on another thread"));
    if (!strstr(mk[lose].msg, "in progress on another thread"))
        fprintf(stderr, "create refusal: status %d: %s\n", (int)mk[lose].st, mk[lose].msg);
    CU_ASSERT_EQUAL(beam_cpu_group_destroy(g), BEAM_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "in progress"));
    mk_main(&mk[2]); /* rank 1, on this thread */
    for (k = 0; k < 2; k++)
        pthread_join(th[k], NULL);
    CU_ASSERT_EQUAL(mk[2].st, BEAM_OK);
    CU_ASSERT_EQUAL(mk[win].st, BEAM_OK);
    CU_ASSERT_EQUAL(beam_workspace_destroy(mk[win].ws), BEAM_OK);
    CU_ASSERT_EQUAL(beam_workspace_destroy(mk[2].ws), BEAM_OK);
    CU_ASSERT_EQUAL(beam_cpu_group_destroy(g), BEAM_OK);
}

/* Rank 1 fails its own creation checks (or has no out-parameter) while
 * rank 0's arguments are fine and its
 * timeout is the default 30 s: both fail at once, nobody waits, and the
 * group still works. A rank out of range cannot join at all: its peer
 * times out (here after 300 ms) and the group is broken. */
static void test_create_failures(void)
{
    static const struct {
        const char *what;
        int64_t max_tokens;
        int32_t hidden, timeout_ms;
        int null_out;
        const char *arg;
    } bad[] = {{"hidden 300", 8, 300, 1000, 0, "hidden"},
               {"max_tokens -1", -1, 256, 1000, 0, "max_tokens"},
               {"timeout_ms 0", 8, 256, 0, 0, "timeout_ms"},
               {"NULL workspace", 8, 256, 1000, 1, "workspace must not be NULL"}};
    beam_cpu_group *g = NULL;
    beam_workspace_config bcfg = beam_workspace_config_default();
    mk_call mk[2];
    pthread_t th[2];
    struct timespec t0, t1;
    double secs;
    size_t b;
    int k;
    CU_ASSERT_EQUAL_FATAL(beam_cpu_group_create(2, &g), BEAM_OK);
    for (b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        memset(mk, 0, sizeof mk);
        bcfg.timeout_ms = bad[b].timeout_ms;
        for (k = 0; k < 2; k++) {
            mk[k].g = g;
            mk[k].rank = k;
            mk[k].max_tokens = k ? bad[b].max_tokens : 8;
            mk[k].hidden = k ? bad[b].hidden : 256;
            mk[k].cfg = k ? &bcfg : NULL; /* rank 0: the defaults, 30 s */
            mk[k].null_out = k ? bad[b].null_out : 0;
        }
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (k = 0; k < 2; k++)
            pthread_create(&th[k], NULL, mk_main, &mk[k]);
        for (k = 0; k < 2; k++)
            pthread_join(th[k], NULL);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        CU_ASSERT_EQUAL(mk[1].st, BEAM_ERR_INVALID_ARGUMENT);
        CU_ASSERT_PTR_NOT_NULL(strstr(mk[1].msg, bad[b].arg));
        CU_ASSERT_EQUAL(mk[0].st, BEAM_ERR_INVALID_ARGUMENT);
        CU_ASSERT_PTR_NOT_NULL(strstr(mk[0].msg, "rank 1 failed its own checks"));
        CU_ASSERT_PTR_NULL(mk[0].ws);
        CU_ASSERT_PTR_NULL(mk[1].ws);
        /* at once: well before rank 0's 30 s */
        CU_ASSERT(secs < 10.0);
        if (mk[0].st != BEAM_ERR_INVALID_ARGUMENT || mk[1].st != BEAM_ERR_INVALID_ARGUMENT || secs >= 10.0)
            fprintf(stderr, "create failure '%s' on rank 1: %.2f s; rank 0: %d %s; rank 1: %d %s\n",
                    bad[b].what, secs, (int)mk[0].st, mk[0].msg, (int)mk[1].st, mk[1].msg);
    }
    CU_ASSERT_EQUAL(beam_cpu_group_destroy(g), BEAM_OK);

    /* rank out of range: the peer has nobody to meet and times out */
    CU_ASSERT_EQUAL_FATAL(beam_cpu_group_create(2, &g), BEAM_OK);
    memset(mk, 0, sizeof mk);
    bcfg.timeout_ms = 300;
    for (k = 0; k < 2; k++) {
        mk[k].g = g;
        mk[k].rank = k ? 2 : 0;
        mk[k].max_tokens = 8;
        mk[k].hidden = 256;
        mk[k].cfg = &bcfg;
        pthread_create(&th[k], NULL, mk_main, &mk[k]);
    }
    for (k = 0; k < 2; k++)
        pthread_join(th[k], NULL);
    CU_ASSERT_EQUAL(mk[1].st, BEAM_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(mk[1].msg, "rank=2 must be in [0, 2)"));
    CU_ASSERT_EQUAL(mk[0].st, BEAM_ERR_COMM);
    CU_ASSERT_PTR_NOT_NULL(strstr(mk[0].msg, "timeout_ms=300"));
    CU_ASSERT_EQUAL(beam_cpu_group_destroy(g), BEAM_OK);
}

static double secs_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0->tv_nsec);
}

/* Both ranks' gathers on ws[] of case d, each on its thread: 1 when both
 * return the reference's bits. */
static int gather_both(beam_workspace *const *ws, gdata *d)
{
    ga_call ga[2];
    pthread_t th[2];
    int k, ok = 1;
    for (k = 0; k < 2; k++) {
        memset(&ga[k], 0, sizeof ga[k]);
        ga[k].ws = ws[k];
        ga[k].d = d;
        ga[k].r = k;
        ga[k].s = BEAM_STRATEGY_AUTO;
        pthread_create(&th[k], NULL, ga_main, &ga[k]);
    }
    for (k = 0; k < 2; k++) {
        pthread_join(th[k], NULL);
        if (ga[k].st != BEAM_OK || !outputs_exact(d, k)) {
            fprintf(stderr, "gather after a refused creation, rank %d: status %d %s\n", k, (int)ga[k].st,
                    ga[k].msg);
            ok = 0;
        }
    }
    return ok;
}

/* Both ranks of g make a workspace (8 x 512) into ws[], each on its
 * thread: 1 when both succeed. */
static int make_both(beam_cpu_group *g, const beam_workspace_config *cfg, beam_workspace **ws)
{
    mk_call mk[2];
    pthread_t th[2];
    int k, ok = 1;
    memset(mk, 0, sizeof mk);
    for (k = 0; k < 2; k++) {
        mk[k].g = g;
        mk[k].rank = k;
        mk[k].max_tokens = 8;
        mk[k].hidden = 512;
        mk[k].cfg = cfg;
        pthread_create(&th[k], NULL, mk_main, &mk[k]);
    }
    for (k = 0; k < 2; k++) {
        pthread_join(th[k], NULL);
        ok = ok && mk[k].st == BEAM_OK;
        ws[k] = mk[k].ws;
    }
    return ok;
}

/* A rank that already holds a workspace and creates another is refused at
 * once with that reason, whatever its timeout, without joining: its peers'
 * workspaces and the group keep working. A peer already waiting in a
 * creation then gives up at once with the reason; one that comes later
 * waits for its own timeout only, and the group is not broken by it. */
static void test_create_repeated(void)
{
    beam_cpu_group *g = NULL;
    beam_workspace_config cfg = beam_workspace_config_default();
    beam_workspace *ws[2] = {NULL, NULL};
    mk_call mk[2], again;
    pthread_t th[2];
    struct timespec t0;
    gcase c;
    gdata d;
    int k;
    cfg.timeout_ms = 400;
    gcase_small(&c, 5);
    gdata_make(&d, &c, 2, g_seed + 37);
    CU_ASSERT_EQUAL_FATAL(beam_cpu_group_create(2, &g), BEAM_OK);
    CU_ASSERT_FATAL(make_both(g, &cfg, ws));

    /* rank 0 again, alone, with the default 30 s timeout: at once */
    memset(&again, 0, sizeof again);
    again.g = g;
    again.rank = 0;
    again.max_tokens = 8;
    again.hidden = 512;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    mk_main(&again);
    CU_ASSERT(secs_since(&t0) < 0.2);
    CU_ASSERT_EQUAL(again.st, BEAM_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NULL(again.ws);
    CU_ASSERT_PTR_NOT_NULL(strstr(again.msg, "rank=0 already holds a workspace on this group"));
    CU_ASSERT(gather_both(ws, &d));

    /* rank 1 creates anew (30 s) and waits; rank 0's repeated creation
     * ends that wait at once, with the reason */
    CU_ASSERT_EQUAL(beam_workspace_destroy(ws[1]), BEAM_OK);
    memset(&mk[1], 0, sizeof mk[1]);
    mk[1].g = g;
    mk[1].rank = 1;
    mk[1].max_tokens = 8;
    mk[1].hidden = 512;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_create(&th[1], NULL, mk_main, &mk[1]);
    {
        struct timespec nap = {0, 100000000L};
        nanosleep(&nap, NULL); /* rank 1 is waiting by now (or soon: then it times out, below) */
    }
    again.ws = NULL;
    mk_main(&again);
    CU_ASSERT_EQUAL(again.st, BEAM_ERR_INVALID_ARGUMENT);
    pthread_join(th[1], NULL);
    CU_ASSERT(secs_since(&t0) < 5.0);
    CU_ASSERT_EQUAL(mk[1].st, BEAM_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(mk[1].msg, "rank 0 already holds a workspace on this group"));
    if (mk[1].st != BEAM_ERR_INVALID_ARGUMENT)
        fprintf(stderr, "rank 1 beside a refused creation: status %d: %s\n", (int)mk[1].st, mk[1].msg);

    /* rank 1 alone (400 ms): its own timeout, and the group is not broken */
    mk[1].cfg = &cfg;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    mk_main(&mk[1]);
    CU_ASSERT(secs_since(&t0) < 2.0);
    CU_ASSERT_EQUAL(mk[1].st, BEAM_ERR_COMM);
    CU_ASSERT_PTR_NOT_NULL(strstr(mk[1].msg, "timeout_ms=400; nothing was done"));

    /* both anew: a working pair again */
    CU_ASSERT_EQUAL(beam_workspace_destroy(ws[0]), BEAM_OK);
    CU_ASSERT_FATAL(make_both(g, &cfg, ws));
    for (k = 0; k < 2; k++) {
        hu_poison(d.hid[k], 2 * ((size_t)c.T + GUARD) * (size_t)c.H);
        hu_poison(d.nrm[k], 2 * ((size_t)c.T + GUARD) * (size_t)c.H);
    }
    CU_ASSERT(gather_both(ws, &d));
    for (k = 0; k < 2; k++)
        CU_ASSERT_EQUAL(beam_workspace_destroy(ws[k]), BEAM_OK);
    CU_ASSERT_EQUAL(beam_cpu_group_destroy(g), BEAM_OK);
    gdata_free(&d);
}

/* Non-collective argument errors of the group and workspace calls. */
static void test_group_args(void)
{
    beam_cpu_group *g = NULL;
    beam_workspace *ws = NULL;
    int32_t rk, nr;
    beam_workspace_config def = beam_workspace_config_default();
    /* defaults: a positive timeout, thresholds in order */
    CU_ASSERT(def.timeout_ms > 0);
    CU_ASSERT(def.oneshot_max_tokens >= 0);
    CU_ASSERT(def.twoshot_max_tokens >= def.oneshot_max_tokens);
    CU_ASSERT_EQUAL(beam_cpu_group_create(0, &g), BEAM_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "beam_cpu_group_create"));
    CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "nranks"));
    CU_ASSERT_EQUAL(beam_cpu_group_create(257, &g), BEAM_ERR_INVALID_ARGUMENT);
    CU_ASSERT_EQUAL(beam_cpu_group_create(-3, &g), BEAM_ERR_INVALID_ARGUMENT);
    CU_ASSERT_EQUAL(beam_cpu_group_create(2, NULL), BEAM_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NULL(g);
    CU_ASSERT_EQUAL(beam_cpu_group_create(2, &g), BEAM_OK);
    if (g) {
        /* rank outside [0, nranks): fails at once, before any collective wait */
        CU_ASSERT_EQUAL(beam_workspace_create_cpu(g, 2, 16, 512, NULL, &ws),
                        BEAM_ERR_INVALID_ARGUMENT);
        CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "rank"));
        CU_ASSERT_EQUAL(beam_workspace_create_cpu(g, -1, 16, 512, NULL, &ws),
                        BEAM_ERR_INVALID_ARGUMENT);
        CU_ASSERT_PTR_NULL(ws);
        CU_ASSERT_EQUAL(beam_cpu_group_destroy(g), BEAM_OK);
    }
    CU_ASSERT_NOT_EQUAL(beam_workspace_create_cpu(NULL, 0, 16, 512, NULL, &ws), BEAM_OK);
    CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "group"));
    CU_ASSERT_EQUAL(beam_workspace_destroy(NULL), BEAM_OK);
    CU_ASSERT_NOT_EQUAL(beam_workspace_info(NULL, &rk, &nr), BEAM_OK);
    /* a one-rank group: hidden and max_tokens are checked before anything */
    CU_ASSERT_EQUAL(beam_cpu_group_create(1, &g), BEAM_OK);
    if (g) {
        CU_ASSERT_EQUAL(beam_workspace_create_cpu(g, 0, 16, 300, NULL, &ws),
                        BEAM_ERR_INVALID_ARGUMENT);
        CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "hidden"));
        CU_ASSERT_EQUAL(beam_workspace_create_cpu(g, 0, -1, 512, NULL, &ws),
                        BEAM_ERR_INVALID_ARGUMENT);
        CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "max_tokens"));
        CU_ASSERT_EQUAL(beam_workspace_create_cpu(g, 0, 16, 512, NULL, NULL),
                        BEAM_ERR_INVALID_ARGUMENT);
        CU_ASSERT_EQUAL(beam_workspace_create_cpu(g, 0, 16, 512, NULL, &ws), BEAM_OK);
        if (ws) {
            CU_ASSERT_EQUAL(beam_workspace_info(ws, &rk, &nr), BEAM_OK);
            CU_ASSERT_EQUAL(rk, 0);
            CU_ASSERT_EQUAL(nr, 1);
            CU_ASSERT_EQUAL(beam_workspace_destroy(ws), BEAM_OK);
        }
        CU_ASSERT_EQUAL(beam_cpu_group_destroy(g), BEAM_OK);
    }
    /* the NCCL workspace belongs to the CUDA backend */
    CU_ASSERT_NOT_EQUAL(beam_workspace_create_nccl(NULL, 16, 512, NULL, &ws), BEAM_OK);
}

int main(void)
{
    static const suite_test tests[] = {{"group and workspace arguments", test_group_args},
                                    {"R=1", test_R1},
                                    {"R=2", test_R2},
                                    {"R=3", test_R3},
                                    {"R=4", test_R4},
                                    {"R=8", test_R8},
                                    {"back-to-back gathers", test_burst},
                                    {"invalid gathers fail on every rank", test_invalid},
                                    {"absent peer: timeout, not a hang", test_timeout},
                                    {"quantized output (_q), every form and strategy", test_quant},
                                    {"invalid _q gathers fail on every rank", test_quant_invalid},
                                    {"two caller threads per rank", test_two_callers},
                                    {"overlapping calls are refused", test_refusal},
                                    {"overlapping creations are refused", test_create_refusal},
                                    {"a failed creation fails its peers at once", test_create_failures},
                                    {"a repeated creation is refused at once, the group keeps working", test_create_repeated},
                                    {NULL, NULL}};
    g_seed = hu_seed("test_group");
    /* a hang is a failure: SIGALRM ends the program (default action) */
    alarm(hu_quick() ? 1200 : 300);
    if (beam_set_backend("cpu") != BEAM_OK) {
        fprintf(stderr, "beam_set_backend(cpu): %s\n", beam_last_error());
        return 1;
    }
    return suite_run("group", tests);
}
