/*
 * run.c - `beammoe run`: one case, timed, with a checksum of its outputs.
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
#include "st_case.h"

static void run_usage(FILE *f)
{
    fprintf(f,
            "Usage: beammoe run --tokens T --top-k K --hidden H [options]\n"
            "\n"
            "Runs one operation on generated inputs; prints the backend, the median time\n"
            "per call, GB/s (bytes per call: read plus written) and a 64-bit FNV-1a\n"
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
            "backend that is not available here, or an --output that cannot be written\n"
            "(then nothing is written). 'beammoe --help' has the rule of every command.\n",
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

int cmd_run(int argc, char **argv)
{
    enum { O_TOKENS = 256, O_TOPK, O_HIDDEN, O_BACKEND, O_STRATEGY, O_OP, O_POST, O_NEXT, O_PRE,
           O_SCALES, O_RS, O_EPS, O_ITERS, O_SEED, O_OUTPUT };
    static const struct option longopts[] = {
        {"tokens", required_argument, NULL, O_TOKENS},
        {"top-k", required_argument, NULL, O_TOPK},
        {"hidden", required_argument, NULL, O_HIDDEN},
        {"backend", required_argument, NULL, O_BACKEND},
        {"strategy", required_argument, NULL, O_STRATEGY},
        {"op", required_argument, NULL, O_OP},
        {"post-norm", no_argument, NULL, O_POST},
        {"next-norm", no_argument, NULL, O_NEXT},
        {"pre-norm", no_argument, NULL, O_PRE},
        {"scales", required_argument, NULL, O_SCALES},
        {"routed-scale", required_argument, NULL, O_RS},
        {"eps", required_argument, NULL, O_EPS},
        {"iters", required_argument, NULL, O_ITERS},
        {"seed", required_argument, NULL, O_SEED},
        {"output", required_argument, NULL, O_OUTPUT},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    int64_t tokens = 0, iters64 = 10;
    int32_t top_k = 1, hidden = 0;
    int have_t = 0, have_k = 0, have_h = 0, have_strategy = 0, have_rs = 0, have_eps = 0;
    unsigned char seen[sizeof longopts / sizeof longopts[0]] = {0};
    const char *backend = NULL, *output = NULL;
    beam_strategy strategy = BEAM_STRATEGY_AUTO;
    hc_op op = HC_FUSED;
    hc_spec spec;
    float scales[2] = {1.0f, 1.0f}, rs = 1.0f, eps = 1e-6f;
    uint64_t seed = 1;
    int opt, i, iters, on_device = 0, help = 0, rc = TOOL_EXIT_FAIL;
    const beam_ops *ops;
    hc_case p;
    hc_out o;
    hc_bound b;
    beam_status st;
    double *times = NULL, med, bytes, need, have;
    const char *env;
    char msg[400];

    memset(&spec, 0, sizeof spec);
    optind = 1;
    while ((opt = next_option("run", argc, argv, longopts, seen, &help)) >= 0) {
        switch (opt) {
        case O_TOKENS:
            if (parse_i64("run", "--tokens", optarg, &tokens)) return TOOL_EXIT_USAGE;
            have_t = 1;
            break;
        case O_TOPK:
            if (parse_i32("run", "--top-k", optarg, &top_k)) return TOOL_EXIT_USAGE;
            have_k = 1;
            break;
        case O_HIDDEN:
            if (parse_i32("run", "--hidden", optarg, &hidden)) return TOOL_EXIT_USAGE;
            have_h = 1;
            break;
        case O_BACKEND:
            if (strcmp(optarg, "auto") && bm_backend_find(optarg) < 0)
                return usage_error("--backend: '%s' is not %s or auto", optarg, bm_backend_choices(0));
            backend = optarg;
            break;
        case O_STRATEGY: /* BEAM_STRATEGY_AUTO, _FUSED, _UNFUSED: 0, 1, 2 */
            if ((i = word_index(optarg, "auto", "fused", "unfused")) < 0)
                return usage_error("--strategy: '%s' is not auto, fused or unfused", optarg);
            strategy = (beam_strategy)i;
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
            have_rs = 1;
            break;
        case O_EPS:
            if (parse_f32("run", "--eps", optarg, &eps)) return TOOL_EXIT_USAGE;
            have_eps = 1;
            break;
        case O_ITERS:
            if (parse_i64("run", "--iters", optarg, &iters64)) return TOOL_EXIT_USAGE;
            if (iters64 < 1 || iters64 > 1000000)
                return usage_error("--iters: '%s' must be in [1, 1000000]", optarg);
            break;
        case O_SEED:
            if (parse_u64("run", "--seed", optarg, &seed)) return TOOL_EXIT_USAGE;
            break;
        case O_OUTPUT:
            output = optarg;
            break;
        }
    }
    if ((i = options_end("run", opt, argc, argv, help, run_usage)) >= 0) return i;
    if (!have_t) return usage_error("%s is required", "--tokens");
    if (!have_h) return usage_error("%s is required", "--hidden");
    if (!have_k && op != HC_NRN) return usage_error("%s is required", "--top-k");
    /* Options that the chosen op has no place for: say so, do not ignore. */
    if (have_k && op == HC_NRN) return usage_error("%s applies to --op finalize and fused only", "--top-k");
    if (have_rs && op == HC_NRN)
        return usage_error("%s applies to --op finalize and fused only", "--routed-scale");
    if (op == HC_NRN) top_k = 1;
    if (spec.pre && op != HC_NRN) return usage_error("%s applies to --op nrn only", "--pre-norm");
    if (spec.post && op == HC_NRN)
        return usage_error("%s applies to --op finalize and fused only", "--post-norm");
    if ((spec.next || spec.scales) && op == HC_FINALIZE)
        return usage_error("%s apply to --op nrn and fused only", "--next-norm and --scales");
    if (have_eps && !spec.post && !spec.pre && !spec.next)
        return usage_error("%s applies to a norm: give --post-norm, --pre-norm or --next-norm", "--eps");
    if (have_strategy && op != HC_FUSED) return usage_error("%s applies to --op fused only", "--strategy");
    if (output && op == HC_NRN) return usage_error("%s supports --op finalize and fused only", "--output");
    if (output && !st_available()) return usage_error("--output: %s", ST_NO_JSON_C);
    /* a path that cannot be written is found now, not after the run */
    if (output && st_output_check(output, msg, sizeof msg)) {
        fprintf(stderr, "beammoe run: --output %s: %s; nothing was written\n", output, msg);
        return TOOL_EXIT_USAGE;
    }
    iters = (int)iters64;

    /* the backend: --backend, else BEAM_BACKEND (the library's choice, made
     * again here so a backend that is not available is said before any
     * memory is taken), else auto */
    env = getenv("BEAM_BACKEND");
    if (backend || (env && *env)) {
        st = beam_set_backend(backend ? backend : env);
        if (st != BEAM_OK) {
            fprintf(stderr, "beammoe run: %s%s: %s: %s\n", backend ? "--backend " : "BEAM_BACKEND=",
                    backend ? backend : env, beam_status_string(st), beam_last_error());
            return tool_exit_status(st);
        }
    }
    /* the calls go through the backend's table */
    ops = beam_backend_ops(NULL, BEAM_OPS_VERSION);
    if (!ops) {
        fprintf(stderr, "beammoe run: beam_backend_ops: %s\n", beam_last_error());
        return TOOL_EXIT_FAIL;
    }
    on_device = ops->device_memory;
    if (on_device && dev_open(msg, sizeof msg)) {
        fprintf(stderr, "beammoe run: the %s backend cannot be used by this tool: %s\n", ops->name, msg);
        return TOOL_EXIT_USAGE;
    }

    /* sizes no host could hold are the caller's error, not "out of memory" */
    need = case_bytes(op, tokens, top_k, hidden, on_device);
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
    if (hc_make_mode(&p, op, &spec, rs, scales, eps, HC_MODE_NORMAL, seed)) {
        fprintf(stderr, "beammoe run: out of memory for the inputs\n");
        return TOOL_EXIT_FAIL;
    }
    if (hc_out_make(&o, &p, 1)) {
        fprintf(stderr, "beammoe run: out of memory for the outputs\n");
        hc_free(&p);
        return TOOL_EXIT_FAIL;
    }
    times = malloc(sizeof *times * (size_t)iters);
    if (!times || hc_bind(&b, &p, op, &o, on_device ? HC_DEVICE : 0u, msg, sizeof msg)) {
        fprintf(stderr, "beammoe run: %s\n", times ? msg : "out of memory");
        goto out;
    }

    /* one untimed call: first-touch of pages, lazy loading, errors */
    st = hc_call(ops, &b, strategy, NULL);
    if (st != BEAM_OK) {
        /* invalid argument (sizes, NaN, eps, ...) is exit status 2 */
        report_lib_error(ops, "run", op == HC_FINALIZE ? "beam_moe_finalize"
                                : op == HC_NRN    ? "beam_norm_residual_norm"
                                                  : "beam_moe_finalize_norm_residual_norm",
                         st);
        rc = tool_exit_status(st);
        goto out_b;
    }
    for (i = 0; i < iters; i++) {
        double t0 = hu_now();
        st = hc_call(ops, &b, strategy, NULL);
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
    med = hu_median(times, iters);
    bytes = op == HC_FINALIZE ? bytes_finalize(tokens, top_k, hidden, !!spec.post)
            : op == HC_NRN    ? bytes_nrn(tokens, hidden, !!spec.pre, !!spec.next, !!spec.next)
                              : bytes_fused(tokens, top_k, hidden, !!spec.post, !!spec.next,
                                            !!spec.next);
    printf("backend:   %s\n", beam_backend_name());
    printf("op:        %s%s%s T=%lld K=%d H=%d%s%s%s%s routed_scale=%g\n", hc_op_name(op),
           op == HC_FUSED ? " strategy=" : "",
           op == HC_FUSED ? (strategy == BEAM_STRATEGY_AUTO    ? "auto"
                             : strategy == BEAM_STRATEGY_FUSED ? "fused"
                                                               : "unfused")
                          : "",
           (long long)tokens, (int)top_k, (int)hidden, spec.post ? " post-norm" : "",
           spec.pre ? " pre-norm" : "", spec.next ? " next-norm" : "",
           spec.scales ? " scales" : "", (double)rs);
    printf("median:    %.2f us per call (%d calls)\n", med * 1e6, iters);
    printf("bandwidth: %.2f GB/s (%.0f bytes per call)\n", med > 0 ? bytes / med * 1e-9 : 0.0,
           bytes);
    printf("checksum:  0x%016llx\n", (unsigned long long)hc_out_checksum(&o, &p, op));
    if (output) {
        if (st_case_write(output, &p, op, &o, msg, sizeof msg)) {
            fprintf(stderr, "beammoe run: %s: %s\n", output, msg);
            rc = TOOL_EXIT_USAGE;
            goto out_b;
        }
        printf("output:    %s\n", output);
    }
    rc = TOOL_EXIT_OK;
out_b:
    hc_unbind(&b);
out:
    free(times);
    hc_out_free(&o);
    hc_free(&p);
    return rc;
}
