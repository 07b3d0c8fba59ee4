/*
 * gather_unfused.cu - the UNFUSED gather: the library's own row kernel
 * finalizes this rank's rows into the workspace's all-gather buffer,
 * ncclAllGather (in place) replicates them, and the row kernel runs
 * norm_residual_norm over all T rows (internal).
 *
 * It needs no peer memory, so it is also the path across nodes. The
 * all-gather moves L = ceil(T/R) rows from every rank, the last rank's rows
 * past T included (whatever the buffer holds there; never read after).
 */
#include "error.h"
#include "gather_impl.h"
#include "launch.h"

static beam_status bm_tp_launched(const char *fn, const char *what, cudaError_t e)
{
    if (e == cudaSuccess)
        return BEAM_OK;
    return bm_fail(BEAM_ERR_DEVICE, "%s: %s failed: %s", fn, what, cudaGetErrorString(e));
}

beam_status bm_tp_unfused(const char *fn, const bm_tp_ws *w, const bm_args *a)
{
    const int64_t T = a->tokens;
    const int64_t L = (T + w->nranks - 1) / w->nranks;
    const int H = w->hidden;
    int64_t owned = T - (int64_t)w->rank * L;
    owned = owned < 0 ? 0 : (owned > L ? L : owned);
    cudaStream_t stream = (cudaStream_t)a->stream;
    uint16_t *mine = w->ag + (size_t)w->rank * (size_t)L * H;

    /* finalize (+ post-norm) of the owned rows */
    bm_row_params f = {};
    f.experts = a->experts;
    f.weights = a->weights;
    f.top_k = a->top_k;
    f.routed_scale = a->routed_scale;
    f.normA = a->post.on;
    f.wA = a->post.on ? a->post.weight : nullptr;
    f.epsA = a->post.eps;
    f.out = mine;
    f.rows = owned;
    f.hidden = H;
    BM_CHECK(bm_tp_launched(fn, "the finalize kernel",
                            bm_launch_rows(f, bm_pick_shape(f), bm_params_vec_ok(f), stream)));

    if (w->nranks > 1) {
        ncclResult_t r = ncclAllGather(mine, w->ag, (size_t)L * H * sizeof(uint16_t), ncclChar, w->comm,
                                       stream);
        if (r != ncclSuccess)
            return bm_fail(BEAM_ERR_COMM, "%s: ncclAllGather failed: %s", fn, ncclGetErrorString(r));
    }

    /* norm_residual_norm over every row */
    bm_row_params n = {};
    n.x = w->ag;
    n.residual = a->residual;
    n.has_scales = a->has_scales;
    n.scale_x = a->scale_x;
    n.scale_r = a->scale_r;
    n.normB = a->next.on;
    n.wB = a->next.on ? a->next.weight : nullptr;
    n.epsB = a->next.eps;
    n.out = a->hidden_out;
    n.normalized = a->normalized;
    n.rows = T;
    n.hidden = H;
    return bm_tp_launched(fn, "the norm_residual_norm kernel",
                          bm_launch_rows(n, bm_pick_shape(n), bm_params_vec_ok(n), stream));
}
