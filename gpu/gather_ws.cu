/*
 * gather_ws.cu - creating and destroying an NCCL gather workspace
 * (internal). Both are collective over the caller's communicator (its
 * split into the workspace's own, then that one: gather_watch.cu) and may
 * synchronize; no later call does.
 *
 * Creation: every rank allocates its peer-visible region, zeroes the flags,
 * and all-gathers over the communicator one record per rank (IPC handle,
 * host identity, whether its device check, stream and allocations
 * succeeded, the launch caps of its device). A rank that failed still takes
 * part (the small exchange buffer is allocated first), so if any rank
 * failed, every rank fails, and none waits for it forever. If all ranks are on one
 * host, each maps every peer's region (cudaIpcOpenMemHandle); the ranks
 * agree (an all-reduce) whether every mapping worked, else the workspace
 * runs UNFUSED only. Destruction: device sync, barrier, unmap, barrier,
 * free, so no peer still writes into a freed region.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "gather_impl.h"
#include "meet.h"

/* AUTO's thresholds: ONESHOT for every T, the fastest strategy at every T
 * measured on one host (docs/log/2026-12-04-constants.md); UNFUSED only
 * without peer memory (the thresholds are set to 0 at creation). */
#define BM_TP_DEFAULT_ONESHOT INT64_MAX
#define BM_TP_DEFAULT_TWOSHOT INT64_MAX
#define BM_TP_DEFAULT_TIMEOUT_MS 10000

extern "C" beam_workspace_config bm_cuda_ws_default(void)
{
    beam_workspace_config c;
    c.oneshot_max_tokens = BM_TP_DEFAULT_ONESHOT;
    c.twoshot_max_tokens = BM_TP_DEFAULT_TWOSHOT;
    c.timeout_ms = BM_TP_DEFAULT_TIMEOUT_MS;
    return c;
}

/* What each rank tells the others at creation. */
struct bm_tp_rec {
    cudaIpcMemHandle_t handle;
    unsigned long long host;
    int32_t ok;
    int32_t gcap[BM_TP_NCAPS];
    int32_t sms;       /* its device's multiprocessors */
    bm_tp_shape shape; /* what every rank must pass alike */
};

/* Which host this rank runs on: ranks with equal ids map each other's
 * memory. BEAM_GATHER_HOST, when set, replaces the host's name: ranks
 * given different values act as if on different hosts (the fused
 * strategies off, AUTO takes UNFUSED), which is how the path between nodes
 * is tested on one host (with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL
 * takes its network transport too). */
static unsigned long long bm_tp_host_id(void)
{
    char name[256];
    const char *env = getenv("BEAM_GATHER_HOST");
    unsigned long long h = 1469598103934665603ull;
    memset(name, 0, sizeof name);
    if (env && *env)
        strncpy(name, env, sizeof name - 1);
    else if (gethostname(name, sizeof name - 1) != 0)
        return 0;
    for (const char *c = name; *c; ++c)
        h = (h ^ (unsigned char)*c) * 1099511628211ull;
    return env && *env ? (h | 1ull) : h ^ (unsigned long long)gethostid();
}

static size_t bm_tp_round(size_t n)
{
    return (n + 255u) & ~(size_t)255u;
}

/* Free everything a workspace holds (any part may be missing). Peer
 * regions are unmapped only for NCCL workspaces (an in-process group's
 * peers are the other ranks' own allocations). */
void bm_tp_release(bm_tp_ws *w)
{
    bm_tp_watch_stop(w);
    if (w->own)
        ncclCommAbort(w->own);
    for (int s = 0; s < w->nranks && s < BM_TP_MAX_RANKS && !w->group; ++s)
        if (w->peer[s] && w->peer[s] != w->base)
            cudaIpcCloseMemHandle(w->peer[s]);
    if (w->base) cudaFree(w->base);
    if (w->ag) cudaFree(w->ag);
    if (w->rec) cudaFree(w->rec);
    if (w->epoch) cudaFree(w->epoch);
    if (w->err_h) cudaFreeHost(w->err_h);
    if (w->side) cudaStreamDestroy(w->side);
    free(w);
}

bm_tp_shape bm_tp_shape_of(const bm_ws *ws)
{
    bm_tp_shape sh;
    memset(&sh, 0, sizeof sh); /* exchanged as bytes: no uninitialised padding */
    sh.max_tokens = ws->max_tokens;
    sh.hidden = ws->hidden;
    sh.oneshot = ws->cfg.oneshot_max_tokens;
    sh.twoshot = ws->cfg.twoshot_max_tokens;
    sh.timeout_ms = ws->cfg.timeout_ms;
    return sh;
}

beam_status bm_tp_same_shape(const char *fn, int s, const bm_tp_shape *theirs, const bm_tp_shape *mine)
{
    if (theirs->max_tokens == mine->max_tokens && theirs->hidden == mine->hidden &&
        theirs->oneshot == mine->oneshot && theirs->twoshot == mine->twoshot &&
        theirs->timeout_ms == mine->timeout_ms)
        return BEAM_OK;
    return bm_fail(BEAM_ERR_INVALID_ARGUMENT,
                   "%s: rank %d passed max_tokens=%lld, hidden=%d, cfg {%lld, %lld, %d} but this rank "
                   "max_tokens=%lld, hidden=%d, cfg {%lld, %lld, %d}: every rank must pass the same",
                   fn, s, (long long)theirs->max_tokens, (int)theirs->hidden, (long long)theirs->oneshot,
                   (long long)theirs->twoshot, (int)theirs->timeout_ms, (long long)mine->max_tokens,
                   (int)mine->hidden, (long long)mine->oneshot, (long long)mine->twoshot, (int)mine->timeout_ms);
}

/* The layout of the peer-visible region (gather_impl.h) and every
 * allocation a workspace has on its device, flags zeroed. Returns NULL, or
 * what could not be allocated. */
const char *bm_tp_alloc(bm_tp_ws *w, const bm_ws *ws, int R)
{
    const size_t row_bytes = (size_t)ws->hidden * sizeof(uint16_t);
    w->flags_off = 0;
    w->errf_off = bm_tp_round((size_t)2 * BM_TP_MAX_RANKS * BM_TP_MAX_BLOCKS * 8u);
    w->arr_off = bm_tp_round(w->errf_off + BM_TP_MAX_RANKS * 8u);
    w->sig_off = bm_tp_round(w->arr_off + BM_TP_MAX_RANKS * 8u);
    w->fail_off = bm_tp_round(w->sig_off + 2u * BM_TP_MAX_RANKS * 8u);
    w->ll_off = bm_tp_round(w->fail_off + BM_TP_MAX_RANKS * 8u);
    w->ll_rows = (int64_t)R * BM_TP_LL_MAX_L;
    if (w->ll_rows > ws->max_tokens) w->ll_rows = ws->max_tokens;
    if (R < 2) w->ll_rows = 0;
    /* LL rows take twice a row's bytes (a tag beside every 32 data bits);
     * they are zeroed with the flags: tag 0 is no epoch */
    w->data_off = bm_tp_round(w->ll_off + 2u * (size_t)w->ll_rows * 2u * row_bytes);
    w->slot_bytes = R > 1 ? bm_tp_round((size_t)ws->max_tokens * row_bytes) : 0;
    w->region_bytes = w->data_off + 4u * w->slot_bytes;
    w->ag_rows = (size_t)R * (size_t)((ws->max_tokens + R - 1) / R);

    const char *what = nullptr;
    if (bm_tp_preload() != cudaSuccess) { cudaGetLastError(); return "loading the kernels"; }
    if (cudaMalloc(&w->base, w->region_bytes) != cudaSuccess) { what = "the peer-visible buffers"; w->base = nullptr; }
    else if (cudaMalloc(&w->ag, (w->ag_rows ? w->ag_rows : 1) * row_bytes) != cudaSuccess) { what = "the all-gather buffer"; w->ag = nullptr; }
    else if (cudaMalloc(&w->rec, 2u * BM_TP_MAX_RANKS * sizeof(uint32_t)) != cudaSuccess) { what = "the all-gather records"; w->rec = nullptr; }
    else if (cudaMalloc(&w->epoch, BM_TP_STATE_WORDS * sizeof(unsigned long long)) != cudaSuccess) { what = "the epoch counters"; w->epoch = nullptr; }
    else if (cudaHostAlloc(&w->err_h, sizeof(bm_tp_err), cudaHostAllocMapped) != cudaSuccess) { what = "the failure record"; w->err_h = nullptr; }
    else if (cudaHostGetDevicePointer(&w->err_d, w->err_h, 0) != cudaSuccess) what = "the failure record";
    cudaGetLastError(); /* a failed allocation must not stick to later launches */
    if (what)
        return what;
    memset((void *)w->err_h, 0, sizeof(bm_tp_err));
    /* BEAM_GATHER_EPOCH: the epoch before the first call (0 unless set; a
     * test knob, the same on every rank, so that the LL tag's 32-bit wrap
     * and the clearing epochs are reached in a few calls) */
    const char *env = getenv("BEAM_GATHER_EPOCH");
    const unsigned long long first = env ? strtoull(env, nullptr, 0) : 0ull;
    unsigned long long *e0 = (unsigned long long *)calloc(BM_TP_STATE_WORDS, sizeof *e0);
    if (!e0)
        return "host memory for the epoch counters";
    for (int i = 0; i < BM_TP_MAX_BLOCKS; ++i)
        e0[i] = first;
    const int bad = cudaMemset(w->base, 0, w->data_off) != cudaSuccess ||
                    cudaMemcpy(w->epoch, e0, BM_TP_STATE_WORDS * sizeof *e0, cudaMemcpyHostToDevice) != cudaSuccess ||
                    cudaDeviceSynchronize() != cudaSuccess;
    free(e0);
    return bad ? "zeroing the flags" : nullptr;
}

/* A barrier: a one-int all-reduce (min) on the workspace's own
 * communicator, waited for on the side stream at most timeout_ms (then the
 * communicator is aborted). *v becomes the minimum over the ranks. */
static ncclResult_t bm_tp_allmin(bm_tp_ws *w, int *v, int *dbuf)
{
    if (!bm_tp_own_enter(w))
        return ncclInvalidUsage;
    const unsigned long long deadline = bm_tp_now_ns() + (unsigned long long)w->timeout_ms * 1000000ull;
    cudaMemcpyAsync(dbuf, v, sizeof(int), cudaMemcpyHostToDevice, w->side);
    ncclResult_t r = bm_tp_own_settle(w, ncclAllReduce(dbuf, dbuf, 1, ncclInt, ncclMin, w->own, w->side), w->side,
                                      deadline, 1);
    bm_tp_own_leave(w);
    if (r != ncclSuccess)
        return r;
    cudaMemcpyAsync(v, dbuf, sizeof(int), cudaMemcpyDeviceToHost, w->side);
    return cudaStreamSynchronize(w->side) == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}

/* Why this rank cannot make its workspace (told to the peers as ok = 0;
 * the message is written after the exchange, so that bm_fail's is the
 * last). */
enum { BM_TP_WHY_NONE, BM_TP_WHY_DEVICE, BM_TP_WHY_STREAM, BM_TP_WHY_HOST, BM_TP_WHY_ALLOC, BM_TP_WHY_ARGS };

extern "C" beam_status bm_cuda_ws_create_nccl(void *comm_ptr, bm_ws *ws, beam_status local_status)
{
    static const char fn[] = "beam_workspace_create_nccl";
    ncclComm_t comm = (ncclComm_t)comm_ptr;
    int R = 0, r = 0, cudev = -1, dev = -1;
    ncclResult_t nr;
    beam_status st = BEAM_OK;
    /* the exchange's records: host ones on the stack (R <= BM_TP_MAX_RANKS),
     * R device ones then one int for the barriers */
    bm_tp_rec recs[BM_TP_MAX_RANKS];
    bm_tp_rec mine;
    bm_tp_rec *drec = nullptr;
    bm_tp_ws probe; /* holds the own communicator of a rank that has no workspace */
    cudaStream_t side = nullptr;
    bm_tp_ws *w = nullptr;
    int ok = 1, why = BM_TP_WHY_NONE;
    const char *what = "";
    cudaError_t ce = cudaSuccess;

    memset(&probe, 0, sizeof probe);
    if ((nr = ncclCommCount(comm, &R)) != ncclSuccess || (nr = ncclCommUserRank(comm, &r)) != ncclSuccess ||
        (nr = ncclCommCuDevice(comm, &cudev)) != ncclSuccess)
        return bm_fail(BEAM_ERR_COMM, "%s: nccl_comm is not a usable ncclComm_t: %s", fn,
                       ncclGetErrorString(nr));
    if (R > BM_TP_MAX_RANKS) /* R is the same on every rank: all fail alike */
        return bm_fail(BEAM_ERR_UNSUPPORTED, "%s: the communicator has %d ranks; at most %d are supported",
                       fn, R, BM_TP_MAX_RANKS);

    /* From here on every local failure is remembered (ok = 0) and this rank
     * still joins the exchange below, so that its peers fail with it
     * instead of waiting for it in NCCL forever. A wrong current device:
     * the exchange runs on the communicator's device, then it is restored. */
    if (local_status != BEAM_OK) { /* lib's checks failed: join, allocate nothing */
        ok = 0;
        why = BM_TP_WHY_ARGS;
    }
    if (cudaGetDevice(&dev) != cudaSuccess || dev != cudev) {
        cudaGetLastError();
        if (ok) why = BM_TP_WHY_DEVICE;
        ok = 0;
        if (cudaSetDevice(cudev) != cudaSuccess) /* cannot even reach it: no exchange possible */
            return bm_fail(BEAM_ERR_INVALID_ARGUMENT,
                           "%s: the current device (%d) must be the communicator's device (%d)", fn, dev,
                           cudev);
    }
    /* The small exchange buffer first, whatever else fails; without it this
     * rank cannot take part (its peers then wait inside NCCL). */
    if (cudaMalloc(&drec, (size_t)R * sizeof(bm_tp_rec) + 16) != cudaSuccess) {
        cudaGetLastError();
        if (dev != cudev && dev >= 0) cudaSetDevice(dev);
        return bm_fail(BEAM_ERR_OUT_OF_MEMORY, "%s: out of device memory for the exchange records", fn);
    }
    /* Without a side stream the exchange runs on the legacy default stream. */
    if (ok && (ce = cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking)) != cudaSuccess) {
        cudaGetLastError();
        side = nullptr;
        ok = 0;
        why = BM_TP_WHY_STREAM;
    }
    if (ok && !(w = (bm_tp_ws *)calloc(1, sizeof *w))) {
        ok = 0;
        why = BM_TP_WHY_HOST;
    }
    if (ok) {
        w->comm = comm;
        w->device = dev;
        w->rank = r;
        w->nranks = R;
        w->max_tokens = ws->max_tokens;
        w->hidden = ws->hidden;
        w->timeout_ms = (uint32_t)ws->cfg.timeout_ms;
        w->side = side;
        why = BM_TP_WHY_ALLOC;
        if ((what = bm_tp_alloc(w, ws, R)) != nullptr)
            ok = 0;
        if (ok)
            why = BM_TP_WHY_NONE;
    }

    /* Exchange the records (an ncclAllGather of bytes); every rank gets
     * here, failed or not. */
    memset(recs, 0, sizeof recs);
    memset(&mine, 0, sizeof mine);
    mine.host = bm_tp_host_id();
    mine.ok = ok;
    mine.shape = bm_tp_shape_of(ws);
    if (ok && R > 1 && cudaIpcGetMemHandle(&mine.handle, w->base) != cudaSuccess) {
        cudaGetLastError();
        mine.host = 0; /* cannot export: nobody maps us, the fused paths are off */
    }
    mine.sms = bm_tp_device_sms();
    if (ok)
        bm_tp_caps(1, mine.gcap); /* NCCL: one rank per device */
    else
        for (int i = 0; i < BM_TP_NCAPS; ++i)
            mine.gcap[i] = 1;
    /* The workspace's own communicator (gather_watch.cu), split from the
     * caller's by every rank, failed or not; the exchange and every later
     * collective run on it, each wait bounded by the timeout (lib/meet.h's
     * rule). */
    {
        const unsigned long long deadline =
            bm_tp_now_ns() + (unsigned long long)bm_meet_timeout(local_status, ws->cfg.timeout_ms) * 1000000ull;
        bm_tp_ws *x = w ? w : &probe;
        nr = bm_tp_own_split(comm, r, &x->own, deadline);
        if (nr != ncclSuccess) {
            st = bm_fail(BEAM_ERR_COMM, "%s: splitting the communicator for the workspace failed, or a peer did not "
                         "join within the timeout: %s (a communicator created non-blocking may still hold the "
                         "split: abort it)", fn, ncclGetErrorString(nr));
            goto fail;
        }
        if (ok && w && R > 1 && bm_tp_watch_start(w) != 0) {
            ok = 0;
            why = BM_TP_WHY_HOST;
        }
        /* on the side stream: a pageable cudaMemcpy may return before its DMA
         * lands, and the side stream does not wait for the legacy stream */
        if (cudaMemcpyAsync(drec + r, &mine, sizeof mine, cudaMemcpyHostToDevice, side) != cudaSuccess)
            nr = ncclUnhandledCudaError;
        if (nr == ncclSuccess && bm_tp_own_enter(x)) {
            nr = bm_tp_own_settle(x, ncclAllGather(drec + r, drec, sizeof(bm_tp_rec), ncclChar, x->own, side), side,
                                  deadline, 1);
            bm_tp_own_leave(x);
        } else if (nr == ncclSuccess) {
            nr = ncclInvalidUsage;
        }
        if (nr == ncclSuccess && (cudaMemcpyAsync(recs, drec, (size_t)R * sizeof(bm_tp_rec), cudaMemcpyDeviceToHost,
                                                  side) != cudaSuccess ||
                                  cudaStreamSynchronize(side) != cudaSuccess))
            nr = ncclUnhandledCudaError;
        if (nr != ncclSuccess) {
            st = bm_fail(BEAM_ERR_COMM, "%s: exchanging the workspace records failed, or a peer did not join within "
                         "the timeout: %s", fn, ncclGetErrorString(nr));
            goto fail;
        }
    }
    if (!ok) {
        switch (why) {
        case BM_TP_WHY_ARGS:
            st = local_status; /* lib's message stands */
            break;
        case BM_TP_WHY_DEVICE:
            st = bm_fail(BEAM_ERR_INVALID_ARGUMENT,
                         "%s: the current device (%d) must be the communicator's device (%d)", fn, dev, cudev);
            break;
        case BM_TP_WHY_STREAM:
            st = bm_fail(BEAM_ERR_DEVICE, "%s: cudaStreamCreate failed: %s", fn, cudaGetErrorString(ce));
            break;
        case BM_TP_WHY_HOST:
            st = bm_fail(BEAM_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
            break;
        default:
            st = bm_fail(BEAM_ERR_OUT_OF_MEMORY, "%s: allocating %s on device %d failed", fn, what, dev);
        }
        goto fail;
    }
    for (int s = 0; s < R; ++s) {
        if (!recs[s].ok) {
            st = bm_fail(BEAM_ERR_COMM, "%s: rank %d could not make its workspace", fn, s);
            goto fail;
        }
        if ((st = bm_tp_same_shape(fn, s, &recs[s].shape, &mine.shape)) != BEAM_OK)
            goto fail;
        for (int i = 0; i < BM_TP_NCAPS; ++i)
            if (s == 0 || recs[s].gcap[i] < w->gcap[i])
                w->gcap[i] = recs[s].gcap[i] < 1 ? 1 : recs[s].gcap[i];
        if (s == 0 || recs[s].sms < w->sms)
            w->sms = recs[s].sms < 1 ? 1 : recs[s].sms;
    }

    /* Map every peer's region when all ranks share this host. */
    {
        int peers = 1;
        for (int s = 0; s < R; ++s)
            if (recs[s].host == 0 || recs[s].host != recs[r].host)
                peers = 0;
        w->peer[r] = w->base;
        for (int s = 0; s < R && peers; ++s) {
            if (s == r)
                continue;
            void *p = nullptr;
            if (cudaIpcOpenMemHandle(&p, recs[s].handle, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
                cudaGetLastError();
                peers = 0;
                break;
            }
            w->peer[s] = (char *)p;
        }
        if (bm_tp_allmin(w, &peers, (int *)(drec + R)) != ncclSuccess) {
            st = bm_fail(BEAM_ERR_COMM, "%s: agreeing on peer access failed", fn);
            goto fail;
        }
        w->peers = R > 1 ? peers : 1;
        if (!peers) {
            for (int s = 0; s < R; ++s)
                if (w->peer[s] && s != r) {
                    cudaIpcCloseMemHandle(w->peer[s]);
                    w->peer[s] = nullptr;
                }
            /* No peer memory (several hosts): AUTO takes UNFUSED always. */
            ws->cfg.oneshot_max_tokens = 0;
            ws->cfg.twoshot_max_tokens = 0;
        }
    }
    cudaFree(drec);
    ws->rank = r;
    ws->nranks = R;
    ws->impl = w;
    return BEAM_OK;

fail:
    cudaFree(drec);
    if (probe.own)
        ncclCommAbort(probe.own);
    if (w)
        bm_tp_release(w); /* destroys the side stream and the own communicator too */
    else if (side)
        cudaStreamDestroy(side);
    if (dev != cudev && dev >= 0)
        cudaSetDevice(dev);
    return st;
}

beam_status bm_tp_check_failed(const char *fn, const bm_tp_ws *w)
{
    const uint32_t code = w->err_h->code;
    if (code == BM_TP_OK)
        return BEAM_OK;
    if (code == BM_TP_CONCURRENT)
        return bm_fail(BEAM_ERR_COMM,
                       "%s: two calls on this workspace (rank %d) ran at the same time on the device (calls on "
                       "one workspace must be ordered on one stream, or by events); the later one computed "
                       "nothing; the workspace is unusable, destroy it",
                       fn, w->rank);
    if (code == BM_TP_PEER_FAILED)
        return bm_fail(BEAM_ERR_COMM,
                       "%s: in an earlier call on this workspace rank %d gave that call up (it timed out, or found "
                       "a peer that failed, rejected its arguments or passed other ones), so this rank's outputs "
                       "of that call are undefined; the workspace is unusable, destroy it",
                       fn, (int)w->err_h->peer);
    if (code == BM_TP_MISMATCH)
        return bm_fail(BEAM_ERR_COMM,
                       "%s: in an earlier call on this workspace rank %d passed arguments that differ from rank "
                       "%d's (tokens, top_k, hidden, routed_scale, norms, scales, strategy and the quantized "
                       "output's form must be the same on every rank), so that call's outputs are undefined; the workspace is unusable, destroy it",
                       fn, (int)w->err_h->peer, w->rank);
    if (code == BM_TP_NCCL_TIMEOUT)
        return bm_fail(BEAM_ERR_COMM,
                       "%s: an earlier UNFUSED call on this workspace (rank %d, all-gather %llu) waited more than %u "
                       "ms inside NCCL for its peers, so the workspace's own communicator was aborted; that call's "
                       "outputs are undefined; the workspace is unusable, destroy it",
                       fn, w->rank, (unsigned long long)w->err_h->epoch, (unsigned)w->timeout_ms);
    if (code == BM_TP_TIMEOUT)
        return bm_fail(BEAM_ERR_COMM,
                       "%s: an earlier call on this workspace (rank %d, call %llu) timed out after %u ms "
                       "waiting for rank %d; the workspace is unusable, destroy it",
                       fn, w->rank, (unsigned long long)w->err_h->epoch, (unsigned)w->timeout_ms,
                       (int)w->err_h->peer);
    return bm_fail(BEAM_ERR_COMM,
                   "%s: in an earlier call on this workspace rank %d rejected its arguments, so this rank's "
                   "outputs of that call are incomplete; the workspace is unusable, destroy it",
                   fn, (int)w->err_h->peer);
}

extern "C" beam_status bm_cuda_ws_destroy(bm_ws *ws)
{
    static const char fn[] = "beam_workspace_destroy";
    bm_tp_ws *w = (bm_tp_ws *)ws->impl;
    int cur = -1;
    if (!w)
        return BEAM_OK;
    cudaGetDevice(&cur);
    if (cur != w->device)
        cudaSetDevice(w->device);
    /* Every kernel of this rank is done (a waiting one ends at its timeout),
     * then every rank's (barrier), before the mappings go. */
    cudaDeviceSynchronize();
    beam_status st = bm_tp_check_failed(fn, w);
    if (w->group) {
        const int dev = w->device;
        st = bm_tp_group_destroy(w, st);
        ws->impl = nullptr; /* released, or kept for peers that never came */
        if (cur != dev && cur >= 0)
            cudaSetDevice(cur);
        return st;
    }
    /* its watchdog has ended any all-gather that waited too long by now */
    bm_tp_watch_stop(w);
    int *dint = nullptr;
    if (w->nranks > 1 && cudaMalloc(&dint, sizeof(int)) == cudaSuccess) {
        int one = 1;
        bm_tp_allmin(w, &one, dint); /* errors ignored: bounded, and a failed one aborts the own communicator */
        for (int s = 0; s < w->nranks; ++s)
            if (w->peer[s] && w->peer[s] != w->base) {
                cudaIpcCloseMemHandle(w->peer[s]);
                w->peer[s] = nullptr;
            }
        bm_tp_allmin(w, &one, dint);
        cudaFree(dint);
    }
    bm_tp_own_close(w);
    const int dev = w->device;
    bm_tp_release(w);
    ws->impl = nullptr;
    if (cur != dev && cur >= 0)
        cudaSetDevice(cur);
    return st;
}
