/*
 * launch_nrn.cu - the norm_residual_norm kernel's shapes (launch_shapes.h:
 * BM_NRNS): one row per block, rows beyond the grid in a grid-stride loop.
 */
#include "launch_shapes.h"
#include "nrn_kernel.cuh"

cudaError_t bm_launch_nrn_family(const bm_row_params_q &pq, bm_shape s, unsigned blocks, cudaStream_t stream)
{
    const bm_row_params &p = pq;
#define BM_SGO(NT, J, MB, HINT, PK, PF)                                                             \
    if (s.nt == NT && s.j == J && s.mb == MB && s.st == bm_nrn_st(HINT, PK, PF))                  \
        return bm_with_form(pq.q.kind, [&](auto qf) {                                             \
            constexpr int Q = decltype(qf)::value;                                                \
            return bm_launch(bm_nrn_kernel<NT, J, MB, HINT, Q, PK, PF>, bm_kp<Q>(p, pq), blocks, NT, 1, 0, \
                             s.pdl, stream);                                                      \
        });
    BM_NRNS(BM_SGO)
#undef BM_SGO
    return cudaErrorInvalidConfiguration;
}

cudaError_t bm_preload_nrn(void)
{
#define BM_PRE_NRN(NT, J, MB, HINT, PK, PF)                                           \
    bm_each_form([&](auto qf) { pre(bm_nrn_kernel<NT, J, MB, HINT, decltype(qf)::value, PK, PF>); });
    BM_PRELOAD_FAMILY(BM_NRNS, BM_PRE_NRN)
#undef BM_PRE_NRN
}
