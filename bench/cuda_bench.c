/*
 * cuda_bench.c - speed of the CUDA backend on one GPU (public API + cudart).
 *
 * First the device's copy bandwidth (cudaMemcpy device to device of 2 GiB,
 * bytes read plus written), then for each shape (K = 8; H = 7168 with T in
 * {1, 8, 64, 128, 512, 4096, 16384}; H = 4096 and 2048 at T = 4096) and each
 * configuration a user can call (cfgs below: every op, with and without the
 * post or pre norm and its weight, scales, routed scale, in place) the
 * median time per call over CUDA graph replays. One graph cycles through N
 * buffer sets, outputs included, N chosen so that the sets together exceed
 * 3x the L2 cache: every call reads cold memory and writes lines no recent
 * call wrote, as in a model. It makes N calls or more (bm_graph_calls), so
 * that the graph's own launch latency is spread thin. Time per call =
 * graph time / calls; median over 20 replays.
 *
 * Bytes per call (docs/PERF.md): finalize reads T*K*H*2 + T*K*4, writes
 * T*H*2; norm_residual_norm reads x and residual, writes hidden and
 * normalized (4 T*H*2); the fused op is finalize plus the residual read and
 * the two writes; each norm weight adds H*2. The "fp8" configurations write
 * the next norm's output as FP8 only (beam_*_q, normalized NULL): T*H bytes
 * of values and their FP32 scales instead of T*H*2; the "nvfp4" ones T*H/2
 * bytes of values and T*H/16 of block scales (each the first form of its
 * kind in harness/quant_model.c's qm_forms, its bytes the model's).
 *
 * Printed per configuration: microseconds, GB/s and the fraction of the
 * copy floor (bytes over the copy bandwidth). For T <= 64 also "hot us": 50
 * calls on one buffer set, which stays in L2 (in a model the expert GEMM
 * has just written these inputs, so decode reads them from L2). Last, the
 * host overhead of one call: a call with live_tokens = 0 runs every check
 * (pointer attributes too) and launches nothing. bench/torch_compare.py
 * times torch.compile of the same pipeline beside beammoe.
 *
 * usage: cuda_bench [--quick] [--cfg NAMES] [--json FILE]
 *   --quick      three shapes, fewer replays
 *   --cfg NAMES  only these configurations (names as printed, comma
 *                separated), e.g. "nrn,allreduce1" to compare two rows
 *   --json FILE  also write every measured row to FILE (written beside it,
 *                renamed onto it once complete), for scripts/perf-report.py:
 *                the run (date, BEAM_COMMIT from the environment, device,
 *                copy bandwidth, host overhead) and one record per row and
 *                mode: op, config, T, H, K, mode (cold, hot), us (median),
 *                us_min, us_max, bytes, and for cold rows gbs and floor_pct.
 *                The text on standard output is the same with or without.
 * Inputs are random BF16 values (never zeros), weights in (0, 1).
 * Exit 77 (skip) when no GPU here can run the cuda backend
 * (harness/gpu_probe.h).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

#include "beammoe.h"
#include "checks.h"
#include "gpu_probe.h"
#include "graph_calls.h"
#include "quant_model.h"

enum { OP_FIN, OP_NRN, OP_FUSED, OP_UNFUSED, OP_AR, OP_AR_MOE };
static const char *const op_names[] = {"finalize", "nrn", "fused", "unfused", "allreduce", "moe_allreduce"};

/* Every configuration a user can call, by operation: which norms (the
 * post-norm of finalize or the pre-norm of norm_residual_norm, with or
 * without its weight), scales and routed scale. Every op with a residual has
 * the next norm with weight; "+post" is the reference module's call. */
typedef struct bench_cfg {
    const char *name;
    int op, normA, normA_w, scales;
    float routed;
    int quant; /* the next norm's output only (beam_*_q): 0 no, else a
                * beam_quant_kind, in its first form of qm_forms
                * (BEAM_QUANT_FP8_GROUP: group 128) */
    int inplace; /* hidden written over the residual (hidden_out == residual) */
} bench_cfg;

static const bench_cfg cfgs[] = {
    {"finalize", OP_FIN, 0, 0, 0, 1.0f, 0, 0},
    {"finalize+post", OP_FIN, 1, 1, 0, 1.0f, 0, 0},
    {"finalize+post0", OP_FIN, 1, 0, 0, 2.5f, 0, 0},
    {"nrn", OP_NRN, 0, 0, 0, 1.0f, 0, 0},
    {"nrn+pre", OP_NRN, 1, 1, 0, 1.0f, 0, 0},
    {"nrn+pre+scales", OP_NRN, 1, 1, 1, 1.0f, 0, 0},
    {"nrn+inplace", OP_NRN, 0, 0, 0, 1.0f, 0, 1},
    {"fused", OP_FUSED, 0, 0, 0, 1.0f, 0, 0},
    {"fused+post", OP_FUSED, 1, 1, 0, 1.0f, 0, 0},
    {"fused+post0", OP_FUSED, 1, 0, 0, 1.0f, 0, 0},
    {"fused+post+scales", OP_FUSED, 1, 1, 1, 2.5f, 0, 0},
    {"fused+post+inplace", OP_FUSED, 1, 1, 0, 1.0f, 0, 1},
    {"unfused+post", OP_UNFUSED, 1, 1, 0, 1.0f, 0, 0},
    {"nrn fp8 group", OP_NRN, 0, 0, 0, 1.0f, BEAM_QUANT_FP8_GROUP, 0},
    {"fused+post fp8 group", OP_FUSED, 1, 1, 0, 1.0f, BEAM_QUANT_FP8_GROUP, 0},
    {"fused+post fp8 token", OP_FUSED, 1, 1, 0, 1.0f, BEAM_QUANT_FP8_TOKEN, 0},
    {"fused+post fp8 tensor", OP_FUSED, 1, 1, 0, 1.0f, BEAM_QUANT_FP8_TENSOR, 0},
    {"nrn nvfp4", OP_NRN, 0, 0, 0, 1.0f, BEAM_QUANT_NVFP4, 0},
    {"fused+post nvfp4", OP_FUSED, 1, 1, 0, 1.0f, BEAM_QUANT_NVFP4, 0},
    /* the all-reduces on a group of one rank (the kernel without the
     * exchange): what they add to nrn, nrn+pre and fused+post */
    {"allreduce1", OP_AR, 0, 0, 0, 1.0f, 0, 0},
    {"allreduce1+pre", OP_AR, 1, 1, 0, 1.0f, 0, 0},
    {"allreduce1 moe+post", OP_AR_MOE, 1, 1, 0, 1.0f, 0, 0},
};
enum { NCFG = sizeof cfgs / sizeof cfgs[0] };

static int cmp_times(const void *a, const void *b)
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
    int quick; /* also in the --quick run */
} shape;

static const shape shapes[] = {
    {1, 7168, 1},    {8, 7168, 0},     {64, 7168, 1},   {128, 7168, 0}, {512, 7168, 0},
    {4096, 7168, 1}, {16384, 7168, 0}, {4096, 4096, 0}, {4096, 2048, 0},
};

/* The CUDA backend's table: every timed call goes through it, and a failed
 * one's message is that table's. */
static const beam_ops *g_ops;
static beam_workspace *g_ws; /* the all-reduces': one rank, the shape's T and H */
#define OPS_OK(x)                                                                \
    do {                                                                         \
        beam_status ok_s_ = (x);                                                 \
        if (ok_s_ != BEAM_OK) FAIL("%s: %s", #x, g_ops->last_error());          \
    } while (0)

/* The bytes of normalized's region that the quantized output of kind
 * quant takes at T rows of H (values, then the scales' array 256 bytes
 * aligned: block scales in whole tiles), and the bytes a call writes there
 * (values and the scales of T rows). */
static size_t quant_region(int quant, int64_t T, int32_t H)
{
    beam_quant q;
    qm_form_of(&q, quant, T);
    return (qm_values_bytes(&q, T, H) + 255) / 256 * 256 + qm_scale_floats(&q, T, H) * 4;
}

static double quant_written(int quant, int64_t T, int32_t H)
{
    beam_quant q;
    qm_form_of(&q, quant, T);
    return (double)qm_values_bytes(&q, T, H) +
           (qm_block(&q) ? (double)T * (H / qm_block(&q)) : 4.0 * (double)qm_scale_floats(&q, T, H));
}

/* Median time per call (us) of a graph of n calls of op; nsets > 0: call
 * i uses buffer set i % nsets (else every call uses set 0). */
static double time_calls(cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, char *pool, size_t set_bytes,
                         size_t n, size_t nsets, const bench_cfg *cf, int64_t T, int32_t H, int32_t K,
                         size_t o_w, size_t o_res, size_t o_out, size_t o_nrm, const beam_norm *normA,
                         const beam_norm *next, int reps, double *times)
{
    cudaGraph_t g;
    cudaGraphExec_t ge;
    size_t s;
    int r;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (s = 0; s < n; s++) {
        char *b = pool + (nsets ? s % nsets : 0) * set_bytes;
        const uint16_t *x = (const uint16_t *)b;
        const float *w = (const float *)(b + o_w);
        uint16_t *res = (uint16_t *)(b + o_res);
        uint16_t *out = cf->inplace ? res : (uint16_t *)(b + o_out);
        uint16_t *nrm = (uint16_t *)(b + o_nrm);
        const beam_norm *nA = cf->normA ? normA : NULL;
        static const float scales[2] = {0.75f, 1.25f};
        const float *sc = cf->scales ? scales : NULL;
        /* the quantized output only: the values, then the scales at the
         * next 256 bytes past them, in normalized's region (made large
         * enough for them: quant_region) */
        beam_quant q;
        qm_form_of(&q, cf->quant, T);
        qm_bind(&q, (uint8_t *)nrm, (float *)(void *)((char *)nrm + (qm_values_bytes(&q, T, H) + 255) / 256 * 256));
        if (cf->quant) {
            if (cf->op == OP_NRN)
                OPS_OK(g_ops->norm_residual_norm_q(x, res, T, H, nA, sc, next, out, NULL, &q, st));
            else
                OPS_OK(g_ops->moe_finalize_norm_residual_norm_q(
                    x, w, T, T, K, H, cf->routed, nA, res, sc, next, out, NULL, &q,
                    cf->op == OP_FUSED ? BEAM_STRATEGY_FUSED : BEAM_STRATEGY_UNFUSED, st));
            continue;
        }
        switch (cf->op) {
        case OP_AR:
            OPS_OK(g_ops->allreduce_norm_residual_norm(g_ws, x, T, H, nA, res, sc, next, out, nrm, NULL,
                                                       BEAM_STRATEGY_ONESHOT, st));
            break;
        case OP_AR_MOE:
            OPS_OK(g_ops->moe_finalize_allreduce_norm_residual_norm(g_ws, x, w, T, T, K, H, cf->routed, nA, res, sc,
                                                                    next, out, nrm, NULL, BEAM_STRATEGY_ONESHOT,
                                                                    st));
            break;
        case OP_FIN:
            OPS_OK(g_ops->moe_finalize(x, w, T, T, K, H, cf->routed, nA, out, st));
            break;
        case OP_NRN:
            OPS_OK(g_ops->norm_residual_norm(x, res, T, H, nA, sc, next, out, nrm, st));
            break;
        default:
            OPS_OK(g_ops->moe_finalize_norm_residual_norm(
                x, w, T, T, K, H, cf->routed, nA, res, sc, next, out, nrm,
                cf->op == OP_FUSED ? BEAM_STRATEGY_FUSED : BEAM_STRATEGY_UNFUSED, st));
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
    qsort(times, (size_t)reps, sizeof(double), cmp_times);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return times[reps / 2];
}

/* ---- --json FILE: the rows for scripts/perf-report.py ---- */
static FILE *g_json;  /* NULL: no --json */
static char *g_json_tmp;
static int g_json_rows;

static void json_printf(const char *fmt, ...)
{
    va_list ap;
    if (!g_json) return;
    va_start(ap, fmt);
    vfprintf(g_json, fmt, ap);
    va_end(ap);
}

/* a JSON string, or null for NULL */
static void json_string(const char *s)
{
    if (!s) {
        json_printf("null");
        return;
    }
    json_printf("\"");
    for (; *s; s++) {
        const unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            json_printf("\\%c", c);
        else if (c < 0x20)
            json_printf("\\u%04x", c);
        else
            json_printf("%c", c);
    }
    json_printf("\"");
}

/* A string field of the run: ",\n \"key\": value". */
static void json_field(const char *key, const char *s)
{
    json_printf(",\n \"%s\": ", key);
    json_string(s);
}

/* Open FILE's temporary twin and write the run's fields up to its records. */
static void json_open(const char *file, int argc, char **argv, const struct cudaDeviceProp *prop)
{
    char buf[512], date[32];
    time_t now = time(NULL);
    struct tm tmv;
    int drv = 0, rt = 0, i;
    size_t n = 0;
    g_json_tmp = (char *)malloc(strlen(file) + 5);
    if (!g_json_tmp) FAIL("out of memory");
    sprintf(g_json_tmp, "%s.tmp", file);
    g_json = fopen(g_json_tmp, "w");
    if (!g_json) FAIL("--json: cannot write %s", g_json_tmp);
    gmtime_r(&now, &tmv);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tmv);
    CK(cudaDriverGetVersion(&drv));
    CK(cudaRuntimeGetVersion(&rt));
    json_printf("{\n \"format\": \"beammoe-perf/1\",\n \"tool\": \"cuda_bench\",\n \"date\": ");
    json_string(date);
    json_field("commit", getenv("BEAM_COMMIT") && *getenv("BEAM_COMMIT") ? getenv("BEAM_COMMIT") : NULL);
    json_field("library", beam_version());
    snprintf(buf, sizeof buf, "%s, %d SMs, L2 %d MiB", prop->name, prop->multiProcessorCount,
             prop->l2CacheSize >> 20);
    json_field("hardware", buf);
    snprintf(buf, sizeof buf, "CUDA driver API %d.%d, runtime %d.%d", drv / 1000, drv % 1000 / 10, rt / 1000,
             rt % 1000 / 10);
    json_field("software", buf);
    buf[0] = 0;
    for (i = 0; i < argc; i++) {
        const char *a = i ? argv[i] : "bench/cuda_bench";
        if (n + strlen(a) + 2 >= sizeof buf) break;
        n += (size_t)sprintf(buf + n, "%s%s", i ? " " : "", a);
    }
    json_field("command", buf);
    json_printf(",\n \"records\": [");
}

/* One record: times[0..reps-1] sorted, their median us; floor_pct < 0: none. */
static void json_row(const bench_cfg *cf, int64_t T, int32_t H, int32_t K, const char *mode, double us,
                     const double *times, int reps, double bytes, double floor_pct)
{
    json_printf("%s\n  {\"op\": \"%s\", \"config\": ", g_json_rows++ ? "," : "", op_names[cf->op]);
    json_string(cf->name);
    json_printf(", \"T\": %lld, \"H\": %d, \"K\": %d, \"mode\": \"%s\", \"us\": %.3f, \"us_min\": %.3f, "
                "\"us_max\": %.3f, \"bytes\": %.0f",
                (long long)T, (int)H, (int)K, mode, us, times[0], times[reps - 1], bytes);
    if (floor_pct >= 0)
        json_printf(", \"gbs\": %.1f, \"floor_pct\": %.2f", bytes / us / 1e3, floor_pct);
    json_printf("}");
}

/* The run's last fields; the file renamed onto its name. */
static void json_close(const char *file, double copy_gbs, int reps, double host_check, double host_capture)
{
    if (!g_json) return;
    json_printf("\n ],\n \"copy_gbs\": %.1f,\n \"reps\": %d,\n \"host_check_us\": %.2f,\n"
                " \"host_capture_us\": %.2f\n}\n", copy_gbs, reps, host_check, host_capture);
    if (ferror(g_json) | fclose(g_json)) FAIL("--json: cannot write %s", g_json_tmp);
    if (rename(g_json_tmp, file) != 0) FAIL("--json: cannot rename %s onto %s", g_json_tmp, file);
    free(g_json_tmp);
    g_json = NULL;
}

/* name is one of the comma-separated names of list */
static int listed(const char *list, const char *name)
{
    const size_t n = strlen(name);
    const char *p = list;
    for (;;) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return 1;
        if (!end) return 0;
        p = end + 1;
    }
}

static int usage(FILE *f, int status)
{
    fprintf(f, "usage: cuda_bench [--quick] [--cfg NAMES] [--json FILE]\n"
               "  --quick      three shapes, fewer replays\n"
               "  --cfg NAMES  only these configurations (names as printed, comma separated)\n"
               "  --json FILE  also write every measured row to FILE (scripts/perf-report.py reads it;\n"
               "               BEAM_COMMIT in the environment names the library's commit)\n");
    return status;
}

int main(int argc, char **argv)
{
    const int32_t K = 8;
    int quick = 0, reps, ai;
    const char *json_file = NULL, *only = NULL;
    double host_check = 0.0, host_capture = 0.0;
    struct cudaDeviceProp prop;
    cudaStream_t st;
    cudaEvent_t e0, e1;
    double copy_gbs, times[64];
    size_t si;
    int dev = 0;

    char why[300];

    for (ai = 1; ai < argc; ai++) {
        if (strcmp(argv[ai], "--quick") == 0 && !quick)
            quick = 1;
        else if (strcmp(argv[ai], "--cfg") == 0 && ai + 1 < argc && !only && *argv[ai + 1])
            only = argv[++ai];
        else if (strcmp(argv[ai], "--json") == 0 && ai + 1 < argc && !json_file && *argv[ai + 1])
            json_file = argv[++ai];
        else if (strcmp(argv[ai], "--help") == 0)
            return usage(stdout, 0);
        else {
            fprintf(stderr, "cuda_bench: unexpected argument '%s'\n", argv[ai]);
            return usage(stderr, 2);
        }
    }
    reps = quick ? 5 : 20;
    if (only) {
        size_t ci, known = 0;
        for (ci = 0; ci < NCFG; ci++)
            known += listed(only, cfgs[ci].name);
        if (!known) {
            fprintf(stderr, "cuda_bench: --cfg '%s' names no configuration\n", only);
            return usage(stderr, 2);
        }
    }
    if (bm_gpu_probe(why, sizeof why) < 1) {
        printf("cuda_bench: %s: skipped\n", why);
        return 77;
    }
    BK(beam_set_backend("cuda"));
    g_ops = beam_backend_ops("cuda", BEAM_OPS_VERSION);
    if (!g_ops) FAIL("beam_backend_ops(\"cuda\"): %s", beam_last_error());
    CK(cudaGetDevice(&dev));
    CK(cudaGetDeviceProperties(&prop, dev));
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("device: %s, %d SMs, L2 %d MiB, beammoe %s backend %s\n", prop.name,
           prop.multiProcessorCount, prop.l2CacheSize >> 20, beam_version(), beam_backend_name());
    if (json_file) json_open(json_file, argc, argv, &prop);

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
        qsort(times, (size_t)reps, sizeof(double), cmp_times);
        copy_gbs = 2.0 * (double)n / (times[reps / 2] * 1e-3) / 1e9;
        printf("copy bandwidth (cudaMemcpy D2D %zu MiB, read+write): %.0f GB/s\n\n", n >> 20, copy_gbs);
        CK(cudaFree(a));
        CK(cudaFree(b));
    }

    printf("configurations: nrn = norm_residual_norm with the next norm; +post / +pre: the post-norm of\n"
           "finalize / the pre-norm, with weight (post0: without); +scales: scales (0.75, 1.25); every op\n"
           "with a residual has the next norm with weight; fused+post is the reference module's call\n\n");
    printf("%-6s %-5s %-22s %10s %9s %8s %8s\n", "T", "H", "configuration", "us", "GB/s", "floor%",
           "hot us");
    for (si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t T = shapes[si].T;
        const int32_t H = shapes[si].H;
        const size_t bx = (size_t)T * K * H * 2, bw = (size_t)T * K * 4, brow = (size_t)T * H * 2;
        const size_t align = 256;
        size_t o_w, o_res, o_out, o_nrm, set_bytes, nsets, s;
        char *pool;
        uint16_t *nw, *hbuf;
        float *hw;
        size_t ci;
        beam_norm post, next;
        beam_cpu_group *group;

        if (quick && !shapes[si].quick) continue;
        o_w = (bx + align - 1) / align * align;
        o_res = o_w + (bw + align - 1) / align * align;
        o_out = o_res + (brow + align - 1) / align * align;
        o_nrm = o_out + (brow + align - 1) / align * align;
        {
            /* normalized's region also holds each configuration's quantized
             * output */
            size_t region = brow;
            for (ci = 0; ci < NCFG; ci++)
                if (cfgs[ci].quant && quant_region(cfgs[ci].quant, T, H) > region)
                    region = quant_region(cfgs[ci].quant, T, H);
            set_bytes = o_nrm + (region + align - 1) / align * align;
        }
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
        post = (beam_norm){nw, 1e-6f};
        next = (beam_norm){nw + H, 1e-6f};
        OPS_OK(g_ops->cpu_group_create(1, &group));
        OPS_OK(g_ops->workspace_create_cpu(group, 0, T, H, NULL, &g_ws));

        for (ci = 0; ci < NCFG; ci++) {
            const bench_cfg *cf = &cfgs[ci];
            const int op = cf->op;
            const double wA = cf->normA && cf->normA_w ? H * 2.0 : 0.0;
            const double fin_b = (double)bx + bw + brow + (op == OP_FIN ? wA : 0.0);
            /* normalized's bytes, or the quantized values and scales instead */
            const double nrm_b = !cf->quant ? (double)brow : quant_written(cf->quant, T, H);
            const double bytes = op == OP_FIN                    ? fin_b
                                 : op == OP_NRN || op == OP_AR ? 3.0 * brow + nrm_b + wA + H * 2.0
                                                               : fin_b + wA + brow + nrm_b + H * 2.0;
            double us, hot = 0.0;
            if (only ? !listed(only, cf->name) : quick && op < OP_AR && cf->normA != (op != OP_NRN)) continue;
            us = time_calls(st, e0, e1, pool, set_bytes, bm_graph_calls(nsets, bytes, copy_gbs), nsets, cf,
                            T, H, K, o_w, o_res, o_out, o_nrm, &post, &next, reps, times);
            json_row(cf, T, H, K, "cold", us, times, reps, bytes, 100.0 * bytes / copy_gbs / 1e3 / us);
            /* decode sizes also hot: 50 calls on one buffer set, which then
             * stays in L2 (as when the previous kernel just wrote it) */
            if (T <= 64) {
                hot = time_calls(st, e0, e1, pool, set_bytes, 50, 0, cf, T, H, K, o_w, o_res, o_out,
                                 o_nrm, &post, &next, reps, times);
                json_row(cf, T, H, K, "hot", hot, times, reps, bytes, -1.0);
            }
            printf("%-6lld %-5d %-22s %10.2f %9.0f %7.1f%%", (long long)T, (int)H, cf->name, us,
                   bytes / us / 1e3, 100.0 * bytes / copy_gbs / 1e3 / us);
            if (hot > 0)
                printf(" %8.2f\n", hot);
            else
                printf(" %8s\n", "-");
        }
        OPS_OK(g_ops->workspace_destroy(g_ws));
        OPS_OK(g_ops->cpu_group_destroy(group));
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
        post = (beam_norm){nw, 1e-6f};
        next = (beam_norm){nw + H, 1e-6f};
        t0 = now_s();
        for (i = 0; i < n; i++)
            OPS_OK(g_ops->moe_finalize_norm_residual_norm(x, w, 1, 0, K, H, 1.0f, &post, res, NULL, &next, out,
                                                          nrm, BEAM_STRATEGY_FUSED, st));
        t1 = now_s();
        host_check = (t1 - t0) / n * 1e6;
        printf("\nhost overhead, fused op, every check incl. 7 pointer attribute queries, no launch: %.2f us/call\n",
               host_check);
        /* one launch per call, into a capture (nothing runs) */
        {
            cudaGraph_t g;
            const int m = 2000;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            t0 = now_s();
            for (i = 0; i < m; i++)
                OPS_OK(g_ops->moe_finalize_norm_residual_norm(x, w, 1, 1, K, H, 1.0f, &post, res, NULL, &next, out,
                                                              nrm, BEAM_STRATEGY_FUSED, st));
            t1 = now_s();
            CK(cudaStreamEndCapture(st, &g));
            CK(cudaGraphDestroy(g));
            host_capture = (t1 - t0) / m * 1e6;
            printf("host time of a call with its launch recorded into a graph capture: %.2f us/call\n",
                   host_capture);
        }
        CK(cudaFree(x)); CK(cudaFree(w)); CK(cudaFree(res)); CK(cudaFree(out)); CK(cudaFree(nrm));
        CK(cudaFree(nw));
    }
    json_close(json_file, copy_gbs, reps, host_check, host_capture);
    return 0;
}
