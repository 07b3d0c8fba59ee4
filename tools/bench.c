/*
 * bench.c - `beammoe bench`: CPU backend throughput against this machine's
 * memcpy bandwidth, both measured in the same run with the same threads.
 *
 * Bytes per call follow docs/PERF.md (read plus written); the memcpy figure
 * counts read plus written too, so the fraction is a like-for-like ratio.
 * Buffers are filled in parallel with the same static split the copy uses
 * (first touch), so on NUMA hosts pages sit near the threads that use them.
 *
 * A row is printed as soon as it is timed (with --repeat, after the last
 * pass), in text or as a row of the JSON document of --json; a line per
 * row on stderr says how far the bench is. The text rows keep the columns
 * scripts/perf-report.py --import-cpu-bench reads; the spread of each
 * row's calls (min, max) follows the table.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <getopt.h>
#include "omp_shim.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "bench_host.h"
#include "cpu_isa.h"
#include "json_out.h"

#define BENCH_K 8
#define BENCH_H 7168
#define BENCH_TMAX 8192
#define MAXT 16 /* values of --tokens */

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
            "                     [--config LIST] [--hot] [--json]\n"
            "\n"
            "CPU backend throughput of every configuration below, K=8, H=7168, as a\n"
            "fraction of this machine's memcpy bandwidth measured right before and right\n"
            "after each row's timed calls (1 GiB copies with the same OpenMP threads,\n"
            "best of %d each time; the larger figure is used). Bytes per call:\n"
            "docs/PERF.md (read plus written). The path column names the row kernels\n"
            "the library runs for that configuration here (lib/cpu_isa.h). Each row is\n"
            "printed when it is timed (with --repeat: after the last pass); a table of\n"
            "each row's fastest and slowest call follows; stderr says how far the bench\n"
            "is, a line per row (docs/tool.md).\n"
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
            "  --json         one JSON document on stdout instead of the text\n"
            "                 (docs/tool.md)\n"
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

/* Time one configuration into *t (min, median, max seconds of its timed
 * calls); 0, or -1 after printing the error. Cold (the default): call i works on the i-th slice of T rows of
 * the 8192-row buffers, wrapping around, so a call finds its inputs in
 * memory, not in a cache the previous call warmed (1.3 GB of rows against
 * caches of a few hundred MB at most). Hot: always the first T rows. */
static int time_op(const bench_bufs *b, const bench_cfg *c, int64_t T, double min_time, int hot, tool_times *t)
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
        return -1;
    }
    start = hu_now();
    while (n < 2000 && (n < 5 || hu_now() - start < min_time)) {
        int64_t first = hot ? 0 : (cursor++ % slices) * T;
        double t0 = hu_now();
        call_op(b, c, first, T);
        times[n++] = hu_now() - t0;
    }
    tool_times_of(times, n, t);
    return 0;
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

/* Where the rows go: text, or the JSON document w; progress on stderr. */
typedef struct bench_out {
    jw *w;
    int isa, hot;
    int done, total;  /* rows timed so far (every pass), and in all */
    int quiet_rows;   /* the rows themselves show the progress (stdout and
                         stderr on one terminal, rows printed as timed) */
    double start;
} bench_out;

static void bench_row(const bench_out *o, int cfg, int64_t T, const tool_times *t, double copy)
{
    const bench_cfg *c = &CFGS[cfg - 1];
    const double bytes = cfg_bytes(c, T), gbs = bytes / t->median * 1e-9;
    char path[160];
    bench_path_text(o->isa, c->op, c->pre, c->next, c->fp8, path, sizeof path);
    if (!o->w) {
        printf("%6lld  %-24s %10.1f %8.2f %8.2f %8.1f%%  %s\n", (long long)T, c->name, t->median * 1e6, gbs, copy,
               100.0 * gbs / copy, path);
        return;
    }
    /* the keys of scripts/perf-report.py's records, and the spread */
    jw_begin_row(o->w, NULL);
    jw_str(o->w, "op", c->op == BENCH_OP_FUSED ? "fused" : c->op == BENCH_OP_NRN ? "nrn" : "finalize");
    jw_str(o->w, "config", c->name);
    jw_int(o->w, "config_number", cfg);
    jw_int(o->w, "T", T);
    jw_int(o->w, "K", BENCH_K);
    jw_int(o->w, "H", BENCH_H);
    jw_str(o->w, "mode", o->hot ? "hot" : "cold");
    jw_int(o->w, "calls", t->n);
    jw_num(o->w, "us_min", t->min * 1e6);
    jw_num(o->w, "us", t->median * 1e6);
    jw_num(o->w, "us_max", t->max * 1e6);
    jw_num(o->w, "bytes", bytes);
    jw_num(o->w, "gbs", gbs);
    jw_num(o->w, "memcpy_gbs", copy);
    jw_num(o->w, "floor_pct", 100.0 * gbs / copy);
    jw_str(o->w, "path", path);
    jw_end(o->w);
}

static void bench_table_head(const bench_out *o)
{
    if (o->w)
        jw_begin_arr(o->w, "rows");
    else
        printf("%6s  %-24s %10s %8s %8s %9s  %s\n", "T", "configuration", "median us", "GB/s", "memcpy",
               "of memcpy", "path");
}

/* After each timed row: "beammoe bench: row 3 of 36 (T=1024 fused next),
 * median 80.1 us (min 78.2, max 95.0), 9 s so far, about 99 s left". */
static void bench_progress(bench_out *o, int cfg, int64_t T, const tool_times *t)
{
    const double spent = hu_now() - o->start;
    o->done++;
    if (o->quiet_rows) return;
    fprintf(stderr,
            "beammoe bench: row %d of %d (T=%lld %s), median %.1f us (min %.1f, max %.1f), %.0f s so far, "
            "about %.0f s left\n",
            o->done, o->total, (long long)T, CFGS[cfg - 1].name, t->median * 1e6, t->min * 1e6, t->max * 1e6,
            spent, spent / o->done * (o->total - o->done));
}

/* The fastest and slowest call of each row, in text after the table. */
static void bench_spread(const int64_t *cfgs, int ncfg, const int64_t *Ts, int nT, tool_times (*best)[MAXT])
{
    int ci, i;
    printf("\nspread of each row's timed calls (us per call):\n%6s  %-24s %7s %10s %10s %10s\n", "T",
           "configuration", "calls", "min", "median", "max");
    for (ci = 0; ci < ncfg; ci++)
        for (i = 0; i < nT; i++)
            printf("%6lld  %-24s %7d %10.1f %10.1f %10.1f\n", (long long)Ts[i], CFGS[cfgs[ci] - 1].name,
                   best[ci][i].n, best[ci][i].min * 1e6, best[ci][i].median * 1e6, best[ci][i].max * 1e6);
}

int cmd_bench(int argc, char **argv)
{
    static const struct option longopts[] = {{"threads", required_argument, NULL, 't'},
                                             {"hot", no_argument, NULL, 'H'},
                                             {"min-time", required_argument, NULL, 'm'},
                                             {"repeat", required_argument, NULL, 'r'},
                                             {"tokens", required_argument, NULL, 'T'},
                                             {"config", required_argument, NULL, 'c'}, TOOL_OPTIONS_END};
    int64_t Ts[MAXT] = {1, 64, 1024, 8192}, cfgs[NCFG], repeat64 = 1;
    int nT = 4, ncfg = NCFG;
    int32_t threads = 0;
    float min_time = 1.0f;
    int opt, i, ci, rep, rc = TOOL_EXIT_OK, hot = 0, help = 0, json = 0;
    unsigned char seen[sizeof longopts / sizeof longopts[0]] = {0};
    bench_bufs b;
    size_t rowsH = (size_t)BENCH_TMAX * BENCH_H;
    double rd, copy, best_copy[NCFG][MAXT];
    tool_times best[NCFG][MAXT];
    char model[256], *csrc = NULL, *cdst = NULL;
    bench_out o;
    jw w;

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
        case 'j':
            json = 1;
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
    o = (bench_out){.w = json ? &w : NULL, .isa = bm_cpu_pick_isa(), .hot = hot,
                    .total = ncfg * nT * (int)repeat64,
                    .quiet_rows = !json && repeat64 == 1 && isatty(1) && isatty(2)};
    if (json) jw_init(&w, stdout);

    cpu_model(model, sizeof model);
    warn_load("bench", threads);
    if (o.w) {
        jw_begin_obj(&w, NULL);
        jw_str(&w, "format", "beammoe-bench/1");
        jw_str(&w, "library", beam_version());
        jw_str(&w, "backend", beam_backend_name());
        jw_int(&w, "openmp_threads", threads);
        jw_int(&w, "cores_online", omp_get_num_procs());
        jw_str(&w, "cpu", model);
        jw_str(&w, "row_kernels", bm_isa_name(o.isa));
    } else {
        printf("beammoe bench: library %s, backend %s, %d OpenMP threads, %d cores online\n", beam_version(),
               beam_backend_name(), (int)threads, omp_get_num_procs());
        printf("cpu: %s; row kernels: %s\n", model, bm_isa_name(o.isa));
    }

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
    /* the copies and fills take seconds before the first row */
    fprintf(stderr, "beammoe bench: measuring memcpy and filling %.1f GB of inputs\n",
            (2.0 * COPY_BYTES + (double)rowsH * (BENCH_K * 2 + 11)) * 1e-9);
    copy_touch(threads, csrc, cdst);
    rd = read_gbs(threads);
    copy = copy_gbs(threads, csrc, cdst);
    if (o.w) {
        jw_num(&w, "memcpy_gbs", copy);
        jw_num(&w, "read_gbs", rd);
    } else {
        printf("memcpy: %.2f GB/s now (1 GiB buffers, read + written, best of %d); read-only stream: "
               "%.2f GB/s (plain loads, for context)\n", copy, COPY_REPS, rd);
    }
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

    if (o.w) {
        jw_str(&w, "inputs", hot ? "hot" : "cold");
        jw_float(&w, "min_time_s", min_time);
        jw_int(&w, "repeat", repeat64);
    } else {
        printf("inputs: %s; each row: memcpy right before and after its timed calls (the larger is "
               "used)%s\n\n",
               hot ? "hot (the same T rows every call)" : "cold (each call the next T rows of 8192)",
               repeat64 > 1 ? "; each row: the fastest of the --repeat passes" : "");
    }
    o.start = hu_now();
    if (repeat64 == 1) bench_table_head(&o);
    /* The repetitions go over the whole table, so that a row's windows
     * are minutes apart on a long table: another process's burst spoils
     * one of them, not all. */
    for (rep = 0; rep < (int)repeat64; rep++) {
        if (repeat64 > 1) fprintf(stderr, "beammoe bench: pass %d of %d\n", rep + 1, (int)repeat64);
        for (ci = 0; ci < ncfg; ci++)
            for (i = 0; i < nT; i++) {
                const double c1 = copy_gbs(threads, csrc, cdst);
                tool_times t;
                double c2;
                if (time_op(&b, &CFGS[cfgs[ci] - 1], Ts[i], min_time, hot, &t)) {
                    rc = TOOL_EXIT_FAIL;
                    goto out;
                }
                c2 = copy_gbs(threads, csrc, cdst);
                if (rep == 0 || t.median < best[ci][i].median) {
                    best[ci][i] = t;
                    best_copy[ci][i] = c1 > c2 ? c1 : c2;
                }
                bench_progress(&o, (int)cfgs[ci], Ts[i], &t);
                if (repeat64 == 1) bench_row(&o, (int)cfgs[ci], Ts[i], &best[ci][i], best_copy[ci][i]);
            }
    }
    if (repeat64 > 1) {
        bench_table_head(&o);
        for (ci = 0; ci < ncfg; ci++)
            for (i = 0; i < nT; i++) bench_row(&o, (int)cfgs[ci], Ts[i], &best[ci][i], best_copy[ci][i]);
    }
    if (!o.w) bench_spread(cfgs, ncfg, Ts, nT, best);
out:
    if (o.w && o.w->depth) {
        /* one whole document even when a row failed: its rows so far, and
         * the failure (the message is on stderr) */
        if (o.w->depth > 1) jw_end(o.w);
        if (rc != TOOL_EXIT_OK) jw_str(o.w, "error", "the bench stopped early (stderr says why)");
        jw_end(o.w);
    }
    {
        void *const bufs[] = {csrc, cdst, b.experts, b.weights, b.x, b.residual, b.hidden, b.normalized,
                              b.output, b.norm_w, b.values, b.scales};
        for (i = 0; i < (int)(sizeof bufs / sizeof bufs[0]); i++) free(bufs[i]);
    }
    return rc;
}
