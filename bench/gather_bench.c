/*
 * gather_bench.c - timing of beam_moe_finalize_gather_norm_residual_norm on
 * several GPUs through NCCL, one process per GPU, started like the test's
 * ranks (harness/ranks.h: a failing rank makes the others be killed).
 *
 * For each T, every strategy (UNFUSED, ONESHOT, TWOSHOT, AUTO) in the same
 * run: a CUDA graph of NI back-to-back calls is captured, warmed up, then
 * replayed REPS times (each call of a graph works on other rows where they
 * fit, so that small T are not measured out of L2 alone); each replay is
 * timed with CUDA events on rank 0's stream, and the median per call is reported, with the speed-up over
 * UNFUSED (the NCCL all-gather between the library's own kernels).
 * Both ranks replay the same graphs in the same order.
 *
 * Defaults: TP = 2, H = 7168, K = 8, T in {1, 8, 64, 512, 4096, 16384},
 * post-norm and next-norm with weights, scales. Environment:
 * BEAM_BENCH_RANKS, BEAM_BENCH_H, BEAM_BENCH_K, BEAM_BENCH_T (comma list),
 * BEAM_BENCH_REPS, BEAM_BENCH_ONESHOT_MAX / BEAM_BENCH_TWOSHOT_MAX (AUTO's
 * thresholds; default: the backend's).
 * Exit 77 when fewer GPUs than ranks can run the cuda backend
 * (harness/gpu_probe.h).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "beammoe.h"

static int g_rank = -1; /* this process's rank, for the check macros */

/* Failures name the rank (harness/checks.h). */
#define BM_CHECK_RANK g_rank
#include "checks.h"
#include "gpu_probe.h"
#include "ranks.h"

static int envi(const char *n, int d)
{
    const char *v = getenv(n);
    return v && *v ? atoi(v) : d;
}

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Fill n BF16 values with a repeating random block (fast for GBs). */
static void fill_bf16(uint16_t *d, size_t n, uint32_t seed)
{
    enum { B = 1 << 20 };
    static uint16_t h[B];
    size_t i, done;
    uint32_t s = seed * 2654435761u + 1;
    for (i = 0; i < B; ++i) {
        s = s * 1664525u + 1013904223u;
        h[i] = (uint16_t)(((s >> 31) << 15) | ((121 + (s >> 8) % 10) << 7) | ((s >> 16) & 0x7F));
    }
    for (done = 0; done < n; done += B) {
        size_t c = n - done < B ? n - done : B;
        CK(cudaMemcpy(d + done, h, c * 2, cudaMemcpyHostToDevice));
    }
}

static const beam_strategy STRATS[4] = {BEAM_STRATEGY_UNFUSED, BEAM_STRATEGY_ONESHOT, BEAM_STRATEGY_TWOSHOT,
                                        BEAM_STRATEGY_AUTO};

/* One rank: device `rank`, its communicator, the table (printed by rank 0). */
static int bench_rank(int rank, int R, void *arg)
{
    const int H = envi("BEAM_BENCH_H", 7168), K = envi("BEAM_BENCH_K", 8);
    const int reps = envi("BEAM_BENCH_REPS", 25);
    int64_t Ts[32];
    int nT = 0, t, s, i;
    int64_t maxT = 0;
    ncclComm_t comm;
    beam_workspace *ws;
    beam_workspace_config cfg;
    cudaStream_t st;
    cudaEvent_t e0, e1;
    uint16_t *x, *res, *hid, *nrm, *pw, *nw;
    float *w, sc[2] = {1.0f, 1.0f};
    beam_norm post, next;
    {
        const char *tl = getenv("BEAM_BENCH_T");
        char buf[512], *tok;
        snprintf(buf, sizeof buf, "%s", tl && *tl ? tl : "1,8,64,512,4096,16384");
        for (tok = strtok(buf, ","); tok && nT < 32; tok = strtok(NULL, ",")) {
            Ts[nT] = atoll(tok);
            if (Ts[nT] > maxT) maxT = Ts[nT];
            ++nT;
        }
    }
    (void)arg;
    g_rank = rank;
    CK(cudaSetDevice(rank));
    comm = bm_ranks_comm();
    {
        const int64_t Lmax = (maxT + R - 1) / R;
        CK(cudaMalloc((void **)&x, (size_t)Lmax * K * H * 2));
        CK(cudaMalloc((void **)&w, (size_t)Lmax * K * 4));
        CK(cudaMalloc((void **)&res, (size_t)maxT * H * 2));
        CK(cudaMalloc((void **)&hid, (size_t)maxT * H * 2));
        CK(cudaMalloc((void **)&nrm, (size_t)maxT * H * 2));
        CK(cudaMalloc((void **)&pw, (size_t)H * 2));
        CK(cudaMalloc((void **)&nw, (size_t)H * 2));
        fill_bf16(x, (size_t)Lmax * K * H, 1 + rank);
        fill_bf16(res, (size_t)maxT * H, 7);
        fill_bf16(pw, (size_t)H, 8);
        fill_bf16(nw, (size_t)H, 9);
        {
            float *hw = malloc((size_t)Lmax * K * 4);
            for (i = 0; i < Lmax * K; ++i) hw[i] = (float)((i * 37 % 101) / 101.0);
            CK(cudaMemcpy(w, hw, (size_t)Lmax * K * 4, cudaMemcpyHostToDevice));
            free(hw);
        }
    }
    post = (beam_norm){pw, 1e-6f};
    next = (beam_norm){nw, 1e-6f};
    cfg = beam_workspace_config_default();
    if (getenv("BEAM_BENCH_ONESHOT_MAX")) cfg.oneshot_max_tokens = envi("BEAM_BENCH_ONESHOT_MAX", 0);
    if (getenv("BEAM_BENCH_TWOSHOT_MAX")) cfg.twoshot_max_tokens = envi("BEAM_BENCH_TWOSHOT_MAX", 0);
    BK(beam_workspace_create_nccl((void *)comm, maxT, H, &cfg, &ws));
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    if (rank == 0) {
        printf("gather_bench: TP=%d H=%d K=%d, post+next norms with weights, scales; AUTO: oneshot<=%lld, "
               "twoshot<=%lld, else unfused\n",
               R, H, K, (long long)cfg.oneshot_max_tokens, (long long)cfg.twoshot_max_tokens);
        printf("median us per call over %d graph replays (rank 0)\n", reps);
        printf("%8s %10s %10s %10s %10s %9s %9s %9s\n", "T", "unfused", "oneshot", "twoshot", "auto",
               "one/unf", "two/unf", "auto/best");
        fflush(stdout);
    }
    for (t = 0; t < nT; ++t) {
        const int64_t T = Ts[t], L = (T + R - 1) / R;
        const int ni = T <= 512 ? 20 : (T <= 4096 ? 5 : 2);
        float med[4];
        for (s = 0; s < 4; ++s) {
            cudaGraph_t g;
            cudaGraphExec_t ex;
            float *ms = malloc(sizeof(float) * (size_t)reps);
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            for (i = 0; i < ni; ++i) {
                /* each call of the graph on other rows where they fit, so
                 * that small T are not timed out of L2 alone */
                const int64_t o = (int64_t)(i + 1) * T <= maxT && (int64_t)(i + 1) * L <= (maxT + R - 1) / R ? (int64_t)i : 0;
                const size_t ro = (size_t)(o * T) * H, xo = (size_t)(o * L) * K;
                BK(beam_moe_finalize_gather_norm_residual_norm(ws, x + xo * H, w + xo, L, T, K, H, 1.0f, &post,
                                                               res + ro, sc, &next, hid + ro, nrm + ro, STRATS[s],
                                                               st));
            }
            CK(cudaStreamEndCapture(st, &g));
            CK(cudaGraphInstantiate(&ex, g, 0));
            for (i = 0; i < 3; ++i) CK(cudaGraphLaunch(ex, st));
            for (i = 0; i < reps; ++i) {
                CK(cudaEventRecord(e0, st));
                CK(cudaGraphLaunch(ex, st));
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                CK(cudaEventElapsedTime(&ms[i], e0, e1));
            }
            qsort(ms, (size_t)reps, sizeof(float), cmp_f);
            med[s] = ms[reps / 2] * 1000.0f / (float)ni;
            free(ms);
            CK(cudaGraphExecDestroy(ex));
            CK(cudaGraphDestroy(g));
        }
        if (rank == 0) {
            float best = med[0];
            for (s = 1; s < 3; ++s)
                if (med[s] < best) best = med[s];
            printf("%8lld %10.2f %10.2f %10.2f %10.2f %8.2fx %8.2fx %8.3f\n", (long long)T, med[0], med[1], med[2],
                   med[3], med[0] / med[1], med[0] / med[2], med[3] / best);
            fflush(stdout);
        }
    }
    BK(beam_workspace_destroy(ws));
    NK(ncclCommDestroy(comm));
    return 0;
}

int main(void)
{
    char why[300];
    const int ndev = bm_gpu_probe(why, sizeof why);
    const int R = envi("BEAM_BENCH_RANKS", 2);
    if (R < 1 || R > 8 || ndev < R) {
        printf("gather_bench: %s, %d ranks asked: skipped\n", why, R);
        return 77;
    }
    return bm_ranks_run("gather_bench", R, 0, bench_rank, NULL);
}
