/*
 * fp4.h - the NVFP4 output of normalized (docs/numerics.md#nvfp4) on the
 * CPU: the E2M1 conversion and the block scale (internal).
 *
 * E2M1: sign (bit 3), 2 exponent bits, 1 mantissa bit, the magnitudes 0,
 * 0.5, 1, 1.5, 2, 3, 4, 6 as codes 0..7; no infinities, no NaN. Integer
 * operations on the FP32 bits, branch-free so that cpu/quant.c's loops
 * vectorize; gpu/quant.cuh runs the same formula.
 */
#ifndef BEAMMOE_CPU_FP4_H
#define BEAMMOE_CPU_FP4_H

#include <stdint.h>

#include "fp8.h"

/* RN(1 / 6): the block's largest magnitude over E2M1's largest, 6 */
#define BM_FP4_RCP6 0x1.555556p-3f

/* e2m1(p): the magnitude code is how many of the seven rounding boundaries
 * 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 |p| passes, where a boundary whose
 * code below is even is passed above it and one whose code below is odd is
 * passed at it: nearest, ties to the even code; beyond 5 (infinity too)
 * saturates to 6. Positive floats order as their bits, so the comparisons
 * are on integers (signed: |p| < 2^31). A NaN's bits pass every boundary:
 * 0x7 (+6), its sign bit dropped (backends give NaNs different signs). A
 * zero, or a value that rounds to one, keeps its sign. */
static inline uint32_t bm_e2m1_bits(uint32_t u)
{
    const int32_t a = (int32_t)(u & 0x7FFFFFFFu);
    const uint32_t mag = (uint32_t)(a > 0x3E800000) + (uint32_t)(a >= 0x3F400000) +
                         (uint32_t)(a > 0x3FA00000) + (uint32_t)(a >= 0x3FE00000) +
                         (uint32_t)(a > 0x40200000) + (uint32_t)(a >= 0x40600000) +
                         (uint32_t)(a > 0x40A00000);
    const uint32_t nan = (uint32_t)(a > 0x7F800000);
    return mag | ((u >> 28) & 8u & (nan - 1u));
}

static inline uint32_t bm_e2m1(float p)
{
    return bm_e2m1_bits(bm_fp8_bits(p));
}

/* The E4M3 code of a block's scale from its largest magnitude m (not a
 * NaN) and the global scale g (0 < g < 2^118): e4m3(min(g * (m * RN(1/6)),
 * 448)), each product rounded to FP32; never negative, never a NaN. */
static inline uint8_t bm_nvfp4_scale_code(float m, float g)
{
    /* bm_e4m3_sel saturates at 448 (an infinite sv too) and equals bm_e4m3
     * for every value but a NaN, which sv is not: no branches, so that the
     * loop over a row's blocks vectorizes */
    return bm_e4m3_sel(g * (m * BM_FP4_RCP6));
}

/* The value of a scale code (non-negative, not a NaN), exact, from its
 * bits: a normal code's exponent and mantissa moved into an FP32's, a
 * subnormal one m * 2^-9 (bm_e4m3_value's ldexpf is a library call, once
 * per 16 values here) */
static inline float bm_nvfp4_scale_value(uint8_t sf)
{
    const uint32_t e = (uint32_t)sf >> 3, m = sf & 7u;
    const uint32_t normal = 0u - (uint32_t)(e != 0);
    const uint32_t sub = bm_fp8_bits((float)m * 0x1p-9f); /* exact */
    return bm_fp8_float(((((e + 120u) << 23) | (m << 20)) & normal) | (sub & ~normal));
}

/* The factor of a block's values, os = g * (1 / value(sf)), each operation
 * rounded to FP32; +0 when sf is 0. Masks, no branch (as cpu/fp8.h's
 * select forms): a zero code divides by 1 instead and its result is
 * masked to +0. */
static inline float bm_nvfp4_factor(uint8_t sf, float g)
{
    const uint32_t nz = 0u - (uint32_t)(sf != 0);
    const float os = g * (1.0f / bm_nvfp4_scale_value((uint8_t)(sf | (~nz & 0x38u)))); /* 0x38: 1.0 */
    return bm_fp8_float(bm_fp8_bits(os) & nz);
}

#endif
