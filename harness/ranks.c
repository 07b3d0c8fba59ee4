/*
 * ranks.c - ranks as processes over NCCL (ranks.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* MAP_ANONYMOUS, usleep, kill under -std=c99 */
#endif

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ranks.h"

/* This process's rank (-1 in the parent), for the check macros. */
static struct {
    struct ranks_page *page;
    int rank, size, comms;
} rk = {NULL, -1, 0, 0};

#define BM_CHECK_RANK rk.rank
#include "checks.h"

/* The page every rank shares: one ncclUniqueId per communicator, and the
 * barrier's count and generation. */
typedef struct ranks_page {
    ncclUniqueId id[BM_RANKS_COMMS];
    volatile int id_ready[BM_RANKS_COMMS];
    volatile int bar_count, bar_gen;
} ranks_page;

void bm_ranks_barrier(void)
{
    ranks_page *s = rk.page;
    int gen = __atomic_load_n(&s->bar_gen, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&s->bar_count, 1, __ATOMIC_ACQ_REL) == rk.size) {
        __atomic_store_n(&s->bar_count, 0, __ATOMIC_RELAXED);
        __atomic_add_fetch(&s->bar_gen, 1, __ATOMIC_RELEASE);
    } else {
        while (__atomic_load_n(&s->bar_gen, __ATOMIC_ACQUIRE) == gen)
            usleep(50);
    }
}

ncclComm_t bm_ranks_comm(void)
{
    ranks_page *s = rk.page;
    const int i = rk.comms++;
    ncclComm_t c;
    if (i >= BM_RANKS_COMMS) FAIL("bm_ranks_comm: more than %d communicators in one run", BM_RANKS_COMMS);
    if (rk.rank == 0) {
        NK(ncclGetUniqueId(&s->id[i]));
        __atomic_store_n(&s->id_ready[i], 1, __ATOMIC_RELEASE);
    } else {
        while (!__atomic_load_n(&s->id_ready[i], __ATOMIC_ACQUIRE)) usleep(100);
    }
    NK(ncclCommInitRank(&c, rk.size, s->id[i], rk.rank));
    return c;
}

/* Kill every rank still running but `except` (0: none). */
static void kill_ranks(const pid_t *pids, const int *running, int R, pid_t except)
{
    int r;
    for (r = 0; r < R; ++r)
        if (running[r] && pids[r] != except) kill(pids[r], SIGKILL);
}

/* How a rank ended, for the message. */
static void describe_end(int status, char *buf, size_t n)
{
    if (WIFEXITED(status))
        snprintf(buf, n, "exit status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, n, "signal %d", WTERMSIG(status));
    else
        snprintf(buf, n, "wait status 0x%x", status);
}

int bm_ranks_run(const char *name, int R, int deadline_s, bm_rank_main rank_main, void *arg)
{
    pid_t pids[BM_RANKS_MAX];
    int running[BM_RANKS_MAX];
    const time_t start = time(NULL);
    int r, left, failed = 0, killing = 0;
    ranks_page *page;

    if (R < 1 || R > BM_RANKS_MAX) {
        fprintf(stderr, "%s: %d ranks: must be in [1, %d]\n", name, R, BM_RANKS_MAX);
        return 1;
    }
    setenv("NCCL_NVLS_ENABLE", "0", 1); /* never NVLink multicast */
    page = mmap(NULL, sizeof *page, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) {
        fprintf(stderr, "%s: mmap of the ranks' shared page: %s\n", name, strerror(errno));
        return 1;
    }
    memset((void *)page, 0, sizeof *page);
    rk.page = page;
    rk.size = R;
    fflush(stdout); /* a child must not print the parent's buffered output again */
    fflush(stderr);
    for (r = 0; r < R; ++r) {
        pids[r] = fork();
        if (pids[r] == 0) {
            /* line-buffered, flushed before _exit (which skips stdio) */
            int rc;
            setvbuf(stdout, NULL, _IOLBF, 0);
            rk.rank = r;
            rc = rank_main(r, R, arg);
            fflush(stdout);
            _exit(rc);
        }
        if (pids[r] < 0) {
            fprintf(stderr, "%s: fork of rank %d: %s\n", name, r, strerror(errno));
            R = r; /* end the ranks already started, then report */
            kill_ranks(pids, running, R, 0);
            killing = failed = 1;
            break;
        }
        running[r] = 1;
    }

    /* Wait for every rank; the first failure or the deadline ends the rest. */
    left = R;
    while (left > 0) {
        int status;
        const pid_t p = waitpid(-1, &status, WNOHANG);
        if (p > 0) {
            for (r = 0; r < R && pids[r] != p; ++r) {
            }
            if (r == R) continue; /* not a rank */
            running[r] = 0;
            --left;
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                char how[64];
                failed = 1;
                if (!killing) {
                    describe_end(status, how, sizeof how);
                    fprintf(stderr, "%s: rank %d failed (%s): killing the others\n", name, r, how);
                    killing = 1;
                    kill_ranks(pids, running, R, p);
                }
            }
            continue;
        }
        if (p < 0 && errno != EINTR) {
            fprintf(stderr, "%s: waitpid: %s\n", name, strerror(errno));
            kill_ranks(pids, running, R, 0);
            failed = 1;
            break;
        }
        if (!killing && deadline_s > 0 && time(NULL) - start > deadline_s) {
            fprintf(stderr, "%s: deadline of %d s passed: killing the ranks\n", name, deadline_s);
            killing = failed = 1;
            kill_ranks(pids, running, R, 0);
        }
        usleep(20000);
    }
    munmap((void *)page, sizeof *page);
    rk.page = NULL;
    return failed;
}
