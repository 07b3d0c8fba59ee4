/*
 * quant_bits.h - the formulas of the quantized output of normalized
 * (docs/numerics.md#fp8, #nvfp4) written once for both backends
 * (internal): cpu/fp8.h and cpu/fp4.h (C99) and gpu/quant.cuh (nvcc)
 * compile this same text. Integer operations on the FP32 bits and FP32
 * operations that are exact or correctly rounded, so that the result
 * depends neither on the rounding mode nor on contraction.
 *
 * Spelled per compiler, not per formula: a float's bits, a select (BM_SEL,
 * BM_SELF: a ternary on the device, whose kernels' register allocation
 * follows the code's shape; masks in C, where GCC vectorizes a loop with
 * float operations only without branches), the reciprocal (bm_rcp) and the
 * division by 448 (bm_div448): a division in C, on the device the
 * hardware's approximate reciprocal or RN(1 / 448) and a correction step
 * (bench/shape_sweep check compares those with the division over their
 * ranges). The GPU's own fast
 * forms (the hardware's E4M3 conversion, the quotient by reciprocal) are
 * gpu/quant.cuh's.
 */
#ifndef BEAMMOE_LIB_QUANT_BITS_H
#define BEAMMOE_LIB_QUANT_BITS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define BM_HD __host__ __device__ __forceinline__
#else
#define BM_HD static inline
#endif

#define BM_FP8_MAX 448.0f
/* The floor of a group's largest magnitude (vLLM's eps default) */
#define BM_FP8_GROUP_EPS 1e-10f
/* RN(1 / 6): the block's largest magnitude over E2M1's largest, 6 */
#define BM_FP4_RCP6 0x1.555556p-3f

#ifdef __CUDACC__
/* RN(1 / s) for 2^-126 <= s < 2^126: the hardware's approximation and one
 * Newton step, which is __frcp_rn's own fast path without its range check
 * and slow-path call. Outside that range the result is not RN(1 / s); the
 * callers' bounds on s keep it out (bm_fp8_quant8 divides instead). */
__device__ __forceinline__ float bm_rcp_rn(float s)
{
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(s));
    return __fmaf_rn(__fmaf_rn(-s, r, 1.0f), r, r);
}
#endif

/* Per compiler: a float's bits; c ? a : b of integers (BM_SEL) and floats
 * (BM_SELF); x * y rounded (BM_MUL); RN(1 / s) for a normal s (bm_rcp).
 * The device's forms are those the kernels' register allocation was
 * recorded with (a ternary whose arms are evaluated only when taken, a
 * constant factor in a register); C's are masks, and a division that is by
 * 1 where s is 0 (no FE_DIVBYZERO; the caller selects that result away). */
#ifdef __CUDA_ARCH__
BM_HD uint32_t bm_fp8_bits(float v) { return __float_as_uint(v); }
BM_HD float bm_fp8_float(uint32_t u) { return __uint_as_float(u); }
#define BM_SEL(c, a, b) ((c) ? (a) : (b))
#define BM_SELF(c, a, b) ((c) ? (a) : (b))
#define BM_MUL(x, y) __fmul_rn(x, y)
#define bm_rcp bm_rcp_rn
#else
BM_HD uint32_t bm_fp8_bits(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

BM_HD float bm_fp8_float(uint32_t u)
{
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}
#define BM_SEL(c, a, b) (((a) & (0u - (uint32_t)(c))) | ((b) & ((uint32_t)(c) - 1u)))
#define BM_SELF(c, a, b) bm_fp8_float(BM_SEL(c, bm_fp8_bits(a), bm_fp8_bits(b)))
#define BM_MUL(x, y) ((x) * (y))
BM_HD float bm_rcp(float s)
{
    return 1.0f / BM_SELF(s != 0.0f, s, 1.0f);
}
#endif

/* e4m3(v): the nearest E4M3 value, ties to even. |v| >= 448 gives +-448
 * (saturation: the callers clamp first, so this only matters for values
 * that round to 448 from below); NaN gives 0x7F with v's sign. */
BM_HD uint32_t bm_e4m3(float v)
{
    const uint32_t u = bm_fp8_bits(v);
    const uint32_t sign = (u >> 24) & 0x80u;
    const uint32_t a = u & 0x7FFFFFFFu;
    uint32_t q, rest, half;
    if (a > 0x7F800000u) return sign | 0x7Fu;
    if (a >= 0x43E00000u) return sign | 0x7Eu; /* >= 448 */
    if (a < 0x3C800000u) {
        /* below 2^-6, the smallest normal: E4M3 steps of 2^-9 (the
         * subnormals; 8 steps is 2^-6, whose code 0x08 follows on) */
        const float t = bm_fp8_float(a) * 512.0f; /* exact: a power of two */
        const uint32_t i = (uint32_t)t;          /* t < 8 */
        const float frac = t - (float)i;         /* exact */
        q = i + (frac > 0.5f || (frac == 0.5f && (i & 1u)));
        return sign | q;
    }
    /* normal: exponent field (e + 7) beside the top 3 of the 23 mantissa
     * bits; the 20 bits below round the 3 to nearest, ties to even (a
     * carry out of the mantissa moves into the exponent, which is right) */
    q = ((((a >> 23) - 127u + 7u) << 3) | ((a >> 20) & 7u));
    rest = a & 0xFFFFFu;
    half = 0x80000u;
    q += rest > half || (rest == half && (q & 1u));
    return sign | q;
}

/* The clamp before the conversion, in vLLM's order for the group kernel:
 * fminf(fmaxf(v, -448), 448), so a NaN becomes -448. */
BM_HD float bm_fp8_clamp(float v)
{
    return fminf(fmaxf(v, -BM_FP8_MAX), BM_FP8_MAX);
}

/* The smallest power of two >= s, for a finite s > 0 (UE8M0 scales);
 * infinity stays infinity. Exact, where vLLM's exp2f(ceilf(log2f(s)))
 * depends on the accuracy of log2f next to powers of two. */
BM_HD float bm_pow2_ceil(float s)
{
    uint32_t u = bm_fp8_bits(s);
    if (u >= 0x7F800000u) return s;
    if (u < 0x00800000u) return bm_fp8_float(0x00800000u); /* a subnormal s: the first normal power */
    if (u & 0x7FFFFFu) u = (u & 0xFF800000u) + 0x00800000u;
    return bm_fp8_float(u);
}

/* One element: e4m3(clamp(x / s)), FP32 division correctly rounded. */
BM_HD uint32_t bm_fp8_quant(float x, float s)
{
    return bm_e4m3(bm_fp8_clamp(x / s));
}

/* m / 448 correctly rounded. On the device, for m = +0 or a positive value
 * whose quotient is normal (a BF16 maximum, the group's eps), or +inf
 * (which stays): Markstein's correction with the constant RN(1 / 448). The
 * division's fast path costs some ten instructions and a slow-path call;
 * this is three. A quotient below the normal range (a token maximum under
 * 2^-117) may be off by an ulp, which the per-token floor absorbs. */
BM_HD float bm_div448(float m)
{
#ifdef __CUDA_ARCH__
    const float c = 0x1.24924ap-9f; /* RN(1 / 448) */
    const float q = __fmul_rn(m, c);
    const float d = __fmaf_rn(__fmaf_rn(-q, BM_FP8_MAX, m), c, q);
    return m <= 3.402823466e38f ? d : m;
#else
    return m / BM_FP8_MAX;
#endif
}

/* The scale of a group (or of a token) from its largest magnitude:
 * s = max(absmax, floor) / 448 in FP32 (correctly rounded); with ue8m0, the
 * smallest power of two >= max(s, 1e-10). floor: eps of the group form
 * (vLLM starts the group's maximum at eps); the per-token form takes
 * max(absmax / 448, 1 / (448 * 512)) instead (bm_fp8_token_scale), whose
 * UE8M0 form is bm_pow2_ceil of it. */
BM_HD float bm_fp8_group_scale(float absmax, float eps, int ue8m0)
{
    float s = bm_div448(fmaxf(absmax, eps));
    if (ue8m0) s = bm_pow2_ceil(fmaxf(fabsf(s), 1e-10f));
    return s;
}

BM_HD float bm_fp8_token_scale(float absmax, int ue8m0)
{
    const float s = fmaxf(bm_div448(absmax), 1.0f / (BM_FP8_MAX * 512.0f));
    return ue8m0 ? bm_pow2_ceil(s) : s;
}

/* e2m1(p): the magnitude code is how many of the seven rounding boundaries
 * 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 |p| passes, where a boundary whose
 * code below is even is passed above it and one whose code below is odd is
 * passed at it: nearest, ties to the even code; beyond 5 (infinity too)
 * saturates to 6. Positive floats order as their bits, so the comparisons
 * are on integers (signed: |p| < 2^31). A NaN's bits pass every boundary:
 * 0x7 (+6), its sign bit dropped (backends give NaNs different signs). A
 * zero, or a value that rounds to one, keeps its sign. Hopper has no
 * conversion to E2M1 (cvt.rn.satfinite.e2m1x2 needs sm_100a): the GPU
 * runs this too. */
BM_HD uint32_t bm_e2m1_bits(uint32_t u)
{
    const int32_t a = (int32_t)(u & 0x7FFFFFFFu);
    const uint32_t mag = (uint32_t)(a > 0x3E800000) + (uint32_t)(a >= 0x3F400000) +
                         (uint32_t)(a > 0x3FA00000) + (uint32_t)(a >= 0x3FE00000) +
                         (uint32_t)(a > 0x40200000) + (uint32_t)(a >= 0x40600000) +
                         (uint32_t)(a > 0x40A00000);
    return BM_SEL(a > 0x7F800000, 7u, mag | ((u >> 28) & 8u));
}

BM_HD uint32_t bm_e2m1(float p)
{
    return bm_e2m1_bits(bm_fp8_bits(p));
}

/* The value of a non-negative, non-NaN E4M3 code, exact, from its bits: a
 * normal code's exponent and mantissa moved into an FP32's, a subnormal
 * one m * 2^-9. */
BM_HD float bm_nvfp4_scale_value(uint32_t sf)
{
    const uint32_t e = sf >> 3, m = sf & 7u;
    return BM_SELF(e != 0, bm_fp8_float(((e + 120u) << 23) | (m << 20)), BM_MUL((float)m, 0x1p-9f));
}

/* What a block's scale code converts (docs/numerics.md#nvfp4), from its
 * largest magnitude m (not a NaN) and the global scale g (0 < g < 2^118):
 * g * (m * RN(1/6)), each product rounded to FP32; the code is its E4M3,
 * saturated at 448 (an infinite product too): never negative, never a
 * NaN. */
BM_HD float bm_nvfp4_scale_arg(float m, float g)
{
    return BM_MUL(g, BM_MUL(m, BM_FP4_RCP6));
}

/* The factor of a block's values, os = g * (1 / value(sf)), each operation
 * rounded to FP32; +0 when sf is 0. */
BM_HD float bm_nvfp4_factor(uint32_t sf, float g)
{
    return BM_SELF(sf != 0, g * bm_rcp(bm_nvfp4_scale_value(sf)), 0.0f);
}

#endif
