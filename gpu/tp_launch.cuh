/*
 * tp_launch.cuh - the host side that the peer-memory kernel families (the
 * gather's, gather_fused.cu; the all-reduce's, allreduce_fused.cu) share
 * (internal, C++): the launch by shape of BM_TP_SHAPES, quantized form,
 * alignment and strategy, the preload, and the occupancy that the caps
 * take. A family F names its kernels: F::kernel<NT, J, CS, VEC, V, Q>(),
 * V its variant, 0 .. F::NV - 1 (the gather's: ONESHOT, TWOSHOT; the
 * all-reduce's: gpu/allreduce_fused.cu's bm_ar_family).
 */
#ifndef BEAMMOE_GPU_TP_LAUNCH_CUH
#define BEAMMOE_GPU_TP_LAUNCH_CUH

#include <stdint.h>

#include <type_traits>

#include "gather_stages.cuh"
#include "launch.h"

/* blocks per row (a cluster) of a shape */
inline int bm_tp_cs(int shape)
{
#define BM_CS(I, NT, J, CS) \
    if (shape == I) return CS;
    BM_TP_SHAPES(BM_CS)
#undef BM_CS
    return 1;
}

/* Whether a launch takes the vector loads and stores: every array 16-byte
 * aligned, and the quantized values as bm_quant_vec_ok says (8 bytes per
 * chunk, NVFP4 4). */
inline int bm_tp_vec(const bm_tp_params_q &pq)
{
    const void *ptrs[] = {pq.experts, pq.x, pq.wA, pq.residual, pq.wB, pq.out, pq.normalized};
    for (const void *q : ptrs)
        if (q && ((uintptr_t)q & 15u) != 0)
            return 0;
    return !pq.q.kind || bm_quant_vec_ok(pq.q);
}

/* f(v) for variant v of F, v a compile-time constant (a bad v: variant 0) */
template <class F, int V = F::NV - 1, class G>
inline auto bm_tp_with_variant(int v, G &&f) -> decltype(f(std::integral_constant<int, 0>()))
{
    if constexpr (V > 0)
        if (v != V)
            return bm_tp_with_variant<F, V - 1>(v, f);
    return f(std::integral_constant<int, V>());
}

/* f(v) for every variant v of F */
template <class F, class G>
inline void bm_tp_each_variant(G &&f)
{
    for (int v = 0; v < F::NV; ++v)
        bm_tp_with_variant<F>(v, [&](auto vc) { f(vc); return 0; });
}

/* F's kernel of shape, pq.q's form, the alignment and the variant, over
 * `groups` row groups (clusters of CS blocks), with programmatic dependent
 * launch. */
template <class F>
cudaError_t bm_tp_launch_family(int shape, const bm_tp_params_q &pq, int variant, unsigned groups,
                                cudaStream_t stream)
{
    const int vec = bm_tp_vec(pq);
    const bm_tp_params &p = pq;
#define BM_GO(I, NT, J, CS)                                                                              \
    if (shape == I)                                                                                      \
        return bm_with_form(pq.q.kind, [&](auto qf) {                                                    \
            constexpr int Q = decltype(qf)::value;                                                       \
            const typename bm_tp_kparams<Q>::type &k = bm_kp<Q>(p, pq);                                  \
            auto go = [&](auto kernel) { return bm_launch(kernel, k, groups * CS, NT, CS, 0, 1, stream); }; \
            return bm_tp_with_variant<F>(variant, [&](auto vc) {                                         \
                constexpr int V = decltype(vc)::value;                                                   \
                return vec ? go(F::template kernel<NT, J, CS, true, V, Q>())                             \
                           : go(F::template kernel<NT, J, CS, false, V, Q>());                           \
            });                                                                                          \
        });
    BM_TP_SHAPES(BM_GO)
#undef BM_GO
    return cudaErrorInvalidConfiguration;
}

/* Load every kernel of F (see bm_preload_rows); the first error into e. */
template <class F>
void bm_tp_preload_family(cudaError_t &e)
{
#define BM_PRE(I, NT, J, CS)                                                  \
    bm_each_form([&](auto qf) {                                               \
        constexpr int Q = decltype(qf)::value;                                \
        bm_tp_each_variant<F>([&](auto vc) {                                  \
            constexpr int V = decltype(vc)::value;                            \
            bm_preload(e, F::template kernel<NT, J, CS, true, V, Q>());       \
            bm_preload(e, F::template kernel<NT, J, CS, false, V, Q>());      \
        });                                                                   \
    });
    BM_TP_SHAPES(BM_PRE)
#undef BM_PRE
}

/* The fewest blocks of F's kernels of a shape (every variant, both
 * alignments; q: every form with a quantized output, else the plain ones)
 * resident on one multiprocessor; 0 when the runtime cannot tell. */
template <class F>
int bm_tp_family_occupancy(int shape, bool q)
{
    int per = -1;
    cudaError_t e = cudaSuccess;
    auto occ = [&](auto kernel, int nt) {
        int a = 0;
        if (e == cudaSuccess)
            e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&a, kernel, nt, 0);
        per = per < 0 || a < per ? a : per;
    };
#define BM_OCC(I, NT, J, CS)                                                  \
    if (shape == I)                                                           \
        bm_each_form([&](auto qf) {                                           \
            constexpr int Q = decltype(qf)::value;                            \
            if ((Q != BM_QF_NONE) == q)                                       \
                bm_tp_each_variant<F>([&](auto vc) {                          \
                    constexpr int V = decltype(vc)::value;                    \
                    occ(F::template kernel<NT, J, CS, true, V, Q>(), NT);     \
                    occ(F::template kernel<NT, J, CS, false, V, Q>(), NT);    \
                });                                                           \
        });
    BM_TP_SHAPES(BM_OCC)
#undef BM_OCC
    cudaGetLastError();
    return e != cudaSuccess || per < 0 ? 0 : per;
}

#endif
