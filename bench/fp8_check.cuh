/*
 * fp8_check.cuh - shape_sweep check's exhaustive checks of the quantized
 * output's arithmetic (gpu/quant.cuh): the fast forms the kernels run
 * against the definitions, which are the CPU's operations
 * (docs/numerics.md#fp8).
 *
 *   the E4M3 conversion  bm_e4m3x2 (the hardware's saturating cvt on sm_89
 *                        and later) against bm_e4m3 after the clamp, on
 *                        every FP32 value, a NaN giving a NaN code (which
 *                        sends the kernels' chunk to the division);
 *   the reciprocal       bm_rcp_rn against __frcp_rn on every FP32 value of
 *                        2^-126 .. 2^126 (its range);
 *   the scales           bm_fp8_group_scale and bm_fp8_token_scale
 *                        (bm_div448) against the division, on every BF16
 *                        maximum (normalized is BF16), UE8M0 or not;
 *   the quotient         bm_fp8_quant8 (and its UE8M0 form where the scale
 *                        is a power of two) against bm_fp8_quant on every
 *                        BF16 value x, for every scale the dynamic kinds
 *                        can produce (the group scale of every finite or
 *                        infinite BF16 maximum, every power of two (UE8M0),
 *                        the per-token floor), the edges of the fast
 *                        form's range and random static scales over
 *                        2^-80 .. 2^80.
 */
#ifndef BEAMMOE_BENCH_FP8_CHECK_CUH
#define BEAMMOE_BENCH_FP8_CHECK_CUH

#include <stdint.h>

#include "exhaustive.cuh"
#include "quant.cuh"

/* the definitions of the scales: the division itself */
__device__ float fp8c_group_scale_def(float absmax, int ue8m0)
{
    float s = __fdiv_rn(fmaxf(absmax, BM_FP8_GROUP_EPS), BM_FP8_MAX);
    if (ue8m0) s = bm_pow2_ceil(fmaxf(fabsf(s), 1e-10f));
    return s;
}

__device__ float fp8c_token_scale_def(float absmax, int ue8m0)
{
    const float s = fmaxf(__fdiv_rn(absmax, BM_FP8_MAX), 1.0f / (BM_FP8_MAX * 512.0f));
    return ue8m0 ? bm_pow2_ceil(s) : s;
}

#define FP8C_MAXIMA 0x7F81u /* BF16 bits 0 .. 0x7F80: +0 .. +inf */
#define FP8C_POW2 254u       /* 2^-126 .. 2^127 */
#define FP8C_EDGES 8u
#define FP8C_RANDOM 16384u
#define FP8C_SCALES (FP8C_MAXIMA + FP8C_POW2 + 1u + FP8C_EDGES + FP8C_RANDOM)

/* the static scales at the edges of the fast form's range and beyond
 * (static scales are any positive finite value) */
__constant__ uint32_t fp8c_edges[FP8C_EDGES] = {
    0x00000001u, /* 2^-149 */
    0x007FFFFFu, /* the largest subnormal */
    0x1F7FFFFFu, /* just below BM_FP8_FAST_MIN_S */
    0x1F800000u, /* BM_FP8_FAST_MIN_S */
    0x7E7FFFFFu, /* just below BM_FP8_FAST_MAX_S */
    0x7E800000u, /* BM_FP8_FAST_MAX_S */
    0x7F000000u, /* 2^127 */
    0x7F7FFFFFu, /* the largest float */
};

/* scale k of the set above */
__device__ float fp8c_scale(uint32_t k)
{
    if (k < FP8C_MAXIMA)
        return bm_fp8_group_scale(__uint_as_float(k << 16), BM_FP8_GROUP_EPS, 0);
    k -= FP8C_MAXIMA;
    if (k < FP8C_POW2)
        return __uint_as_float((k + 1u) << 23);
    k -= FP8C_POW2;
    if (k == 0)
        return bm_fp8_token_scale(0.0f, 0);
    k -= 1u;
    if (k < FP8C_EDGES)
        return __uint_as_float(fp8c_edges[k]);
    k -= FP8C_EDGES;
    /* random: a hash of k, exponent 2^-80 .. 2^80, any mantissa */
    uint32_t h = k * 0x9E3779B1u;
    h ^= h >> 15;
    h *= 0x85EBCA77u;
    h ^= h >> 13;
    return __uint_as_float(((47u + h % 161u) << 23) | ((h * 0xC2B2AE3Du) >> 9));
}

/* one thread: scale k, the eight BF16 values x = 8c .. 8c+7; the
 * reciprocal as the kernels compute it */
__global__ void fp8c_quot_kernel(unsigned long long *bad, unsigned long long *first)
{
    const uint64_t n = (uint64_t)FP8C_SCALES * 8192u;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const uint32_t k = (uint32_t)(i >> 13), c = (uint32_t)(i & 8191u);
        const float s = fp8c_scale(k);
        float x[8];
        for (int e = 0; e < 8; ++e)
            x[e] = __uint_as_float((c * 8u + (uint32_t)e) << 16);
        /* the UE8M0 form too where s is a power of two or infinite, as
         * the UE8M0 scales are */
        const uint32_t su = __float_as_uint(s);
        const int forms = (su & 0x7FFFFFu) == 0 && su != 0 ? 2 : 1;
        for (int f = 0; f < forms; ++f) {
            const uint2 got = bm_fp8_quant8(x, s, bm_rcp_rn(s), f == 1);
            for (int e = 0; e < 8; ++e) {
                const uint32_t want = bm_fp8_quant(x[e], s);
                const uint32_t g = ((e < 4 ? got.x : got.y) >> (8 * (e & 3))) & 0xFFu;
                if (g != want)
                    exh_bad(bad, first, ((unsigned long long)k << 16) | (c * 8u + (uint32_t)e));
            }
        }
    }
}

/* the code the kernels need of one value: the definition's after the
 * clamp; for a NaN, a NaN code (0x7F | sign), which bm_fp8_quant8 takes
 * as its sign to divide instead */
__device__ bool fp8c_cvt_ok(float v, uint32_t code)
{
    if (v != v)
        return (code & 0x7Fu) == 0x7Fu;
    return code == bm_e4m3(bm_fp8_clamp(v));
}

/* every FP32 value u, and its complement (the pair's other half) */
__global__ void fp8c_cvt_kernel(unsigned long long *bad, unsigned long long *first)
{
    const uint64_t n = 1ull << 32;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const float a = __uint_as_float((uint32_t)i), b = __uint_as_float(~(uint32_t)i);
        const uint32_t c = bm_e4m3x2(a, b);
        if (!fp8c_cvt_ok(a, c & 0xFFu) || !fp8c_cvt_ok(b, c >> 8))
            exh_bad(bad, first, i);
    }
}

/* every s of 2^-126 .. 2^126 (positive; the sign is symmetric) */
__global__ void fp8c_rcp_kernel(unsigned long long *bad, unsigned long long *first)
{
    const uint32_t lo = 0x00800000u, hi = 0x7E800000u;
    for (uint64_t i = lo + blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < hi;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const float s = __uint_as_float((uint32_t)i);
        if (__float_as_uint(bm_rcp_rn(s)) != __float_as_uint(__frcp_rn(s)))
            exh_bad(bad, first, i);
    }
}

/* every BF16 maximum (+0 .. +inf), both scale kinds, UE8M0 or not */
__global__ void fp8c_scale_kernel(unsigned long long *bad, unsigned long long *first)
{
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < FP8C_MAXIMA; i += gridDim.x * blockDim.x) {
        const float m = __uint_as_float(i << 16);
        for (int u = 0; u < 2; ++u)
            if (__float_as_uint(bm_fp8_group_scale(m, BM_FP8_GROUP_EPS, u)) != __float_as_uint(fp8c_group_scale_def(m, u)) ||
                __float_as_uint(bm_fp8_token_scale(m, u)) != __float_as_uint(fp8c_token_scale_def(m, u)))
                exh_bad(bad, first, i);
    }
}

static int check_fp8()
{
    int bad = exh_run(fp8c_cvt_kernel, "e4m3 conversion, every FP32 value");
    bad |= exh_run(fp8c_rcp_kernel, "fp8 reciprocal, every FP32 value of 2^-126 .. 2^126");
    bad |= exh_run(fp8c_scale_kernel, "fp8 group and token scales, every BF16 maximum");
    bad |= exh_run(fp8c_quot_kernel,
                   "fp8 quotient, every BF16 value x every dynamic scale, 8 edges and 16384 static ones");
    return bad;
}

#endif
