/*
 * ranks.h - R ranks as processes of one host, one per GPU, joined over
 * NCCL: how the NCCL gather's test (tests/test_gather_nccl.c) and its
 * benchmark (bench/gather_bench.c) start and end their ranks.
 *
 * The calling process forks the ranks and waits for them; it never touches
 * CUDA itself (a forked child cannot use its parent's CUDA state: count
 * the GPUs with bm_gpu_probe, which asks in a child too). The ranks share
 * one page (mmap MAP_SHARED) that carries the ncclUniqueIds and a host
 * barrier. A rank that fails makes the others be killed, and so does the
 * deadline: nothing waits for a dead peer forever.
 */
#ifndef BEAMMOE_HARNESS_RANKS_H
#define BEAMMOE_HARNESS_RANKS_H

#include <nccl.h>

/* The most ranks of one run, and NCCL communicators a run may make. */
#define BM_RANKS_MAX 64
#define BM_RANKS_COMMS 8

/* The body of one rank, run in its own process; its return value is the
 * process's exit status (0: success). Stdout is line-buffered there. */
typedef int (*bm_rank_main)(int rank, int R, void *arg);

/* Run rank_main(rank, R, arg) for every rank in [0, R) (1 <= R <=
 * BM_RANKS_MAX), each in a forked process, and wait for all of them. The
 * first rank that fails (a nonzero exit or a signal) makes the others be
 * killed; so does the deadline (deadline_s > 0: seconds from this call;
 * 0: none). Sets NCCL_NVLS_ENABLE=0 for the ranks: NVLink multicast is
 * never used. name starts the messages. Returns 0 when every rank ended
 * with 0, else 1. */
int bm_ranks_run(const char *name, int R, int deadline_s, bm_rank_main rank_main, void *arg);

/* In a rank: wait until every rank got here. */
void bm_ranks_barrier(void);

/* In a rank: a new NCCL communicator over every rank (collective). The
 * i-th call of each rank joins the i-th call of the others; rank 0 makes
 * its ncclUniqueId in the shared page. Failures end the rank
 * (harness/checks.h). */
ncclComm_t bm_ranks_comm(void);

#endif
