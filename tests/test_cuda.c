/*
 * test_cuda.c - the CUDA backend against the CPU backend, bit for bit.
 *
 * Links the dispatcher libbeammoe and switches between beam_set_backend("cpu")
 * (host buffers) and beam_set_backend("cuda") (device buffers) for the same
 * case, both run by the harness's runner (harness/case.c: the CUnit tests
 * and `beammoe audit` run cases the same way). Every output must match bit
 * for bit, and rows past the live ones (guard rows) must stay untouched.
 *
 *   sweep     every case of the CPU sweep: top_k 1,2,6,8,32 x hidden 256,
 *             2048,4096,7168,8192 x tokens 0,1,7,100, the other axes (norms,
 *             scales, routed_scale, in place, misaligned bases, exotic
 *             values, NaN padding rows) rotated; each op, each strategy
 *   random    a randomized sweep of 1500 shapes: top_k 1..32, hidden
 *             256..8192 step 256, tokens 0..5000 (log-uniform; a case's
 *             expert input capped at 8M values, so the run stays near two
 *             minutes on an H200 host); BEAM_TEST_QUICK=1 shrinks it (to 60,
 *             for compute-sanitizer runs)
 *   special   all-exotic inputs (subnormals, infinities, NaNs, signed zeros)
 *   cuda      CUDA-only contract: host pointers are refused with
 *             BEAM_ERR_INVALID_ARGUMENT and nothing is written; a call
 *             captured in a CUDA graph and replayed on a stream gives the
 *             same bits; the backend reports "cuda"
 *
 * Exits 77 (skip) when the CUDA backend is not usable here (no device).
 * BEAM_TEST_SEED reproduces a run (the seed is printed).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>
#include <cuda_runtime.h>

#include "devmem.h"
#include "suite.h"

static uint64_t g_seed;
static long g_runs;

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

/* One op of a case on the current backend through the harness's runner:
 * host memory for the CPU, device memory for CUDA, laid out as the spec asks.
 * capture (CUDA): the call is recorded in a CUDA graph on a fresh stream,
 * then the graph is replayed (proves it capturable and stream-ordered). */
static beam_status run_on(const hc_case *d, hc_op op, beam_strategy strategy, int device,
                          int capture, hc_out *o)
{
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
    st = hc_call(&b, strategy, stream);
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

static const char *op_name(hc_op op)
{
    return hc_op_name(op);
}

static const char *strat_name(beam_strategy s)
{
    return s == BEAM_STRATEGY_FUSED ? "FUSED" : s == BEAM_STRATEGY_UNFUSED ? "UNFUSED" : "AUTO";
}

/* Returns 1 when the CUDA results equal the CPU's, guard rows included. */
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
    CU_ASSERT_EQUAL_FATAL(beam_set_backend("cpu"), BEAM_OK);
    cs = run_on(d, op, strat, 0, 0, &co);
    CU_ASSERT_EQUAL_FATAL(beam_set_backend("cuda"), BEAM_OK);
    gs = run_on(d, op, strat, 1, capture, &go);
    ++g_runs;
    if (cs != BEAM_OK || gs != BEAM_OK) {
        fprintf(stderr, "  %s %s %s: status cpu=%d cuda=%d (%s)\n", op_name(op), strat_name(strat), desc,
                (int)cs, (int)gs, beam_last_error());
        ok = 0;
    } else {
        if (!hc_out_untouched(&go, d, op)) {
            fprintf(stderr, "  %s %s %s: cuda wrote past the live rows\n", op_name(op), strat_name(strat), desc);
            ok = 0;
        }
        if (hu_cmp_bf16("hidden", go.hidden, co.hidden, TH)) ok = 0;
        if (hc_has_normalized(d, op) && hu_cmp_bf16("normalized", go.normalized, co.normalized, TH)) ok = 0;
        if (!ok)
            fprintf(stderr, "  ^ %s %s %s (seed %llu)\n", op_name(op), strat_name(strat), desc,
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

/* ---- sweep: the CPU test's cases ------------------------------------------ */

static hc_spec sweep_spec(int i)
{
    return hc_sweep_spec(i);
}

static void test_sweep(void)
{
    int i, bad = 0, n = HC_SWEEP_SIZE, rot;
    /* BEAM_TEST_QUICK (sanitizer runs): every third triple */
    for (i = 0; i < n; i += hu_quick() ? 3 : 1) {
        /* each triple twice: its rotation and the complementary one, so
         * norms, in-place and misalignment each appear on and off */
        for (rot = 0; rot < 2; rot++) {
            hc_case d;
            hc_spec s = sweep_spec(i + rot * 37), base = sweep_spec(i);
            s.K = base.K;
            s.H = base.H;
            s.T = base.T;
            hc_make(&d, &s, g_seed + (uint64_t)(2 * i + rot));
            if (!compare_all(&d, 0)) ++bad;
            hc_free(&d);
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* ---- prefill shapes ---------------------------------------------------------- */

/* The launch shapes that only large T picks: the pipelined prefill kernel
 * (hidden > 4096, T >= 2048) with its vector and misaligned variants, and
 * the row kernel at prefill sizes. The randomized sweep's size cap never
 * reaches them. BEAM_TEST_QUICK (the sanitizer runs) keeps one small case of
 * the pipelined shape. */
static void test_prefill(void)
{
    static const struct {
        int64_t T;
        int32_t K, H;
        int misalign, post, inplace, exotic;
    } full[] = {
        {4096, 8, 7168, 0, HC_NORM_OFF, 0, 0},    {4096, 8, 7168, 1, HC_NORM_WEIGHT, 0, 0},
        {2048, 8, 8192, 0, HC_NORM_WEIGHT, 1, 1}, {3001, 8, 4352, 1, HC_NORM_PLAIN, 0, 0},
        {4096, 8, 4096, 0, HC_NORM_OFF, 0, 1},    {4096, 8, 2048, 1, HC_NORM_WEIGHT, 1, 0},
    }, quick[] = {{2048, 2, 4608, 1, HC_NORM_WEIGHT, 0, 1}};
    const int n = hu_quick() ? 1 : (int)(sizeof full / sizeof full[0]);
    int i, bad = 0;
    for (i = 0; i < n; i++) {
        hc_case d;
        hc_spec s;
        memset(&s, 0, sizeof s);
        s.T = hu_quick() ? quick[i].T : full[i].T;
        s.K = hu_quick() ? quick[i].K : full[i].K;
        s.H = hu_quick() ? quick[i].H : full[i].H;
        s.misalign = hu_quick() ? quick[i].misalign : full[i].misalign;
        s.post = hu_quick() ? quick[i].post : full[i].post;
        s.inplace = hu_quick() ? quick[i].inplace : full[i].inplace;
        s.exotic = hu_quick() ? quick[i].exotic : full[i].exotic;
        s.pad = 2;
        s.next = HC_NORM_WEIGHT;
        s.scales = i % 2;
        s.rs_one = i % 3 == 0;
        hc_make(&d, &s, g_seed + 7919ULL * (uint64_t)(i + 1));
        if (!compare_all(&d, 0)) ++bad;
        hc_free(&d);
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* ---- randomized sweep ------------------------------------------------------ */

static void test_random(void)
{
    hu_rng r;
    int i, bad = 0, n = hu_quick() ? 60 : 1500;
    /* expert input elements of one case at most (8M: 16 MB): keeps the
     * generation, the CPU side and the copies short, so that the sweep takes
     * about a minute on a 16-core GPU host; tokens near 5000 then come with
     * small top_k * hidden */
    const double cap_elems = hu_quick() ? 2e6 : 8e6;
    hu_rng_init(&r, g_seed ^ 0x5EEDCAFEULL);
    for (i = 0; i < n; i++) {
        hc_case d;
        hc_spec s;
        hc_op op;
        beam_strategy strat;
        double lt;
        memset(&s, 0, sizeof s);
        s.K = 1 + (int32_t)hu_below(&r, 32);
        s.H = 256 * (1 + (int32_t)hu_below(&r, 32));
        /* tokens log-uniform in [0, 5000], 0 one time in 32 */
        lt = (double)hu_below(&r, 1u << 20) / (double)(1u << 20) * log(5001.0);
        s.T = hu_below(&r, 32) == 0 ? 0 : (int64_t)floor(exp(lt)) - 1;
        if (s.T > 5000) s.T = 5000;
        while (s.T > 1 && (double)s.T * s.K * s.H > cap_elems) s.T /= 2;
        s.pad = hu_below(&r, 3);
        s.post = hu_below(&r, 3);
        s.pre = hu_below(&r, 3);
        s.next = hu_below(&r, 3);
        s.scales = hu_below(&r, 2);
        s.rs_one = hu_below(&r, 2);
        s.inplace = hu_below(&r, 3) == 0;
        s.misalign = hu_below(&r, 5) == 0;
        s.exotic = hu_below(&r, 8) == 0;
        op = (hc_op)hu_below(&r, 3);
        strat = op == HC_FUSED ? (beam_strategy)hu_below(&r, 3) : BEAM_STRATEGY_AUTO;
        hc_make(&d, &s, g_seed + 1000003ULL * (uint64_t)(i + 1));
        if (!compare_case(&d, op, strat, hu_below(&r, 16) == 0)) ++bad;
        hc_free(&d);
        if (bad > 10) break;
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* ---- special values -------------------------------------------------------- */

static void test_special(void)
{
    static const int32_t hs[] = {256, 768, 7168, 8192};
    int i, bad = 0;
    for (i = 0; i < 24; i += hu_quick() ? 3 : 1) {
        hc_case d;
        hc_spec s;
        memset(&s, 0, sizeof s);
        s.K = i % 3 == 0 ? 1 : i % 3 == 1 ? 8 : 32;
        s.H = hs[i % 4];
        s.T = 1 + i * 3;
        s.pad = 2;
        s.post = i % 3;
        s.pre = (i + 1) % 3;
        s.next = (i + 2) % 3;
        s.scales = i % 2;
        s.rs_one = (i / 2) % 2;
        s.inplace = (i / 3) % 2;
        s.misalign = (i / 4) % 2;
        s.exotic = 1;
        hc_make(&d, &s, g_seed + 77 * (uint64_t)(i + 1));
        if (!compare_all(&d, i % 4 == 0)) ++bad;
        hc_free(&d);
    }
    CU_ASSERT_EQUAL(bad, 0);
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
        hc_spec s = sweep_spec(i);
        hc_make(&d, &s, g_seed + 999 * (uint64_t)(i + 1));
        if (!compare_all(&d, 1)) ++bad;
        hc_free(&d);
    }
    CU_ASSERT_EQUAL(bad, 0);
}

int main(void)
{
    CU_pSuite suite;
    int n = 0, failures;
    beam_status st;

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
    st = beam_set_backend("cuda");
    if (st != BEAM_OK) {
        printf("test_cuda: the cuda backend is not usable here (%s): skipped\n", beam_last_error());
        return 77;
    }
    g_seed = hu_seed("test_cuda");

    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    suite = CU_add_suite("cuda", NULL, NULL);
    if (!suite || !CU_add_test(suite, "sweep of the CPU cases", test_sweep) ||
        !CU_add_test(suite, "special values", test_special) ||
        !CU_add_test(suite, "CUDA contract", test_cuda_contract) ||
        !CU_add_test(suite, "CUDA graph capture", test_graph) ||
        !CU_add_test(suite, "prefill shapes", test_prefill) ||
        !CU_add_test(suite, "randomized sweep", test_random)) {
        CU_cleanup_registry();
        return 1;
    }
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    failures = (int)CU_get_number_of_failures();
    CU_cleanup_registry();
    printf("test_cuda: %ld CPU-vs-CUDA comparisons, seed %llu\n", g_runs, (unsigned long long)g_seed);
    return failures ? 1 : 0;
}
