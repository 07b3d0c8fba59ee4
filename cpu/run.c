/*
 * run.c - one operation over all rows of a bm_args on the CPU (ops.h): how
 * many threads, their scratch, and the OpenMP loop. Called by the table's
 * local operations (cpu/backend_cpu.c) and by the group gather's stages
 * (cpu/group.c).
 *
 * Tokens are spread over OpenMP threads (dynamic schedule, the team as
 * cpu/team.c sizes it); each token
 * is computed by one thread alone (cpu/rows.c), so the bits are the same
 * for every thread count and schedule. Work too small to share runs on the
 * calling thread without starting a team.
 */
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "error.h"
#include "ops.h"

/* Bytes each thread of a team must have to move, else fewer threads (down
 * to the calling thread alone, no team): starting a team costs more than a
 * small call's rows, and the threads share one memory
 * (docs/log/2026-12-04-constants.md). */
#ifndef BM_CPU_BYTES_PER_THREAD
#define BM_CPU_BYTES_PER_THREAD ((int64_t)128 * 1024)
#endif

int bm_cpu_team(const bm_args *a, int op)
{
    const int64_t H2 = 2 * (int64_t)a->hidden;
    /* bytes read and written per row (docs/PERF.md) */
    const int64_t row = op == BM_OP_NRN        ? 4 * H2
                        : op == BM_OP_FINALIZE ? ((int64_t)a->top_k + 1) * H2 + 4 * (int64_t)a->top_k
                                               : ((int64_t)a->top_k + 3) * H2 + 4 * (int64_t)a->top_k;
    return bm_cpu_team_of(a->tokens, row, BM_CPU_BYTES_PER_THREAD);
}

beam_status bm_cpu_scratch_alloc(bm_scratch *s, int slots, int32_t hidden, const char *fn)
{
    s->stride = bm_cpu_row_scratch(hidden);
    s->slots = slots;
    s->raw = malloc((size_t)slots * s->stride + 64);
    if (!s->raw) {
        s->mem = NULL;
        return bm_fail(BEAM_ERR_OUT_OF_MEMORY, "%s: no host memory for the scratch rows of %d threads "
                       "(%zu bytes each, hidden=%d)", fn, slots, s->stride, (int)hidden);
    }
    s->mem = (unsigned char *)s->raw + (64 - (uintptr_t)s->raw % 64) % 64;
    return BEAM_OK;
}

void bm_cpu_scratch_free(bm_scratch *s)
{
    free(s->raw);
    s->raw = NULL;
    s->mem = NULL;
}

void bm_cpu_run(const bm_args *a, int op, const bm_scratch *s)
{
    int team = bm_cpu_team(a, op);
    if (team > s->slots) team = s->slots;
    if (team <= 1) {
        bm_cpu_rows(a, op, 0, a->tokens, s->mem);
        return;
    }
#ifdef _OPENMP
    {
        const int64_t T = a->tokens, chunk = bm_cpu_chunk(T, team);
        const int64_t nchunks = (T + chunk - 1) / chunk;
#pragma omp parallel num_threads(team)
        {
            unsigned char *mine = s->mem + (size_t)omp_get_thread_num() * s->stride;
            int64_t c;
#pragma omp for schedule(dynamic, 1)
            for (c = 0; c < nchunks; c++) {
                const int64_t t0 = c * chunk;
                bm_cpu_rows(a, op, t0, t0 + chunk < T ? t0 + chunk : T, mine);
            }
        }
    }
#endif
}
