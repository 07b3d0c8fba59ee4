/*
 * test_oom.c - no host memory for the CPU backend's per-call scratch: every
 * local op and the CPU gather (plain and _q, whose normalized rows to
 * quantize are allocated too) return BEAM_ERR_OUT_OF_MEMORY with a message
 * naming the function called (the _q one for a _q call), write nothing (outputs keep their poison, an
 * in-place residual keeps its values) and do not crash; with memory back, the
 * same calls give the reference's bits.
 *
 * Allocation failures are injected by this program's own malloc, which the
 * library's calls reach through ELF symbol interposition: while a thread is
 * armed, its n-th allocation of at least BIG bytes returns NULL (the
 * library's scratch and UNFUSED rows are that large, the OpenMP runtime's
 * bookkeeping is not). Skipped (77) where that cannot work: AddressSanitizer
 * builds (its allocator owns malloc), C libraries other than glibc, and
 * tools such as valgrind that replace malloc themselves (checked at run
 * time).
 *
 * Links libbeammoe_cpu directly.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "suite.h" /* BEAM_TEST_ASAN */

#if defined(__GLIBC__) && !defined(BEAM_TEST_ASAN)
#define BEAM_TEST_INJECT 1
#endif

#ifndef BEAM_TEST_INJECT

int main(void)
{
    fprintf(stderr, "test_oom: malloc cannot be interposed in this build (sanitizers or not glibc): "
                    "skipped\n");
    return 77;
}

#else

#include <pthread.h>

#include <CUnit/Basic.h>

#define BIG ((size_t)32 * 1024)

extern void *__libc_malloc(size_t n);

static __thread int t_fail_nth; /* 0: not armed */
static __thread int t_big_seen;

/* default visibility: the build hides symbols by default, and the
 * library's calls must find this definition */
__attribute__((visibility("default"))) void *malloc(size_t n)
{
    if (t_fail_nth && n >= BIG && ++t_big_seen == t_fail_nth) return NULL;
    return __libc_malloc(n);
}

static void arm(int nth)
{
    t_fail_nth = nth;
    t_big_seen = 0;
}

static void disarm(void)
{
    t_fail_nth = 0;
}

static uint64_t g_seed;

enum { K = 8, H = 7168 };

/* A case of the harness (every norm with a weight, scales) with T rows,
 * outputs, and a copy of its residual (in-place calls write it). */
typedef struct bufs {
    hc_case c;
    uint16_t *res_copy, *hid, *nrm;
    beam_norm post, pre, next;
} bufs;

static void bufs_make(bufs *b, int64_t T)
{
    const hc_spec s = {.K = K, .H = H, .T = T, .post = HC_NORM_WEIGHT, .pre = HC_NORM_WEIGHT, .next = HC_NORM_WEIGHT,
                       .scales = 1};
    const size_t TH = (size_t)T * H;
    hc_make(&b->c, &s, g_seed + (uint64_t)T);
    b->res_copy = (uint16_t *)hu_alloc(2 * TH, 0);
    b->hid = (uint16_t *)hu_alloc(2 * TH, 0);
    b->nrm = (uint16_t *)hu_alloc(2 * TH, 0);
    memcpy(b->res_copy, b->c.residual, 2 * TH);
    hu_beam_norm(&b->c.post, &b->post);
    hu_beam_norm(&b->c.pre, &b->pre);
    hu_beam_norm(&b->c.next, &b->next);
}

static void bufs_free(bufs *b)
{
    hu_free(b->res_copy);
    hu_free(b->hid);
    hu_free(b->nrm);
    hc_free(&b->c);
}

static void poison_outputs(bufs *b)
{
    size_t TH = (size_t)b->c.s.T * H;
    hu_poison(b->hid, 2 * TH);
    hu_poison(b->nrm, 2 * TH);
    memcpy(b->c.residual, b->res_copy, 2 * TH);
}

/* Fresh outputs, and this thread's nth large allocation from now on fails. */
static void arm_on(bufs *b, int nth)
{
    poison_outputs(b);
    arm(nth);
}

/* After a call armed by arm_on (st: its status): out of memory, the
 * message names fn, nothing written. */
static void expect_oom(const bufs *b, beam_status st, const char *fn, const char *what)
{
    size_t TH = (size_t)b->c.s.T * H;
    disarm();
    if (st != BEAM_ERR_OUT_OF_MEMORY)
        fprintf(stderr, "FAIL %s T=%lld: status %d (%s)\n", what, (long long)b->c.s.T, (int)st, beam_last_error());
    CU_ASSERT_EQUAL(st, BEAM_ERR_OUT_OF_MEMORY);
    CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), fn));
    CU_ASSERT(hu_is_poison(b->hid, 2 * TH));
    CU_ASSERT(hu_is_poison(b->nrm, 2 * TH));
    CU_ASSERT(memcmp(b->c.residual, b->res_copy, 2 * TH) == 0);
}

/* One call with a team before any allocation is made to fail: the OpenMP
 * runtime allocates its own large blocks when it starts (LLVM's libomp
 * does, at the first query of the thread count), and the failure injected
 * here is meant for the library's scratch, not for the runtime. */
static void warm_up_runtime(void)
{
    bufs b;
    bufs_make(&b, 64);
    CU_ASSERT_EQUAL(beam_moe_finalize(b.c.experts, b.c.weights, 64, 64, K, H, 1.0f, NULL, b.hid, NULL), BEAM_OK);
    bufs_free(&b);
}

static void test_local_ops(void)
{
    static const int64_t Ts[2] = {1, 64}; /* the calling thread alone, and a team */
    int i, nth;
    warm_up_runtime();
    for (i = 0; i < 2; i++) {
        bufs b;
        const int64_t T = Ts[i];
        const size_t TH = (size_t)T * H;
        uint16_t *ref_h = (uint16_t *)hu_alloc(2 * TH, 0), *ref_n = (uint16_t *)hu_alloc(2 * TH, 0);
        bufs_make(&b, T);
        const uint16_t *ex = b.c.experts, *x = b.c.x;
        const float *wt = b.c.weights, *sc = b.c.scales, rs = b.c.rs;
        uint16_t *res = b.c.residual;

        /* finalize with a post-norm */
        arm_on(&b, 1);
        expect_oom(&b, beam_moe_finalize(ex, wt, T, T, K, H, rs, &b.post, b.hid, NULL), "beam_moe_finalize",
                   "finalize");
        hc_ref(&b.c, HC_FINALIZE, ref_h, ref_n);
        CU_ASSERT_EQUAL(beam_moe_finalize(ex, wt, T, T, K, H, rs, &b.post, b.hid, NULL), BEAM_OK);
        CU_ASSERT_EQUAL(hu_cmp_bf16("finalize after OOM", b.hid, ref_h, TH), 0);

        /* norm_residual_norm, pre and next norms, in place */
        arm_on(&b, 1);
        expect_oom(&b, beam_norm_residual_norm(x, res, T, H, &b.pre, sc, &b.next, res, b.nrm, NULL),
                   "beam_norm_residual_norm", "nrn");
        hc_ref(&b.c, HC_NRN, ref_h, ref_n);
        CU_ASSERT_EQUAL(beam_norm_residual_norm(x, res, T, H, &b.pre, sc, &b.next, res, b.nrm, NULL), BEAM_OK);
        CU_ASSERT_EQUAL(hu_cmp_bf16("nrn after OOM", res, ref_h, TH), 0);
        CU_ASSERT_EQUAL(hu_cmp_bf16("nrn after OOM", b.nrm, ref_n, TH), 0);

        /* the _q forms with normalized NULL (its rows to quantize are
         * allocated too): the message names the _q function, not the
         * plain one the backend runs */
        {
            float *qs = (float *)hu_alloc(4 * (TH / 128), 0);
            beam_quant q;
            memset(&q, 0, sizeof q);
            q.kind = BEAM_QUANT_FP8_GROUP;
            q.group_size = 128;
            q.values = (uint8_t *)b.nrm; /* stays poison when nothing is written */
            q.scales = qs;
            arm_on(&b, 1);
            expect_oom(&b, beam_norm_residual_norm_q(x, res, T, H, &b.pre, sc, &b.next, b.hid, NULL, &q, NULL),
                       "beam_norm_residual_norm_q:", "nrn _q");
            arm_on(&b, 1);
            expect_oom(&b,
                       beam_moe_finalize_norm_residual_norm_q(ex, wt, T, T, K, H, rs, &b.post, res, sc, &b.next, b.hid,
                                                              NULL, &q, BEAM_STRATEGY_FUSED, NULL),
                       "beam_moe_finalize_norm_residual_norm_q:", "fused _q");
            hu_free(qs);
        }

        /* the fused op: FUSED (one allocation), UNFUSED (the rows, then the
         * scratch: either may fail) */
        poison_outputs(&b);
        hc_ref(&b.c, HC_FUSED, ref_h, ref_n);
        for (nth = 0; nth < (T > 1 ? 3 : 2); nth++) { /* T = 1: the rows are small */
            beam_strategy s = nth == 0 ? BEAM_STRATEGY_FUSED : BEAM_STRATEGY_UNFUSED;
            arm_on(&b, nth == 0 ? 1 : nth);
            expect_oom(&b,
                       beam_moe_finalize_norm_residual_norm(ex, wt, T, T, K, H, rs, &b.post, res, sc, &b.next, b.hid,
                                                            b.nrm, s, NULL),
                       "beam_moe_finalize_norm_residual_norm", "fused");
            CU_ASSERT_EQUAL(beam_moe_finalize_norm_residual_norm(ex, wt, T, T, K, H, rs, &b.post, res, sc, &b.next,
                                                                 b.hid, b.nrm, s, NULL),
                            BEAM_OK);
            CU_ASSERT_EQUAL(hu_cmp_bf16("fused after OOM", b.hid, ref_h, TH), 0);
            CU_ASSERT_EQUAL(hu_cmp_bf16("fused after OOM", b.nrm, ref_n, TH), 0);
        }
        hu_free(ref_h);
        hu_free(ref_n);
        bufs_free(&b);
    }
}

/* ---- the CPU gather: one rank without memory fails every rank ------------ */

#define R 2

typedef struct rank_job {
    beam_cpu_group *g;
    int rank, armed; /* armed: this rank's armed-th large allocation fails */
    bufs *b;
    beam_strategy strategy;
    uint16_t *hid, *nrm;
    /* quant != NULL: the _q gather with normalized NULL (nrm stays poison) */
    beam_quant *quant;
    uint8_t *vals;
    float *sc;
    beam_status create_st, st;
    char msg[300];
} rank_job;

static void *rank_main(void *p)
{
    rank_job *j = (rank_job *)p;
    const hc_case *c = &j->b->c;
    const int64_t T = c->s.T, L = (T + R - 1) / R, start = (int64_t)j->rank * L;
    const uint16_t *ex = c->experts + (size_t)start * K * H;
    const float *wt = c->weights + (size_t)start * K;
    beam_workspace *ws = NULL;
    j->create_st = beam_workspace_create_cpu(j->g, j->rank, T, H, NULL, &ws);
    if (j->create_st != BEAM_OK) return NULL;
    if (j->armed) arm(j->armed);
    if (j->quant)
        j->st = beam_moe_finalize_gather_norm_residual_norm_q(ws, ex, wt, L, T, K, H, c->rs, &j->b->post, c->residual,
                                                              c->scales, &j->b->next, j->hid, NULL, j->quant,
                                                              j->strategy, NULL);
    else
        j->st = beam_moe_finalize_gather_norm_residual_norm(ws, ex, wt, L, T, K, H, c->rs, &j->b->post, c->residual,
                                                            c->scales, &j->b->next, j->hid, j->nrm, j->strategy, NULL);
    disarm();
    snprintf(j->msg, sizeof j->msg, "%s", beam_last_error());
    beam_workspace_destroy(ws);
    return NULL;
}

/* The gather (quant: the _q one with normalized NULL, which allocates two
 * large blocks on each rank before the agreement: the scratch, then the
 * normalized rows it quantizes from) with rank 1 without memory for the
 * first (or the second) of its large blocks: every rank fails with
 * BEAM_ERR_OUT_OF_MEMORY (rank 1 naming the allocation), nothing written
 * (hidden, normalized, values, scales); with memory, every rank gives the
 * reference's bits. */
static void run_gather(int quant)
{
    static const beam_strategy strats[3] = {BEAM_STRATEGY_ONESHOT, BEAM_STRATEGY_TWOSHOT,
                                            BEAM_STRATEGY_UNFUSED};
    const char *fn =
        quant ? "beam_moe_finalize_gather_norm_residual_norm_q" : "beam_moe_finalize_gather_norm_residual_norm";
    bufs b;
    const int64_t T = 8;
    const size_t TH = (size_t)T * H;
    uint16_t *ref_h = (uint16_t *)hu_alloc(2 * TH, 0), *ref_n = (uint16_t *)hu_alloc(2 * TH, 0);
    int k, r, armed;

    bufs_make(&b, T);
    hc_ref(&b.c, HC_FUSED, ref_h, ref_n);
    for (k = 0; k < 3; k++)
        for (armed = quant ? 2 : 1; armed >= 0; armed--) {
            const beam_status want = armed ? BEAM_ERR_OUT_OF_MEMORY : BEAM_OK;
            beam_cpu_group *g = NULL;
            rank_job jobs[R];
            beam_quant q[R];
            pthread_t th[R];
            CU_ASSERT_EQUAL_FATAL(beam_cpu_group_create(R, &g), BEAM_OK);
            for (r = 0; r < R; r++) {
                rank_job *j = &jobs[r];
                memset(j, 0, sizeof *j);
                j->g = g;
                j->rank = r;
                j->armed = r == 1 ? armed : 0;
                j->b = &b;
                j->strategy = strats[k];
                j->hid = (uint16_t *)hu_alloc(2 * TH, 0);
                j->nrm = (uint16_t *)hu_alloc(2 * TH, 0);
                j->vals = (uint8_t *)hu_alloc(TH, 0);
                j->sc = (float *)hu_alloc(4 * (size_t)T, 0);
                hu_poison(j->hid, 2 * TH);
                hu_poison(j->nrm, 2 * TH);
                hu_poison(j->vals, TH);
                hu_poison(j->sc, 4 * (size_t)T);
                memset(&q[r], 0, sizeof q[r]);
                q[r].kind = BEAM_QUANT_FP8_TOKEN;
                q[r].values = j->vals;
                q[r].scales = j->sc;
                j->quant = quant ? &q[r] : NULL;
                CU_ASSERT_EQUAL_FATAL(pthread_create(&th[r], NULL, rank_main, j), 0);
            }
            for (r = 0; r < R; r++) pthread_join(th[r], NULL);
            for (r = 0; r < R; r++) {
                rank_job *j = &jobs[r];
                CU_ASSERT_EQUAL(j->create_st, BEAM_OK);
                CU_ASSERT_EQUAL(j->st, want);
                if (armed) {
                    /* rank 1 had no memory; rank 0 learns it at the agreement */
                    CU_ASSERT_PTR_NOT_NULL(strstr(j->msg, fn));
                    /* rank 1 names the allocation that failed */
                    if (quant && r == 1)
                        CU_ASSERT_PTR_NOT_NULL(
                            strstr(j->msg, armed == 1 ? "scratch rows" : "normalized rows to quantize"));
                    CU_ASSERT(hu_is_poison(j->hid, 2 * TH));
                    CU_ASSERT(hu_is_poison(j->vals, TH));
                    CU_ASSERT(hu_is_poison(j->sc, 4 * (size_t)T));
                } else {
                    CU_ASSERT_EQUAL(hu_cmp_bf16("gather after OOM", j->hid, ref_h, TH), 0);
                    CU_ASSERT(quant ? !hu_is_poison(j->vals, TH) : !hu_cmp_bf16("gather after OOM", j->nrm, ref_n, TH));
                }
                if (quant || armed)
                    CU_ASSERT(hu_is_poison(j->nrm, 2 * TH));
                if (j->st != want)
                    fprintf(stderr, "FAIL %s strategy=%d armed=%d rank=%d: status %d: %s\n", fn, (int)strats[k], armed,
                            r, (int)j->st, j->msg);
                hu_free(j->hid);
                hu_free(j->nrm);
                hu_free(j->vals);
                hu_free(j->sc);
            }
            CU_ASSERT_EQUAL(beam_cpu_group_destroy(g), BEAM_OK);
        }
    hu_free(ref_h);
    hu_free(ref_n);
    bufs_free(&b);
}

static void test_gather(void)
{
    run_gather(0);
}

static void test_gather_q(void)
{
    run_gather(1);
}

int main(void)
{
    static const suite_test tests[] = {{"local ops without scratch memory", test_local_ops},
                                    {"CPU gather with a rank without memory", test_gather},
                                    {"CPU _q gather with a rank without memory", test_gather_q},
                                    {NULL, NULL}};
    void *(*volatile m)(size_t) = malloc;
    void *p;
    arm(1);
    p = m(BIG);
    disarm();
    if (p) {
        free(p);
        fprintf(stderr, "test_oom: this program's malloc is not the one called (valgrind?): skipped\n");
        return 77;
    }
    g_seed = hu_seed("test_oom");
    return suite_run("oom", tests);
}

#endif
