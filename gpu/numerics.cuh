/*
 * numerics.cuh - docs/numerics.md arithmetic on the device (internal).
 *
 * Every FP32 step is an explicit round-to-nearest intrinsic (__fmul_rn,
 * __fadd_rn, __fdiv_rn, __fsqrt_rn) so that no compiler flag or contraction
 * can change a bit; the build adds --fmad=false as a second guard. BF16
 * rounding is the integer formula of docs/numerics.md#bf16, with every NaN becoming 0x7FFF.
 */
#ifndef BEAMMOE_GPU_NUMERICS_CUH
#define BEAMMOE_GPU_NUMERICS_CUH

#include <stdint.h>

/* f(b): BF16 bits -> FP32, exact (the device's bm_f of cpu/bf16.h). */
__device__ __forceinline__ float bm_widen_bf16(uint32_t b16)
{
    return __uint_as_float(b16 << 16);
}

/* bf16(v) as docs/numerics.md#bf16 writes it:
 * (u + 0x7FFF + ((u >> 16) & 1)) >> 16, NaN -> 0x7FFF. The reference the
 * hardware conversions below are checked against. */
__device__ __forceinline__ uint32_t bm_bf16_formula(float v)
{
    uint32_t u = __float_as_uint(v);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return 0x7FFFu;
    return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

/* bf16(v) with the hardware conversion (cvt.rn.bf16.f32: one instruction,
 * round to nearest even, subnormals kept, every NaN to 0x7FFF); equal to
 * bm_bf16_formula for every FP32 input (`bench/shape_sweep check`). */
__device__ __forceinline__ uint32_t bm_bf16_hw(float v)
{
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(v));
    return (uint32_t)r;
}

/* bf16 of two values at once with the hardware conversion (cvt.rn.bf16x2.f32,
 * one instruction for what the formula does in six per value): round to
 * nearest even, overflow to infinity, subnormals kept (no .ftz), every NaN to
 * the canonical 0x7FFF. That this equals bm_bf16_formula for all 2^32 inputs
 * is checked on the device by `bench/shape_sweep check` (scripts/gpu-run.sh
 * runs it).
 * lo lands in the low half (the lower address in memory). */
__device__ __forceinline__ uint32_t bm_bf16x2(float lo, float hi)
{
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* Eight BF16 values packed in four 32-bit words (element 2i in the low half
 * of word i: the little-endian memory order of a 16-byte vector). */
struct bm_pack8 {
    uint32_t w[4];
};

__device__ __forceinline__ void bm_unpack8(const bm_pack8 &p, float v[8])
{
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[2 * i] = __uint_as_float(p.w[i] << 16);
        v[2 * i + 1] = __uint_as_float(p.w[i] & 0xFFFF0000u);
    }
}

__device__ __forceinline__ bm_pack8 bm_round8(const float v[8])
{
    bm_pack8 p;
#pragma unroll
    for (int i = 0; i < 4; ++i)
        p.w[i] = bm_bf16x2(v[2 * i], v[2 * i + 1]);
    return p;
}

/* Loads and stores of eight consecutive BF16 values. VEC: one 16-byte
 * access (the caller guarantees 16-byte alignment); otherwise eight 2-byte
 * accesses, for bases that are only 2-byte aligned. */
template <bool VEC>
__device__ __forceinline__ bm_pack8 bm_load8(const uint16_t *p)
{
    bm_pack8 r;
    if (VEC) {
        uint4 q = *reinterpret_cast<const uint4 *>(p);
        r.w[0] = q.x; r.w[1] = q.y; r.w[2] = q.z; r.w[3] = q.w;
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i)
            r.w[i] = (uint32_t)p[2 * i] | ((uint32_t)p[2 * i + 1] << 16);
    }
    return r;
}

/* Streaming load for data read exactly once (expert outputs): evict-first,
 * so it does not push the residual stream out of L2. */
template <bool VEC>
__device__ __forceinline__ bm_pack8 bm_load8_stream(const uint16_t *p)
{
    if (VEC) {
        bm_pack8 r;
        uint4 q = __ldcs(reinterpret_cast<const uint4 *>(p));
        r.w[0] = q.x; r.w[1] = q.y; r.w[2] = q.z; r.w[3] = q.w;
        return r;
    }
    return bm_load8<false>(p);
}

template <bool VEC>
__device__ __forceinline__ void bm_store8(uint16_t *p, const bm_pack8 &v)
{
    if (VEC) {
        *reinterpret_cast<uint4 *>(p) = make_uint4(v.w[0], v.w[1], v.w[2], v.w[3]);
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            p[2 * i] = (uint16_t)(v.w[i] & 0xFFFFu);
            p[2 * i + 1] = (uint16_t)(v.w[i] >> 16);
        }
    }
}

/* 16-byte asynchronous copy global -> shared (LDGSTS): the data lands in
 * shared memory without passing through registers. Both addresses must be
 * 16-byte aligned. bm_cp_async_wait waits for all of the thread's copies. */
__device__ __forceinline__ void bm_cp_async16(void *smem, const void *gmem)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}

__device__ __forceinline__ void bm_cp_async_wait()
{
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}

/* P[c] of docs/numerics.md#chunk-sums: ((((((q0 + q1) + q2) + q3) + q4) + q5) + q6) + q7. */
__device__ __forceinline__ float bm_chunk_sumsq(const float v[8])
{
    float a = __fmul_rn(v[0], v[0]);
#pragma unroll
    for (int i = 1; i < 8; ++i)
        a = __fadd_rn(a, __fmul_rn(v[i], v[i]));
    return a;
}

/* inv = 1 / sqrt(P0 / H + eps), correctly rounded at every step. */
__device__ __forceinline__ float bm_inv_rms(float p0, int hidden, float eps)
{
    float ms = __fdiv_rn(p0, (float)hidden);
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
}

#endif
