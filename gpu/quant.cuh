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
 *                      correction step, the clamp and the conversion by
 *                      the hardware's cvt.rn.satfinite.e4m3x2 (two values
 *                      per instruction).
 * The definition costs some 60 instructions a value, which made the
 * quantized kernels compute-bound (an H200 at T = 4096, H = 7168:
 * norm_residual_norm 59 -> 120 us); the fast form about 6. The scales and
 * their reciprocals are computed without a division or a library call
 * either (bm_div448, bm_rcp_rn): the library's division and reciprocal
 * carry a slow path called as a subroutine, whose calling convention cost
 * registers in every kernel that holds one. bench/shape_sweep check
 * compares each fast form with its definition exhaustively: the
 * conversion on every FP32 value, the reciprocal on every FP32 value of
 * its range, the scales on every BF16 maximum, and the quotient on every
 * BF16 value against every scale the dynamic kinds can produce and
 * random static ones.
 */
#ifndef BEAMMOE_GPU_QUANT_CUH
#define BEAMMOE_GPU_QUANT_CUH

#include <stdint.h>

#include "numerics.cuh"

#define BM_FP8_MAX 448.0f
#define BM_FP8_GROUP_EPS 1e-10f
enum { BM_QUANT_GROUP = 1, BM_QUANT_TOKEN = 2, BM_QUANT_TENSOR = 3, /* BEAM_QUANT_FP8_* */
       BM_QUANT_NVFP4 = 4 };                                          /* BEAM_QUANT_NVFP4 */

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

/* x / s correctly rounded, from r = RN(1 / s) (BM_FP8_FAST_MIN_S <= s <
 * BM_FP8_FAST_MAX_S): the quotient q = RN(x * r) is within one ulp of
 * x / s; its residual e = x - q * s is then exact in one FMA, and
 * RN(q + e * r) is the correctly rounded quotient (Markstein's theorem; it
 * needs no underflow in e, which the lower bound on s ensures wherever the
 * result can reach a nonzero E4M3 code, and a normal r, which the upper
 * bound ensures). A zero result takes x's sign, as the division's does. A
 * NaN result (x infinite or NaN, x * r overflowing, s infinite) tells the
 * caller to divide instead. */
#define BM_FP8_FAST_MIN_S 0x1p-64f
#define BM_FP8_FAST_MAX_S 0x1p126f
__device__ __forceinline__ float bm_div_by_scale(float x, float s, float r)
{
    const float q = __fmul_rn(x, r);
    const float e = __fmaf_rn(-q, s, x);
    return copysignf(__fmaf_rn(e, r, q), x);
}

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

/* e4m3 of two values, saturating: e4m3(clamp(v)) for every v but a NaN,
 * which gives 0x7F | sign (not the clamp's -448: bm_fp8_quant8 divides
 * such a chunk instead). The hardware's cvt.rn.satfinite.e4m3x2 (sm_89 and
 * later), else bm_e4m3_dev, which saturates the same way. lo in the low
 * byte. */
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

/* whether a packed code is 0x7F or 0xFF in any byte: the saturating
 * conversion gives those only for a NaN (every other value goes into
 * +-448, 0x7E / 0xFE) */
__device__ __forceinline__ bool bm_fp8_nan_code(uint2 c)
{
    const uint32_t m = 0x7F7F7F7Fu; /* a byte 0x7F becomes 0x80 at +1, no carry */
    return (((c.x & m) + 0x01010101u) | ((c.y & m) + 0x01010101u)) & 0x80808080u;
}

/* bm_e4m3x2 of eight values, packed little endian */
__device__ __forceinline__ uint2 bm_fp8_pack8(const float (&d)[8])
{
    return make_uint2(bm_e4m3x2(d[0], d[1]) | (bm_e4m3x2(d[2], d[3]) << 16),
                      bm_e4m3x2(d[4], d[5]) | (bm_e4m3x2(d[6], d[7]) << 16));
}

/* The codes of eight values of one scale s (r = bm_rcp_rn(s)), packed
 * little endian: bm_fp8_quant_dev of each, bit for bit. pow2: s is a power
 * of two (UE8M0), so r is 1 / s exactly and x * r is already the correctly
 * rounded quotient. The chunk divides instead when s is outside the fast
 * form's range or a quotient is a NaN (x infinite or NaN, x * r
 * overflowing, s infinite), which the codes show; the clamp then also maps
 * a NaN to -448, as the definition's does. Every other quotient converts
 * as the clamp and the conversion would (the conversion saturates). */
__device__ __forceinline__ uint2 bm_fp8_quant8(const float (&x)[8], float s, float r, bool pow2)
{
    float d[8];
    if (pow2) {
#pragma unroll
        for (int e = 0; e < 8; ++e)
            d[e] = __fmul_rn(x[e], r);
    } else {
#pragma unroll
        for (int e = 0; e < 8; ++e)
            d[e] = bm_div_by_scale(x[e], s, r);
    }
    uint2 c = bm_fp8_pack8(d);
    if (!(s >= BM_FP8_FAST_MIN_S && s < BM_FP8_FAST_MAX_S) || bm_fp8_nan_code(c)) {
#pragma unroll
        for (int e = 0; e < 8; ++e)
            d[e] = bm_fp8_clamp(__fdiv_rn(x[e], s));
        c = bm_fp8_pack8(d);
    }
    return c;
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

/* m / 448 correctly rounded, for m = +0 or a positive value whose
 * quotient is normal (a BF16 maximum, the group's eps), or +inf (which
 * stays): Markstein's correction with the constant RN(1 / 448). The
 * division's fast path costs some ten instructions and a slow-path call;
 * this is three. A quotient below the normal range (a token maximum under
 * 2^-117) may be off by an ulp, which the per-token floor absorbs. */
__device__ __forceinline__ float bm_div448(float m)
{
    const float c = 0x1.24924ap-9f; /* RN(1 / 448) */
    const float q = __fmul_rn(m, c);
    const float d = __fmaf_rn(__fmaf_rn(-q, BM_FP8_MAX, m), c, q);
    return m <= 3.402823466e38f ? d : m;
}

/* the definitions (docs/numerics.md#fp8) with the division written as
 * bm_div448; shape_sweep check compares them with __fdiv_rn's forms on
 * every BF16 maximum */
__device__ __forceinline__ float bm_fp8_group_scale_dev(float absmax, int ue8m0)
{
    float s = bm_div448(fmaxf(absmax, BM_FP8_GROUP_EPS));
    if (ue8m0) s = bm_pow2_ceil_dev(fmaxf(fabsf(s), 1e-10f));
    return s;
}

__device__ __forceinline__ float bm_fp8_token_scale_dev(float absmax, int ue8m0)
{
    const float s = fmaxf(bm_div448(absmax), 1.0f / (BM_FP8_MAX * 512.0f));
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

/* ---- NVFP4 (docs/numerics.md#nvfp4), as cpu/fp4.h computes it ---- */

/* e2m1(p): the number of the rounding boundaries 0.25, 0.75, 1.25, 1.75,
 * 2.5, 3.5, 5 that |p| passes (above the ones whose code below is even, at
 * the others: ties to even), on the bits (positive floats order as their
 * bits); a NaN passes all: 0x7, its sign dropped. Hopper has no conversion
 * to E2M1 (cvt.rn.satfinite.e2m1x2 needs sm_100a), so this is software on
 * every GPU, the same formula as the CPU's. */
__device__ __forceinline__ uint32_t bm_e2m1_dev(float p)
{
    const uint32_t u = __float_as_uint(p);
    const int32_t a = (int32_t)(u & 0x7FFFFFFFu);
    const uint32_t mag = (uint32_t)(a > 0x3E800000) + (uint32_t)(a >= 0x3F400000) +
                         (uint32_t)(a > 0x3FA00000) + (uint32_t)(a >= 0x3FE00000) +
                         (uint32_t)(a > 0x40200000) + (uint32_t)(a >= 0x40600000) +
                         (uint32_t)(a > 0x40A00000);
    return a > 0x7F800000 ? 7u : mag | ((u >> 28) & 8u);
}

/* The value of a non-negative, non-NaN E4M3 code, exact. */
__device__ __forceinline__ float bm_e4m3_value_dev(uint32_t c)
{
    const uint32_t e = c >> 3, m = c & 7u;
    return e ? __uint_as_float(((e + 120u) << 23) | (m << 20)) : __fmul_rn((float)m, 0x1p-9f);
}

/* The E4M3 code of a block's scale from its largest magnitude m (not a
 * NaN) and the global scale g: e4m3(min(g * (m * RN(1/6)), 448)); the
 * saturating conversion does the min (an infinite product too). */
__device__ __forceinline__ uint32_t bm_nvfp4_scale_code_dev(float m, float g)
{
    return bm_e4m3x2(__fmul_rn(g, __fmul_rn(m, 0x1.555556p-3f)), 0.0f) & 0xFFu;
}

/* e2m1(x * os) of eight values, element e in bits 4e..4e+3 */
__device__ __forceinline__ uint32_t bm_nvfp4_pack8(const float (&x)[8], float os)
{
    uint32_t c = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e)
        c |= bm_e2m1_dev(__fmul_rn(x[e], os)) << (4 * e);
    return c;
}

#endif
