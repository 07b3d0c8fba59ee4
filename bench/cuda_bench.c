/*
 * cuda_bench.c - speed of the CUDA backend on one GPU (public API + cudart).
 *
 * First the device's copy bandwidth (cudaMemcpy device to device of 2 GiB,
 * bytes read plus written), then for each shape of TARGETS.md (K = 8;
 * H = 7168 with T in {1, 8, 64, 512, 4096, 16384}; H = 4096 and 2048 at
 * T = 4096) each op's median time per call over CUDA graph replays. One
 * graph holds N calls on N different buffer sets, N chosen so that the sets
 * together exceed 3x the L2 cache: every call reads cold memory, as in a
 * model. Time per call = graph time / N; median over 20 replays.
 *
 * Bytes per call: finalize and the fused op as TARGETS.md counts them;
 * norm_residual_norm reads x and residual and writes hidden and normalized
 * (4 T*H*2, + H*2 for the norm weight).
 *
 * Printed per op: microseconds, GB/s, the fraction of the copy floor (bytes
 * of TARGETS.md over the copy bandwidth) and TARGETS.md's "compiled"
 * (torch.compile) figure. For T <= 64 also "hot us": 50 calls on one buffer
 * set, which stays in L2 (in a model the expert GEMM has just written these
 * inputs, so decode reads them from L2). Last, the host overhead of one call: a call with
 * live_tokens = 0 runs every check (pointer attributes too) and launches
 * nothing.
 *
 * usage: cuda_bench [--quick]     (--quick: fewer shapes and replays)
 * Inputs are random BF16 values (never zeros), weights in (0, 1).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

#include "beammoe.h"

#define CK(call)                                                                 \
    do {                                                                         \
        cudaError_t e_ = (call);                                                 \
        if (e_ != cudaSuccess) {                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,        \
                    cudaGetErrorString(e_));                                     \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

#define BK(call)                                                                 \
    do {                                                                         \
        beam_status s_ = (call);                                                 \
        if (s_ != BEAM_OK) {                                                     \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,        \
                    beam_last_error());                                          \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

enum { OP_FIN, OP_NRN, OP_FUSED, OP_UNFUSED, NOPS };
static const char *op_names[NOPS] = {"finalize", "norm_res_norm", "fused", "unfused"};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t g_rng = 0x243F6A8885A308D3ULL;
static uint64_t next_u64(void)
{
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* random BF16 in +-[2^-6, 2^4), random FP32 weights in (0, 1) */
static void fill_bf16(uint16_t *p, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        uint64_t z = next_u64();
        p[i] = (uint16_t)(((z & 1) << 15) | ((121 + (z >> 8) % 10) << 7) | ((z >> 20) & 0x7F));
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct shape {
    int64_t T;
    int32_t H;
    double compiled_fin, compiled_fused; /* TARGETS.md, us */
} shape;

static const shape shapes[] = {
    {1, 7168, 3.57, 5.37},       {8, 7168, 4.38, 5.88},       {64, 7168, 7.25, 8.12},
    {512, 7168, 41.0, 47.1},     {4096, 7168, 320.5, 352.6},  {16384, 7168, 1265.0, 1385.9},
    {4096, 4096, 186.6, 204.7},  {4096, 2048, 97.0, 106.4},
};

/* Median time per call (us) of a graph of n calls of op; rotate: call i
 * uses buffer set i (else every call uses set 0). */
static double time_calls(cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, char *pool, size_t set_bytes,
                         size_t n, int rotate, int op, int64_t T, int32_t H, int32_t K, size_t o_w,
                         size_t o_res, size_t o_out, size_t o_nrm, const beam_norm *post,
                         const beam_norm *next, int reps, double *times)
{
    cudaGraph_t g;
    cudaGraphExec_t ge;
    size_t s;
    int r;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (s = 0; s < n; s++) {
        char *b = pool + (rotate ? s : 0) * set_bytes;
        const uint16_t *x = (const uint16_t *)b;
        const float *w = (const float *)(b + o_w);
        uint16_t *res = (uint16_t *)(b + o_res), *out = (uint16_t *)(b + o_out);
        uint16_t *nrm = (uint16_t *)(b + o_nrm);
        switch (op) {
        case OP_FIN:
            BK(beam_moe_finalize(x, w, T, T, K, H, 1.0f, post, out, st));
            break;
        case OP_NRN:
            BK(beam_norm_residual_norm(x, res, T, H, NULL, NULL, next, out, nrm, st));
            break;
        default:
            BK(beam_moe_finalize_norm_residual_norm(
                x, w, T, T, K, H, 1.0f, post, res, NULL, next, out, nrm,
                op == OP_FUSED ? BEAM_STRATEGY_FUSED : BEAM_STRATEGY_UNFUSED, st));
        }
    }
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (r = 0; r < reps + 2; r++) {
        float ms;
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 2) times[r - 2] = ms * 1e3 / (double)n;
    }
    qsort(times, (size_t)reps, sizeof(double), cmp_double);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return times[reps / 2];
}

int main(int argc, char **argv)
{
    const int32_t K = 8;
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    const int reps = quick ? 5 : 20;
    struct cudaDeviceProp prop;
    cudaStream_t st;
    cudaEvent_t e0, e1;
    double copy_gbs, times[64];
    size_t si;
    int dev = 0;

    if (beam_set_backend("cuda") != BEAM_OK) {
        fprintf(stderr, "cuda_bench: %s\n", beam_last_error());
        return 77;
    }
    CK(cudaGetDevice(&dev));
    CK(cudaGetDeviceProperties(&prop, dev));
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("device: %s, %d SMs, L2 %d MiB, beammoe %s backend %s\n", prop.name,
           prop.multiProcessorCount, prop.l2CacheSize >> 20, beam_version(), beam_backend_name());

    /* ---- copy bandwidth ---- */
    {
        size_t n = (size_t)2 << 30;
        void *a, *b;
        int i;
        CK(cudaMalloc(&a, n));
        CK(cudaMalloc(&b, n));
        CK(cudaMemset(a, 0x3C, n));
        for (i = 0; i < reps + 2; i++) {
            float ms;
            CK(cudaEventRecord(e0, st));
            CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st));
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (i >= 2) times[i - 2] = ms;
        }
        qsort(times, (size_t)reps, sizeof(double), cmp_double);
        copy_gbs = 2.0 * (double)n / (times[reps / 2] * 1e-3) / 1e9;
        printf("copy bandwidth (cudaMemcpy D2D %zu MiB, read+write): %.0f GB/s\n\n", n >> 20, copy_gbs);
        CK(cudaFree(a));
        CK(cudaFree(b));
    }

    printf("%-6s %-5s %-14s %10s %9s %8s %8s %10s %9s\n", "T", "H", "op", "us", "GB/s", "floor%",
           "hot us", "compiled", "x compiled");
    for (si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t T = shapes[si].T;
        const int32_t H = shapes[si].H;
        const size_t bx = (size_t)T * K * H * 2, bw = (size_t)T * K * 4, brow = (size_t)T * H * 2;
        const size_t align = 256;
        size_t o_w, o_res, o_out, o_nrm, set_bytes, nsets, s;
        char *pool;
        uint16_t *nw, *hbuf;
        float *hw;
        int op;
        beam_norm post, next;

        if (quick && si != 0 && si != 2 && si != 4) continue;
        o_w = (bx + align - 1) / align * align;
        o_res = o_w + (bw + align - 1) / align * align;
        o_out = o_res + (brow + align - 1) / align * align;
        o_nrm = o_out + (brow + align - 1) / align * align;
        set_bytes = o_nrm + (brow + align - 1) / align * align;
        nsets = (3 * (size_t)prop.l2CacheSize + set_bytes - 1) / set_bytes;
        if (nsets < 2) nsets = 2;
        if (nsets > 2000) nsets = 2000;
        CK(cudaMalloc((void **)&pool, set_bytes * nsets));
        CK(cudaMalloc((void **)&nw, (size_t)H * 2 * 2));
        /* one random set on the host, copied into every set */
        hbuf = (uint16_t *)malloc(set_bytes);
        hw = (float *)(void *)((char *)hbuf + o_w);
        if (!hbuf) return 1;
        fill_bf16(hbuf, set_bytes / 2);
        for (s = 0; s < (size_t)T * K; s++) hw[s] = (float)((next_u64() >> 40) + 1) / 16777216.0f;
        for (s = 0; s < nsets; s++)
            CK(cudaMemcpy(pool + s * set_bytes, hbuf, set_bytes, cudaMemcpyHostToDevice));
        fill_bf16(hbuf, (size_t)H * 2);
        CK(cudaMemcpy(nw, hbuf, (size_t)H * 2 * 2, cudaMemcpyHostToDevice));
        free(hbuf);
        post.weight = nw;
        post.eps = 1e-6f;
        next.weight = nw + H;
        next.eps = 1e-6f;

        for (op = 0; op < NOPS; op++) {
            const double fin_b = (double)bx + bw + brow + H * 2.0;
            const double bytes = op == OP_FIN ? fin_b : op == OP_NRN ? 4.0 * brow + H * 2.0 : fin_b + 2.0 * brow;
            const double comp = op == OP_FIN ? shapes[si].compiled_fin
                                : op == OP_NRN ? 0.0 : shapes[si].compiled_fused;
            double us, hot = 0.0;
            us = time_calls(st, e0, e1, pool, set_bytes, nsets, 1, op, T, H, K, o_w, o_res, o_out, o_nrm,
                            &post, &next, reps, times);
            /* decode sizes also hot: 50 calls on one buffer set, which then
             * stays in L2 (as when the previous kernel just wrote it) */
            if (T <= 64)
                hot = time_calls(st, e0, e1, pool, set_bytes, 50, 0, op, T, H, K, o_w, o_res, o_out,
                                 o_nrm, &post, &next, reps, times);
            printf("%-6lld %-5d %-14s %10.2f %9.0f %7.1f%%", (long long)T, (int)H, op_names[op], us,
                   bytes / us / 1e3, 100.0 * bytes / copy_gbs / 1e3 / us);
            if (hot > 0)
                printf(" %8.2f", hot);
            else
                printf(" %8s", "-");
            if (comp > 0)
                printf(" %10.2f %8.2fx\n", comp, comp / us);
            else
                printf(" %10s %9s\n", "-", "-");
        }
        CK(cudaFree(pool));
        CK(cudaFree(nw));
    }

    /* ---- host overhead of one call (checks + dispatch, no launch) ---- */
    {
        const int32_t H = 7168;
        const int n = 200000;
        uint16_t *x, *res, *out, *nrm, *nw;
        float *w;
        beam_norm post, next;
        double t0, t1;
        int i;
        CK(cudaMalloc((void **)&x, (size_t)K * H * 2));
        CK(cudaMalloc((void **)&w, (size_t)K * 4));
        CK(cudaMalloc((void **)&res, (size_t)H * 2));
        CK(cudaMalloc((void **)&out, (size_t)H * 2));
        CK(cudaMalloc((void **)&nrm, (size_t)H * 2));
        CK(cudaMalloc((void **)&nw, (size_t)H * 2 * 2));
        post.weight = nw;
        post.eps = 1e-6f;
        next.weight = nw + H;
        next.eps = 1e-6f;
        t0 = now_s();
        for (i = 0; i < n; i++)
            BK(beam_moe_finalize_norm_residual_norm(x, w, 1, 0, K, H, 1.0f, &post, res, NULL, &next, out,
                                                    nrm, BEAM_STRATEGY_FUSED, st));
        t1 = now_s();
        printf("\nhost overhead, fused op, every check incl. 7 pointer attribute queries, no launch: %.2f us/call\n",
               (t1 - t0) / n * 1e6);
        /* one launch per call, into a capture (nothing runs) */
        {
            cudaGraph_t g;
            const int m = 2000;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            t0 = now_s();
            for (i = 0; i < m; i++)
                BK(beam_moe_finalize_norm_residual_norm(x, w, 1, 1, K, H, 1.0f, &post, res, NULL, &next, out,
                                                        nrm, BEAM_STRATEGY_FUSED, st));
            t1 = now_s();
            CK(cudaStreamEndCapture(st, &g));
            CK(cudaGraphDestroy(g));
            printf("host time of a call with its launch recorded into a graph capture: %.2f us/call\n",
                   (t1 - t0) / m * 1e6);
        }
        CK(cudaFree(x)); CK(cudaFree(w)); CK(cudaFree(res)); CK(cudaFree(out)); CK(cudaFree(nrm));
        CK(cudaFree(nw));
    }
    return 0;
}
