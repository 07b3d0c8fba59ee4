/*
 * test_allreduce.c - the tensor-parallel all-reduce (docs/numerics.md#all-reduce)
 * of every backend whose in-process group has one, against the naive
 * reference (nr_allreduce): R = 1 .. 8 ranks as threads of one group, both
 * forms (the dense layer's partial rows, the MoE layer's partial slots),
 * every strategy, T from 0 (fewer than R, not divisible by R), the norms,
 * scales, routed scale, in place and exotic values of the suite's sweep,
 * and every quantized form; a device backend's calls across the epoch
 * wrap and the LL clearing epochs; a group of one against the local
 * operations; ranks that disagree, one rank's bad argument or a rank that
 * never calls, refused on every rank with nothing written (a device
 * backend's ONESHOT at LL sizes too, where ranks that disagree are found
 * after the rows are used: outputs may be written, docs/contract.md). A device
 * backend's ranks share one device (each its own stream): its arrays are
 * device copies, made before the ranks start.
 *
 * Every rank's inputs are its own draw (hc_make with the rank in the seed):
 * a rank's partials, or its expert slots with rank 0's routing weights
 * (the router is replicated); residual, norms and scales are rank 0's.
 * Each rank's calls run back to back with no sync but the library's own.
 * BEAM_TEST_RANKS=R: the results at that world size only (1, 2, 3, 4, 5
 * or 8), whatever BEAM_TEST_QUICK says, with the draws that size takes in
 * a run of every size (a failure of that run repeats with its seed).
 */
#define _POSIX_C_SOURCE 200809L /* setenv, nanosleep */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <CUnit/CUnit.h>

#include "backends.h"
#include "beammoe.h"
#include "devmem.h"
#include "quant_model.h"
#include "suite.h"

#define A_GUARD 3   /* output rows past T that must stay untouched */
#define A_QGUARD 64 /* bytes of values, floats of scales past the model's extent */
#define A_MAXR 8

static uint64_t g_seed;
static long g_calls;
static const beam_ops *g_ops[BM_NBACKENDS];

/* One problem of R ranks: their draws, the reference of both forms. */
typedef struct acase {
    int R, dev;
    int64_t T;
    hc_case d[A_MAXR];
    /* where the backend reads them (dev: device copies): each rank's
     * partials and slots, rank 0's weights, residual and norm weights */
    const uint16_t *x[A_MAXR], *ex[A_MAXR], *res, *wpost, *wpre, *wnext;
    const float *wt;
    void *blocks[2 * A_MAXR + 5];
    int nblocks;
    uint16_t *ref_h[2], *ref_n[2]; /* [T, H]: dense, MoE */
    int only[2];                   /* the one quantized form of each (-1: all) */
    beam_quant forms[QM_NFORMS];
    uint8_t *want_v[2][QM_NFORMS];
    float *want_s[2][QM_NFORMS];
} acase;

static size_t a_nv(const beam_quant *q, int64_t T, int32_t H) { return qm_values_bytes(q, T, H) + A_QGUARD; }
static size_t a_ns(const beam_quant *q, int64_t T, int32_t H) { return qm_scale_floats(q, T, H) + A_QGUARD; }
static size_t a_max(size_t a, size_t b) { return a > b ? a : b; }

/* host as the backend reads it (dev_place); c keeps the copy */
static const void *a_place(acase *c, const void *host, size_t bytes, size_t off)
{
    const void *p = dev_place(host, bytes, off, c->dev, &c->blocks[c->nblocks]);
    if (host && !p) {
        fprintf(stderr, "device memory: %s\n", dev_last_error());
        exit(1);
    }
    if (c->blocks[c->nblocks]) c->nblocks++;
    return p;
}

/* only: -1, or the quantized form of the dense calls (the MoE calls'
 * the next one): the only ones called, and modelled (the large lines: the
 * model takes seconds a form there) */
static void acase_make(const beam_ops *ops, acase *c, int R, int n, int32_t H, int64_t T, int only)
{
    const uint16_t *part[A_MAXR], *slots[A_MAXR];
    hc_spec s = hc_sweep_spec(n);
    /* the sweep's misaligned specs: every array 2 (BF16) or 4 (FP32)
     * bytes off 16, which takes the kernels' unaligned twins */
    const size_t mb = s.misalign ? 2 : 0, mf = s.misalign ? 4 : 0;
    int r, m, f;
    memset(c, 0, sizeof *c);
    c->R = R;
    c->dev = ops->device_memory;
    c->T = T;
    c->only[0] = only < 0 ? -1 : only % QM_NFORMS;
    c->only[1] = only < 0 ? -1 : (only + 1) % QM_NFORMS;
    s.H = H;
    s.T = T;
    if (only >= 0 && s.K > 4) s.K = 4; /* the large lines' draws take seconds a rank */
    if (s.next == HC_NORM_OFF && n % 3 == 0) s.next = HC_NORM_WEIGHT; /* the quantized calls need one */
    for (r = 0; r < R; r++) {
        hc_make(&c->d[r], &s, g_seed ^ (0xA11ULL + 7919ULL * (uint64_t)n + 131ULL * (uint64_t)r));
        part[r] = c->d[r].x;
        slots[r] = c->d[r].experts;
        c->x[r] = (const uint16_t *)a_place(c, part[r], 2 * (size_t)c->d[r].cap * (size_t)H, mb);
        c->ex[r] = (const uint16_t *)a_place(c, slots[r], 2 * (size_t)c->d[r].cap * (size_t)s.K * (size_t)H, mb);
    }
    c->wt = (const float *)a_place(c, c->d[0].weights, 4 * (size_t)c->d[0].cap * (size_t)s.K, mf);
    c->res = (const uint16_t *)a_place(c, c->d[0].residual, 2 * (size_t)c->d[0].cap * (size_t)H, mb);
    c->wpost = (const uint16_t *)a_place(c, c->d[0].post.weight, 2 * (size_t)H, mb);
    c->wpre = (const uint16_t *)a_place(c, c->d[0].pre.weight, 2 * (size_t)H, mb);
    c->wnext = (const uint16_t *)a_place(c, c->d[0].next.weight, 2 * (size_t)H, mb);
    for (m = 0; m < 2; m++) {
        const hc_case *d = &c->d[0];
        c->ref_h[m] = (uint16_t *)hu_alloc(2 * (size_t)T * (size_t)H + 2, 0);
        c->ref_n[m] = (uint16_t *)hu_alloc(2 * (size_t)T * (size_t)H + 2, 0);
        nr_allreduce(m ? NULL : part, slots, d->weights, R, T, s.K, H, d->rs, m ? &d->post : &d->pre,
                     d->residual, s.scales ? d->scales : NULL, &d->next, c->ref_h[m], c->ref_n[m]);
        if (!s.next) continue;
        qm_forms(c->forms, T);
        for (f = 0; f < QM_NFORMS; f++) {
            const size_t nv = a_nv(&c->forms[f], T, H), ns = a_ns(&c->forms[f], T, H);
            if (c->only[m] >= 0 && f != c->only[m]) continue;
            c->want_v[m][f] = (uint8_t *)hu_alloc(nv, 0);
            c->want_s[m][f] = (float *)hu_alloc(4 * ns, 0);
            memset(c->want_v[m][f], 0x5A, nv);
            memset(c->want_s[m][f], 0xFF, 4 * ns);
            qm_quant(&c->forms[f], c->ref_n[m], T, H, c->want_v[m][f], c->want_s[m][f]);
        }
    }
}

static void acase_free(acase *c)
{
    int r, m, f;
    for (m = 0; m < 2; m++) {
        hu_free(c->ref_h[m]);
        hu_free(c->ref_n[m]);
        for (f = 0; f < QM_NFORMS; f++) {
            hu_free(c->want_v[m][f]);
            hu_free(c->want_s[m][f]);
        }
    }
    for (r = 0; r < c->R; r++) hc_free(&c->d[r]);
    for (r = 0; r < c->nblocks; r++) dev_unplace(c->blocks[r], c->dev);
}

/* One call of rank r on c: form m (0 dense, 1 MoE), strategy s, quant form
 * f (QM_NFORMS: none), normalized kept or not; outputs h, n, qv, qs where
 * the backend writes (room for T + A_GUARD rows; in place: h holds the
 * residual). */
static beam_status acall(const beam_ops *ops, beam_workspace *ws, const acase *c, int r, int m, beam_strategy s,
                         int f, int keep, uint16_t *h, uint16_t *n, uint8_t *qv, float *qs, void *stream)
{
    const hc_case *d0 = &c->d[0];
    const hc_spec *sp = &d0->s;
    const beam_norm post = {c->wpost, d0->post.eps}, pre = {c->wpre, d0->pre.eps};
    const beam_norm next = {c->wnext, d0->next.eps};
    const beam_norm *first = m ? (sp->post ? &post : NULL) : (sp->pre ? &pre : NULL);
    const uint16_t *res = sp->inplace ? h : c->res;
    beam_quant qu;
    if (f < QM_NFORMS) {
        qu = c->forms[f];
        qm_bind(&qu, qv, qs);
    }
    if (m)
        return ops->moe_finalize_allreduce_norm_residual_norm(
            ws, c->ex[r], c->wt, c->d[r].cap, c->T, sp->K, sp->H, d0->rs, first, res,
            sp->scales ? d0->scales : NULL, sp->next ? &next : NULL, h, keep ? n : NULL,
            f < QM_NFORMS ? &qu : NULL, s, stream);
    return ops->allreduce_norm_residual_norm(ws, c->x[r], c->T, sp->H, first, res, sp->scales ? d0->scales : NULL,
                                             sp->next ? &next : NULL, h, keep ? n : NULL,
                                             f < QM_NFORMS ? &qu : NULL, s, stream);
}

/* The cases of one world: H, then tokens a * R + b; large lines only on
 * a device backend, and not under BEAM_TEST_QUICK (top_k at most 4
 * there; normalized kept, and one quantized form for each of dense
 * and MoE: another pair at each world size, and on the line of large = k,
 * k - 1 forms further on). The last: more than 128 rows a rank on every
 * strategy at H = 7168, the two-chunk kernels of 512 threads
 * (gpu/gather_fused.cu, bm_tp_shape_index). */
static const struct aline {
    int32_t H;
    int nt, large;
    int16_t t[8][2];
} APLAN[] = {
    {256, 8, 0, {{0, 0}, {0, 1}, {1, -1}, {1, 0}, {1, 1}, {2, 3}, {0, 9}, {0, 70}}},
    {2048, 2, 0, {{0, 3}, {3, 1}}},
    {7168, 3, 0, {{0, 1}, {0, 64}, {0, 100}}},
    {2048, 1, 1, {{0, 16384}}},
    {7168, 1, 2, {{129, 44}}},
};
#define A_NLINES ((int)(sizeof APLAN / sizeof APLAN[0]))

typedef struct arank {
    const beam_ops *ops;
    beam_cpu_group *g;
    int rank, R, bad;
    long calls;
    /* outputs (bytes: ob hidden and normalized each, vb values, sb
     * scales) on the host, and where the backend writes them (d*: the
     * device's, or the host's), and the rank's stream */
    size_t ob, vb, sb;
    uint16_t *h, *n, *dh, *dn;
    uint8_t *qv, *dqv;
    float *qs, *dqs;
    void *stream;
    acase *cases[A_NLINES];
    int ncases[A_NLINES];
    int kind;              /* refusals: how rank 1 departs (BAD_*) ... */
    const acase *refused;  /* ... on this case ... */
    int ll;                /* ... with room for R * T LL rows (a device's LL path) */
    char first[800];
} arank;

/* Before a call (back 0): poison the rank's outputs (hidden's first
 * `keep` bytes from `first`: the residual of a call in place) and put
 * them where the backend writes; after it (back 1): wait for the rank's
 * stream and bring them back. hidden and normalized take `out` bytes,
 * values and scales vb and sb: the call's own form's (0 without one), not
 * the buffers', which the large lines size. 0, or -1 with
 * dev_last_error(). */
static int arank_out(arank *a, size_t out, size_t vb, size_t sb, const uint16_t *first, size_t keep, int back)
{
    void *hb[4] = {a->h, a->n, a->qv, a->qs}, *db[4] = {a->dh, a->dn, a->dqv, a->dqs};
    const size_t nb[4] = {out, out, vb, sb};
    int i;
    if (!back) {
        hu_poison(a->h, out);
        hu_poison(a->n, out);
        memset(a->qv, 0x5A, vb);
        memset(a->qs, 0xFF, sb);
        if (first) memcpy(a->h, first, keep);
    }
    if (!a->stream) return 0;
    if (back && dev_stream_sync(a->stream)) return -1;
    for (i = 0; i < 4; i++)
        if (nb[i] && (back ? dev_download(hb[i], db[i], nb[i]) : dev_upload_on(db[i], hb[i], nb[i], a->stream)))
            return -1;
    return 0;
}

/* The rank's outputs on the host and, for a device backend, on the device
 * with a stream whose first kernel (a local op) has run: a first launch
 * may wait for the device's other work, which can be a peer's kernel
 * waiting for this rank. make 0: free them. */
static void arank_bufs(arank *a, int make)
{
    void *hb[4], *db[4];
    int i;
    if (make) {
        const size_t nb[4] = {a->ob, a->ob, a->vb, a->sb};
        void **hp[4] = {(void **)&a->h, (void **)&a->n, (void **)&a->qv, (void **)&a->qs};
        void **dp[4] = {(void **)&a->dh, (void **)&a->dn, (void **)&a->dqv, (void **)&a->dqs};
        for (i = 0; i < 4; i++) {
            *hp[i] = hu_alloc(nb[i], 0);
            *dp[i] = a->ops->device_memory ? dev_alloc(nb[i]) : *hp[i];
            CU_ASSERT_PTR_NOT_NULL_FATAL(*dp[i]);
        }
        if (a->ops->device_memory) {
            CU_ASSERT_PTR_NOT_NULL_FATAL(a->stream = dev_stream_create());
            hu_poison(a->h, 3 * 2 * 256);
            CU_ASSERT_EQUAL_FATAL(dev_upload_on(a->dh, a->h, 3 * 2 * 256, a->stream), 0);
            CU_ASSERT_EQUAL_FATAL(a->ops->norm_residual_norm(a->dh, a->dh + 256, 1, 256, NULL, NULL, NULL,
                                                             a->dh + 512, NULL, a->stream), BEAM_OK);
            CU_ASSERT_EQUAL_FATAL(dev_stream_sync(a->stream), 0);
        }
        return;
    }
    hb[0] = a->h, hb[1] = a->n, hb[2] = a->qv, hb[3] = a->qs;
    db[0] = a->dh, db[1] = a->dn, db[2] = a->dqv, db[3] = a->dqs;
    for (i = 0; i < 4; i++) {
        if (db[i] != hb[i]) dev_free(db[i]);
        hu_free(hb[i]);
    }
    if (a->stream) dev_stream_destroy(a->stream);
}

static void *arank_main(void *p)
{
    static const beam_strategy strats[4] = {BEAM_STRATEGY_UNFUSED, BEAM_STRATEGY_AUTO, BEAM_STRATEGY_ONESHOT,
                                            BEAM_STRATEGY_TWOSHOT};
    arank *a = (arank *)p;
    const beam_ops *ops = a->ops;
    int l, i, k, m, f, keep;
    for (l = 0; l < A_NLINES && !a->bad; l++) {
        beam_workspace_config cfg = ops->workspace_config_default();
        beam_workspace *ws = NULL;
        int64_t maxT = 0;
        const int32_t H = APLAN[l].H;
        for (i = 0; i < a->ncases[l]; i++) maxT = a->cases[l][i].T > maxT ? a->cases[l][i].T : maxT;
        cfg.oneshot_max_tokens = 2; /* AUTO takes every strategy over the line */
        cfg.twoshot_max_tokens = 9;
        if (ops->workspace_create_cpu(a->g, a->rank, maxT, H, &cfg, &ws) != BEAM_OK) {
            snprintf(a->first, sizeof a->first, "workspace: %s", ops->last_error());
            a->bad++;
        }
        for (i = 0; i < a->ncases[l] && !a->bad; i++) {
            const acase *c = &a->cases[l][i];
            const size_t th = (size_t)c->T * (size_t)H, rows = th + A_GUARD * (size_t)H;
            const int nf = c->d[0].s.next ? QM_NFORMS : 0;
            for (m = 0; m < 2 && !a->bad; m++)
                for (k = 0; k < 4 && !a->bad; k++)
                    for (f = QM_NFORMS - nf; f <= QM_NFORMS && !a->bad; f++)
                        for (keep = f < QM_NFORMS ? 0 : 1; keep < 2 && !a->bad; keep++) {
                            const int kept = keep && c->d[0].s.next;
                            const size_t fv = f < QM_NFORMS ? a_nv(&c->forms[f], c->T, H) : 0;
                            const size_t fs = f < QM_NFORMS ? a_ns(&c->forms[f], c->T, H) : 0;
                            const char *what = NULL;
                            beam_status st;
                            if (f < QM_NFORMS ? c->only[m] >= 0 && f != c->only[m]
                                              : APLAN[l].large && !keep)
                                continue;
                            arank_out(a, 2 * rows, fv, 4 * fs, c->d[0].s.inplace ? c->d[0].residual : NULL,
                                      2 * th, 0);
                            st = acall(ops, ws, c, a->rank, m, strats[k], f, kept, a->dh, a->dn, a->dqv, a->dqs,
                                       a->stream);
                            a->calls++;
                            if (st == BEAM_OK && arank_out(a, 2 * rows, fv, 4 * fs, NULL, 0, 1))
                                what = "device";
                            else if (st != BEAM_OK)
                                what = "status";
                            else if (hu_cmp_bf16("all-reduce hidden_out", a->h, c->ref_h[m], th))
                                what = "hidden_out"; /* the first difference is on stderr */
                            else if (!hu_is_poison(a->h + th, 2 * (rows - th)))
                                what = "hidden_out past T";
                            else if (kept && hu_cmp_bf16("all-reduce normalized", a->n, c->ref_n[m], th))
                                what = "normalized";
                            else if (!hu_is_poison(a->n + (kept ? th : 0), 2 * (rows - (kept ? th : 0))))
                                what = "normalized past what was asked";
                            else if (fv && memcmp(a->qv, c->want_v[m][f], fv))
                                what = "values";
                            else if (fs && memcmp(a->qs, c->want_s[m][f], 4 * fs))
                                what = "scales";
                            if (what) {
                                char desc[200];
                                hc_describe(&c->d[0].s, desc, sizeof desc);
                                snprintf(a->first, sizeof a->first,
                                         "%s R=%d rank %d %s T=%lld strategy %d form %d normalized %s [%s]: "
                                         "%s: %d %s", ops->name, a->R, a->rank, m ? "MoE" : "dense",
                                         (long long)c->T, (int)strats[k], f, kept ? "kept" : "NULL", desc, what,
                                         (int)st, st != BEAM_OK ? ops->last_error() : dev_last_error());
                                a->bad++;
                            }
                        }
        }
        /* a call the device gave up (bad: no rows stored) reports why here */
        if (ws && ops->workspace_destroy(ws) != BEAM_OK) {
            const size_t u = strlen(a->first);
            snprintf(a->first + u, sizeof a->first - u, "%sdestroy: %s", u ? "; " : "", ops->last_error());
            a->bad++;
        }
    }
    return NULL;
}

/* proto->R ranks, each a copy of proto with its rank, run fn on threads;
 * the failures of each reported. */
static void run_ranks(const arank *proto, void *(*fn)(void *), const char *what)
{
    arank ranks[A_MAXR];
    pthread_t th[A_MAXR];
    int r;
    /* the uploads land before any rank's stream runs */
    if (proto->ops->device_memory) CU_ASSERT_EQUAL_FATAL(dev_sync(), 0);
    for (r = 0; r < proto->R; r++) {
        ranks[r] = *proto;
        ranks[r].rank = r;
        arank_bufs(&ranks[r], 1);
    }
    for (r = 0; r < proto->R; r++) CU_ASSERT_EQUAL_FATAL(pthread_create(&th[r], NULL, fn, &ranks[r]), 0);
    for (r = 0; r < proto->R; r++) {
        pthread_join(th[r], NULL);
        if (ranks[r].bad) fprintf(stderr, "  %s: %s (seed %llu)\n", what, ranks[r].first, (unsigned long long)g_seed);
        CU_ASSERT_EQUAL(ranks[r].bad, 0);
        g_calls += ranks[r].calls;
        arank_bufs(&ranks[r], 0);
    }
}

/* A group's destroy; when it fails (a workspace of the group still live),
 * the case (what) that left it so is named. */
static void group_destroy(const beam_ops *ops, beam_cpu_group *g, const char *what)
{
    const beam_status st = ops->cpu_group_destroy(g);
    if (st != BEAM_OK)
        fprintf(stderr, "  %s: %s: the group's destroy: %s (seed %llu)\n", what, ops->name, ops->last_error(),
                (unsigned long long)g_seed);
    CU_ASSERT_EQUAL(st, BEAM_OK);
}

/* the cases of line l of the plan (large: as run_plan's) */
static int plan_cases(int l, int large)
{
    return APLAN[l].large && large < 0 ? 0 : APLAN[l].nt;
}

/* R ranks of ops over the plan (large >= 0: its large lines too, from
 * that quantized form on, acase_make's only); *n counts the cases made,
 * the index of each one's draw in the sweep */
static void run_plan(const beam_ops *ops, int R, int large, int *n)
{
    arank proto;
    acase *cases[A_NLINES];
    beam_cpu_group *g;
    int l, i;
    CU_ASSERT_EQUAL_FATAL(ops->cpu_group_create(R, &g), BEAM_OK);
    memset(&proto, 0, sizeof proto);
    proto.vb = proto.sb = 4;
    for (l = 0; l < A_NLINES; l++) {
        proto.ncases[l] = plan_cases(l, large);
        cases[l] = (acase *)hu_alloc(sizeof(acase) * (size_t)APLAN[l].nt, 0);
        for (i = 0; i < proto.ncases[l]; i++, (*n)++) {
            acase *c = &cases[l][i];
            int f;
            acase_make(ops, c, R, *n, APLAN[l].H, APLAN[l].t[i][0] * R + APLAN[l].t[i][1],
                       APLAN[l].large ? large + APLAN[l].large - 1 : -1);
            proto.ob = a_max(proto.ob, 2 * (size_t)(c->T + A_GUARD) * (size_t)APLAN[l].H);
            for (f = 0; c->d[0].s.next && f < QM_NFORMS; f++) {
                proto.vb = a_max(proto.vb, a_nv(&c->forms[f], c->T, APLAN[l].H));
                proto.sb = a_max(proto.sb, 4 * a_ns(&c->forms[f], c->T, APLAN[l].H));
            }
        }
        proto.cases[l] = cases[l];
    }
    proto.ops = ops;
    proto.g = g;
    proto.R = R;
    run_ranks(&proto, arank_main, "all-reduce");
    group_destroy(ops, g, "all-reduce");
    for (l = 0; l < A_NLINES; l++) {
        for (i = 0; i < proto.ncases[l]; i++) acase_free(&cases[l][i]);
        hu_free(cases[l]);
    }
}

static void test_results(void)
{
    static const int Rs[] = {1, 2, 3, 4, 5, 8};
    const char *only = getenv("BEAM_TEST_RANKS"); /* one world size of Rs */
    FOR_EACH_BACKEND(ops)
    {
        int ri, n = 0;
        for (ri = 0; ri < (only ? 6 : hu_world_sizes(ops->device_memory)); ri++) {
            const double t0 = hu_now();
            const int large = !hu_quick() && ops->device_memory ? 2 * ri : -1;
            if (only && atoi(only) != Rs[ri]) {
                int l; /* the draws the skipped world size would take */
                for (l = 0; l < A_NLINES; l++) n += plan_cases(l, large);
                continue;
            }
            run_plan(ops, Rs[ri], large, &n);
            fprintf(stderr, "  all-reduce: %s R=%d done in %.1f s, %ld calls so far\n", ops->name, Rs[ri],
                    hu_now() - t0, g_calls);
        }
    }
}

/* A device backend's workspaces started just before the LL tag's 32-bit
 * wrap and before the epochs that clear the LL rows (k * 2^30, k * 2^30 +
 * 1; BEAM_GATHER_EPOCH, read at creation): the plan's calls, LL and flag
 * sizes alike, cross both. */
static void test_wrap(void)
{
    static const char *const starts[2] = {"0xFFFFFFF9", "0x3FFFFFFD"};
    FOR_EACH_BACKEND(ops)
    {
        int k, n = 0;
        if (!ops->device_memory || hu_world_sizes(ops->device_memory) < 3) continue;
        for (k = 0; k < 2; k++) {
            setenv("BEAM_GATHER_EPOCH", starts[k], 1);
            run_plan(ops, 3, -1, &n);
            unsetenv("BEAM_GATHER_EPOCH");
        }
    }
}

/* Case s of a group of one (workspace ws) against the local operations:
 * the fused op for the MoE form, norm_residual_norm for the dense one. */
static void one_rank_case(const beam_ops *ops, beam_workspace *ws, hc_spec s, uint64_t seed)
{
    const unsigned dev = ops->device_memory ? HC_DEVICE : 0u;
    hc_case d;
    int m;
    hc_make(&d, &s, seed);
    for (m = 0; m < 2; m++) {
        const hc_op op = m ? HC_FUSED : HC_NRN;
        char err[300] = "";
        hc_out o[2];
        hc_bound b;
        beam_status st[2];
        CU_ASSERT_EQUAL_FATAL(hc_out_make(&o[0], &d, 1), 0);
        CU_ASSERT_EQUAL_FATAL(hc_out_make(&o[1], &d, 1), 0);
        CU_ASSERT_EQUAL_FATAL(hc_bind(&b, &d, op, &o[0], hc_how(&s) | dev, err, sizeof err), 0);
        if (m)
            st[0] = ops->moe_finalize_allreduce_norm_residual_norm(
                ws, b.experts, b.weights, d.cap, s.T, s.K, s.H, d.rs, b.post_p, b.residual, b.scales, b.next_p,
                b.hidden, b.normalized, NULL, BEAM_STRATEGY_AUTO, NULL);
        else
            st[0] = ops->allreduce_norm_residual_norm(ws, b.x, s.T, s.H, b.pre_p, b.residual, b.scales, b.next_p,
                                                      b.hidden, b.normalized, NULL, BEAM_STRATEGY_AUTO, NULL);
        CU_ASSERT_EQUAL(hc_finish(&b, err, sizeof err), 0);
        hc_unbind(&b);
        st[1] = hc_run(ops, &d, op, BEAM_STRATEGY_FUSED, hc_how(&s) | dev, &o[1], err, sizeof err);
        CU_ASSERT_EQUAL(st[0], BEAM_OK);
        CU_ASSERT_EQUAL(st[1], BEAM_OK);
        CU_ASSERT(memcmp(o[0].hidden, o[1].hidden, 2 * (size_t)o[0].rows * (size_t)s.H) == 0);
        CU_ASSERT(memcmp(o[0].normalized, o[1].normalized, 2 * (size_t)o[0].rows * (size_t)s.H) == 0);
        hc_out_free(&o[0]);
        hc_out_free(&o[1]);
        g_calls += 2;
    }
    hc_free(&d);
}

/* Prefill sizes of a group of one on a device backend, not under
 * BEAM_TEST_QUICK: the two-chunk launch shapes, with more rows than the
 * grid has blocks (its launch cap, gpu/tp_shape.h); the last with its
 * arrays 2 bytes off 16 (the kernels' unaligned twins). */
static const hc_spec ONE_PREFILL[] = {
    {.K = 8, .H = 7168, .T = 4096, .post = HC_NORM_WEIGHT, .pre = HC_NORM_WEIGHT, .next = HC_NORM_WEIGHT,
     .scales = 1, .exotic = 1},
    {.K = 4, .H = 4096, .T = 1000, .pad = 3, .post = HC_NORM_PLAIN, .next = HC_NORM_WEIGHT, .rs_one = 1,
     .inplace = 1},
    {.K = 6, .H = 2048, .T = 700, .pre = HC_NORM_WEIGHT, .next = HC_NORM_WEIGHT, .scales = 1, .exotic = 1},
    {.K = 8, .H = 7168, .T = 2000, .post = HC_NORM_WEIGHT, .pre = HC_NORM_PLAIN, .next = HC_NORM_WEIGHT,
     .misalign = 1},
};
#define ONE_NPREFILL ((int)(sizeof ONE_PREFILL / sizeof ONE_PREFILL[0]))

/* A group of one gives the local operations' bits over the suite's sweep
 * (signed zeros, NaNs, infinities and subnormals included, misaligned
 * arrays), and on a device backend at prefill sizes. */
static void test_one_rank(void)
{
    FOR_EACH_BACKEND(ops)
    {
        beam_cpu_group *g;
        beam_workspace *ws;
        int i;
        CU_ASSERT_EQUAL_FATAL(ops->cpu_group_create(1, &g), BEAM_OK);
        CU_ASSERT_EQUAL_FATAL(ops->workspace_create_cpu(g, 0, 128, 8192, NULL, &ws), BEAM_OK);
        for (i = 0; i < HC_SWEEP_SIZE; i++) {
            const hc_spec s = hc_sweep_spec(i);
            if (s.H == 8192) /* the workspace's */
                one_rank_case(ops, ws, s, g_seed ^ (0x1A11ULL + (uint64_t)i));
        }
        CU_ASSERT_EQUAL(ops->workspace_destroy(ws), BEAM_OK);
        for (i = 0; ops->device_memory && !hu_quick() && i < ONE_NPREFILL; i++) {
            const hc_spec *s = &ONE_PREFILL[i];
            CU_ASSERT_EQUAL_FATAL(ops->workspace_create_cpu(g, 0, s->T, s->H, NULL, &ws), BEAM_OK);
            one_rank_case(ops, ws, *s, g_seed ^ (0x1A12ULL + (uint64_t)i));
            CU_ASSERT_EQUAL(ops->workspace_destroy(ws), BEAM_OK);
        }
        group_destroy(ops, g, "a group of one");
    }
}

/* ---- refusals: every rank fails, nothing written ------------------------- */

enum {
    BAD_TOKENS, BAD_HIDDEN, BAD_GATHER, BAD_FORM, BAD_NULL, BAD_NULL_SLOTS, BAD_STRATEGY,
    BAD_ABSENT, /* rank 1 never calls: its peers time out (ABSENT_MS) */
    BAD_NKINDS
};
#define ABSENT_MS 300

/* Rank 1 (the last rank with R = 1) departs from the others as a->kind says. */
static void *brank_main(void *p)
{
    arank *a = (arank *)p;
    const acase *c = a->refused;
    const hc_case *d = &c->d[a->rank];
    const int32_t H = d->s.H;
    const int odd = a->rank == (a->R > 1 ? 1 : 0);
    const size_t th = (size_t)c->T * (size_t)H;
    const uint16_t *x = c->x[a->rank], *ex = c->ex[a->rank];
    beam_workspace_config cfg = a->ops->workspace_config_default();
    beam_workspace *ws = NULL;
    beam_status st;
    if (a->kind == BAD_ABSENT) cfg.timeout_ms = ABSENT_MS;
    if (a->ops->workspace_create_cpu(a->g, a->rank, a->ll ? a->R * c->T : c->T, H, &cfg, &ws) != BEAM_OK) {
        snprintf(a->first, sizeof a->first, "workspace: %s", a->ops->last_error());
        a->bad++;
        return NULL;
    }
    if (odd && a->kind == BAD_ABSENT) {
        /* the destroy (collective on a device backend) after the peers
         * have given up */
        const struct timespec nap = {0, 3 * ABSENT_MS * 1000000L};
        nanosleep(&nap, NULL);
        a->ops->workspace_destroy(ws);
        return NULL;
    }
    arank_out(a, 2 * th, 0, 0, NULL, 0, 0);
    if (odd && a->kind == BAD_GATHER)
        st = a->ops->moe_finalize_gather_norm_residual_norm(ws, ex, c->wt, d->cap, c->T, d->s.K, H, d->rs, NULL,
                                                            c->res, NULL, NULL, a->dh, NULL, BEAM_STRATEGY_ONESHOT,
                                                            a->stream);
    else if ((odd && a->kind == BAD_FORM) || a->kind == BAD_NULL_SLOTS)
        st = a->ops->moe_finalize_allreduce_norm_residual_norm(
            ws, odd && a->kind == BAD_NULL_SLOTS ? NULL : ex, c->wt, d->cap, c->T, d->s.K, H, d->rs, NULL, c->res,
            NULL, NULL, a->dh, NULL, NULL, BEAM_STRATEGY_ONESHOT, a->stream);
    else
        st = a->ops->allreduce_norm_residual_norm(
            ws, odd && a->kind == BAD_NULL ? NULL : x, odd && a->kind == BAD_TOKENS ? c->T - 1 : c->T,
            odd && a->kind == BAD_HIDDEN ? H + 256 : H, NULL, c->res, NULL, NULL, a->dh, NULL, NULL,
            odd && a->kind == BAD_STRATEGY ? BEAM_STRATEGY_FUSED : BEAM_STRATEGY_ONESHOT, a->stream);
    a->calls++;
    {
        /* the message before the outputs come back (a download may set
         * the device's). A device backend's peers of a rank that refused
         * learn it on the device: their call returns BEAM_OK and the
         * failure is reported by the next call or, here, the destroy. */
        char msg[200];
        int back, refused;
        beam_status dst;
        /* ranks that disagree on an LL path compare signatures only after
         * the rows are used: outputs may be written (docs/contract.md).
         * The all-reduce takes it with room for R * T rows (a->ll), the
         * gather that rank 1 calls instead (BAD_GATHER) with room for T
         * (its LL rows are the T gathered ones): on every workspace here */
        const int written = a->ops->device_memory &&
                            ((a->ll && (a->kind == BAD_TOKENS || a->kind == BAD_GATHER || a->kind == BAD_FORM)) ||
                             (odd && a->kind == BAD_GATHER));
        snprintf(msg, sizeof msg, "%s", a->ops->last_error());
        back = arank_out(a, 2 * th, 0, 0, NULL, 0, 1);
        dst = a->ops->workspace_destroy(ws);
        refused = st != BEAM_OK || (a->ops->device_memory && dst != BEAM_OK);
        if (!refused || back || (!written && (!hu_is_poison(a->h, 2 * th) || !hu_is_poison(a->n, 2 * th))) ||
            (st != BEAM_OK && !msg[0]) || (!a->ops->device_memory && dst != BEAM_OK)) {
            snprintf(a->first, sizeof a->first,
                     "R=%d rank %d refusal %d: status %d, destroy %d, outputs %s, message \"%s\"", a->R, a->rank,
                     a->kind, (int)st, (int)dst, hu_is_poison(a->h, 2 * th) ? "untouched" : "written", msg);
            a->bad++;
        }
    }
    return NULL;
}

static void test_refusals(void)
{
    static const int Rs[] = {1, 2, 3};
    FOR_EACH_BACKEND(ops)
    {
        /* ll: a device backend's calls again with room for LL rows */
        const int n = (ops->device_memory ? 2 : 1) * 3 * BAD_NKINDS;
        int i;
        for (i = 0; i < n; i++) {
            const int ll = i / (3 * BAD_NKINDS), ri = i / BAD_NKINDS % 3, R = Rs[ri], k = i % BAD_NKINDS;
            arank proto;
            acase c;
            beam_cpu_group *g;
            char what[64];
            if (ri >= hu_world_sizes(ops->device_memory)) continue;
            /* one rank cannot disagree with itself */
            if (R == 1 && (k == BAD_TOKENS || k == BAD_GATHER || k == BAD_FORM || k == BAD_ABSENT)) continue;
            acase_make(ops, &c, R, k, 512, 5, -1);
            CU_ASSERT_EQUAL_FATAL(ops->cpu_group_create(R, &g), BEAM_OK);
            memset(&proto, 0, sizeof proto);
            proto.ob = 2 * 5 * 512;
            proto.vb = proto.sb = 4;
            proto.ops = ops;
            proto.g = g;
            proto.R = R;
            proto.kind = k;
            proto.refused = &c;
            proto.ll = ll;
            run_ranks(&proto, brank_main, "refusal");
            snprintf(what, sizeof what, "refusal %d at R=%d%s", k, R, ll ? ", room for LL rows" : "");
            group_destroy(ops, g, what);
            acase_free(&c);
        }
    }
}

int main(void)
{
    static const suite_test tests[] = {{"every rank count, form, strategy and output", test_results},
                                       {"a group of one is the local operation", test_one_rank},
                                       {"refusals on every rank", test_refusals},
                                       /* last: a failed assertion would leave its epoch set */
                                       {"across the epoch wrap and the LL clearing epochs", test_wrap},
                                       {NULL, NULL}};
    int b, n = 0, rc;
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* up to 8 ranks' streams on one GPU */
    dev_shared_gpu_env();
    g_seed = hu_seed("test_allreduce");
    /* every backend that runs here */
    for (b = 0; b < BM_NBACKENDS; b++) {
        const beam_ops *ops = beam_backend_ops(bm_backend_name(b), BEAM_OPS_VERSION);
        char msg[256];
        if (!ops) continue;
        if (ops->device_memory && dev_open(msg, sizeof msg)) {
            fprintf(stderr, "test_allreduce: %s runs here, but the test cannot reach its memory: %s\n", ops->name,
                    msg);
            return 1;
        }
        g_ops[b] = ops;
        printf("test_allreduce: %s\n", ops->name);
        n++;
    }
    if (!n) {
        printf("test_allreduce: no backend runs here: skipped\n");
        return 77;
    }
    rc = suite_run("allreduce", tests);
    printf("test_allreduce: %ld calls, seed %llu\n", g_calls, (unsigned long long)g_seed);
    return rc;
}
