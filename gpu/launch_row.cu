/*
 * launch_row.cu - the row kernel's shapes (launch_shapes.h: BM_SHAPES):
 * decode, clusters, prefill at hidden <= 4096, and the row twins of the
 * pipelined and nrn shapes (bases not 16-byte aligned).
 */
#include "launch_shapes.h"
#include "row_kernel.cuh"

/* The row kernel of one shape: vector or scalar path, finalize or not,
 * the kernels of the call's form. */
template <int NT, int J, int U, int CS>
static cudaError_t bm_go_row(const bm_row_params_q &pq, unsigned blocks, int pdl, int vec, cudaStream_t stream)
{
    return bm_with_form(pq.q.kind, [&](auto qf) {
        constexpr int Q = decltype(qf)::value;
        const typename bm_kparams<Q>::type &p = bm_kp<Q>(static_cast<const bm_row_params &>(pq), pq);
        if (p.experts)
            return vec ? bm_launch(bm_row_kernel<NT, J, U, CS, true, true, Q>, p, blocks, NT, CS, 0, pdl, stream)
                       : bm_launch(bm_row_kernel<NT, J, U, CS, false, true, Q>, p, blocks, NT, CS, 0, pdl, stream);
        return vec ? bm_launch(bm_row_kernel<NT, J, U, CS, true, false, Q>, p, blocks, NT, CS, 0, pdl, stream)
                   : bm_launch(bm_row_kernel<NT, J, U, CS, false, false, Q>, p, blocks, NT, CS, 0, pdl, stream);
    });
}

cudaError_t bm_launch_row_family(const bm_row_params_q &pq, bm_shape s, unsigned blocks, int vec,
                                 cudaStream_t stream)
{
#define BM_GO(NT, J, U, CS)                                                       \
    if (s.nt == NT && s.j == J && s.u == U && s.cs == CS)                         \
        return bm_go_row<NT, J, U, CS>(pq, blocks, s.pdl, vec, stream);
    BM_SHAPES(BM_GO)
#undef BM_GO
    return cudaErrorInvalidConfiguration;
}

cudaError_t bm_preload_row(void)
{
#define BM_PRE_ROW(NT, J, U, CS)                                                      \
    bm_each_form([&](auto qf) {                                                       \
        constexpr int Q = decltype(qf)::value;                                        \
        pre(bm_row_kernel<NT, J, U, CS, true, true, Q>);                              \
        pre(bm_row_kernel<NT, J, U, CS, false, true, Q>);                             \
        pre(bm_row_kernel<NT, J, U, CS, true, false, Q>);                             \
        pre(bm_row_kernel<NT, J, U, CS, false, false, Q>);                            \
    });
    BM_PRELOAD_FAMILY(BM_SHAPES, BM_PRE_ROW)
#undef BM_PRE_ROW
}
