/*
 * launch_pipe.cu - the pipelined kernel's shapes (launch_shapes.h:
 * BM_PIPES): prefill rows on the vector path.
 */
#include <atomic>

#include "launch_shapes.h"
#include "pipe_kernel.cuh"

/* The pipelined kernel: its dynamic shared memory limit raised once per
 * device, and a persistent grid of one wave (multiprocessors x resident
 * blocks from the occupancy API), both cached per device (host-side
 * attribute calls, not stream work: legal during graph capture). */
template <int NT, int J, int D, int MB, bool FIN, int Q>
static cudaError_t bm_go_pipe(const typename bm_kparams<Q>::type &p, int pdl, cudaStream_t stream)
{
    enum { MAX_DEV = 64 };
    static std::atomic<int> wave[MAX_DEV];
    const size_t smem = (size_t)D * J * NT * 16;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess)
        return e;
    if (dev < 0 || dev >= MAX_DEV)
        return cudaErrorInvalidDevice;
    int w = wave[dev].load(std::memory_order_relaxed);
    if (w == 0) {
        int per_sm = 0;
        e = cudaFuncSetAttribute(bm_pipe_kernel<NT, J, D, MB, FIN, Q>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e == cudaSuccess)
            e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, bm_pipe_kernel<NT, J, D, MB, FIN, Q>,
                                                              NT, smem);
        if (e != cudaSuccess)
            return e;
        w = bm_device_sms() * (per_sm > 0 ? per_sm : 1);
        wave[dev].store(w, std::memory_order_relaxed);
    }
    const int64_t grid = p.rows < (int64_t)w ? p.rows : (int64_t)w;
    return bm_launch(bm_pipe_kernel<NT, J, D, MB, FIN, Q>, p, (unsigned)grid, NT, 1, smem, pdl, stream);
}

/* ... finalize or not, with the kernels of the call's form */
template <int NT, int J, int D, int MB>
static cudaError_t bm_go_pipe_fin(const bm_row_params_q &pq, int pdl, cudaStream_t stream)
{
    return bm_with_form(pq.q.kind, [&](auto qf) {
        constexpr int Q = decltype(qf)::value;
        return pq.experts ? bm_go_pipe<NT, J, D, MB, true, Q>(bm_kp<Q>(static_cast<const bm_row_params &>(pq), pq), pdl, stream)
                          : bm_go_pipe<NT, J, D, MB, false, Q>(bm_kp<Q>(static_cast<const bm_row_params &>(pq), pq), pdl, stream);
    });
}

cudaError_t bm_launch_pipe_family(const bm_row_params_q &pq, bm_shape s, cudaStream_t stream)
{
#define BM_PGO(NT, J, D, MB)                                                      \
    if (s.nt == NT && s.j == J && s.d == D && s.mb == MB)                     \
        return bm_go_pipe_fin<NT, J, D, MB>(pq, s.pdl, stream);
    BM_PIPES(BM_PGO)
#undef BM_PGO
    return cudaErrorInvalidConfiguration;
}

cudaError_t bm_preload_pipe(void)
{
#define BM_PRE_PIPE(NT, J, D, MB)                                                     \
    bm_each_form([&](auto qf) {                                                       \
        constexpr int Q = decltype(qf)::value;                                        \
        pre(bm_pipe_kernel<NT, J, D, MB, true, Q>);                                   \
        pre(bm_pipe_kernel<NT, J, D, MB, false, Q>);                                  \
    });
    BM_PRELOAD_FAMILY(BM_PIPES, BM_PRE_PIPE)
#undef BM_PRE_PIPE
}
