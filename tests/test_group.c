/*
 * test_group.c - what only the CPU group does with its ranks: faults,
 * timeouts, thread races and the argument refusals of the CPU gather.
 * Its results over every R, T, strategy, norm and quantized form are
 * test_backends' gather part (every backend's in-process group, against
 * the naive reference); the cases here are the harness's
 * (hc_make_gather), with +-0 made +-1 (no_zeros).
 *
 * Each rank's call on a pthread of its own, a beam_cpu_group, a workspace
 * per rank (beam_workspace_create_cpu, collective). Rank r owns L = ceil(T/R)
 * tokens and passes the case's expert rows from row r*L (capacity past L,
 * NaN past its live rows); residual, hidden_out and normalized are full
 * [T, H] arrays on every rank.
 *
 * Invalid gathers (T > max_tokens, hidden mismatch, capacity < ceil(T/R) on
 * every rank or on one, strategy FUSED or unknown, ranks that disagree on a
 * collective argument, NULL workspace) must fail with
 * BEAM_ERR_INVALID_ARGUMENT on every rank, at once, and write nothing; so
 * must a bad quant on one rank, or ranks that pass different forms (the
 * _q gather: values and scales untouched too). A rank that never arrives
 * makes its peers return BEAM_ERR_COMM after the workspace's timeout; a
 * hang is caught by alarm().
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

/* CU_ASSERT(cond), and printf's arguments on standard error when it fails:
 * CUnit's report names the line only, not the rank or the message. */
#define CHECK_MSG(cond, ...)                                                             \
    do {                                                                                 \
        const int check_ok_ = (cond) ? 1 : 0;                                            \
        CU_assertImplementation(check_ok_, __LINE__, #cond, __FILE__, "", CU_FALSE);     \
        if (!check_ok_) fprintf(stderr, __VA_ARGS__);                                    \
    } while (0)

static uint64_t g_seed;

/* ---- one gather case ---------------------------------------------------- */

/* A case: T tokens, top_k K, hidden H, the norms (HC_NORM_*), scales. */
static hc_spec spec(int64_t T, int32_t K, int32_t H, int post, int next, int scales)
{
    const hc_spec s = {.K = K, .H = H, .T = T, .post = post, .next = next, .scales = scales};
    return s;
}

/* The case of the invalid-argument tests on their workspaces (16 x 512). */
static hc_spec spec_small(int64_t T)
{
    return spec(T, 4, 512, HC_NORM_PLAIN, HC_NORM_WEIGHT, 1);
}

/* A case of the harness for R ranks, its reference, and every rank's
 * outputs (T + GUARD rows of poison) and residual (a copy, or hidden_out
 * itself in place). */
typedef struct gdata {
    hc_case c;
    int R;
    int64_t L, cap; /* rows a rank owns (rank r's from row r * L), its capacity */
    beam_norm post, next;
    uint16_t *want_h, *want_n;
    uint16_t *res[MAXR], *hid[MAXR], *nrm[MAXR];
} gdata;

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

/* Rank r's outputs as before any call: poison (in place, hidden_out the
 * residual and poison past it). */
static void gdata_reset(gdata *d, int r)
{
    const size_t TH = (size_t)d->c.s.T * (size_t)d->c.s.H, ob = 2 * (TH + GUARD * (size_t)d->c.s.H);
    hu_poison(d->hid[r], ob);
    if (d->nrm[r])
        hu_poison(d->nrm[r], ob);
    if (d->c.s.inplace)
        memcpy(d->hid[r], d->c.residual, 2 * TH);
}

/* The case of spec s for R ranks from seed; rs > 0: its routed_scale. */
static void gdata_make(gdata *d, const hc_spec *s, int R, uint64_t seed, float rs)
{
    const size_t TH = (size_t)s->T * (size_t)s->H, ob = 2 * (TH + GUARD * (size_t)s->H);
    int r;
    memset(d, 0, sizeof *d);
    hc_make_gather(&d->c, s, R, seed);
    no_zeros(d->c.experts, (size_t)s->T * (size_t)s->K * (size_t)s->H);
    no_zeros(d->c.residual, TH);
    if (rs > 0.0f)
        d->c.rs = rs;
    d->R = R;
    d->L = (s->T + R - 1) / R;
    d->cap = d->c.cap - (R - 1) * d->L;
    hu_beam_norm(&d->c.post, &d->post);
    hu_beam_norm(&d->c.next, &d->next);
    d->want_h = (uint16_t *)hu_alloc(2 * TH, 0);
    d->want_n = (uint16_t *)hu_alloc(2 * TH, 0);
    hc_gather_ref(&d->c, R, s->T, d->want_h, d->want_n);
    for (r = 0; r < R; r++) {
        d->hid[r] = (uint16_t *)hu_alloc(ob, 0);
        d->nrm[r] = s->next ? (uint16_t *)hu_alloc(ob, 0) : NULL;
        d->res[r] = s->inplace ? d->hid[r] : (uint16_t *)hu_alloc(2 * TH, 0);
        memcpy(d->res[r], d->c.residual, 2 * TH);
        gdata_reset(d, r);
    }
}

static void gdata_free(gdata *d)
{
    int r;
    for (r = 0; r < d->R; r++) {
        if (d->res[r] != d->hid[r])
            hu_free(d->res[r]);
        hu_free(d->hid[r]);
        hu_free(d->nrm[r]);
    }
    hu_free(d->want_h);
    hu_free(d->want_n);
    hc_free(&d->c);
}

/* Rank r's outputs: every byte poison (after a refused call; in place,
 * hidden_out still the residual). */
static int outputs_untouched(const gdata *d, int r)
{
    const size_t TH = (size_t)d->c.s.T * (size_t)d->c.s.H, ob = 2 * (TH + GUARD * (size_t)d->c.s.H);
    return (d->c.s.inplace ? !memcmp(d->hid[r], d->c.residual, 2 * TH) && hu_is_poison(d->hid[r] + TH, ob - 2 * TH)
                           : hu_is_poison(d->hid[r], ob)) &&
           (!d->nrm[r] || hu_is_poison(d->nrm[r], ob));
}

/* Rank r's outputs: the reference's, the guard rows poison. */
static int outputs_exact(const gdata *d, int r)
{
    size_t TH = (size_t)d->c.s.T * (size_t)d->c.s.H, gb = 2 * GUARD * (size_t)d->c.s.H;
    return memcmp(d->hid[r], d->want_h, 2 * TH) == 0 && hu_is_poison(d->hid[r] + TH, gb) &&
           (!d->c.s.next || (memcmp(d->nrm[r], d->want_n, 2 * TH) == 0 && hu_is_poison(d->nrm[r] + TH, gb)));
}

/* ---- one call of one rank, on a thread of its own ----------------------- */

typedef enum call_kind { C_CREATE, C_GATHER, C_INFO, C_DESTROY } call_kind;

/* Each rank's call holds every argument of its own, so that a test makes
 * one rank differ from its peers by changing that rank's copy. CUnit
 * asserts run on the main thread only: the call just records what it got. */
typedef struct rcall {
    call_kind kind;
    beam_workspace *ws; /* create: the one made; else the one passed (may be NULL) */
    /* create */
    beam_cpu_group *g;
    int32_t rank, hidden;
    int64_t max_tokens;
    const beam_workspace_config *cfg;
    int null_out; /* pass NULL as the out-parameter */
    /* gather: the plain entry, or (use_q) the _q entry with quant (may be NULL) */
    const uint16_t *ex, *res;
    const float *wt, *scales;
    int64_t cap, T;
    int32_t K, H;
    float rs;
    const beam_norm *post, *next;
    uint16_t *hid, *nrm;
    const beam_quant *quant;
    beam_strategy s;
    int use_q, absent; /* absent: this rank never calls (the timeout test) */
    /* results */
    beam_status st;
    char msg[256];
    int32_t info_rank, info_n;
    int done;
} rcall;

static void *call_main(void *p)
{
    rcall *c = (rcall *)p;
    switch (c->kind) {
    case C_CREATE:
        c->st = beam_workspace_create_cpu(c->g, c->rank, c->max_tokens, c->hidden, c->cfg,
                                          c->null_out ? NULL : &c->ws);
        break;
    case C_GATHER:
        c->st = c->use_q ? beam_moe_finalize_gather_norm_residual_norm_q(
                               c->ws, c->ex, c->wt, c->cap, c->T, c->K, c->H, c->rs, c->post, c->res, c->scales,
                               c->next, c->hid, c->nrm, c->quant, c->s, NULL)
                         : beam_moe_finalize_gather_norm_residual_norm(c->ws, c->ex, c->wt, c->cap, c->T, c->K, c->H,
                                                                       c->rs, c->post, c->res, c->scales, c->next,
                                                                       c->hid, c->nrm, c->s, NULL);
        break;
    case C_INFO:
        c->st = beam_workspace_info(c->ws, &c->info_rank, &c->info_n);
        break;
    case C_DESTROY:
        c->st = beam_workspace_destroy(c->ws);
        break;
    }
    snprintf(c->msg, sizeof c->msg, "%s", c->st == BEAM_OK ? "" : beam_last_error());
    __atomic_store_n(&c->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Rank r's gather of case d on ws under strategy s, through the plain entry. */
static void call_gather(rcall *c, beam_workspace *ws, gdata *d, int r, beam_strategy s)
{
    const hc_spec *p = &d->c.s;
    const size_t r0 = (size_t)(r * d->L);
    const rcall g = {.kind = C_GATHER, .ws = ws, .ex = d->c.experts + r0 * (size_t)p->K * (size_t)p->H,
                     .res = d->res[r], .wt = d->c.weights + r0 * (size_t)p->K,
                     .scales = p->scales ? d->c.scales : NULL, .cap = d->cap, .T = p->T, .K = p->K, .H = p->H,
                     .rs = d->c.rs, .post = p->post ? &d->post : NULL, .next = p->next ? &d->next : NULL,
                     .hid = d->hid[r], .nrm = d->nrm[r], .s = s};
    *c = g;
}

/* That call, made now on this thread. */
static beam_status gdata_call(beam_workspace *ws, gdata *d, int r, beam_strategy s)
{
    rcall c;
    call_gather(&c, ws, d, r, s);
    call_main(&c);
    return c.st;
}

/* A creation of rank on g: max_tokens x hidden, cfg. */
static void call_create(rcall *c, beam_cpu_group *g, int32_t rank, int64_t max_tokens, int32_t hidden,
                        const beam_workspace_config *cfg)
{
    const rcall m = {.kind = C_CREATE, .g = g, .rank = rank, .max_tokens = max_tokens, .hidden = hidden, .cfg = cfg};
    *c = m;
}

/* The calls c[0..n) (but the absent), each on a thread of its own; done
 * when all returned. */
static void run_calls(rcall *c, int n)
{
    pthread_t th[MAXR];
    int k;
    for (k = 0; k < n; k++)
        if (!c[k].absent) pthread_create(&th[k], NULL, call_main, &c[k]);
    for (k = 0; k < n; k++)
        if (!c[k].absent) pthread_join(th[k], NULL);
}

/* The calls c[0] and c[1] of one rank at once, on threads th[0] and th[1]:
 * the one that returns first (waiting up to 10 s) is the one refused, at
 * once, with a message that names fn and the rule; its index (1 when
 * neither returns: the other checks fail then too). */
static int race(rcall *c, pthread_t *th, const char *fn)
{
    int k, t, lose = -1;
    for (k = 0; k < 2; k++)
        pthread_create(&th[k], NULL, call_main, &c[k]);
    for (t = 0; t < 10000 && lose < 0; t++) {
        struct timespec ts = {0, 1000000L};
        for (k = 0; k < 2 && lose < 0; k++)
            if (__atomic_load_n(&c[k].done, __ATOMIC_ACQUIRE))
                lose = k;
        if (lose < 0)
            nanosleep(&ts, NULL);
    }
    CU_ASSERT(lose >= 0);
    if (lose < 0) {
        fprintf(stderr, "%s: neither of two calls of one rank returned within 10 s\n", fn);
        lose = 1; /* the rest of the test lets the waiting ones end */
    }
    CU_ASSERT_EQUAL(c[lose].st, BEAM_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(c[lose].msg, fn));
    CHECK_MSG(strstr(c[lose].msg, "in progress on another thread") != NULL, "%s refused: status %d: %s\n", fn,
              (int)c[lose].st, c[lose].msg);
    return lose;
}

/* ---- a group of R ranks, a workspace each ------------------------------- */

typedef struct group {
    int R;
    beam_cpu_group *g;
    beam_workspace *ws[MAXR];
    rcall c[MAXR]; /* every rank's next call */
} group;

/* A group of R ranks with a workspace each (max_tokens, hidden H, the
 * timeout) that reports its rank and size; 0 when either could not be made
 * (the failure is recorded, the group destroyed). */
static int group_ws(group *G, int R, int64_t max_tokens, int32_t H, int32_t timeout_ms)
{
    beam_workspace_config cfg = beam_workspace_config_default();
    int r, ok = 1;
    cfg.timeout_ms = timeout_ms;
    memset(G, 0, sizeof *G);
    G->R = R;
    if (beam_cpu_group_create(R, &G->g) != BEAM_OK) {
        fprintf(stderr, "beam_cpu_group_create(%d): %s\n", R, beam_last_error());
        CU_FAIL("group create");
        return 0;
    }
    for (r = 0; r < R; r++)
        call_create(&G->c[r], G->g, r, max_tokens, H, &cfg);
    run_calls(G->c, R);
    for (r = 0; r < R; r++) {
        G->ws[r] = G->c[r].ws;
        G->c[r].kind = C_INFO;
        if (G->c[r].st != BEAM_OK) {
            fprintf(stderr, "workspace_create_cpu R=%d rank %d: %s\n", R, r, G->c[r].msg);
            ok = 0;
        }
    }
    CU_ASSERT(ok);
    if (!ok) {
        CU_ASSERT_EQUAL(beam_cpu_group_destroy(G->g), BEAM_OK);
        return 0;
    }
    run_calls(G->c, R);
    for (r = 0; r < R; r++) {
        CU_ASSERT_EQUAL(G->c[r].st, BEAM_OK);
        CU_ASSERT_EQUAL(G->c[r].info_rank, r);
        CU_ASSERT_EQUAL(G->c[r].info_n, R);
    }
    return 1;
}

/* Every rank's workspace destroyed, then the group. */
static void group_end(group *G)
{
    int r;
    for (r = 0; r < G->R; r++) {
        memset(&G->c[r], 0, sizeof G->c[r]);
        G->c[r].kind = C_DESTROY;
        G->c[r].ws = G->ws[r];
    }
    run_calls(G->c, G->R);
    for (r = 0; r < G->R; r++)
        CU_ASSERT_EQUAL(G->c[r].st, BEAM_OK);
    CU_ASSERT_EQUAL(beam_cpu_group_destroy(G->g), BEAM_OK);
}

/* Every rank's gather of case d under strategy s on its workspace. */
static void job_from(group *G, gdata *d, beam_strategy s)
{
    int r;
    for (r = 0; r < G->R; r++)
        call_gather(&G->c[r], G->ws[r], d, r, s);
}

/* One valid gather of spec s on every rank under strategy st: every
 * rank's outputs the reference's. */
static void run_valid(group *G, const hc_spec *s, beam_strategy st, uint64_t seed)
{
    gdata d;
    int r;
    gdata_make(&d, s, G->R, seed, 0.0f);
    job_from(G, &d, st);
    run_calls(G->c, G->R);
    for (r = 0; r < G->R; r++) {
        if (G->c[r].st != BEAM_OK || !outputs_exact(&d, r))
            fprintf(stderr, "FAIL seed=%llu R=%d rank=%d strategy %d: status %d: %s\n", (unsigned long long)seed,
                    G->R, r, (int)st, (int)G->c[r].st, G->c[r].msg);
        CU_ASSERT_EQUAL(G->c[r].st, BEAM_OK);
        CU_ASSERT(outputs_exact(&d, r));
    }
    gdata_free(&d);
}

/* ---- invalid gathers ---------------------------------------------------- */

/* Every rank must fail; no output byte on any rank may change. */
static void expect_all_fail(group *G, gdata *d, const char *what, const char *arg)
{
    int r;
    run_calls(G->c, G->R);
    for (r = 0; r < G->R; r++) {
        /* an argument error, found before any wait: not a peer timeout */
        CHECK_MSG(G->c[r].st == BEAM_ERR_INVALID_ARGUMENT, "FAIL invalid gather '%s' R=%d rank %d: status %d (%s)\n",
                  what, G->R, r, (int)G->c[r].st, G->c[r].msg);
        if (arg && G->c[r].st == BEAM_ERR_INVALID_ARGUMENT) {
            CU_ASSERT_PTR_NOT_NULL(strstr(G->c[r].msg, "beam_moe_finalize_gather_norm_residual_norm"));
            CHECK_MSG(strstr(G->c[r].msg, arg) != NULL, "message for '%s' does not name %s: %s\n", what, arg,
                      G->c[r].msg);
        }
        CHECK_MSG(outputs_untouched(d, r), "FAIL invalid gather '%s' R=%d rank %d wrote its outputs\n", what, G->R, r);
    }
}

static void test_invalid(void)
{
    static const beam_strategy bad_s[3] = {BEAM_STRATEGY_FUSED, (beam_strategy)99, (beam_strategy)-1};
    static const char *const bad_names[3] = {"strategy FUSED", "strategy 99", "strategy -1"};
    int R, k;
    for (R = 1; R <= 3; R++) {
        const hc_spec c = spec_small(7), big = spec_small(17), wide = spec(5, 4, 768, HC_NORM_PLAIN, HC_NORM_WEIGHT, 1);
        group G;
        gdata d, db, dw;
        int r;
        if (!group_ws(&G, R, 16, 512, 5000))
            continue;
        gdata_make(&d, &c, R, g_seed + 7, 0.0f);
        gdata_make(&db, &big, R, g_seed + 5, 0.0f);
        gdata_make(&dw, &wide, R, g_seed + 6, 0.0f);

        /* T > max_tokens; hidden mismatch: H = 768 on a hidden = 512 workspace */
        job_from(&G, &db, BEAM_STRATEGY_AUTO);
        expect_all_fail(&G, &db, "T > max_tokens", "tokens");
        job_from(&G, &dw, BEAM_STRATEGY_AUTO);
        expect_all_fail(&G, &dw, "hidden mismatch", "hidden");

        /* capacity < ceil(T/R) on every rank */
        job_from(&G, &d, BEAM_STRATEGY_TWOSHOT);
        for (r = 0; r < R; r++)
            G.c[r].cap = d.L - 1;
        expect_all_fail(&G, &d, "capacity < ceil(T/R)", "capacity");
        /* ... and on one rank only: its peers must learn it too (no rank
         * writes anything, and nobody waits for a timeout) */
        if (R > 1) {
            static float other[2] = {1.0f, 1.0f};
            job_from(&G, &d, BEAM_STRATEGY_ONESHOT);
            G.c[R - 1].cap = d.L - 1;
            expect_all_fail(&G, &d, "capacity < ceil(T/R) on the last rank", NULL);
            job_from(&G, &d, BEAM_STRATEGY_TWOSHOT);
            G.c[0].cap = d.L - 1;
            expect_all_fail(&G, &d, "capacity < ceil(T/R) on rank 0", NULL);
            job_from(&G, &d, BEAM_STRATEGY_UNFUSED);
            G.c[R - 1].cap = -1;
            expect_all_fail(&G, &d, "capacity -1 on the last rank", NULL);
            /* ranks that disagree on a collective argument: rank 0's
             * strategy, tokens, scales differ from its peers' */
            job_from(&G, &d, BEAM_STRATEGY_ONESHOT);
            G.c[0].s = BEAM_STRATEGY_TWOSHOT;
            expect_all_fail(&G, &d, "strategy", NULL);
            job_from(&G, &d, BEAM_STRATEGY_TWOSHOT);
            G.c[0].T = c.T - 1;
            expect_all_fail(&G, &d, "tokens", NULL);
            job_from(&G, &d, BEAM_STRATEGY_UNFUSED);
            G.c[0].scales = other;
            expect_all_fail(&G, &d, "scales", NULL);
        }

        /* strategies the gather does not take; a NULL workspace */
        for (k = 0; k < 3; k++) {
            job_from(&G, &d, bad_s[k]);
            expect_all_fail(&G, &d, bad_names[k], "strategy");
        }
        job_from(&G, &d, BEAM_STRATEGY_AUTO);
        for (r = 0; r < R; r++)
            G.c[r].ws = NULL;
        expect_all_fail(&G, &d, "NULL workspace", "workspace");
        gdata_free(&d);
        gdata_free(&db);
        gdata_free(&dw);

        /* the workspace still works after all that */
        run_valid(&G, &c, BEAM_STRATEGY_AUTO, g_seed + 10);
        run_valid(&G, &c, BEAM_STRATEGY_TWOSHOT, g_seed + 11);
        group_end(&G);
    }
}

/* A peer that never arrives: the others return BEAM_ERR_COMM after about
 * timeout_ms instead of hanging, and write nothing. The workspace is then
 * only destroyed. */
static void test_timeout(void)
{
    group G;
    gdata d;
    const hc_spec c = spec(9, 2, 256, HC_NORM_OFF, HC_NORM_PLAIN, 0);
    double t0;
    double secs;
    size_t ob;
    int r;
    if (!group_ws(&G, 3, 16, 256, 1000))
        return;
    gdata_make(&d, &c, 3, g_seed + 99, 0.0f);
    ob = 2 * ((size_t)c.T * (size_t)c.H + GUARD * (size_t)c.H);
    job_from(&G, &d, BEAM_STRATEGY_ONESHOT);
    G.c[2].absent = 1;
    t0 = hu_now();
    run_calls(G.c, G.R);
    secs = hu_now() - t0;
    for (r = 0; r < 2; r++) {
        CHECK_MSG(G.c[r].st == BEAM_ERR_COMM, "timeout: rank %d status %d (%s)\n", r, (int)G.c[r].st, G.c[r].msg);
        CU_ASSERT(hu_is_poison(d.hid[r], ob));
        CU_ASSERT(hu_is_poison(d.nrm[r], ob));
    }
    fprintf(stderr, "  (peer absent: returned after %.2f s, timeout 1 s)\n", secs);
    CU_ASSERT(secs < 10.0);
    gdata_free(&d);
    group_end(&G);
}

/* ---- invalid quantized outputs (_q) ------------------------------------- */

#define QGUARD 64      /* values bytes and scales floats checked past the extent */
#define QPOISON8 0x5Au /* values; scales get 0xFF bytes, a NaN no scale is */

/* Every rank's quantized output of one form, and the model's over the same
 * extent (poison where nothing may be written). */
typedef struct qout {
    int R;
    beam_quant q[MAXR];
    uint8_t *vals[MAXR], *want_v;
    float *sc[MAXR], *want_s;
    size_t nv, ns; /* bytes of values, floats of scales, guards included */
} qout;

static void qout_make(qout *o, const beam_quant *form, int R, int64_t T, int32_t H, const uint16_t *want_n)
{
    int r;
    memset(o, 0, sizeof *o);
    o->R = R;
    o->nv = qm_values_bytes(form, T, H) + QGUARD; /* 4-bit values: two a byte */
    o->ns = qm_scale_floats(form, T, H) + QGUARD;
    o->want_v = (uint8_t *)hu_alloc(o->nv, 0);
    o->want_s = (float *)hu_alloc(4 * o->ns, 0);
    memset(o->want_v, QPOISON8, o->nv);
    memset(o->want_s, 0xFF, 4 * o->ns);
    qm_quant(form, want_n, T, H, o->want_v, o->want_s);
    for (r = 0; r < R; r++) {
        o->vals[r] = (uint8_t *)hu_alloc(o->nv, 0);
        o->sc[r] = (float *)hu_alloc(4 * o->ns, 0);
        o->q[r] = *form;
        /* block-scaled: the scales array's bytes are the block scales */
        qm_bind(&o->q[r], o->vals[r], o->sc[r]);
    }
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

/* Fresh poison in every rank's outputs, quantized ones included. */
static void q_poison_outputs(gdata *d, qout *o)
{
    int r;
    for (r = 0; r < d->R; r++) {
        gdata_reset(d, r);
        memset(o->vals[r], QPOISON8, o->nv);
        memset(o->sc[r], 0xFF, 4 * o->ns);
    }
}

/* The _q gather of d on every rank under strategy s, with o's quant. */
static void q_job(group *G, gdata *d, qout *o, beam_strategy s)
{
    int r;
    job_from(G, d, s);
    for (r = 0; r < G->R; r++) {
        G->c[r].use_q = 1;
        G->c[r].quant = &o->q[r];
    }
}

/* Rank r's quant made odd's copy (for the caller to change). */
static beam_quant *odd_of(group *G, int r, beam_quant *odd)
{
    *odd = *G->c[r].quant;
    G->c[r].quant = odd;
    return odd;
}

/* Every rank fails with BEAM_ERR_INVALID_ARGUMENT and writes nothing,
 * values and scales included; rank bad's message names arg (bad < 0:
 * every rank's). */
static void q_expect_all_fail(group *G, gdata *d, qout *o, int bad, const char *arg, const char *what)
{
    int r;
    q_poison_outputs(d, o);
    expect_all_fail(G, d, what, NULL);
    for (r = 0; r < G->R; r++) {
        int untouched = 1;
        size_t i;
        for (i = 0; i < o->nv; i++)
            untouched &= o->vals[r][i] == QPOISON8;
        for (i = 0; i < 4 * o->ns; i++)
            untouched &= ((const uint8_t *)o->sc[r])[i] == 0xFF;
        CHECK_MSG(untouched, "FAIL invalid _q gather '%s' R=%d rank %d wrote its quantized output\n", what, G->R, r);
        if ((bad < 0 || r == bad) && !strstr(G->c[r].msg, arg)) {
            fprintf(stderr, "invalid _q gather '%s' R=%d rank %d: message does not name %s: %s\n", what,
                    G->R, r, arg, G->c[r].msg);
            CU_FAIL("message");
        }
    }
}

/* One rank's bad quant (or normalized NULL without one), and ranks that
 * pass different forms: every rank fails at once, nothing written; the
 * workspace works on. */
static void test_quant_invalid(void)
{
    int R, r;
    for (R = 1; R <= 3; R++) {
        const int last = R - 1;
        const hc_spec c = spec_small(7);
        const size_t TH = (size_t)c.T * (size_t)c.H;
        group G;
        gdata d;
        qout o;
        beam_quant form, odd;
        if (!group_ws(&G, R, 16, 512, 5000))
            continue;
        gdata_make(&d, &c, R, g_seed + 4711u + (uint64_t)R, 0.0f);
        memset(&form, 0, sizeof form);
        form.kind = BEAM_QUANT_FP8_GROUP;
        form.group_size = 128;
        qout_make(&o, &form, R, c.T, c.H, d.want_n);

        /* group_size 96 on the last rank */
        q_job(&G, &d, &o, BEAM_STRATEGY_ONESHOT);
        odd_of(&G, last, &odd)->group_size = 96;
        q_expect_all_fail(&G, &d, &o, last, "quant->group_size=96", "group_size 96 on the last rank");

        /* scales NULL on rank 0 */
        q_job(&G, &d, &o, BEAM_STRATEGY_TWOSHOT);
        odd_of(&G, 0, &odd)->scales = NULL;
        q_expect_all_fail(&G, &d, &o, 0, "quant->scales must not be NULL", "scales NULL on rank 0");

        /* normalized NULL without a quant on the last rank */
        q_job(&G, &d, &o, BEAM_STRATEGY_UNFUSED);
        G.c[last].quant = NULL;
        G.c[last].nrm = NULL;
        q_expect_all_fail(&G, &d, &o, last, "normalized must not be NULL",
                          "normalized NULL without a quant on the last rank");

        if (R > 1) {
            /* rank 0 quantizes per token, the others per group */
            q_job(&G, &d, &o, BEAM_STRATEGY_ONESHOT);
            odd_of(&G, 0, &odd)->kind = BEAM_QUANT_FP8_TOKEN;
            odd.group_size = 0;
            q_expect_all_fail(&G, &d, &o, -1, "passed different quant", "rank 0 per token, the others per group");
            /* the last rank without a quant (normalized kept), the others with */
            q_job(&G, &d, &o, BEAM_STRATEGY_TWOSHOT);
            G.c[last].quant = NULL;
            q_expect_all_fail(&G, &d, &o, -1, "passed different quant", "the last rank without a quant");
        }

        /* NULL workspace: the _q entry's own message */
        q_job(&G, &d, &o, BEAM_STRATEGY_AUTO);
        for (r = 0; r < R; r++)
            G.c[r].ws = NULL;
        q_expect_all_fail(&G, &d, &o, -1, "beam_moe_finalize_gather_norm_residual_norm_q: workspace must not be NULL",
                          "NULL workspace");

        /* each block-scaled kind of the model's forms (its first form):
         * block_scales NULL on the last rank; with more ranks and a global
         * scale, rank 0's global scale not the others' */
        {
            beam_quant forms[QM_NFORMS];
            int f;
            qm_forms(forms, c.T);
            for (f = 0; f < QM_NFORMS; f++) {
                qout ob;
                char label[64], what[160];
                if (!qm_block(&forms[f]) || (f > 0 && forms[f - 1].kind == forms[f].kind)) continue;
                qm_label(&forms[f], label, sizeof label);
                qout_make(&ob, &forms[f], R, c.T, c.H, d.want_n);
                q_job(&G, &d, &ob, BEAM_STRATEGY_ONESHOT);
                odd_of(&G, last, &odd)->block_scales = NULL;
                snprintf(what, sizeof what, "%s block_scales NULL on the last rank", label);
                q_expect_all_fail(&G, &d, &ob, last, "quant->block_scales", what);
                if (R > 1 && qm_global(&forms[f])) {
                    q_job(&G, &d, &ob, BEAM_STRATEGY_TWOSHOT);
                    odd_of(&G, 0, &odd)->scale = forms[f].scale == 1.0f ? 2.0f : 1.0f;
                    snprintf(what, sizeof what, "%s rank 0's global scale %g, the others' %g", label,
                             (double)odd.scale, (double)forms[f].scale);
                    q_expect_all_fail(&G, &d, &ob, -1, "passed different quant", what);
                }
                qout_free(&ob);
            }
        }

        /* the workspace still works after all that (normalized NULL) */
        q_poison_outputs(&d, &o);
        q_job(&G, &d, &o, BEAM_STRATEGY_AUTO);
        for (r = 0; r < R; r++) G.c[r].nrm = NULL;
        run_calls(G.c, G.R);
        for (r = 0; r < R; r++) {
            CHECK_MSG(G.c[r].st == BEAM_OK, "quant after the failures, rank %d: status %d: %s\n", r, (int)G.c[r].st,
                      G.c[r].msg);
            CU_ASSERT(!memcmp(d.hid[r], d.want_h, 2 * TH) && hu_is_poison(d.hid[r] + TH, 2 * GUARD * (size_t)c.H));
            CU_ASSERT(hu_is_poison(d.nrm[r], 2 * (TH + GUARD * (size_t)c.H)));
            CU_ASSERT(!memcmp(o.vals[r], o.want_v, o.nv) && !memcmp(o.sc[r], o.want_s, 4 * o.ns));
        }
        qout_free(&o);
        gdata_free(&d);
        group_end(&G);
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

/* counts: OK under each strategy, then what else happened */
enum { TT_WRONG = TT_STRATS, TT_REFUSED, TT_DISAGREED, TT_OTHER, TT_WROTE, TT_NSTATS };
typedef struct tt_stats {
    long n[TT_NSTATS];
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
        hc_spec c;
        gdata d;
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
        /* routed_scale unique per logical call and exact: 1 + k/8192, k < 8192 */
        gdata_make(&d, &c, 2, hu_next(&rng), 1.0f + (float)(key + 1) * (1.0f / 8192.0f));
        for (tries = 0;; tries++) {
            struct timespec ts = {0, 0};
            int refused;
            st = gdata_call(a->ws, &d, r, TT_STRAT[si]);
            if (st == BEAM_OK)
                break;
            if (!outputs_untouched(&d, r)) {
                a->s.n[TT_WROTE]++;
                tt_note(a, "a failed call wrote its outputs", i, st);
                gdata_reset(&d, r);
            }
            refused = strstr(beam_last_error(), "another call on this workspace is in progress") != NULL;
            if (st != BEAM_ERR_INVALID_ARGUMENT ||
                (!refused && !strstr(beam_last_error(), "passed different"))) {
                a->s.n[TT_OTHER]++;
                tt_note(a, "unexpected failure", i, st);
                break;
            }
            if (refused)
                a->s.n[TT_REFUSED]++;
            else
                a->s.n[TT_DISAGREED]++;
            /* Each try meets the right call about one time in two; a
             * thousand misses in a row means the calls no longer pair up
             * (this thread then stops, and its partner times out). */
            if (tries == 1000) {
                a->s.n[TT_OTHER]++;
                tt_note(a, "a thousand tries without meeting its partner's call", i, st);
                break;
            }
            ts.tv_nsec = 1000L * (1 + (long)hu_below(&pause, 40));
            nanosleep(&ts, NULL);
        }
        if (st == BEAM_OK) {
            a->s.n[si]++;
            if (!outputs_exact(&d, r)) {
                a->s.n[TT_WRONG]++;
                tt_note(a, "BEAM_OK with wrong bits", i, st);
            }
        }
        gdata_free(&d);
        if (st != BEAM_OK)
            break;
    }
    return NULL;
}

static void test_two_callers(void)
{
    group G;
    tt_arg args[2 * TT_THREADS];
    pthread_t th[2 * TT_THREADS];
    tt_stats sum;
    double t0;
    double secs;
    int k, si;
    /* no wait may time out when every call is accounted for; a short
     * timeout only bounds how long a broken run takes */
    if (!group_ws(&G, 2, 16, 256, 5000))
        return;
    memset(&sum, 0, sizeof sum);
    t0 = hu_now();
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
        for (si = 0; si < TT_NSTATS; si++)
            sum.n[si] += args[k].s.n[si];
        if (args[k].s.first[0])
            fprintf(stderr, "  first failure: %s\n", args[k].s.first);
    }
    secs = hu_now() - t0;
    fprintf(stderr,
            "  (%d calls to make: OK %ld ONESHOT, %ld TWOSHOT, %ld UNFUSED; %ld OK with wrong "
            "bits; %ld refused and made again; %ld failed the agreement and made again; %ld other "
            "failures; %ld failed calls wrote; %.2f s)\n",
            2 * TT_THREADS * args[0].n, sum.n[0], sum.n[1], sum.n[2], sum.n[TT_WRONG], sum.n[TT_REFUSED],
            sum.n[TT_DISAGREED], sum.n[TT_OTHER], sum.n[TT_WROTE], secs);
    CU_ASSERT_EQUAL(sum.n[TT_WRONG], 0);
    CU_ASSERT_EQUAL(sum.n[TT_WROTE], 0);
    CU_ASSERT_EQUAL(sum.n[TT_OTHER], 0);
    /* every logical call succeeded in the end, on both ranks (each one is
     * counted once per rank) */
    CU_ASSERT_EQUAL(sum.n[0] + sum.n[1] + sum.n[2], 2 * TT_THREADS * args[0].n);
    group_end(&G);
}
/* ---- refusals and creation failures ------------------------------------- */

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
    const hc_spec c = spec(7, 3, 256, HC_NORM_WEIGHT, HC_NORM_WEIGHT, 1);
    gdata d[3]; /* the same case three times: two callers on rank 0, one more */
    rcall call[2];
    pthread_t th[2];
    int k, win, lose;
    int32_t rk = -1, nr = -1;
    beam_status st;
    if (!group_ws(&G, 2, 16, 256, 20000))
        return;
    for (k = 0; k < 3; k++)
        gdata_make(&d[k], &c, 2, g_seed + 777, 0.0f);
    for (k = 0; k < 2; k++)
        call_gather(&call[k], G.ws[0], &d[k], 0, BEAM_STRATEGY_TWOSHOT);
    lose = race(call, th, fn); /* rank 1's call below lets a waiting one end */
    win = 1 - lose;
    CHECK_MSG(strstr(call[lose].msg, rule) != NULL, "refusal message: status %d: %s\n", (int)call[lose].st,
              call[lose].msg);
    CU_ASSERT(outputs_untouched(&d[lose], 0));
    /* the winner still waits for rank 1: this thread is a third caller */
    CU_ASSERT_FALSE(__atomic_load_n(&call[win].done, __ATOMIC_ACQUIRE));
    st = gdata_call(G.ws[0], &d[2], 0, BEAM_STRATEGY_TWOSHOT);
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
    st = gdata_call(G.ws[1], &d[win], 1, BEAM_STRATEGY_TWOSHOT);
    CHECK_MSG(st == BEAM_OK, "refusal: rank 1: status %d: %s\n", (int)st, beam_last_error());
    for (k = 0; k < 2; k++)
        pthread_join(th[k], NULL);
    CHECK_MSG(call[win].st == BEAM_OK, "refusal: the waiting call: status %d: %s\n", (int)call[win].st, call[win].msg);
    CU_ASSERT(outputs_exact(&d[win], 0));
    CU_ASSERT(outputs_exact(&d[win], 1));
    CU_ASSERT(outputs_untouched(&d[lose], 0));
    /* and the workspace goes on: one more call, from the rank threads */
    gdata_free(&d[2]);
    gdata_make(&d[2], &c, 2, g_seed + 778, 0.0f);
    job_from(&G, &d[2], BEAM_STRATEGY_ONESHOT);
    run_calls(G.c, G.R);
    for (k = 0; k < 2; k++) {
        CU_ASSERT_EQUAL(G.c[k].st, BEAM_OK);
        CU_ASSERT(outputs_exact(&d[2], k));
    }
    for (k = 0; k < 3; k++)
        gdata_free(&d[k]);
    group_end(&G);
}

/* Two threads create rank 0's workspace at once: one is refused without
 * joining, and the group cannot be destroyed while the other waits; rank
 * 1 then meets the waiting one. */
static void test_create_refusal(void)
{
    beam_cpu_group *g = NULL;
    beam_workspace_config cfg = beam_workspace_config_default();
    rcall mk[3];
    pthread_t th[2];
    int k, win, lose;
    cfg.timeout_ms = 20000;
    CU_ASSERT_EQUAL_FATAL(beam_cpu_group_create(2, &g), BEAM_OK);
    for (k = 0; k < 3; k++)
        call_create(&mk[k], g, k == 2 ? 1 : 0, 8, 256, &cfg);
    lose = race(mk, th, "beam_workspace_create_cpu");
    win = 1 - lose;
    CU_ASSERT_PTR_NULL(mk[lose].ws);
    CU_ASSERT_EQUAL(beam_cpu_group_destroy(g), BEAM_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "in progress"));
    call_main(&mk[2]); /* rank 1, on this thread */
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
    rcall mk[2];
    double t0;
    double secs;
    size_t b;
    CU_ASSERT_EQUAL_FATAL(beam_cpu_group_create(2, &g), BEAM_OK);
    for (b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        bcfg.timeout_ms = bad[b].timeout_ms;
        call_create(&mk[0], g, 0, 8, 256, NULL); /* rank 0: the defaults, 30 s */
        call_create(&mk[1], g, 1, bad[b].max_tokens, bad[b].hidden, &bcfg);
        mk[1].null_out = bad[b].null_out;
        t0 = hu_now();
        run_calls(mk, 2);
        secs = hu_now() - t0;
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
    bcfg.timeout_ms = 300;
    call_create(&mk[0], g, 0, 8, 256, &bcfg);
    call_create(&mk[1], g, 2, 8, 256, &bcfg);
    run_calls(mk, 2);
    CU_ASSERT_EQUAL(mk[1].st, BEAM_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(mk[1].msg, "rank=2 must be in [0, 2)"));
    CU_ASSERT_EQUAL(mk[0].st, BEAM_ERR_COMM);
    CU_ASSERT_PTR_NOT_NULL(strstr(mk[0].msg, "timeout_ms=300"));
    CU_ASSERT_EQUAL(beam_cpu_group_destroy(g), BEAM_OK);
}

/* Both ranks' gathers on ws[] of case d, each on its thread: 1 when both
 * return the reference's bits. */
static int gather_both(beam_workspace *const *ws, gdata *d)
{
    rcall ga[2];
    int k, ok = 1;
    for (k = 0; k < 2; k++)
        call_gather(&ga[k], ws[k], d, k, BEAM_STRATEGY_AUTO);
    run_calls(ga, 2);
    for (k = 0; k < 2; k++) {
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
    rcall mk[2];
    call_create(&mk[0], g, 0, 8, 512, cfg);
    call_create(&mk[1], g, 1, 8, 512, cfg);
    run_calls(mk, 2);
    ws[0] = mk[0].ws;
    ws[1] = mk[1].ws;
    return mk[0].st == BEAM_OK && mk[1].st == BEAM_OK;
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
    rcall mk[2], again;
    pthread_t th[2];
    double t0;
    const hc_spec c = spec_small(5);
    gdata d;
    int k;
    cfg.timeout_ms = 400;
    gdata_make(&d, &c, 2, g_seed + 37, 0.0f);
    CU_ASSERT_EQUAL_FATAL(beam_cpu_group_create(2, &g), BEAM_OK);
    CU_ASSERT_FATAL(make_both(g, &cfg, ws));

    /* rank 0 again, alone, with the default 30 s timeout: at once */
    call_create(&again, g, 0, 8, 512, NULL);
    t0 = hu_now();
    call_main(&again);
    CU_ASSERT(hu_now() - t0 < 0.2);
    CU_ASSERT_EQUAL(again.st, BEAM_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NULL(again.ws);
    CU_ASSERT_PTR_NOT_NULL(strstr(again.msg, "rank=0 already holds a workspace on this group"));
    CU_ASSERT(gather_both(ws, &d));

    /* rank 1 creates anew (30 s) and waits; rank 0's repeated creation
     * ends that wait at once, with the reason */
    CU_ASSERT_EQUAL(beam_workspace_destroy(ws[1]), BEAM_OK);
    call_create(&mk[1], g, 1, 8, 512, NULL);
    t0 = hu_now();
    pthread_create(&th[1], NULL, call_main, &mk[1]);
    {
        struct timespec nap = {0, 100000000L};
        nanosleep(&nap, NULL); /* rank 1 is waiting by now (or soon: then it times out, below) */
    }
    again.ws = NULL;
    call_main(&again);
    CU_ASSERT_EQUAL(again.st, BEAM_ERR_INVALID_ARGUMENT);
    pthread_join(th[1], NULL);
    CU_ASSERT(hu_now() - t0 < 5.0);
    CHECK_MSG(mk[1].st == BEAM_ERR_INVALID_ARGUMENT, "rank 1 beside a refused creation: status %d: %s\n",
              (int)mk[1].st, mk[1].msg);
    CU_ASSERT_PTR_NOT_NULL(strstr(mk[1].msg, "rank 0 already holds a workspace on this group"));

    /* rank 1 alone (400 ms): its own timeout, and the group is not broken */
    mk[1].cfg = &cfg;
    t0 = hu_now();
    call_main(&mk[1]);
    CU_ASSERT(hu_now() - t0 < 2.0);
    CU_ASSERT_EQUAL(mk[1].st, BEAM_ERR_COMM);
    CU_ASSERT_PTR_NOT_NULL(strstr(mk[1].msg, "timeout_ms=400; nothing was done"));

    /* both anew: a working pair again */
    CU_ASSERT_EQUAL(beam_workspace_destroy(ws[0]), BEAM_OK);
    CU_ASSERT_FATAL(make_both(g, &cfg, ws));
    for (k = 0; k < 2; k++)
        gdata_reset(&d, k);
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
                                       {"invalid gathers fail on every rank", test_invalid},
                                       {"absent peer: timeout, not a hang", test_timeout},
                                       {"invalid _q gathers fail on every rank", test_quant_invalid},
                                       {"two caller threads per rank", test_two_callers},
                                       {"overlapping calls are refused", test_refusal},
                                       {"overlapping creations are refused", test_create_refusal},
                                       {"a failed creation fails its peers at once", test_create_failures},
                                       {"a repeated creation is refused at once, the group keeps working",
                                        test_create_repeated},
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