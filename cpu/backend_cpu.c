/*
 * backend_cpu.c - the CPU backend's table of operations (C99 + OpenMP).
 *
 * Each local operation runs over all rows with cpu/run.c, which spreads the
 * tokens over OpenMP threads (each token computed by one thread alone, so
 * the bits are the same for every thread count and schedule). The gather
 * over an in-process group of ranks is in cpu/group.c, which runs its
 * stages with cpu/run.c too: the table below points at both, and neither
 * calls back into this file.
 */
#include <stdlib.h>

#include "backend.h"
#include "error.h"
#include "check.h"
#include "group.h"
#include "ops.h"

static beam_status bm_cpu_available(void)
{
    return BEAM_OK;
}

/* One op over all rows, with its own scratch. */
static beam_status bm_cpu_op(const bm_args *a, int op)
{
    bm_scratch s;
    BM_CHECK(bm_cpu_scratch_alloc(&s, bm_cpu_team(a, op), a->hidden, a->fn));
    bm_cpu_run(a, op, &s);
    bm_cpu_scratch_free(&s);
    return BEAM_OK;
}

static beam_status bm_cpu_finalize(const bm_args *a)
{
    return bm_cpu_op(a, BM_OP_FINALIZE);
}

/* A quantized output of normalized is made by the rows themselves, each
 * row's right after its normalized (cpu/rows.h): no second pass, and no
 * array of the call's own when only the quantized form is asked for. */
static beam_status bm_cpu_norm_residual_norm(const bm_args *a)
{
    return bm_cpu_op(a, BM_OP_NRN);
}

/* One pass: the finalized row never leaves the thread's scratch. */
static beam_status bm_cpu_fused(const bm_args *a)
{
    return bm_cpu_op(a, BM_OP_FUSED);
}

/* The composition: finalize all rows into a scratch array, then
 * norm_residual_norm over it (no pre-norm). Same bits as the fused pass. */
static beam_status bm_cpu_unfused(const bm_args *a)
{
    const char *fn = a->fn;
    bm_args b = *a;
    bm_scratch s;
    const int team_f = bm_cpu_team(a, BM_OP_FINALIZE), team_n = bm_cpu_team(a, BM_OP_NRN);
    uint16_t *tmp = (uint16_t *)malloc((size_t)a->tokens * (size_t)a->hidden * sizeof *tmp);
    if (!tmp)
        return bm_fail(BEAM_ERR_OUT_OF_MEMORY, "%s: no host memory for the UNFUSED strategy's %lld x %d "
                       "scratch rows", fn, (long long)a->tokens, (int)a->hidden);
    if (bm_cpu_scratch_alloc(&s, team_f > team_n ? team_f : team_n, a->hidden, fn) != BEAM_OK) {
        free(tmp);
        return BEAM_ERR_OUT_OF_MEMORY;
    }
    b.output = tmp;
    bm_cpu_run(&b, BM_OP_FINALIZE, &s);
    b.x = tmp;
    b.pre.on = 0;
    bm_cpu_run(&b, BM_OP_NRN, &s);
    bm_cpu_scratch_free(&s);
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
    bm_cpu_allreduce,
};
