/*
 * test_cuda.c - what only the CUDA backend has: its contract on device
 * memory and CUDA graphs. (Its results against the CPU's, bit for bit, over
 * every operation and configuration: tests/test_backends.c, which runs
 * every registered backend.)
 *
 *   cuda      host pointers are refused with BEAM_ERR_INVALID_ARGUMENT and
 *             nothing is written; tokens == 0 writes nothing; the backend
 *             reports "cuda"
 *   graph     cases of the CPU sweep, each call captured in a CUDA graph on
 *             a fresh stream and replayed: the same bits as the CPU's
 *
 * Exits 77 (skip) when the CUDA backend is not usable here (no device).
 * BEAM_TEST_SEED reproduces a run (the seed is printed).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>
#include <cuda_runtime.h>

#include "devmem.h"
#include "suite.h"

static uint64_t g_seed;
static long g_runs;
static const beam_ops *g_cpu, *g_cuda; /* the two backends' tables */

#define CU_OK(call)                                                              \
    do {                                                                         \
        cudaError_t e_ = (call);                                                 \
        if (e_ != cudaSuccess) {                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,        \
                    cudaGetErrorString(e_));                                     \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

/* Poison check of device memory (the contract test's buffers). */
static int dis_poison(const void *dp, size_t n)
{
    unsigned char *h = (unsigned char *)malloc(n ? n : 1);
    int ok;
    CU_OK(cudaMemcpy(h, dp, n, cudaMemcpyDeviceToHost));
    ok = hu_is_poison(h, n);
    free(h);
    return ok;
}

/* One op of a case through a backend's table: host memory for the CPU,
 * device memory for CUDA, laid out as the spec asks. capture (CUDA): the
 * call is recorded in a CUDA graph on a fresh stream, then the graph is
 * replayed (proves it capturable and stream-ordered). */
static beam_status run_on(const beam_ops *ops, const hc_case *d, hc_op op, beam_strategy strategy,
                          int capture, hc_out *o)
{
    const int device = ops->device_memory;
    hc_bound b;
    char err[400];
    beam_status st;
    cudaStream_t stream = NULL;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;

    if (hc_bind(&b, d, op, o, hc_how(&d->s) | (device ? HC_DEVICE : 0u), err, sizeof err)) {
        fprintf(stderr, "hc_bind: %s\n", err);
        exit(1);
    }
    if (capture) {
        CU_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        CU_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    }
    st = hc_call(ops, &b, strategy, stream);
    if (capture) {
        CU_OK(cudaStreamEndCapture(stream, &graph));
        if (st == BEAM_OK) {
            CU_OK(cudaGraphInstantiate(&exec, graph, 0));
            CU_OK(cudaGraphLaunch(exec, stream));
            CU_OK(cudaStreamSynchronize(stream));
            CU_OK(cudaGraphExecDestroy(exec));
        }
        CU_OK(cudaGraphDestroy(graph));
        CU_OK(cudaStreamDestroy(stream));
    }
    if (device) {
        CU_OK(cudaDeviceSynchronize());
        CU_OK(cudaGetLastError());
    }
    if (hc_finish(&b, err, sizeof err)) {
        fprintf(stderr, "hc_finish: %s\n", err);
        exit(1);
    }
    hc_unbind(&b);
    return st;
}

/* ---- one case: CPU vs CUDA ---------------------------------------------- */

static const char *strat_name(beam_strategy s)
{
    return s == BEAM_STRATEGY_FUSED ? "FUSED" : s == BEAM_STRATEGY_UNFUSED ? "UNFUSED" : "AUTO";
}

/* Returns 1 when the CUDA results (the call captured in a graph and
 * replayed) equal the CPU's, guard rows included. */
static int compare_case(const hc_case *d, hc_op op, beam_strategy strat, int capture)
{
    size_t TH = (size_t)d->s.T * (size_t)d->s.H;
    hc_out co, go;
    int ok = 1;
    beam_status cs, gs;
    char desc[256];

    if (hc_out_make(&co, d, 2) || hc_out_make(&go, d, 2)) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    hc_describe(&d->s, desc, sizeof desc);
    cs = run_on(g_cpu, d, op, strat, 0, &co);
    gs = run_on(g_cuda, d, op, strat, capture, &go);
    ++g_runs;
    if (cs != BEAM_OK || gs != BEAM_OK) {
        fprintf(stderr, "  %s %s %s: status cpu=%d cuda=%d (%s)\n", hc_op_name(op), strat_name(strat), desc,
                (int)cs, (int)gs, gs != BEAM_OK ? g_cuda->last_error() : g_cpu->last_error());
        ok = 0;
    } else {
        if (!hc_out_untouched(&go, d, op)) {
            fprintf(stderr, "  %s %s %s: cuda wrote past the live rows\n", hc_op_name(op), strat_name(strat), desc);
            ok = 0;
        }
        if (hu_cmp_bf16("hidden", go.hidden, co.hidden, TH)) ok = 0;
        if (hc_has_normalized(d, op) && hu_cmp_bf16("normalized", go.normalized, co.normalized, TH)) ok = 0;
        if (!ok)
            fprintf(stderr, "  ^ %s %s %s (seed %llu)\n", hc_op_name(op), strat_name(strat), desc,
                    (unsigned long long)g_seed);
    }
    hc_out_free(&co);
    hc_out_free(&go);
    return ok;
}

/* every op of a case; the fused op under every local strategy */
static int compare_all(const hc_case *d, int capture)
{
    static const beam_strategy strats[3] = {BEAM_STRATEGY_AUTO, BEAM_STRATEGY_FUSED, BEAM_STRATEGY_UNFUSED};
    int ok = 1, i;
    ok &= compare_case(d, HC_FINALIZE, BEAM_STRATEGY_AUTO, capture);
    ok &= compare_case(d, HC_NRN, BEAM_STRATEGY_AUTO, capture);
    for (i = 0; i < 3; i++) ok &= compare_case(d, HC_FUSED, strats[i], capture);
    return ok;
}

/* ---- CUDA contract --------------------------------------------------------- */

static void test_cuda_contract(void)
{
    const int32_t K = 2, H = 256;
    const int64_t T = 3;
    const size_t ex_b = (size_t)T * K * H * 2, row_b = (size_t)T * H * 2;
    uint16_t *dex, *dres, *dhid, *dnrm, *hex, *hhid, *pinned;
    float *dwt, *hwt;
    beam_norm nn = {NULL, 1e-6f};
    beam_status st;

    CU_ASSERT_EQUAL_FATAL(beam_set_backend("cuda"), BEAM_OK);
    CU_ASSERT_STRING_EQUAL(beam_backend_name(), "cuda");
    CU_OK(cudaMalloc((void **)&dex, ex_b));
    CU_OK(cudaMalloc((void **)&dwt, (size_t)T * K * 4));
    CU_OK(cudaMalloc((void **)&dres, row_b));
    CU_OK(cudaMalloc((void **)&dhid, row_b));
    CU_OK(cudaMalloc((void **)&dnrm, row_b));
    CU_OK(cudaMemset(dex, 0x3F, ex_b));
    CU_OK(cudaMemset(dwt, 0, (size_t)T * K * 4));
    CU_OK(cudaMemset(dres, 0x3F, row_b));
    CU_OK(cudaMemset(dhid, HU_POISON, row_b));
    CU_OK(cudaMemset(dnrm, HU_POISON, row_b));
    hex = (uint16_t *)calloc(1, ex_b);
    hwt = (float *)calloc(1, (size_t)T * K * 4);
    hhid = (uint16_t *)malloc(row_b);
    CU_OK(cudaMallocHost((void **)&pinned, row_b));

    /* host (pageable) input */
    st = beam_moe_finalize(hex, dwt, T, T, K, H, 1.0f, NULL, dhid, NULL);
    CU_ASSERT_EQUAL(st, BEAM_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "expert_outputs"));
    CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "device memory"));
    CU_ASSERT(dis_poison(dhid, row_b));
    /* host weights */
    st = beam_moe_finalize(dex, hwt, T, T, K, H, 1.0f, NULL, dhid, NULL);
    CU_ASSERT_EQUAL(st, BEAM_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "expert_weights"));
    CU_ASSERT(dis_poison(dhid, row_b));
    /* host output */
    memset(hhid, HU_POISON, row_b);
    st = beam_norm_residual_norm(dres, dres + 0, T, H, NULL, NULL, NULL, hhid, NULL, NULL);
    CU_ASSERT_EQUAL(st, BEAM_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "hidden_out"));
    CU_ASSERT(hu_is_poison(hhid, row_b));
    /* pinned host memory is host memory too */
    st = beam_moe_finalize_norm_residual_norm(dex, dwt, T, T, K, H, 1.0f, NULL, pinned, NULL, &nn, dhid,
                                              dnrm, BEAM_STRATEGY_FUSED, NULL);
    CU_ASSERT_EQUAL(st, BEAM_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "residual"));
    CU_ASSERT(dis_poison(dhid, row_b));
    CU_ASSERT(dis_poison(dnrm, row_b));
    /* host norm weight */
    {
        beam_norm hn = {hex, 1e-6f};
        st = beam_moe_finalize(dex, dwt, T, T, K, H, 1.0f, &hn, dhid, NULL);
        CU_ASSERT_EQUAL(st, BEAM_ERR_INVALID_ARGUMENT);
        CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "post_norm->weight"));
        CU_ASSERT(dis_poison(dhid, row_b));
    }
    /* live_tokens == 0 writes nothing */
    st = beam_moe_finalize(dex, dwt, T, 0, K, H, 1.0f, NULL, dhid, NULL);
    CU_ASSERT_EQUAL(st, BEAM_OK);
    CU_OK(cudaDeviceSynchronize());
    CU_ASSERT(dis_poison(dhid, row_b));
    /* a valid call works and leaves no CUDA error behind */
    st = beam_moe_finalize(dex, dwt, T, T, K, H, 1.0f, NULL, dhid, NULL);
    CU_ASSERT_EQUAL(st, BEAM_OK);
    CU_ASSERT_EQUAL(cudaDeviceSynchronize(), cudaSuccess);
    CU_ASSERT(!dis_poison(dhid, row_b));

    CU_OK(cudaFreeHost(pinned));
    free(hex); free(hwt); free(hhid);
    CU_OK(cudaFree(dex)); CU_OK(cudaFree(dwt)); CU_OK(cudaFree(dres));
    CU_OK(cudaFree(dhid)); CU_OK(cudaFree(dnrm));
}

/* a few sweep cases again, each captured in a CUDA graph and replayed */
static void test_graph(void)
{
    int i, bad = 0;
    for (i = 0; i < 100; i += hu_quick() ? 29 : 7) {
        hc_case d;
        hc_spec s = hc_sweep_spec(i);
        hc_make(&d, &s, g_seed + 999 * (uint64_t)(i + 1));
        if (!compare_all(&d, 1)) ++bad;
        hc_free(&d);
    }
    CU_ASSERT_EQUAL(bad, 0);
}

int main(void)
{
    static const suite_test tests[] = {
        {"CUDA contract", test_cuda_contract}, {"CUDA graph capture", test_graph}, {NULL, NULL}};
    int n = 0, rc;
    char msg[300];

    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        printf("test_cuda: no CUDA device visible: skipped\n");
        return 77;
    }
    if (dev_open(msg, sizeof msg)) {
        printf("test_cuda: %s\n", msg);
        return 1;
    }
    /* the contract test calls the beam_* names (libbeammoe, backend cuda);
     * the graph test calls both backends through their tables */
    if (beam_set_backend("cuda") != BEAM_OK || !(g_cuda = beam_backend_ops("cuda", BEAM_OPS_VERSION))) {
        printf("test_cuda: the cuda backend is not usable here (%s): skipped\n", beam_last_error());
        return 77;
    }
    g_cpu = beam_backend_ops("cpu", BEAM_OPS_VERSION);
    if (!g_cpu) {
        printf("test_cuda: the cpu backend: %s\n", beam_last_error());
        return 1;
    }
    g_seed = hu_seed("test_cuda");

    rc = suite_run("cuda", tests);
    printf("test_cuda: %ld CPU-vs-CUDA comparisons of graph replays, seed %llu\n", g_runs,
           (unsigned long long)g_seed);
    return rc;
}
