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
 *             own where the backend takes device memory): R = 1, 2, 3, 4,
 *             5, 8, hidden 256 to 8192, tokens 0 to 65R + 1 (fewer than R,
 *             not divisible by R, a rank with no rows; to 16384 on a
 *             device), every strategy, norm, top_k, scales, in place,
 *             misaligned, exotic values, every quantized form (the _q
 *             gather), each rank's calls back to back, against nr_gather
 *             (and the model of the quantized output) on every rank
 * Every output must match, and rows past the live ones (guard rows) must
 * stay untouched. BEAM_TEST_QUICK=1 shrinks the sweeps (sanitizer runs;
 * a device backend's gather then in a group of one: hu_world_sizes);
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
#include "quant_model.h"
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
    static const hc_spec full[] = {
        {.T = 4096, .K = 8, .H = 7168, .post = HC_NORM_OFF},
        {.T = 4096, .K = 8, .H = 7168, .misalign = 1, .post = HC_NORM_WEIGHT},
        {.T = 2048, .K = 8, .H = 8192, .post = HC_NORM_WEIGHT, .inplace = 1, .exotic = 1},
        {.T = 3001, .K = 8, .H = 4352, .misalign = 1, .post = HC_NORM_PLAIN},
        {.T = 4096, .K = 8, .H = 4096, .post = HC_NORM_OFF, .exotic = 1},
        {.T = 4096, .K = 8, .H = 2048, .misalign = 1, .post = HC_NORM_WEIGHT, .inplace = 1},
    }, quick[] = {{.T = 2048, .K = 2, .H = 4608, .misalign = 1, .post = HC_NORM_WEIGHT, .exotic = 1}};
    FOR_EACH_BACKEND(ops)
    {
        const int q = hu_quick() || ops == g_cpu;
        const int n = q ? 1 : (int)(sizeof full / sizeof full[0]);
        int i, bad = 0;
        for (i = 0; i < n; i++) {
            hc_case d;
            hc_spec s = q ? quick[i] : full[i];
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

/* The gather's plan, run on one group of R ranks for each R: a workspace per
 * line (its hidden; AUTO's thresholds low enough that AUTO takes each
 * strategy, or the defaults), and on it every case of the line under every
 * strategy, UNFUSED first, each rank's calls back to back with no sync but
 * the library's own (a fast rank runs into the next call while slow ones
 * still read this one's). Tokens are a * R + b: none, 1, fewer than R, not
 * divisible by R, a rank owning no row (T = 9, R = 4), ceil(T/R) past 64
 * (the CUDA ONESHOT's flag rows), near max_tokens. The other axes rotate
 * with the case's number (hc_sweep_spec: top_k up to the line's, norms,
 * scales, routed_scale, NaN rows past each rank's live ones, in place,
 * misaligned bases, exotic values). G_QUANT: also the _q gather with quant
 * NULL and with every form (harness/quant_model.h), normalized kept, NULL
 * or kept on the even ranks only, values and scales the model's of the
 * reference's normalized, nothing past them written. G_LARGE: one case at
 * the line's largest T, called at every T (a device backend's launch
 * shapes; the CPU's schedule does not depend on T). */
enum { G_PLAIN, G_QUANT, G_LARGE };
#define G_NLINES 7
#define G_GUARD 130 /* output rows past T that must stay untouched: more than a 128-row tile */
#define G_QGUARD 64 /* bytes of values, floats of scales past the model's extent */
#define G_CAP 8e6   /* expert values of a case at most (top_k shrinks to fit); G_LARGE: any */
static const struct gline {
    int32_t H, K;     /* hidden; top_k at most */
    int64_t one, two; /* AUTO's thresholds; 0: the defaults */
    int kind, nt;
    int16_t t[16][2]; /* tokens a * R + b */
} GPLAN[G_NLINES] = {
    {1024, 32, 2, 8, G_PLAIN, 15,
     {{0, 1}, {0, 0}, {1, -1}, {0, 2}, {1, 0}, {1, 1}, {2, 1}, {0, 7}, {0, 9}, {0, 63}, {0, 64}, {0, 65},
      {0, 100}, {65, 0}, {65, 1}}},
    {512, 4, 2, 8, G_QUANT, 4, {{0, 1}, {1, -1}, {1, 1}, {0, 99}}},
    {7168, 8, 0, 0, G_PLAIN, 5, {{0, 1}, {1, 1}, {0, 61}, {0, 64}, {0, 100}}},
    {256, 2, 64, 200, G_PLAIN, 6, {{0, 63}, {0, 64}, {0, 65}, {0, 200}, {0, 201}, {0, 333}}},
    {2304, 3, 64, 200, G_PLAIN, 2, {{1, 1}, {0, 129}}},
    {8192, 32, 64, 200, G_PLAIN, 2, {{1, 1}, {2, 1}}},
    {4096, 8, 64, 200, G_LARGE, 6, {{0, 1}, {0, 2049}, {0, 4095}, {0, 8191}, {0, 16383}, {0, 16384}}},
};

/* One case on a backend's memory: its inputs, shared by the ranks (read
 * only), the reference of its largest call and (G_QUANT) the model's
 * quantized output of every form. */
typedef struct gcase {
    hc_case d;
    int64_t T;               /* tokens (G_LARGE: the largest of the line's) */
    uint16_t *ref_h, *ref_n; /* [T, H] */
    const uint16_t *ex, *res, *wpost, *wnext;
    const float *wt;
    void *blocks[5]; /* copies (misaligned, or device) */
    int dev;
    beam_quant forms[QM_NFORMS];
    uint8_t *want_v[QM_NFORMS];
    float *want_s[QM_NFORMS];
} gcase;

/* src as the backend takes it (dev_place); block i keeps the copy */
static const void *g_place(gcase *c, int i, const void *src, size_t bytes, size_t off)
{
    const void *p = dev_place(src, bytes, off, c->dev, &c->blocks[i]);
    if (src && !p) {
        fprintf(stderr, "device memory: %s\n", dev_last_error());
        exit(1);
    }
    return p;
}

static size_t g_nv(const beam_quant *q, int64_t T, int32_t H) { return qm_values_bytes(q, T, H) + G_QGUARD; }
static size_t g_ns(const beam_quant *q, int64_t T, int32_t H) { return qm_scale_floats(q, T, H) + G_QGUARD; }

static void gcase_make(const beam_ops *ops, gcase *c, int l, int R, int64_t T, int n)
{
    const struct gline *ln = &GPLAN[l];
    hc_spec s = hc_sweep_spec(n);
    size_t cap, KH, mb, f;
    memset(c, 0, sizeof *c);
    c->dev = ops->device_memory;
    c->T = T;
    s.H = ln->H;
    s.T = T;
    s.K = s.K < ln->K ? s.K : ln->K;
    while (ln->kind != G_LARGE && s.K > 1 && (double)s.K * s.H * (double)T > G_CAP) s.K /= 2;
    if (ln->kind == G_QUANT && s.next == HC_NORM_OFF) s.next = HC_NORM_WEIGHT;
    hc_make_gather(&c->d, &s, R, g_seed ^ (0x6A7E0ULL + 7919ULL * (uint64_t)n + 131ULL * (uint64_t)R));
    c->ref_h = (uint16_t *)hu_alloc(2 * (size_t)T * (size_t)s.H + 2, 0);
    c->ref_n = (uint16_t *)hu_alloc(2 * (size_t)T * (size_t)s.H + 2, 0);
    hc_gather_ref(&c->d, R, T, c->ref_h, c->ref_n);
    cap = (size_t)c->d.cap;
    KH = (size_t)s.K * (size_t)s.H;
    mb = s.misalign ? 2 : 0;
    c->ex = (const uint16_t *)g_place(c, 0, c->d.experts, cap * KH * 2, mb);
    c->wt = (const float *)g_place(c, 1, c->d.weights, cap * (size_t)s.K * 4, 2 * mb);
    c->res = (const uint16_t *)g_place(c, 2, c->d.residual, (size_t)T * (size_t)s.H * 2, mb);
    c->wpost = (const uint16_t *)g_place(c, 3, c->d.wpost, (size_t)s.H * 2, mb);
    c->wnext = (const uint16_t *)g_place(c, 4, c->d.wnext, (size_t)s.H * 2, mb);
    if (ln->kind != G_QUANT) return;
    qm_forms(c->forms, T);
    for (f = 0; f < QM_NFORMS; f++) {
        const size_t nv = g_nv(&c->forms[f], T, s.H), ns = g_ns(&c->forms[f], T, s.H);
        c->want_v[f] = (uint8_t *)hu_alloc(nv, 0);
        c->want_s[f] = (float *)hu_alloc(4 * ns, 0);
        memset(c->want_v[f], 0x5A, nv);
        memset(c->want_s[f], 0xFF, 4 * ns); /* a NaN: never a scale */
        qm_quant(&c->forms[f], c->ref_n, T, s.H, c->want_v[f], c->want_s[f]);
    }
}

static void gcase_free(gcase *c)
{
    int i;
    for (i = 0; i < 5; i++) dev_unplace(c->blocks[i], c->dev);
    for (i = 0; i < QM_NFORMS; i++) {
        hu_free(c->want_v[i]);
        hu_free(c->want_s[i]);
    }
    hu_free(c->ref_h);
    hu_free(c->ref_n);
    hc_free(&c->d);
}

/* One world: R ranks on one group, the cases of every line. */
typedef struct gworld {
    const beam_ops *ops;
    beam_cpu_group *g;
    int R, ncases[G_NLINES];
    gcase *cases[G_NLINES];
    int64_t T[G_NLINES][16], maxT[G_NLINES];
    int nT[G_NLINES];
    size_t out_el, nv, ns; /* the largest outputs of a call */
} gworld;

/* A rank: its outputs (h, n, qv, qs; on a device backend staged through
 * the host and on the device at dh, dn, dqv, dqs) and its first failure. */
typedef struct grank {
    const gworld *w;
    int rank, bad;
    long calls;
    void *stream;
    uint16_t *h, *n, *dh, *dn;
    uint8_t *qv, *dqv;
    float *qs, *dqs;
    char first[400];
} grank;

/* Copies of a rank's n bytes of host buffer h and the device's d, one way
 * or the other (the host backend's are one): 0, or -1. */
static int g_copy(const grank *a, void *h, void *d, size_t n, int up)
{
    if (h == d || n == 0) return 0;
    return up ? dev_upload_on(d, h, n, a->stream) : dev_download(h, d, n);
}

/* Where n values of got first differ from want (n: none). */
static size_t g_diff(const void *got, const void *want, size_t n, size_t size)
{
    size_t i;
    if (n == 0 || !memcmp(got, want, n * size)) return n;
    for (i = 0; i < n && !memcmp((const char *)got + i * size, (const char *)want + i * size, size); i++) continue;
    return i;
}

/* One call of rank a on case c: T tokens, strategy s, quant form f
 * (QM_NFORMS: none; q: through the _q entry), normalized kept or not.
 * 0 when every output is the reference's (or the model's) and nothing
 * past them was written; else 1, with the first failure noted. */
static int gcall(grank *a, beam_workspace *ws, const gcase *c, int64_t T, beam_strategy s, int q, int f,
                 int keep)
{
    const beam_ops *ops = a->w->ops;
    const hc_spec *sp = &c->d.s;
    const int R = a->w->R, off = sp->misalign;
    const int64_t L = (T + R - 1) / R, r0 = (int64_t)a->rank * L;
    const size_t th = (size_t)T * (size_t)sp->H, rows = th + (size_t)G_GUARD * (size_t)sp->H;
    const int kept = sp->next && (keep == 2 ? a->rank % 2 == 0 : keep);
    const size_t nb = kept ? 2 * rows + 2 : 0; /* normalized's bytes to check */
    const size_t nv = f < QM_NFORMS ? g_nv(&c->forms[f], T, sp->H) : 0;
    const size_t ns = f < QM_NFORMS ? g_ns(&c->forms[f], T, sp->H) : 0;
    const beam_norm post = {c->d.post.weight ? c->wpost : NULL, c->d.post.eps};
    const beam_norm next = {c->d.next.weight ? c->wnext : NULL, c->d.next.eps};
    uint16_t *hid = a->dh + off, *nrm = a->dn + off;
    beam_quant qu;
    beam_status st;
    size_t at = 0;
    const char *what = NULL;
    hu_poison(a->h, 2 * rows + 2);
    hu_poison(a->n, nb);
    if (sp->inplace) memcpy(a->h + off, c->d.residual, 2 * th);
    if (f < QM_NFORMS) {
        memset(a->qv, 0x5A, nv);
        memset(a->qs, 0xFF, 4 * ns);
        qu = c->forms[f];
        qm_bind(&qu, a->dqv, a->dqs);
    }
    if (g_copy(a, a->h, a->dh, 2 * rows + 2, 1) || g_copy(a, a->n, a->dn, nb, 1) ||
        g_copy(a, a->qv, a->dqv, nv, 1) || g_copy(a, a->qs, a->dqs, 4 * ns, 1))
        st = BEAM_ERR_DEVICE;
    else if (q)
        st = ops->moe_finalize_gather_norm_residual_norm_q(
            ws, c->ex + (size_t)r0 * (size_t)sp->K * (size_t)sp->H, c->wt + (size_t)r0 * (size_t)sp->K,
            c->d.cap - (R - 1) * L, T, sp->K, sp->H, c->d.rs, sp->post ? &post : NULL, sp->inplace ? hid : c->res,
            sp->scales ? c->d.scales : NULL, sp->next ? &next : NULL, hid, kept ? nrm : NULL,
            f < QM_NFORMS ? &qu : NULL, s, a->stream);
    else
        st = ops->moe_finalize_gather_norm_residual_norm(
            ws, c->ex + (size_t)r0 * (size_t)sp->K * (size_t)sp->H, c->wt + (size_t)r0 * (size_t)sp->K,
            c->d.cap - (R - 1) * L, T, sp->K, sp->H, c->d.rs, sp->post ? &post : NULL, sp->inplace ? hid : c->res,
            sp->scales ? c->d.scales : NULL, sp->next ? &next : NULL, hid, kept ? nrm : NULL, s, a->stream);
    if (st == BEAM_OK && ops->device_memory &&
        (dev_stream_sync(a->stream) || g_copy(a, a->h, a->dh, 2 * rows + 2, 0) ||
         g_copy(a, a->n, a->dn, nb, 0) || g_copy(a, a->qv, a->dqv, nv, 0) ||
         g_copy(a, a->qs, a->dqs, 4 * ns, 0)))
        st = BEAM_ERR_DEVICE;
    ++a->calls;
    if (st != BEAM_OK)
        what = "status";
    else if ((at = g_diff(a->h + off, c->ref_h, th, 2)) < th)
        what = "hidden_out";
    else if (!hu_is_poison(a->h + off + th, 2 * (rows - th)))
        what = "hidden_out past T";
    else if (kept && (at = g_diff(a->n + off, c->ref_n, th, 2)) < th)
        what = "normalized";
    else if (kept && !hu_is_poison(a->n + off + th, 2 * (rows - th)))
        what = "normalized past T";
    else if ((at = g_diff(a->qv, c->want_v[f < QM_NFORMS ? f : 0], nv, 1)) < nv)
        what = "values";
    else if ((at = g_diff(a->qs, c->want_s[f < QM_NFORMS ? f : 0], ns, 4)) < ns)
        what = "scales";
    if (what) {
        char desc[200];
        hc_describe(sp, desc, sizeof desc);
        snprintf(a->first, sizeof a->first,
                 "%s R=%d rank %d T=%lld strategy %d%s form %d normalized %s [%s]: %s [%zu]: %d %s", ops->name, R,
                 a->rank, (long long)T, (int)s, q ? " _q" : "", f, kept ? "kept" : "NULL", desc, what, at, (int)st,
                 st != BEAM_OK ? ops->last_error() : "");
    }
    return what != NULL;
}

/* Rank a: every line's workspace, its calls, its destruction. */
static void *grank_main(void *p)
{
    static const beam_strategy strats[4] = {BEAM_STRATEGY_UNFUSED, BEAM_STRATEGY_AUTO, BEAM_STRATEGY_ONESHOT,
                                            BEAM_STRATEGY_TWOSHOT};
    grank *a = (grank *)p;
    const gworld *w = a->w;
    const beam_ops *ops = w->ops;
    int l, i, t, k, f, keep;
    for (l = 0; l < G_NLINES && !a->bad; l++) {
        const int quant = GPLAN[l].kind == G_QUANT;
        beam_workspace_config cfg = ops->workspace_config_default();
        beam_workspace *ws = NULL;
        beam_status st;
        if (!w->ncases[l]) continue;
        if (GPLAN[l].one) {
            cfg.oneshot_max_tokens = GPLAN[l].one;
            cfg.twoshot_max_tokens = GPLAN[l].two;
        }
        st = ops->workspace_create_cpu(w->g, a->rank, w->maxT[l], GPLAN[l].H, &cfg, &ws);
        if (st != BEAM_OK) {
            snprintf(a->first, sizeof a->first, "%s workspace: %d %s", ops->name, (int)st, ops->last_error());
            a->bad++;
        }
        for (i = 0; i < w->ncases[l] && !a->bad; i++)
            for (t = 0; t < (GPLAN[l].kind == G_LARGE ? w->nT[l] : 1) && !a->bad; t++)
                for (k = 0; k < 4 && !a->bad; k++)
                    for (f = quant ? 0 : QM_NFORMS; f <= QM_NFORMS && !a->bad; f++)
                        for (keep = f < QM_NFORMS ? 0 : 1; keep < (f < QM_NFORMS ? 3 : 2) && !a->bad; keep++)
                            a->bad += gcall(a, ws, &w->cases[l][i],
                                            GPLAN[l].kind == G_LARGE ? w->T[l][t] : w->cases[l][i].T, strats[k],
                                            quant, f, keep);
        if (ws && ops->workspace_destroy(ws) != BEAM_OK && !a->bad) {
            snprintf(a->first, sizeof a->first, "%s destroy: %s", ops->name, ops->last_error());
            a->bad++;
        }
    }
    return NULL;
}

static void gworld_make(gworld *w, const beam_ops *ops, int R)
{
    int l, i, n = 0;
    memset(w, 0, sizeof *w);
    w->ops = ops;
    w->R = R;
    for (l = 0; l < G_NLINES; l++) {
        const int large = GPLAN[l].kind == G_LARGE;
        /* BEAM_TEST_QUICK: every other token count, no G_LARGE */
        const int step = hu_quick() ? 2 : 1;
        w->nT[l] = large && (hu_quick() || !ops->device_memory) ? 0 : (GPLAN[l].nt + step - 1) / step;
        for (i = 0; i < w->nT[l]; i++) w->T[l][i] = GPLAN[l].t[step * i][0] * R + GPLAN[l].t[step * i][1];
        w->ncases[l] = large ? w->nT[l] > 0 : w->nT[l];
        w->cases[l] = (gcase *)hu_alloc(sizeof(gcase) * (size_t)(w->nT[l] + 1), 0);
        for (i = 0; i < w->nT[l]; i++)
            if (w->T[l][i] > w->maxT[l]) w->maxT[l] = w->T[l][i];
        for (i = 0; i < w->ncases[l]; i++, n++) {
            const int64_t T = w->ncases[l] == w->nT[l] ? w->T[l][i] : w->maxT[l];
            int f;
            gcase_make(ops, &w->cases[l][i], l, R, T, n);
            for (f = 0; GPLAN[l].kind == G_QUANT && f < QM_NFORMS; f++) {
                const size_t nv = g_nv(&w->cases[l][i].forms[f], T, GPLAN[l].H);
                const size_t ns = g_ns(&w->cases[l][i].forms[f], T, GPLAN[l].H);
                if (nv > w->nv) w->nv = nv;
                if (ns > w->ns) w->ns = ns;
            }
        }
        if ((size_t)(w->maxT[l] + G_GUARD) * (size_t)GPLAN[l].H > w->out_el)
            w->out_el = (size_t)(w->maxT[l] + G_GUARD) * (size_t)GPLAN[l].H;
    }
    w->out_el += 8;
}

static void gworld_free(gworld *w)
{
    int l, i;
    for (l = 0; l < G_NLINES; l++) {
        for (i = 0; i < w->ncases[l]; i++) gcase_free(&w->cases[l][i]);
        hu_free(w->cases[l]);
    }
}

/* The device's copy of a rank's host buffer h of n bytes (a host backend's:
 * h itself). */
static void *g_dev(const grank *a, void *h, size_t n)
{
    void *d = a->w->ops->device_memory ? dev_alloc(n) : h;
    if (!d) {
        fprintf(stderr, "device memory: %s\n", dev_last_error());
        exit(1);
    }
    return d;
}

/* The rank's outputs, on the host and (a device backend) on the device. */
static void grank_bufs(grank *a, int make)
{
    const size_t ob = 2 * a->w->out_el, vb = a->w->nv + 1, sb = 4 * a->w->ns + 4;
    void *hb[4] = {a->h, a->n, a->qv, a->qs}, *db[4] = {a->dh, a->dn, a->dqv, a->dqs};
    int i;
    if (make) {
        a->dh = (uint16_t *)g_dev(a, a->h = (uint16_t *)hu_alloc(ob, 0), ob);
        a->dn = (uint16_t *)g_dev(a, a->n = (uint16_t *)hu_alloc(ob, 0), ob);
        a->dqv = (uint8_t *)g_dev(a, a->qv = (uint8_t *)hu_alloc(vb, 0), vb);
        a->dqs = (float *)g_dev(a, a->qs = (float *)hu_alloc(sb, 0), sb);
        return;
    }
    for (i = 0; i < 4; i++) {
        if (db[i] != hb[i]) dev_free(db[i]);
        hu_free(hb[i]);
    }
}

static void test_gather(void)
{
    static const int Rs[] = {1, 2, 3, 4, 5, 8};
    FOR_EACH_BACKEND(ops)
    {
        long calls = 0;
        int ri, r;
        for (ri = 0; ri < hu_world_sizes(ops->device_memory); ri++) {
            const int R = Rs[ri];
            gworld w;
            grank ranks[8];
            pthread_t th[8];
            gworld_make(&w, ops, R);
            CU_ASSERT_EQUAL_FATAL(ops->cpu_group_create(R, &w.g), BEAM_OK);
            /* the uploads land before any rank's stream runs */
            if (ops->device_memory) CU_ASSERT_EQUAL_FATAL(dev_sync(), 0);
            for (r = 0; r < R; r++) {
                memset(&ranks[r], 0, sizeof ranks[r]);
                ranks[r].w = &w;
                ranks[r].rank = r;
                grank_bufs(&ranks[r], 1);
                if (ops->device_memory) {
                    /* the stream's first kernel (a local op) before any rank's gather: a first launch may
                     * wait for the device's other work, a peer's gather kernel waiting for this rank */
                    uint16_t zero[3 * 256] = {0};
                    CU_ASSERT_PTR_NOT_NULL_FATAL(ranks[r].stream = dev_stream_create());
                    CU_ASSERT_EQUAL_FATAL(dev_upload_on(ranks[r].dh, zero, sizeof zero, ranks[r].stream), 0);
                    CU_ASSERT_EQUAL_FATAL(ops->norm_residual_norm(ranks[r].dh, ranks[r].dh + 256, 1, 256, NULL, NULL,
                                                                  NULL, ranks[r].dh + 512, NULL, ranks[r].stream),
                                          BEAM_OK);
                    CU_ASSERT_EQUAL_FATAL(dev_stream_sync(ranks[r].stream), 0);
                }
            }
            for (r = 0; r < R; r++)
                CU_ASSERT_EQUAL_FATAL(pthread_create(&th[r], NULL, grank_main, &ranks[r]), 0);
            for (r = 0; r < R; r++) {
                pthread_join(th[r], NULL);
                if (ranks[r].bad)
                    fprintf(stderr, "  gather: %s (seed %llu)\n", ranks[r].first, (unsigned long long)g_seed);
                CU_ASSERT_EQUAL(ranks[r].bad, 0);
                calls += ranks[r].calls;
                dev_stream_destroy(ranks[r].stream);
                grank_bufs(&ranks[r], 0);
            }
            CU_ASSERT_EQUAL(ops->cpu_group_destroy(w.g), BEAM_OK);
            gworld_free(&w);
        }
        g_runs += calls;
        printf("  gather: %s, %ld calls\n", ops->name, calls);
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
    /* the gather's in-process ranks share one GPU */
    dev_shared_gpu_env();
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
