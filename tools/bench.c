/*
 * bench.c - `beammoe bench`: CPU backend throughput against this machine's
 * memcpy bandwidth, both measured in the same run with the same threads.
 *
 * Bytes per call are read plus written; the memcpy figure
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

#define BENCH_K 8
#define BENCH_H 7168
#define BENCH_TMAX 8192
#define COPY_BYTES ((size_t)1 << 30)
#define COPY_REPS 5

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: beammoe bench [--threads N] [--min-time S] [--hot]\n"
            "\n"
            "CPU backend throughput of beam_moe_finalize_norm_residual_norm (FUSED,\n"
            "post-norm off, next-norm on) and beam_moe_finalize, K=8, H=7168,\n"
            "T in {1, 64, 1024, 8192}, as a fraction of this machine's memcpy bandwidth\n"
            "(1 GiB copies with the same OpenMP threads, best of %d, before and after the\n"
            "timed calls: the larger) measured in the same run. Bytes per call:\n"
            "read plus written.\n"
            "\n"
            "  --threads N    OpenMP threads (default: OMP_NUM_THREADS or all cores)\n"
            "  --min-time S   seconds of timed calls per row, at least 5 calls (default 1)\n"
            "  --hot          every call on the same rows (cache-warm for small T); by\n"
            "                 default each call takes the next T rows of 8192, so its\n"
            "                 inputs come from memory, not from the last call's cache\n"
            "  -h, --help     this text\n",
            COPY_REPS);
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

/* memcpy bandwidth: each thread copies its contiguous share; best of reps. */
static double copy_gbs(int threads)
{
    (void)threads; /* used by the pragmas only */
    char *src = hu_malloc(COPY_BYTES), *dst = hu_malloc(COPY_BYTES);
    double best = 0.0;
    int rep;
    if (!src || !dst) {
        free(src);
        free(dst);
        return 0.0;
    }
    TOOL_OMP(omp parallel num_threads(threads))
    {
        int t = omp_get_thread_num(), n = omp_get_num_threads();
        size_t lo = COPY_BYTES / (size_t)n * (size_t)t;
        size_t hi = t == n - 1 ? COPY_BYTES : COPY_BYTES / (size_t)n * (size_t)(t + 1);
        memset(src + lo, 1 + t, hi - lo);
        memset(dst + lo, 0, hi - lo);
    }
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
    free(src);
    free(dst);
    return best;
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

typedef struct bench_bufs {
    uint16_t *experts, *residual, *hidden, *normalized, *output, *next_w;
    float *weights;
} bench_bufs;

/* One call on rows [first, first + T) of the 8192-row buffers. */
static beam_status call_op(const bench_bufs *b, int fused, int64_t first, int64_t T)
{
    const beam_norm next = {b->next_w, 1e-6f};
    const size_t r = (size_t)first, KH = (size_t)BENCH_K * BENCH_H, H = BENCH_H;
    if (fused)
        return beam_moe_finalize_norm_residual_norm(
            b->experts + r * KH, b->weights + r * BENCH_K, T, T, BENCH_K, BENCH_H, 1.0f, NULL,
            b->residual + r * H, NULL, &next, b->hidden + r * H, b->normalized + r * H,
            BEAM_STRATEGY_FUSED, NULL);
    return beam_moe_finalize(b->experts + r * KH, b->weights + r * BENCH_K, T, T, BENCH_K,
                             BENCH_H, 1.0f, NULL, b->output + r * H, NULL);
}

/* Time one op; returns the median seconds or -1 after printing the error.
 * Cold (the default): call i works on the i-th slice of T rows of the
 * 8192-row buffers, wrapping around, so a call finds its inputs in memory,
 * not in a cache the previous call warmed (1.3 GB of rows against caches
 * of a few hundred MB at most). Hot: always the first T rows. */
static double time_op(const bench_bufs *b, int fused, int64_t T, double min_time, int hot)
{
    double times[2000], start;
    int64_t slices = BENCH_TMAX / T;
    /* shared by every op and T: the next op starts where the last stopped,
     * not on rows the last one just pulled into the cache */
    static int64_t cursor = 1;
    int n = 0, i;
    beam_status st = BEAM_OK;
    for (i = 0; i < 2 && st == BEAM_OK; i++) /* warm-up: thread pool, lazy binding */
        st = call_op(b, fused, 0, T);
    if (st != BEAM_OK) {
        report_lib_error("bench", fused ? "beam_moe_finalize_norm_residual_norm"
                                        : "beam_moe_finalize", st);
        return -1.0;
    }
    start = hu_now();
    while (n < 2000 && (n < 5 || hu_now() - start < min_time)) {
        int64_t first = hot ? 0 : (cursor++ % slices) * T;
        double t0 = hu_now();
        call_op(b, fused, first, T);
        times[n++] = hu_now() - t0;
    }
    return hu_median(times, n);
}

int cmd_bench(int argc, char **argv)
{
    static const struct option longopts[] = {{"threads", required_argument, NULL, 't'},
                                             {"hot", no_argument, NULL, 'H'},
                                             {"min-time", required_argument, NULL, 'm'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    static const int64_t Ts[] = {1, 64, 1024, 8192};
    int32_t threads = 0;
    float min_time = 1.0f;
    int opt, i, f, rc = TOOL_EXIT_OK, hot = 0;
    bench_bufs b;
    size_t rowsH = (size_t)BENCH_TMAX * BENCH_H;
    double copy, rd;
    char model[256];
    beam_status st;

    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (opt) {
        case 't':
            if (parse_i32("bench", "--threads", optarg, &threads)) return TOOL_EXIT_USAGE;
            if (threads < 1 || threads > 4096) {
                fprintf(stderr, "beammoe bench: --threads: '%s' must be in [1, 4096]\n", optarg);
                return TOOL_EXIT_USAGE;
            }
            break;
        case 'H':
            hot = 1;
            break;
        case 'm':
            if (parse_f32("bench", "--min-time", optarg, &min_time)) return TOOL_EXIT_USAGE;
            if (!(min_time >= 0.0f && min_time <= 600.0f)) {
                fprintf(stderr, "beammoe bench: --min-time: '%s' must be in [0, 600]\n", optarg);
                return TOOL_EXIT_USAGE;
            }
            break;
        case 'h':
            usage(stdout);
            return TOOL_EXIT_OK;
        default:
            fprintf(stderr, "Try 'beammoe bench --help'.\n");
            return TOOL_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "beammoe bench: unexpected argument '%s'\nTry 'beammoe bench --help'.\n",
                argv[optind]);
        return TOOL_EXIT_USAGE;
    }
    st = beam_set_backend("cpu");
    if (st != BEAM_OK) return report_lib_error("bench", "beam_set_backend(\"cpu\")", st);
    if (threads) omp_set_num_threads(threads);
    threads = omp_get_max_threads();

    cpu_model(model, sizeof model);
    load_warning(threads);
    printf("beammoe bench: library %s, backend %s, %d OpenMP threads, %d cores online\n",
           beam_version(), beam_backend_name(), (int)threads, omp_get_num_procs());
    printf("cpu: %s\n", model);
    copy = copy_gbs(threads);
    if (copy <= 0.0) {
        fprintf(stderr, "beammoe bench: out of memory for the 1 GiB copy buffers\n");
        return TOOL_EXIT_FAIL;
    }
    printf("memcpy: %.2f GB/s (1 GiB buffers, read + written, best of %d)\n", copy, COPY_REPS);
    rd = read_gbs(threads);
    printf("read-only stream: %.2f GB/s (%.1f%% of memcpy; plain loads, for context)\n", rd,
           100.0 * rd / copy);

    memset(&b, 0, sizeof b);
    b.experts = hu_malloc(rowsH * BENCH_K * 2);
    b.weights = hu_malloc((size_t)BENCH_TMAX * BENCH_K * 4);
    b.residual = hu_malloc(rowsH * 2);
    b.hidden = hu_malloc(rowsH * 2);
    b.normalized = hu_malloc(rowsH * 2);
    b.output = hu_malloc(rowsH * 2);
    b.next_w = hu_malloc((size_t)BENCH_H * 2);
    if (!b.experts || !b.weights || !b.residual || !b.hidden || !b.normalized || !b.output ||
        !b.next_w) {
        fprintf(stderr, "beammoe bench: out of memory for the inputs\n");
        rc = TOOL_EXIT_FAIL;
        goto out;
    }
    par_fill_bf16(b.experts, rowsH * BENCH_K, -3.0f, 3.0f);
    par_fill_bf16(b.residual, rowsH, -10.0f, 10.0f);
    par_fill_bf16(b.hidden, rowsH, 0.0f, 0.0f);
    par_fill_bf16(b.normalized, rowsH, 0.0f, 0.0f);
    par_fill_bf16(b.output, rowsH, 0.0f, 0.0f);
    par_fill_bf16(b.next_w, BENCH_H, 0.5f, 1.5f);
    for (i = 0; i < BENCH_TMAX * BENCH_K; i++) b.weights[i] = nr_f(hashed_bf16((uint64_t)i, 0.0f, 0.25f));

    {
        /* Time every row first, then copy again: on a shared machine the
         * larger of the two copy figures is the fairer floor, and printing
         * after both keeps the fraction against that one. */
        enum { NT = (int)(sizeof Ts / sizeof Ts[0]) };
        double sec[NT][2], copy2;
        for (i = 0; i < NT; i++)
            for (f = 1; f >= 0; f--) {
                sec[i][f] = time_op(&b, f, Ts[i], min_time, hot);
                if (sec[i][f] < 0) {
                    rc = TOOL_EXIT_FAIL;
                    goto out;
                }
            }
        copy2 = copy_gbs(threads);
        printf("memcpy again after the table: %.2f GB/s; fractions below use %.2f GB/s\n",
               copy2, copy2 > copy ? copy2 : copy);
        if (copy2 > copy) copy = copy2;
        printf("inputs: %s\n\n", hot ? "hot (the same T rows every call)"
                                      : "cold (each call the next T rows of 8192)");
        printf("%6s  %-34s %12s %10s %10s\n", "T", "op", "median us", "GB/s", "of memcpy");
        for (i = 0; i < NT; i++)
            for (f = 1; f >= 0; f--) {
                int64_t T = Ts[i];
                double bytes = f ? bytes_fused(T, BENCH_K, BENCH_H, 0, 1, 1)
                                 : bytes_finalize(T, BENCH_K, BENCH_H, 0);
                double gbs = bytes / sec[i][f] * 1e-9;
                printf("%6lld  %-34s %12.1f %10.2f %9.1f%%\n", (long long)T,
                       f ? "finalize_norm_residual_norm fused" : "finalize", sec[i][f] * 1e6,
                       gbs, 100.0 * gbs / copy);
            }
    }
out:
    free(b.experts);
    free(b.weights);
    free(b.residual);
    free(b.hidden);
    free(b.normalized);
    free(b.output);
    free(b.next_w);
    return rc;
}
