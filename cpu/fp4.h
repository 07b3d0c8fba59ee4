/*
 * fp4.h - the NVFP4 output of normalized (docs/numerics.md#nvfp4) on the
 * CPU: the E2M1 conversion and the block scale (internal).
 *
 * E2M1: sign (bit 3), 2 exponent bits, 1 mantissa bit, the magnitudes 0,
 * 0.5, 1, 1.5, 2, 3, 4, 6 as codes 0..7; no infinities, no NaN. The
 * conversion, the scale's value and the blocks' factor are
 * lib/quant_bits.h's (branch-free in C, so that cpu/quant.c's loops
 * vectorize), which the GPU shares; here the scale's code, by the CPU's
 * branch-free E4M3 conversion.
 */
#ifndef BEAMMOE_CPU_FP4_H
#define BEAMMOE_CPU_FP4_H

#include <stdint.h>

#include "fp8.h"

/* The E4M3 code of a block's scale from its largest magnitude m (not a
 * NaN) and the global scale g (0 < g < 2^118): e4m3(min(g * (m * RN(1/6)),
 * 448)), each product rounded to FP32; never negative, never a NaN. */
static inline uint8_t bm_nvfp4_scale_code(float m, float g)
{
    /* bm_e4m3_sel saturates at 448 (an infinite sv too) and equals bm_e4m3
     * for every value but a NaN, which sv is not: no branches, so that the
     * loop over a row's blocks vectorizes */
    return bm_e4m3_sel(bm_nvfp4_scale_arg(m, g));
}

#endif
