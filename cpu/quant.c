/*
 * quant.c - the quantized output of normalized on the CPU: the ground truth
 * of docs/numerics.md#fp8, one row at a time from the row's BF16
 * normalized values (so it equals quantizing the BF16 output afterwards).
 */
#include <math.h>
#include <stdint.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "bf16.h"
#include "fp8.h"
#include "ops.h"

/* The scale of one group (GROUP, TOKEN) from its values y[0..n). */
static float bm_quant_scale(const bm_quant *q, const uint16_t *y, int n)
{
    float absmax = 0.0f, s;
    int i;
    /* fmaxf(absmax, |y|), written as a comparison: a NaN is never greater,
     * so it is skipped as fmaxf skips it (and GCC 12 for aarch64 fails
     * with an internal error when it vectorizes the fmaxf reduction) */
    for (i = 0; i < n; i++) {
        const float a = fabsf(bm_f(y[i]));
        if (a > absmax) absmax = a;
    }
    if (q->kind == BEAM_QUANT_FP8_GROUP) return bm_fp8_group_scale(absmax, BM_FP8_GROUP_EPS, q->ue8m0);
    s = bm_fp8_token_scale(absmax);
    return q->ue8m0 ? bm_pow2_ceil(s) : s;
}

/* Token t's row y of normalized into values and scales. */
static void bm_quant_row(const bm_quant *q, const uint16_t *y, int64_t t, int32_t hidden)
{
    uint8_t *out = q->values + (size_t)t * (size_t)hidden;
    const int n = q->group;
    int g, i;
    for (g = 0; g < hidden / n; g++) {
        const uint16_t *yg = y + (size_t)g * n;
        const float s = q->kind == BEAM_QUANT_FP8_TENSOR ? q->scale : bm_quant_scale(q, yg, n);
        if (q->kind != BEAM_QUANT_FP8_TENSOR) q->scales[t * q->ld_t + g * q->ld_g] = s;
        for (i = 0; i < n; i++)
            out[(size_t)g * n + i] = bm_fp8_quant(bm_f(yg[i]), s);
    }
}

void bm_cpu_quant_rows(const bm_args *a, const uint16_t *normalized)
{
    const int64_t T = a->tokens;
    const int32_t H = a->hidden;
    int64_t t;
    /* each row by one thread: the bits do not depend on the schedule */
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (T * (int64_t)H >= ((int64_t)1 << 20))
#endif
    for (t = 0; t < T; t++)
        bm_quant_row(&a->q, normalized + (size_t)t * (size_t)H, t, H);
}
