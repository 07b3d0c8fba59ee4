/*
 * quant_row.cuh - the quantized output stage of a row (internal): what a
 * kernel compiled with a quantized output (params.cuh, Q) runs on the
 * normalized values of norm B. The formulas are quant.cuh's (lib/
 * quant_bits.h's definitions and the device's fast forms); this file is
 * where a row's threads find a group's, a block's or a token's maximum and
 * store the codes and scales.
 */
#ifndef BEAMMOE_GPU_QUANT_ROW_CUH
#define BEAMMOE_GPU_QUANT_ROW_CUH

#include <stdint.h>

#include "params.cuh"
#include "quant.cuh"
#include "row_ops.cuh"

/* Eight E4M3 codes (uint2, the first in the low byte of x) at dst: one
 * 8-byte store (VEC), or byte by byte. */
template <bool VEC>
__device__ __forceinline__ void bm_store_e4m3(uint8_t *dst, const uint2 &codes)
{
    if (VEC) {
        *reinterpret_cast<uint2 *>(dst) = codes;
    } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            dst[e] = (uint8_t)(codes.x >> (8 * e));
            dst[e + 4] = (uint8_t)(codes.y >> (8 * e));
        }
    }
}

/* The quantized output's forms (lib/quant_forms.def's BM_QF lines), one
 * trait each: bm_form<QF>::row stores one row's codes and scales; exchanges
 * says whether it takes a cluster exchange after norm B (a token's
 * maximum: then norm B's exchange is not a kernel's last); wfirst whether
 * the decode row kernels load the norm weights before the reduction
 * (row_ops.cuh, bm_norm_stage). In row, v holds f(normalized) of the
 * thread's chunks c = g0 + j * STRIDE (c >= C: padding, +0), consecutive
 * chunks on consecutive lanes; every thread of the block (of every block
 * of the cluster) calls it; st false: compute, store nothing (a gather
 * block that failed); tc, last: the row's tree (a token's maximum across
 * the cluster), no exchange following in this kernel. */
template <int QF>
struct bm_form;

/* FP8 E4M3 with FP32 scales (docs/numerics.md#fp8): groups of 128 or 64
 * values are 16 or 8 chunks of consecutive lanes, so a group's maximum is
 * a warp reduction among them (bm_groups_max); a token's is the row's. */
template <>
struct bm_form<BM_QF_FP8> {
    static constexpr bool wfirst = true;
    __device__ __forceinline__ static bool exchanges(const bm_quant &q) { return q.kind == BEAM_QUANT_FP8_TOKEN; }

    template <int NT, int J, int CS, bool VEC, int STRIDE>
    __device__ __forceinline__ static void row(const bm_quant &q, int H, int64_t row, const float (&v)[J][8],
                                               int C, int g0, bm_tree_ctx<NT, CS> &tc, bool last, bool st)
    {
        float s = q.scale;
        if (q.kind == BEAM_QUANT_FP8_TOKEN) {
            float m = 0.0f;
#pragma unroll
            for (int j = 0; j < J; ++j)
                if (g0 + j * STRIDE < C)
                    m = fmaxf(m, bm_absmax8(v[j]));
            s = bm_fp8_token_scale(tc.max(m, last), q.ue8m0);
            if (st && g0 == 0)
                q.scales[row * q.ld_t] = s;
        }
        /* (a group's scale and reciprocal come per chunk, below) */
        float r = q.kind == BEAM_QUANT_FP8_GROUP ? 0.0f : bm_rcp_rn(s);
        /* the dynamic kinds' UE8M0 scales are powers of two: x * (1 / s) exact */
        const bool pow2 = q.ue8m0 != 0;
        /* a group is 16 or 8 chunks: shifts, not a division by a variable */
        const int lg = q.group == 128 ? 4 : 3;
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = g0 + j * STRIDE;
            if (q.kind == BEAM_QUANT_FP8_GROUP) {
                const float m = bm_absmax8(v[j]);
                s = bm_fp8_group_scale(lg == 4 ? bm_groups_max<16>(m) : bm_groups_max<8>(m), BM_FP8_GROUP_EPS,
                                       q.ue8m0);
                r = bm_rcp_rn(s);
                if (st && c < C && (c & ((1 << lg) - 1)) == 0)
                    q.scales[row * q.ld_t + (int64_t)(c >> lg) * q.ld_g] = s;
            }
            if (!st || c >= C)
                continue;
            bm_store_e4m3<VEC>(q.values + (size_t)row * H + (size_t)c * 8, bm_fp8_quant8(v[j], s, r, pow2));
        }
    }
};

/* The block-scaled forms' row: a block is CHUNKS chunks on consecutive
 * lanes, so its maximum is a warp reduction among them; each chunk takes
 * its block's scale code (F::code, every lane: the reduction is
 * collective), stores its values (F::store) and, on the block's first
 * chunk, the code at its tiled place (BEAM_BLOCK_SCALE_OFFSET). */
template <class F, int J, bool VEC, int STRIDE>
__device__ __forceinline__ void bm_block_row(const bm_quant &q, int H, int64_t row, const float (&v)[J][8],
                                             int C, int g0, bool st)
{
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int c = g0 + j * STRIDE;
        const uint32_t code = F::code(q, bm_absmax8(v[j]));
        if (!st || c >= C)
            continue;
        if (c % F::CHUNKS == 0)
            q.block_scales[BEAM_BLOCK_SCALE_OFFSET(row, c / F::CHUNKS, H / (8 * F::CHUNKS))] = (uint8_t)code;
        F::template store<VEC>(q, H, row, c, v[j], code);
    }
}

/* A form's trait members that only some forms change: no exchange after
 * norm B, and the row of a block-scaled form. */
template <class F>
struct bm_block_form {
    __device__ __forceinline__ static bool exchanges(const bm_quant &) { return false; }

    template <int NT, int J, int CS, bool VEC, int STRIDE>
    __device__ __forceinline__ static void row(const bm_quant &q, int H, int64_t row, const float (&v)[J][8],
                                               int C, int g0, bm_tree_ctx<NT, CS> &, bool, bool st)
    {
        bm_block_row<F, J, VEC, STRIDE>(q, H, row, v, C, g0, st);
    }
};

/* NVFP4 (docs/numerics.md#nvfp4): blocks of 16 values, two chunks on
 * adjacent lanes (their maximum one shuffle). os = g * (1 / value(sf)) is
 * a reciprocal and a multiply per chunk, not per value: the definition's
 * own two operations, with no division and no slow-path call. */
template <>
struct bm_form<BM_QF_NVFP4> : bm_block_form<bm_form<BM_QF_NVFP4>> {
    static constexpr bool wfirst = false;
    static constexpr int CHUNKS = 2;
    __device__ __forceinline__ static uint32_t code(const bm_quant &q, float m)
    {
        return bm_nvfp4_scale_code_dev(bm_lanes_max(m, 2), q.scale);
    }
    template <bool VEC>
    __device__ __forceinline__ static void store(const bm_quant &q, int H, int64_t row, int c, const float (&v)[8],
                                                 uint32_t sf)
    {
        /* its bm_rcp_rn is RN(1 / v) on [2^-126, 2^126): every nonzero E4M3 value */
        const uint32_t codes = bm_nvfp4_pack8(v, bm_nvfp4_factor(sf, q.scale));
        uint8_t *dst = q.values + (size_t)row * (H / 2) + (size_t)c * 4;
        if (VEC) {
            *reinterpret_cast<uint32_t *>(dst) = codes;
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e)
                dst[e] = (uint8_t)(codes >> (8 * e));
        }
    }
};

/* MXFP8 (docs/numerics.md#mxfp8): FP8 group 32 with UE8M0 scales, four
 * chunks a block; the code is the scale's exponent field. */
template <>
struct bm_form<BM_QF_MXFP8> : bm_block_form<bm_form<BM_QF_MXFP8>> {
    static constexpr bool wfirst = true;
    static constexpr int CHUNKS = 4;
    __device__ __forceinline__ static uint32_t code(const bm_quant &, float m)
    {
        return __float_as_uint(bm_fp8_group_scale(bm_groups_max<4>(m), BM_FP8_GROUP_EPS, 1)) >> 23;
    }
    template <bool VEC>
    __device__ __forceinline__ static void store(const bm_quant &q, int H, int64_t row, int c, const float (&v)[8],
                                                 uint32_t code)
    {
        const float s = __uint_as_float(code << 23);
        bm_store_e4m3<VEC>(q.values + (size_t)row * H + (size_t)c * 8, bm_fp8_quant8(v, s, bm_rcp_rn(s), true));
    }
};

/* bm_form<Q>::wfirst, false for the kernels without a quantized output */
template <int Q>
struct bm_wfirst {
    static constexpr bool value = bm_form<Q>::wfirst;
};
template <>
struct bm_wfirst<BM_QF_NONE> {
    static constexpr bool value = false;
};

/* The quantized output of one row (the kernel's form QF; bm_form above). */
template <int NT, int J, int CS, bool VEC, int STRIDE, int QF>
__device__ __forceinline__ void bm_quant_row(const bm_quant &q, int H, int64_t row,
                                             const float (&v)[J][8], int C, int g0,
                                             bm_tree_ctx<NT, CS> &tc, bool last, bool st = true)
{
    bm_form<QF>::template row<NT, J, CS, VEC, STRIDE>(q, H, row, v, C, g0, tc, last, st);
}

/* Whether the kernel's quantized output takes a cluster exchange after
 * norm B: then norm B's exchange is not a kernel's last. */
template <int Q, class P>
__device__ __forceinline__ bool bm_quant_exchanges(const P &p)
{
    if constexpr (Q)
        return bm_form<Q>::exchanges(p.q);
    return false;
}

/* Read the quantized output's parameters at kernel start (Q kernels):
 * they are the end of the parameter block, which the rest of the kernel
 * never reads, so their first read, in the row's tail after norm B, waited
 * for the constant cache each launch [2026-12-04-constants: touch]. Thread
 * 0 of each block stores a value made of every field into shared memory,
 * so that ptxas keeps the reads; the other warps of the multiprocessor
 * then find them cached. (The decode row kernel calls it; the gather
 * kernels do not.) */
template <int Q, class P>
__device__ __forceinline__ void bm_quant_touch(const P &p)
{
    if constexpr (Q) {
        __shared__ volatile int sink;
        const bm_quant &q = p.q;
        const int t = q.kind ^ q.group ^ q.ue8m0 ^ __float_as_int(q.scale) ^ (int)(uintptr_t)q.values ^
                      (int)(uintptr_t)q.scales ^ (int)q.ld_t ^ (int)q.ld_g ^ (int)(uintptr_t)q.block_scales;
        if (threadIdx.x == 0)
            sink = t;
    }
}

/* Norm B's output: the BF16 rows (when asked for) and the quantized form
 * (when asked for). pk: the thread's packed chunks, v: the same widened. Q:
 * the kernel was compiled with the quantized output (a kernel without it
 * holds no registers for it: the plain kernels stay as fast as before). */
template <int NT, int J, int CS, bool VEC, int STRIDE, int Q>
__device__ __forceinline__ void bm_out_normalized(const typename bm_kparams<Q>::type &p, int64_t row,
                                                  const bm_pack8 (&pk)[J], const float (&v)[J][8], int C, int g0,
                                                  bm_tree_ctx<NT, CS> &tc, bool last)
{
    if constexpr (Q) {
        if (p.normalized)
            bm_store_row<J, VEC, STRIDE>(p.normalized + (size_t)row * p.hidden, pk, C, g0);
        bm_quant_row<NT, J, CS, VEC, STRIDE, Q>(p.q, p.hidden, row, v, C, g0, tc, last);
    } else {
        bm_store_row<J, VEC, STRIDE>(p.normalized + (size_t)row * p.hidden, pk, C, g0);
    }
}

#endif
