/*
 * fp8.h - the FP8 E4M3 conversion and the scales of the quantized
 * `normalized` output, as docs/numerics.md ("The FP8 output") defines them
 * (CPU, internal).
 *
 * E4M3 here is the "fn" format of torch.float8_e4m3fn and __nv_fp8_e4m3:
 * 1 sign, 4 exponent (bias 7) and 3 mantissa bits, no infinities, NaN
 * 0x7F / 0xFF, largest finite value 448 (0x7E). The definitions (the
 * conversion, the clamp, the scales) are lib/quant_bits.h's, which the GPU
 * shares; here the CPU's own forms: the branch-free conversion that
 * cpu/quant.c's loops vectorize and the largest magnitude of BF16 values.
 */
#ifndef BEAMMOE_CPU_FP8_H
#define BEAMMOE_CPU_FP8_H

#include <stdint.h>

#include "bf16.h"
#include "quant_bits.h"

/* The value of an E4M3 code (NaN for 0x7F / 0xFF), exact. */
static inline float bm_e4m3_value(uint8_t c)
{
    const float v = bm_nvfp4_scale_value(c & 0x7Fu);
    if ((c & 0x7Fu) == 0x7Fu) return bm_fp8_float(0x7FC00000u);
    return (c & 0x80u) ? -v : v;
}

/* The largest magnitude of the BF16 values y[0..n), as fabsf and fmaxf from
 * +0.0 give it (a NaN is skipped; +0.0 when every value is a zero or a
 * NaN), as an integer maximum that vectorizes: the magnitudes of BF16
 * values order as their bits without the sign, and a NaN (bits above
 * 0x7F80) counts as -1. Signed 16-bit lanes: SSE2 has their maximum. (GCC
 * 12 for aarch64 fails with an internal error when it vectorizes the
 * fmaxf reduction.) */
static inline float bm_fp8_absmax_bf16(const uint16_t *y, int n)
{
    int16_t m = 0;
    int i;
    for (i = 0; i < n; i++) {
        const int16_t b = (int16_t)(y[i] & 0x7FFFu);
        const int16_t v = b <= 0x7F80 ? b : -1;
        m = v > m ? v : m;
    }
    return bm_f((uint16_t)m);
}

/* The same without branches, for loops that the compiler vectorizes
 * (cpu/quant.c): masks on the FP32 bits and exact float operations only (so
 * the rounding mode does not matter either), and the codes equal the
 * definitions (lib/quant_bits.h) bit for bit (tests/test_fp8.c checks every FP32
 * value). Masks, not ternaries: GCC sinks the float
 * operations of a select into a branch, where they may trap, and then does
 * not if-convert (vectorize) the loop. Signed comparisons (a < 2^31) and no
 * min or max: SSE2 has neither unsigned 32-bit comparisons nor a 32-bit
 * min. The code is assembled in bits 24..31 and shifted down once: a code
 * assembled in the low byte lets GCC narrow each part to bytes on its own
 * (a pack per part). */

/* The code of v, for every v whose bits u are not a NaN's, and with a NaN's
 * bits some code; a = u & 0x7FFFFFFF, sign the sign bit (0x80000000 or 0):
 *  normal (2^-6 <= |v| < 448): the exponent field (e + 7) beside the top 3
 *  mantissa bits is (a >> 20) - (120 << 3), i.e. (a - 0x3C000000) >> 20;
 *  adding 0x7FFFF and the kept last bit before the shift rounds to nearest,
 *  ties to even (a rest above half carries; exactly half carries when the
 *  last bit is 1; a carry out of the mantissa moves into the exponent).
 *  Shifted left by 4, not right by 20: bits 24..31 hold the code.
 *  subnormal (|v| < 2^-6): bm_e4m3 rounds t = |v| * 512 < 8 to an integer,
 *  ties to even; here f = |v| * 2^33 = t * 2^24 (exact: a power of two;
 *  below 2^27) as an integer by truncation, rounded by the same carry into
 *  bit 24. For t >= 1/2, t's last bit is worth at least 2^-24, so f is
 *  exactly t * 2^24; below 1/2, f < 2^23 truncated or not, so both give 0.
 *  Outside this range |v| is replaced by 0 (so the conversion never
 *  overflows), whose bits 24..31 are 0.
 *  saturated (|v| >= 448): 0x7E, as in bm_e4m3.
 * Bits 0..23 of the parts are left as they come: the final shift drops
 * them. */
static inline uint32_t bm_e4m3_sel_bits(uint32_t a, uint32_t sign)
{
    const uint32_t sub = 0u - (uint32_t)((int32_t)a < 0x3C800000);  /* |v| < 2^-6 */
    const uint32_t sat = 0u - (uint32_t)((int32_t)a >= 0x43E00000); /* |v| >= 448 */
    /* wraps below 2^-6: not taken */
    const uint32_t qn = (a + (0x7FFFFu - 0x3C000000u) + ((a >> 20) & 1u)) << 4;
    const uint32_t f = (uint32_t)(int32_t)(bm_fp8_float(a & sub) * 8589934592.0f); /* |v| * 2^33 */
    const uint32_t qs = f + 0x7FFFFFu + ((f >> 24) & 1u); /* bits 24..31: 0 unless sub */
    return (sign | qs | (0x7E000000u & sat) | (qn & ~(sub | sat))) >> 24;
}

/* bm_e4m3(v) for every v that is not a NaN. */
static inline uint8_t bm_e4m3_sel(float v)
{
    const uint32_t u = bm_fp8_bits(v);
    return (uint8_t)bm_e4m3_sel_bits(u & 0x7FFFFFFFu, u & 0x80000000u);
}

/* bm_e4m3(bm_fp8_clamp(v)) in 32 bits, for every v but a signaling NaN:
 * the clamp is the saturation (+-448 and beyond give 0x7E with v's sign;
 * -0.0 stays 0x80), and a quiet NaN, which fmaxf(v, -448) makes -448,
 * saturates with the sign forced: 0xFE. (fmaxf of a signaling NaN is a
 * NaN in glibc, so bm_fp8_clamp then gives +448; a division, as in
 * bm_fp8_quant_sel, never returns one.) */
static inline uint32_t bm_e4m3_clamp_sel32(float v)
{
    const uint32_t u = bm_fp8_bits(v);
    const uint32_t a = u & 0x7FFFFFFFu;
    /* 0x7F800000 - a wraps (sets bit 31) exactly for a NaN; arithmetic, not
     * a comparison: GCC turns a mask here into a select that computes v
     * (the division) a second time */
    return bm_e4m3_sel_bits(a, (u | (0x7F800000u - a)) & 0x80000000u);
}

static inline uint8_t bm_e4m3_clamp_sel(float v)
{
    return (uint8_t)bm_e4m3_clamp_sel32(v);
}

/* bm_fp8_quant(x, s), branch-free: the same correctly rounded division; in
 * 32 bits (narrow at the store). */
static inline uint32_t bm_fp8_quant_sel(float x, float s)
{
    return bm_e4m3_clamp_sel32(x / s);
}

#endif
