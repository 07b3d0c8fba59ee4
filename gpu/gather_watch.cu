/*
 * gather_watch.cu - the NCCL workspace's own communicator and its watchdog
 * (internal).
 *
 * An NCCL collective whose peer never comes waits on the GPU forever; only
 * ncclCommAbort ends it, and the caller's communicator is not ours to
 * abort. So at creation the workspace splits the caller's communicator
 * into one of its own, created non-blocking (config.blocking = 0): every
 * host wait on it is a poll with a deadline, and the library may abort it.
 * Creation's exchanges, UNFUSED's all-gathers and destruction's barriers
 * run on it.
 *
 * UNFUSED's all-gather runs on the GPU after the call has returned (and in
 * graph replays without host code at all), so a watchdog thread watches
 * it: the record kernel before each all-gather and the check kernel after
 * it count them into host-mapped words (bm_tp_err.ag_begun, ag_ended).
 * When the count of ended ones has not moved for timeout_ms while one is
 * begun, the watchdog records BM_TP_NCCL_TIMEOUT and aborts the own
 * communicator: NCCL's kernels then end, the stream moves on (that call's
 * outputs are undefined), and the next call and beam_workspace_destroy
 * return BEAM_ERR_COMM, as after a fused strategy's timeout. The peers'
 * watchdogs do the same. docs/contract.md#timeouts.
 *
 * While the watchdog runs, the caller's thread uses w->own only between
 * bm_tp_own_enter and bm_tp_own_leave (the watchdog's mutex), and an
 * aborted communicator (w->own NULL) is never touched again.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gather_impl.h"
#include "meet.h"

struct bm_tp_watch {
    pthread_t thread;
    bm_host h; /* the lock and the condition the thread sleeps on (lib/meet.h) */
    int stop;
};

int bm_tp_own_enter(bm_tp_ws *w)
{
    if (w->watch)
        pthread_mutex_lock(&w->watch->h.mu);
    if (w->own)
        return 1;
    bm_tp_own_leave(w);
    return 0;
}

void bm_tp_own_leave(bm_tp_ws *w)
{
    if (w->watch)
        pthread_mutex_unlock(&w->watch->h.mu);
}

unsigned long long bm_tp_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

static void bm_tp_nap(void)
{
    const struct timespec t = {0, 20000}; /* 20 us */
    nanosleep(&t, nullptr);
}

/* The state of a non-blocking communicator once it leaves ncclInProgress,
 * or ncclInProgress at the deadline. */
static ncclResult_t bm_tp_poll(ncclComm_t c, ncclResult_t r, unsigned long long deadline_ns)
{
    while (r == ncclInProgress) {
        if (ncclCommGetAsyncError(c, &r) != ncclSuccess)
            return ncclInternalError;
        if (r == ncclInProgress) {
            if (bm_tp_now_ns() > deadline_ns)
                return ncclInProgress;
            bm_tp_nap();
        }
    }
    return r;
}

ncclResult_t bm_tp_own_split(ncclComm_t parent, int rank, ncclComm_t *own, unsigned long long deadline_ns)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    *own = nullptr;
    ncclResult_t r = ncclCommSplit(parent, 0, rank, own, &cfg);
    /* A non-blocking parent returns at once and reports through its own
     * state; a blocking one returns when the split is done. */
    if (r == ncclInProgress)
        r = bm_tp_poll(parent, r, deadline_ns);
    /* the child finishes its own set-up in the background */
    if (r == ncclSuccess && *own)
        r = bm_tp_poll(*own, ncclInProgress, deadline_ns);
    if (r == ncclSuccess && !*own)
        r = ncclInternalError;
    if (r != ncclSuccess && *own) {
        ncclCommAbort(*own);
        *own = nullptr;
    }
    return r;
}

void bm_tp_own_abort(bm_tp_ws *w, uint32_t code)
{
    if (!w->own)
        return;
    if (w->err_h && w->err_h->code == BM_TP_OK) {
        w->err_h->peer = -1;
        w->err_h->epoch = w->err_h->ag_begun;
        w->err_h->code = code;
    }
    ncclCommAbort(w->own);
    w->own = nullptr;
}

ncclResult_t bm_tp_own_settle(bm_tp_ws *w, ncclResult_t r, cudaStream_t stream, unsigned long long deadline_ns,
                              int stream_too)
{
    r = bm_tp_poll(w->own, r, deadline_ns);
    if (r == ncclSuccess && stream_too) {
        cudaError_t e;
        while ((e = cudaStreamQuery(stream)) == cudaErrorNotReady && bm_tp_now_ns() <= deadline_ns)
            bm_tp_nap();
        if (e == cudaErrorNotReady)
            r = ncclInProgress;
        else if (e != cudaSuccess)
            r = ncclUnhandledCudaError;
    }
    if (r != ncclSuccess) {
        bm_tp_own_abort(w, BM_TP_NCCL_TIMEOUT);
        if (stream_too) /* NCCL's kernels end once aborted */
            cudaStreamSynchronize(stream);
        cudaGetLastError();
    }
    return r;
}

static void *bm_tp_watch_main(void *p)
{
    bm_tp_ws *w = (bm_tp_ws *)p;
    bm_tp_watch *d = w->watch;
    /* a tenth of the timeout between looks, within 1..100 ms */
    const unsigned step_ms = w->timeout_ms / 10 < 1 ? 1 : (w->timeout_ms / 10 > 100 ? 100 : w->timeout_ms / 10);
    unsigned long long ended = 0, since = 0;
    int waiting = 0;
    pthread_mutex_lock(&d->h.mu);
    while (!d->stop && w->own) {
        struct timespec until;
        bm_deadline(&until, (int32_t)step_ms);
        if (pthread_cond_timedwait(&d->h.cv, &d->h.mu, &until) != ETIMEDOUT)
            continue;
        const unsigned long long b = w->err_h->ag_begun, e = w->err_h->ag_ended, now = bm_tp_now_ns();
        if (b == e) {
            waiting = 0;
        } else if (!waiting || e != ended) {
            waiting = 1; /* an all-gather under way, or a later one */
            ended = e;
            since = now;
        } else if (now - since > (unsigned long long)w->timeout_ms * 1000000ull) {
            bm_tp_own_abort(w, BM_TP_NCCL_TIMEOUT);
        }
    }
    pthread_mutex_unlock(&d->h.mu);
    return nullptr;
}

int bm_tp_watch_start(bm_tp_ws *w)
{
    bm_tp_watch *d = (bm_tp_watch *)calloc(1, sizeof *d);
    if (!d)
        return -1;
    bm_host_init(&d->h, 1);
    w->watch = d;
    if (pthread_create(&d->thread, nullptr, bm_tp_watch_main, w) != 0) {
        w->watch = nullptr;
        bm_host_fini(&d->h);
        free(d);
        return -1;
    }
    return 0;
}

void bm_tp_watch_stop(bm_tp_ws *w)
{
    bm_tp_watch *d = w->watch;
    if (!d)
        return;
    pthread_mutex_lock(&d->h.mu);
    d->stop = 1;
    pthread_cond_signal(&d->h.cv);
    pthread_mutex_unlock(&d->h.mu);
    pthread_join(d->thread, nullptr);
    w->watch = nullptr;
    bm_host_fini(&d->h);
    free(d);
}

void bm_tp_own_close(bm_tp_ws *w)
{
    if (!w->own)
        return;
    const unsigned long long deadline = bm_tp_now_ns() + (unsigned long long)w->timeout_ms * 1000000ull;
    if (bm_tp_poll(w->own, ncclCommFinalize(w->own), deadline) == ncclSuccess &&
        ncclCommDestroy(w->own) == ncclSuccess) {
        w->own = nullptr;
        return;
    }
    ncclCommAbort(w->own);
    w->own = nullptr;
}
