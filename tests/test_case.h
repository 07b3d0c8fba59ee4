/*
 * test_case.h - one random problem, run through the naive reference and
 * through the library, compared bit for bit (shared by the numerics, thread
 * and golden tests).
 *
 * A case owns every input of the three local operations: expert results and
 * weights with `pad` NaN/infinity rows past the live ones, x and residual,
 * the norm weights, scales and routed_scale. The library's outputs get
 * TC_GUARD poisoned rows past the live ones that must come back untouched.
 */
#ifndef BEAMMOE_TESTS_TEST_CASE_H
#define BEAMMOE_TESTS_TEST_CASE_H

#include "test_util.h"

#define TC_GUARD 2

/* norm choice of a case */
enum { TC_NORM_OFF = 0, TC_NORM_PLAIN = 1, TC_NORM_WEIGHT = 2 };

typedef struct tc_spec {
    int32_t K, H;
    int64_t T;   /* live rows */
    int64_t pad; /* NaN rows past them: capacity = T + pad */
    int post, pre, next; /* TC_NORM_* */
    int scales;          /* pass scales (else NULL) */
    int rs_one;          /* routed_scale 1 (else a random scale) */
    int inplace;         /* hidden_out == residual */
    int misalign;        /* bases 2 (BF16) / 4 (FP32) bytes off 16 */
    int exotic;          /* sprinkle subnormals, infinities, NaNs, zeros */
} tc_spec;

typedef struct tc_data {
    tc_spec s;
    int64_t cap;
    uint16_t *experts; /* [cap, K, H] */
    float *weights;    /* [cap, K] */
    uint16_t *x;       /* [T, H] */
    uint16_t *residual;/* [T, H] */
    uint16_t *wpost, *wpre, *wnext; /* [H] or NULL */
    float scales[2];
    float rs;
    nr_norm post, pre, next;
} tc_data;

typedef enum tc_op { TC_FINALIZE, TC_NRN, TC_FUSED } tc_op;

/* Build a case from its spec; the same (spec, seed) gives the same bits. */
void tc_make(tc_data *d, const tc_spec *s, uint64_t seed);
void tc_free(tc_data *d);

/* Reference outputs: hidden [T, H] (finalize: its output), normalized
 * [T, H] (only when the op has a next norm). */
void tc_ref(const tc_data *d, tc_op op, uint16_t *hidden, uint16_t *normalized);

/* Run the library; hidden/normalized receive its outputs [T, H] (copied
 * out of guarded, possibly misaligned buffers). *guard_ok is 0 when a byte
 * past the live rows (or normalized without a next norm) was written. */
beam_status tc_lib(const tc_data *d, tc_op op, beam_strategy strategy,
                   uint16_t *hidden, uint16_t *normalized, int *guard_ok);

/* 1 when op writes normalized */
int tc_has_normalized(const tc_data *d, tc_op op);

/* One-line description of a case for failure messages. */
void tc_describe(const tc_spec *s, char *buf, size_t n);

#endif
