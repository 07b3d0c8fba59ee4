/*
 * fp4_check.cuh - shape_sweep check's exhaustive checks of the NVFP4
 * output's arithmetic (gpu/quant.cuh, docs/numerics.md#nvfp4) against
 * definitions written here from the text:
 *
 *   the E2M1 conversion  bm_e2m1 (the count of rounding boundaries)
 *                        against the nearest of the eight magnitudes by
 *                        distance, ties to the even code, on every FP32
 *                        value;
 *   the block scale      bm_nvfp4_scale_code_dev (the saturating cvt)
 *                        against bm_e4m3(min(sv, 448)), and
 *                        bm_nvfp4_scale_value of its code against the code's
 *                        value, on every BF16 maximum for global scales
 *                        from 2^-149 to just under 2^118.
 * The factor's reciprocal is bm_rcp_rn, which fp8_check.cuh compares with
 * __frcp_rn on every FP32 value of its range (every nonzero E4M3 value is
 * in it); the rest are single __fmul_rn, the definition's own operations.
 */
#ifndef BEAMMOE_BENCH_FP4_CHECK_CUH
#define BEAMMOE_BENCH_FP4_CHECK_CUH

#include <stdint.h>

#include "exhaustive.cuh"
#include "quant.cuh"

/* e2m1(p) by distance: the nearest magnitude (ties: the even code), above
 * 6 saturated, a NaN 0x7, the sign bit kept otherwise. Distances in double:
 * exact wherever two magnitudes are near enough to tie. */
__device__ uint32_t fp4c_e2m1_def(float p)
{
    const double mags[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
    if (p != p)
        return 7u;
    const double a = fabs((double)p);
    const uint32_t sign = signbit(p) ? 8u : 0u;
    if (a >= 6.0) /* saturated; far above, a - 4 and a - 6 round to one double */
        return 7u | sign;
    uint32_t best = 0;
    for (uint32_t k = 1; k < 8; ++k) {
        const double dk = fabs(a - mags[k]), db = fabs(a - mags[best]);
        if (dk < db || (dk == db && (k & 1u) == 0))
            best = k;
    }
    return best | sign;
}

__global__ void fp4c_e2m1_kernel(unsigned long long *bad, unsigned long long *first)
{
    const uint64_t n = 1ull << 32;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const float p = __uint_as_float((uint32_t)i);
        if (bm_e2m1(p) != fp4c_e2m1_def(p))
            exh_bad(bad, first, i);
    }
}

/* the value of a non-negative E4M3 code, from the format's text */
__device__ float fp4c_e4m3_value(uint32_t c)
{
    const int e = (int)(c >> 3);
    const float m = (float)(c & 7u);
    return e ? ldexpf(1.0f + m / 8.0f, e - 7) : ldexpf(m, -9);
}

/* every BF16 maximum +0 .. +inf (index i: bits i << 16) for each global
 * scale; the index counts maxima x scales */
#define FP4C_MAXIMA 0x7F81u
__global__ void fp4c_scale_kernel(unsigned long long *bad, unsigned long long *first)
{
    const float gs[] = {0x1p-149f, 1e-30f, 0x1p-9f, 1.0f, 672.0f, 2688.0f / 3.0f, 1e20f, 0x1.fffffep117f};
    const uint32_t ng = sizeof gs / sizeof gs[0];
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < FP4C_MAXIMA * ng; i += gridDim.x * blockDim.x) {
        const float m = __uint_as_float((i % FP4C_MAXIMA) << 16), g = gs[i / FP4C_MAXIMA];
        const float sv = __fmul_rn(g, __fmul_rn(m, 0x1.555556p-3f));
        const uint32_t c = bm_nvfp4_scale_code_dev(m, g);
        if (c != bm_e4m3(fminf(sv, 448.0f)) ||
            __float_as_uint(bm_nvfp4_scale_value(c)) != __float_as_uint(fp4c_e4m3_value(c)))
            exh_bad(bad, first, i);
    }
}

static int check_fp4()
{
    int bad = exh_run(fp4c_e2m1_kernel, "e2m1 conversion, every FP32 value");
    bad |= exh_run(fp4c_scale_kernel, "nvfp4 block scale and its value, every BF16 maximum x 8 global scales");
    return bad;
}

#endif
