/*
 * fp8_check.cuh - shape_sweep check's exhaustive checks of the quantized
 * output's arithmetic (gpu/quant.cuh): the forms the kernels run against
 * the definitions, which are the CPU's operations (docs/numerics.md#fp8).
 *
 *   the E4M3 conversion  bm_e4m3x2 (the hardware's cvt on sm_89 and later)
 *                        against bm_e4m3_dev on every FP32 value after the
 *                        clamp;
 *   the quotient         bm_fp8_quant8 (reciprocal and one correction)
 *                        against bm_fp8_quant_dev (division) on every BF16
 *                        value x (normalized is BF16), for every scale the
 *                        dynamic kinds can produce (the group scale of
 *                        every finite or infinite BF16 maximum, every power
 *                        of two (UE8M0), the per-token floor) and for
 *                        random static scales over 2^-80 .. 2^80.
 */
#ifndef BEAMMOE_BENCH_FP8_CHECK_CUH
#define BEAMMOE_BENCH_FP8_CHECK_CUH

#include <stdint.h>
#include <stdio.h>

#include "quant.cuh"

#define FP8C_MAXIMA 0x7F81u /* BF16 bits 0 .. 0x7F80: +0 .. +inf */
#define FP8C_POW2 254u       /* 2^-126 .. 2^127 */
#define FP8C_RANDOM 16384u
#define FP8C_SCALES (FP8C_MAXIMA + FP8C_POW2 + 1u + FP8C_RANDOM)

/* scale k of the set above */
__device__ float fp8c_scale(uint32_t k)
{
    if (k < FP8C_MAXIMA)
        return bm_fp8_group_scale_dev(__uint_as_float(k << 16), 0);
    k -= FP8C_MAXIMA;
    if (k < FP8C_POW2)
        return __uint_as_float((k + 1u) << 23);
    k -= FP8C_POW2;
    if (k == 0)
        return bm_fp8_token_scale_dev(0.0f, 0);
    /* random: a hash of k, exponent 2^-80 .. 2^80, any mantissa */
    uint32_t h = k * 0x9E3779B1u;
    h ^= h >> 15;
    h *= 0x85EBCA77u;
    h ^= h >> 13;
    return __uint_as_float(((47u + h % 161u) << 23) | ((h * 0xC2B2AE3Du) >> 9));
}

/* one thread: scale k, the eight BF16 values x = 8c .. 8c+7 */
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
        const uint2 got = bm_fp8_quant8(x, s, __frcp_rn(s));
        for (int e = 0; e < 8; ++e) {
            const uint32_t want = bm_fp8_quant_dev(x[e], s);
            const uint32_t g = ((e < 4 ? got.x : got.y) >> (8 * (e & 3))) & 0xFFu;
            if (g != want) {
                atomicAdd(bad, 1ull);
                atomicMin(first, ((unsigned long long)k << 16) | (c * 8u + (uint32_t)e));
            }
        }
    }
}

/* every FP32 value u (and its complement, the pair's other half) */
__global__ void fp8c_cvt_kernel(unsigned long long *bad, unsigned long long *first)
{
    const uint64_t n = 1ull << 32;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const float a = bm_fp8_clamp(__uint_as_float((uint32_t)i));
        const float b = bm_fp8_clamp(__uint_as_float(~(uint32_t)i));
        if (bm_e4m3x2(a, b) != (bm_e4m3_dev(a) | (bm_e4m3_dev(b) << 8))) {
            atomicAdd(bad, 1ull);
            atomicMin(first, i);
        }
    }
}

/* run kernel, print "what: N mismatches"; 0 when there were none */
template <typename K>
static int fp8c_run(K kernel, const char *what)
{
    unsigned long long *d, h[2] = {0, 0};
    if (cudaMalloc(&d, sizeof h) != cudaSuccess) return 1;
    cudaMemset(d, 0, sizeof(unsigned long long));
    cudaMemset(d + 1, 0xFF, sizeof(unsigned long long));
    kernel<<<4096, 256>>>(d, d + 1);
    const cudaError_t e = cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (e != cudaSuccess) {
        printf("%s: %s\n", what, cudaGetErrorString(e));
        return 1;
    }
    printf("%s: %llu mismatches", what, h[0]);
    if (h[0]) printf(" (first at 0x%llx)", h[1]);
    printf("\n");
    return h[0] ? 1 : 0;
}

static int check_fp8()
{
    int bad = fp8c_run(fp8c_cvt_kernel, "e4m3 conversion, every FP32 value after the clamp");
    bad |= fp8c_run(fp8c_quot_kernel, "fp8 quotient, every BF16 value x every dynamic scale and 16384 static ones");
    return bad;
}

#endif
