/*
 * test_gather_nccl.c - the CUDA tensor-parallel gather over NCCL, one
 * process per GPU: the parts of tests/gather_parts.c (every strategy and
 * configuration against the naive reference, bit for bit; stress, the
 * all-reduce's stress, bad input, mismatch, overlapping calls, epoch wrap,
 * timeout), then "hosts":
 * ranks that act as if on different hosts (BEAM_GATHER_HOST) with NCCL on
 * its network transport (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1): AUTO
 * takes UNFUSED, ONESHOT and TWOSHOT are refused, results bit-identical.
 *
 * The parent never touches CUDA: it counts the GPUs in a probe child
 * (harness/gpu_probe.h) and starts R rank processes with the harness's
 * launcher (harness/ranks.h: a shared page for the ncclUniqueIds and the
 * host barrier, a deadline, a failing rank makes the others be killed, so
 * nothing hangs); each rank takes device `rank` and its communicator.
 *
 * Environment: BEAM_TEST_RANKS (default 2, at most the GPUs; 1 runs one
 * rank, for the parts that need no peer), BEAM_TEST_SEED,
 * BEAM_TEST_STRESS (calls per stress part, default 10000), BEAM_TEST_ONLY
 * (one part: sweep|large|stress|arstress|bad|mismatch|concurrent|wrap|
 * timeout|hosts),
 * BEAM_TEST_DEADLINE (seconds for the whole run, default 900).
 * Exit 0 pass, 1 fail, 77 skip (fewer than 2 GPUs that can run the cuda
 * backend).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "beammoe.h"
#include "gather_parts.h"
#include "gpu_probe.h"
#include "ranks.h"

/* ---- the ranks (harness/ranks.h) ------------------------------------------ */

static ncclComm_t g_comm;

void host_barrier(void)
{
    bm_ranks_barrier();
}

static beam_status make_nccl(int64_t max_tokens, int32_t hidden, const beam_workspace_config *cfg,
                             beam_workspace **ws)
{
    return beam_workspace_create_nccl((void *)g_comm, max_tokens, hidden, cfg, ws);
}

/* Part "hosts" (tests/gather_parts.c): a communicator made after this
 * rank took a host name of its own (BEAM_GATHER_HOST) and NCCL was told to
 * use its network transport, so that the ranks act as on different hosts;
 * made at the part's first workspace, destroyed after the parts. */
static ncclComm_t g_hosts_comm;

static beam_status make_hosts(int64_t max_tokens, int32_t hidden, const beam_workspace_config *cfg,
                              beam_workspace **ws)
{
    if (!g_hosts_comm) {
        char host[32];
        snprintf(host, sizeof host, "rank-%d", g_rank);
        setenv("BEAM_GATHER_HOST", host, 1);
        setenv("NCCL_P2P_DISABLE", "1", 1);
        setenv("NCCL_SHM_DISABLE", "1", 1);
        g_hosts_comm = bm_ranks_comm();
    }
    return beam_workspace_create_nccl((void *)g_hosts_comm, max_tokens, hidden, cfg, ws);
}

/* ---- processes -------------------------------------------------------------- */

/* One rank: device `rank`, its communicator, the parts. */
static int rank_main(int rank, int R, void *arg)
{
    uint64_t seed = getenv("BEAM_TEST_SEED") ? strtoull(getenv("BEAM_TEST_SEED"), NULL, 0) : 20261130ull;
    const char *only = getenv("BEAM_TEST_ONLY");
    int stress = getenv("BEAM_TEST_STRESS") ? atoi(getenv("BEAM_TEST_STRESS")) : 10000;
    g_rank = rank;
    g_R = R;
    g_dev = rank;
    g_ndev = *(const int *)arg;
    g_threads = 0;
    g_make = make_nccl;
    g_make_hosts = make_hosts;
    CK(cudaSetDevice(rank));
    g_comm = bm_ranks_comm();
    if (rank == 0) printf("test_gather_nccl: %d ranks, seed %llu\n", R, (unsigned long long)seed);
    gp_run_parts(seed, stress, only);
    if (g_hosts_comm) {
        NK(ncclCommDestroy(g_hosts_comm));
        unsetenv("BEAM_GATHER_HOST");
    }
    NK(ncclCommDestroy(g_comm));
    return 0;
}

int main(void)
{
    char why[300];
    int ndev = bm_gpu_probe(why, sizeof why);
    int R = getenv("BEAM_TEST_RANKS") ? atoi(getenv("BEAM_TEST_RANKS")) : 2;
    const int deadline_s = getenv("BEAM_TEST_DEADLINE") ? atoi(getenv("BEAM_TEST_DEADLINE")) : 900;

    /* BEAM_TEST_RANKS=1: one rank on one GPU, the workspace's own
     * communicator made and used alone (with BEAM_TEST_ONLY=sweep or large,
     * the parts that need no peer) */
    if (R == 1 && ndev >= 1) {
        if (bm_ranks_run("test_gather_nccl", 1, deadline_s, rank_main, &ndev) != 0) return 1;
        printf("test_gather_nccl: PASS (one rank)\n");
        return 0;
    }
    if (ndev < 2) {
        printf("test_gather_nccl: %s, 2 needed: skipped\n", why);
        return 77;
    }
    if (R < 2) R = 2;
    if (R > ndev) R = ndev;
    if (R > 8) R = 8;
    if (bm_ranks_run("test_gather_nccl", R, deadline_s, rank_main, &ndev) != 0) return 1;
    printf("test_gather_nccl: PASS\n");
    return 0;
}
