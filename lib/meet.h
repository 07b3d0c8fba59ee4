/*
 * meet.h - the host rendezvous of the in-process groups (internal): ranks
 * that are threads of one process meet, each wait bounded by one timeout
 * rule. cpu/group.c meets at it for creation and for every gather;
 * gpu/gather_group.cu for creation and destruction (its gathers meet on
 * the device).
 *
 * A meeting completes when all nranks have arrived; its generation is
 * 64-bit and only compared for equality (at one meeting a nanosecond it
 * would take 584 years to wrap), so a waiter never mistakes a later
 * meeting for its own. A rank that gives up at the timeout either
 * withdraws (BM_MEET_WITHDRAW: for a meeting that nothing has happened
 * before, such as a creation's first; its arrival is taken back, the count
 * stays right and the group keeps working) or breaks the group
 * (BM_MEET_BREAK: in the middle of an exchange, where the count no longer
 * says who is where; every later meeting of the group then fails at once).
 */
#ifndef BEAMMOE_LIB_MEET_H
#define BEAMMOE_LIB_MEET_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "beammoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the ranks of a group share: one lock for every meeting. */
typedef struct bm_host {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t nranks;
    int broken; /* a BM_MEET_BREAK meeting timed out */
} bm_host;

/* One rendezvous of a group. */
typedef struct bm_meet {
    uint64_t gen;
    int32_t arrived;
    /* rank + 1 of a rank that refused the meeting under way (creation: it
     * already holds a workspace), 0 if none: its waiters give up at once;
     * cleared when the last of them has left */
    int32_t refused;
} bm_meet;

enum { BM_MEET_BREAK = 0, BM_MEET_WITHDRAW = 1 };

/* h's lock, and its condition on the monotonic clock (bm_deadline's) */
void bm_host_init(bm_host *h, int32_t nranks);
void bm_host_fini(bm_host *h);

/* *ts := now + ms on the monotonic clock, for pthread_cond_timedwait on a
 * bm_host's condition */
void bm_deadline(struct timespec *ts, int32_t ms);

/* The one timeout rule: the workspace's timeout_ms, or 30 s for a rank
 * whose own arguments failed (its timeout_ms is not to be trusted). */
int32_t bm_meet_timeout(beam_status local, int32_t timeout_ms);

/* Meet at m as rank `rank`: BEAM_OK when all came; else BEAM_ERR_COMM (the
 * timeout, a broken group) or BEAM_ERR_INVALID_ARGUMENT (a peer refused),
 * with a message naming fn. bm_meet_wait_locked: h->mu held by the caller (it
 * is released while waiting). */
beam_status bm_meet_wait(bm_host *h, bm_meet *m, int32_t rank, int32_t timeout_ms, const char *fn, int how);
beam_status bm_meet_wait_locked(bm_host *h, bm_meet *m, int32_t rank, int32_t timeout_ms, const char *fn,
                                int how);

/* h->mu held: rank refuses the meeting under way at m, if any: its waiters
 * give up at once. */
void bm_meet_refuse_locked(bm_host *h, bm_meet *m, int32_t rank);

/* h->mu held: rank's workspace creation (fn) starts, meeting at make.
 * Refused at once, without meeting, when a thread of the rank is already
 * creating one (a meeting counts arrivals, not ranks: two threads of one
 * rank would complete it without a peer), or when the rank already holds
 * one (joined[rank]: peers that are not creating would wait for it; those
 * waiting in a creation give up at once). Else making[rank] is set and
 * *making_n counted; the caller clears them when the creation ends. */
beam_status bm_meet_claim_locked(bm_host *h, bm_meet *make, const char *joined, char *making, int32_t *making_n,
                                 int32_t rank, const char *fn);

#ifdef __cplusplus
}
#endif

#endif
