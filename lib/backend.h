/*
 * backend.h - the table of operations every backend implements (internal).
 *
 * lib/api.c holds the public beam_* entry points of a backend library: it
 * checks every argument once (lib/check.c), packs the call into a bm_args and
 * calls the backend through bm_backend_table. A backend folder (cpu/, gpu/)
 * defines that one table and never sees an unchecked argument.
 *
 * Nothing here is exported: internal names use the bm_ prefix and the build
 * uses -fvisibility=hidden.
 */
#ifndef BEAMMOE_LIB_BACKEND_H
#define BEAMMOE_LIB_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "beammoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An optional RMSNorm after checking: on = 0 means "no norm". */
typedef struct bm_norm {
    int on;
    const uint16_t *weight; /* NULL: no affine step */
    float eps;
} bm_norm;

/* The quantized output of normalized after checking (beam_quant):
 * kind 0 means none; the CUDA kernels take it as their parameter as is
 * (gpu/row_kernel.cuh). Scales of group g of token t: scales[t * ld_t + g * ld_g]
 * (GROUP row-major: ld_t = hidden / group, ld_g = 1; column-major: ld_t = 1,
 * ld_g = scale_ld; TOKEN: ld_t = 1, group = hidden). */
typedef struct bm_quant {
    int kind;      /* 0 or BEAM_QUANT_FP8_*, BEAM_QUANT_NVFP4 */
    int group;     /* values per scale: group_size, or hidden for TOKEN */
    int ue8m0;
    float scale;   /* TENSOR: the scale; NVFP4: the global scale */
    uint8_t *values;
    float *scales;
    int64_t ld_t, ld_g;
    uint8_t *block_scales; /* NVFP4 (group 16, scale = g): BEAM_NVFP4_SCALE_OFFSET */
} bm_quant;

/* One checked call. Which fields are used depends on the operation:
 *  finalize:            experts, weights, top_k, routed_scale, post -> output
 *  norm_residual_norm:  x, pre, scales, residual, next -> hidden_out, normalized
 *  fused / unfused:     experts .. post, then scales, residual, next
 *                       -> hidden_out, normalized (the finalized row is never
 *                       stored by the fused pass)
 * tokens is the number of rows processed (live_tokens); all row arrays are
 * dense [tokens, hidden] (experts [tokens, top_k, hidden]). */
typedef struct bm_args {
    const uint16_t *experts;
    const float *weights;
    int32_t top_k;
    float routed_scale;
    bm_norm post;

    const uint16_t *x;
    bm_norm pre;

    int has_scales;
    float scale_x, scale_r;
    const uint16_t *residual;
    bm_norm next;

    uint16_t *output;
    uint16_t *hidden_out;  /* may equal residual */
    uint16_t *normalized;  /* non-NULL exactly when next.on, except with a
                              quantized output: then it may be NULL */
    bm_quant q;            /* the quantized output of normalized (needs next.on) */

    int64_t tokens;
    int32_t hidden;
    void *stream;
    const char *fn; /* the entry point called: the name in a backend's messages */
} bm_args;

/* One pointer argument of a call, for the generic checks (alignment,
 * overlap) and the backend's own (CUDA: device memory of this device). */
typedef struct bm_ptr {
    const char *name;
    const void *ptr;
    size_t bytes;  /* extent the call may touch */
    size_t align;  /* 2 for BF16 arrays, 4 for FP32 */
    int is_output;
    int in_place;  /* set on one output and one input: they may be exactly
                      the same buffer (hidden_out == residual) */
} bm_ptr;

/* The state every workspace shares; the backend owns impl. */
typedef struct bm_ws {
    int32_t rank, nranks;
    int64_t max_tokens;
    int32_t hidden;
    beam_workspace_config cfg;
    void *impl;
} bm_ws;

typedef struct bm_backend {
    const char *name;

    /* BEAM_OK when the backend can run here (CUDA: a device is visible);
     * otherwise an error with the message set. */
    beam_status (*available)(void);

    /* Extra checks of the pointers of a call (after the generic ones);
     * must not write anything. NULL: none. */
    beam_status (*check_pointers)(const char *fn, const bm_ptr *p, int n);

    beam_status (*finalize)(const bm_args *a);
    beam_status (*norm_residual_norm)(const bm_args *a);
    beam_status (*fused)(const bm_args *a);   /* finalize_norm_residual_norm, one pass */
    beam_status (*unfused)(const bm_args *a); /* the composition of the two */

    /* ---- gather (NULL members: unsupported by this backend) ---- */
    beam_workspace_config (*ws_default)(void);
    beam_status (*group_create)(int32_t nranks, beam_cpu_group **group);
    beam_status (*group_destroy)(beam_cpu_group *group);
    /* Collective. Fill ws->impl; ws->rank/nranks are set by the backend.
     * local_status != BEAM_OK: this rank's arguments failed lib's checks; the
     * backend still joins its peers so that every rank fails together. */
    beam_status (*ws_create_cpu)(beam_cpu_group *group, int32_t rank, bm_ws *ws,
                                 beam_status local_status);
    /* Collective, like ws_create_cpu: local_status != BEAM_OK still joins. */
    beam_status (*ws_create_nccl)(void *comm, bm_ws *ws, beam_status local_status);
    /* BEAM_ERR_INVALID_ARGUMENT: refused, nothing released, the handle
     * stays valid (lib/ does not free it); any other status: released. */
    beam_status (*ws_destroy)(bm_ws *ws);
    /* Collective. a->experts/weights hold this rank's owned rows; a->tokens is
     * the global T; residual/hidden_out/normalized are [T, hidden]. With
     * a->q.kind != 0 (beam_moe_finalize_gather_norm_residual_norm_q) the
     * quantized form of all T normalized rows is written too (values
     * [T, hidden], the scales of all T rows), and a->normalized may be NULL.
     * local_status != BEAM_OK: this rank's arguments failed the checks; the
     * backend must still let its peers learn that (all ranks then return an
     * error and write nothing) where it can. strategy is never AUTO here. */
    beam_status (*gather)(bm_ws *ws, const bm_args *a, beam_strategy strategy,
                          beam_status local_status);
    /* Collective, like gather: the all-reduce (docs/numerics.md#all-reduce)
     * of every rank's partial of all a->tokens rows, then norm_residual_norm
     * with a->pre on the sum. The partial is a->x (the dense form) or, with
     * a->experts ([tokens, top_k, hidden]), the finalize of this rank's
     * slots with a->post off. */
    beam_status (*allreduce)(bm_ws *ws, const bm_args *a, beam_strategy strategy,
                             beam_status local_status);
} bm_backend;

/* Defined by exactly one backend folder per library. */
extern const bm_backend bm_backend_table;

#ifdef __cplusplus
}
#endif

#endif
