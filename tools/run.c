/*
 * run.c - `beammoe run`: one case, generated or read from a safetensors
 * file (--input), timed (min, median, max), with a checksum of its outputs;
 * in text or as a JSON document (--json).
 *
 * The checksum (64-bit FNV-1a over the live output rows, little-endian
 * bytes) is the same on every backend and strategy when they agree bit for
 * bit, so `run` on two hosts or backends can be compared by eye.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <getopt.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends.h"
#include "common.h"
#include "devmem.h"
#include "json_out.h"
#include "omp_shim.h"
#include "text.h"

static void run_usage(FILE *f)
{
    fprintf(f,
            "Usage: beammoe run --tokens T --top-k K --hidden H [options]\n"
            "       beammoe run --input FILE.safetensors [--backend B] [--strategy S]\n"
            "                   [--iters N] [--output F] [--json]\n"
            "\n"
            "Runs one operation on generated inputs, or on the case a safetensors file\n"
            "holds; prints the backend, the time per call (median, and the fastest and\n"
            "slowest call: a wide spread means other work shared the host), GB/s at\n"
            "the median (bytes per call: read plus written) and a 64-bit FNV-1a\n"
            "checksum of the outputs.\n"
            "\n"
            "  --tokens T           live tokens (rows)\n"
            "  --top-k K            experts per token (finalize, fused)\n"
            "  --hidden H           hidden size\n"
            "  --backend B          %s or auto (default: the library's choice,\n"
            "                       BEAM_BACKEND or auto)\n"
            "  --op OP              finalize, nrn (norm_residual_norm) or fused\n"
            "                       (finalize_norm_residual_norm, the default)\n"
            "  --strategy S         auto, fused or unfused (--op fused only; default auto)\n"
            "  --post-norm          post-FFN RMSNorm with a weight (finalize, fused)\n"
            "  --pre-norm           RMSNorm of x with a weight (nrn only)\n"
            "  --next-norm          RMSNorm of hidden with a weight (nrn, fused)\n"
            "  --scales A,B         scale x by A and the residual by B (nrn, fused)\n"
            "  --routed-scale S     routed scale (finalize, fused; default 1)\n"
            "  --eps E              eps of every norm given (default 1e-6)\n"
            "  --iters N            timed calls (default 10)\n"
            "  --seed N             seed of the inputs (default 1)\n"
            "  --input F            the case of safetensors file F (the tensors 'beammoe\n"
            "                       audit --input' reads and --output writes;\n"
            "                       docs/safetensors.md) instead of generated inputs: the\n"
            "                       options that shape or seed the inputs do not apply\n"
            "  --json               one JSON document on stdout instead of the text\n"
            "                       (docs/tool.md), printed when the run succeeded\n"
            "  --output F           write the inputs and outputs to safetensors file F\n"
            "                       (--op finalize or fused; 'beammoe audit --input F'\n"
            "                       checks it again; docs/safetensors.md). F is written\n"
            "                       whole or not at all: a new file in F's folder, renamed\n"
            "                       onto F when complete; a directory, device or FIFO, or\n"
            "                       a file or folder this user may not write, is refused\n"
            "                       before the run\n"
            "  -h, --help           this text\n"
            "\n"
            "Numbers are the whole value: no spaces, no trailing text. An option given\n"
            "twice, or one the chosen op has no place for, is an error.\n"
            "Exit status: 0 done; 1 a device, communication or out-of-memory error of the\n"
            "run; 2 a bad option or value, sizes or values the library rejects (NaN,\n"
            "infinite, top_k, hidden, ...), inputs larger than this host's memory, a\n"
            "backend that is not available here, an --input file that cannot be used, or\n"
            "an --output that cannot be written (then nothing is written). 'beammoe\n"
            "--help' has the rule of every command.\n",
            bm_backend_choices(0));
}

static int usage_error(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "beammoe run: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry 'beammoe run --help'.\n");
    return TOOL_EXIT_USAGE;
}

/* Which of the three words s is (0, 1, 2), or -1. */
static int word_index(const char *s, const char *w0, const char *w1, const char *w2)
{
    return !strcmp(s, w0) ? 0 : !strcmp(s, w1) ? 1 : !strcmp(s, w2) ? 2 : -1;
}

/* Host bytes of a case's inputs and outputs (hc_make_mode, hc_out_make),
 * twice that with device copies; a double, so no size overflows it. */
static double case_bytes(hc_op op, int64_t T, int32_t K, int32_t H, int on_device)
{
    double t = T > 0 ? (double)T : 0.0, k = K > 0 ? (double)K : 0.0, h = H > 0 ? (double)H : 0.0;
    double in = op == HC_NRN ? t * h * 2 : t * k * h * 2 + t * k * 4;
    if (op != HC_FINALIZE) in += t * h * 2;
    return (in + 3 * h * 2 + (t + 1) * h * 2 * 3) * (on_device ? 2 : 1);
}

static double host_memory_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (double)pages * (double)size : 0.0;
}

/* What one run did: the case, its timing and its checksum. */
typedef struct run_result {
    const char *input, *output; /* the --input and --output paths, or NULL */
    uint64_t seed;
    beam_strategy strategy;
    int iters;
    tool_times times;
    double bytes;
    uint64_t checksum;
} run_result;

static const char *strategy_name(beam_strategy s)
{
    return s == BEAM_STRATEGY_AUTO ? "auto" : s == BEAM_STRATEGY_FUSED ? "fused" : "unfused";
}

static void run_report_text(const hc_case *p, hc_op op, const run_result *r)
{
    const tool_times *t = &r->times;
    char shown[1024];
    if (r->input) printf("input:     %s\n", hu_escape(shown, sizeof shown, r->input, 0));
    printf("backend:   %s\n", beam_backend_name());
    printf("op:        %s%s%s T=%lld K=%d H=%d%s%s%s%s routed_scale=%g\n", hc_op_name(op),
           op == HC_FUSED ? " strategy=" : "", op == HC_FUSED ? strategy_name(r->strategy) : "",
           (long long)p->s.T, (int)p->s.K, (int)p->s.H, p->post.on ? " post-norm" : "",
           p->pre.on ? " pre-norm" : "", p->next.on ? " next-norm" : "", p->s.scales ? " scales" : "",
           (double)p->rs);
    printf("median:    %.2f us per call (%d calls; min %.2f, max %.2f)\n", t->median * 1e6, t->n, t->min * 1e6,
           t->max * 1e6);
    printf("bandwidth: %.2f GB/s (%.0f bytes per call)\n", t->median > 0 ? r->bytes / t->median * 1e-9 : 0.0,
           r->bytes);
    printf("checksum:  0x%016llx\n", (unsigned long long)r->checksum);
}

static void run_report_json(const hc_case *p, hc_op op, const run_result *r)
{
    jw w;
    char sum[24];
    jw_init(&w, stdout);
    jw_begin_obj(&w, NULL);
    jw_str(&w, "format", "beammoe-run/1");
    jw_str(&w, "library", beam_version());
    jw_str(&w, "backend", beam_backend_name());
    jw_str(&w, "input", r->input);
    if (r->input)
        jw_null(&w, "seed");
    else
        jw_uint(&w, "seed", r->seed);
    jw_str(&w, "op", hc_op_name(op));
    jw_str(&w, "strategy", op == HC_FUSED ? strategy_name(r->strategy) : NULL);
    jw_int(&w, "tokens", p->s.T);
    jw_int(&w, "top_k", p->s.K);
    jw_int(&w, "hidden", p->s.H);
    jw_bool(&w, "post_norm", p->post.on);
    jw_bool(&w, "pre_norm", p->pre.on);
    jw_bool(&w, "next_norm", p->next.on);
    if (p->s.scales) {
        jw_begin_row_arr(&w, "scales");
        jw_float(&w, NULL, p->scales[0]);
        jw_float(&w, NULL, p->scales[1]);
        jw_end(&w);
    } else {
        jw_null(&w, "scales");
    }
    jw_float(&w, "routed_scale", p->rs);
    jw_int(&w, "calls", r->times.n);
    jw_begin_row(&w, "time_us");
    jw_num(&w, "min", r->times.min * 1e6);
    jw_num(&w, "median", r->times.median * 1e6);
    jw_num(&w, "max", r->times.max * 1e6);
    jw_end(&w);
    jw_num(&w, "bytes_per_call", r->bytes);
    jw_num(&w, "gbs", r->times.median > 0 ? r->bytes / r->times.median * 1e-9 : 0.0);
    snprintf(sum, sizeof sum, "0x%016llx", (unsigned long long)r->checksum);
    jw_str(&w, "checksum", sum);
    jw_str(&w, "output", r->output);
    jw_end(&w);
}

/* Time case p through ops: one untimed call, then r->iters timed ones,
 * the outputs' checksum, --output; then the report (text, or JSON when
 * json). The exit status. */
static int run_case(const beam_ops *ops, const hc_case *p, hc_op op, run_result *r, int json)
{
    const int on_device = ops->device_memory;
    hc_out o;
    hc_bound b;
    beam_status st;
    double *times = NULL;
    char msg[400];
    int i, rc = TOOL_EXIT_FAIL;

    if (hc_out_make(&o, p, 1)) {
        fprintf(stderr, "beammoe run: out of memory for the outputs\n");
        return TOOL_EXIT_FAIL;
    }
    times = malloc(sizeof *times * (size_t)r->iters);
    if (!times || hc_bind(&b, p, op, &o, on_device ? HC_DEVICE : 0u, msg, sizeof msg)) {
        fprintf(stderr, "beammoe run: %s\n", times ? msg : "out of memory");
        goto out;
    }

    /* one untimed call: first-touch of pages, lazy loading, errors */
    st = hc_call(ops, &b, r->strategy, NULL);
    if (st != BEAM_OK) {
        /* invalid argument (sizes, NaN, eps, ...) is exit status 2 */
        report_lib_error(ops, "run", op == HC_FINALIZE ? "beam_moe_finalize"
                                : op == HC_NRN    ? "beam_norm_residual_norm"
                                                  : "beam_moe_finalize_norm_residual_norm",
                         st);
        rc = tool_exit_status(st);
        goto out_b;
    }
    /* one or two calls give a checksum, not a timing: no warning then */
    if (r->iters >= 3) warn_load("run", omp_get_max_threads());
    for (i = 0; i < r->iters; i++) {
        double t0 = hu_now();
        st = hc_call(ops, &b, r->strategy, NULL);
        if (on_device && dev_sync()) {
            fprintf(stderr, "beammoe run: %s\n", dev_last_error());
            goto out_b;
        }
        times[i] = hu_now() - t0;
        if (st != BEAM_OK) {
            report_lib_error(ops, "run", "timed call", st);
            rc = tool_exit_status(st);
            goto out_b;
        }
    }
    if (hc_finish(&b, msg, sizeof msg)) {
        fprintf(stderr, "beammoe run: %s\n", msg);
        goto out_b;
    }
    tool_times_of(times, r->iters, &r->times);
    /* the median of a loaded host is no figure of the library: say so */
    if (r->times.median > 2.0 * r->times.min && r->times.n >= 3)
        fprintf(stderr,
                "beammoe run: note: the median call took %.1f times the fastest: other work slowed most "
                "calls; the min is closer to what the library does on a quiet host\n",
                r->times.median / r->times.min);
    r->bytes = op == HC_FINALIZE ? bytes_finalize(p->s.T, p->s.K, p->s.H, p->post.weight != NULL)
               : op == HC_NRN    ? bytes_nrn(p->s.T, p->s.H, p->pre.weight != NULL, p->next.on,
                                             p->next.weight != NULL)
                                 : bytes_fused(p->s.T, p->s.K, p->s.H, p->post.weight != NULL, p->next.on,
                                               p->next.weight != NULL);
    r->checksum = hc_out_checksum(&o, p, op);
    if (!json) run_report_text(p, op, r);
    if (r->output) {
        if (st_case_write(r->output, p, op, &o, msg, sizeof msg)) {
            fprintf(stderr, "beammoe run: %s: %s\n", r->output, msg);
            rc = TOOL_EXIT_USAGE;
            goto out_b;
        }
        if (!json) printf("output:    %s\n", r->output);
    }
    if (json) run_report_json(p, op, r);
    rc = TOOL_EXIT_OK;
out_b:
    hc_unbind(&b);
out:
    free(times);
    hc_out_free(&o);
    return rc;
}

/* The generated case's options against the op: an option the op has no
 * place for is an error, never ignored. 0, or the exit status. */
static int check_generated(hc_op op, const hc_spec *spec, const unsigned char *seen, const struct option *lo)
{
    int i, have_k = 0, have_rs = 0, have_eps = 0, have_t = 0, have_h = 0;
    for (i = 0; lo[i].name; i++) {
        if (!seen[i]) continue;
        have_t |= !strcmp(lo[i].name, "tokens");
        have_h |= !strcmp(lo[i].name, "hidden");
        have_k |= !strcmp(lo[i].name, "top-k");
        have_rs |= !strcmp(lo[i].name, "routed-scale");
        have_eps |= !strcmp(lo[i].name, "eps");
    }
    if (!have_t) return usage_error("%s is required (or --input FILE)", "--tokens");
    if (!have_h) return usage_error("%s is required (or --input FILE)", "--hidden");
    if (!have_k && op != HC_NRN) return usage_error("%s is required (or --input FILE)", "--top-k");
    if (have_k && op == HC_NRN) return usage_error("%s applies to --op finalize and fused only", "--top-k");
    if (have_rs && op == HC_NRN)
        return usage_error("%s applies to --op finalize and fused only", "--routed-scale");
    if (spec->pre && op != HC_NRN) return usage_error("%s applies to --op nrn only", "--pre-norm");
    if (spec->post && op == HC_NRN)
        return usage_error("%s applies to --op finalize and fused only", "--post-norm");
    if ((spec->next || spec->scales) && op == HC_FINALIZE)
        return usage_error("%s apply to --op nrn and fused only", "--next-norm and --scales");
    if (have_eps && !spec->post && !spec->pre && !spec->next)
        return usage_error("%s applies to a norm: give --post-norm, --pre-norm or --next-norm", "--eps");
    return 0;
}

/* The backend of the run: --backend, else BEAM_BACKEND (the library's
 * choice, made again here so a backend that is not available is said
 * before any memory is taken), else auto. Its table, or NULL after a
 * message with *rc set. */
static const beam_ops *run_backend(const char *backend, int *rc)
{
    const char *env = getenv("BEAM_BACKEND");
    const beam_ops *ops;
    char msg[400];
    if (backend || (env && *env)) {
        const beam_status st = beam_set_backend(backend ? backend : env);
        if (st != BEAM_OK) {
            /* "cuda: not available (no NVIDIA driver on this host)", not
             * the CUDA runtime's words for it */
            if (st == BEAM_ERR_UNSUPPORTED)
                backend_unavailable(backend ? backend : env, beam_last_error(), msg, sizeof msg);
            else
                snprintf(msg, sizeof msg, "%s: %s", beam_status_string(st), beam_last_error());
            fprintf(stderr, "beammoe run: %s%s: %s\n", backend ? "--backend " : "BEAM_BACKEND=",
                    backend ? backend : env, msg);
            *rc = tool_exit_status(st);
            return NULL;
        }
    }
    ops = beam_backend_ops(NULL, BEAM_OPS_VERSION);
    if (!ops) {
        fprintf(stderr, "beammoe run: beam_backend_ops: %s\n", beam_last_error());
        *rc = TOOL_EXIT_FAIL;
        return NULL;
    }
    if (ops->device_memory && dev_open(msg, sizeof msg)) {
        fprintf(stderr, "beammoe run: the %s backend cannot be used by this tool: %s\n", ops->name, msg);
        *rc = TOOL_EXIT_USAGE;
        return NULL;
    }
    return ops;
}

int cmd_run(int argc, char **argv)
{
    enum { O_TOKENS = 256, O_TOPK, O_HIDDEN, O_OP, O_POST, O_NEXT, O_PRE, O_SCALES, O_RS, O_EPS, O_SEED,
           O_BACKEND, O_STRATEGY, O_ITERS, O_OUTPUT, O_INPUT };
    /* O_TOKENS .. O_SEED shape or seed the generated inputs */
    static const struct option longopts[] = {
        {"tokens", required_argument, NULL, O_TOKENS},
        {"top-k", required_argument, NULL, O_TOPK},
        {"hidden", required_argument, NULL, O_HIDDEN},
        {"op", required_argument, NULL, O_OP},
        {"post-norm", no_argument, NULL, O_POST},
        {"next-norm", no_argument, NULL, O_NEXT},
        {"pre-norm", no_argument, NULL, O_PRE},
        {"scales", required_argument, NULL, O_SCALES},
        {"routed-scale", required_argument, NULL, O_RS},
        {"eps", required_argument, NULL, O_EPS},
        {"seed", required_argument, NULL, O_SEED},
        {"backend", required_argument, NULL, O_BACKEND},
        {"strategy", required_argument, NULL, O_STRATEGY},
        {"iters", required_argument, NULL, O_ITERS},
        {"output", required_argument, NULL, O_OUTPUT},
        {"input", required_argument, NULL, O_INPUT},
        TOOL_OPTIONS_END};
    int64_t tokens = 0, iters64 = 10;
    int32_t top_k = 1, hidden = 0;
    int have_strategy = 0, json = 0, help = 0, opt, i, rc = TOOL_EXIT_FAIL;
    unsigned char seen[sizeof longopts / sizeof longopts[0]] = {0};
    const char *backend = NULL;
    hc_op op = HC_FUSED;
    hc_spec spec = {0};
    float scales[2] = {1.0f, 1.0f}, rs = 1.0f, eps = 1e-6f;
    const beam_ops *ops;
    hc_case p;
    run_result r = {.seed = 1, .strategy = BEAM_STRATEGY_AUTO};
    st_file f;
    st_stored stored;
    double need, have;
    char msg[400];

    optind = 1;
    while ((opt = next_option("run", argc, argv, longopts, seen, &help)) >= 0) {
        switch (opt) {
        case O_TOKENS:
            if (parse_i64("run", "--tokens", optarg, &tokens)) return TOOL_EXIT_USAGE;
            break;
        case O_TOPK:
            if (parse_i32("run", "--top-k", optarg, &top_k)) return TOOL_EXIT_USAGE;
            break;
        case O_HIDDEN:
            if (parse_i32("run", "--hidden", optarg, &hidden)) return TOOL_EXIT_USAGE;
            break;
        case O_BACKEND:
            if (strcmp(optarg, "auto") && bm_backend_find(optarg) < 0)
                return usage_error("--backend: '%s' is not %s or auto", optarg, bm_backend_choices(0));
            backend = optarg;
            break;
        case O_STRATEGY: /* BEAM_STRATEGY_AUTO, _FUSED, _UNFUSED: 0, 1, 2 */
            if ((i = word_index(optarg, "auto", "fused", "unfused")) < 0)
                return usage_error("--strategy: '%s' is not auto, fused or unfused", optarg);
            r.strategy = (beam_strategy)i;
            have_strategy = 1;
            break;
        case O_OP: /* HC_FINALIZE, HC_NRN, HC_FUSED: 0, 1, 2 */
            if ((i = word_index(optarg, "finalize", "nrn", "fused")) < 0)
                return usage_error("--op: '%s' is not finalize, nrn or fused", optarg);
            op = (hc_op)i;
            break;
        case O_POST:
            spec.post = HC_NORM_WEIGHT;
            break;
        case O_NEXT:
            spec.next = HC_NORM_WEIGHT;
            break;
        case O_PRE:
            spec.pre = HC_NORM_WEIGHT;
            break;
        case O_SCALES:
            if (parse_f32_pair("run", "--scales", optarg, scales)) return TOOL_EXIT_USAGE;
            spec.scales = 1;
            break;
        case O_RS:
            if (parse_f32("run", "--routed-scale", optarg, &rs)) return TOOL_EXIT_USAGE;
            break;
        case O_EPS:
            if (parse_f32("run", "--eps", optarg, &eps)) return TOOL_EXIT_USAGE;
            break;
        case O_ITERS:
            if (parse_i64("run", "--iters", optarg, &iters64)) return TOOL_EXIT_USAGE;
            if (iters64 < 1 || iters64 > 1000000)
                return usage_error("--iters: '%s' must be in [1, 1000000]", optarg);
            break;
        case O_SEED:
            if (parse_u64("run", "--seed", optarg, &r.seed)) return TOOL_EXIT_USAGE;
            break;
        case O_OUTPUT:
            r.output = optarg;
            break;
        case O_INPUT:
            r.input = optarg;
            break;
        case 'j':
            json = 1;
            break;
        }
    }
    if ((i = options_end("run", opt, argc, argv, help, run_usage)) >= 0) return i;
    /* a file's case is the file's: a size or seed given too would be
     * silently unused */
    for (i = 0; r.input && longopts[i].name; i++)
        if (seen[i] && longopts[i].val >= O_TOKENS && longopts[i].val <= O_SEED)
            return usage_error("--%s applies to generated inputs, not to --input (the file holds the case)",
                               longopts[i].name);
    if (!r.input && (rc = check_generated(op, &spec, seen, longopts)) != 0) return rc;
    if (op == HC_NRN) top_k = 1;
    if (have_strategy && op != HC_FUSED) return usage_error("%s applies to --op fused only", "--strategy");
    if (r.output && op == HC_NRN) return usage_error("%s supports --op finalize and fused only", "--output");
    if (r.output && !st_available()) return usage_error("--output: %s", ST_NO_JSON_C);
    /* a path that cannot be written is found now, not after the run */
    if (r.output && st_output_check(r.output, msg, sizeof msg)) {
        fprintf(stderr, "beammoe run: --output %s: %s; nothing was written\n", r.output, msg);
        return TOOL_EXIT_USAGE;
    }
    r.iters = (int)iters64;

    if (!(ops = run_backend(backend, &rc))) return rc;
    if (r.input) {
        if ((rc = load_input_case("run", r.input, &f, &p, &op, &stored)) != 0) return rc;
        st_close(&f); /* the case is a copy; the stored results are audit's */
        /* the file decides the op: a strategy needs the fused one */
        if (have_strategy && op != HC_FUSED) {
            hc_free(&p);
            return usage_error("--strategy applies to the fused op; %s holds a %s case", r.input,
                               hc_op_name(op));
        }
        rc = run_case(ops, &p, op, &r, json);
        hc_free(&p);
        return rc;
    }

    /* sizes no host could hold are the caller's error, not "out of memory" */
    need = case_bytes(op, tokens, top_k, hidden, ops->device_memory);
    have = host_memory_bytes();
    if (have > 0 && need > have) {
        fprintf(stderr,
                "beammoe run: --tokens %lld --top-k %d --hidden %d: the inputs and outputs need "
                "%.3g GB, more than this host's memory (%.3g GB)\n",
                (long long)tokens, (int)top_k, (int)hidden, need * 1e-9, have * 1e-9);
        return TOOL_EXIT_USAGE;
    }
    spec.T = tokens;
    spec.K = top_k;
    spec.H = hidden;
    if (hc_make_mode(&p, op, &spec, rs, scales, eps, HC_MODE_NORMAL, r.seed)) {
        fprintf(stderr, "beammoe run: out of memory for the inputs\n");
        return TOOL_EXIT_FAIL;
    }
    rc = run_case(ops, &p, op, &r, json);
    hc_free(&p);
    return rc;
}
