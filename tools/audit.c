/*
 * audit.c - `beammoe audit`: every backend and strategy against the CPU
 * ground truth, the CPU ground truth against the naive reference
 * (harness/naive_ref.c), on a built-in sweep; `audit --input FILE` does the
 * same for a case read from a safetensors file (audit_input.c).
 *
 * Ground truth of a case: the CPU backend's plain call (FUSED for the fused
 * operation). Rows of the table:
 *   cpu  reference      ground truth vs the naive reference
 *   cpu  <strategy>     another CPU call (run-to-run, strategies, in-place,
 *                       thread counts) vs the ground truth
 *   cpu  gather/<s>     the fused op through CPU groups of R = 1,2,3,4,8 ranks
 *   cuda <strategy>     the local ops on CUDA when that backend is available
 *   <backend> fp8 ...   the quantized output of normalized (audit_fp8.c;
 *   <backend> nvfp4 ... every form of harness/quant_model.c's qm_forms,
 *                       named by its format): the CPU's against the
 *                       model, every backend's and strategy's against the
 *                       CPU's
 * Elements compared include one guard row past the live rows of each output
 * and the `normalized` buffer when no next norm is given: both must keep the
 * sentinel the tool wrote there. How the rows are shown (the table per
 * backend and strategy, --verbose, --json) is audit_rows.c's; the command
 * and its options audit_cmd.c's.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <math.h>
#include "omp_shim.h"
#include <stdlib.h>
#include <string.h>

#include "audit.h"
#include "audit_fp8.h"
#include "common.h"
#include "devmem.h"
#include "gather.h"

/* ---- the case list ---- */

/* Option bits of a case in the lists below (hc_spec's norms and scales). */
enum {
    OPT_POST = 1 << 0,
    OPT_POST_W = 1 << 1, /* affine weight of the post norm */
    OPT_PRE = 1 << 2,
    OPT_PRE_W = 1 << 3,
    OPT_NEXT = 1 << 4,
    OPT_NEXT_W = 1 << 5,
    OPT_SCALES = 1 << 6
};

static int norm_of(unsigned opts, unsigned on, unsigned w)
{
    return !(opts & on) ? HC_NORM_OFF : (opts & w) ? HC_NORM_WEIGHT : HC_NORM_PLAIN;
}

typedef struct acase {
    hc_op op;
    int64_t T, cap;
    int32_t K, H;
    unsigned opts;
    float rs;
    float scales[2];
    float eps;
    hc_mode gen;
} acase;

typedef struct case_list {
    acase *v;
    int n, cap;
} case_list;

static void audit_add_case(case_list *l, hc_op op, int64_t T, int64_t pad, int32_t K, int32_t H,
                           unsigned opts, float rs, float s0, float s1, float eps, hc_mode gen)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->v = realloc(l->v, sizeof *l->v * (size_t)l->cap);
        if (!l->v) {
            fprintf(stderr, "beammoe audit: out of memory\n");
            exit(TOOL_EXIT_FAIL);
        }
    }
    l->v[l->n++] = (acase){op, T, T + pad, K, H, opts, rs, {s0, s1}, eps, gen};
}

/* Option sets the sweep rotates through, so every combination meets many
 * shapes without a full cross product. */
static const unsigned fin_opts[] = {0, OPT_POST | OPT_POST_W, OPT_POST};
static const unsigned fused_opts[] = {
    OPT_NEXT | OPT_NEXT_W,
    OPT_POST | OPT_POST_W | OPT_NEXT | OPT_NEXT_W | OPT_SCALES,
    0,
    OPT_NEXT | OPT_SCALES,
    OPT_POST | OPT_NEXT | OPT_NEXT_W,
    OPT_POST | OPT_POST_W | OPT_SCALES,
};
static const unsigned nrn_opts[] = {
    OPT_NEXT | OPT_NEXT_W,
    OPT_PRE | OPT_PRE_W | OPT_NEXT | OPT_NEXT_W | OPT_SCALES,
    0,
    OPT_PRE | OPT_SCALES,
    OPT_PRE | OPT_PRE_W | OPT_NEXT,
};
static const float rs_values[] = {1.0f, 2.5f, 0.75f, -1.25f};
#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void build_cases(case_list *l, int quick)
{
    static const int32_t Ks[] = {1, 2, 8, 32}, Hs[] = {256, 2048, 7168, 8192};
    static const int64_t Ts[] = {0, 1, 7, 100};
    static const int32_t qK[] = {1, 8}, qH[] = {256, 2048};
    static const int64_t qT[] = {0, 1, 7};
    int i = 0, a, b, c, g;
    const int32_t *ks = quick ? qK : Ks, *hs = quick ? qH : Hs;
    const int64_t *ts = quick ? qT : Ts;
    int nk = quick ? NELEM(qK) : NELEM(Ks), nh = quick ? NELEM(qH) : NELEM(Hs);
    int nt = quick ? NELEM(qT) : NELEM(Ts);
    int64_t sT = quick ? 16 : 100;

    /* shape sweep: finalize and fused over K x H x T, nrn over H x T */
    for (a = 0; a < nk; a++)
        for (b = 0; b < nh; b++)
            for (c = 0; c < nt; c++, i++) {
                int64_t pad = (i % 3 == 0) ? 0 : 2;
                hc_mode gen = (i % 4 == 3) ? HC_MODE_MIXED : HC_MODE_NORMAL;
                float rs = rs_values[i % NELEM(rs_values)];
                audit_add_case(l, HC_FINALIZE, ts[c], pad, ks[a], hs[b], fin_opts[i % NELEM(fin_opts)],
                               rs, 1.0f, 1.0f, 1e-6f, gen);
                audit_add_case(l, HC_FUSED, ts[c], pad, ks[a], hs[b],
                               fused_opts[i % NELEM(fused_opts)], rs, 0.5f, 1.0f, 1e-5f, gen);
            }
    for (b = 0, i = 0; b < nh; b++)
        for (c = 0; c < nt; c++, i++)
            audit_add_case(l, HC_NRN, ts[c], 1, 1, hs[b], nrn_opts[i % NELEM(nrn_opts)], 1.0f, 1.5f,
                           0.25f, 1e-6f, i % 2 ? HC_MODE_MIXED : HC_MODE_NORMAL);

    /* special values: every generator, every op, every option on */
    for (g = HC_MODE_NAN; g <= HC_MODE_MIXED; g++) {
        float eps = 1e-6f; /* eps = 0 has its own case below */
        float rs = g == HC_MODE_TIES ? 1.5f : g == HC_MODE_HUGE ? 2.0f : 1.0f;
        float s0 = g == HC_MODE_TIES ? 1.5f : g == HC_MODE_HUGE ? 3.0f : 0.5f;
        float s1 = g == HC_MODE_TIES ? 0.75f : 2.0f;
        unsigned all = OPT_POST | OPT_POST_W | OPT_NEXT | OPT_NEXT_W | OPT_SCALES;
        audit_add_case(l, HC_FINALIZE, sT, 2, 8, 256, OPT_POST | OPT_POST_W, rs, s0, s1, eps,
                       (hc_mode)g);
        audit_add_case(l, HC_FINALIZE, sT, 0, 2, 2048, 0, rs, s0, s1, eps, (hc_mode)g);
        audit_add_case(l, HC_NRN, sT, 2, 1, 256, OPT_PRE | OPT_PRE_W | OPT_NEXT | OPT_NEXT_W | OPT_SCALES,
                       rs, s0, s1, eps, (hc_mode)g);
        audit_add_case(l, HC_NRN, sT, 0, 1, 512, OPT_NEXT, rs, s0, s1, eps, (hc_mode)g);
        audit_add_case(l, HC_FUSED, sT, 2, 8, 256, all, rs, s0, s1, eps, (hc_mode)g);
        audit_add_case(l, HC_FUSED, sT, 1, 4, 1024, OPT_POST | OPT_NEXT, rs, s0, s1, eps, (hc_mode)g);
    }
    /* eps = 0 with all-zero rows: 1/sqrt(0) = inf, 0 * inf = NaN */
    audit_add_case(l, HC_FUSED, 9, 1, 2, 256, OPT_NEXT | OPT_POST, 1.0f, 1.0f, 1.0f, 0.0f, HC_MODE_ZERO);
    if (!quick) {
        /* more rows than threads split evenly */
        audit_add_case(l, HC_FUSED, 257, 3, 8, 2048, OPT_NEXT | OPT_NEXT_W | OPT_SCALES, 1.0f, 1.0f,
                       1.0f, 1e-6f, HC_MODE_MIXED);
        audit_add_case(l, HC_FINALIZE, 257, 0, 8, 7168, OPT_POST | OPT_POST_W, 1.0f, 1.0f, 1.0f, 1e-6f,
                       HC_MODE_MIXED);
        audit_add_case(l, HC_NRN, 1025, 0, 1, 4096, nrn_opts[1], 1.0f, 1.0f, 1.0f, 1e-6f, HC_MODE_MIXED);
    }
}

static void case_label(const acase *c, char *buf, size_t n)
{
    char o[64] = "";
    if (c->opts & OPT_POST) strcat(o, c->opts & OPT_POST_W ? "post:w " : "post ");
    if (c->opts & OPT_PRE) strcat(o, c->opts & OPT_PRE_W ? "pre:w " : "pre ");
    if (c->opts & OPT_NEXT) strcat(o, c->opts & OPT_NEXT_W ? "next:w " : "next ");
    if (c->opts & OPT_SCALES) strcat(o, "sc ");
    if (c->op == HC_NRN)
        snprintf(buf, n, "%s T%lld H%d c%lld %s%s", hc_op_name(c->op), (long long)c->T, (int)c->H,
                 (long long)c->cap, o, hc_mode_name(c->gen));
    else
        snprintf(buf, n, "%s T%lld K%d H%d c%lld %srs%g %s", hc_op_name(c->op), (long long)c->T,
                 (int)c->K, (int)c->H, (long long)c->cap, o, (double)c->rs, hc_mode_name(c->gen));
}

/* ---- local operations ---- */

typedef struct variant {
    const char *name;
    beam_strategy strategy;
    int inplace;
    int threads; /* 0: leave the OpenMP default */
} variant;

static const variant fused_variants[] = {
    {"auto", BEAM_STRATEGY_AUTO, 0, 0},       {"fused", BEAM_STRATEGY_FUSED, 0, 0},
    {"unfused", BEAM_STRATEGY_UNFUSED, 0, 0}, {"fused+inplace", BEAM_STRATEGY_FUSED, 1, 0},
    {"unfused+inplace", BEAM_STRATEGY_UNFUSED, 1, 0},
};
static const variant plain_variants[] = {{"plain", BEAM_STRATEGY_AUTO, 0, 0},
                                         {"inplace", BEAM_STRATEGY_AUTO, 1, 0}};
/* (the strategy applies to the fused op only; the others ignore it) */
static const variant thread_variants[] = {{"threads=1", BEAM_STRATEGY_FUSED, 0, 1},
                                          {"threads=3", BEAM_STRATEGY_FUSED, 0, 3}};

const beam_ops *audit_ops[BM_NBACKENDS];

/* Run one variant through a backend's table into o; 0 or -1 with msg. */
static int run_variant(const beam_ops *ops, const hc_case *p, hc_op op, hc_out *o, const variant *v, int on_device,
                       char *msg, size_t n)
{
    beam_status st;
    int saved = omp_get_max_threads();
    if (v->threads) omp_set_num_threads(v->threads);
    st = hc_run(ops, p, op, v->strategy,
                (v->inplace ? HC_INPLACE : 0u) | (on_device ? HC_DEVICE : 0u), o, msg, n);
    if (v->threads) omp_set_num_threads(saved);
    return st == BEAM_OK ? 0 : -1;
}

static void run_variants(tally *t, const char *label, const beam_ops *ops, const hc_case *p,
                         hc_op op, const hc_out *truth, const variant *vs, int nv)
{
    const char *backend = ops->name;
    const int on_device = ops->device_memory;
    hc_out o;
    int i;
    char msg[600];
    if (hc_out_make(&o, p, 1)) {
        audit_print_error(t, label, backend, "-", "out of memory");
        return;
    }
    for (i = 0; i < nv; i++) {
        hu_cmp c;
        const variant *v = &vs[i];
        if (v->inplace && op == HC_FINALIZE) continue;
        if (run_variant(ops, p, op, &o, v, on_device, msg, sizeof msg)) {
            audit_print_error(t, label, backend, v->name, msg);
            continue;
        }
        hu_cmp_init(&c);
        hc_out_compare(&o, truth, op, &c);
        audit_print_row(t, label, backend, v->name, &c);
    }
    hc_out_free(&o);
}

/* How many of the reference's roundings were exact ties: shows that the tie
 * inputs really exercise nearest-even. */
static int64_t ties_seen;

/* The rows of the fused op through CPU groups (gather.c). */
static void gather_rows(tally *t, const char *label, const hc_case *p, const hc_out *truth)
{
    gather_row rows[GATHER_NSTRAT];
    int s;
    audit_gather(p, truth, rows);
    for (s = 0; s < GATHER_NSTRAT; s++) {
        if (rows[s].errors)
            audit_print_error(t, label, "cpu", rows[s].name, rows[s].error);
        else
            audit_print_row_detail(t, label, "cpu", rows[s].name, &rows[s].cmp, rows[s].detail);
    }
}

/* audit.h */
void audit_problem(tally *t, const char *label, const hc_case *p, hc_op op, const hc_out *truth, int quick,
                   unsigned others)
{
    hc_out ref;
    hu_cmp cmp;
    int b;

    if (hc_out_make(&ref, p, 1)) {
        audit_print_error(t, label, "cpu", "reference", "out of memory for the outputs");
    } else {
        nr_ties = &ties_seen; /* the reference's roundings only */
        hc_reference(p, op, &ref);
        nr_ties = NULL;
        hu_cmp_init(&cmp);
        hc_out_compare(truth, &ref, op, &cmp);
        audit_print_row(t, label, "cpu", "reference", &cmp);
        hc_out_free(&ref);
    }

    /* every backend's variants of the op; on the CPU the thread counts and
     * the CPU groups' gather of the fused op too, before the other backends */
    for (b = 0; b < BM_NBACKENDS; b++) {
        if (b != BM_CPU && !(others >> b & 1u)) continue;
        if (op == HC_FUSED)
            run_variants(t, label, audit_ops[b], p, op, truth, fused_variants, NELEM(fused_variants));
        else
            run_variants(t, label, audit_ops[b], p, op, truth, plain_variants, NELEM(plain_variants));
        if (b == BM_CPU && !quick)
            run_variants(t, label, audit_ops[b], p, op, truth, thread_variants, NELEM(thread_variants));
        if (b == BM_CPU && op == HC_FUSED) gather_rows(t, label, p, truth);
    }
}

/* ---- one case ---- */

typedef struct audit_ctx {
    int quick;
    unsigned others; /* audit_detect_backends() */
    uint64_t seed;
    tally t;
    int gather_cases;
} audit_ctx;

static void audit_case(audit_ctx *ax, const acase *c, int index)
{
    hc_case p;
    const hc_spec s = {.K = c->K, .H = c->H, .T = c->T, .pad = c->cap - c->T,
                       .post = norm_of(c->opts, OPT_POST, OPT_POST_W),
                       .pre = norm_of(c->opts, OPT_PRE, OPT_PRE_W),
                       .next = norm_of(c->opts, OPT_NEXT, OPT_NEXT_W),
                       .scales = !!(c->opts & OPT_SCALES)};
    hc_out truth;
    char label[128], msg[600];
    variant truth_v = {"fused", BEAM_STRATEGY_FUSED, 0, 0};

    memset(&truth, 0, sizeof truth);
    case_label(c, label, sizeof label);
    if (hc_make_mode(&p, c->op, &s, c->rs, c->scales, c->eps, c->gen,
                     ax->seed ^ (0x9E3779B97F4A7C15ULL * (uint64_t)(index + 1)))) {
        audit_print_error(&ax->t, label, "cpu", "-", "out of memory for the inputs");
        return;
    }
    if (hc_out_make(&truth, &p, 1)) {
        audit_print_error(&ax->t, label, "cpu", "-", "out of memory for the outputs");
        goto done;
    }

    /* ground truth: the CPU backend, nothing else */
    if (run_variant(audit_ops[BM_CPU], &p, c->op, &truth, &truth_v, 0, msg, sizeof msg)) {
        audit_print_error(&ax->t, label, "cpu", "truth", msg);
        goto done;
    }
    audit_problem(&ax->t, label, &p, c->op, &truth, ax->quick, ax->others);
    if (c->op == HC_FUSED) ax->gather_cases++;
done:
    hc_out_free(&truth);
    hc_free(&p);
}

unsigned audit_detect_backends(jw *w, int verbose)
{
    char msg[300], why[BM_NBACKENDS][400], detail[BM_NBACKENDS][400];
    unsigned others = 0;
    int b;
    for (b = 0; b < BM_NBACKENDS; b++) {
        const char *name = bm_backend_name(b);
        why[b][0] = detail[b][0] = '\0';
        audit_ops[b] = b == BM_CPU ? audit_ops[b] : beam_backend_ops(name, BEAM_OPS_VERSION);
        if (b == BM_CPU) continue;
        if (!audit_ops[b]) {
            snprintf(detail[b], sizeof detail[b], "%s", beam_last_error());
            backend_unavailable(name, detail[b], why[b], sizeof why[b]);
        } else if (audit_ops[b]->device_memory && dev_open(msg, sizeof msg) != 0) {
            snprintf(why[b], sizeof why[b], "loads, but this tool cannot reach its memory");
            snprintf(detail[b], sizeof detail[b], "%s", msg);
        } else {
            others |= 1u << b;
        }
    }
    if (w) {
        jw_begin_arr(w, "backends");
        for (b = 0; b < BM_NBACKENDS; b++) {
            jw_begin_row(w, NULL);
            jw_str(w, "name", bm_backend_name(b));
            jw_bool(w, "audited", b == BM_CPU || (others >> b & 1u));
            if (why[b][0]) {
                jw_str(w, "why", why[b]);
                jw_str(w, "detail", detail[b]);
            }
            jw_end(w);
        }
        jw_end(w);
        return others;
    }
    /* "backends: " and the names, then nothing else on the line: callers
     * read it (python/beammoe/audit.py) */
    printf("backends: %s", bm_backend_name(BM_CPU));
    for (b = 0; b < BM_NBACKENDS; b++)
        if (others >> b & 1u) printf(", %s", bm_backend_name(b));
    printf("\n");
    for (b = 0; b < BM_NBACKENDS; b++) {
        if (!why[b][0]) continue;
        printf("%s: %s\n", bm_backend_name(b), why[b]);
        if (verbose) printf("      library: %s\n", detail[b]);
    }
    return others;
}

/* audit.h */
int audit_sweep(const audit_view *view, int quick, uint64_t seed)
{
    audit_ctx ax;
    case_list l = {NULL, 0, 0};
    jw json, *w = NULL;
    double t0;
    int i, b;

    ax = (audit_ctx){.quick = quick, .seed = seed};
    audit_ops[BM_CPU] = beam_backend_ops("cpu", BEAM_OPS_VERSION);
    if (!audit_ops[BM_CPU])
        return report_lib_error(NULL, "audit", "beam_backend_ops(\"cpu\")", BEAM_ERR_UNSUPPORTED);
    if (view->json) w = &json;
    audit_begin(w, view, NULL, ax.seed, ax.quick);
    ax.others = audit_detect_backends(w, view->verbose);
    ax.t.verbose = view->verbose;
    ax.t.json = w;
    if (w) jw_begin_arr(w, "rows");

    build_cases(&l, ax.quick);
    t0 = hu_now();
    if (!w) printf("\n");
    ties_seen = 0;
    audit_progress(&ax.t, 0, l.n, "cases");
    for (i = 0; i < l.n; i++) {
        audit_case(&ax, &l.v[i], i);
        audit_progress(&ax.t, i + 1, l.n, "cases");
    }
    /* the quantized forms take a while too: say what is running now */
    if (ax.t.progress_lines) fprintf(stderr, "beammoe audit: the quantized output of normalized, every form\n");
    audit_fp8(&ax.t, audit_ops, ax.quick, ax.seed);
    for (b = 0; b < BM_NBACKENDS; b++)
        if (ax.others >> b & 1u) audit_skipped(&ax.t, bm_backend_name(b), "gather/*",
                                               "one process per GPU: tests/test_gather_nccl");
    free(l.v);
    return audit_end(w, &ax.t, l.n, "case", ties_seen, hu_now() - t0);
}
