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

typedef struct bufs {
    int64_t T;
    uint16_t *ex, *x, *res, *res_copy, *hid, *nrm, *wn;
    float *wt;
    float scales[2];
} bufs;

static void bufs_make(bufs *b, int64_t T)
{
    hu_rng r;
    size_t TH = (size_t)T * H;
    int h;
    memset(b, 0, sizeof *b);
    b->T = T;
    hu_rng_init(&r, g_seed + (uint64_t)T);
    b->ex = (uint16_t *)hu_alloc(2 * TH * K, 0);
    b->wt = (float *)hu_alloc(4 * (size_t)T * K, 0);
    b->x = (uint16_t *)hu_alloc(2 * TH, 0);
    b->res = (uint16_t *)hu_alloc(2 * TH, 0);
    b->res_copy = (uint16_t *)hu_alloc(2 * TH, 0);
    b->hid = (uint16_t *)hu_alloc(2 * TH, 0);
    b->nrm = (uint16_t *)hu_alloc(2 * TH, 0);
    b->wn = (uint16_t *)hu_alloc(2 * H, 0);
    hu_fill_bf16(&r, b->ex, TH * K);
    hu_fill_weight(&r, b->wt, (size_t)T * K);
    hu_fill_bf16(&r, b->x, TH);
    hu_fill_bf16(&r, b->res, TH);
    memcpy(b->res_copy, b->res, 2 * TH);
    for (h = 0; h < H; h++) b->wn[h] = hu_rand_norm_weight(&r);
    b->scales[0] = 0.75f;
    b->scales[1] = 1.5f;
}

static void bufs_free(bufs *b)
{
    hu_free(b->ex);
    hu_free(b->wt);
    hu_free(b->x);
    hu_free(b->res);
    hu_free(b->res_copy);
    hu_free(b->hid);
    hu_free(b->nrm);
    hu_free(b->wn);
}

static void poison_outputs(bufs *b)
{
    size_t TH = (size_t)b->T * H;
    hu_poison(b->hid, 2 * TH);
    hu_poison(b->nrm, 2 * TH);
    memcpy(b->res, b->res_copy, 2 * TH);
}

/* After a failed call: status, message, nothing written. */
static void expect_oom(const bufs *b, beam_status st, const char *fn, const char *what)
{
    size_t TH = (size_t)b->T * H;
    if (st != BEAM_ERR_OUT_OF_MEMORY)
        fprintf(stderr, "FAIL %s T=%lld: status %d (%s)\n", what, (long long)b->T, (int)st, beam_last_error());
    CU_ASSERT_EQUAL(st, BEAM_ERR_OUT_OF_MEMORY);
    CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), fn));
    CU_ASSERT(hu_is_poison(b->hid, 2 * TH));
    CU_ASSERT(hu_is_poison(b->nrm, 2 * TH));
    CU_ASSERT(memcmp(b->res, b->res_copy, 2 * TH) == 0);
}

/* One call with a team before any allocation is made to fail: the OpenMP
 * runtime allocates its own large blocks when it starts (LLVM's libomp
 * does, at the first query of the thread count), and the failure injected
 * here is meant for the library's scratch, not for the runtime. */
static void warm_up_runtime(void)
{
    bufs b;
    bufs_make(&b, 64);
    CU_ASSERT_EQUAL(beam_moe_finalize(b.ex, b.wt, 64, 64, K, H, 1.0f, NULL, b.hid, NULL), BEAM_OK);
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
        beam_norm n = {NULL, 1e-6f};
        nr_norm rn = {1, NULL, 1e-6f};
        uint16_t *ref_h = (uint16_t *)hu_alloc(2 * TH, 0), *ref_n = (uint16_t *)hu_alloc(2 * TH, 0);
        beam_status st;
        bufs_make(&b, T);
        n.weight = rn.weight = b.wn;

        /* finalize with a post-norm */
        poison_outputs(&b);
        arm(1);
        st = beam_moe_finalize(b.ex, b.wt, T, T, K, H, 2.0f, &n, b.hid, NULL);
        disarm();
        expect_oom(&b, st, "beam_moe_finalize", "finalize");
        nr_finalize(b.ex, b.wt, T, K, H, 2.0f, &rn, ref_h);
        CU_ASSERT_EQUAL(beam_moe_finalize(b.ex, b.wt, T, T, K, H, 2.0f, &n, b.hid, NULL), BEAM_OK);
        CU_ASSERT_EQUAL(hu_cmp_bf16("finalize after OOM", b.hid, ref_h, TH), 0);

        /* norm_residual_norm, pre and next norms, in place */
        poison_outputs(&b);
        hu_poison(b.hid, 2 * TH);
        arm(1);
        st = beam_norm_residual_norm(b.x, b.res, T, H, &n, b.scales, &n, b.res, b.nrm, NULL);
        disarm();
        expect_oom(&b, st, "beam_norm_residual_norm", "nrn");
        nr_norm_residual_norm(b.x, b.res_copy, T, H, &rn, b.scales, &rn, ref_h, ref_n);
        CU_ASSERT_EQUAL(beam_norm_residual_norm(b.x, b.res, T, H, &n, b.scales, &n, b.res, b.nrm, NULL),
                        BEAM_OK);
        CU_ASSERT_EQUAL(hu_cmp_bf16("nrn after OOM", b.res, ref_h, TH), 0);
        CU_ASSERT_EQUAL(hu_cmp_bf16("nrn after OOM", b.nrm, ref_n, TH), 0);

        /* the _q forms with normalized NULL (its rows to quantize are
         * allocated too): the message names the _q function, not the
         * plain one the backend runs */
        {
            float *sc = (float *)hu_alloc(4 * (TH / 128), 0);
            beam_quant q;
            memset(&q, 0, sizeof q);
            q.kind = BEAM_QUANT_FP8_GROUP;
            q.group_size = 128;
            q.values = (uint8_t *)b.nrm; /* stays poison when nothing is written */
            q.scales = sc;
            poison_outputs(&b);
            arm(1);
            st = beam_norm_residual_norm_q(b.x, b.res, T, H, &n, b.scales, &n, b.hid, NULL, &q, NULL);
            disarm();
            expect_oom(&b, st, "beam_norm_residual_norm_q:", "nrn _q");
            poison_outputs(&b);
            arm(1);
            st = beam_moe_finalize_norm_residual_norm_q(b.ex, b.wt, T, T, K, H, 2.0f, &n, b.res, b.scales, &n,
                                                        b.hid, NULL, &q, BEAM_STRATEGY_FUSED, NULL);
            disarm();
            expect_oom(&b, st, "beam_moe_finalize_norm_residual_norm_q:", "fused _q");
            hu_free(sc);
        }

        /* the fused op: FUSED (one allocation), UNFUSED (the rows, then the
         * scratch: either may fail) */
        nr_finalize_norm_residual_norm(b.ex, b.wt, T, K, H, 2.0f, &rn, b.res_copy, b.scales, &rn, ref_h,
                                       ref_n);
        for (nth = 0; nth < (T > 1 ? 3 : 2); nth++) { /* T = 1: the rows are small */
            beam_strategy s = nth == 0 ? BEAM_STRATEGY_FUSED : BEAM_STRATEGY_UNFUSED;
            poison_outputs(&b);
            arm(nth == 0 ? 1 : nth);
            st = beam_moe_finalize_norm_residual_norm(b.ex, b.wt, T, T, K, H, 2.0f, &n, b.res, b.scales, &n,
                                                      b.hid, b.nrm, s, NULL);
            disarm();
            expect_oom(&b, st, "beam_moe_finalize_norm_residual_norm", "fused");
            CU_ASSERT_EQUAL(beam_moe_finalize_norm_residual_norm(b.ex, b.wt, T, T, K, H, 2.0f, &n, b.res,
                                                                 b.scales, &n, b.hid, b.nrm, s, NULL),
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
    const beam_quant *quant;
    beam_status create_st, st;
    char msg[300];
} rank_job;

static void *rank_main(void *p)
{
    rank_job *j = (rank_job *)p;
    bufs *b = j->b;
    const int64_t L = (b->T + R - 1) / R, start = (int64_t)j->rank * L;
    beam_norm n = {b->wn, 1e-6f};
    beam_workspace *ws = NULL;
    j->create_st = beam_workspace_create_cpu(j->g, j->rank, b->T, H, NULL, &ws);
    if (j->create_st != BEAM_OK) return NULL;
    if (j->armed) arm(j->armed);
    if (j->quant)
        j->st = beam_moe_finalize_gather_norm_residual_norm_q(
            ws, b->ex + (size_t)start * K * H, b->wt + (size_t)start * K, L, b->T, K, H, 2.0f, &n, b->res,
            b->scales, &n, j->hid, NULL, j->quant, j->strategy, NULL);
    else
        j->st = beam_moe_finalize_gather_norm_residual_norm(ws, b->ex + (size_t)start * K * H,
                                                            b->wt + (size_t)start * K, L, b->T, K, H, 2.0f, &n,
                                                            b->res, b->scales, &n, j->hid, j->nrm, j->strategy,
                                                            NULL);
    disarm();
    snprintf(j->msg, sizeof j->msg, "%s", beam_last_error());
    beam_workspace_destroy(ws);
    return NULL;
}

static void test_gather(void)
{
    static const beam_strategy strats[3] = {BEAM_STRATEGY_ONESHOT, BEAM_STRATEGY_TWOSHOT,
                                            BEAM_STRATEGY_UNFUSED};
    bufs b;
    const int64_t T = 8;
    const size_t TH = (size_t)T * H;
    nr_norm rn = {1, NULL, 1e-6f};
    uint16_t *ref_h = (uint16_t *)hu_alloc(2 * TH, 0), *ref_n = (uint16_t *)hu_alloc(2 * TH, 0);
    int k, r, armed;

    bufs_make(&b, T);
    rn.weight = b.wn;
    nr_finalize_norm_residual_norm(b.ex, b.wt, T, K, H, 2.0f, &rn, b.res, b.scales, &rn, ref_h, ref_n);
    for (k = 0; k < 3; k++)
        for (armed = 1; armed >= 0; armed--) {
            beam_cpu_group *g = NULL;
            rank_job jobs[R];
            pthread_t th[R];
            CU_ASSERT_EQUAL_FATAL(beam_cpu_group_create(R, &g), BEAM_OK);
            for (r = 0; r < R; r++) {
                memset(&jobs[r], 0, sizeof jobs[r]);
                jobs[r].g = g;
                jobs[r].rank = r;
                jobs[r].armed = armed && r == 1;
                jobs[r].b = &b;
                jobs[r].strategy = strats[k];
                jobs[r].hid = (uint16_t *)hu_alloc(2 * TH, 0);
                jobs[r].nrm = (uint16_t *)hu_alloc(2 * TH, 0);
                hu_poison(jobs[r].hid, 2 * TH);
                hu_poison(jobs[r].nrm, 2 * TH);
                CU_ASSERT_EQUAL_FATAL(pthread_create(&th[r], NULL, rank_main, &jobs[r]), 0);
            }
            for (r = 0; r < R; r++) pthread_join(th[r], NULL);
            for (r = 0; r < R; r++) {
                CU_ASSERT_EQUAL(jobs[r].create_st, BEAM_OK);
                if (armed) {
                    /* rank 1 had no memory; rank 0 learns it at the agreement */
                    CU_ASSERT_EQUAL(jobs[r].st, BEAM_ERR_OUT_OF_MEMORY);
                    CU_ASSERT_PTR_NOT_NULL(strstr(jobs[r].msg, "beam_moe_finalize_gather_norm_residual_norm"));
                    CU_ASSERT(hu_is_poison(jobs[r].hid, 2 * TH));
                    CU_ASSERT(hu_is_poison(jobs[r].nrm, 2 * TH));
                } else {
                    CU_ASSERT_EQUAL(jobs[r].st, BEAM_OK);
                    CU_ASSERT_EQUAL(hu_cmp_bf16("gather after OOM", jobs[r].hid, ref_h, TH), 0);
                    CU_ASSERT_EQUAL(hu_cmp_bf16("gather after OOM", jobs[r].nrm, ref_n, TH), 0);
                }
                if (jobs[r].st != (armed ? BEAM_ERR_OUT_OF_MEMORY : BEAM_OK))
                    fprintf(stderr, "FAIL gather strategy=%d armed=%d rank=%d: status %d: %s\n", (int)strats[k],
                            armed, r, (int)jobs[r].st, jobs[r].msg);
                hu_free(jobs[r].hid);
                hu_free(jobs[r].nrm);
            }
            CU_ASSERT_EQUAL(beam_cpu_group_destroy(g), BEAM_OK);
        }
    hu_free(ref_h);
    hu_free(ref_n);
    bufs_free(&b);
}

/* The _q gather with normalized NULL allocates two large blocks on each
 * rank before the agreement: the scratch, then the normalized rows it
 * quantizes from. Rank 1 without either: every rank fails with
 * BEAM_ERR_OUT_OF_MEMORY, nothing written (hidden, values, scales); with
 * memory, every rank succeeds. */
static void test_gather_q(void)
{
    static const beam_strategy strats[3] = {BEAM_STRATEGY_ONESHOT, BEAM_STRATEGY_TWOSHOT,
                                            BEAM_STRATEGY_UNFUSED};
    bufs b;
    const int64_t T = 8;
    const size_t TH = (size_t)T * H;
    int k, r, armed;

    bufs_make(&b, T);
    for (k = 0; k < 3; k++)
        for (armed = 2; armed >= 0; armed--) {
            beam_cpu_group *g = NULL;
            rank_job jobs[R];
            beam_quant q[R];
            uint8_t *vals[R];
            float *sc[R];
            pthread_t th[R];
            CU_ASSERT_EQUAL_FATAL(beam_cpu_group_create(R, &g), BEAM_OK);
            for (r = 0; r < R; r++) {
                memset(&jobs[r], 0, sizeof jobs[r]);
                memset(&q[r], 0, sizeof q[r]);
                vals[r] = (uint8_t *)hu_alloc(TH, 0);
                sc[r] = (float *)hu_alloc(4 * (size_t)T, 0);
                hu_poison(vals[r], TH);
                hu_poison(sc[r], 4 * (size_t)T);
                q[r].kind = BEAM_QUANT_FP8_TOKEN;
                q[r].values = vals[r];
                q[r].scales = sc[r];
                jobs[r].g = g;
                jobs[r].rank = r;
                jobs[r].armed = r == 1 ? armed : 0;
                jobs[r].b = &b;
                jobs[r].strategy = strats[k];
                jobs[r].quant = &q[r];
                jobs[r].hid = (uint16_t *)hu_alloc(2 * TH, 0);
                hu_poison(jobs[r].hid, 2 * TH);
                CU_ASSERT_EQUAL_FATAL(pthread_create(&th[r], NULL, rank_main, &jobs[r]), 0);
            }
            for (r = 0; r < R; r++) pthread_join(th[r], NULL);
            for (r = 0; r < R; r++) {
                const beam_status want = armed ? BEAM_ERR_OUT_OF_MEMORY : BEAM_OK;
                CU_ASSERT_EQUAL(jobs[r].create_st, BEAM_OK);
                CU_ASSERT_EQUAL(jobs[r].st, want);
                if (armed) {
                    CU_ASSERT_PTR_NOT_NULL(strstr(jobs[r].msg, "beam_moe_finalize_gather_norm_residual_norm_q"));
                    /* rank 1 names the allocation that failed */
                    if (r == 1)
                        CU_ASSERT_PTR_NOT_NULL(
                            strstr(jobs[r].msg, armed == 1 ? "scratch rows" : "normalized rows to quantize"));
                    CU_ASSERT(hu_is_poison(jobs[r].hid, 2 * TH));
                    CU_ASSERT(hu_is_poison(vals[r], TH));
                    CU_ASSERT(hu_is_poison(sc[r], 4 * (size_t)T));
                } else {
                    CU_ASSERT(!hu_is_poison(vals[r], TH));
                }
                if (jobs[r].st != want)
                    fprintf(stderr, "FAIL _q gather strategy=%d armed=%d rank=%d: status %d: %s\n", (int)strats[k],
                            armed, r, (int)jobs[r].st, jobs[r].msg);
                hu_free(jobs[r].hid);
                hu_free(vals[r]);
                hu_free(sc[r]);
            }
            CU_ASSERT_EQUAL(beam_cpu_group_destroy(g), BEAM_OK);
        }
    bufs_free(&b);
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
