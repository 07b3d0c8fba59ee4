/*
 * gather_unfused.cu - the UNFUSED gather: the library's own row kernel
 * finalizes this rank's rows into the workspace's all-gather buffer, an
 * all-gather replicates them, and the row kernel runs norm_residual_norm
 * over all T rows (internal), with the quantized output of normalized when
 * asked for.
 *
 * The all-gather: over NCCL (ncclAllGather in place), which needs no peer
 * memory, so it is also the path across nodes; in an in-process group, the
 * all-gather kernel of gather_fused.cu over the peers' buffers. It moves
 * L = ceil(T/R) rows from every rank, the last rank's rows past T included
 * (whatever the buffer holds there; never read after).
 *
 * Over NCCL (the workspace's own communicator, gather_watch.cu) every
 * rank's status and call signature travel with its rows
 * (a second all-gather of two words per rank in the same NCCL group), and
 * a check kernel compares them, so a rank that rejected its arguments, or
 * passed other ones, fails the call on every rank instead of leaving them
 * waiting inside NCCL. NCCL itself needs the same byte count on every
 * rank: ranks that disagree on tokens itself are outside what it can
 * check (docs/contract.md).
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

/* Over NCCL (the workspace's own communicator): all-gather n values from
 * every rank's `mine` (its block of w->ag) into w->ag in place, with the
 * records: NCCL's taking of the all-gathers is awaited at most timeout_ms
 * (then the communicator is aborted), their run on the GPU is watched
 * (gather_watch.cu). A rank whose local_status failed takes part all the
 * same and only counts. */
static beam_status bm_tp_nccl_exchange(const char *fn, bm_tp_ws *w, uint16_t *mine, size_t n, uint32_t sig,
                                       beam_status local_status, cudaStream_t stream)
{
    if (!bm_tp_own_enter(w))
        return bm_tp_check_failed(fn, w);
    cudaError_t e = bm_tp_launch_record(w, local_status != BEAM_OK, sig, stream);
    ncclResult_t r = ncclSuccess;
    if (e == cudaSuccess) {
        r = ncclGroupStart();
        if (r == ncclSuccess)
            r = ncclAllGather(w->rec + 2 * w->rank, w->rec, 2, ncclUint32, w->own, stream);
        if (r == ncclSuccess || r == ncclInProgress)
            r = ncclAllGather(mine, w->ag, n * sizeof(uint16_t), ncclChar, w->own, stream);
        const ncclResult_t r2 = ncclGroupEnd();
        if (r == ncclSuccess || r == ncclInProgress)
            r = r2;
        r = bm_tp_own_settle(w, r, stream, bm_tp_now_ns() + (unsigned long long)w->timeout_ms * 1000000ull, 0);
    }
    bm_tp_own_leave(w);
    BM_CHECK(bm_tp_launched(fn, "the record kernel", e));
    if (r != ncclSuccess)
        return bm_fail(BEAM_ERR_COMM, "%s: ncclAllGather on rank %d failed: %s; the workspace is unusable, "
                       "destroy it", fn, w->rank, ncclGetErrorString(r));
    return bm_tp_launched(fn, "the record check kernel",
                          bm_tp_launch_check(w, sig, local_status != BEAM_OK, stream));
}

beam_status bm_tp_unfused(const char *fn, bm_tp_ws *w, const bm_args *a, uint32_t sig,
                          beam_status local_status)
{
    /* a rejecting rank's tokens may be out of range: the count it joins with */
    const int64_t T = a->tokens < 0 ? 0 : (a->tokens > w->max_tokens ? w->max_tokens : a->tokens);
    const int64_t L = (T + w->nranks - 1) / w->nranks;
    const int H = w->hidden;
    int64_t owned = T - (int64_t)w->rank * L;
    owned = owned < 0 ? 0 : (owned > L ? L : owned);
    cudaStream_t stream = (cudaStream_t)a->stream;
    uint16_t *mine = w->ag + (size_t)w->rank * (size_t)L * H;

    /* finalize (+ post-norm) of the owned rows */
    if (local_status == BEAM_OK) {
        bm_row_params f = bm_params_of(a, BM_PART_FIN);
        f.out = mine;
        f.rows = owned;
        f.hidden = H;
        BM_CHECK(bm_tp_launched(fn, "the finalize kernel",
                                bm_launch_rows(f, bm_pick_shape(f, 0, w->shared), bm_params_vec_ok(f), stream)));
    }

    if (w->nranks > 1 && w->group) {
        if (local_status != BEAM_OK)
            return bm_tp_launched(fn, "the reject kernel", bm_tp_launch_reject(w, stream));
        BM_CHECK(bm_tp_launched(fn, "the all-gather kernel", bm_tp_launch_allgather(w, T, sig, stream)));
    } else if (w->nranks > 1) {
        BM_CHECK(bm_tp_nccl_exchange(fn, w, mine, (size_t)L * H, sig, local_status, stream));
        if (local_status != BEAM_OK)
            return local_status;
    }

    /* norm_residual_norm over every row, with the quantized output of
     * normalized when the call asks for it */
    bm_row_params n = bm_params_of(a, BM_PART_RES);
    n.x = w->ag;
    n.rows = T;
    n.hidden = H;
    const bm_quant &q = a->q;
    return bm_tp_launched(fn, "the norm_residual_norm kernel",
                          bm_launch_rows(n, bm_pick_shape(n, q.kind, w->shared), bm_params_vec_ok(n, &q), stream, &q));
}

/* The all-reduce's UNFUSED (docs/strategies.md#all-reduce): in chunks of
 * at most n = w->ag_rows / R tokens (the all-gather buffer holds R
 * blocks of n rows): each rank's partial of the chunk into its block of
 * w->ag (the finalize kernel, or a copy of the dense form's rows), the
 * all-gather (NCCL, or the in-process kernel, which moves every rank's
 * whole block: T' = R * rows), the ordered sum of the R blocks; then one
 * norm_residual_norm over all T summed rows.
 *
 * Where the sums go: this rank's own block of w->ag when one chunk holds
 * every token; else array 0 of parity 0 of its own region, which only the
 * fused strategies use. No peer reads or writes it by then: each one has
 * finished its previous call before it joined this call's first exchange.
 * A peer's next fused call could write it while norm_residual_norm still
 * reads it, so with peer memory a barrier kernel (the in-process
 * all-gather of no rows: an epoch like any call) follows, and the next
 * fused call waits for every rank to have started it. Every rank takes
 * the same steps: they depend on T, R and max_tokens only. */
beam_status bm_ar_unfused(const char *fn, bm_tp_ws *w, const bm_args *a, uint32_t sig, beam_status local_status)
{
    const int64_t T = a->tokens < 0 ? 0 : (a->tokens > w->max_tokens ? w->max_tokens : a->tokens);
    const int R = w->nranks, H = w->hidden;
    const int64_t n = (int64_t)(w->ag_rows / (size_t)R);
    const int64_t chunks = n > 0 ? (T + n - 1) / n : 0;
    cudaStream_t stream = (cudaStream_t)a->stream;
    uint16_t *sum = chunks == 1 ? w->ag + (size_t)w->rank * (size_t)T * H : (uint16_t *)(w->base + w->data_off);
    for (int64_t k = 0; k < chunks; ++k) {
        const int64_t t0 = k * n, rows = T - t0 < n ? T - t0 : n;
        uint16_t *mine = w->ag + (size_t)w->rank * (size_t)rows * H;
        if (local_status == BEAM_OK) {
            if (a->experts) {
                bm_row_params f = bm_params_of(a, BM_PART_FIN); /* a->post is off: the partial */
                f.experts = a->experts + (size_t)t0 * (size_t)a->top_k * H;
                f.weights = a->weights + (size_t)t0 * a->top_k;
                f.out = mine;
                f.rows = rows;
                BM_CHECK(bm_tp_launched(fn, "the finalize kernel",
                                        bm_launch_rows(f, bm_pick_shape(f, 0, w->shared), bm_params_vec_ok(f),
                                                       stream)));
            } else {
                BM_CHECK(bm_tp_launched(fn, "the copy of partial",
                                        cudaMemcpyAsync(mine, a->x + (size_t)t0 * H, (size_t)rows * H * 2,
                                                        cudaMemcpyDeviceToDevice, stream)));
            }
        }
        if (R > 1 && w->group) {
            if (local_status != BEAM_OK)
                return bm_tp_launched(fn, "the reject kernel", bm_tp_launch_reject(w, stream));
            BM_CHECK(bm_tp_launched(fn, "the all-gather kernel",
                                    bm_tp_launch_allgather(w, (int64_t)R * rows, sig, stream)));
        } else if (R > 1) {
            BM_CHECK(bm_tp_nccl_exchange(fn, w, mine, (size_t)rows * H, sig, local_status, stream));
        }
        if (local_status != BEAM_OK)
            continue; /* NCCL: the peers' exchanges still need this rank */
        BM_CHECK(bm_tp_launched(fn, "the sum kernel",
                                bm_ar_launch_sum(w->ag, (size_t)rows * H, R, sum + (size_t)t0 * H, (size_t)rows * H,
                                                 stream)));
    }
    if (local_status != BEAM_OK)
        return local_status;
    bm_row_params nr = bm_params_of(a, BM_PART_X | BM_PART_RES);
    nr.x = sum;
    nr.rows = T;
    const bm_quant &q = a->q;
    BM_CHECK(bm_tp_launched(fn, "the norm_residual_norm kernel",
                            bm_launch_rows(nr, bm_pick_shape(nr, q.kind, w->shared), bm_params_vec_ok(nr, &q),
                                           stream, &q)));
    if (chunks > 1 && R > 1 && w->peers)
        return bm_tp_launched(fn, "the barrier kernel", bm_tp_launch_allgather(w, 0, sig, stream));
    return BEAM_OK;
}
