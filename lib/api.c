/*
 * api.c - the public beam_* entry points of a backend library.
 *
 * Compiled into libbeammoe_cpu and libbeammoe_cuda alike: every argument is
 * checked here (lib/check.c), then the call goes to the backend through its
 * table, bm_backend_table. Nothing here calls an exported beam_* name.
 */
#include "config.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backends.h"
#include "check.h"
#include "error.h"

#define BE (&bm_backend_table)
#define BF16 2u
#define FP32 4u

/* The opaque public handle: lib's shared fields plus the backend's state. */
struct beam_workspace {
    bm_ws ws;
};

static beam_status bm_backend_pointers(const char *fn, const bm_ptr *p, int n)
{
    BM_CHECK(bm_check_pointers(fn, p, n));
    if (BE->check_pointers) BM_CHECK(BE->check_pointers(fn, p, n));
    return BEAM_OK;
}

static size_t bm_rows_bytes(int64_t rows, int32_t hidden)
{
    return (size_t)rows * (size_t)hidden * BF16;
}

/* A BF16 input array of the call. */
static bm_ptr bm_in(const char *name, const void *ptr, size_t bytes)
{
    bm_ptr p;
    p.name = name;
    p.ptr = ptr;
    p.bytes = bytes;
    p.align = BF16;
    p.is_output = 0;
    p.in_place = 0;
    return p;
}

/* An FP32 input array (expert_weights). */
static bm_ptr bm_in32(const char *name, const void *ptr, size_t bytes)
{
    bm_ptr p = bm_in(name, ptr, bytes);
    p.align = FP32;
    return p;
}

/* A BF16 output array. */
static bm_ptr bm_out(const char *name, const void *ptr, size_t bytes)
{
    bm_ptr p = bm_in(name, ptr, bytes);
    p.is_output = 1;
    return p;
}

/* residual and hidden_out: the one pair that may be the same buffer. */
static bm_ptr bm_allow_in_place(bm_ptr p)
{
    p.in_place = 1;
    return p;
}

/* ---- backend (errors and the version: lib/error.c) --------------------- */

BEAM_API const char *beam_backend_name(void)
{
    return BE->name;
}

BEAM_API beam_status beam_set_backend(const char *name)
{
    static const char fn[] = "beam_set_backend";
    bm_clear_error();
    if (!name) return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: name must not be NULL", fn);
    if (strcmp(name, "auto") != 0 && strcmp(name, BE->name) != 0) {
        if (bm_backend_find(name) >= 0)
            return bm_fail(BEAM_ERR_UNSUPPORTED,
                           "%s: name=\"%s\": this library holds only the %s backend "
                           "(link libbeammoe to choose at run time)", fn, name, BE->name);
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT,
                       "%s: name=\"%s\" must be %s or \"auto\"", fn, name, bm_backend_choices(1));
    }
    return BE->available();
}

/* ---- single-device operations ------------------------------------------ */

/* Checks shared by the three local ops' finalize stage. */
static beam_status bm_check_finalize_stage(const char *fn, int64_t capacity, int64_t live,
                                           int32_t top_k, int32_t hidden, float routed_scale,
                                           const beam_norm *post_norm, bm_args *a)
{
    BM_CHECK(bm_check_top_k(fn, top_k));
    BM_CHECK(bm_check_hidden(fn, hidden));
    BM_CHECK(bm_check_rows(fn, "capacity", capacity, "live_tokens", live, top_k, hidden));
    BM_CHECK(bm_check_finite(fn, "routed_scale", routed_scale));
    BM_CHECK(bm_check_norm(fn, "post_norm", post_norm, &a->post));
    a->top_k = top_k;
    a->hidden = hidden;
    a->tokens = live;
    a->routed_scale = routed_scale;
    return BEAM_OK;
}

static beam_status bm_check_next(const char *fn, const beam_norm *next_norm,
                                 const uint16_t *normalized, bm_args *a)
{
    /* normalized == NULL with next_norm given is caught by the pointer
     * checks, which (like for every array) allow NULL for zero rows. */
    BM_CHECK(bm_check_norm(fn, "next_norm", next_norm, &a->next));
    if (!a->next.on && normalized)
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT,
                       "%s: normalized must be NULL when next_norm is NULL (it would not be written)", fn);
    return BEAM_OK;
}

/* The extent of normalized: rows when a next norm writes it, none when it
 * is not written (no next norm, or only the quantized form: NULL with a
 * quant). */
static size_t bm_normalized_bytes(const bm_args *a, const uint16_t *normalized, size_t rows)
{
    if (!a->next.on || (a->q.kind && !normalized)) return 0;
    return rows;
}

/* beam_moe_finalize after its message is cleared: the checks, then the
 * backend's call. */
static beam_status bm_finalize_call(const uint16_t *experts, const float *weights, int64_t capacity,
                                    int64_t live, int32_t top_k, int32_t hidden, float routed_scale,
                                    const beam_norm *post_norm, uint16_t *output, void *stream)
{
    static const char fn[] = "beam_moe_finalize";
    bm_args a;
    bm_ptr p[4];
    memset(&a, 0, sizeof a);
    a.fn = fn;
    BM_CHECK(bm_check_finalize_stage(fn, capacity, live, top_k, hidden, routed_scale, post_norm, &a));
    p[0] = bm_in("expert_outputs", experts, (size_t)capacity * (size_t)top_k * bm_rows_bytes(1, hidden));
    p[1] = bm_in32("expert_weights", weights, (size_t)capacity * (size_t)top_k * FP32);
    p[2] = bm_in("post_norm->weight", a.post.weight, a.post.weight ? bm_rows_bytes(1, hidden) : 0);
    p[3] = bm_out("output", output, bm_rows_bytes(live, hidden));
    BM_CHECK(bm_backend_pointers(fn, p, 4));
    if (live == 0) return BEAM_OK;
    a.experts = experts;
    a.weights = weights;
    a.output = output;
    a.stream = stream;
    return BE->finalize(&a);
}

BEAM_API beam_status beam_moe_finalize(const uint16_t *expert_outputs, const float *expert_weights,
                                       int64_t capacity, int64_t live_tokens, int32_t top_k,
                                       int32_t hidden, float routed_scale, const beam_norm *post_norm,
                                       uint16_t *output, void *stream)
{
    bm_clear_error();
    return bm_finalize_call(expert_outputs, expert_weights, capacity, live_tokens, top_k, hidden,
                            routed_scale, post_norm, output, stream);
}

/* Checks of norm_residual_norm's arguments over `tokens` rows, shared with
 * the dense all-reduce, whose x is named xname. */
static beam_status bm_check_nrn(const char *fn, const char *xname, const uint16_t *x, const uint16_t *residual,
                                int64_t tokens, int32_t hidden, const beam_norm *pre_norm, const float *scales,
                                const beam_norm *next_norm, uint16_t *hidden_out, uint16_t *normalized,
                                const beam_quant *quant, bm_args *a)
{
    bm_ptr p[8];
    size_t rows;
    BM_CHECK(bm_check_hidden(fn, hidden));
    BM_CHECK(bm_check_rows(fn, "tokens", tokens, "tokens", tokens, 1, hidden));
    BM_CHECK(bm_check_norm(fn, "pre_norm", pre_norm, &a->pre));
    BM_CHECK(bm_check_scales(fn, scales, &a->has_scales, &a->scale_x, &a->scale_r));
    BM_CHECK(bm_check_next(fn, next_norm, normalized, a));
    BM_CHECK(bm_check_quant(fn, quant, a->next.on, tokens, hidden, &a->q, p + 6));
    rows = bm_rows_bytes(tokens, hidden);
    p[0] = bm_in(xname, x, rows);
    p[1] = bm_allow_in_place(bm_in("residual", residual, rows));
    p[2] = bm_in("pre_norm->weight", a->pre.weight, a->pre.weight ? bm_rows_bytes(1, hidden) : 0);
    p[3] = bm_in("next_norm->weight", a->next.weight, a->next.weight ? bm_rows_bytes(1, hidden) : 0);
    p[4] = bm_allow_in_place(bm_out("hidden_out", hidden_out, rows));
    p[5] = bm_out("normalized", normalized, bm_normalized_bytes(a, normalized, rows));
    BM_CHECK(bm_backend_pointers(fn, p, 8));
    a->x = x;
    a->residual = residual;
    a->hidden_out = hidden_out;
    a->normalized = normalized;
    a->tokens = tokens;
    a->hidden = hidden;
    return BEAM_OK;
}

/* norm_residual_norm with or without its quantized output (quant NULL). */
static beam_status bm_nrn_call(const char *fn, const uint16_t *x, const uint16_t *residual, int64_t tokens,
                               int32_t hidden, const beam_norm *pre_norm, const float *scales,
                               const beam_norm *next_norm, uint16_t *hidden_out, uint16_t *normalized,
                               const beam_quant *quant, void *stream)
{
    bm_args a;
    memset(&a, 0, sizeof a);
    a.fn = fn;
    BM_CHECK(bm_check_nrn(fn, "x", x, residual, tokens, hidden, pre_norm, scales, next_norm, hidden_out,
                          normalized, quant, &a));
    if (tokens == 0) return BEAM_OK;
    a.stream = stream;
    return BE->norm_residual_norm(&a);
}

BEAM_API beam_status beam_norm_residual_norm(const uint16_t *x, const uint16_t *residual,
                                             int64_t tokens, int32_t hidden,
                                             const beam_norm *pre_norm, const float *scales,
                                             const beam_norm *next_norm, uint16_t *hidden_out,
                                             uint16_t *normalized, void *stream)
{
    bm_clear_error();
    return bm_nrn_call("beam_norm_residual_norm", x, residual, tokens, hidden, pre_norm, scales, next_norm,
                       hidden_out, normalized, NULL, stream);
}

BEAM_API beam_status beam_norm_residual_norm_q(const uint16_t *x, const uint16_t *residual,
                                               int64_t tokens, int32_t hidden,
                                               const beam_norm *pre_norm, const float *scales,
                                               const beam_norm *next_norm, uint16_t *hidden_out,
                                               uint16_t *normalized, const beam_quant *quant, void *stream)
{
    bm_clear_error();
    return bm_nrn_call("beam_norm_residual_norm_q", x, residual, tokens, hidden, pre_norm, scales, next_norm,
                       hidden_out, normalized, quant, stream);
}

/* Checks of the fused op's arguments, shared with the gather, which passes
 * rows = its token count (residual and outputs) and capacity/live for the
 * expert buffers. */
static beam_status bm_check_fused(const char *fn, const uint16_t *experts, const float *weights,
                                  int64_t capacity, int64_t live, int64_t rows, int32_t top_k,
                                  int32_t hidden, float routed_scale, const beam_norm *post_norm,
                                  const uint16_t *residual, const float *scales,
                                  const beam_norm *next_norm, uint16_t *hidden_out,
                                  uint16_t *normalized, const beam_quant *quant, bm_args *a)
{
    bm_ptr p[9];
    size_t row_bytes;
    BM_CHECK(bm_check_finalize_stage(fn, capacity, live, top_k, hidden, routed_scale, post_norm, a));
    BM_CHECK(bm_check_scales(fn, scales, &a->has_scales, &a->scale_x, &a->scale_r));
    BM_CHECK(bm_check_next(fn, next_norm, normalized, a));
    BM_CHECK(bm_check_quant(fn, quant, a->next.on, rows, hidden, &a->q, p + 7));
    row_bytes = bm_rows_bytes(rows, hidden);
    p[0] = bm_in("expert_outputs", experts, (size_t)capacity * (size_t)top_k * bm_rows_bytes(1, hidden));
    p[1] = bm_in32("expert_weights", weights, (size_t)capacity * (size_t)top_k * FP32);
    p[2] = bm_in("post_norm->weight", a->post.weight, a->post.weight ? bm_rows_bytes(1, hidden) : 0);
    p[3] = bm_allow_in_place(bm_in("residual", residual, row_bytes));
    p[4] = bm_in("next_norm->weight", a->next.weight, a->next.weight ? bm_rows_bytes(1, hidden) : 0);
    p[5] = bm_allow_in_place(bm_out("hidden_out", hidden_out, row_bytes));
    p[6] = bm_out("normalized", normalized, bm_normalized_bytes(a, normalized, row_bytes));
    BM_CHECK(bm_backend_pointers(fn, p, 9));
    a->experts = experts;
    a->weights = weights;
    a->residual = residual;
    a->hidden_out = hidden_out;
    a->normalized = normalized;
    return BEAM_OK;
}

static beam_status bm_fused_call(const char *fn, const uint16_t *expert_outputs, const float *expert_weights,
                                 int64_t capacity, int64_t live_tokens, int32_t top_k, int32_t hidden,
                                 float routed_scale, const beam_norm *post_norm, const uint16_t *residual,
                                 const float *scales, const beam_norm *next_norm, uint16_t *hidden_out,
                                 uint16_t *normalized, const beam_quant *quant, beam_strategy strategy,
                                 void *stream)
{
    bm_args a;
    memset(&a, 0, sizeof a);
    a.fn = fn;
    BM_CHECK(bm_check_strategy(fn, strategy, 0));
    BM_CHECK(bm_check_fused(fn, expert_outputs, expert_weights, capacity, live_tokens, live_tokens,
                            top_k, hidden, routed_scale, post_norm, residual, scales, next_norm,
                            hidden_out, normalized, quant, &a));
    if (live_tokens == 0) return BEAM_OK;
    a.stream = stream;
    return strategy == BEAM_STRATEGY_UNFUSED ? BE->unfused(&a) : BE->fused(&a);
}

BEAM_API beam_status beam_moe_finalize_norm_residual_norm(
    const uint16_t *expert_outputs, const float *expert_weights, int64_t capacity,
    int64_t live_tokens, int32_t top_k, int32_t hidden, float routed_scale,
    const beam_norm *post_norm, const uint16_t *residual, const float *scales,
    const beam_norm *next_norm, uint16_t *hidden_out, uint16_t *normalized,
    beam_strategy strategy, void *stream)
{
    bm_clear_error();
    return bm_fused_call("beam_moe_finalize_norm_residual_norm", expert_outputs, expert_weights, capacity,
                         live_tokens, top_k, hidden, routed_scale, post_norm, residual, scales, next_norm,
                         hidden_out, normalized, NULL, strategy, stream);
}

BEAM_API beam_status beam_moe_finalize_norm_residual_norm_q(
    const uint16_t *expert_outputs, const float *expert_weights, int64_t capacity,
    int64_t live_tokens, int32_t top_k, int32_t hidden, float routed_scale,
    const beam_norm *post_norm, const uint16_t *residual, const float *scales,
    const beam_norm *next_norm, uint16_t *hidden_out, uint16_t *normalized,
    const beam_quant *quant, beam_strategy strategy, void *stream)
{
    bm_clear_error();
    return bm_fused_call("beam_moe_finalize_norm_residual_norm_q", expert_outputs, expert_weights, capacity,
                         live_tokens, top_k, hidden, routed_scale, post_norm, residual, scales, next_norm,
                         hidden_out, normalized, quant, strategy, stream);
}

/* ---- tensor-parallel gather -------------------------------------------- */

BEAM_API beam_workspace_config beam_workspace_config_default(void)
{
    beam_workspace_config c;
    if (BE->ws_default) return BE->ws_default();
    memset(&c, 0, sizeof c);
    return c;
}

BEAM_API beam_status beam_cpu_group_create(int32_t nranks, beam_cpu_group **group)
{
    static const char fn[] = "beam_cpu_group_create";
    bm_clear_error();
    if (!group) return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: group must not be NULL", fn);
    if (nranks < 1 || nranks > 256)
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: nranks=%d must be in [1, 256]", fn, (int)nranks);
    if (!BE->group_create)
        return bm_fail(BEAM_ERR_UNSUPPORTED, "%s: the %s backend has no CPU group "
                       "(use libbeammoe_cpu, or libbeammoe)", fn, BE->name);
    return BE->group_create(nranks, group);
}

BEAM_API beam_status beam_cpu_group_destroy(beam_cpu_group *group)
{
    bm_clear_error();
    if (!group) return BEAM_OK;
    if (!BE->group_destroy)
        return bm_fail(BEAM_ERR_UNSUPPORTED, "beam_cpu_group_destroy: the %s backend has no CPU group",
                       BE->name);
    return BE->group_destroy(group);
}

static beam_status bm_check_config(const char *fn, const beam_workspace_config *cfg, bm_ws *ws)
{
    ws->cfg = cfg ? *cfg : (BE->ws_default ? BE->ws_default() : ws->cfg);
    if (ws->cfg.oneshot_max_tokens < 0 || ws->cfg.twoshot_max_tokens < 0)
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT,
                       "%s: cfg->oneshot_max_tokens=%lld and cfg->twoshot_max_tokens=%lld must be >= 0", fn,
                       (long long)ws->cfg.oneshot_max_tokens, (long long)ws->cfg.twoshot_max_tokens);
    if (ws->cfg.timeout_ms < 1)
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: cfg->timeout_ms=%d must be >= 1", fn,
                       (int)ws->cfg.timeout_ms);
    return BEAM_OK;
}

static beam_status bm_check_ws_shape(const char *fn, int64_t max_tokens, int32_t hidden, bm_ws *ws)
{
    BM_CHECK(bm_check_hidden(fn, hidden));
    BM_CHECK(bm_check_rows(fn, "max_tokens", max_tokens, "max_tokens", max_tokens, 1, hidden));
    ws->max_tokens = max_tokens;
    ws->hidden = hidden;
    return BEAM_OK;
}

BEAM_API beam_status beam_workspace_create_cpu(beam_cpu_group *group, int32_t rank, int64_t max_tokens,
                                               int32_t hidden, const beam_workspace_config *cfg,
                                               beam_workspace **workspace)
{
    static const char fn[] = "beam_workspace_create_cpu";
    struct beam_workspace *w = NULL;
    bm_ws none; /* what the backend sees when there is no handle to fill */
    beam_status local = BEAM_OK, st;
    bm_clear_error();
    if (workspace)
        *workspace = NULL;
    else
        local = bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: workspace must not be NULL", fn);
    /* Without a group (or a backend with groups) there is nobody to tell. */
    if (local != BEAM_OK && (!group || !BE->ws_create_cpu)) return local;
    if (!group) return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: group must not be NULL", fn);
    if (!BE->ws_create_cpu)
        return bm_fail(BEAM_ERR_UNSUPPORTED, "%s: the %s backend has no CPU group", fn, BE->name);
    if (local == BEAM_OK) {
        w = (struct beam_workspace *)calloc(1, sizeof *w);
        if (!w) local = bm_fail(BEAM_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    }
    memset(&none, 0, sizeof none);
    /* The rank is checked by the backend (it knows the group). Every other
     * failure here (no out-parameter, no memory for the handle, a bad size
     * or cfg) still joins the peers, so that they fail with us at once
     * instead of waiting for this rank until their timeout. */
    if (local == BEAM_OK) local = bm_check_ws_shape(fn, max_tokens, hidden, &w->ws);
    if (local == BEAM_OK) local = bm_check_config(fn, cfg, &w->ws);
    st = BE->ws_create_cpu(group, rank, w ? &w->ws : &none, local);
    if (st != BEAM_OK) {
        free(w);
        return st;
    }
    *workspace = w;
    return BEAM_OK;
}

BEAM_API beam_status beam_workspace_create_nccl(void *nccl_comm, int64_t max_tokens, int32_t hidden,
                                                const beam_workspace_config *cfg,
                                                beam_workspace **workspace)
{
    static const char fn[] = "beam_workspace_create_nccl";
    struct beam_workspace *w;
    beam_status st;
    bm_clear_error();
    if (!workspace) return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: workspace must not be NULL", fn);
    *workspace = NULL;
    if (!BE->ws_create_nccl)
        return bm_fail(BEAM_ERR_UNSUPPORTED, "%s: the %s backend has no NCCL workspace", fn, BE->name);
    if (!nccl_comm) return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: nccl_comm must not be NULL", fn);
    w = (struct beam_workspace *)calloc(1, sizeof *w);
    if (!w) return bm_fail(BEAM_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    /* A rank whose arguments fail still joins the collective creation, so
     * that its peers fail with it instead of waiting for it. */
    st = bm_check_ws_shape(fn, max_tokens, hidden, &w->ws);
    if (st == BEAM_OK) st = bm_check_config(fn, cfg, &w->ws);
    st = BE->ws_create_nccl(nccl_comm, &w->ws, st);
    if (st != BEAM_OK) {
        free(w);
        return st;
    }
    *workspace = w;
    return BEAM_OK;
}

BEAM_API beam_status beam_workspace_destroy(beam_workspace *workspace)
{
    beam_status st;
    bm_clear_error();
    if (!workspace) return BEAM_OK;
    st = BE->ws_destroy ? BE->ws_destroy(&workspace->ws) : BEAM_OK;
    /* An argument error changes nothing (the CPU group refuses to destroy a
     * workspace while a call on it is in progress): the handle stays valid.
     * Any other failure has released the workspace all the same. */
    if (st == BEAM_ERR_INVALID_ARGUMENT) return st;
    free(workspace);
    return st;
}

BEAM_API beam_status beam_workspace_info(const beam_workspace *workspace, int32_t *rank, int32_t *nranks)
{
    static const char fn[] = "beam_workspace_info";
    bm_clear_error();
    if (!workspace) return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: workspace must not be NULL", fn);
    if (rank) *rank = workspace->ws.rank;
    if (nranks) *nranks = workspace->ws.nranks;
    return BEAM_OK;
}

/* AUTO's choice, from the workspace thresholds. */
static beam_strategy bm_pick_gather(const bm_ws *ws, int64_t tokens)
{
    if (tokens <= ws->cfg.oneshot_max_tokens) return BEAM_STRATEGY_ONESHOT;
    if (tokens <= ws->cfg.twoshot_max_tokens) return BEAM_STRATEGY_TWOSHOT;
    return BEAM_STRATEGY_UNFUSED;
}

/* What every collective call checks first: the strategy, and the tokens
 * and hidden against the workspace's. */
static beam_status bm_check_collective(const char *fn, const bm_ws *ws, int64_t tokens, int32_t hidden,
                                       beam_strategy strategy)
{
    BM_CHECK(bm_check_strategy(fn, strategy, 1));
    if (tokens < 0)
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: tokens=%lld must be >= 0", fn, (long long)tokens);
    if (tokens > ws->max_tokens)
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: tokens=%lld must be <= max_tokens=%lld of the workspace",
                       fn, (long long)tokens, (long long)ws->max_tokens);
    if (hidden != ws->hidden)
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: hidden=%d must equal hidden=%d of the workspace", fn,
                       (int)hidden, (int)ws->hidden);
    return BEAM_OK;
}

static beam_status bm_check_gather(const char *fn, const bm_ws *ws, const uint16_t *experts,
                                   const float *weights, int64_t capacity, int64_t tokens,
                                   int32_t top_k, int32_t hidden, float routed_scale,
                                   const beam_norm *post_norm, const uint16_t *residual,
                                   const float *scales, const beam_norm *next_norm,
                                   uint16_t *hidden_out, uint16_t *normalized,
                                   const beam_quant *quant, beam_strategy strategy, bm_args *a)
{
    int64_t per_rank, owned;
    BM_CHECK(bm_check_collective(fn, ws, tokens, hidden, strategy));
    per_rank = (tokens + ws->nranks - 1) / ws->nranks;
    owned = tokens - (int64_t)ws->rank * per_rank;
    owned = owned < 0 ? 0 : (owned > per_rank ? per_rank : owned);
    if (capacity < per_rank)
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT,
                       "%s: capacity=%lld must be >= ceil(tokens / ranks) = %lld (tokens=%lld, ranks=%d)", fn,
                       (long long)capacity, (long long)per_rank, (long long)tokens, (int)ws->nranks);
    BM_CHECK(bm_check_fused(fn, experts, weights, capacity, owned, tokens, top_k, hidden, routed_scale,
                            post_norm, residual, scales, next_norm, hidden_out, normalized, quant, a));
    return BEAM_OK;
}

/* The gather with or without its quantized output (quant NULL). quant is
 * checked for all `tokens` rows like normalized: its arrays are replicated
 * on every rank. */
static beam_status bm_gather_call(const char *fn, beam_workspace *workspace, const uint16_t *expert_outputs,
                                  const float *expert_weights, int64_t capacity, int64_t tokens, int32_t top_k,
                                  int32_t hidden, float routed_scale, const beam_norm *post_norm,
                                  const uint16_t *residual, const float *scales, const beam_norm *next_norm,
                                  uint16_t *hidden_out, uint16_t *normalized, const beam_quant *quant,
                                  beam_strategy strategy, void *stream)
{
    bm_args a;
    beam_status local;
    if (!workspace) return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: workspace must not be NULL", fn);
    if (!BE->gather)
        return bm_fail(BEAM_ERR_UNSUPPORTED, "%s: the %s backend has no gather yet", fn, BE->name);
    memset(&a, 0, sizeof a);
    a.fn = fn;
    /* The shape travels even when the checks fail, so that a backend can
     * tell its peers about this rank's failure in a call of the same size. */
    a.top_k = top_k;
    a.hidden = hidden;
    local = bm_check_gather(fn, &workspace->ws, expert_outputs, expert_weights, capacity, tokens, top_k,
                            hidden, routed_scale, post_norm, residual, scales, next_norm, hidden_out,
                            normalized, quant, strategy, &a);
    /* The global T, set after the checks: the fused op's checks leave this
     * rank's owned row count there, and one that fails past them (a bad
     * quant, scales, next_norm) on a rank that owns no rows would leave 0,
     * which a backend takes for a call without rows: it keeps the failure
     * to itself while its peers wait for it (the CUDA gather until its
     * timeout). */
    a.tokens = tokens;
    a.stream = stream;
    if (strategy == BEAM_STRATEGY_AUTO) strategy = bm_pick_gather(&workspace->ws, tokens);
    /* Even a rank whose arguments failed joins the collective, so that its
     * peers return an error too instead of waiting for it. */
    return BE->gather(&workspace->ws, &a, strategy, local);
}

BEAM_API beam_status beam_moe_finalize_gather_norm_residual_norm(
    beam_workspace *workspace, const uint16_t *expert_outputs, const float *expert_weights,
    int64_t capacity, int64_t tokens, int32_t top_k, int32_t hidden, float routed_scale,
    const beam_norm *post_norm, const uint16_t *residual, const float *scales,
    const beam_norm *next_norm, uint16_t *hidden_out, uint16_t *normalized, beam_strategy strategy,
    void *stream)
{
    bm_clear_error();
    return bm_gather_call("beam_moe_finalize_gather_norm_residual_norm", workspace, expert_outputs,
                          expert_weights, capacity, tokens, top_k, hidden, routed_scale, post_norm, residual,
                          scales, next_norm, hidden_out, normalized, NULL, strategy, stream);
}

BEAM_API beam_status beam_moe_finalize_gather_norm_residual_norm_q(
    beam_workspace *workspace, const uint16_t *expert_outputs, const float *expert_weights,
    int64_t capacity, int64_t tokens, int32_t top_k, int32_t hidden, float routed_scale,
    const beam_norm *post_norm, const uint16_t *residual, const float *scales,
    const beam_norm *next_norm, uint16_t *hidden_out, uint16_t *normalized, const beam_quant *quant,
    beam_strategy strategy, void *stream)
{
    bm_clear_error();
    return bm_gather_call("beam_moe_finalize_gather_norm_residual_norm_q", workspace, expert_outputs,
                          expert_weights, capacity, tokens, top_k, hidden, routed_scale, post_norm, residual,
                          scales, next_norm, hidden_out, normalized, quant, strategy, stream);
}

/* Both all-reduces: moe 0 is the dense form (x the partial), 1 the MoE
 * form (experts, weights). The norm of the reduced sum travels as a.pre
 * (the MoE form's post_norm). */
static beam_status bm_allreduce_call(const char *fn, beam_workspace *workspace, int moe, const uint16_t *x,
                                     const uint16_t *experts, const float *weights, int64_t capacity,
                                     int64_t tokens, int32_t top_k, int32_t hidden, float routed_scale,
                                     const beam_norm *norm, const uint16_t *residual, const float *scales,
                                     const beam_norm *next_norm, uint16_t *hidden_out, uint16_t *normalized,
                                     const beam_quant *quant, beam_strategy strategy, void *stream)
{
    bm_args a;
    beam_status local;
    if (!workspace) return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: workspace must not be NULL", fn);
    if (!BE->allreduce)
        return bm_fail(BEAM_ERR_UNSUPPORTED, "%s: the %s backend has no all-reduce yet", fn, BE->name);
    memset(&a, 0, sizeof a);
    a.fn = fn;
    local = bm_check_collective(fn, &workspace->ws, tokens, hidden, strategy);
    if (local == BEAM_OK && moe && capacity < tokens)
        local = bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: capacity=%lld must be >= tokens=%lld (every rank holds "
                        "every token's slots)", fn, (long long)capacity, (long long)tokens);
    if (local == BEAM_OK && !moe)
        local = bm_check_nrn(fn, "partial", x, residual, tokens, hidden, norm, scales, next_norm, hidden_out,
                             normalized, quant, &a);
    if (local == BEAM_OK && moe) {
        local = bm_check_fused(fn, experts, weights, capacity, tokens, tokens, top_k, hidden, routed_scale, norm,
                               residual, scales, next_norm, hidden_out, normalized, quant, &a);
        a.pre = a.post;
        a.post.on = 0;
    }
    /* the shape travels even when the checks fail (bm_gather_call) */
    a.top_k = moe ? top_k : 0;
    a.hidden = hidden;
    a.tokens = tokens;
    a.stream = stream;
    if (strategy == BEAM_STRATEGY_AUTO) strategy = bm_pick_gather(&workspace->ws, tokens);
    return BE->allreduce(&workspace->ws, &a, strategy, local);
}

BEAM_API beam_status beam_allreduce_norm_residual_norm(beam_workspace *workspace, const uint16_t *partial,
                                                       int64_t tokens, int32_t hidden, const beam_norm *pre_norm,
                                                       const uint16_t *residual, const float *scales,
                                                       const beam_norm *next_norm, uint16_t *hidden_out,
                                                       uint16_t *normalized, const beam_quant *quant,
                                                       beam_strategy strategy, void *stream)
{
    bm_clear_error();
    return bm_allreduce_call("beam_allreduce_norm_residual_norm", workspace, 0, partial, NULL, NULL, 0, tokens,
                             0, hidden, 1.0f, pre_norm, residual, scales, next_norm, hidden_out, normalized, quant,
                             strategy, stream);
}

BEAM_API beam_status beam_moe_finalize_allreduce_norm_residual_norm(
    beam_workspace *workspace, const uint16_t *expert_outputs, const float *expert_weights,
    int64_t capacity, int64_t tokens, int32_t top_k, int32_t hidden, float routed_scale,
    const beam_norm *post_norm, const uint16_t *residual, const float *scales,
    const beam_norm *next_norm, uint16_t *hidden_out, uint16_t *normalized, const beam_quant *quant,
    beam_strategy strategy, void *stream)
{
    bm_clear_error();
    return bm_allreduce_call("beam_moe_finalize_allreduce_norm_residual_norm", workspace, 1, NULL, expert_outputs,
                             expert_weights, capacity, tokens, top_k, hidden, routed_scale, post_norm, residual,
                             scales, next_norm, hidden_out, normalized, quant, strategy, stream);
}

/* ---- this library's table (beam_backend_ops) ------------------------- */

/* Hidden aliases of the exported functions above: the table points at
 * these, so that it reaches this library's code even where another library
 * interposes a beam_* name (ELF symbol interposition). */
#define BM_LOCAL(name) \
    extern __typeof__(name) bm_local_##name __attribute__((alias(#name), visibility("hidden")))
BM_LOCAL(beam_moe_finalize);
BM_LOCAL(beam_norm_residual_norm);
BM_LOCAL(beam_moe_finalize_norm_residual_norm);
BM_LOCAL(beam_workspace_config_default);
BM_LOCAL(beam_cpu_group_create);
BM_LOCAL(beam_cpu_group_destroy);
BM_LOCAL(beam_workspace_create_cpu);
BM_LOCAL(beam_workspace_create_nccl);
BM_LOCAL(beam_workspace_destroy);
BM_LOCAL(beam_workspace_info);
BM_LOCAL(beam_moe_finalize_gather_norm_residual_norm);
BM_LOCAL(beam_norm_residual_norm_q);
BM_LOCAL(beam_moe_finalize_norm_residual_norm_q);
BM_LOCAL(beam_moe_finalize_gather_norm_residual_norm_q);
BM_LOCAL(beam_allreduce_norm_residual_norm);
BM_LOCAL(beam_moe_finalize_allreduce_norm_residual_norm);
#undef BM_LOCAL

static const beam_ops bm_ops = {
    BEAM_OPS_VERSION,
    (uint32_t)sizeof(beam_ops),
    NULL, /* name and device_memory: from BE and backends.def, bm_ops_fill */
    0,
    bm_last_error,
    bm_local_beam_moe_finalize,
    bm_local_beam_norm_residual_norm,
    bm_local_beam_moe_finalize_norm_residual_norm,
    bm_local_beam_workspace_config_default,
    bm_local_beam_cpu_group_create,
    bm_local_beam_cpu_group_destroy,
    bm_local_beam_workspace_create_cpu,
    bm_local_beam_workspace_create_nccl,
    bm_local_beam_workspace_destroy,
    bm_local_beam_workspace_info,
    bm_local_beam_moe_finalize_gather_norm_residual_norm,
    bm_local_beam_norm_residual_norm_q,
    bm_local_beam_moe_finalize_norm_residual_norm_q,
    bm_local_beam_moe_finalize_gather_norm_residual_norm_q,
    bm_local_beam_allreduce_norm_residual_norm,
    bm_local_beam_moe_finalize_allreduce_norm_residual_norm,
};

static beam_ops bm_ops_filled;
static pthread_once_t bm_ops_once = PTHREAD_ONCE_INIT;

static void bm_ops_fill(void)
{
    bm_ops_filled = bm_ops;
    bm_ops_filled.name = BE->name;
    bm_ops_filled.device_memory = bm_backend_device_memory(bm_backend_find(BE->name));
}

BEAM_API const beam_ops *beam_backend_ops(const char *name, uint32_t version)
{
    static const char fn[] = "beam_backend_ops";
    bm_clear_error();
    if (version < 1 || version > BEAM_OPS_VERSION) {
        bm_fail(BEAM_ERR_UNSUPPORTED, "%s: version=%u: this library serves table versions 1 to %u", fn,
                (unsigned)version, (unsigned)BEAM_OPS_VERSION);
        return NULL;
    }
    if (name && strcmp(name, BE->name) != 0) {
        if (bm_backend_find(name) >= 0)
            bm_fail(BEAM_ERR_UNSUPPORTED,
                    "%s: name=\"%s\": this library holds only the %s backend (libbeammoe loads any)", fn,
                    name, BE->name);
        else
            bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: name=\"%s\" must be %s", fn, name, bm_backend_choices(1));
        return NULL;
    }
    if (BE->available() != BEAM_OK) return NULL;
    pthread_once(&bm_ops_once, bm_ops_fill);
    return &bm_ops_filled;
}
