/*
 * bench_host.c - the host's own figures for `beammoe bench` (bench_host.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_host.h"
#include "omp_shim.h"
#include "util.h"

/* The calling thread's share [lo, *hi) of COPY_BYTES: the one static split
 * of every pass over the buffers (first touch, copy, read). */
static size_t share(size_t *hi)
{
    const size_t t = (size_t)omp_get_thread_num(), n = (size_t)omp_get_num_threads();
    *hi = t + 1 == n ? COPY_BYTES : COPY_BYTES / n * (t + 1);
    return COPY_BYTES / n * t;
}

/* memcpy bandwidth: each thread copies its contiguous share of the 1 GiB
 * buffers (allocated and first touched once, by the same split); best of
 * COPY_REPS, counted as read plus written. */
double copy_gbs(int threads, char *src, char *dst)
{
    double best = 0.0;
    int rep;
    (void)threads; /* used by the pragmas only */
    for (rep = 0; rep < COPY_REPS; rep++) {
        double t0 = hu_now(), dt, gbs;
        TOOL_OMP(omp parallel num_threads(threads))
        {
            size_t hi, lo = share(&hi);
            memcpy(dst + lo, src + lo, hi - lo);
        }
        dt = hu_now() - t0;
        gbs = 2.0 * (double)COPY_BYTES / dt * 1e-9;
        if (gbs > best) best = gbs;
    }
    return best;
}

void copy_touch(int threads, char *src, char *dst)
{
    (void)threads;
    TOOL_OMP(omp parallel num_threads(threads))
    {
        size_t hi, lo = share(&hi);
        memset(src + lo, 1 + omp_get_thread_num(), hi - lo);
        memset(dst + lo, 0, hi - lo);
    }
}

/* Read-only stream over 1 GiB (no stores), for context: glibc's memcpy of
 * large blocks uses streaming stores and fast string moves that plain loads
 * do not match on every host. memchr for a byte that is not there is
 * glibc's own vectorized load loop, so no compiler flag decides the figure. */
double read_gbs(int threads)
{
    (void)threads;
    char *src = hu_malloc(COPY_BYTES);
    double best = 0.0;
    int rep, found = 0;
    if (!src) return 0.0;
    TOOL_OMP(omp parallel num_threads(threads))
    {
        size_t hi, lo = share(&hi);
        memset(src + lo, 0, hi - lo);
    }
    for (rep = 0; rep < COPY_REPS; rep++) {
        double t0 = hu_now(), dt, gbs;
        TOOL_OMP(omp parallel num_threads(threads) reduction(+ : found))
        {
            size_t hi, lo = share(&hi);
            found += memchr(src + lo, 0x5A, hi - lo) != NULL;
        }
        dt = hu_now() - t0;
        gbs = (double)COPY_BYTES / dt * 1e-9;
        if (gbs > best) best = gbs;
    }
    free(src);
    return found ? -1.0 : best; /* found is always 0; using it keeps the loads */
}

void cpu_model(char *buf, size_t n)
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
