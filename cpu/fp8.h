/*
 * fp8.h - the FP8 E4M3 conversion and the scales of the quantized
 * `normalized` output, as docs/numerics.md ("The FP8 output") defines them
 * (CPU, internal).
 *
 * E4M3 here is the "fn" format of torch.float8_e4m3fn and __nv_fp8_e4m3:
 * 1 sign, 4 exponent (bias 7) and 3 mantissa bits, no infinities, NaN
 * 0x7F / 0xFF, largest finite value 448 (0x7E). Integer operations on the
 * FP32 bits, so that the result never depends on the rounding mode or on
 * how the compiler contracts float expressions.
 */
#ifndef BEAMMOE_CPU_FP8_H
#define BEAMMOE_CPU_FP8_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"

#define BM_FP8_MAX 448.0f
/* The floor of a group's largest magnitude (vLLM's eps default) */
#define BM_FP8_GROUP_EPS 1e-10f

static inline uint32_t bm_fp8_bits(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

static inline float bm_fp8_float(uint32_t u)
{
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* e4m3(v): the nearest E4M3 value, ties to even. |v| >= 448 gives +-448
 * (saturation: the callers clamp first, so this only matters for values
 * that round to 448 from below); NaN gives 0x7F with v's sign. */
static inline uint8_t bm_e4m3(float v)
{
    const uint32_t u = bm_fp8_bits(v);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    const uint32_t a = u & 0x7FFFFFFFu;
    uint32_t q, rest, half;
    if (a > 0x7F800000u) return (uint8_t)(sign | 0x7Fu);
    if (a >= 0x43E00000u) return (uint8_t)(sign | 0x7Eu); /* >= 448 */
    if (a < 0x3C800000u) {
        /* below 2^-6, the smallest normal: E4M3 steps of 2^-9 (the
         * subnormals; 8 steps is 2^-6, whose code 0x08 follows on) */
        const float t = bm_fp8_float(a) * 512.0f; /* exact: a power of two */
        const uint32_t i = (uint32_t)t;          /* t < 8 */
        const float frac = t - (float)i;         /* exact */
        q = i + (frac > 0.5f || (frac == 0.5f && (i & 1u)));
        return (uint8_t)(sign | q);
    }
    /* normal: exponent field (e + 7) beside the top 3 of the 23 mantissa
     * bits; the 20 bits below round the 3 to nearest, ties to even (a
     * carry out of the mantissa moves into the exponent, which is right) */
    q = ((((a >> 23) - 127u + 7u) << 3) | ((a >> 20) & 7u));
    rest = a & 0xFFFFFu;
    half = 0x80000u;
    q += rest > half || (rest == half && (q & 1u));
    return (uint8_t)(sign | q);
}

/* The value of an E4M3 code (NaN for 0x7F / 0xFF), exact. */
static inline float bm_e4m3_value(uint8_t c)
{
    const uint32_t e = (c >> 3) & 15u, m = c & 7u;
    float v;
    if ((c & 0x7Fu) == 0x7Fu) return bm_fp8_float(0x7FC00000u);
    v = e ? ldexpf((float)(8u + m), (int)e - 10) : ldexpf((float)m, -9);
    return (c & 0x80u) ? -v : v;
}

/* The clamp before the conversion, in vLLM's order for the group kernel:
 * fminf(fmaxf(v, -448), 448), so a NaN becomes -448. */
static inline float bm_fp8_clamp(float v)
{
    return fminf(fmaxf(v, -BM_FP8_MAX), BM_FP8_MAX);
}

/* The smallest power of two >= s, for a finite s > 0 (UE8M0 scales);
 * infinity stays infinity. Exact, where vLLM's exp2f(ceilf(log2f(s)))
 * depends on the accuracy of log2f next to powers of two. */
static inline float bm_pow2_ceil(float s)
{
    uint32_t u = bm_fp8_bits(s);
    if (u >= 0x7F800000u) return s;
    if (u < 0x00800000u) return ldexpf(1.0f, -126); /* a subnormal s: the first normal power */
    if (u & 0x7FFFFFu) u = (u & 0xFF800000u) + 0x00800000u;
    return bm_fp8_float(u);
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

/* The scale of a group (or of a token) from its largest magnitude:
 * s = max(absmax, floor) / 448 in FP32 (correctly rounded); with ue8m0, the
 * smallest power of two >= max(s, 1e-10). floor: eps of the group form
 * (vLLM starts the group's maximum at eps); the per-token form takes
 * max(absmax / 448, 1 / (448 * 512)) instead (bm_fp8_token_scale). */
static inline float bm_fp8_group_scale(float absmax, float eps, int ue8m0)
{
    float s = fmaxf(absmax, eps) / BM_FP8_MAX;
    if (ue8m0) s = bm_pow2_ceil(fmaxf(fabsf(s), 1e-10f));
    return s;
}

static inline float bm_fp8_token_scale(float absmax)
{
    return fmaxf(absmax / BM_FP8_MAX, 1.0f / (BM_FP8_MAX * 512.0f));
}

/* One element: e4m3(clamp(x / s)), FP32 division correctly rounded. */
static inline uint8_t bm_fp8_quant(float x, float s)
{
    return bm_e4m3(bm_fp8_clamp(x / s));
}

/* The same without branches, for loops that the compiler vectorizes
 * (cpu/quant.c): masks on the FP32 bits and exact float operations only (so
 * the rounding mode does not matter either), and the codes equal the
 * definitions above bit for bit (tests/test_fp8.c checks every FP32
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
