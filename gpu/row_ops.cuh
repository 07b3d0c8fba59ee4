/*
 * row_ops.cuh - the stages of a row, written once (internal).
 *
 * Every kernel of the CUDA backend is a schedule (where a row's bytes come
 * from, which threads hold which chunks, when they are loaded) around the
 * same stages of docs/numerics.md:
 *   slot      a = a + w[k] * f(x[k])               (finalize, k in order)
 *   finalize  s = bf16(f(bf16(a)) * routed_scale)
 *   norm      the RMSNorm of a row: chunk sums, the halving tree, 1/rms,
 *             u = bf16(v * inv), y = bf16(f(u) * f(w))
 *   residual  hidden = bf16(f(bx) + f(br)), with the optional scales
 * A thread holds its chunks of a row as float v[J][8] (eight consecutive
 * BF16 values widened exactly); a stage that rounds leaves the rounded
 * values widened in v and returns their BF16 bits packed (bm_pack8), ready
 * to store, so no value is rounded twice.
 *
 * Rounding uses the hardware conversion of two values at once
 * (bm_bf16x2): the per-element instruction count is what bounds the fused
 * op when the memory system is busy, and the conversion is one instruction
 * per pair instead of about six per value.
 */
#ifndef BEAMMOE_GPU_ROW_OPS_CUH
#define BEAMMOE_GPU_ROW_OPS_CUH

#include <stdint.h>

#include <cooperative_groups.h>

#include "numerics.cuh"

/* ---- rounding ----------------------------------------------------------- */

/* v <- f(bf16(v)) element by element; returns the BF16 bits. */
__device__ __forceinline__ bm_pack8 bm_rnd8(float (&v)[8])
{
    bm_pack8 p;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        p.w[i] = bm_bf16x2(v[2 * i], v[2 * i + 1]);
        v[2 * i] = __uint_as_float(p.w[i] << 16);
        v[2 * i + 1] = __uint_as_float(p.w[i] & 0xFFFF0000u);
    }
    return p;
}

/* ---- finalize ------------------------------------------------------------- */

/* a = a + w * f(x) for the eight values of one chunk of one slot. */
__device__ __forceinline__ void bm_slot8(float (&a)[8], const bm_pack8 &x, float w)
{
    float f[8];
    bm_unpack8(x, f);
#pragma unroll
    for (int e = 0; e < 8; ++e)
        a[e] = __fadd_rn(a[e], __fmul_rn(w, f[e]));
}

/* r = bf16(a); s = bf16(f(r) * scale). A scale of 1 is skipped: f(r) * 1
 * is f(r) exactly, NaN and signed zeros included. */
__device__ __forceinline__ bm_pack8 bm_finalize8(float (&a)[8], float scale)
{
    bm_pack8 p = bm_rnd8(a);
    if (scale != 1.0f) {
#pragma unroll
        for (int e = 0; e < 8; ++e)
            a[e] = __fmul_rn(a[e], scale);
        p = bm_rnd8(a);
    }
    return p;
}

/* ---- residual --------------------------------------------------------------- */

/* bx = scales ? bf16(f(x) * sx) : x; br = scales ? bf16(f(r) * sr) : r;
 * hidden = bf16(f(bx) + f(br)). v holds f(x) in, f(hidden) out. */
__device__ __forceinline__ bm_pack8 bm_residual8(float (&v)[8], const bm_pack8 &res,
                                                 int has_scales, float sx, float sr)
{
    float r[8];
    bm_unpack8(res, r);
    if (has_scales) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            v[e] = __fmul_rn(v[e], sx);
            r[e] = __fmul_rn(r[e], sr);
        }
        bm_rnd8(v);
        bm_rnd8(r);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e)
        v[e] = __fadd_rn(v[e], r[e]);
    return bm_rnd8(v);
}

/* ---- RMSNorm ---------------------------------------------------------------- */

/* The halving tree over N values held in a register array:
 * v[i] += v[i + s] for s = N/2 .. 1. A template recursion so that every
 * index is a compile-time constant (no local-memory array). */
template <int S>
__device__ __forceinline__ void bm_halving(float *v)
{
    if (S >= 1) {
#pragma unroll
        for (int i = 0; i < S; ++i)
            v[i] = __fadd_rn(v[i], v[i + S]);
        bm_halving<(S > 1 ? S / 2 : 0)>(v);
    }
}
template <>
__device__ __forceinline__ void bm_halving<0>(float *) {}

/* Sum of one value per thread, in tree order over the thread index; every
 * thread gets the result. red holds NT floats of shared memory; the caller
 * alternates two such buffers between consecutive calls, which is safe
 * because a call's barrier separates a buffer's reads from its next writes
 * two calls later. P[t] += P[t+s] for s = NT/2 .. 32 through shared memory
 * (every warp redoes that part, reading 32-strided values, so that no
 * second barrier is needed), then s = 16 .. 1 with __shfl_down_sync. */
template <int NT>
__device__ __forceinline__ float bm_block_tree(float q, float *red)
{
    constexpr int NW = NT / 32;
    const int lane = threadIdx.x & 31;
    if (NW > 1) {
        red[threadIdx.x] = q;
        __syncthreads();
        float v[NW];
#pragma unroll
        for (int i = 0; i < NW; ++i)
            v[i] = red[lane + 32 * i];
        bm_halving<NW / 2>(v);
        q = v[0];
    }
#pragma unroll
    for (int s = 16; s >= 1; s /= 2)
        q = __fadd_rn(q, __shfl_down_sync(0xFFFFFFFFu, q, s));
    return __shfl_sync(0xFFFFFFFFu, q, 0);
}

/* The thread's part of the tree: the chunk sums of its J chunks (padding
 * chunks hold +0), then the halving tree over them. Thread t's chunks all
 * share the low index bits, so this is the top of the tree. */
template <int J>
__device__ __forceinline__ float bm_sumsq_local(const float (&v)[J][8])
{
    float P[J];
#pragma unroll
    for (int j = 0; j < J; ++j)
        P[j] = bm_chunk_sumsq(v[j]);
    bm_halving<J / 2>(P);
    return P[0];
}

/* ---- the cluster exchange of decode shapes ----------------------------------
 *
 * A row spread over a cluster of CS blocks (virtual thread g = b*NT + t of
 * block b owns chunks g, g + CS*NT, ...) needs, before the block tree, the
 * cluster level of the tree: Q[b] += Q[b + s] across the blocks for the
 * same t. Each thread pushes its value into slot [b][t] of every block of
 * the cluster (st.async: a store into the peer's shared memory that counts
 * its bytes on the peer's mbarrier), then waits on its own block's
 * mbarrier until all CS*NT values have landed: one one-way trip per norm,
 * no cluster-wide barrier. Two buffers and two mbarriers alternate between
 * consecutive norms: a block pushes into buffer i again only after it
 * passed the wait of the norm in between, which needs every peer's push
 * of that norm, which each peer makes after it read buffer i. */
template <int NT, int CS>
struct bm_xchg {
    uint64_t bar[2];
    float buf[2][CS][NT];
};
template <int NT>
struct bm_xchg<NT, 1> { /* a block alone: nothing to exchange */
    char unused;
};

__device__ __forceinline__ uint32_t bm_smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* Before the first push: every block's mbarriers initialised. Start (at
 * kernel entry) arrives on the cluster barrier, ready waits on it. */
template <int NT, int CS>
__device__ __forceinline__ void bm_xchg_start(bm_xchg<NT, CS> &x)
{
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bm_smem_u32(&x.bar[0])) : "memory");
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bm_smem_u32(&x.bar[1])) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void bm_cluster_wait()
{
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
/* The exit barrier's arrive (bm_tree_ctx): relaxed, since what it stands
 * for, the block's own last exchange completed, is ordered by the mbarrier
 * wait before it, not by memory. A release here would also wait until the
 * block's earlier global stores (hidden, stored before norm B) are
 * performed at cluster scope: an L2 round trip on the decode kernels'
 * critical path. */
__device__ __forceinline__ void bm_cluster_arrive()
{
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

/* The cluster level of the tree for buffer i (phase: its parity bit); MAX:
 * the largest of the CS values instead (a token's quantization scale). g:
 * the thread's virtual index (its slot in the tree, bm_cluster_slot), or
 * -1 for b * NT + t; the value lands in slot g of every block's buffer,
 * and each thread then takes slots t, NT + t, ... (-1 rather than that
 * index itself: passed as a number, it changed the instructions of every
 * kernel that keeps b * NT + t, the row kernels of 64 and 128 threads and
 * the tensor-parallel ones, by cuobjdump, and such a build ran slower
 * [2026-12-04-constants: even]) */
template <int NT, int CS, bool MAX = false>
__device__ __forceinline__ float bm_xchg_sum(bm_xchg<NT, CS> &x, int i, uint32_t phase, float q, int g)
{
    const uint32_t me = (uint32_t)(blockIdx.x % CS);
    const uint32_t slot = bm_smem_u32(g >= 0 ? &x.buf[i][0][0] + g : &x.buf[i][me][threadIdx.x]);
    const uint32_t bar = bm_smem_u32(&x.bar[i]);
    if (threadIdx.x == 0)
        asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
                     "r"((uint32_t)(CS * NT * 4))
                     : "memory");
#pragma unroll
    for (int r = 0; r < CS; ++r) {
        uint32_t rs, rb;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rs) : "r"(slot), "r"(r));
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rb) : "r"(bar), "r"(r));
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(rs),
                     "r"(__float_as_uint(q)), "r"(rb)
                     : "memory");
    }
    asm volatile("{\n"
                 ".reg .pred done;\n"
                 "wait:\n"
                 "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra wait;\n"
                 "}\n" ::"r"(bar),
                 "r"(phase)
                 : "memory");
    float qb[CS];
#pragma unroll
    for (int b = 0; b < CS; ++b)
        qb[b] = x.buf[i][b][threadIdx.x];
    if constexpr (MAX) {
#pragma unroll
        for (int b = 1; b < CS; ++b)
            qb[0] = fmaxf(qb[0], qb[b]);
    } else {
        bm_halving<CS / 2>(qb);
    }
    return qb[0];
}

/* The virtual index g of this thread in a row spread over a cluster of CS
 * blocks of NT threads, one chunk a thread: the row's C chunks split
 * evenly, R = C / CS rounded up to a whole warp, chunk g = b * R + t for
 * t < R (b: the block's rank in the cluster); the threads beyond hold the
 * padding slots up to CS * NT, which the tree adds as +0. The tree runs
 * over the slots (bm_xchg_sum puts each thread's value in slot g), so
 * which thread holds which slot changes no bit. With g = b * NT + t a row
 * of 896 chunks (H = 7168) put 512 in block 0 and 384 in block 1, and each
 * norm waited for block 0's share. R a multiple of 32 keeps a warp's
 * chunks consecutive, a quantization group's (16 or 8 chunks) on aligned
 * lanes and an NVFP4 block's pair on an even lane. */
template <int NT, int CS>
__device__ __forceinline__ int bm_cluster_slot(int C, int b)
{
    const int t = (int)threadIdx.x;
    if constexpr (CS == 1) {
        return t;
    } else {
        int r = ((C + CS - 1) / CS + 31) & ~31;
        if (r > NT)
            r = NT;
        return t < r ? b * r + t : CS * r + b * (NT - r) + (t - r);
    }
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

/* the maximum over aligned groups of G lanes of a warp (G = 8, 16 or 32)
 * of a non-negative m that is not a NaN (bm_absmax8's). Such floats order
 * as their bits, so the maximum is the integer one, which redux.sync takes
 * over the warp in one instruction: one per group, each lane keeping its
 * own group's, where bm_lanes_max takes log2(G) dependent shuffles
 * [2026-12-04-constants: redux]. Every lane of the warp must call it. */
template <int G>
__device__ __forceinline__ float bm_groups_max(float m)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const uint32_t lane = threadIdx.x & 31u, b = __float_as_uint(m);
    uint32_t r = 0u;
#pragma unroll
    for (int g = 0; g < 32; g += G) {
        const bool in = lane - (uint32_t)g < (uint32_t)G;
        const uint32_t x = __reduce_max_sync(0xFFFFFFFFu, in ? b : 0u);
        r = in ? x : r;
    }
    return __uint_as_float(r);
#else
    return bm_lanes_max(m, G);
#endif
}

/* the maximum over the NT threads of a block of m >= 0, not a NaN (as
 * bm_groups_max's); every thread gets it. Two
 * barriers: the first keeps a warp from overwriting the buffer while
 * another still reads the previous row's maxima (a gather's copied rows
 * pass no other barrier in between). */
template <int NT>
__device__ __forceinline__ float bm_block_max(float m)
{
    m = bm_groups_max<32>(m);
    if (NT > 32) {
        __shared__ float qred[NT / 32 > 0 ? NT / 32 : 1];
        __syncthreads();
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

/* Where a norm stage takes the levels of the tree above a thread: the
 * block (CS == 1) or the cluster exchange, then the block. Keeps the
 * alternation of the block-tree buffers and of the exchange buffers. */
template <int NT, int CS>
struct bm_tree_ctx {
    float (*red)[NT];     /* [2][NT] shared */
    bm_xchg<NT, CS> *xc;  /* CS > 1 */
    int par;
    uint32_t phase;       /* parity bit per exchange buffer */
    int ready;            /* the cluster barrier of bm_xchg_start passed */

    int left;             /* arrived on the exit barrier (see finish) */
    int slot;             /* the thread's virtual index, -1: b * NT + t */

    /* last: no exchange follows in this kernel. Then the block arrives on
     * the cluster barrier that finish waits for: a block may exit only
     * when its pushes into its peers have landed, which every peer has
     * seen once it arrives there after its own last exchange. */
    __device__ __forceinline__ float sum(float q, bool last)
    {
        /* the exchange written out, not cluster<false>: the same
         * operations, but LLVM then orders two predicates differently and
         * ptxas allocates the plain row kernels differently, slower
         * [2026-12-04-constants: exchange] */
        if constexpr (CS > 1) {
            if (!ready) {
                bm_cluster_wait();
                ready = 1;
            }
            q = bm_xchg_sum<NT, CS>(*xc, par, (phase >> par) & 1u, q, slot);
            phase ^= 1u << par;
            if (last) {
                bm_cluster_arrive();
                left = 1;
            }
        }
        q = bm_block_tree<NT>(q, red[par]);
        par ^= 1;
        return q;
    }

    /* The largest m of the row's threads (every thread gets it), for a
     * token's quantization scale: the same exchange, then the block's
     * maximum (exact in any order). */
    __device__ __forceinline__ float max(float m, bool last)
    {
        m = cluster<true>(m, last);
        m = bm_block_max<NT>(m);
        par ^= 1;
        return m;
    }

    template <bool MAX>
    __device__ __forceinline__ float cluster(float q, bool last)
    {
        if constexpr (CS > 1) {
            if (!ready) {
                bm_cluster_wait();
                ready = 1;
            }
            q = bm_xchg_sum<NT, CS, MAX>(*xc, par, (phase >> par) & 1u, q, slot);
            phase ^= 1u << par;
            if (last) {
                bm_cluster_arrive();
                left = 1;
            }
        }
        return q;
    }

    /* At kernel exit (every thread): pair the barrier phases opened. */
    __device__ __forceinline__ void finish()
    {
        if constexpr (CS > 1) {
            if (!ready)
                bm_cluster_wait();
            if (!left)
                bm_cluster_arrive();
            bm_cluster_wait();
        }
    }
};

/* u = bf16(v * inv); y = w ? bf16(f(u) * f(w)) : u, for one chunk. */
__device__ __forceinline__ bm_pack8 bm_norm_apply8(float (&v)[8], float inv, int has_w,
                                                   const bm_pack8 &w)
{
#pragma unroll
    for (int e = 0; e < 8; ++e)
        v[e] = __fmul_rn(v[e], inv);
    bm_pack8 p = bm_rnd8(v);
    if (has_w) {
        float wf[8];
        bm_unpack8(w, wf);
#pragma unroll
        for (int e = 0; e < 8; ++e)
            v[e] = __fmul_rn(v[e], wf[e]);
        p = bm_rnd8(v);
    }
    return p;
}

/* The thread's J chunks c = g0 + j * STRIDE of one norm weight row into
 * registers (zero for padding chunks and for no weight, w NULL). */
template <int J, bool VEC, int STRIDE>
__device__ __forceinline__ void bm_weight_chunks(bm_pack8 (&wp)[J], const uint16_t *w, int C, int g0)
{
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int c = g0 + j * STRIDE;
        wp[j] = bm_pack8{{0u, 0u, 0u, 0u}};
        if (w && c < C)
            wp[j] = bm_load8<VEC>(w + (size_t)c * 8);
    }
}

/* The squares' sum of the thread's chunks held packed: the same chunk sums
 * and halving tree as bm_sumsq_local on the widened values. */
template <int J>
__device__ __forceinline__ float bm_sumsq_packed(const bm_pack8 (&h)[J])
{
    float P[J];
#pragma unroll
    for (int j = 0; j < J; ++j) {
        float f[8];
        bm_unpack8(h[j], f);
        P[j] = bm_chunk_sumsq(f);
    }
    bm_halving<J / 2>(P);
    return P[0];
}

/* The whole norm of a row (bm_norm_stage, below) with the thread's weight
 * chunks already in registers: wp, zero where has_w is false. Each
 * normalized chunk j (c < C) goes to emit(j, bits) as soon as it is
 * computed, v[j] then holding its values widened: the caller stores it,
 * keeps it, or both (a kernel that stores each chunk at once holds fewer
 * registers than one that collects the row). */
template <int NT, int J, int CS, int STRIDE, class Emit>
__device__ __forceinline__ void bm_norm_stage_emit(float (&v)[J][8], const bm_pack8 (&wp)[J], bool has_w,
                                                   float eps, int hidden, int C, int g0,
                                                   bm_tree_ctx<NT, CS> &tc, bool last, Emit emit)
{
    const float inv = bm_inv_rms(tc.sum(bm_sumsq_local<J>(v), last), hidden, eps);
#pragma unroll
    for (int j = 0; j < J; ++j)
        if (g0 + j * STRIDE < C)
            emit(j, bm_norm_apply8(v[j], inv, has_w, wp[j]));
}

/* ... the BF16 bits of the normalized chunks into out */
template <int NT, int J, int CS, int STRIDE>
__device__ __forceinline__ void bm_norm_stage_held(float (&v)[J][8], bm_pack8 (&out)[J],
                                                   const bm_pack8 (&wp)[J], bool has_w, float eps,
                                                   int hidden, int C, int g0,
                                                   bm_tree_ctx<NT, CS> &tc, bool last)
{
    bm_norm_stage_emit<NT, J, CS, STRIDE>(v, wp, has_w, eps, hidden, C, g0, tc, last,
                                          [&](int j, const bm_pack8 &y) { out[j] = y; });
}

/* The packed form: the row held as BF16 bits h (every value a stage leaves
 * is rounded to BF16, so the bits are all a row needs between stages);
 * each chunk widened where it is used. The same sums, tree and rounding as
 * the float form; emit(j, bits) as there, with no widened values kept. */
template <int NT, int J, int CS, int STRIDE, class Emit>
__device__ __forceinline__ void bm_norm_stage_packed(const bm_pack8 (&h)[J], const bm_pack8 (&wp)[J],
                                                     bool has_w, float eps, int hidden, int C, int g0,
                                                     bm_tree_ctx<NT, CS> &tc, bool last, Emit emit)
{
    const float inv = bm_inv_rms(tc.sum(bm_sumsq_packed<J>(h), last), hidden, eps);
#pragma unroll
    for (int j = 0; j < J; ++j) {
        if (g0 + j * STRIDE >= C)
            continue;
        float f[8];
        bm_unpack8(h[j], f);
        emit(j, bm_norm_apply8(f, inv, has_w, wp[j]));
    }
}

/* The whole norm of a row held by a block (or a cluster of CS blocks):
 * v <- f(N(v, w, eps)) for the thread's J chunks, the BF16 bits in out.
 * Chunk j of the thread is c = g0 + j * STRIDE; chunks c >= C are padding
 * (+0 in v, never loaded or stored). w: the norm weight row, or NULL.
 * WFIRST: the weights are loaded before the reduction (their latency
 * behind it, their registers held across it) instead of after it: of the
 * decode kernels only the FP8 ones gain from it and ask for it
 * [2026-12-04-constants: wfirst]; the pipelined kernel does where it
 * cannot hold the weights (pipe_kernel.cuh). held: the thread's weight
 * chunks where the kernel holds them for all its rows (bm_weight_chunks
 * before its first row), else NULL. */
template <int NT, int J, int CS, bool VEC, int STRIDE, bool WFIRST = false>
__device__ __forceinline__ void bm_norm_stage(float (&v)[J][8], bm_pack8 (&out)[J],
                                              const uint16_t *w, float eps, int hidden,
                                              int C, int g0, bm_tree_ctx<NT, CS> &tc,
                                              bool last, const bm_pack8 (*held)[J] = nullptr)
{
    if (held) {
        bm_norm_stage_held<NT, J, CS, STRIDE>(v, out, *held, w != NULL, eps, hidden, C, g0, tc, last);
    } else if constexpr (WFIRST) {
        bm_pack8 wp[J];
        bm_weight_chunks<J, VEC, STRIDE>(wp, w, C, g0);
        bm_norm_stage_held<NT, J, CS, STRIDE>(v, out, wp, w != NULL, eps, hidden, C, g0, tc, last);
    } else {
        const float sum = tc.sum(bm_sumsq_local<J>(v), last);
        const float inv = bm_inv_rms(sum, hidden, eps);
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = g0 + j * STRIDE;
            if (c >= C)
                continue;
            bm_pack8 wp = {{0u, 0u, 0u, 0u}};
            if (w)
                wp = bm_load8<VEC>(w + (size_t)c * 8);
            out[j] = bm_norm_apply8(v[j], inv, w != NULL, wp);
        }
    }
}

/* ---- the row's memory ---------------------------------------------------------- */

/* The norm weights are the same for every row: pull the thread's chunks
 * into L1 at kernel start, while the first row's loads are in flight (no
 * registers held). wA, wB: NULL when that norm has no weight or is off. */
template <int J, int STRIDE>
__device__ __forceinline__ void bm_prefetch_weights(const uint16_t *wA, const uint16_t *wB, int C,
                                                    int g0)
{
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int c = g0 + j * STRIDE;
        if (c >= C)
            continue;
        if (wA)
            asm volatile("prefetch.global.L1 [%0];" ::"l"(wA + (size_t)c * 8));
        if (wB)
            asm volatile("prefetch.global.L1 [%0];" ::"l"(wB + (size_t)c * 8));
    }
}

/* Store the thread's chunks of one row (row: the row's first element). */
template <int J, bool VEC, int STRIDE>
__device__ __forceinline__ void bm_store_row(uint16_t *row, const bm_pack8 (&pk)[J], int C, int g0)
{
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int c = g0 + j * STRIDE;
        if (c < C)
            bm_store8<VEC>(row + (size_t)c * 8, pk[j]);
    }
}

/* Request `bytes` at p (16-byte aligned, a multiple of 16) into L2: one
 * bulk prefetch by the calling thread, no registers, nothing waits on it. */
__device__ __forceinline__ void bm_prefetch_l2(const void *p, uint32_t bytes)
{
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

/* ---- finalize's expert slots ------------------------------------------------ */

/* a = +0; a = a + w[k] * f(x[k]) for k in order, for U slots at a time
 * (all U*J loads are issued before the first use). The __syncwarp between
 * the loads and the sums is what keeps them so: ptxas moves a load down to
 * its first use when it judges registers short, and may not move one past
 * a warp barrier (which orders the lanes' memory accesses)
 * [2026-12-04-constants: slots]. The weights are plain loads: as __ldg
 * (ld.global.nc) ptxas issued them one slot at a time even so. */
template <int NT, int J, int U, int CS, bool VEC>
__device__ __forceinline__ void bm_finalize_slots(float (&acc)[J][8],
                                                  const uint16_t *xr,
                                                  const float *wr, int k,
                                                  int hidden, int C, int g0)
{
    bm_pack8 ld[U][J];
    float wk[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        wk[u] = wr[k + u];
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = g0 + j * CS * NT;
            if (c < C)
                ld[u][j] = bm_load8_stream<VEC>(xr + (size_t)(k + u) * hidden +
                                                (size_t)c * 8);
        }
    }
    __syncwarp();
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = g0 + j * CS * NT;
            if (c >= C)
                continue;
            bm_slot8(acc[j], ld[u][j], wk[u]);
        }
}

/* ---- launch order ------------------------------------------------------------- */

/* Programmatic dependent launch: wait until the preceding kernel of the
 * stream has completed (and its writes are visible) before touching global
 * memory, and let the next kernel's blocks be scheduled early. Both are
 * no-ops when the launch did not ask for it. */
__device__ __forceinline__ void bm_pdl_wait()
{
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
__device__ __forceinline__ void bm_pdl_trigger()
{
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

#endif
