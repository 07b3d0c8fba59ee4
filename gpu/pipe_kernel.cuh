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

#include "row_kernel.cuh"

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

template <int NT, int J, int D>
__global__ void __launch_bounds__(NT) bm_pipe_kernel(const bm_row_params p)
{
    __shared__ float red[2][NT];
    /* D stages of J x NT 16-byte slots, dynamic (above the 48 KB static limit) */
    extern __shared__ uint4 bm_pipe_ring[];
    uint4 (*ring)[J][NT] = reinterpret_cast<uint4 (*)[J][NT]>(bm_pipe_ring);
    int par = 0;
    const int C = p.hidden >> 3;
    const int H = p.hidden;
    const int K = p.experts ? p.top_k : 1;        /* stage-A items per row */
    const int n_items = K + (p.residual ? 1 : 0); /* residual comes last */
    const int lane = threadIdx.x & 31;
    const int t = threadIdx.x;

    bm_pdl_wait();
    bm_pdl_trigger();
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int c = t + j * NT;
        if (c >= C)
            continue;
        if (p.normA && p.wA)
            asm volatile("prefetch.global.L1 [%0];" ::"l"(p.wA + (size_t)c * 8));
        if (p.normB && p.wB)
            asm volatile("prefetch.global.L1 [%0];" ::"l"(p.wB + (size_t)c * 8));
    }

    /* issue one item's copies (or nothing past the last row) + commit */
    bm_pipe_cursor pc = {(int64_t)blockIdx.x, 0};
    int slot_in = 0;
    auto issue = [&]() {
        if (pc.row < p.rows) {
            const uint16_t *src;
            if (pc.item < K)
                src = p.experts ? p.experts + ((size_t)pc.row * K + pc.item) * (size_t)H
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
    /* take the next item: keep D-1 in flight, wait for the oldest */
    auto take = [&](float (&f)[J][8]) {
        issue();
        bm_cp_async_wait_group<D - 1>();
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const uint4 q = ring[slot_out][j][t];
            const bm_pack8 pk = {{q.x, q.y, q.z, q.w}};
            bm_unpack8(pk, f[j]);
        }
        slot_out = slot_out + 1 == D ? 0 : slot_out + 1;
    };

#pragma unroll
    for (int i = 0; i < D - 1; ++i)
        issue();

    float wl_next = 0.0f;
    if (p.experts && lane < K && (int64_t)blockIdx.x < p.rows)
        wl_next = __ldg(p.weights + (size_t)blockIdx.x * K + lane);

    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
        float v[J][8];
        float f[J][8];

        /* ---- stage A ---- */
        if (p.experts) {
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
                take(f);
#pragma unroll
                for (int j = 0; j < J; ++j)
#pragma unroll
                    for (int e = 0; e < 8; ++e)
                        v[j][e] = __fadd_rn(v[j][e], __fmul_rn(wk, f[j][e]));
            }
#pragma unroll
            for (int j = 0; j < J; ++j)
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    const uint32_t r = bm_bf16(v[j][e]);
                    v[j][e] = bm_f(bm_bf16(__fmul_rn(bm_f(r), p.routed_scale)));
                }
        } else {
            take(v);
        }
#pragma unroll
        for (int j = 0; j < J; ++j)
            if (t + j * NT >= C)
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    v[j][e] = 0.0f;

        /* ---- norm A ---- */
        if (p.normA) {
            bm_norm_row<NT, J, 1, true>(v, p.wA, p.epsA, H, C, t, red[par], nullptr);
            par ^= 1;
        }

        if (!p.residual) {
#pragma unroll
            for (int j = 0; j < J; ++j) {
                const int c = t + j * NT;
                if (c < C)
                    bm_store8<true>(p.out + (size_t)row * H + (size_t)c * 8, bm_round8(v[j]));
            }
            continue;
        }

        /* ---- stage B ---- */
        take(f);
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = t + j * NT;
            if (c >= C)
                continue;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                float bx = v[j][e], br = f[j][e];
                if (p.has_scales) {
                    bx = bm_f(bm_bf16(__fmul_rn(bx, p.scale_x)));
                    br = bm_f(bm_bf16(__fmul_rn(br, p.scale_r)));
                }
                v[j][e] = bm_f(bm_bf16(__fadd_rn(bx, br)));
            }
            bm_store8<true>(p.out + (size_t)row * H + (size_t)c * 8, bm_round8(v[j]));
        }

        /* ---- norm B ---- */
        if (p.normB) {
            bm_norm_row<NT, J, 1, true>(v, p.wB, p.epsB, H, C, t, red[par], nullptr);
            par ^= 1;
#pragma unroll
            for (int j = 0; j < J; ++j) {
                const int c = t + j * NT;
                if (c < C)
                    bm_store8<true>(p.normalized + (size_t)row * H + (size_t)c * 8,
                                    bm_round8(v[j]));
            }
        }
    }
    bm_cp_async_wait_group<0>();
}

#endif
