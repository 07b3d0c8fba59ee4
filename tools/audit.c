/*
 * audit.c - `beammoe audit`: every backend and strategy against the CPU
 * ground truth, the CPU ground truth against tools/reference.c.
 *
 * Ground truth of a case: the CPU backend's plain call (FUSED for the fused
 * operation). Rows of the table:
 *   cpu  reference      ground truth vs the tool's own scalar model
 *   cpu  <strategy>     another CPU call (run-to-run, strategies, in-place,
 *                       thread counts) vs the ground truth
 *   cpu  gather/<s>     the fused op through CPU groups of R = 1,2,3,4,8 ranks
 *   cuda <strategy>     the local ops on CUDA when that backend is available
 * Elements compared include one guard row past the live rows of each output
 * and the `normalized` buffer when no next norm is given: both must keep the
 * sentinel the tool wrote there.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <getopt.h>
#include <math.h>
#include "omp_shim.h"
#include <stdlib.h>
#include <string.h>

#include "audit.h"
#include "audit_input.h"
#include "devmem.h"
#include "problem.h"
#include "reference.h"

/* ---- the case list ---- */

typedef struct acase {
    tool_op op;
    int64_t T, cap;
    int32_t K, H;
    unsigned opts;
    float rs;
    float scales[2];
    float eps;
    tool_gen gen;
} acase;

typedef struct case_list {
    acase *v;
    int n, cap;
} case_list;

static void add_case(case_list *l, tool_op op, int64_t T, int64_t pad, int32_t K, int32_t H,
                     unsigned opts, float rs, float s0, float s1, float eps, tool_gen gen)
{
    acase *c;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->v = realloc(l->v, sizeof *l->v * (size_t)l->cap);
        if (!l->v) {
            fprintf(stderr, "beammoe audit: out of memory\n");
            exit(TOOL_EXIT_FAIL);
        }
    }
    c = &l->v[l->n++];
    c->op = op;
    c->T = T;
    c->cap = T + pad;
    c->K = K;
    c->H = H;
    c->opts = opts;
    c->rs = rs;
    c->scales[0] = s0;
    c->scales[1] = s1;
    c->eps = eps;
    c->gen = gen;
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
                tool_gen gen = (i % 4 == 3) ? GEN_MIXED : GEN_NORMAL;
                float rs = rs_values[i % NELEM(rs_values)];
                add_case(l, OP_FINALIZE, ts[c], pad, ks[a], hs[b], fin_opts[i % NELEM(fin_opts)],
                         rs, 1.0f, 1.0f, 1e-6f, gen);
                add_case(l, OP_FUSED, ts[c], pad, ks[a], hs[b],
                         fused_opts[i % NELEM(fused_opts)], rs, 0.5f, 1.0f, 1e-5f, gen);
            }
    for (b = 0, i = 0; b < nh; b++)
        for (c = 0; c < nt; c++, i++)
            add_case(l, OP_NRN, ts[c], 1, 1, hs[b], nrn_opts[i % NELEM(nrn_opts)], 1.0f, 1.5f,
                     0.25f, 1e-6f, i % 2 ? GEN_MIXED : GEN_NORMAL);

    /* special values: every generator, every op, every option on */
    for (g = GEN_NAN; g <= GEN_MIXED; g++) {
        float eps = 1e-6f; /* eps = 0 has its own case below */
        float rs = g == GEN_TIES ? 1.5f : g == GEN_HUGE ? 2.0f : 1.0f;
        float s0 = g == GEN_TIES ? 1.5f : g == GEN_HUGE ? 3.0f : 0.5f;
        float s1 = g == GEN_TIES ? 0.75f : 2.0f;
        unsigned all = OPT_POST | OPT_POST_W | OPT_NEXT | OPT_NEXT_W | OPT_SCALES;
        add_case(l, OP_FINALIZE, sT, 2, 8, 256, OPT_POST | OPT_POST_W, rs, s0, s1, eps,
                 (tool_gen)g);
        add_case(l, OP_FINALIZE, sT, 0, 2, 2048, 0, rs, s0, s1, eps, (tool_gen)g);
        add_case(l, OP_NRN, sT, 2, 1, 256, OPT_PRE | OPT_PRE_W | OPT_NEXT | OPT_NEXT_W | OPT_SCALES,
                 rs, s0, s1, eps, (tool_gen)g);
        add_case(l, OP_NRN, sT, 0, 1, 512, OPT_NEXT, rs, s0, s1, eps, (tool_gen)g);
        add_case(l, OP_FUSED, sT, 2, 8, 256, all, rs, s0, s1, eps, (tool_gen)g);
        add_case(l, OP_FUSED, sT, 1, 4, 1024, OPT_POST | OPT_NEXT, rs, s0, s1, eps, (tool_gen)g);
    }
    /* eps = 0 with all-zero rows: 1/sqrt(0) = inf, 0 * inf = NaN */
    add_case(l, OP_FUSED, 9, 1, 2, 256, OPT_NEXT | OPT_POST, 1.0f, 1.0f, 1.0f, 0.0f, GEN_ZERO);
    if (!quick) {
        /* more rows than threads split evenly */
        add_case(l, OP_FUSED, 257, 3, 8, 2048, OPT_NEXT | OPT_NEXT_W | OPT_SCALES, 1.0f, 1.0f,
                 1.0f, 1e-6f, GEN_MIXED);
        add_case(l, OP_FINALIZE, 257, 0, 8, 7168, OPT_POST | OPT_POST_W, 1.0f, 1.0f, 1.0f, 1e-6f,
                 GEN_MIXED);
        add_case(l, OP_NRN, 1025, 0, 1, 4096, nrn_opts[1], 1.0f, 1.0f, 1.0f, 1e-6f, GEN_MIXED);
    }
}

static void case_label(const acase *c, char *buf, size_t n)
{
    char o[64] = "";
    if (c->opts & OPT_POST) strcat(o, c->opts & OPT_POST_W ? "post:w " : "post ");
    if (c->opts & OPT_PRE) strcat(o, c->opts & OPT_PRE_W ? "pre:w " : "pre ");
    if (c->opts & OPT_NEXT) strcat(o, c->opts & OPT_NEXT_W ? "next:w " : "next ");
    if (c->opts & OPT_SCALES) strcat(o, "sc ");
    if (c->op == OP_NRN)
        snprintf(buf, n, "%s T%lld H%d c%lld %s%s", op_name(c->op), (long long)c->T, (int)c->H,
                 (long long)c->cap, o, gen_name(c->gen));
    else
        snprintf(buf, n, "%s T%lld K%d H%d c%lld %srs%g %s", op_name(c->op), (long long)c->T,
                 (int)c->K, (int)c->H, (long long)c->cap, o, (double)c->rs, gen_name(c->gen));
}

/* ---- the table ---- */

void audit_print_header(void)
{
    printf("%-56s %-7s %-18s %11s %10s %7s\n", "case", "backend", "strategy", "compared",
           "mismatch", "maxulp");
}

void audit_print_row(tally *t, const char *label, const char *backend, const char *strategy,
                      const cmp_result *c)
{
    char ulp[32];
    cmp_ulp_text(c, ulp, sizeof ulp);
    printf("%-56s %-7s %-18s %11lld %10lld %7s%s\n", label, backend, strategy,
           (long long)c->compared, (long long)c->mismatched, ulp, c->mismatched ? "  <-- MISMATCH" : "");
    t->rows++;
    t->compared += c->compared;
    t->mismatched += c->mismatched;
    if (c->mismatched) t->bad_rows++;
}

void audit_print_error(tally *t, const char *label, const char *backend, const char *strategy,
                        const char *msg)
{
    printf("%-56s %-7s %-18s %11s %10s %7s  <-- ERROR\n      %s\n", label, backend, strategy, "-",
           "ERROR", "-", msg);
    t->rows++;
    t->errors++;
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
static const variant thread_variants[] = {{"threads=1", BEAM_STRATEGY_FUSED, 0, 1},
                                          {"threads=3", BEAM_STRATEGY_FUSED, 0, 3}};

/* Run one variant on the current backend into o; 0 or -1 with msg. */
static int run_variant(const problem *p, outputs *o, const variant *v, int on_device, char *msg,
                       size_t n)
{
    bound b;
    beam_status st;
    int saved = omp_get_max_threads();
    if (bound_make(&b, p, o, on_device, v->inplace, msg, n)) return -1;
    if (v->threads) omp_set_num_threads(v->threads);
    st = bound_call(&b, v->strategy);
    if (v->threads) omp_set_num_threads(saved);
    if (st != BEAM_OK) {
        snprintf(msg, n, "%s: %s", beam_status_string(st), beam_last_error());
        bound_free(&b);
        return -1;
    }
    if (bound_finish(&b, msg, n)) {
        bound_free(&b);
        return -1;
    }
    bound_free(&b);
    return 0;
}

static void run_variants(tally *t, const char *label, const char *backend, const problem *p,
                         const outputs *truth, const variant *vs, int nv, int on_device)
{
    outputs o;
    int i;
    char msg[600];
    if (outputs_make(&o, p)) {
        audit_print_error(t, label, backend, "-", "out of memory");
        return;
    }
    for (i = 0; i < nv; i++) {
        cmp_result c;
        const variant *v = &vs[i];
        if (v->inplace && p->op == OP_FINALIZE) continue;
        if (run_variant(p, &o, v, on_device, msg, sizeof msg)) {
            audit_print_error(t, label, backend, v->name, msg);
            continue;
        }
        cmp_init(&c);
        outputs_compare(&o, truth, p, &c);
        audit_print_row(t, label, backend, v->name, &c);
    }
    outputs_free(&o);
}

/* Every row of one problem after its ground truth (the CPU backend's
 * fused/plain call) is known: the scalar reference, the other CPU
 * variants, the CPU gather groups (fused op) and CUDA when available.
 * Shared with audit_input.c (audit --input), which builds p from a file. */
void audit_problem(tally *t, const char *label, const problem *p, const outputs *truth,
                   int quick, int have_cuda)
{
    outputs ref;
    cmp_result cmp;

    if (outputs_make(&ref, p)) {
        audit_print_error(t, label, "cpu", "reference", "out of memory for the outputs");
    } else {
        problem_reference(p, &ref);
        cmp_init(&cmp);
        outputs_compare(truth, &ref, p, &cmp);
        audit_print_row(t, label, "cpu", "reference", &cmp);
        outputs_free(&ref);
    }

    if (p->op == OP_FUSED) {
        run_variants(t, label, "cpu", p, truth, fused_variants, NELEM(fused_variants), 0);
        if (!quick)
            run_variants(t, label, "cpu", p, truth, thread_variants, NELEM(thread_variants), 0);
        audit_gather(t, label, p, truth);
    } else {
        run_variants(t, label, "cpu", p, truth, plain_variants, NELEM(plain_variants), 0);
        if (!quick) {
            variant tv[2] = {{"threads=1", BEAM_STRATEGY_AUTO, 0, 1},
                             {"threads=3", BEAM_STRATEGY_AUTO, 0, 3}};
            run_variants(t, label, "cpu", p, truth, tv, 2, 0);
        }
    }

    if (have_cuda) {
        if (beam_set_backend("cuda") != BEAM_OK) {
            audit_print_error(t, label, "cuda", "-", beam_last_error());
        } else if (p->op == OP_FUSED) {
            run_variants(t, label, "cuda", p, truth, fused_variants, NELEM(fused_variants), 1);
        } else {
            run_variants(t, label, "cuda", p, truth, plain_variants, NELEM(plain_variants), 1);
        }
        beam_set_backend("cpu");
    }
}

/* ---- one case ---- */

typedef struct audit_ctx {
    int quick;
    int have_cuda;
    uint64_t seed;
    tally t;
    int gather_cases;
} audit_ctx;

static void audit_case(audit_ctx *ax, const acase *c, int index)
{
    problem p;
    outputs truth;
    char label[128], msg[600];
    float sc[2];
    variant truth_v = {"fused", BEAM_STRATEGY_FUSED, 0, 0};

    memset(&truth, 0, sizeof truth);
    case_label(c, label, sizeof label);
    sc[0] = c->scales[0];
    sc[1] = c->scales[1];
    if (problem_make(&p, c->op, c->T, c->cap, c->K, c->H, c->opts, c->rs, sc, c->eps, c->gen,
                     ax->seed ^ (0x9E3779B97F4A7C15ULL * (uint64_t)(index + 1)))) {
        audit_print_error(&ax->t, label, "cpu", "-", "out of memory for the inputs");
        return;
    }
    if (outputs_make(&truth, &p)) {
        audit_print_error(&ax->t, label, "cpu", "-", "out of memory for the outputs");
        goto done;
    }

    /* ground truth: the CPU backend, nothing else */
    if (beam_set_backend("cpu") != BEAM_OK) {
        audit_print_error(&ax->t, label, "cpu", "truth", beam_last_error());
        goto done;
    }
    if (run_variant(&p, &truth, &truth_v, 0, msg, sizeof msg)) {
        audit_print_error(&ax->t, label, "cpu", "truth", msg);
        goto done;
    }
    audit_problem(&ax->t, label, &p, &truth, ax->quick, ax->have_cuda);
    if (c->op == OP_FUSED) ax->gather_cases++;
done:
    outputs_free(&truth);
    problem_free(&p);
}

/* ---- command ---- */

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: beammoe audit [--quick] [--seed N]\n"
            "       beammoe audit --input FILE.safetensors [--quick]\n"
            "\n"
            "Checks every available backend (cpu; cuda when it loads) and every strategy\n"
            "against the CPU ground truth on a built-in sweep of shapes and special\n"
            "values (NaN, +-inf, signed zeros, subnormals, rounding ties, overflow), and\n"
            "the CPU backend against the tool's own scalar model of SPEC.md section 2.\n"
            "The gather runs on CPU groups of 1, 2, 3, 4 and 8 ranks (the CUDA gather\n"
            "needs one process per GPU: tests/test_gather_nccl checks it bit for bit\n"
            "against the same rules). Inputs past the live rows are NaN; outputs get a\n"
            "guard row "
            "that must keep the tool's sentinel.\n"
            "\n"
            "Table: case, backend, strategy, elements compared, mismatching elements,\n"
            "max BF16 ULP distance (ordered integers; NaN vs NaN 0, NaN vs number 'nan').\n"
            "\n"
            "  --quick     a smaller sweep (seconds)\n"
            "  --seed N    seed of the generated inputs (default 1)\n"
            "  --input F   audit the tensors of safetensors file F instead of the sweep\n"
            "  -h, --help  this text\n"
            "\n"
            "--input F: the same backends and strategies on real tensors (a dump from a\n"
            "model, or 'beammoe run --output'). Tensors (row-major, little-endian):\n"
            "  expert_outputs    BF16 [capacity, top_k, hidden] or [capacity*top_k, hidden]\n"
            "  expert_weights    F32  [capacity, top_k]                       (required)\n"
            "  residual          BF16 [rows >= live_tokens, hidden]: the fused op\n"
            "                    (finalize_norm_residual_norm); without it, finalize\n"
            "  post_norm_weight  BF16 [hidden]   post-FFN RMSNorm weight\n"
            "  next_norm_weight  BF16 [hidden]   next-layer RMSNorm weight (needs residual)\n"
            "  output | hidden, normalized  BF16 [live_tokens, hidden]: expected results,\n"
            "                    compared bit for bit with the ground truth when present\n"
            "Metadata (__metadata__, strings): routed_scale (default 1), post_eps,\n"
            "next_eps (default 1e-6; a given eps turns its norm on even without a\n"
            "weight), live_tokens (default: residual rows, else capacity), scales \"a,b\"\n"
            "(needs residual). A file that cannot be used (missing, truncated, bad JSON,\n"
            "missing names, wrong dtypes or shapes, arguments the library rejects) is\n"
            "exit status 2 with a message. Needs a build with json-c.\n"
            "\n"
            "Exit status: 0 all match; 1 a mismatch or an error row, or the run failed\n"
            "(out of memory, device error); 2 a bad option or value (a number is the\n"
            "whole value: no spaces, no trailing text), or an --input file that cannot\n"
            "be used: missing, not a regular file (a FIFO or device is refused at once),\n"
            "malformed, or values the library rejects. 'beammoe --help' has the rule of\n"
            "every command.\n");
}

/* Which backends the audit reaches: prints the "backends:" line, returns 1
 * when CUDA can be audited. Leaves the CPU backend selected. */
int audit_detect_backends(void)
{
    char msg[300];
    int have_cuda = 0;
    if (beam_set_backend("cuda") == BEAM_OK) {
        if (dev_open(msg, sizeof msg) == 0) {
            have_cuda = 1;
            printf("backends: cpu, cuda\n");
        } else {
            printf("backends: cpu (cuda backend loads, but the tool cannot: %s)\n", msg);
        }
    } else {
        printf("backends: cpu (cuda: %s)\n", beam_last_error());
    }
    beam_set_backend("cpu");
    return have_cuda;
}

int cmd_audit(int argc, char **argv)
{
    static const struct option longopts[] = {{"quick", no_argument, NULL, 'q'},
                                             {"seed", required_argument, NULL, 's'},
                                             {"input", required_argument, NULL, 'i'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    audit_ctx ax;
    case_list l = {NULL, 0, 0};
    int opt, i;
    const char *input = NULL;
    double t0;

    memset(&ax, 0, sizeof ax);
    ax.seed = 1;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'q':
            ax.quick = 1;
            break;
        case 's':
            if (parse_u64("audit", "--seed", optarg, &ax.seed)) return TOOL_EXIT_USAGE;
            break;
        case 'i':
            input = optarg;
            break;
        case 'h':
            usage(stdout);
            return TOOL_EXIT_OK;
        default:
            fprintf(stderr, "Try 'beammoe audit --help'.\n");
            return TOOL_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "beammoe audit: unexpected argument '%s'\nTry 'beammoe audit --help'.\n",
                argv[optind]);
        return TOOL_EXIT_USAGE;
    }

    if (input) return audit_input(input, ax.quick);
    if (beam_set_backend("cpu") != BEAM_OK)
        return report_lib_error("audit", "beam_set_backend(\"cpu\")", BEAM_ERR_UNSUPPORTED);
    printf("beammoe audit: library %s, seed %llu, %s sweep, OpenMP threads %d\n", beam_version(),
           (unsigned long long)ax.seed, ax.quick ? "quick" : "full", omp_get_max_threads());
    ax.have_cuda = audit_detect_backends();

    build_cases(&l, ax.quick);
    t0 = now_seconds();
    printf("\n");
    audit_print_header();
    ref_ties_seen = 0;
    for (i = 0; i < l.n; i++) {
        audit_case(&ax, &l.v[i], i);
        fflush(stdout);
    }
    if (ax.have_cuda)
        printf("%-56s %-7s %-18s %11s %10s %7s  skipped: one process per GPU: tests/test_gather_nccl\n",
               "(every fused case)", "cuda", "gather/*", "-", "-", "-");
    printf("\nsummary: %d cases, %d rows, %lld elements compared, %lld mismatching in %d rows, "
           "%d errors, reference met %lld rounding ties, %.1f s: %s\n",
           l.n, ax.t.rows, (long long)ax.t.compared, (long long)ax.t.mismatched, ax.t.bad_rows,
           ax.t.errors, (long long)ref_ties_seen, now_seconds() - t0,
           (ax.t.mismatched || ax.t.errors) ? "FAIL" : "PASS");
    free(l.v);
    return (ax.t.mismatched || ax.t.errors) ? TOOL_EXIT_FAIL : TOOL_EXIT_OK;
}
