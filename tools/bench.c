/*
 * bench.c - `beammoe bench`: CPU backend throughput against this machine's
 * memcpy bandwidth, both measured in the same run with the same threads.
 *
 * Bytes per call follow docs/PERF.md (read plus written); the memcpy figure
 * counts read plus written too, so the fraction is a like-for-like ratio.
 * Buffers are filled in parallel with the same static split the copy uses
 * (first touch), so on NUMA hosts pages sit near the threads that use them.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <getopt.h>
#include "omp_shim.h"
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "cpu_isa.h"

#define BENCH_K 8
#define BENCH_H 7168
#define BENCH_TMAX 8192
#define COPY_BYTES ((size_t)1 << 30)
#define COPY_REPS 5

/* The operations of the table. */
enum { BENCH_OP_FINALIZE, BENCH_OP_NRN, BENCH_OP_FUSED };

/* The configurations of the table: op, post (finalize/fused) or pre (nrn)
 * norm, next norm, scales; norms always with a weight. fp8: normalized in
 * its FP8 form only (E4M3, a scale per group of 128, row-major; the *_q
 * calls with normalized NULL), as an FP8 model's next layer reads it. */
typedef struct bench_cfg {
    const char *name;
    int op; /* BENCH_OP_* */
    int pre, next, scales, fp8;
} bench_cfg;

#define BENCH_GROUP 128

static const bench_cfg CFGS[] = {
    {"fused next", BENCH_OP_FUSED, 0, 1, 0, 0},
    {"fused post next", BENCH_OP_FUSED, 1, 1, 0, 0},
    {"fused post next scales", BENCH_OP_FUSED, 1, 1, 1, 0},
    {"finalize", BENCH_OP_FINALIZE, 0, 0, 0, 0},
    {"finalize post", BENCH_OP_FINALIZE, 1, 0, 0, 0},
    {"nrn next", BENCH_OP_NRN, 0, 1, 0, 0},
    {"nrn pre next", BENCH_OP_NRN, 1, 1, 0, 0},
    {"fused post next fp8", BENCH_OP_FUSED, 1, 1, 0, 1},
    {"nrn next fp8", BENCH_OP_NRN, 0, 1, 0, 1},
};
#define NCFG ((int)(sizeof CFGS / sizeof CFGS[0]))

/* The path column: the kernels (lib/cpu_isa.h) and the passes over one row
 * that the vector kernels of cpu/rows_simd.h make for op; pre is the
 * pre-norm (nrn) or the post-norm (finalize, fused). */
static void bench_path_text(int isa, int op, int pre, int next, int fp8, char *buf, size_t n)
{
    const char *p;
    if (op == BENCH_OP_FINALIZE)
        p = pre ? "sum+chunks -> post-norm" : "sum";
    else if (op == BENCH_OP_FUSED)
        p = pre ? (next ? "sum+chunks -> post-norm+residual+chunks -> next-norm"
                        : "sum+chunks -> post-norm+residual")
                : (next ? "sum+residual+chunks -> next-norm" : "sum+residual");
    else
        p = pre ? (next ? "chunks -> pre-norm+residual+chunks -> next-norm" : "chunks -> pre-norm+residual")
                : (next ? "residual+chunks -> next-norm" : "residual");
    if (isa == BM_ISA_PORTABLE)
        snprintf(buf, n, "portable loops%s", fp8 ? " -> fp8" : "");
    else
        snprintf(buf, n, "%s %s%s", bm_isa_name(isa), p, fp8 ? " -> fp8" : "");
}

static void bench_usage(FILE *f)
{
    int i;
    fprintf(f,
            "Usage: beammoe bench [--threads N] [--min-time S] [--repeat N] [--tokens LIST]\n"
            "                     [--config LIST] [--hot]\n"
            "\n"
            "CPU backend throughput of every configuration below, K=8, H=7168, as a\n"
            "fraction of this machine's memcpy bandwidth measured right before and right\n"
            "after each row's timed calls (1 GiB copies with the same OpenMP threads,\n"
            "best of %d each time; the larger figure is used). Bytes per call:\n"
            "docs/PERF.md (read plus written). The path column names the row kernels\n"
            "the library runs for that configuration here (lib/cpu_isa.h).\n"
            "\n"
            "Configurations (fused = beam_moe_finalize_norm_residual_norm, strategy\n"
            "FUSED; nrn = beam_norm_residual_norm; post, pre and next norms have a\n"
            "weight; scales = {0.5, 2}; fp8: normalized written only in its FP8 form,\n"
            "E4M3 with a scale per group of %d, through the *_q calls):\n",
            COPY_REPS, BENCH_GROUP);
    for (i = 0; i < NCFG; i++) fprintf(f, "  %d  %s\n", i + 1, CFGS[i].name);
    fprintf(f,
            "\n"
            "  --threads N    OpenMP threads (default: OMP_NUM_THREADS or all cores)\n"
            "  --min-time S   seconds of timed calls per row, at least 5 calls (default 1)\n"
            "  --repeat N     run the whole table N times, each row with its own memcpy\n"
            "                 figures, and print for each row its fastest run (the\n"
            "                 quietest window of a shared machine) with the memcpy of\n"
            "                 that window (default 1)\n"
            "  --tokens LIST  comma-separated T values (default 1,64,1024,8192; each\n"
            "                 in [1, 8192])\n"
            "  --config LIST  comma-separated configuration numbers (default: all)\n"
            "  --hot          every call on the same rows (cache-warm for small T); by\n"
            "                 default each call takes the next T rows of 8192, so its\n"
            "                 inputs come from memory, not from the last call's cache\n"
            "  -h, --help     this text\n");
}

/* A value from the element index alone: same inputs for any thread count. */
static uint16_t hashed_bf16(uint64_t i, float lo, float hi)
{
    hu_rng r;
    hu_rng_init(&r, i * 0x9E3779B97F4A7C15ULL + 12345);
    return nr_bf16(hu_uniform(&r, lo, hi));
}

static void par_fill_bf16(uint16_t *p, size_t n, float lo, float hi)
{
    long long i;
    TOOL_OMP(omp parallel for schedule(static))
    for (i = 0; i < (long long)n; i++) p[i] = hashed_bf16((uint64_t)i, lo, hi);
}

/* memcpy bandwidth: each thread copies its contiguous share of the 1 GiB
 * buffers (allocated and first touched once, by the same split); best of
 * COPY_REPS, counted as read plus written. */
static double copy_gbs(int threads, char *src, char *dst)
{
    double best = 0.0;
    int rep;
    (void)threads; /* used by the pragmas only */
    for (rep = 0; rep < COPY_REPS; rep++) {
        double t0 = hu_now(), dt, gbs;
        TOOL_OMP(omp parallel num_threads(threads))
        {
            int t = omp_get_thread_num(), n = omp_get_num_threads();
            size_t lo = COPY_BYTES / (size_t)n * (size_t)t;
            size_t hi = t == n - 1 ? COPY_BYTES : COPY_BYTES / (size_t)n * (size_t)(t + 1);
            memcpy(dst + lo, src + lo, hi - lo);
        }
        dt = hu_now() - t0;
        gbs = 2.0 * (double)COPY_BYTES / dt * 1e-9;
        if (gbs > best) best = gbs;
    }
    return best;
}

static void copy_touch(int threads, char *src, char *dst)
{
    (void)threads;
    TOOL_OMP(omp parallel num_threads(threads))
    {
        int t = omp_get_thread_num(), n = omp_get_num_threads();
        size_t lo = COPY_BYTES / (size_t)n * (size_t)t;
        size_t hi = t == n - 1 ? COPY_BYTES : COPY_BYTES / (size_t)n * (size_t)(t + 1);
        memset(src + lo, 1 + t, hi - lo);
        memset(dst + lo, 0, hi - lo);
    }
}

/* Read-only stream over 1 GiB (no stores), for context: glibc's memcpy of
 * large blocks uses streaming stores and fast string moves that plain loads
 * do not match on every host. memchr for a byte that is not there is
 * glibc's own vectorized load loop, so no compiler flag decides the figure. */
static double read_gbs(int threads)
{
    (void)threads;
    char *src = hu_malloc(COPY_BYTES);
    double best = 0.0;
    int rep, found = 0;
    if (!src) return 0.0;
    TOOL_OMP(omp parallel num_threads(threads))
    {
        int t = omp_get_thread_num(), n = omp_get_num_threads();
        size_t lo = COPY_BYTES / (size_t)n * (size_t)t;
        size_t hi = t == n - 1 ? COPY_BYTES : COPY_BYTES / (size_t)n * (size_t)(t + 1);
        memset(src + lo, 0, hi - lo);
    }
    for (rep = 0; rep < COPY_REPS; rep++) {
        double t0 = hu_now(), dt, gbs;
        TOOL_OMP(omp parallel num_threads(threads) reduction(+ : found))
        {
            int t = omp_get_thread_num(), n = omp_get_num_threads();
            size_t lo = COPY_BYTES / (size_t)n * (size_t)t;
            size_t hi = t == n - 1 ? COPY_BYTES : COPY_BYTES / (size_t)n * (size_t)(t + 1);
            found += memchr(src + lo, 0x5A, hi - lo) != NULL;
        }
        dt = hu_now() - t0;
        gbs = (double)COPY_BYTES / dt * 1e-9;
        if (gbs > best) best = gbs;
    }
    free(src);
    return found ? -1.0 : best; /* found is always 0; using it keeps the loads */
}

/* Bandwidth figures are only as good as the machine is quiet: say when
 * other processes were running as the bench started. */
static void load_warning(int threads)
{
    FILE *f = fopen("/proc/loadavg", "r");
    double l1 = 0.0;
    if (!f) return;
    if (fscanf(f, "%lf", &l1) == 1 && l1 > 0.5)
        fprintf(stderr,
                "beammoe bench: warning: load average %.2f before the bench (%d threads): other "
                "work competes for cores and memory, figures may be low\n",
                l1, threads);
    fclose(f);
}

static void cpu_model(char *buf, size_t n)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    snprintf(buf, n, "unknown");
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        char *c = strchr(line, ':');
        if (!strncmp(line, "model name", 10) && c) {
            c += 2;
            c[strcspn(c, "\n")] = 0;
            snprintf(buf, n, "%s", c);
            break;
        }
    }
    fclose(f);
}

/* The CPU backend's table: every timed call goes through it. */
static const beam_ops *g_cpu;

typedef struct bench_bufs {
    uint16_t *experts, *x, *residual, *hidden, *normalized, *output, *norm_w;
    float *weights;
    uint8_t *values; /* the FP8 form of normalized, and its scales */
    float *scales;
} bench_bufs;

/* One call of configuration c on rows [first, first + T) of the 8192-row
 * buffers. */
static beam_status call_op(const bench_bufs *b, const bench_cfg *c, int64_t first, int64_t T)
{
    static const float scales[2] = {0.5f, 2.0f};
    const beam_norm norm = {b->norm_w, 1e-6f};
    const beam_norm *pre = c->pre ? &norm : NULL, *next = c->next ? &norm : NULL;
    const float *sc = c->scales ? scales : NULL;
    const size_t r = (size_t)first, KH = (size_t)BENCH_K * BENCH_H, H = BENCH_H;
    uint16_t *nrm = c->next && !c->fp8 ? b->normalized + r * H : NULL;
    beam_quant q; /* the *_q calls with no quant are the plain operations */
    memset(&q, 0, sizeof q);
    q.kind = BEAM_QUANT_FP8_GROUP;
    q.group_size = BENCH_GROUP;
    q.values = b->values + r * H;
    q.scales = b->scales + r * (H / BENCH_GROUP);
    if (c->op == BENCH_OP_FUSED)
        return g_cpu->moe_finalize_norm_residual_norm_q(b->experts + r * KH, b->weights + r * BENCH_K, T, T,
                                                        BENCH_K, BENCH_H, 1.0f, pre, b->residual + r * H, sc,
                                                        next, b->hidden + r * H, nrm, c->fp8 ? &q : NULL,
                                                        BEAM_STRATEGY_FUSED, NULL);
    if (c->op == BENCH_OP_NRN)
        return g_cpu->norm_residual_norm_q(b->x + r * H, b->residual + r * H, T, BENCH_H, pre, sc, next,
                                           b->hidden + r * H, nrm, c->fp8 ? &q : NULL, NULL);
    return g_cpu->moe_finalize(b->experts + r * KH, b->weights + r * BENCH_K, T, T, BENCH_K, BENCH_H, 1.0f,
                               pre, b->output + r * H, NULL);
}

static const char *op_fn(const bench_cfg *c)
{
    if (c->fp8)
        return c->op == BENCH_OP_FUSED ? "beam_moe_finalize_norm_residual_norm_q" : "beam_norm_residual_norm_q";
    return c->op == BENCH_OP_FUSED ? "beam_moe_finalize_norm_residual_norm"
           : c->op == BENCH_OP_NRN ? "beam_norm_residual_norm"
                                   : "beam_moe_finalize";
}

static double cfg_bytes(const bench_cfg *c, int64_t T)
{
    /* fp8: no BF16 normalized; a byte per value and 4 per group's scale */
    const int nrm = c->next && !c->fp8;
    const double q = c->fp8 ? (double)T * BENCH_H + (double)T * (BENCH_H / BENCH_GROUP) * 4.0 : 0.0;
    if (c->op == BENCH_OP_FUSED) return bytes_fused(T, BENCH_K, BENCH_H, c->pre, nrm, c->next) + q;
    if (c->op == BENCH_OP_NRN) return bytes_nrn(T, BENCH_H, c->pre, nrm, c->next) + q;
    return bytes_finalize(T, BENCH_K, BENCH_H, c->pre);
}

/* Time one configuration; returns the median seconds or -1 after printing
 * the error. Cold (the default): call i works on the i-th slice of T rows of
 * the 8192-row buffers, wrapping around, so a call finds its inputs in
 * memory, not in a cache the previous call warmed (1.3 GB of rows against
 * caches of a few hundred MB at most). Hot: always the first T rows. */
static double time_op(const bench_bufs *b, const bench_cfg *c, int64_t T, double min_time, int hot)
{
    double times[2000], start;
    int64_t slices = BENCH_TMAX / T;
    /* shared by every row: the next row starts where the last stopped, not
     * on rows the last one just pulled into the cache */
    static int64_t cursor = 1;
    int n = 0, i;
    beam_status st = BEAM_OK;
    for (i = 0; i < 2 && st == BEAM_OK; i++) /* warm-up: thread pool, lazy binding */
        st = call_op(b, c, hot ? 0 : (cursor++ % slices) * T, T);
    if (st != BEAM_OK) {
        report_lib_error(g_cpu, "bench", op_fn(c), st);
        return -1.0;
    }
    start = hu_now();
    while (n < 2000 && (n < 5 || hu_now() - start < min_time)) {
        int64_t first = hot ? 0 : (cursor++ % slices) * T;
        double t0 = hu_now();
        call_op(b, c, first, T);
        times[n++] = hu_now() - t0;
    }
    return hu_median(times, n);
}

/* "1,64,1024" -> values in [lo, hi]; returns the count, or -1. */
static int parse_list(const char *s, int64_t lo, int64_t hi, int64_t *out, int max)
{
    int n = 0;
    while (*s) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v < lo || v > hi || n == max || (*end && *end != ',')) return -1;
        out[n++] = v;
        s = *end ? end + 1 : end;
    }
    return n ? n : -1;
}

int cmd_bench(int argc, char **argv)
{
    enum { MAXT = 16 };
    static const struct option longopts[] = {{"threads", required_argument, NULL, 't'},
                                             {"hot", no_argument, NULL, 'H'},
                                             {"min-time", required_argument, NULL, 'm'},
                                             {"repeat", required_argument, NULL, 'r'},
                                             {"tokens", required_argument, NULL, 'T'},
                                             {"config", required_argument, NULL, 'c'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    int64_t Ts[MAXT] = {1, 64, 1024, 8192}, cfgs[NCFG], repeat64 = 1;
    int nT = 4, ncfg = NCFG;
    int32_t threads = 0;
    float min_time = 1.0f;
    int opt, i, ci, rep, rc = TOOL_EXIT_OK, hot = 0, isa, help = 0;
    unsigned char seen[sizeof longopts / sizeof longopts[0]] = {0};
    bench_bufs b;
    size_t rowsH = (size_t)BENCH_TMAX * BENCH_H;
    double rd, best[NCFG][MAXT], best_copy[NCFG][MAXT];
    char model[256], *csrc = NULL, *cdst = NULL;

    for (i = 0; i < NCFG; i++) cfgs[i] = i + 1;
    optind = 1;
    while ((opt = next_option("bench", argc, argv, longopts, seen, &help)) >= 0) {
        switch (opt) {
        case 't':
            if (parse_i32("bench", "--threads", optarg, &threads)) return TOOL_EXIT_USAGE;
            if (threads < 1 || threads > 4096) return value_error("bench", "--threads", optarg, "must be in [1, 4096]");
            break;
        case 'H':
            hot = 1;
            break;
        case 'm':
            if (parse_f32("bench", "--min-time", optarg, &min_time)) return TOOL_EXIT_USAGE;
            if (!(min_time >= 0.0f && min_time <= 600.0f))
                return value_error("bench", "--min-time", optarg, "must be in [0, 600]");
            break;
        case 'r':
            if (parse_i64("bench", "--repeat", optarg, &repeat64)) return TOOL_EXIT_USAGE;
            if (repeat64 < 1 || repeat64 > 100) return value_error("bench", "--repeat", optarg, "must be in [1, 100]");
            break;
        case 'T':
            nT = parse_list(optarg, 1, BENCH_TMAX, Ts, MAXT);
            if (nT < 0) {
                fprintf(stderr, "beammoe bench: --tokens: '%s' must be up to %d comma-separated values in "
                        "[1, %d]\n", optarg, MAXT, BENCH_TMAX);
                return TOOL_EXIT_USAGE;
            }
            break;
        case 'c':
            ncfg = parse_list(optarg, 1, NCFG, cfgs, NCFG);
            if (ncfg < 0) {
                fprintf(stderr, "beammoe bench: --config: '%s' must be comma-separated numbers in [1, %d] "
                        "(see --help)\n", optarg, NCFG);
                return TOOL_EXIT_USAGE;
            }
            break;
        }
    }
    if ((i = options_end("bench", opt, argc, argv, help, bench_usage)) >= 0) return i;
    g_cpu = beam_backend_ops("cpu", BEAM_OPS_VERSION);
    if (!g_cpu) return report_lib_error(NULL, "bench", "beam_backend_ops(\"cpu\")", BEAM_ERR_UNSUPPORTED);
    if (threads) omp_set_num_threads(threads);
    threads = omp_get_max_threads();
    isa = bm_cpu_pick_isa();

    cpu_model(model, sizeof model);
    load_warning(threads);
    printf("beammoe bench: library %s, backend %s, %d OpenMP threads, %d cores online\n",
           beam_version(), beam_backend_name(), (int)threads, omp_get_num_procs());
    printf("cpu: %s; row kernels: %s\n", model, bm_isa_name(isa));

    memset(&b, 0, sizeof b);
    csrc = hu_malloc(COPY_BYTES);
    cdst = hu_malloc(COPY_BYTES);
    b.experts = hu_malloc(rowsH * BENCH_K * 2);
    b.weights = hu_malloc((size_t)BENCH_TMAX * BENCH_K * 4);
    b.x = hu_malloc(rowsH * 2);
    b.residual = hu_malloc(rowsH * 2);
    b.hidden = hu_malloc(rowsH * 2);
    b.normalized = hu_malloc(rowsH * 2);
    b.output = hu_malloc(rowsH * 2);
    b.norm_w = hu_malloc((size_t)BENCH_H * 2);
    b.values = hu_malloc(rowsH);
    b.scales = hu_malloc(rowsH / BENCH_GROUP * 4);
    if (!csrc || !cdst || !b.experts || !b.weights || !b.x || !b.residual || !b.hidden || !b.normalized ||
        !b.output || !b.norm_w || !b.values || !b.scales) {
        fprintf(stderr, "beammoe bench: out of memory for the inputs and the copy buffers\n");
        rc = TOOL_EXIT_FAIL;
        goto out;
    }
    copy_touch(threads, csrc, cdst);
    rd = read_gbs(threads);
    printf("memcpy: %.2f GB/s now (1 GiB buffers, read + written, best of %d); read-only stream: "
           "%.2f GB/s (plain loads, for context)\n", copy_gbs(threads, csrc, cdst), COPY_REPS, rd);
    par_fill_bf16(b.experts, rowsH * BENCH_K, -3.0f, 3.0f);
    par_fill_bf16(b.x, rowsH, -3.0f, 3.0f);
    par_fill_bf16(b.residual, rowsH, -10.0f, 10.0f);
    par_fill_bf16(b.hidden, rowsH, 0.0f, 0.0f);
    par_fill_bf16(b.normalized, rowsH, 0.0f, 0.0f);
    par_fill_bf16(b.output, rowsH, 0.0f, 0.0f);
    par_fill_bf16(b.norm_w, BENCH_H, 0.5f, 1.5f);
    memset(b.values, 0, rowsH); /* first touch before the timed calls, as the other outputs */
    memset(b.scales, 0, rowsH / BENCH_GROUP * 4);
    for (i = 0; i < BENCH_TMAX * BENCH_K; i++) b.weights[i] = nr_f(hashed_bf16((uint64_t)i, 0.0f, 0.25f));

    printf("inputs: %s; each row: memcpy right before and after its timed calls (the larger is "
           "used)%s\n\n",
           hot ? "hot (the same T rows every call)" : "cold (each call the next T rows of 8192)",
           repeat64 > 1 ? "; each row: the fastest of the --repeat passes" : "");
    /* The repetitions go over the whole table, so that a row's windows
     * are minutes apart on a long table: another process's burst spoils
     * one of them, not all. */
    for (rep = 0; rep < (int)repeat64; rep++) {
        if (repeat64 > 1) fprintf(stderr, "beammoe bench: pass %d of %d\n", rep + 1, (int)repeat64);
        for (ci = 0; ci < ncfg; ci++)
            for (i = 0; i < nT; i++) {
                const double c1 = copy_gbs(threads, csrc, cdst);
                const double sec = time_op(&b, &CFGS[cfgs[ci] - 1], Ts[i], min_time, hot);
                double c2;
                if (sec < 0) {
                    rc = TOOL_EXIT_FAIL;
                    goto out;
                }
                c2 = copy_gbs(threads, csrc, cdst);
                if (rep == 0 || sec < best[ci][i]) {
                    best[ci][i] = sec;
                    best_copy[ci][i] = c1 > c2 ? c1 : c2;
                }
            }
    }
    printf("%6s  %-24s %10s %8s %8s %9s  %s\n", "T", "configuration", "median us", "GB/s", "memcpy",
           "of memcpy", "path");
    for (ci = 0; ci < ncfg; ci++) {
        const bench_cfg *c = &CFGS[cfgs[ci] - 1];
        char path[160];
        bench_path_text(isa, c->op, c->pre, c->next, c->fp8, path, sizeof path);
        for (i = 0; i < nT; i++) {
            const double gbs = cfg_bytes(c, Ts[i]) / best[ci][i] * 1e-9;
            printf("%6lld  %-24s %10.1f %8.2f %8.2f %8.1f%%  %s\n", (long long)Ts[i], c->name,
                   best[ci][i] * 1e6, gbs, best_copy[ci][i], 100.0 * gbs / best_copy[ci][i], path);
        }
    }
out:
    free(csrc);
    free(cdst);
    free(b.experts);
    free(b.weights);
    free(b.x);
    free(b.residual);
    free(b.hidden);
    free(b.normalized);
    free(b.output);
    free(b.norm_w);
    free(b.values);
    free(b.scales);
    return rc;
}
