/*
 * problem.h - one call of a local operation: its inputs (generated from a
 * seed), its output buffers, and running it on the host or on a device.
 *
 * Shared by `audit` and `run`. Inputs have `capacity` rows; rows past
 * `tokens` are filled with NaN so a backend that reads them is caught.
 * Outputs have OUT_GUARD_ROWS extra rows (and unused outputs stay
 * allocated) filled with OUT_SENTINEL before the call, so a backend that
 * writes past the live rows, or writes `normalized` without a next norm,
 * shows up as a mismatch against the reference (which never writes there).
 */
#ifndef BEAMMOE_TOOLS_PROBLEM_H
#define BEAMMOE_TOOLS_PROBLEM_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

#define OUT_GUARD_ROWS 1
#define OUT_SENTINEL ((uint16_t)0xFFC1) /* a NaN the library never writes */
#define IN_PAD_NAN ((uint16_t)0x7FC1)

typedef enum tool_op { OP_FINALIZE = 0, OP_NRN = 1, OP_FUSED = 2 } tool_op;

/* Input generators (SPEC.md section 2 corner cases). */
typedef enum tool_gen {
    GEN_NORMAL = 0, /* moderate random values                          */
    GEN_NAN,        /* a few NaNs (several payloads) in every kind of input */
    GEN_INF,        /* +-inf, and zero weights so inf * 0 = NaN happens */
    GEN_ZERO,       /* signed zeros everywhere: all-zero rows for the norm */
    GEN_SUBNORMAL,  /* BF16 subnormals, FP32-subnormal products           */
    GEN_TIES,       /* powers of two: sums land on BF16 rounding ties   */
    GEN_HUGE,       /* near BF16 max: sums and squares overflow          */
    GEN_MIXED,      /* each row picks one of the above                  */
    GEN_COUNT
} tool_gen;

const char *gen_name(tool_gen g);
const char *op_name(tool_op op);

/* Option bits of a problem. */
enum {
    OPT_POST = 1 << 0,
    OPT_POST_W = 1 << 1, /* affine weight of the post norm */
    OPT_PRE = 1 << 2,
    OPT_PRE_W = 1 << 3,
    OPT_NEXT = 1 << 4,
    OPT_NEXT_W = 1 << 5,
    OPT_SCALES = 1 << 6
};

typedef struct problem {
    tool_op op;
    int64_t tokens, capacity;
    int32_t top_k, hidden;
    unsigned opts;
    float routed_scale;
    float scales[2];
    float eps;
    /* eps of the post and next norms: problem_make sets both to eps; a
     * safetensors file (audit --input) gives them separately */
    float post_eps, next_eps;
    /* host inputs, capacity rows each (NULL where the op has none) */
    uint16_t *experts; /* [capacity, top_k, hidden] */
    float *weights;    /* [capacity, top_k]         */
    uint16_t *x;       /* [capacity, hidden]        */
    uint16_t *residual;
    uint16_t *post_w, *pre_w, *next_w; /* [hidden] */
} problem;

/* Output buffers: rows = tokens + OUT_GUARD_ROWS. finalize uses out;
 * nrn and fused use hidden_out and normalized. */
typedef struct outputs {
    int64_t rows;
    int32_t hidden;
    uint16_t *out, *hidden_out, *normalized;
} outputs;

/* Allocate and fill the inputs; 0 on success, -1 when out of memory. */
int problem_make(problem *p, tool_op op, int64_t tokens, int64_t capacity, int32_t top_k,
                 int32_t hidden, unsigned opts, float routed_scale, const float scales[2],
                 float eps, tool_gen gen, uint64_t seed);
void problem_free(problem *p);

/* The norms of a problem as API structs (NULL when off). */
const beam_norm *problem_norm(const problem *p, unsigned on_bit, beam_norm *storage,
                              const uint16_t *weight_ptr, unsigned w_bit);

int outputs_make(outputs *o, const problem *p);
void outputs_reset(outputs *o); /* every element := OUT_SENTINEL */
void outputs_free(outputs *o);
/* Compare all buffers of the op (guard rows included) into c. */
void outputs_compare(const outputs *got, const outputs *want, const problem *p, cmp_result *c);
uint64_t outputs_checksum(const outputs *o, const problem *p); /* live rows only */

/* The scalar reference (tools/reference.c) into o (after outputs_reset). */
void problem_reference(const problem *p, outputs *o);

/* A problem bound to the memory of a backend: host pointers as they are, or
 * device copies for CUDA. */
typedef struct bound {
    const problem *p;
    outputs *o;
    int on_device;
    int inplace; /* hidden_out is the residual buffer */
    const uint16_t *experts, *x, *residual;
    const float *weights;
    beam_norm post, pre, next;
    const beam_norm *post_p, *pre_p, *next_p;
    uint16_t *out, *hidden_out, *normalized;
    void *dev[12];
    int ndev;
} bound;

/* 0 on success; on failure -1 and a message in err. Resets o first. */
int bound_make(bound *b, const problem *p, outputs *o, int on_device, int inplace, char *err,
               size_t errn);
/* One call of the problem's operation (strategy used by OP_FUSED only). */
beam_status bound_call(const bound *b, beam_strategy strategy);
/* Device: wait for the work and copy outputs back. 0 on success. */
int bound_finish(bound *b, char *err, size_t errn);
void bound_free(bound *b);

#endif
