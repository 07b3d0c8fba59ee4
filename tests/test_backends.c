/*
 * test_backends.c - every operation of every registered backend against
 * the CPU ground truth, bit for bit, in one loop (as ggml's
 * test-backend-ops runs every backend against its CPU one).
 *
 * The backends are the lines of lib/backends.def; each is reached through
 * its table (beam_backend_ops of libbeammoe, which loads its library), so a
 * new backend is tested by being registered there. Its ground truth:
 *   cpu      the naive reference of the specification (harness/naive_ref.c)
 *   others   the CPU backend's call on the same case
 * A backend whose calls take device memory (backends.def) runs on device
 * buffers through harness/devmem.h. A backend that cannot run here (no
 * device) is named and left out; the CPU backend always runs, so this test
 * never skips.
 *
 *   sweep     every case of the CPU sweep: top_k 1,2,6,8,32 x hidden 256,
 *             2048,4096,7168,8192 x tokens 0,1,7,100, the other axes (norms,
 *             scales, routed_scale, in place, misaligned bases, exotic
 *             values, NaN padding rows) rotated; each op, each strategy
 *   special   all-exotic inputs (subnormals, infinities, NaNs, signed zeros)
 *   prefill   the launch shapes only large T picks (GPU backends)
 *   random    a randomized sweep: top_k 1..32, hidden 256..8192 step 256,
 *             tokens 0..5000 (log-uniform, a case's expert input capped at 8M
 *             values); 1500 shapes for a device backend, 60 for the CPU
 *             against the naive reference
 *   gather    every backend's in-process group (its table's
 *             cpu_group_create, ranks as threads, each on a stream of its
 *             own where the backend takes device memory): R = 1, 2, 3, 5,
 *             hidden 512 and 7168, tokens 0, 1, 4, 7 and 64 (fewer tokens
 *             than ranks, not divisible by R), every strategy, against the
 *             naive reference of the fused op on all the tokens, on every
 *             rank
 * Every output must match, and rows past the live ones (guard rows) must
 * stay untouched. BEAM_TEST_QUICK=1 shrinks the sweeps (sanitizer runs);
 * BEAM_TEST_SEED reproduces a run (the seed is printed); BEAM_TEST_BACKEND
 * names the one backend to test.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>

#include "backends.h"
#include "devmem.h"
#include "suite.h"

static uint64_t g_seed;
static long g_runs;
static const beam_ops *g_cpu;                /* the ground truth of the others */
static const beam_ops *g_ops[BM_NBACKENDS];  /* NULL: not tested here */

static const char *strat_name(beam_strategy s)
{
    return s == BEAM_STRATEGY_FUSED ? "FUSED" : s == BEAM_STRATEGY_UNFUSED ? "UNFUSED" : "AUTO";
}

/* 1 when the backend's results equal the ground truth, guard rows included. */
static int compare_case(const beam_ops *ops, const hc_case *d, hc_op op, beam_strategy strat)
{
    size_t TH = (size_t)d->s.T * (size_t)d->s.H;
    hc_out want, got;
    int ok = 1;
    beam_status ws = BEAM_OK, gs;
    char desc[256], werr[400] = "", gerr[400] = "";

    if (hc_out_make(&want, d, 2) || hc_out_make(&got, d, 2)) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    hc_describe(&d->s, desc, sizeof desc);
    /* the harness's runner: the case laid out as its spec asks, on device
     * buffers where the backend takes device memory */
    if (ops == g_cpu)
        hc_reference(d, op, &want);
    else
        ws = hc_run(g_cpu, d, op, strat, hc_how(&d->s), &want, werr, sizeof werr);
    gs = hc_run(ops, d, op, strat, hc_how(&d->s) | (ops->device_memory ? HC_DEVICE : 0u), &got, gerr,
                sizeof gerr);
    ++g_runs;
    if (ws != BEAM_OK || gs != BEAM_OK) {
        fprintf(stderr, "  %s %s %s %s: status cpu=%d %s=%d (%s)\n", ops->name, hc_op_name(op),
                strat_name(strat), desc, (int)ws, ops->name, (int)gs, gs != BEAM_OK ? gerr : werr);
        ok = 0;
    } else {
        if (!hc_out_untouched(&got, d, op)) {
            fprintf(stderr, "  %s %s %s %s: wrote past the live rows\n", ops->name, hc_op_name(op),
                    strat_name(strat), desc);
            ok = 0;
        }
        if (hu_cmp_bf16("hidden", got.hidden, want.hidden, TH)) ok = 0;
        if (hc_has_normalized(d, op) && hu_cmp_bf16("normalized", got.normalized, want.normalized, TH)) ok = 0;
        if (!ok)
            fprintf(stderr, "  ^ %s %s %s %s (seed %llu)\n", ops->name, hc_op_name(op), strat_name(strat), desc,
                    (unsigned long long)g_seed);
    }
    hc_out_free(&want);
    hc_out_free(&got);
    return ok;
}

/* every op of a case; the fused op under every local strategy */
static int compare_all(const beam_ops *ops, const hc_case *d)
{
    static const beam_strategy strats[3] = {BEAM_STRATEGY_AUTO, BEAM_STRATEGY_FUSED, BEAM_STRATEGY_UNFUSED};
    int ok = 1, i;
    ok &= compare_case(ops, d, HC_FINALIZE, BEAM_STRATEGY_AUTO);
    ok &= compare_case(ops, d, HC_NRN, BEAM_STRATEGY_AUTO);
    for (i = 0; i < 3; i++) ok &= compare_case(ops, d, HC_FUSED, strats[i]);
    return ok;
}

/* Each test runs for every backend tested here. */
#define FOR_EACH_BACKEND(ops)                        \
    for (int b_ = 0; b_ < BM_NBACKENDS; b_++)        \
        for (const beam_ops *ops = g_ops[b_]; ops; ops = NULL)

/* ---- sweep: the CPU test's cases ------------------------------------------ */

static void test_sweep(void)
{
    FOR_EACH_BACKEND(ops)
    {
        int i, bad = 0, rot;
        /* BEAM_TEST_QUICK (sanitizer runs), and the CPU against the naive
         * reference (test_numerics runs the whole sweep): every third */
        const int step = hu_quick() || ops == g_cpu ? 3 : 1;
        for (i = 0; i < HC_SWEEP_SIZE; i += step) {
            /* each triple twice: its rotation and the complementary one, so
             * norms, in-place and misalignment each appear on and off */
            for (rot = 0; rot < 2; rot++) {
                hc_case d;
                hc_spec s = hc_sweep_spec(i + rot * 37), base = hc_sweep_spec(i);
                s.K = base.K;
                s.H = base.H;
                s.T = base.T;
                hc_make(&d, &s, g_seed + (uint64_t)(2 * i + rot));
                if (!compare_all(ops, &d)) ++bad;
                hc_free(&d);
            }
        }
        CU_ASSERT_EQUAL(bad, 0);
    }
}

/* ---- special values -------------------------------------------------------- */

static void test_special(void)
{
    static const int32_t hs[] = {256, 768, 7168, 8192};
    FOR_EACH_BACKEND(ops)
    {
        int i, bad = 0;
        for (i = 0; i < 24; i += hu_quick() ? 3 : 1) {
            hc_case d;
            hc_spec s;
            memset(&s, 0, sizeof s);
            s.K = i % 3 == 0 ? 1 : i % 3 == 1 ? 8 : 32;
            s.H = hs[i % 4];
            s.T = 1 + i * 3;
            s.pad = 2;
            s.post = i % 3;
            s.pre = (i + 1) % 3;
            s.next = (i + 2) % 3;
            s.scales = i % 2;
            s.rs_one = (i / 2) % 2;
            s.inplace = (i / 3) % 2;
            s.misalign = (i / 4) % 2;
            s.exotic = 1;
            hc_make(&d, &s, g_seed + 77 * (uint64_t)(i + 1));
            if (!compare_all(ops, &d)) ++bad;
            hc_free(&d);
        }
        CU_ASSERT_EQUAL(bad, 0);
    }
}

/* ---- prefill shapes ---------------------------------------------------------- */

/* The launch shapes that only large T picks on a GPU: the pipelined prefill
 * kernel (hidden > 4096, T >= 2048) with its vector and misaligned
 * variants, and the row kernel at prefill sizes. The randomized sweep's
 * size cap never reaches them. BEAM_TEST_QUICK, and the CPU (whose
 * schedule does not depend on T), keep one small case of the pipelined
 * shape. */
static void test_prefill(void)
{
    static const struct {
        int64_t T;
        int32_t K, H;
        int misalign, post, inplace, exotic;
    } full[] = {
        {4096, 8, 7168, 0, HC_NORM_OFF, 0, 0},    {4096, 8, 7168, 1, HC_NORM_WEIGHT, 0, 0},
        {2048, 8, 8192, 0, HC_NORM_WEIGHT, 1, 1}, {3001, 8, 4352, 1, HC_NORM_PLAIN, 0, 0},
        {4096, 8, 4096, 0, HC_NORM_OFF, 0, 1},    {4096, 8, 2048, 1, HC_NORM_WEIGHT, 1, 0},
    }, quick[] = {{2048, 2, 4608, 1, HC_NORM_WEIGHT, 0, 1}};
    FOR_EACH_BACKEND(ops)
    {
        const int q = hu_quick() || ops == g_cpu;
        const int n = q ? 1 : (int)(sizeof full / sizeof full[0]);
        int i, bad = 0;
        for (i = 0; i < n; i++) {
            hc_case d;
            hc_spec s;
            memset(&s, 0, sizeof s);
            s.T = q ? quick[i].T : full[i].T;
            s.K = q ? quick[i].K : full[i].K;
            s.H = q ? quick[i].H : full[i].H;
            s.misalign = q ? quick[i].misalign : full[i].misalign;
            s.post = q ? quick[i].post : full[i].post;
            s.inplace = q ? quick[i].inplace : full[i].inplace;
            s.exotic = q ? quick[i].exotic : full[i].exotic;
            s.pad = 2;
            s.next = HC_NORM_WEIGHT;
            s.scales = i % 2;
            s.rs_one = i % 3 == 0;
            hc_make(&d, &s, g_seed + 7919ULL * (uint64_t)(i + 1));
            if (!compare_all(ops, &d)) ++bad;
            hc_free(&d);
        }
        CU_ASSERT_EQUAL(bad, 0);
    }
}

/* ---- randomized sweep ------------------------------------------------------ */

static void test_random(void)
{
    FOR_EACH_BACKEND(ops)
    {
        hu_rng r;
        const int small = hu_quick() || ops == g_cpu;
        int i, bad = 0, n = small ? 60 : 1500;
        /* expert input elements of one case at most (8M: 16 MB): keeps the
         * generation, the ground truth and the copies short, so that the
         * sweep takes about a minute on a 16-core GPU host; tokens near
         * 5000 then come with small top_k * hidden */
        const double cap_elems = small ? 2e6 : 8e6;
        hu_rng_init(&r, g_seed ^ 0x5EEDCAFEULL);
        for (i = 0; i < n; i++) {
            hc_case d;
            hc_spec s;
            hc_op op;
            beam_strategy strat;
            double lt;
            memset(&s, 0, sizeof s);
            s.K = 1 + (int32_t)hu_below(&r, 32);
            s.H = 256 * (1 + (int32_t)hu_below(&r, 32));
            /* tokens log-uniform in [0, 5000], 0 one time in 32 */
            lt = (double)hu_below(&r, 1u << 20) / (double)(1u << 20) * log(5001.0);
            s.T = hu_below(&r, 32) == 0 ? 0 : (int64_t)floor(exp(lt)) - 1;
            if (s.T > 5000) s.T = 5000;
            while (s.T > 1 && (double)s.T * s.K * s.H > cap_elems) s.T /= 2;
            s.pad = hu_below(&r, 3);
            s.post = hu_below(&r, 3);
            s.pre = hu_below(&r, 3);
            s.next = hu_below(&r, 3);
            s.scales = hu_below(&r, 2);
            s.rs_one = hu_below(&r, 2);
            s.inplace = hu_below(&r, 3) == 0;
            s.misalign = hu_below(&r, 5) == 0;
            s.exotic = hu_below(&r, 8) == 0;
            op = (hc_op)hu_below(&r, 3);
            strat = op == HC_FUSED ? (beam_strategy)hu_below(&r, 3) : BEAM_STRATEGY_AUTO;
            hc_make(&d, &s, g_seed + 1000003ULL * (uint64_t)(i + 1));
            if (!compare_case(ops, &d, op, strat)) ++bad;
            hc_free(&d);
            if (bad > 10) break;
        }
        CU_ASSERT_EQUAL(bad, 0);
    }
}

/* ---- gather: every backend's in-process group ----------------------------- */

#define G_MAXR 5
#define G_MAXT 64

/* One case of the gather, laid out on a backend's memory: the experts and
 * weights of all R * L rows (the rows past T are the case's NaN padding),
 * the residual and the norm weights, shared by the ranks (read only). */
typedef struct gcase {
    hc_case d;
    uint16_t *ref_h, *ref_n; /* [T, H] the naive reference */
    const uint16_t *ex, *res, *wpost, *wnext;
    const float *wt;
    void *blocks[5]; /* device copies (NULL on the host) */
} gcase;

typedef struct grank {
    const beam_ops *ops;
    beam_cpu_group *g;
    int rank, R, ncases, bad;
    int32_t H;
    const gcase *cases;
    void *stream;
    char first[300];
} grank;

static void *g_to_dev(const beam_ops *ops, gcase *c, int i, const void *src, size_t bytes)
{
    void *p;
    if (!ops->device_memory || !src) return (void *)src;
    p = dev_alloc(bytes);
    if (!p || dev_upload(p, src, bytes)) {
        fprintf(stderr, "device memory: %s\n", dev_last_error());
        exit(1);
    }
    c->blocks[i] = p;
    return p;
}

static void gcase_make(const beam_ops *ops, gcase *c, int R, int64_t T, int32_t H, int i)
{
    hc_spec s;
    const int64_t L = (T + R - 1) / R;
    const size_t TH = (size_t)T * (size_t)H;
    size_t cap;
    memset(c, 0, sizeof *c);
    memset(&s, 0, sizeof s);
    s.K = i % 2 ? 8 : 4;
    s.H = H;
    s.T = T;
    s.pad = R * L - T + 1;
    s.post = i % 3 == 0 ? HC_NORM_OFF : HC_NORM_WEIGHT;
    s.next = i % 4 == 3 ? HC_NORM_OFF : (i % 2 ? HC_NORM_PLAIN : HC_NORM_WEIGHT);
    s.scales = i % 2;
    s.rs_one = i % 5 == 0;
    hc_make(&c->d, &s, g_seed ^ (0x6A7E0ULL + (uint64_t)i * 7919u + (uint64_t)R));
    c->ref_h = (uint16_t *)hu_alloc(2 * TH + 2, 0);
    c->ref_n = (uint16_t *)hu_alloc(2 * TH + 2, 0);
    hc_ref(&c->d, HC_FUSED, c->ref_h, c->ref_n);
    cap = (size_t)c->d.cap;
    c->ex = (const uint16_t *)g_to_dev(ops, c, 0, c->d.experts, cap * (size_t)s.K * (size_t)H * 2);
    c->wt = (const float *)g_to_dev(ops, c, 1, c->d.weights, cap * (size_t)s.K * 4);
    c->res = (const uint16_t *)g_to_dev(ops, c, 2, c->d.residual, cap * (size_t)H * 2);
    c->wpost = (const uint16_t *)g_to_dev(ops, c, 3, c->d.wpost, (size_t)H * 2);
    c->wnext = (const uint16_t *)g_to_dev(ops, c, 4, c->d.wnext, (size_t)H * 2);
}

static void gcase_free(gcase *c)
{
    int i;
    for (i = 0; i < 5; i++) dev_free(c->blocks[i]);
    hu_free(c->ref_h);
    hu_free(c->ref_n);
    hc_free(&c->d);
}

/* Rank a->rank: its workspace, then every case under every strategy, each
 * compared with the reference on this rank's outputs. */
static void *grank_main(void *p)
{
    static const beam_strategy strats[4] = {BEAM_STRATEGY_AUTO, BEAM_STRATEGY_ONESHOT, BEAM_STRATEGY_TWOSHOT,
                                            BEAM_STRATEGY_UNFUSED};
    grank *a = (grank *)p;
    const beam_ops *ops = a->ops;
    const size_t TH = (size_t)G_MAXT * (size_t)a->H;
    uint16_t *h = (uint16_t *)hu_alloc(2 * TH, 0), *n = (uint16_t *)hu_alloc(2 * TH, 0);
    uint16_t *dh = ops->device_memory ? (uint16_t *)dev_alloc(2 * TH) : h;
    uint16_t *dn = ops->device_memory ? (uint16_t *)dev_alloc(2 * TH) : n;
    beam_workspace *ws = NULL;
    beam_status st = ops->workspace_create_cpu(a->g, a->rank, G_MAXT, a->H, NULL, &ws);
    int i, k;
    if (st != BEAM_OK || !dh || !dn) {
        snprintf(a->first, sizeof a->first, "workspace: %d %s", (int)st, ops->last_error());
        a->bad++;
    }
    for (i = 0; i < a->ncases && !a->bad; i++)
        for (k = 0; k < 4 && !a->bad; k++) {
            const gcase *c = &a->cases[i];
            const hc_spec *s = &c->d.s;
            const int64_t L = (s->T + a->R - 1) / a->R, r0 = (int64_t)a->rank * L;
            const size_t th = (size_t)s->T * (size_t)a->H;
            beam_norm post = {c->d.post.weight ? c->wpost : NULL, c->d.post.eps};
            beam_norm next = {c->d.next.weight ? c->wnext : NULL, c->d.next.eps};
            hu_poison(h, 2 * th); /* every element must be written */
            hu_poison(n, 2 * th);
            if (ops->device_memory &&
                (dev_upload_on(dh, h, 2 * th, a->stream) || dev_upload_on(dn, n, 2 * th, a->stream)))
                a->bad++;
            st = ops->moe_finalize_gather_norm_residual_norm(
                ws, c->ex + (size_t)r0 * (size_t)s->K * (size_t)s->H, c->wt + (size_t)r0 * (size_t)s->K, L, s->T,
                s->K, s->H, c->d.rs, s->post ? &post : NULL, c->res, s->scales ? c->d.scales : NULL,
                s->next ? &next : NULL, dh, s->next ? dn : NULL, strats[k], a->stream);
            if (st == BEAM_OK && ops->device_memory &&
                (dev_stream_sync(a->stream) || dev_download(h, dh, 2 * th) || dev_download(n, dn, 2 * th)))
                st = BEAM_ERR_DEVICE;
            if (st != BEAM_OK || memcmp(h, c->ref_h, 2 * th) != 0 ||
                (s->next && memcmp(n, c->ref_n, 2 * th) != 0)) {
                char desc[200];
                hc_describe(s, desc, sizeof desc);
                snprintf(a->first, sizeof a->first, "%s R=%d rank %d strategy %d [%s]: status %d %s", ops->name,
                         a->R, a->rank, (int)strats[k], desc, (int)st, st != BEAM_OK ? ops->last_error() : "");
                a->bad++;
            }
        }
    if (ws && ops->workspace_destroy(ws) != BEAM_OK && !a->bad) {
        snprintf(a->first, sizeof a->first, "destroy: %s", ops->last_error());
        a->bad++;
    }
    if (ops->device_memory) {
        dev_free(dh);
        dev_free(dn);
    }
    hu_free(h);
    hu_free(n);
    return NULL;
}

static void test_gather(void)
{
    static const int Rs[] = {1, 2, 3, 5};
    static const int64_t Ts[] = {0, 1, 4, 7, 64};
    static const int32_t Hs[] = {512, 7168};
    FOR_EACH_BACKEND(ops)
    {
        int ri, hi, i, r, calls = 0;
        for (ri = 0; ri < 4; ri++)
            for (hi = 0; hi < 2; hi++) {
                const int R = Rs[ri];
                gcase cases[5];
                grank ranks[G_MAXR];
                pthread_t th[G_MAXR];
                beam_cpu_group *g = NULL;
                void *streams[G_MAXR] = {NULL};
                CU_ASSERT_EQUAL_FATAL(ops->cpu_group_create(R, &g), BEAM_OK);
                for (i = 0; i < 5; i++) gcase_make(ops, &cases[i], R, Ts[i], Hs[hi], i + 5 * hi);
                /* the uploads land before any rank's stream runs */
                if (ops->device_memory) CU_ASSERT_EQUAL_FATAL(dev_sync(), 0);
                for (r = 0; r < R; r++) {
                    memset(&ranks[r], 0, sizeof ranks[r]);
                    ranks[r].ops = ops;
                    ranks[r].g = g;
                    ranks[r].rank = r;
                    ranks[r].R = R;
                    ranks[r].H = Hs[hi];
                    ranks[r].cases = cases;
                    ranks[r].ncases = 5;
                    if (ops->device_memory) CU_ASSERT_PTR_NOT_NULL_FATAL(streams[r] = dev_stream_create());
                    ranks[r].stream = streams[r];
                    CU_ASSERT_EQUAL_FATAL(pthread_create(&th[r], NULL, grank_main, &ranks[r]), 0);
                }
                for (r = 0; r < R; r++) {
                    pthread_join(th[r], NULL);
                    if (ranks[r].bad)
                        fprintf(stderr, "  gather: %s (seed %llu)\n", ranks[r].first, (unsigned long long)g_seed);
                    CU_ASSERT_EQUAL(ranks[r].bad, 0);
                    dev_stream_destroy(streams[r]);
                }
                CU_ASSERT_EQUAL(ops->cpu_group_destroy(g), BEAM_OK);
                for (i = 0; i < 5; i++) gcase_free(&cases[i]);
                calls += 4 * 5 * R;
            }
        g_runs += calls;
        printf("  gather: %s, %d calls\n", ops->name, calls);
    }
}

/* Every registered backend that can run here (BEAM_TEST_BACKEND: that one
 * only); the CPU's table is the ground truth of the others. */
static int pick_backends(void)
{
    const char *only = getenv("BEAM_TEST_BACKEND");
    char msg[300];
    int b, n = 0;
    g_cpu = beam_backend_ops("cpu", BEAM_OPS_VERSION);
    if (!g_cpu) {
        fprintf(stderr, "test_backends: the cpu backend: %s\n", beam_last_error());
        return -1;
    }
    if (only && bm_backend_find(only) < 0) {
        fprintf(stderr, "test_backends: BEAM_TEST_BACKEND=%s must be %s\n", only, bm_backend_choices(0));
        return -1;
    }
    for (b = 0; b < BM_NBACKENDS; b++) {
        const char *name = bm_backend_name(b);
        const beam_ops *ops;
        if (only && strcmp(only, name) != 0) continue;
        ops = b == BM_CPU ? g_cpu : beam_backend_ops(name, BEAM_OPS_VERSION);
        if (!ops) {
            printf("test_backends: %s: not tested here (%s)\n", name, beam_last_error());
            continue;
        }
        if (ops->device_memory && dev_open(msg, sizeof msg)) {
            fprintf(stderr, "test_backends: %s runs here, but the test cannot reach its memory: %s\n", name,
                    msg);
            return -1;
        }
        g_ops[b] = ops;
        printf("test_backends: %s against %s\n", name, b == BM_CPU ? "the naive reference" : "the cpu backend");
        ++n;
    }
    return n;
}

int main(void)
{
    static const suite_test tests[] = {{"sweep of the CPU cases", test_sweep},
                                       {"special values", test_special},
                                       {"prefill shapes", test_prefill},
                                       {"randomized sweep", test_random},
                                       {"the gather of every in-process group", test_gather},
                                       {NULL, NULL}};
    int rc, n;

    setvbuf(stdout, NULL, _IOLBF, 0);
    /* Before the first CUDA call (as tests/test_gather_group.c): a hardware
     * queue per rank's stream, and every kernel loaded at once, so that a
     * rank's gather kernel waiting for its peers never holds up theirs. */
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
    g_seed = hu_seed("test_backends");
    n = pick_backends();
    if (n < 0) return 1;
    if (n == 0) {
        printf("test_backends: no backend to test: skipped\n");
        return 77;
    }
    rc = suite_run("backends", tests);
    printf("test_backends: %ld comparisons, seed %llu\n", g_runs, (unsigned long long)g_seed);
    return rc;
}
