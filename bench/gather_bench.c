/*
 * gather_bench.c - timing of the tensor-parallel collectives on several
 * GPUs through NCCL, one process per GPU, started like the test's ranks
 * (harness/ranks.h: a failing rank makes the others be killed):
 * beam_moe_finalize_gather_norm_residual_norm (BEAM_BENCH_COLL=gather, the
 * default), beam_allreduce_norm_residual_norm (allreduce: each rank's
 * partial [T, H]) or beam_moe_finalize_allreduce_norm_residual_norm
 * (allreduce-moe: each rank's partial slots [T, K, H]).
 *
 * For each T, every strategy (UNFUSED, ONESHOT, TWOSHOT, AUTO) in the same
 * run, and for the all-reduce what an engine runs without the library:
 * ncclAllReduce of the BF16 partials, then norm_residual_norm (the MoE
 * form: finalize, ncclAllReduce, norm_residual_norm with the post-norm as
 * its pre-norm). A CUDA graph of NI back-to-back calls is captured,
 * warmed up, then replayed REPS times (each call of a graph works on other
 * rows where they fit, so that small T are not measured out of L2 alone);
 * each replay is timed with CUDA events on rank 0's stream, and the median
 * per call is reported, with the speed-ups over UNFUSED (the gather) or
 * over NCCL's all-reduce and a separate norm (the all-reduce). All ranks
 * replay the same graphs in the same order.
 *
 * Defaults: TP = 2, H = 7168, K = 8, T in {1, 8, 64, 512, 4096, 16384},
 * the gather's post-norm (the all-reduce: no pre-norm, the MoE form's
 * post-norm) and next norm with weights, scales. Environment:
 * BEAM_BENCH_COLL, BEAM_BENCH_RANKS, BEAM_BENCH_H, BEAM_BENCH_K,
 * BEAM_BENCH_T (comma list), BEAM_BENCH_REPS, BEAM_BENCH_FP8=1 (the
 * all-reduce: normalized as FP8 with group-128 scales instead of BF16),
 * BEAM_BENCH_ONESHOT_MAX / BEAM_BENCH_TWOSHOT_MAX (AUTO's thresholds;
 * default: the backend's).
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

/* The columns: the library's strategies, then (the all-reduce) NCCL's
 * all-reduce with a separate norm. */
static const beam_strategy STRATS[4] = {BEAM_STRATEGY_UNFUSED, BEAM_STRATEGY_ONESHOT, BEAM_STRATEGY_TWOSHOT,
                                        BEAM_STRATEGY_AUTO};
#define NCOLS 5
#define BASE 4
enum { COLL_GATHER, COLL_AR, COLL_AR_MOE };

/* One rank's arrays and arguments. */
typedef struct bench {
    int coll, R, H, K;
    int64_t maxT;
    ncclComm_t comm;
    beam_workspace *ws;
    uint16_t *x, *res, *hid, *nrm, *sum;
    float *w, sc[2];
    beam_norm post, next;
    uint8_t *qv;
    float *qs;
    int fp8;
} bench;

/* Call i of a graph for T tokens in column c. */
static void bench_call(const bench *b, int64_t T, int i, int c, cudaStream_t st)
{
    const int R = b->R, H = b->H, K = b->K;
    const int64_t L = (T + R - 1) / R, rowsx = b->coll == COLL_GATHER ? L : T;
    const int64_t maxx = b->coll == COLL_GATHER ? (b->maxT + R - 1) / R : b->maxT;
    /* each call of the graph on other rows where they fit, so that small T
     * are not timed out of L2 alone */
    const int64_t o = (int64_t)(i + 1) * T <= b->maxT && (int64_t)(i + 1) * rowsx <= maxx ? (int64_t)i : 0;
    const size_t ro = (size_t)(o * T) * H, xo = (size_t)(o * rowsx) * (b->coll == COLL_AR ? 1 : K);
    beam_quant q = {0}, *qp = NULL;
    uint16_t *nrm = b->nrm + ro;
    if (b->fp8) {
        q.kind = BEAM_QUANT_FP8_GROUP;
        q.group_size = 128;
        q.values = b->qv + ro;
        q.scales = b->qs + ro / 128;
        qp = &q;
        nrm = NULL;
    }
    if (b->coll == COLL_GATHER) {
        BK(beam_moe_finalize_gather_norm_residual_norm(b->ws, b->x + xo * H, b->w + xo, L, T, K, H, 1.0f, &b->post,
                                                       b->res + ro, b->sc, &b->next, b->hid + ro, b->nrm + ro,
                                                       STRATS[c], st));
        return;
    }
    if (c == BASE) {
        const uint16_t *part = b->x + xo * H;
        if (b->coll == COLL_AR_MOE) {
            BK(beam_moe_finalize(b->x + xo * H, b->w + xo, T, T, K, H, 1.0f, NULL, b->sum + ro, st));
            part = b->sum + ro;
        }
        NK(ncclAllReduce(part, b->sum + ro, (size_t)T * H, ncclBfloat16, ncclSum, b->comm, st));
        BK(beam_norm_residual_norm_q(b->sum + ro, b->res + ro, T, H, b->coll == COLL_AR_MOE ? &b->post : NULL, b->sc,
                                     &b->next, b->hid + ro, nrm, qp, st));
        return;
    }
    if (b->coll == COLL_AR_MOE)
        BK(beam_moe_finalize_allreduce_norm_residual_norm(b->ws, b->x + xo * H, b->w + xo, T, T, K, H, 1.0f,
                                                          &b->post, b->res + ro, b->sc, &b->next, b->hid + ro, nrm,
                                                          qp, STRATS[c], st));
    else
        BK(beam_allreduce_norm_residual_norm(b->ws, b->x + xo * H, T, H, NULL, b->res + ro, b->sc, &b->next,
                                             b->hid + ro, nrm, qp, STRATS[c], st));
}

/* The median time per call of T tokens in column c (graph replays). */
static float bench_time(const bench *b, int64_t T, int c, int reps, cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1)
{
    const int ni = T <= 512 ? 20 : (T <= 4096 ? 5 : 2);
    cudaGraph_t g;
    cudaGraphExec_t ex;
    float *ms = malloc(sizeof(float) * (size_t)reps), med;
    int i;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (i = 0; i < ni; ++i) bench_call(b, T, i, c, st);
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
    med = ms[reps / 2] * 1000.0f / (float)ni;
    free(ms);
    CK(cudaGraphExecDestroy(ex));
    CK(cudaGraphDestroy(g));
    return med;
}

static const char *const COLL_NAMES[3] = {"gather", "allreduce", "allreduce-moe"};

/* One rank: device `rank`, its communicator, the table (printed by rank 0). */
static int bench_rank(int rank, int R, void *arg)
{
    const char *cn = getenv("BEAM_BENCH_COLL");
    const int reps = envi("BEAM_BENCH_REPS", 25);
    int64_t Ts[32];
    int nT = 0, t, c, i;
    bench b;
    beam_workspace_config cfg;
    cudaStream_t st;
    cudaEvent_t e0, e1;
    uint16_t *pw, *nw;
    memset(&b, 0, sizeof b);
    b.R = R;
    b.H = envi("BEAM_BENCH_H", 7168);
    b.K = envi("BEAM_BENCH_K", 8);
    b.sc[0] = b.sc[1] = 1.0f;
    for (c = 0; c < 3; ++c)
        if (cn && !strcmp(cn, COLL_NAMES[c])) b.coll = c;
    b.fp8 = b.coll != COLL_GATHER && envi("BEAM_BENCH_FP8", 0);
    {
        const char *tl = getenv("BEAM_BENCH_T");
        char buf[512], *tok;
        snprintf(buf, sizeof buf, "%s", tl && *tl ? tl : "1,8,64,512,4096,16384");
        for (tok = strtok(buf, ","); tok && nT < 32; tok = strtok(NULL, ",")) {
            Ts[nT] = atoll(tok);
            if (Ts[nT] > b.maxT) b.maxT = Ts[nT];
            ++nT;
        }
    }
    (void)arg;
    g_rank = rank;
    CK(cudaSetDevice(rank));
    b.comm = bm_ranks_comm();
    {
        const int H = b.H, K = b.K;
        const int64_t maxT = b.maxT, rows = b.coll == COLL_GATHER ? (maxT + R - 1) / R : maxT;
        const int64_t per = b.coll == COLL_AR ? 1 : K; /* values of a row, in hidden vectors */
        CK(cudaMalloc((void **)&b.x, (size_t)rows * per * H * 2));
        CK(cudaMalloc((void **)&b.w, (size_t)rows * K * 4));
        CK(cudaMalloc((void **)&b.res, (size_t)maxT * H * 2));
        CK(cudaMalloc((void **)&b.hid, (size_t)maxT * H * 2));
        CK(cudaMalloc((void **)&b.nrm, (size_t)maxT * H * 2));
        CK(cudaMalloc((void **)&b.sum, (size_t)maxT * H * 2));
        CK(cudaMalloc((void **)&b.qv, (size_t)maxT * H));
        CK(cudaMalloc((void **)&b.qs, (size_t)maxT * H / 128 * 4 + 4));
        CK(cudaMalloc((void **)&pw, (size_t)H * 2));
        CK(cudaMalloc((void **)&nw, (size_t)H * 2));
        fill_bf16(b.x, (size_t)rows * per * H, 1 + rank);
        fill_bf16(b.res, (size_t)maxT * H, 7);
        fill_bf16(pw, (size_t)H, 8);
        fill_bf16(nw, (size_t)H, 9);
        {
            float *hw = malloc((size_t)rows * K * 4);
            for (i = 0; i < rows * K; ++i) hw[i] = (float)((i * 37 % 101) / 101.0);
            CK(cudaMemcpy(b.w, hw, (size_t)rows * K * 4, cudaMemcpyHostToDevice));
            free(hw);
        }
    }
    b.post = (beam_norm){pw, 1e-6f};
    b.next = (beam_norm){nw, 1e-6f};
    cfg = beam_workspace_config_default();
    if (getenv("BEAM_BENCH_ONESHOT_MAX")) cfg.oneshot_max_tokens = envi("BEAM_BENCH_ONESHOT_MAX", 0);
    if (getenv("BEAM_BENCH_TWOSHOT_MAX")) cfg.twoshot_max_tokens = envi("BEAM_BENCH_TWOSHOT_MAX", 0);
    BK(beam_workspace_create_nccl((void *)b.comm, b.maxT, b.H, &cfg, &b.ws));
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    if (rank == 0) {
        printf("gather_bench: %s TP=%d H=%d K=%d, %s next norm with weights, scales%s; AUTO: oneshot<=%lld, "
               "twoshot<=%lld, else unfused\n",
               COLL_NAMES[b.coll], R, b.H, b.K, b.coll == COLL_AR ? "no pre-norm," : "post and",
               b.fp8 ? ", normalized as FP8 group-128" : "", (long long)cfg.oneshot_max_tokens,
               (long long)cfg.twoshot_max_tokens);
        printf("median us per call over %d graph replays (rank 0)\n", reps);
        if (b.coll == COLL_GATHER)
            printf("%8s %10s %10s %10s %10s %9s %9s %9s\n", "T", "unfused", "oneshot", "twoshot", "auto", "one/unf",
                   "two/unf", "auto/best");
        else
            printf("%8s %10s %10s %10s %10s %10s %9s %9s\n", "T", "nccl+norm", "unfused", "oneshot", "twoshot",
                   "auto", "nccl/auto", "auto/best");
        fflush(stdout);
    }
    for (t = 0; t < nT; ++t) {
        const int64_t T = Ts[t];
        const int ncols = b.coll == COLL_GATHER ? 4 : NCOLS;
        float med[NCOLS], best;
        for (c = 0; c < ncols; ++c) med[c] = bench_time(&b, T, c, reps, st, e0, e1);
        best = med[0];
        for (c = 1; c < 3; ++c)
            if (med[c] < best) best = med[c];
        if (rank == 0 && b.coll == COLL_GATHER)
            printf("%8lld %10.2f %10.2f %10.2f %10.2f %8.2fx %8.2fx %8.3f\n", (long long)T, med[0], med[1], med[2],
                   med[3], med[0] / med[1], med[0] / med[2], med[3] / best);
        else if (rank == 0)
            printf("%8lld %10.2f %10.2f %10.2f %10.2f %10.2f %8.2fx %8.3f\n", (long long)T, med[BASE], med[0],
                   med[1], med[2], med[3], med[BASE] / med[3], med[3] / best);
        fflush(stdout);
    }
    BK(beam_workspace_destroy(b.ws));
    NK(ncclCommDestroy(b.comm));
    return 0;
}

int main(void)
{
    char why[300];
    const int ndev = bm_gpu_probe(why, sizeof why);
    const int R = envi("BEAM_BENCH_RANKS", 2);
    const char *cn = getenv("BEAM_BENCH_COLL");
    int c, known = !cn || !*cn;
    for (c = 0; c < 3; ++c) known |= cn && !strcmp(cn, COLL_NAMES[c]);
    if (!known || (envi("BEAM_BENCH_FP8", 0) && envi("BEAM_BENCH_H", 7168) % 128)) {
        fprintf(stderr, "gather_bench: BEAM_BENCH_COLL is gather, allreduce or allreduce-moe; BEAM_BENCH_FP8 "
                        "needs BEAM_BENCH_H a multiple of 128\n");
        return 2;
    }
    if (R < 1 || R > 8 || ndev < R) {
        printf("gather_bench: %s, %d ranks asked: skipped\n", why, R);
        return 77;
    }
    return bm_ranks_run("gather_bench", R, 0, bench_rank, NULL);
}
