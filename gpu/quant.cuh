/*
 * quant.cuh - the quantized output of normalized on the device
 * (docs/numerics.md#fp8): the E4M3 conversion, the scales and the maxima
 * they need, written as the CPU's cpu/fp8.h is (the same integer and
 * correctly rounded FP32 operations), so that both give the same bits.
 *
 * The conversion is the integer formula, not the hardware's
 * cvt.rn.satfinite.e4m3x2: bit-identical with the CPU by construction.
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

/* code of one value: e4m3(clamp(x / s)), clamp = fminf(fmaxf(v, -448), 448) */
__device__ __forceinline__ uint32_t bm_fp8_quant_dev(float x, float s)
{
    return bm_e4m3_dev(fminf(fmaxf(__fdiv_rn(x, s), -BM_FP8_MAX), BM_FP8_MAX));
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

/* the maximum over aligned groups of `lanes` lanes of a warp (a power of
 * two <= 32); every lane of the warp must call it. Exact in any order. */
__device__ __forceinline__ float bm_lanes_max(float m, int lanes)
{
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1)
        if (o < lanes)
            m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
    return m;
}

/* the maximum over the NT threads of a block; every thread gets it. One
 * barrier; between two calls a kernel passes at least one other barrier or
 * warp shuffle of every thread (the next row's norm), so one buffer does. */
template <int NT>
__device__ __forceinline__ float bm_block_max(float m)
{
    m = bm_lanes_max(m, 32);
    if (NT > 32) {
        __shared__ float qred[NT / 32 > 0 ? NT / 32 : 1];
        if ((threadIdx.x & 31) == 0)
            qred[threadIdx.x >> 5] = m;
        __syncthreads();
        m = qred[0];
#pragma unroll
        for (int w = 1; w < NT / 32; ++w)
            m = fmaxf(m, qred[w]);
    }
    return m;
}

#endif
