/*
 * gather_group.cu - in-process groups of the CUDA backend (internal):
 * beam_cpu_group_create / beam_workspace_create_cpu on this backend.
 *
 * Each rank is a thread of this process and runs on the device current on
 * its thread when it makes its workspace. Ranks may share a device: R
 * ranks on one GPU run the real gather (the same kernels, flags and epochs
 * as R GPUs over NCCL, each rank with its own stream and buffers, its
 * peers' regions being buffers of the same device), which is how every
 * world size is tested on one GPU. Ranks on different devices need peer
 * access between them (cudaDeviceEnablePeerAccess). UNFUSED's all-gather
 * is a kernel over the peers' buffers instead of NCCL.
 *
 * Launch sizes: where ranks share a device, each rank's grid is capped so
 * that every rank's blocks are resident at once and half the device stays
 * free for the ranks' other kernels (bm_tp_caps; the caps are agreed by all
 * ranks), so a block that waits for a peer never keeps the peer from
 * running. Every kernel is loaded at creation (bm_tp_preload): a lazily
 * loaded kernel can wait for the device to be idle.
 *
 * Creation and destruction meet the other ranks on the host (lib/meet.h,
 * the CPU group's rendezvous, with its timeout rule): a rank that fails
 * still meets them, so every rank fails together; a rank that never comes
 * makes the others fail at the timeout (BEAM_ERR_COMM), and they withdraw,
 * so the group stays usable.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "gather_impl.h"
#include "meet.h"

/* What a rank tells the others at creation (values: nothing points into
 * another rank's host state). */
struct bm_tp_post {
    int ok;
    int device;
    int mapped; /* second meeting: every peer reachable from this rank */
    char *base;
    uint16_t *ag;
    int32_t gcap[BM_TP_NCAPS];
    int32_t sms; /* its device's multiprocessors */
    bm_tp_shape shape; /* what every rank must pass alike */
};

struct beam_cpu_group {
    int32_t nranks;
    bm_host host;         /* the lock of everything below; meetings (lib/meet.h) */
    bm_meet make, drop;   /* creation's meetings, destruction's */
    int32_t live;         /* workspaces alive on the group */
    int32_t making_n;     /* creations in progress (the group cannot go then) */
    char joined[BM_TP_MAX_RANKS];
    char making[BM_TP_MAX_RANKS]; /* a thread of the rank is creating one */
    bm_tp_post post[BM_TP_MAX_RANKS];
};

extern "C" beam_status bm_cuda_group_create(int32_t nranks, beam_cpu_group **group)
{
    static const char fn[] = "beam_cpu_group_create";
    if (nranks < 1 || nranks > BM_TP_MAX_RANKS)
        return bm_fail(BEAM_ERR_UNSUPPORTED, "%s: nranks=%d: the CUDA backend's groups hold 1 to %d ranks", fn,
                       (int)nranks, BM_TP_MAX_RANKS);
    beam_cpu_group *g = (beam_cpu_group *)calloc(1, sizeof *g);
    if (!g)
        return bm_fail(BEAM_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    g->nranks = nranks;
    bm_host_init(&g->host, nranks);
    *group = g;
    return BEAM_OK;
}

extern "C" beam_status bm_cuda_group_destroy(beam_cpu_group *g)
{
    pthread_mutex_lock(&g->host.mu);
    const int32_t live = g->live, making = g->making_n;
    pthread_mutex_unlock(&g->host.mu);
    if (live)
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT,
                       "beam_cpu_group_destroy: group still has %d live workspaces: destroy them first", (int)live);
    /* a creation waiting at the meeting would wake on freed memory */
    if (making)
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "beam_cpu_group_destroy: a beam_workspace_create_cpu call on this "
                       "group is in progress on another thread: destroy the group after it returns");
    bm_host_fini(&g->host);
    free(g);
    return BEAM_OK;
}

extern "C" beam_status bm_cuda_ws_create_group(beam_cpu_group *g, int32_t rank, bm_ws *ws, beam_status local)
{
    static const char fn[] = "beam_workspace_create_cpu";
    const int R = g->nranks;
    if (rank < 0 || rank >= R) /* no slot to tell the others in: they time out */
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: rank=%d must be in [0, %d) of the group", fn, (int)rank, R);
    const int timeout_ms = bm_meet_timeout(local, ws->cfg.timeout_ms);
    bm_tp_ws *w = nullptr;
    const char *what = nullptr;
    bm_tp_post mine;
    memset(&mine, 0, sizeof mine);
    mine.device = -1;

    pthread_mutex_lock(&g->host.mu);
    const beam_status claimed =
        bm_meet_claim_locked(&g->host, &g->make, g->joined, g->making, &g->making_n, rank, fn);
    pthread_mutex_unlock(&g->host.mu);
    if (claimed != BEAM_OK)
        return claimed;
    bool making = true; /* this call stands for its rank: cleared when it ends */
    if (local == BEAM_OK && cudaGetDevice(&mine.device) != cudaSuccess) {
        cudaGetLastError();
        local = bm_fail(BEAM_ERR_DEVICE, "%s: no current CUDA device", fn);
    }
    if (local == BEAM_OK && !(w = (bm_tp_ws *)calloc(1, sizeof *w)))
        local = bm_fail(BEAM_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    if (local == BEAM_OK) {
        w->group = g;
        w->device = mine.device;
        w->rank = rank;
        w->nranks = R;
        w->max_tokens = ws->max_tokens;
        w->hidden = ws->hidden;
        w->timeout_ms = (uint32_t)ws->cfg.timeout_ms;
        if ((what = bm_tp_alloc(w, ws, R)) != nullptr)
            local = bm_fail(BEAM_ERR_OUT_OF_MEMORY, "%s: allocating %s on device %d failed", fn, what,
                            mine.device);
    }
    mine.ok = local == BEAM_OK;
    if (mine.ok) {
        mine.base = w->base;
        mine.ag = w->ag;
        mine.shape = bm_tp_shape_of(ws);
        mine.sms = bm_tp_device_sms();
    }

    /* first meeting: every rank's record */
    beam_status st = BEAM_OK;
    bm_tp_post all[BM_TP_MAX_RANKS];
    pthread_mutex_lock(&g->host.mu);
    g->post[rank] = mine;
    st = bm_meet_wait_locked(&g->host, &g->make, rank, timeout_ms, fn, BM_MEET_WITHDRAW);
    memcpy(all, g->post, sizeof all);
    pthread_mutex_unlock(&g->host.mu);
    if (local != BEAM_OK) {
        st = local; /* its message stands */
        goto fail;
    }
    if (st != BEAM_OK)
        goto fail;
    for (int s = 0; s < R; ++s) {
        if (!all[s].ok) {
            st = bm_fail(BEAM_ERR_COMM, "%s: rank %d could not make its workspace", fn, s);
            goto fail;
        }
        if ((st = bm_tp_same_shape(fn, s, &all[s].shape, &mine.shape)) != BEAM_OK)
            goto fail;
        if (s == 0 || all[s].sms < w->sms)
            w->sms = all[s].sms;
    }

    /* launch caps for the ranks that share this device (bm_tp_caps), agreed
     * at the second meeting */
    {
        int share = 0;
        for (int t = 0; t < R; ++t)
            share += all[t].device == mine.device;
        bm_tp_caps(share, mine.gcap);
        w->shared = share > 1;
    }
    /* peers: the same device, or one this device may access */
    mine.mapped = 1;
    for (int s = 0; s < R; ++s) {
        if (all[s].device != mine.device) {
            int can = 0;
            if (cudaDeviceCanAccessPeer(&can, mine.device, all[s].device) != cudaSuccess || !can) {
                mine.mapped = 0;
            } else {
                const cudaError_t e = cudaDeviceEnablePeerAccess(all[s].device, 0);
                if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled)
                    mine.mapped = 0;
            }
            cudaGetLastError();
        }
        w->peer[s] = all[s].base;
        w->peer_ag[s] = all[s].ag;
    }
    /* second meeting: every rank reaches every peer, or all fail */
    pthread_mutex_lock(&g->host.mu);
    g->post[rank].mapped = mine.mapped;
    memcpy(g->post[rank].gcap, mine.gcap, sizeof mine.gcap);
    st = bm_meet_wait_locked(&g->host, &g->make, rank, timeout_ms, fn, BM_MEET_WITHDRAW);
    memcpy(all, g->post, sizeof all);
    for (int i = 0; i < BM_TP_NCAPS; ++i) {
        w->gcap[i] = mine.gcap[i];
        for (int s = 0; s < R; ++s)
            if (all[s].gcap[i] < w->gcap[i])
                w->gcap[i] = all[s].gcap[i];
    }
    if (st == BEAM_OK)
        for (int s = 0; s < R; ++s)
            if (!all[s].mapped) {
                st = bm_fail(BEAM_ERR_UNSUPPORTED,
                             "%s: rank %d (device %d) cannot access the memory of every other rank's device "
                             "(no peer access between them)",
                             fn, s, all[s].device);
                break;
            }
    if (st == BEAM_OK) {
        g->joined[rank] = 1;
        ++g->live;
    }
    g->making[rank] = 0;
    g->making_n--;
    making = false;
    pthread_mutex_unlock(&g->host.mu);
    if (st != BEAM_OK)
        goto fail;
    w->peers = 1;
    ws->rank = rank;
    ws->nranks = R;
    ws->impl = w;
    return BEAM_OK;

fail:
    if (making) {
        pthread_mutex_lock(&g->host.mu);
        g->making[rank] = 0;
        g->making_n--;
        pthread_mutex_unlock(&g->host.mu);
    }
    if (w)
        bm_tp_release(w);
    return st;
}

/* Collective: every kernel of this rank's device has ended (a waiting one
 * ends at its timeout), then every rank meets, then the buffers go, so no
 * peer still writes into them. A rank whose peers never come keeps its
 * buffers (a peer might still write into them) and reports it. */
beam_status bm_tp_group_destroy(bm_tp_ws *w, beam_status st)
{
    static const char fn[] = "beam_workspace_destroy";
    beam_cpu_group *g = w->group;
    cudaDeviceSynchronize();
    pthread_mutex_lock(&g->host.mu);
    const beam_status met = bm_meet_wait_locked(&g->host, &g->drop, w->rank, (int)w->timeout_ms < 1000 ? 1000 : (int)w->timeout_ms,
                                           fn, BM_MEET_WITHDRAW);
    if (met == BEAM_OK) {
        g->joined[w->rank] = 0;
        --g->live;
    }
    pthread_mutex_unlock(&g->host.mu);
    if (met != BEAM_OK)
        return met;
    bm_tp_release(w);
    return st;
}
