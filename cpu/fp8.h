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

#endif
