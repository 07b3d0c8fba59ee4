/*
 * team.c - how many OpenMP threads an operation over rows takes, and how
 * rows are handed out to them (cpu/ops.h), shared by the row operations
 * (cpu/run.c) and the quantized output (cpu/quant.c).
 */
#ifdef _OPENMP
#include <omp.h>
#endif

#include "ops.h"

/* Rows are handed out dynamically, up to BM_CPU_CHUNK consecutive rows at
 * a time: a row is computed by one thread alone whichever thread takes it,
 * so the bits stay independent of the schedule, while a core slowed by other
 * work no longer holds the whole call back (docs/log/2026-12-04-constants.md).
 * Consecutive rows let a row prefetch the next one. Small calls take
 * smaller chunks, so that every thread of the team gets rows. */
#define BM_CPU_CHUNK 16

int bm_cpu_max_team(void)
{
#ifdef _OPENMP
    int n = omp_get_max_threads();
    return n > 1 ? n : 1;
#else
    return 1;
#endif
}

int bm_cpu_team_of(int64_t rows, int64_t row_bytes, int64_t per_thread)
{
    int64_t n = rows * row_bytes / per_thread;
    const int max = bm_cpu_max_team();
    if (n > rows) n = rows;
    if (n > max) n = max;
    return n > 1 ? (int)n : 1;
}

int64_t bm_cpu_chunk(int64_t rows, int team)
{
    int64_t chunk = rows / (4 * (int64_t)team);
    if (chunk < 1) chunk = 1;
    if (chunk > BM_CPU_CHUNK) chunk = BM_CPU_CHUNK;
    return chunk;
}
