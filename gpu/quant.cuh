/*
 * quant.cuh - the quantized output of normalized on the device
 * (docs/numerics.md#fp8, #nvfp4): the device's fast forms beside the
 * definitions, which are lib/quant_bits.h's, the CPU's own text (the same
 * integer and correctly rounded FP32 operations, so both give the same
 * bits).
 *
 * Two forms of the same function of (x, s):
 *   bm_fp8_quant       the definition: a correctly rounded division, then
 *                      the integer E4M3 formula;
 *   bm_fp8_quant8      what the kernels run, eight values of one scale at
 *                      a time: the division as a reciprocal and one
 *                      correction step, the clamp and the conversion by
 *                      the hardware's cvt.rn.satfinite.e4m3x2 (two values
 *                      per instruction).
 * The definition costs some 60 instructions a value, which made the
 * quantized kernels compute-bound [2026-12-04-constants: fast]; the fast
 * form about 6. The scales and
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
#include "quant_bits.h"

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

/* e4m3 of two values, saturating: e4m3(clamp(v)) for every v but a NaN,
 * which gives 0x7F | sign (not the clamp's -448: bm_fp8_quant8 divides
 * such a chunk instead). The hardware's cvt.rn.satfinite.e4m3x2 (sm_89 and
 * later), else bm_e4m3, which saturates the same way. lo in the low
 * byte. */
__device__ __forceinline__ uint32_t bm_e4m3x2(float lo, float hi)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    unsigned short d;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
    return d;
#else
    return bm_e4m3(lo) | (bm_e4m3(hi) << 8);
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
 * little endian: bm_fp8_quant of each, bit for bit. pow2: s is a power
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

/* the largest |v| of a chunk (fmaxf skips a NaN) */
__device__ __forceinline__ float bm_absmax8(const float (&v)[8])
{
    float m = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e)
        m = fmaxf(m, fabsf(v[e]));
    return m;
}

/* ---- NVFP4 (docs/numerics.md#nvfp4), the fast forms ---- */

/* The E4M3 code of a block's scale from its largest magnitude m (not a
 * NaN) and the global scale g: e4m3(min(g * (m * RN(1/6)), 448)); the
 * saturating conversion does the min (an infinite product too). */
__device__ __forceinline__ uint32_t bm_nvfp4_scale_code_dev(float m, float g)
{
    return bm_e4m3x2(bm_nvfp4_scale_arg(m, g), 0.0f) & 0xFFu;
}

/* e2m1(x * os) of eight values, element e in bits 4e..4e+3 */
__device__ __forceinline__ uint32_t bm_nvfp4_pack8(const float (&x)[8], float os)
{
    uint32_t c = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e)
        c |= bm_e2m1(__fmul_rn(x[e], os)) << (4 * e);
    return c;
}

#endif
