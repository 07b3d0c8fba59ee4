/*
 * quant.cuh - the quantized output of normalized on the device
 * (docs/numerics.md#fp8): the E4M3 conversion, the scales and the maxima
 * they need, written as the CPU's cpu/fp8.h is (the same integer and
 * correctly rounded FP32 operations), so that both give the same bits.
 *
 * Two forms of the same function of (x, s):
 *   bm_fp8_quant_dev   the definition: a correctly rounded division, then
 *                      the integer E4M3 formula (the CPU's, operation for
 *                      operation);
 *   bm_fp8_quant8      what the kernels run, eight values of one scale at
 *                      a time: the division as a reciprocal and one
 *                      correction step, the conversion by the hardware's
 *                      cvt.rn.satfinite.e4m3x2 (two values per instruction).
 * The definition costs some 60 instructions a value, which made the
 * quantized kernels compute-bound (an H200 at T = 4096, H = 7168:
 * norm_residual_norm 59 -> 120 us); the fast form about 8. bench/shape_sweep
 * check compares the two on every BF16 value against every scale the
 * dynamic kinds can produce, and against random static scales, and the
 * hardware conversion against the formula on every FP32 value.
 */
#ifndef BEAMMOE_GPU_QUANT_CUH
#define BEAMMOE_GPU_QUANT_CUH

#include <stdint.h>

#include "numerics.cuh"

#define BM_FP8_MAX 448.0f
#define BM_FP8_GROUP_EPS 1e-10f
enum { BM_QUANT_GROUP = 1, BM_QUANT_TOKEN = 2, BM_QUANT_TENSOR = 3 }; /* BEAM_QUANT_FP8_* */

/* e4m3(v), nearest, ties to even; |v| >= 448 -> +-448; NaN -> 0x7F | sign */
__device__ __forceinline__ uint32_t bm_e4m3_dev(float v)
{
    const uint32_t u = __float_as_uint(v);
    const uint32_t sign = (u >> 24) & 0x80u;
    const uint32_t a = u & 0x7FFFFFFFu;
    uint32_t q;
    if (a > 0x7F800000u) return sign | 0x7Fu;
    if (a >= 0x43E00000u) return sign | 0x7Eu;
    if (a < 0x3C800000u) {
        const float t = __fmul_rn(__uint_as_float(a), 512.0f); /* exact */
        const uint32_t i = (uint32_t)t;                        /* t < 8 */
        const float frac = __fsub_rn(t, (float)i);             /* exact */
        q = i + (frac > 0.5f || (frac == 0.5f && (i & 1u)));
        return sign | q;
    }
    q = ((((a >> 23) - 127u + 7u) << 3) | ((a >> 20) & 7u));
    {
        const uint32_t rest = a & 0xFFFFFu, half = 0x80000u;
        q += rest > half || (rest == half && (q & 1u));
    }
    return sign | q;
}

/* the clamp of docs/numerics.md#fp8 (fmaxf first: a NaN becomes -448) */
__device__ __forceinline__ float bm_fp8_clamp(float v)
{
    return fminf(fmaxf(v, -BM_FP8_MAX), BM_FP8_MAX);
}

/* code of one value, the definition: e4m3(clamp(x / s)) */
__device__ __forceinline__ uint32_t bm_fp8_quant_dev(float x, float s)
{
    return bm_e4m3_dev(bm_fp8_clamp(__fdiv_rn(x, s)));
}

/* x / s correctly rounded, from r = RN(1 / s) (s >= BM_FP8_FAST_MIN_S): the
 * quotient q = RN(x * r) is within one ulp of x / s; its residual
 * e = x - q * s is then exact in one FMA, and RN(q + e * r) is the
 * correctly rounded quotient (Markstein's theorem; it needs no underflow in
 * e, which the bound on s ensures wherever the result can reach a nonzero
 * E4M3 code). A zero result takes x's sign, as the division's does. A
 * non-finite result (x infinite or NaN, x * r overflowing, s infinite)
 * tells the caller to divide instead. */
#define BM_FP8_FAST_MIN_S 0x1p-64f
__device__ __forceinline__ float bm_div_by_scale(float x, float s, float r)
{
    const float q = __fmul_rn(x, r);
    const float e = __fmaf_rn(-q, s, x);
    return copysignf(__fmaf_rn(e, r, q), x);
}

/* e4m3 of two values already clamped to [-448, 448] (no NaN), nearest,
 * ties to even: the hardware's conversion (sm_89 and later), else the
 * formula; lo in the low byte. */
__device__ __forceinline__ uint32_t bm_e4m3x2(float lo, float hi)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    unsigned short d;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
    return d;
#else
    return bm_e4m3_dev(lo) | (bm_e4m3_dev(hi) << 8);
#endif
}

/* The codes of eight values of one scale s (r = RN(1 / s)), packed little
 * endian: bm_fp8_quant_dev of each, bit for bit. The chunk divides instead
 * when s is below the fast form's range or a quotient is not finite. */
__device__ __forceinline__ uint2 bm_fp8_quant8(const float (&x)[8], float s, float r)
{
    float d[8];
    bool fast = s >= BM_FP8_FAST_MIN_S;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        d[e] = bm_div_by_scale(x[e], s, r);
        fast = fast && fabsf(d[e]) <= 3.402823466e38f;
    }
    if (!fast) {
#pragma unroll
        for (int e = 0; e < 8; ++e)
            d[e] = __fdiv_rn(x[e], s);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e)
        d[e] = bm_fp8_clamp(d[e]);
    return make_uint2(bm_e4m3x2(d[0], d[1]) | (bm_e4m3x2(d[2], d[3]) << 16),
                      bm_e4m3x2(d[4], d[5]) | (bm_e4m3x2(d[6], d[7]) << 16));
}

/* the smallest power of two >= s (s > 0; infinity stays) */
__device__ __forceinline__ float bm_pow2_ceil_dev(float s)
{
    uint32_t u = __float_as_uint(s);
    if (u >= 0x7F800000u) return s;
    if (u < 0x00800000u) return __uint_as_float(0x00800000u);
    if (u & 0x7FFFFFu) u = (u & 0xFF800000u) + 0x00800000u;
    return __uint_as_float(u);
}

__device__ __forceinline__ float bm_fp8_group_scale_dev(float absmax, int ue8m0)
{
    float s = __fdiv_rn(fmaxf(absmax, BM_FP8_GROUP_EPS), BM_FP8_MAX);
    if (ue8m0) s = bm_pow2_ceil_dev(fmaxf(fabsf(s), 1e-10f));
    return s;
}

__device__ __forceinline__ float bm_fp8_token_scale_dev(float absmax, int ue8m0)
{
    const float s = fmaxf(__fdiv_rn(absmax, BM_FP8_MAX), 1.0f / (BM_FP8_MAX * 512.0f));
    return ue8m0 ? bm_pow2_ceil_dev(s) : s;
}

/* the largest |v| of a chunk (fmaxf skips a NaN) */
__device__ __forceinline__ float bm_absmax8(const float (&v)[8])
{
    float m = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e)
        m = fmaxf(m, fabsf(v[e]));
    return m;
}

#endif
