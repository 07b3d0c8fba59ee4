/*
 * test_gather_nccl.c - the CUDA tensor-parallel gather over NCCL, one
 * process per GPU: the parts of tests/gather_parts.c (every strategy and
 * configuration against the naive reference, bit for bit; stress, bad
 * input, mismatch, overlapping calls, epoch wrap, timeout), then "hosts":
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
 * Environment: BEAM_TEST_RANKS (default 2, at most the GPUs), BEAM_TEST_SEED,
 * BEAM_TEST_STRESS (calls per stress part, default 10000), BEAM_TEST_ONLY
 * (one part: sweep|large|stress|bad|mismatch|concurrent|wrap|timeout|hosts),
 * BEAM_TEST_DEADLINE (seconds for the whole run, default 900).
 * Exit 0 pass, 1 fail, 77 skip (fewer than 2 GPUs that can run the cuda
 * backend).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "beammoe.h"
#include "gather_parts.h"
#include "gpu_probe.h"
#include "naive_ref.h"
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

/* Ranks that act as if on different hosts, NCCL over its network
 * transport: AUTO (thresholds left at the defaults) must take UNFUSED and
 * give the reference's bits, ONESHOT and TWOSHOT are refused as
 * unsupported, UNFUSED works. */
static void part_hosts(uint64_t seed)
{
    char host[32];
    const int64_t Ts[] = {1, (int64_t)g_R + 1, 200};
    const beam_strategy st[2] = {BEAM_STRATEGY_AUTO, BEAM_STRATEGY_UNFUSED};
    const int H = 2048, K = 8;
    beam_workspace *ws = NULL;
    ncclComm_t c;
    int t, s;
    (void)seed;
    snprintf(host, sizeof host, "rank-%d", g_rank);
    setenv("BEAM_GATHER_HOST", host, 1);
    setenv("NCCL_P2P_DISABLE", "1", 1);
    setenv("NCCL_SHM_DISABLE", "1", 1);
    c = bm_ranks_comm();
    BK(beam_workspace_create_nccl((void *)c, 256, H, NULL, &ws));
    for (t = 0; t < 3; ++t) {
        /* one fused-op reference: the gather must equal it for every T */
        const int64_t T = Ts[t], L = (T + g_R - 1) / g_R;
        const int64_t lo = (int64_t)g_rank * L;
        uint16_t *x = malloc((size_t)T * K * H * 2), *res = malloc((size_t)T * H * 2), *w = malloc((size_t)H * 2);
        uint16_t *rh = malloc((size_t)T * H * 2), *rn = malloc((size_t)T * H * 2);
        uint16_t *oh = malloc((size_t)T * H * 2), *on = malloc((size_t)T * H * 2);
        float *wt = malloc((size_t)T * K * 4);
        uint16_t *dx, *dres, *dw, *dh, *dn;
        float *dwt;
        nr_norm nn = {1, NULL, 1e-6f};
        beam_norm bn = {NULL, 1e-6f};
        int64_t i;
        if (!x || !res || !w || !rh || !rn || !oh || !on || !wt) FAIL("out of host memory");
        for (i = 0; i < T * K * H; ++i) x[i] = (uint16_t)(0x3C00 + (i * 2654435761u >> 20) % 0x400);
        for (i = 0; i < T * H; ++i) res[i] = (uint16_t)(0x3F00 + (i * 40503u >> 4) % 0x200);
        for (i = 0; i < H; ++i) w[i] = (uint16_t)(0x3F80 + i % 64);
        for (i = 0; i < T * K; ++i) wt[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.4f;
        nn.weight = w;
        nr_finalize_norm_residual_norm(x, wt, T, K, H, 1.0f, NULL, res, NULL, &nn, rh, rn);
        CK(cudaMalloc((void **)&dx, (size_t)T * K * H * 2));
        CK(cudaMalloc((void **)&dwt, (size_t)T * K * 4));
        CK(cudaMalloc((void **)&dres, (size_t)T * H * 2));
        CK(cudaMalloc((void **)&dw, (size_t)H * 2));
        CK(cudaMalloc((void **)&dh, (size_t)T * H * 2));
        CK(cudaMalloc((void **)&dn, (size_t)T * H * 2));
        CK(cudaMemcpy(dx, x, (size_t)T * K * H * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dwt, wt, (size_t)T * K * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dres, res, (size_t)T * H * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dw, w, (size_t)H * 2, cudaMemcpyHostToDevice));
        bn.weight = dw;
        for (s = 0; s < 2; ++s) {
            CK(cudaMemset(dh, 0xFF, (size_t)T * H * 2));
            CK(cudaMemset(dn, 0xFF, (size_t)T * H * 2));
            BK(beam_moe_finalize_gather_norm_residual_norm(ws, dx + (size_t)lo * K * H, dwt + (size_t)lo * K, L, T,
                                                           K, H, 1.0f, NULL, dres, NULL, &bn, dh, dn, st[s], 0));
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(oh, dh, (size_t)T * H * 2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(on, dn, (size_t)T * H * 2, cudaMemcpyDeviceToHost));
            if (memcmp(oh, rh, (size_t)T * H * 2) || memcmp(on, rn, (size_t)T * H * 2))
                FAIL("hosts: T=%lld %s: outputs differ from the reference", (long long)T, s ? "UNFUSED" : "AUTO");
        }
        if (beam_moe_finalize_gather_norm_residual_norm(ws, dx + (size_t)lo * K * H, dwt + (size_t)lo * K, L, T, K,
                                                        H, 1.0f, NULL, dres, NULL, &bn, dh, dn,
                                                        BEAM_STRATEGY_ONESHOT, 0) != BEAM_ERR_UNSUPPORTED ||
            !strstr(beam_last_error(), "peer memory"))
            FAIL("hosts: ONESHOT across hosts: expected BEAM_ERR_UNSUPPORTED, got \"%s\"", beam_last_error());
        cudaFree(dx); cudaFree(dwt); cudaFree(dres); cudaFree(dw); cudaFree(dh); cudaFree(dn);
        free(x); free(res); free(w); free(rh); free(rn); free(oh); free(on); free(wt);
    }
    BK(beam_workspace_destroy(ws));
    NK(ncclCommDestroy(c));
    unsetenv("BEAM_GATHER_HOST");
    host_barrier();
    if (g_rank == 0) printf("hosts: ranks on different hosts take UNFUSED over NCCL's network transport, bit-identical\n");
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
    CK(cudaSetDevice(rank));
    g_comm = bm_ranks_comm();
    if (rank == 0) printf("test_gather_nccl: %d ranks, seed %llu\n", R, (unsigned long long)seed);
    if (!only || strcmp(only, "hosts")) gp_run_parts(seed, stress, only);
    if (!only || !strcmp(only, "hosts")) part_hosts(seed);
    NK(ncclCommDestroy(g_comm));
    return 0;
}

int main(void)
{
    char why[300];
    int ndev = bm_gpu_probe(why, sizeof why);
    int R = getenv("BEAM_TEST_RANKS") ? atoi(getenv("BEAM_TEST_RANKS")) : 2;
    const int deadline_s = getenv("BEAM_TEST_DEADLINE") ? atoi(getenv("BEAM_TEST_DEADLINE")) : 900;

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
