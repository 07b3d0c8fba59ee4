/*
 * gather.cu - bm_cuda_gather and bm_cuda_allreduce: one tensor-parallel
 * call (internal); both collectives take the same steps on the same
 * workspace, with their own kernels.
 *
 * Host work per call is a few checks and one or three launches; nothing
 * synchronizes or allocates, so a call can be captured in a CUDA graph.
 * Order of the checks:
 *   1. the workspace must be used from its own device;
 *   2. an earlier device-side failure (timeout, a peer's rejected call)
 *      makes every later call fail with BEAM_ERR_COMM (the record lives in
 *      host-mapped memory: under graph replay it is seen by the next eager
 *      call or by beam_workspace_destroy);
 *   3. this rank's arguments failed lib's checks: it still tells its
 *      peers, so that they fail too instead of waiting for it: ONESHOT and
 *      TWOSHOT mark this epoch as "rejected" at every peer (a small kernel
 *      that touches no user memory and advances the epoch like a call);
 *      UNFUSED joins the all-gather with a "rejected" record (NCCL) or
 *      runs the same reject kernel (in-process group). Not when
 *      tokens == 0 (lib passes the caller's tokens even when a check
 *      failed): the peers' call has tokens == 0 too and launches nothing,
 *      so a reject kernel here would put this rank one epoch ahead of them
 *      and kill the workspace; a call with no rows has nothing to
 *      withhold, so the rejection stays local;
 *   4. tokens == 0: nothing to do, on every rank alike.
 * Every launch carries the signature of the call's arguments
 * (bm_tp_signature): ranks that disagree on a call fail it on the device.
 * A failure found on the device (a timeout, a peer's rejection or other
 * arguments, two overlapping calls) is reported by the next call on the
 * workspace and by beam_workspace_destroy, and the workspace stays
 * unusable; the outputs of the failed call are undefined.
 */
#include <stdio.h>

#include "agree.h"
#include "error.h"
#include "gather_impl.h"

static beam_status bm_tp_call(bm_ws *ws, const bm_args *a, beam_strategy strategy, beam_status local_status,
                              int coll)
{
    const char *fn = a->fn;
    bm_tp_ws *w = (bm_tp_ws *)ws->impl;
    int dev = -1;
    if (!w)
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: the workspace was not created by the CUDA backend", fn);
    if (cudaGetDevice(&dev) != cudaSuccess || dev != w->device)
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT,
                       "%s: workspace belongs to device %d but device %d is current (cudaSetDevice(%d) first)",
                       fn, w->device, dev, w->device);
    BM_CHECK(bm_tp_check_failed(fn, w));
    const int fused = strategy == BEAM_STRATEGY_ONESHOT || strategy == BEAM_STRATEGY_TWOSHOT;
    const int ar = coll == BM_COLL_ALLREDUCE;
    const uint32_t sig = bm_tp_signature(a, bm_agree_coll(strategy, coll));
    if (local_status != BEAM_OK) {
        /* lib sets a->tokens (the caller's value) before its checks; with
         * tokens == 0 the peers launch nothing, so neither may we (3.) */
        if (w->nranks > 1 && a->tokens > 0) {
            char msg[512]; /* lib's message, kept over a failed launch's */
            snprintf(msg, sizeof msg, "%s", bm_last_error());
            if (fused && w->peers)
                bm_tp_launch_reject(w, (cudaStream_t)a->stream);
            else if (strategy == BEAM_STRATEGY_UNFUSED)
                (ar ? bm_ar_unfused : bm_tp_unfused)(fn, w, a, sig, local_status);
            cudaGetLastError(); /* best effort; the argument error is what we report */
            return bm_fail(local_status, "%s", msg);
        }
        return local_status;
    }
    if (a->tokens == 0)
        return BEAM_OK;
    if (strategy == BEAM_STRATEGY_UNFUSED)
        return (ar ? bm_ar_unfused : bm_tp_unfused)(fn, w, a, sig, BEAM_OK);
    if (!fused)
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: strategy=%d is not a tensor-parallel strategy", fn,
                       (int)strategy);
    const char *name = strategy == BEAM_STRATEGY_ONESHOT ? "ONESHOT" : "TWOSHOT";
    if (!w->peers)
        return bm_fail(BEAM_ERR_UNSUPPORTED,
                       "%s: strategy %s needs peer memory, which this workspace lacks (ranks on several "
                       "hosts, or CUDA IPC failed); use UNFUSED or AUTO",
                       fn, name);
    const int two = strategy == BEAM_STRATEGY_TWOSHOT;
    cudaStream_t stream = (cudaStream_t)a->stream;
    cudaError_t e = ar ? bm_ar_launch_fused(w, a, two, sig, stream) : bm_tp_launch_fused(w, a, two, sig, stream);
    if (e != cudaSuccess)
        return bm_fail(BEAM_ERR_DEVICE, "%s: launching the %s kernel failed: %s", fn, name, cudaGetErrorString(e));
    return BEAM_OK;
}

extern "C" beam_status bm_cuda_gather(bm_ws *ws, const bm_args *a, beam_strategy strategy,
                                      beam_status local_status)
{
    return bm_tp_call(ws, a, strategy, local_status, BM_COLL_GATHER);
}

extern "C" beam_status bm_cuda_allreduce(bm_ws *ws, const bm_args *a, beam_strategy strategy,
                                         beam_status local_status)
{
    return bm_tp_call(ws, a, strategy, local_status, BM_COLL_ALLREDUCE);
}
