/*
 * naive_ref.h - a deliberately naive scalar model of docs/numerics.md: the
 * one reference of the test suite, `beammoe audit` and the benches' checks.
 *
 * Written from that text alone and sharing no code with lib/ or cpu/, so
 * that a misreading of the numerics in the library cannot hide in its own
 * test.
 * Everything is a plain loop over one element at a time; it is slow on
 * purpose. Compile with -std=c99 -ffp-contract=off (no FMA contraction).
 *
 * BF16 travels as uint16_t bits, exactly like the public API.
 */
#ifndef BEAMMOE_HARNESS_NAIVE_REF_H
#define BEAMMOE_HARNESS_NAIVE_REF_H

#include <stdint.h>

/* An optional RMSNorm: on = 0 means "no norm"; weight NULL = no affine. */
typedef struct nr_norm {
    int on;
    const uint16_t *weight;
    float eps;
} nr_norm;

/* bf16(v): FP32 -> BF16 round to nearest even; every NaN becomes 0x7FFF. */
uint16_t nr_bf16(float v);
/* When not NULL, nr_bf16 adds 1 here for each rounding that is an exact tie
 * (low 16 bits 0x8000): `beammoe audit` shows that its tie inputs really
 * exercise nearest-even. Not thread-safe; NULL (the default) counts nothing. */
extern int64_t *nr_ties;
/* f(b): BF16 -> FP32, exact. */
float nr_f(uint16_t b);

/* finalize over rows 0..live-1 of x[.., K, H] / wts[.., K] -> out[live, H]. */
void nr_finalize(const uint16_t *x, const float *wts, int64_t live, int32_t K,
                 int32_t H, float routed_scale, const nr_norm *post,
                 uint16_t *out);

/* norm_residual_norm over T rows. hidden may equal residual (in place);
 * normalized is written only when next->on. scales NULL = no scaling. */
void nr_norm_residual_norm(const uint16_t *x, const uint16_t *residual,
                           int64_t T, int32_t H, const nr_norm *pre,
                           const float *scales, const nr_norm *next,
                           uint16_t *hidden, uint16_t *normalized);

/* finalize then norm_residual_norm (no pre-norm), row by row. */
void nr_finalize_norm_residual_norm(const uint16_t *x, const float *wts,
                                    int64_t live, int32_t K, int32_t H,
                                    float routed_scale, const nr_norm *post,
                                    const uint16_t *residual,
                                    const float *scales, const nr_norm *next,
                                    uint16_t *hidden, uint16_t *normalized);

/* The gather (docs/numerics.md#gather) for the whole T: rank r of R owns rows
 * [r*L, min((r+1)*L, T)), L = ceil(T/R); its local row i (global r*L + i)
 * lives at rank_x[r] + i*K*H and rank_w[r] + i*K. The result is the
 * replicated hidden[T, H] / normalized[T, H] every rank must return. */
void nr_gather(const uint16_t *const *rank_x, const float *const *rank_w,
               int32_t R, int64_t T, int32_t K, int32_t H, float routed_scale,
               const nr_norm *post, const uint16_t *residual,
               const float *scales, const nr_norm *next, uint16_t *hidden,
               uint16_t *normalized);

/* The all-reduce (docs/numerics.md#all-reduce) of R ranks over T tokens:
 * each rank's partial of row t is rank_p[r][t*H..] (the dense form), or
 * with rank_p NULL the finalize of its slots rank_x[r][t*K*H..] with the
 * one weights[t*K..] and no post-norm; the sum over ranks in rank order
 * from rank 0's value, rounded once; then norm_residual_norm with `norm`
 * as its pre-norm. hidden / normalized [T, H] as nr_norm_residual_norm. */
void nr_allreduce(const uint16_t *const *rank_p, const uint16_t *const *rank_x,
                  const float *weights, int32_t R, int64_t T, int32_t K,
                  int32_t H, float routed_scale, const nr_norm *norm,
                  const uint16_t *residual, const float *scales,
                  const nr_norm *next, uint16_t *hidden,
                  uint16_t *normalized);

#endif
