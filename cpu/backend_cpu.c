/*
 * backend_cpu.c - the CPU backend's table of operations (C99 + OpenMP).
 *
 * Tokens are spread over OpenMP threads (dynamic schedule); each token
 * is computed by one thread alone (cpu/rows.c), so the bits are the same
 * for every thread count. The gather over an in-process group of ranks is in
 * cpu/group.c.
 */
#include <stdlib.h>

#include "backend.h"
#include "error.h"
#include "check.h"
#include "group.h"
#include "ops.h"
#include "rows.h"

static beam_status bm_cpu_available(void)
{
    return BEAM_OK;
}

/* Rows are handed out dynamically, BM_CPU_CHUNK consecutive rows at a time:
 * a row is computed by one thread alone whichever thread takes it, so the
 * bits stay independent of the schedule, while a core slowed by other work
 * no longer holds the whole call back (static: 5-10% slower on a shared
 * host). Consecutive rows let the fused kernel prefetch the next row. */
#define BM_CPU_CHUNK 16

beam_status bm_cpu_finalize(const bm_args *a)
{
    int64_t t;
    const size_t hidden = (size_t)a->hidden;
#pragma omp parallel for schedule(dynamic, BM_CPU_CHUNK)
    for (t = 0; t < a->tokens; t++) bm_cpu_finalize_row(a, t, a->output + (size_t)t * hidden);
    return BEAM_OK;
}

beam_status bm_cpu_norm_residual_norm(const bm_args *a)
{
    int64_t t;
    const size_t hidden = (size_t)a->hidden;
#pragma omp parallel for schedule(dynamic, BM_CPU_CHUNK)
    for (t = 0; t < a->tokens; t++) {
        size_t o = (size_t)t * hidden;
        bm_cpu_residual_row(a, a->x + o, a->residual + o, a->hidden_out + o,
                            a->normalized ? a->normalized + o : NULL);
    }
    return BEAM_OK;
}

/* One pass: the finalized row never leaves the thread's stack. */
beam_status bm_cpu_fused(const bm_args *a)
{
    int64_t t;
    const size_t hidden = (size_t)a->hidden;
#pragma omp parallel for schedule(dynamic, BM_CPU_CHUNK)
    for (t = 0; t < a->tokens; t++) {
        size_t o = (size_t)t * hidden;
        bm_cpu_fused_row(a, t, a->residual + o, a->hidden_out + o, a->normalized ? a->normalized + o : NULL);
    }
    return BEAM_OK;
}

/* The composition: finalize all rows into a scratch array, then
 * norm_residual_norm over it (no pre-norm). Same bits as the fused pass. */
static beam_status bm_cpu_unfused(const bm_args *a)
{
    bm_args b = *a;
    uint16_t *tmp = (uint16_t *)malloc((size_t)a->tokens * (size_t)a->hidden * sizeof *tmp);
    if (!tmp)
        return bm_fail(BEAM_ERR_OUT_OF_MEMORY, "beam_moe_finalize_norm_residual_norm: no host memory "
                       "for the UNFUSED strategy's %lld x %d scratch rows", (long long)a->tokens, (int)a->hidden);
    b.output = tmp;
    bm_cpu_finalize(&b);
    b.x = tmp;
    b.pre.on = 0;
    bm_cpu_norm_residual_norm(&b);
    free(tmp);
    return BEAM_OK;
}

static beam_workspace_config bm_cpu_ws_default(void)
{
    beam_workspace_config c;
    /* On the CPU every strategy moves about the same bytes; ONESHOT
     * recomputes every row on every rank, so it suits small T only. */
    c.oneshot_max_tokens = 64;
    c.twoshot_max_tokens = INT64_MAX;
    c.timeout_ms = 30000;
    return c;
}

const bm_backend bm_backend_table = {
    "cpu",
    bm_cpu_available,
    NULL, /* host pointers: nothing beyond lib's checks */
    bm_cpu_finalize,
    bm_cpu_norm_residual_norm,
    bm_cpu_fused,
    bm_cpu_unfused,
    bm_cpu_ws_default,
    bm_cpu_group_create,
    bm_cpu_group_destroy,
    bm_cpu_ws_create,
    NULL, /* no NCCL on the CPU */
    bm_cpu_ws_destroy,
    bm_cpu_gather,
};
