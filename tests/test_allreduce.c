/*
 * test_allreduce.c - the tensor-parallel all-reduce (docs/numerics.md#all-reduce)
 * of every backend whose in-process group has one, against the naive
 * reference (nr_allreduce): R = 1 .. 8 ranks as threads of one group, both
 * forms (the dense layer's partial rows, the MoE layer's partial slots),
 * every strategy, T from 0 (fewer than R, not divisible by R), the norms,
 * scales, routed scale, in place and exotic values of the suite's sweep,
 * and every quantized form; a group of one against the local operations;
 * ranks that disagree, or one rank's bad argument, refused on every rank
 * with nothing written.
 *
 * Every rank's inputs are its own draw (hc_make with the rank in the seed):
 * a rank's partials, or its expert slots with rank 0's routing weights
 * (the router is replicated); residual, norms and scales are rank 0's.
 * Each rank's calls run back to back with no sync but the library's own.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/CUnit.h>

#include "backends.h"
#include "beammoe.h"
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
    int R;
    int64_t T;
    hc_case d[A_MAXR];
    uint16_t *ref_h[2], *ref_n[2]; /* [T, H]: dense, MoE */
    beam_quant forms[QM_NFORMS];
    uint8_t *want_v[2][QM_NFORMS];
    float *want_s[2][QM_NFORMS];
} acase;

static size_t a_nv(const beam_quant *q, int64_t T, int32_t H) { return qm_values_bytes(q, T, H) + A_QGUARD; }
static size_t a_ns(const beam_quant *q, int64_t T, int32_t H) { return qm_scale_floats(q, T, H) + A_QGUARD; }

static void acase_make(acase *c, int R, int n, int32_t H, int64_t T)
{
    const uint16_t *part[A_MAXR], *slots[A_MAXR];
    hc_spec s = hc_sweep_spec(n);
    int r, m, f;
    memset(c, 0, sizeof *c);
    c->R = R;
    c->T = T;
    s.H = H;
    s.T = T;
    s.misalign = 0;
    if (s.next == HC_NORM_OFF && n % 3 == 0) s.next = HC_NORM_WEIGHT; /* the quantized calls need one */
    for (r = 0; r < R; r++) {
        hc_make(&c->d[r], &s, g_seed ^ (0xA11ULL + 7919ULL * (uint64_t)n + 131ULL * (uint64_t)r));
        part[r] = c->d[r].x;
        slots[r] = c->d[r].experts;
    }
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
}

/* One call of rank r on c: form m (0 dense, 1 MoE), strategy s, quant form
 * f (QM_NFORMS: none), normalized kept or not; outputs h, n, qv, qs (room
 * for T + A_GUARD rows). */
static beam_status acall(const beam_ops *ops, beam_workspace *ws, const acase *c, int r, int m, beam_strategy s,
                         int f, int keep, uint16_t *h, uint16_t *n, uint8_t *qv, float *qs)
{
    const hc_case *d = &c->d[r], *d0 = &c->d[0];
    const hc_spec *sp = &d0->s;
    const beam_norm post = {d0->post.weight, d0->post.eps}, pre = {d0->pre.weight, d0->pre.eps};
    const beam_norm next = {d0->next.weight, d0->next.eps};
    const beam_norm *first = m ? (sp->post ? &post : NULL) : (sp->pre ? &pre : NULL);
    const uint16_t *res = sp->inplace ? h : d0->residual;
    beam_quant qu;
    if (sp->inplace) memcpy(h, d0->residual, 2 * (size_t)c->T * (size_t)sp->H);
    if (f < QM_NFORMS) {
        qu = c->forms[f];
        qm_bind(&qu, qv, qs);
    }
    if (m)
        return ops->moe_finalize_allreduce_norm_residual_norm(
            ws, d->experts, d0->weights, d->cap, c->T, sp->K, sp->H, d0->rs, first, res,
            sp->scales ? d0->scales : NULL, sp->next ? &next : NULL, h, keep ? n : NULL,
            f < QM_NFORMS ? &qu : NULL, s, NULL);
    return ops->allreduce_norm_residual_norm(ws, d->x, c->T, sp->H, first, res, sp->scales ? d0->scales : NULL,
                                             sp->next ? &next : NULL, h, keep ? n : NULL,
                                             f < QM_NFORMS ? &qu : NULL, s, NULL);
}

/* The cases of one world: H, then tokens a * R + b. */
static const struct aline {
    int32_t H;
    int nt;
    int16_t t[8][2];
} APLAN[] = {
    {256, 8, {{0, 0}, {0, 1}, {1, -1}, {1, 0}, {1, 1}, {2, 3}, {0, 9}, {0, 70}}},
    {2048, 2, {{0, 3}, {3, 1}}},
    {7168, 2, {{0, 1}, {0, 64}}},
};
#define A_NLINES ((int)(sizeof APLAN / sizeof APLAN[0]))

typedef struct arank {
    const beam_ops *ops;
    beam_cpu_group *g;
    int rank, R, bad;
    long calls;
    acase *cases[A_NLINES];
    int ncases[A_NLINES];
    int kind;              /* refusals: how rank 1 departs (BAD_*) ... */
    const acase *refused;  /* ... on this case */
    char first[400];
} arank;

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
            uint16_t *h = (uint16_t *)hu_alloc(2 * rows, 0), *n = (uint16_t *)hu_alloc(2 * rows, 0);
            size_t nv = 1, ns = 1;
            uint8_t *qv;
            float *qs;
            for (f = 0; f < nf; f++) {
                nv = a_nv(&c->forms[f], c->T, H) > nv ? a_nv(&c->forms[f], c->T, H) : nv;
                ns = a_ns(&c->forms[f], c->T, H) > ns ? a_ns(&c->forms[f], c->T, H) : ns;
            }
            qv = (uint8_t *)hu_alloc(nv, 0);
            qs = (float *)hu_alloc(4 * ns, 0);
            for (m = 0; m < 2 && !a->bad; m++)
                for (k = 0; k < 4 && !a->bad; k++)
                    for (f = QM_NFORMS - nf; f <= QM_NFORMS && !a->bad; f++)
                        for (keep = f < QM_NFORMS ? 0 : 1; keep < 2 && !a->bad; keep++) {
                            const int kept = keep && c->d[0].s.next;
                            const size_t fv = f < QM_NFORMS ? a_nv(&c->forms[f], c->T, H) : 0;
                            const size_t fs = f < QM_NFORMS ? a_ns(&c->forms[f], c->T, H) : 0;
                            const char *what = NULL;
                            beam_status st;
                            hu_poison(h, 2 * rows);
                            hu_poison(n, 2 * rows);
                            memset(qv, 0x5A, nv);
                            memset(qs, 0xFF, 4 * ns);
                            st = acall(ops, ws, c, a->rank, m, strats[k], f, kept, h, n, qv, qs);
                            a->calls++;
                            if (st != BEAM_OK)
                                what = "status";
                            else if (memcmp(h, c->ref_h[m], 2 * th))
                                what = "hidden_out";
                            else if (!hu_is_poison(h + th, 2 * (rows - th)))
                                what = "hidden_out past T";
                            else if (kept && memcmp(n, c->ref_n[m], 2 * th))
                                what = "normalized";
                            else if (!hu_is_poison(n + (kept ? th : 0), 2 * (rows - (kept ? th : 0))))
                                what = "normalized past what was asked";
                            else if (fv && memcmp(qv, c->want_v[m][f], fv))
                                what = "values";
                            else if (fs && memcmp(qs, c->want_s[m][f], 4 * fs))
                                what = "scales";
                            if (what) {
                                char desc[200];
                                hc_describe(&c->d[0].s, desc, sizeof desc);
                                snprintf(a->first, sizeof a->first,
                                         "%s R=%d rank %d %s T=%lld strategy %d form %d normalized %s [%s]: "
                                         "%s: %d %s", ops->name, a->R, a->rank, m ? "MoE" : "dense",
                                         (long long)c->T, (int)strats[k], f, kept ? "kept" : "NULL", desc, what,
                                         (int)st, st != BEAM_OK ? ops->last_error() : "");
                                a->bad++;
                            }
                        }
            hu_free(h);
            hu_free(n);
            hu_free(qv);
            hu_free(qs);
        }
        if (ws && ops->workspace_destroy(ws) != BEAM_OK && !a->bad) {
            snprintf(a->first, sizeof a->first, "destroy: %s", ops->last_error());
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
    for (r = 0; r < proto->R; r++) {
        ranks[r] = *proto;
        ranks[r].rank = r;
        CU_ASSERT_EQUAL_FATAL(pthread_create(&th[r], NULL, fn, &ranks[r]), 0);
    }
    for (r = 0; r < proto->R; r++) {
        pthread_join(th[r], NULL);
        if (ranks[r].bad) fprintf(stderr, "  %s: %s (seed %llu)\n", what, ranks[r].first, (unsigned long long)g_seed);
        CU_ASSERT_EQUAL(ranks[r].bad, 0);
        g_calls += ranks[r].calls;
    }
}

static void test_results(void)
{
    static const int Rs[] = {1, 2, 3, 4, 5, 8};
    FOR_EACH_BACKEND(ops)
    {
        int ri, l, i, n = 0;
        for (ri = 0; ri < (hu_quick() ? 3 : 6); ri++) {
            const int R = Rs[ri];
            arank proto;
            acase *cases[A_NLINES];
            beam_cpu_group *g;
            CU_ASSERT_EQUAL_FATAL(ops->cpu_group_create(R, &g), BEAM_OK);
            for (l = 0; l < A_NLINES; l++) {
                cases[l] = (acase *)hu_alloc(sizeof(acase) * (size_t)APLAN[l].nt, 0);
                for (i = 0; i < APLAN[l].nt; i++, n++)
                    acase_make(&cases[l][i], R, n, APLAN[l].H, APLAN[l].t[i][0] * R + APLAN[l].t[i][1]);
            }
            memset(&proto, 0, sizeof proto);
            proto.ops = ops;
            proto.g = g;
            proto.R = R;
            for (l = 0; l < A_NLINES; l++) {
                proto.cases[l] = cases[l];
                proto.ncases[l] = APLAN[l].nt;
            }
            run_ranks(&proto, arank_main, "all-reduce");
            CU_ASSERT_EQUAL(ops->cpu_group_destroy(g), BEAM_OK);
            for (l = 0; l < A_NLINES; l++) {
                for (i = 0; i < APLAN[l].nt; i++) acase_free(&cases[l][i]);
                hu_free(cases[l]);
            }
        }
    }
}

/* A group of one gives the local operations' bits: the fused op for the
 * MoE form, norm_residual_norm for the dense one, over the suite's sweep
 * (signed zeros, NaNs, infinities and subnormals included). */
static void test_one_rank(void)
{
    FOR_EACH_BACKEND(ops)
    {
        beam_cpu_group *g;
        beam_workspace *ws;
        int i, m;
        CU_ASSERT_EQUAL_FATAL(ops->cpu_group_create(1, &g), BEAM_OK);
        CU_ASSERT_EQUAL_FATAL(ops->workspace_create_cpu(g, 0, 128, 8192, NULL, &ws), BEAM_OK);
        for (i = 0; i < HC_SWEEP_SIZE; i++) {
            hc_spec s = hc_sweep_spec(i);
            hc_case d;
            const size_t n = (size_t)s.T * (size_t)s.H;
            uint16_t *h[2], *nn[2];
            beam_status st[2];
            if (s.H != 8192) continue; /* the workspace's */
            s.misalign = 0;
            hc_make(&d, &s, g_seed ^ (0x1A11ULL + (uint64_t)i));
            for (m = 0; m < 2; m++) {
                const beam_norm post = {d.post.weight, d.post.eps}, pre = {d.pre.weight, d.pre.eps};
                const beam_norm next = {d.next.weight, d.next.eps};
                const beam_norm *nx = s.next ? &next : NULL;
                const float *sc = s.scales ? d.scales : NULL;
                int j;
                for (j = 0; j < 2; j++) {
                    h[j] = (uint16_t *)hu_alloc(2 * n + 2, 0);
                    nn[j] = (uint16_t *)hu_alloc(2 * n + 2, 0);
                }
                if (m) {
                    st[0] = ops->moe_finalize_allreduce_norm_residual_norm(
                        ws, d.experts, d.weights, d.cap, s.T, s.K, s.H, d.rs, s.post ? &post : NULL, d.residual, sc,
                        nx, h[0], nx ? nn[0] : NULL, NULL, BEAM_STRATEGY_AUTO, NULL);
                    st[1] = ops->moe_finalize_norm_residual_norm(d.experts, d.weights, d.cap, s.T, s.K, s.H, d.rs,
                                                                 s.post ? &post : NULL, d.residual, sc, nx, h[1],
                                                                 nx ? nn[1] : NULL, BEAM_STRATEGY_FUSED, NULL);
                } else {
                    st[0] = ops->allreduce_norm_residual_norm(ws, d.x, s.T, s.H, s.pre ? &pre : NULL, d.residual, sc,
                                                              nx, h[0], nx ? nn[0] : NULL, NULL, BEAM_STRATEGY_AUTO,
                                                              NULL);
                    st[1] = ops->norm_residual_norm(d.x, d.residual, s.T, s.H, s.pre ? &pre : NULL, sc, nx, h[1],
                                                    nx ? nn[1] : NULL, NULL);
                }
                CU_ASSERT_EQUAL(st[0], BEAM_OK);
                CU_ASSERT_EQUAL(st[1], BEAM_OK);
                CU_ASSERT(memcmp(h[0], h[1], 2 * n) == 0);
                CU_ASSERT(memcmp(nn[0], nn[1], 2 * n + 2) == 0);
                for (j = 0; j < 2; j++) {
                    hu_free(h[j]);
                    hu_free(nn[j]);
                }
                g_calls += 2;
            }
            hc_free(&d);
        }
        CU_ASSERT_EQUAL(ops->workspace_destroy(ws), BEAM_OK);
        CU_ASSERT_EQUAL(ops->cpu_group_destroy(g), BEAM_OK);
    }
}

/* ---- refusals: every rank fails, nothing written ------------------------- */

enum { BAD_TOKENS, BAD_HIDDEN, BAD_GATHER, BAD_FORM, BAD_NULL, BAD_NULL_SLOTS, BAD_STRATEGY, BAD_NKINDS };

/* Rank 1 (the last rank with R = 1) departs from the others as a->kind says. */
static void *brank_main(void *p)
{
    arank *a = (arank *)p;
    const acase *c = a->refused;
    const hc_case *d = &c->d[a->rank];
    const int32_t H = d->s.H;
    const int odd = a->rank == (a->R > 1 ? 1 : 0);
    const size_t th = (size_t)c->T * (size_t)H;
    uint16_t *h = (uint16_t *)hu_alloc(2 * th, 0), *n = (uint16_t *)hu_alloc(2 * th, 0);
    beam_workspace *ws = NULL;
    beam_status st;
    if (a->ops->workspace_create_cpu(a->g, a->rank, c->T, H, NULL, &ws) != BEAM_OK) {
        snprintf(a->first, sizeof a->first, "workspace: %s", a->ops->last_error());
        a->bad++;
        return NULL;
    }
    hu_poison(h, 2 * th);
    hu_poison(n, 2 * th);
    if (odd && a->kind == BAD_GATHER)
        st = a->ops->moe_finalize_gather_norm_residual_norm(ws, d->experts, d->weights, d->cap, c->T, d->s.K, H,
                                                            d->rs, NULL, d->residual, NULL, NULL, h, NULL,
                                                            BEAM_STRATEGY_ONESHOT, NULL);
    else if ((odd && a->kind == BAD_FORM) || a->kind == BAD_NULL_SLOTS)
        st = a->ops->moe_finalize_allreduce_norm_residual_norm(
            ws, odd && a->kind == BAD_NULL_SLOTS ? NULL : d->experts, d->weights, d->cap, c->T, d->s.K, H, d->rs,
            NULL, d->residual, NULL, NULL, h, NULL, NULL, BEAM_STRATEGY_ONESHOT, NULL);
    else
        st = a->ops->allreduce_norm_residual_norm(
            ws, odd && a->kind == BAD_NULL ? NULL : d->x, odd && a->kind == BAD_TOKENS ? c->T - 1 : c->T,
            odd && a->kind == BAD_HIDDEN ? H + 256 : H, NULL, d->residual, NULL, NULL, h, NULL, NULL,
            odd && a->kind == BAD_STRATEGY ? BEAM_STRATEGY_FUSED : BEAM_STRATEGY_ONESHOT, NULL);
    a->calls++;
    if (st == BEAM_OK || !hu_is_poison(h, 2 * th) || !hu_is_poison(n, 2 * th) || !*a->ops->last_error()) {
        snprintf(a->first, sizeof a->first, "R=%d rank %d refusal %d: status %d, outputs %s, message \"%s\"",
                 a->R, a->rank, a->kind, (int)st, hu_is_poison(h, 2 * th) ? "untouched" : "written",
                 a->ops->last_error());
        a->bad++;
    }
    if (a->ops->workspace_destroy(ws) != BEAM_OK) a->bad++;
    hu_free(h);
    hu_free(n);
    return NULL;
}

static void test_refusals(void)
{
    static const int Rs[] = {1, 2, 3};
    FOR_EACH_BACKEND(ops)
    {
        int ri, k;
        for (ri = 0; ri < 3; ri++)
            for (k = 0; k < BAD_NKINDS; k++) {
                const int R = Rs[ri];
                arank proto;
                acase c;
                beam_cpu_group *g;
                /* one rank cannot disagree with itself */
                if (R == 1 && (k == BAD_TOKENS || k == BAD_GATHER || k == BAD_FORM)) continue;
                acase_make(&c, R, k, 512, 5);
                CU_ASSERT_EQUAL_FATAL(ops->cpu_group_create(R, &g), BEAM_OK);
                memset(&proto, 0, sizeof proto);
                proto.ops = ops;
                proto.g = g;
                proto.R = R;
                proto.kind = k;
                proto.refused = &c;
                run_ranks(&proto, brank_main, "refusal");
                CU_ASSERT_EQUAL(ops->cpu_group_destroy(g), BEAM_OK);
                acase_free(&c);
            }
    }
}

int main(void)
{
    static const suite_test tests[] = {{"every rank count, form, strategy and output", test_results},
                                       {"a group of one is the local operation", test_one_rank},
                                       {"refusals on every rank", test_refusals},
                                       {NULL, NULL}};
    int b, n = 0, rc;
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_seed = hu_seed("test_allreduce");
    /* the backends whose arrays are host memory (the CUDA backend has no
     * all-reduce yet) */
    for (b = 0; b < BM_NBACKENDS; b++) {
        const beam_ops *ops = beam_backend_ops(bm_backend_name(b), BEAM_OPS_VERSION);
        if (!ops || ops->device_memory) continue;
        g_ops[b] = ops;
        printf("test_allreduce: %s\n", ops->name);
        n++;
    }
    if (!n) {
        printf("test_allreduce: no host-memory backend: skipped\n");
        return 77;
    }
    rc = suite_run("allreduce", tests);
    printf("test_allreduce: %ld calls, seed %llu\n", g_calls, (unsigned long long)g_seed);
    return rc;
}
