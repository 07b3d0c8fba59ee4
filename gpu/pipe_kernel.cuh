/*
 * pipe_kernel.cuh - the prefill (many rows) version of the row kernel
 * (internal): same arithmetic as row_kernel.cuh, different memory schedule.
 *
 * Why: the row kernel holds every load in registers, so the bytes in flight
 * per multiprocessor are bounded by registers, and between a row's last load
 * and the next row's first one (reductions, stores) nothing is in flight at
 * all. Here each block walks its rows (a persistent grid) as one stream of
 * "items" (one expert slot k of a row, the row x, the residual row), and
 * every thread keeps the next D-1 items of its own chunks in flight with
 * asynchronous global->shared copies (cp.async, one commit group per item)
 * while it computes the current one; the copies of the next row are under
 * way while the block reduces the current one. Each thread copies and reads
 * only its own shared-memory slots, so the ring needs no barrier at all, only
 * cp.async.wait_group.
 *
 * Routing weights: lane l of every warp loads w[row][l] (top_k <= 32) one row
 * ahead; slot k's weight is a __shfl_sync away.
 *
 * Shared memory: D * J * NT * 16 bytes of dynamic shared memory (the
 * launcher raises the kernel's limit once); the grid is persistent, one
 * wave of resident blocks.
 *
 * Vector path only (every BF16 base 16-byte aligned, which cp.async needs);
 * clusters are not used here.
 */
#ifndef BEAMMOE_GPU_PIPE_KERNEL_CUH
#define BEAMMOE_GPU_PIPE_KERNEL_CUH

#include "params.cuh"
#include "quant_row.cuh"
#include "row_ops.cuh"

__device__ __forceinline__ void bm_cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void bm_cp_async_wait_group()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* The producer side: which item comes next for this block. */
struct bm_pipe_cursor {
    int64_t row;
    int item; /* 0 .. n_items-1 within the row */
};

template <int NT, int J, int D, int MB, bool FIN, int Q>
__global__ void __launch_bounds__(NT, MB > 1 ? MB : 0) bm_pipe_kernel(const typename bm_kparams<Q>::type p)
{
    __shared__ float red[2][NT];
    bm_tree_ctx<NT, 1> tc = {red, nullptr, 0, 0u, 0, 0, -1};
    /* D stages of J x NT 16-byte slots, dynamic (above the 48 KB static limit) */
    extern __shared__ uint4 bm_pipe_ring[];
    uint4 (*ring)[J][NT] = reinterpret_cast<uint4 (*)[J][NT]>(bm_pipe_ring);
    const int C = p.hidden >> 3;
    const int H = p.hidden;
    const int K = FIN ? p.top_k : 1;              /* stage-A items per row */
    const int n_items = K + (p.residual ? 1 : 0); /* residual comes last */
    const int lane = threadIdx.x & 31;
    const int t = threadIdx.x;

    bm_pdl_wait();
    bm_pdl_trigger();
    /* The norm weights of the thread's chunks are the same for every row
     * of the block: held in registers from kernel start (HOLD) where a
     * block covers at most 512 chunks (H <= 4096) and asks the compiler
     * for no minimum of resident blocks, else loaded before each
     * reduction (from L1, prefetched here), so that their latency hides
     * behind it. Either way not after the reduction, on the row's chain
     * of dependent steps, where they cost the post-norm configurations 3-6
     * points of the floor [2026-12-04-constants: hold]. */
    constexpr bool HOLD = NT * J <= 512 && MB <= 1;
    bm_pack8 wAr[J], wBr[J]; /* unused unless HOLD */
    if constexpr (HOLD) {
        bm_weight_chunks<J, true, NT>(wAr, p.normA ? p.wA : NULL, C, t);
        bm_weight_chunks<J, true, NT>(wBr, p.normB ? p.wB : NULL, C, t);
    } else {
        bm_prefetch_weights<J, NT>(p.normA ? p.wA : NULL, p.normB ? p.wB : NULL, C, t);
    }

    /* issue one item's copies (or nothing past the last row) + commit */
    bm_pipe_cursor pc = {(int64_t)blockIdx.x, 0};
    int slot_in = 0;
    auto issue = [&]() {
        if (pc.row < p.rows) {
            const uint16_t *src;
            if (pc.item < K)
                src = FIN ? p.experts + ((size_t)pc.row * K + pc.item) * (size_t)H
                                : p.x + (size_t)pc.row * H;
            else
                src = p.residual + (size_t)pc.row * H;
#pragma unroll
            for (int j = 0; j < J; ++j) {
                const int c = t + j * NT;
                if (c < C)
                    bm_cp_async16(&ring[slot_in][j][t], src + (size_t)c * 8);
            }
            if (++pc.item == n_items) {
                pc.item = 0;
                pc.row += gridDim.x;
            }
        }
        bm_cp_async_commit();
        slot_in = slot_in + 1 == D ? 0 : slot_in + 1;
    };
    int slot_out = 0;
    /* take the next item: keep D-1 in flight, wait for the oldest; returns
     * its ring slot (chunk j of this thread: at(slot, j)) */
    auto take = [&]() {
        issue();
        bm_cp_async_wait_group<D - 1>();
        const int s = slot_out;
        slot_out = slot_out + 1 == D ? 0 : slot_out + 1;
        return s;
    };
    auto at = [&](int s, int j) {
        const uint4 q = ring[s][j][t];
        return bm_pack8{{q.x, q.y, q.z, q.w}};
    };

#pragma unroll
    for (int i = 0; i < D - 1; ++i)
        issue();

    float wl_next = 0.0f;
    if (FIN && lane < K && (int64_t)blockIdx.x < p.rows)
        wl_next = __ldg(p.weights + (size_t)blockIdx.x * K + lane);

    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
        float v[J][8];
        bm_pack8 pk[J];

        /* ---- stage A ---- */
        if (FIN) {
            const float wl = wl_next;
            const int64_t nxt = row + gridDim.x;
            if (lane < K && nxt < p.rows)
                wl_next = __ldg(p.weights + (size_t)nxt * K + lane);
#pragma unroll
            for (int j = 0; j < J; ++j)
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    v[j][e] = 0.0f; /* a = +0.0 */
            for (int k = 0; k < K; ++k) {
                const float wk = __shfl_sync(0xFFFFFFFFu, wl, k);
                const int s = take();
#pragma unroll
                for (int j = 0; j < J; ++j)
                    pk[j] = at(s, j);
#pragma unroll
                for (int j = 0; j < J; ++j)
                    bm_slot8(v[j], pk[j], wk);
            }
#pragma unroll
            for (int j = 0; j < J; ++j)
                pk[j] = bm_finalize8(v[j], p.routed_scale);
        } else {
            const int s = take();
#pragma unroll
            for (int j = 0; j < J; ++j) {
                pk[j] = at(s, j);
                bm_unpack8(pk[j], v[j]);
            }
        }
#pragma unroll
        for (int j = 0; j < J; ++j)
            if (t + j * NT >= C)
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    v[j][e] = 0.0f;

        /* ---- norm A ---- */
        if (p.normA)
            bm_norm_stage<NT, J, 1, true, NT, true>(v, pk, p.wA, p.epsA, H, C, t, tc, false, HOLD ? &wAr : nullptr);

        if (!p.residual) {
            bm_store_row<J, true, NT>(p.out + (size_t)row * H, pk, C, t);
            continue;
        }

        /* ---- stage B ---- */
        bm_pack8 r[J];
        const int rs = take();
#pragma unroll
        for (int j = 0; j < J; ++j)
            r[j] = at(rs, j);
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = t + j * NT;
            if (c >= C)
                continue;
            pk[j] = bm_residual8(v[j], r[j], p.has_scales, p.scale_x, p.scale_r);
            bm_store8<true>(p.out + (size_t)row * H + (size_t)c * 8, pk[j]);
        }

        /* ---- norm B ---- */
        if (p.normB) {
            bm_norm_stage<NT, J, 1, true, NT, true>(v, pk, p.wB, p.epsB, H, C, t, tc, false, HOLD ? &wBr : nullptr);
            bm_out_normalized<NT, J, 1, true, NT, Q>(p, row, pk, v, C, t, tc, false);
        }
    }
    bm_cp_async_wait_group<0>();
}

#endif
