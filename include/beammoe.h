/*
 * beammoe.h - the one public header of beammoe.
 *
 * beammoe computes the last step of a mixture-of-experts layer: each token's
 * top_k expert results (BF16) and routing weights (FP32) become its hidden
 * state (weighted sum, BF16 rounding, routed scale, optional post-norm),
 * optionally fused with the residual add and the next layer's RMSNorm, and in
 * tensor parallelism with an all-gather of each rank's tokens.
 *
 * Every result follows one exact rounding order (docs/numerics.md,
 * section 2), so all backends, strategies, thread counts and ranks give the
 * same bits.
 *
 * Layouts are dense, row-major, contiguous:
 *   expert_outputs  [capacity, top_k, hidden]  BF16 (token-major)
 *   expert_weights  [capacity, top_k]          FP32
 *   residual, hidden, normalized, x, output    [tokens, hidden] BF16
 *   norm weights    [hidden]                   BF16
 * Only live rows are read; rows past them may hold anything (NaN included).
 *
 * BF16 values travel as uint16_t bit patterns. Every call returns a
 * beam_status; when an argument breaks a rule (BEAM_ERR_INVALID_ARGUMENT,
 * BEAM_ERR_UNSUPPORTED) nothing has been written, and beam_last_error()
 * names the function, the argument and the rule. A device or communication
 * error (a peer timing out mid-call) may leave outputs partly written.
 *
 * Three libraries export exactly these symbols: libbeammoe_cpu (C99 +
 * OpenMP), libbeammoe_cuda (CUDA) and libbeammoe (picks one at run time).
 */
#ifndef BEAMMOE_H
#define BEAMMOE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define BEAM_API
#elif defined(__GNUC__)
#define BEAM_API __attribute__((visibility("default")))
#else
#define BEAM_API
#endif

/* BEAM_VERSION_MAJOR, _MINOR, _PATCH (written by configure) */
#include "beammoe_version.h"

/* Status codes. BEAM_OK is 0; every other value is an error. */
typedef enum beam_status {
    BEAM_OK = 0,
    BEAM_ERR_INVALID_ARGUMENT = 1, /* a rule of the contract was broken   */
    BEAM_ERR_UNSUPPORTED = 2,      /* not available in this build/backend */
    BEAM_ERR_DEVICE = 3,           /* CUDA runtime or driver error         */
    BEAM_ERR_COMM = 4,             /* communication error or timeout      */
    BEAM_ERR_OUT_OF_MEMORY = 5
} beam_status;

/* How an operation is carried out. Every strategy gives identical bits.
 * Local operations take AUTO, FUSED, UNFUSED; the gather takes AUTO,
 * ONESHOT, TWOSHOT, UNFUSED. */
typedef enum beam_strategy {
    BEAM_STRATEGY_AUTO = 0,
    BEAM_STRATEGY_FUSED = 1,   /* one pass over memory per token          */
    BEAM_STRATEGY_UNFUSED = 2, /* composition of the separate operations  */
    BEAM_STRATEGY_ONESHOT = 3, /* gather finalized rows, normalize all    */
    BEAM_STRATEGY_TWOSHOT = 4  /* normalize owned rows, gather the results */
} beam_strategy;

/* An optional RMSNorm: pass a pointer to one (NULL = no norm).
 * weight may be NULL (no affine step); eps must be finite and >= 0. */
typedef struct beam_norm {
    const uint16_t *weight; /* [hidden] BF16, or NULL */
    float eps;
} beam_norm;

/* ---- errors, version, backend selection ------------------------------- */

/* A fixed description of a status code ("invalid argument", ...). */
BEAM_API const char *beam_status_string(beam_status status);

/* The calling thread's message for its last failed call ("" if none). */
BEAM_API const char *beam_last_error(void);

/* "MAJOR.MINOR.PATCH" */
BEAM_API const char *beam_version(void);

/* Name of the backend that runs the calls: "cpu" or "cuda" ("none" from
 * libbeammoe when no backend library could be loaded). */
BEAM_API const char *beam_backend_name(void);

/* Select a backend: "cpu", "cuda" or "auto" (CUDA when it loads and a device
 * is visible, else the CPU). libbeammoe reads BEAM_BACKEND at first use.
 * A backend library accepts its own name and "auto" only. */
BEAM_API beam_status beam_set_backend(const char *name);

/* ---- single-device operations ------------------------------------------ */

/* finalize: for each live token t < live_tokens,
 *   output[t] = post_norm( bf16( bf16(sum_k w[t][k] * x[t][k]) * routed_scale ) )
 * output is [live_tokens, hidden]. stream is a cudaStream_t (CPU: ignored). */
typedef beam_status beam_moe_finalize_fn(
    const uint16_t *expert_outputs, const float *expert_weights,
    int64_t capacity, int64_t live_tokens, int32_t top_k, int32_t hidden,
    float routed_scale, const beam_norm *post_norm,
    uint16_t *output, void *stream);
BEAM_API beam_moe_finalize_fn beam_moe_finalize;

/* norm_residual_norm: for each token,
 *   x'         = pre_norm ? N(x) : x
 *   hidden     = bf16(bf16(x' * scales[0]) + bf16(residual * scales[1]))
 *                (without the scale products when scales is NULL)
 *   normalized = N(hidden)      (only when next_norm is given)
 * scales is a host array of two floats or NULL. hidden may be the residual
 * buffer itself (in-place update). normalized must be non-NULL exactly when
 * next_norm is given. */
typedef beam_status beam_norm_residual_norm_fn(
    const uint16_t *x, const uint16_t *residual,
    int64_t tokens, int32_t hidden,
    const beam_norm *pre_norm, const float *scales, const beam_norm *next_norm,
    uint16_t *hidden_out, uint16_t *normalized, void *stream);
BEAM_API beam_norm_residual_norm_fn beam_norm_residual_norm;

/* finalize then norm_residual_norm (no pre-norm) in one operation:
 * strategy AUTO, FUSED (one pass over memory) or UNFUSED (the composition).
 * residual, hidden_out, normalized are [live_tokens, hidden]. */
typedef beam_status beam_moe_finalize_norm_residual_norm_fn(
    const uint16_t *expert_outputs, const float *expert_weights,
    int64_t capacity, int64_t live_tokens, int32_t top_k, int32_t hidden,
    float routed_scale, const beam_norm *post_norm,
    const uint16_t *residual, const float *scales, const beam_norm *next_norm,
    uint16_t *hidden_out, uint16_t *normalized,
    beam_strategy strategy, void *stream);
BEAM_API beam_moe_finalize_norm_residual_norm_fn beam_moe_finalize_norm_residual_norm;

/* ---- the next layer's FP8 input (docs/numerics.md#fp8) ------------------- */

/* How normalized is quantized: FP8 E4M3 codes (torch.float8_e4m3fn) and
 * FP32 scales, with the semantics of vLLM's quantization kernels. */
typedef enum beam_quant_kind {
    BEAM_QUANT_FP8_GROUP = 1,  /* dynamic: a scale per token and group of group_size values */
    BEAM_QUANT_FP8_TOKEN = 2,  /* dynamic: a scale per token */
    BEAM_QUANT_FP8_TENSOR = 3, /* static: the caller's scale for the whole tensor */
    BEAM_QUANT_NVFP4 = 4,      /* E2M1 values, an E4M3 scale per 16 values and the
                                * caller's global scale (docs/numerics.md#nvfp4) */
    BEAM_QUANT_MXFP8 = 5       /* OCP MX: E4M3 values, an E8M0 scale per 32 values
                                * (docs/numerics.md#mxfp8) */
} beam_quant_kind;

/* flags */
#define BEAM_QUANT_UE8M0 1u     /* dynamic scales rounded up to a power of two */
#define BEAM_QUANT_COL_MAJOR 2u /* GROUP: scales[g * scale_ld + t] instead of
                                 * scales[t * (hidden / group_size) + g] */

/* The quantized output of an operation's normalized rows: for token t and
 * element h, values[t * hidden + h] = e4m3(clamp(normalized[t][h] / s)),
 * where s is the scale of h's group (GROUP), of t (TOKEN) or `scale`
 * (TENSOR). It equals quantizing the BF16 normalized output afterwards, bit
 * for bit, on every backend.
 *
 * NVFP4: values[t * hidden / 2 + h / 2] holds the E2M1 code of element h in
 * its low (h even) or high (h odd) four bits (torch.float4_e2m1fn_x2);
 * `scale` is the global scale g (vLLM's input_global_scale, typically
 * 448 * 6 / amax), 0 < g < 2^118; block_scales gets one E4M3 code per 16
 * values, at the byte BEAM_NVFP4_SCALE_OFFSET(t, h / 16, hidden) of the
 * 128 x 4 tiled layout that Blackwell's block-scaled GEMMs read, in an
 * array of BEAM_NVFP4_SCALE_BYTES(tokens, hidden) bytes whose padding
 * (the rows past the last token of its 128-row tile) is not written. */
typedef struct beam_quant {
    int32_t kind;       /* beam_quant_kind */
    int32_t group_size; /* GROUP: 128 or 64; otherwise 0 */
    uint32_t flags;     /* BEAM_QUANT_UE8M0 (GROUP, TOKEN), BEAM_QUANT_COL_MAJOR (GROUP) */
    float scale;        /* TENSOR: > 0 and finite; otherwise 0 */
    uint8_t *values;    /* [tokens, hidden] E4M3 codes, written */
    float *scales;      /* GROUP: [tokens, hidden / group_size] row-major, or
                         * column-major with scale_ld; TOKEN: [tokens];
                         * written. TENSOR: NULL */
    int64_t scale_ld;   /* COL_MAJOR: floats from one group's column to the
                         * next, >= tokens (DeepGEMM pads it to a multiple
                         * of 4); otherwise 0 */
    uint8_t *block_scales; /* NVFP4: the E4M3 block scales, MXFP8: the E8M0
                            * ones, written; otherwise NULL */
} beam_quant;

/* The block scales' layout (NVFP4, MXFP8): one byte per group of 16 or 32
 * values, n = hidden / 16 or hidden / 32 of them a row, in 128-row by
 * 4-scale tiles of 512 bytes: tile (t / 128, b / 4) at 512 * ((t / 128) *
 * (n / 4) + b / 4), and in a tile row t % 32 at 16 * (t % 32), then 4 *
 * ((t % 128) / 32) + b % 4; the array holds whole tiles. Integer arguments
 * (int64_t t, b; n). */
#define BEAM_BLOCK_SCALE_OFFSET(t, b, n)                                                         \
    (512 * (((int64_t)(t) / 128) * ((int64_t)(n) / 4) + (int64_t)(b) / 4) +                     \
     16 * ((int64_t)(t) % 32) + 4 * (((int64_t)(t) % 128) / 32) + (int64_t)(b) % 4)
#define BEAM_BLOCK_SCALE_BYTES(tokens, n) (((int64_t)(tokens) + 127) / 128 * 128 * (int64_t)(n))
#define BEAM_NVFP4_SCALE_OFFSET(t, b, hidden) BEAM_BLOCK_SCALE_OFFSET(t, b, (int64_t)(hidden) / 16)
#define BEAM_NVFP4_SCALE_BYTES(tokens, hidden) BEAM_BLOCK_SCALE_BYTES(tokens, (int64_t)(hidden) / 16)
#define BEAM_MXFP8_SCALE_OFFSET(t, b, hidden) BEAM_BLOCK_SCALE_OFFSET(t, b, (int64_t)(hidden) / 32)
#define BEAM_MXFP8_SCALE_BYTES(tokens, hidden) BEAM_BLOCK_SCALE_BYTES(tokens, (int64_t)(hidden) / 32)

/* norm_residual_norm with a quantized output of normalized: quant NULL is
 * the plain operation. With quant, next_norm is required and normalized may
 * be NULL (only the quantized form is written) or a [tokens, hidden] array
 * (both are written). */
typedef beam_status beam_norm_residual_norm_q_fn(
    const uint16_t *x, const uint16_t *residual,
    int64_t tokens, int32_t hidden,
    const beam_norm *pre_norm, const float *scales, const beam_norm *next_norm,
    uint16_t *hidden_out, uint16_t *normalized, const beam_quant *quant, void *stream);
BEAM_API beam_norm_residual_norm_q_fn beam_norm_residual_norm_q;

/* beam_moe_finalize_norm_residual_norm with a quantized output, as above. */
typedef beam_status beam_moe_finalize_norm_residual_norm_q_fn(
    const uint16_t *expert_outputs, const float *expert_weights,
    int64_t capacity, int64_t live_tokens, int32_t top_k, int32_t hidden,
    float routed_scale, const beam_norm *post_norm,
    const uint16_t *residual, const float *scales, const beam_norm *next_norm,
    uint16_t *hidden_out, uint16_t *normalized, const beam_quant *quant,
    beam_strategy strategy, void *stream);
BEAM_API beam_moe_finalize_norm_residual_norm_q_fn beam_moe_finalize_norm_residual_norm_q;

/* ---- tensor-parallel gather -------------------------------------------- */

typedef struct beam_workspace beam_workspace;

/* An in-process group of nranks ranks (threads), for the CPU backend. */
typedef struct beam_cpu_group beam_cpu_group;

/* Strategy thresholds and the timeout of a workspace.
 * AUTO picks ONESHOT for tokens <= oneshot_max_tokens, else TWOSHOT for
 * tokens <= twoshot_max_tokens, else UNFUSED. A rank that waits longer than
 * timeout_ms for its peers returns BEAM_ERR_COMM. */
typedef struct beam_workspace_config {
    int64_t oneshot_max_tokens;
    int64_t twoshot_max_tokens;
    int32_t timeout_ms;
} beam_workspace_config;

/* The defaults of the backend that runs the calls. */
BEAM_API beam_workspace_config beam_workspace_config_default(void);

/* Create / destroy a CPU group of nranks in [1, 256]. Destroy it only after
 * every workspace on it is destroyed. */
BEAM_API beam_status beam_cpu_group_create(int32_t nranks, beam_cpu_group **group);
BEAM_API beam_status beam_cpu_group_destroy(beam_cpu_group *group);

/* Collective: each of the group's ranks calls it once from its own thread.
 * cfg may be NULL (defaults). */
BEAM_API beam_status beam_workspace_create_cpu(
    beam_cpu_group *group, int32_t rank, int64_t max_tokens, int32_t hidden,
    const beam_workspace_config *cfg, beam_workspace **workspace);

/* Collective over an existing NCCL communicator (an ncclComm_t, passed as a
 * pointer); every rank calls it with the same max_tokens, hidden and cfg on
 * its own device, which must be current. CUDA backend only. */
BEAM_API beam_status beam_workspace_create_nccl(
    void *nccl_comm, int64_t max_tokens, int32_t hidden,
    const beam_workspace_config *cfg, beam_workspace **workspace);

/* Collective: every rank destroys its workspace. NULL is a no-op. */
BEAM_API beam_status beam_workspace_destroy(beam_workspace *workspace);

/* Rank and world size of a workspace. */
BEAM_API beam_status beam_workspace_info(const beam_workspace *workspace,
                                         int32_t *rank, int32_t *nranks);

/* The tensor-parallel finalize, gather, norm, residual, norm. Collective:
 * every rank calls it with the same tokens, top_k, hidden, scales, norms and
 * strategy. Rank r of R owns L = ceil(tokens / R) tokens, global rows
 * [r*L, min((r+1)*L, tokens)); its expert_outputs/expert_weights hold only
 * those rows (local row i = global row r*L + i; capacity >= L). residual,
 * hidden_out and normalized are the full replicated [tokens, hidden] arrays
 * on every rank, and every rank returns the same bits. */
typedef beam_status beam_moe_finalize_gather_norm_residual_norm_fn(
    beam_workspace *workspace,
    const uint16_t *expert_outputs, const float *expert_weights,
    int64_t capacity, int64_t tokens, int32_t top_k, int32_t hidden,
    float routed_scale, const beam_norm *post_norm,
    const uint16_t *residual, const float *scales, const beam_norm *next_norm,
    uint16_t *hidden_out, uint16_t *normalized,
    beam_strategy strategy, void *stream);
BEAM_API beam_moe_finalize_gather_norm_residual_norm_fn beam_moe_finalize_gather_norm_residual_norm;

/* The gather with a quantized output of normalized (beam_quant above):
 * quant NULL is the plain gather. With quant, next_norm is required and
 * normalized may be NULL (only the quantized form is written) or the
 * [tokens, hidden] array (both are written). Like normalized, values
 * ([tokens, hidden]) and scales (of all tokens; column-major: scale_ld >=
 * tokens) are the full replicated arrays on every rank, and every rank
 * returns the same bits. Collective: every rank passes a quant or none,
 * with the same kind, group_size, BEAM_QUANT_UE8M0 and scale; where its
 * scales lie (BEAM_QUANT_COL_MAJOR, scale_ld) and whether it keeps
 * normalized are each rank's own. */
typedef beam_status beam_moe_finalize_gather_norm_residual_norm_q_fn(
    beam_workspace *workspace,
    const uint16_t *expert_outputs, const float *expert_weights,
    int64_t capacity, int64_t tokens, int32_t top_k, int32_t hidden,
    float routed_scale, const beam_norm *post_norm,
    const uint16_t *residual, const float *scales, const beam_norm *next_norm,
    uint16_t *hidden_out, uint16_t *normalized, const beam_quant *quant,
    beam_strategy strategy, void *stream);
BEAM_API beam_moe_finalize_gather_norm_residual_norm_q_fn beam_moe_finalize_gather_norm_residual_norm_q;

/* ---- tensor-parallel all-reduce ------------------------------------------
 * The engines' layout: every rank holds a partial sum of every token, and
 * the layer ends with the sum over ranks, then the existing stages
 * (docs/numerics.md#all-reduce). On the gather's workspaces; tokens <=
 * max_tokens counts all tokens (every rank passes all of them). The sum
 * of token t, element h is bf16(((f(p0) + f(p1)) + ...) + f(pR-1)), in
 * rank order, each p the rank's BF16 partial; with one rank it is that
 * partial, so a group of one gives the local operation's bits. Collective:
 * every rank passes the same tokens, top_k, hidden, routed_scale, norms,
 * scales, quant form and strategy (AUTO, ONESHOT, TWOSHOT or UNFUSED);
 * residual, hidden_out, normalized and quant's arrays are [tokens, hidden]
 * on every rank, which all return the same bits. hidden_out may be the
 * residual buffer (in place). quant NULL: no quantized output (as
 * beam_norm_residual_norm_q). */

/* The dense layer's ending: reduced = the sum of the ranks' partial
 * [tokens, hidden], then beam_norm_residual_norm_q(reduced, residual, ...). */
typedef beam_status beam_allreduce_norm_residual_norm_fn(
    beam_workspace *workspace, const uint16_t *partial, int64_t tokens, int32_t hidden,
    const beam_norm *pre_norm, const uint16_t *residual, const float *scales,
    const beam_norm *next_norm, uint16_t *hidden_out, uint16_t *normalized,
    const beam_quant *quant, beam_strategy strategy, void *stream);
BEAM_API beam_allreduce_norm_residual_norm_fn beam_allreduce_norm_residual_norm;

/* The MoE layer's ending with experts sharded along their intermediate
 * dimension: each rank's expert_outputs [capacity >= tokens, top_k, hidden]
 * are partial sums of every token's slots, and its partial is the finalize
 * of its slots without the post-norm (bf16(sum) times routed_scale,
 * rounded); the post-norm applies to the reduced sum, then residual, scales
 * and next norm as beam_moe_finalize_norm_residual_norm_q. */
typedef beam_status beam_moe_finalize_allreduce_norm_residual_norm_fn(
    beam_workspace *workspace, const uint16_t *expert_outputs, const float *expert_weights,
    int64_t capacity, int64_t tokens, int32_t top_k, int32_t hidden, float routed_scale,
    const beam_norm *post_norm, const uint16_t *residual, const float *scales,
    const beam_norm *next_norm, uint16_t *hidden_out, uint16_t *normalized,
    const beam_quant *quant, beam_strategy strategy, void *stream);
BEAM_API beam_moe_finalize_allreduce_norm_residual_norm_fn beam_moe_finalize_allreduce_norm_residual_norm;

/* What the ranks of a gather must pass alike, as BEAM_AGREEMENT_WORDS words:
 * the same words exactly when two ranks' tokens, top_k, hidden, routed_scale,
 * norms (present, weight given, eps), scales and quant (kind, group_size,
 * BEAM_QUANT_UE8M0, scale) are the same, with the strategy asked for. The
 * library's own groups compare these words; a gather built over another
 * transport (the Python package's process groups) exchanges them. It
 * checks quant as the gather does (quant needs next_norm), and words !=
 * NULL; the call itself checks the rest. Any library serves it, the
 * dispatcher with or without a backend. */
#define BEAM_AGREEMENT_WORDS 9
BEAM_API beam_status beam_gather_agreement(int64_t tokens, int32_t top_k, int32_t hidden, float routed_scale,
                                           const beam_norm *post_norm, const float *scales,
                                           const beam_norm *next_norm, const beam_quant *quant,
                                           beam_strategy strategy, uint64_t *words);

/* Word i's argument name ("tokens", "routed_scale", ..., "quant"; NULL for i
 * outside [0, BEAM_AGREEMENT_WORDS)), and in text (size >= 1) the value a
 * word stands for, as a message shows it ("6", "0.5", "eps 1e-06 with
 * weight", "ONESHOT", "BEAM_QUANT_FP8_GROUP group_size 128"). */
BEAM_API const char *beam_gather_agreement_text(int32_t i, uint64_t word, char *text, size_t size);

/* ---- a backend's table -------------------------------------------------- */

/* Every operation of one backend, for a program that drives several
 * backends at once (the audit, the tests) or loads them itself: each
 * backend library (libbeammoe_cpu, libbeammoe_cuda) exports one entry point,
 * beam_backend_ops, that returns its table. Members are that library's
 * beam_* functions: a workspace or group made through one table is used
 * through the same table, and its failures are read with its last_error.
 * The table only grows: a new member goes at the end, and BEAM_OPS_VERSION
 * counts the layouts (version 2 added the three *_q members: the
 * quantized output of the two local operations and of the gather; 3 the
 * two all-reduces); a
 * library serves every version up to its own, whose members are a prefix
 * of its table. */
#define BEAM_OPS_VERSION 3

typedef struct beam_ops {
    uint32_t version;  /* BEAM_OPS_VERSION of the library that made it */
    uint32_t size;     /* sizeof(beam_ops) there */
    const char *name;  /* "cpu", "cuda" */
    int32_t device_memory; /* 1: the arrays of a call are device memory */
    const char *(*last_error)(void);
    beam_moe_finalize_fn *moe_finalize;
    beam_norm_residual_norm_fn *norm_residual_norm;
    beam_moe_finalize_norm_residual_norm_fn *moe_finalize_norm_residual_norm;
    beam_workspace_config (*workspace_config_default)(void);
    beam_status (*cpu_group_create)(int32_t nranks, beam_cpu_group **group);
    beam_status (*cpu_group_destroy)(beam_cpu_group *group);
    beam_status (*workspace_create_cpu)(beam_cpu_group *group, int32_t rank, int64_t max_tokens,
                                        int32_t hidden, const beam_workspace_config *cfg,
                                        beam_workspace **workspace);
    beam_status (*workspace_create_nccl)(void *nccl_comm, int64_t max_tokens, int32_t hidden,
                                         const beam_workspace_config *cfg, beam_workspace **workspace);
    beam_status (*workspace_destroy)(beam_workspace *workspace);
    beam_status (*workspace_info)(const beam_workspace *workspace, int32_t *rank, int32_t *nranks);
    beam_moe_finalize_gather_norm_residual_norm_fn *moe_finalize_gather_norm_residual_norm;
    /* version >= 2 */
    beam_norm_residual_norm_q_fn *norm_residual_norm_q;
    beam_moe_finalize_norm_residual_norm_q_fn *moe_finalize_norm_residual_norm_q;
    beam_moe_finalize_gather_norm_residual_norm_q_fn *moe_finalize_gather_norm_residual_norm_q;
    /* version >= 3 */
    beam_allreduce_norm_residual_norm_fn *allreduce_norm_residual_norm;
    beam_moe_finalize_allreduce_norm_residual_norm_fn *moe_finalize_allreduce_norm_residual_norm;
} beam_ops;

/* The table of backend `name` ("cpu", "cuda"; NULL: the backend that runs
 * the calls now), for a caller built with `version` (BEAM_OPS_VERSION).
 * libbeammoe loads the named backend's library and returns that library's
 * own table; a backend library returns its own for its own name (or NULL).
 * NULL when the backend is unknown, cannot load or cannot run here (CUDA
 * with no device), or when version is not one this library serves (0, or
 * above its BEAM_OPS_VERSION); then beam_last_error() says which. */
BEAM_API const beam_ops *beam_backend_ops(const char *name, uint32_t version);

#ifdef __cplusplus
}
#endif

#endif /* BEAMMOE_H */
