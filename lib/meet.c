/*
 * meet.c - the host rendezvous of the in-process groups (lib/meet.h).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>

#include "error.h"
#include "meet.h"

void bm_host_init(bm_host *h, int32_t nranks)
{
    pthread_condattr_t attr;
    h->nranks = nranks;
    h->broken = 0;
    pthread_mutex_init(&h->mu, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&h->cv, &attr);
    pthread_condattr_destroy(&attr);
}

void bm_host_fini(bm_host *h)
{
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
}

void bm_deadline(struct timespec *ts, int32_t ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec += 1;
        ts->tv_nsec -= 1000000000L;
    }
}

int32_t bm_meet_timeout(beam_status local, int32_t timeout_ms)
{
    return local == BEAM_OK ? timeout_ms : 30000;
}

beam_status bm_meet_wait_locked(bm_host *h, bm_meet *m, int32_t rank, int32_t timeout_ms, const char *fn, int how)
{
    const uint64_t gen = m->gen;
    struct timespec ts;
    int32_t refused = 0;
    int timed_out = 0;

    if (h->broken)
        return bm_fail(BEAM_ERR_COMM, "%s: rank %d: an earlier timeout broke the group (destroy it)", fn,
                       (int)rank);
    if (++m->arrived == h->nranks) {
        m->arrived = 0;
        m->refused = 0;
        m->gen++;
        pthread_cond_broadcast(&h->cv);
        return BEAM_OK;
    }
    bm_deadline(&ts, timeout_ms);
    while (m->gen == gen && !h->broken && !(refused = how == BM_MEET_WITHDRAW ? m->refused : 0) && !timed_out)
        timed_out = pthread_cond_timedwait(&h->cv, &h->mu, &ts) == ETIMEDOUT && m->gen == gen;
    if (m->gen != gen)
        return BEAM_OK;
    if (how == BM_MEET_WITHDRAW || h->broken) {
        if (--m->arrived == 0)
            m->refused = 0;
    } else {
        h->broken = 1;
        pthread_cond_broadcast(&h->cv);
    }
    if (refused)
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: rank %d already holds a workspace on this group and "
                       "refused to join; nothing was created (the group and its workspaces are unchanged)", fn,
                       (int)refused - 1);
    if (how == BM_MEET_WITHDRAW && timed_out)
        return bm_fail(BEAM_ERR_COMM, "%s: rank %d: a peer did not arrive within timeout_ms=%d; nothing was done "
                       "(the group and its workspaces are unchanged)", fn, (int)rank, (int)timeout_ms);
    return bm_fail(BEAM_ERR_COMM, "%s: rank %d: a peer did not arrive within timeout_ms=%d, or an earlier "
                   "timeout broke the group (destroy it)", fn, (int)rank, (int)timeout_ms);
}

beam_status bm_meet_wait(bm_host *h, bm_meet *m, int32_t rank, int32_t timeout_ms, const char *fn, int how)
{
    beam_status st;
    pthread_mutex_lock(&h->mu);
    st = bm_meet_wait_locked(h, m, rank, timeout_ms, fn, how);
    pthread_mutex_unlock(&h->mu);
    return st;
}

void bm_meet_refuse_locked(bm_host *h, bm_meet *m, int32_t rank)
{
    if (m->arrived > 0) {
        m->refused = rank + 1;
        pthread_cond_broadcast(&h->cv);
    }
}

beam_status bm_meet_claim_locked(bm_host *h, bm_meet *make, const char *joined, char *making, int32_t *making_n,
                                 int32_t rank, const char *fn)
{
    if (making[rank])
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: rank=%d: another %s call for this rank is in progress on "
                       "another thread (one at a time per rank)", fn, (int)rank, fn);
    if (joined[rank]) {
        bm_meet_refuse_locked(h, make, rank);
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: rank=%d already holds a workspace on this group (one per "
                       "rank: destroy it first); nothing was created and that workspace is unchanged", fn,
                       (int)rank);
    }
    making[rank] = 1;
    ++*making_n;
    return BEAM_OK;
}
