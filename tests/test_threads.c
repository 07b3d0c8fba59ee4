/*
 * test_threads.c - the same bits for 1, 2 and 3 OpenMP threads.
 *
 * omp_set_num_threads() sets the calling thread's team size, and the CPU
 * backend's parallel regions run on that same thread, through the same
 * libgomp, so each call below runs with exactly that many threads (at most).
 * Every op and local strategy runs on a few shapes that split unevenly over
 * 2 and 3 threads (tokens 1, 7, 100, 257; hidden 256 .. 8192), and every
 * result must equal the naive reference.
 *
 * Links the dispatcher (backend "cpu").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include <CUnit/Basic.h>

#include "suite.h"

static uint64_t g_seed;

typedef struct shape {
    int32_t K, H;
    int64_t T;
} shape;

static const shape SHAPES[] = {{8, 7168, 1}, {6, 256, 7}, {2, 4096, 100}, {32, 2048, 7},
                               {1, 8192, 257}, {8, 1280, 33}};
#define NSHAPES ((int)(sizeof SHAPES / sizeof SHAPES[0]))

static void run_shape(int si)
{
    static const int threads[3] = {1, 2, 3};
    static const beam_strategy strats[3] = {BEAM_STRATEGY_AUTO, BEAM_STRATEGY_FUSED,
                                            BEAM_STRATEGY_UNFUSED};
    hc_spec s;
    hc_case d;
    size_t TH;
    uint16_t *ref_h, *ref_n, *got_h, *got_n;
    int op, ti, k, guard_ok;
    char desc[256];

    memset(&s, 0, sizeof s);
    s.K = SHAPES[si].K;
    s.H = SHAPES[si].H;
    s.T = SHAPES[si].T;
    s.pad = 1;
    s.post = HC_NORM_WEIGHT;
    s.pre = (si % 2) ? HC_NORM_PLAIN : HC_NORM_WEIGHT;
    s.next = (si % 3) ? HC_NORM_WEIGHT : HC_NORM_PLAIN;
    s.scales = si % 2;
    s.rs_one = si % 3 == 0;
    s.inplace = si % 2 == 0;
    hc_make(&d, &s, g_seed + 1000u * (uint64_t)si);
    hc_describe(&s, desc, sizeof desc);

    TH = (size_t)s.T * (size_t)s.H;
    ref_h = (uint16_t *)hu_alloc(2 * TH, 0);
    ref_n = (uint16_t *)hu_alloc(2 * TH, 0);
    got_h = (uint16_t *)hu_alloc(2 * TH, 0);
    got_n = (uint16_t *)hu_alloc(2 * TH, 0);

    for (op = 0; op < 3; op++) {
        hc_ref(&d, (hc_op)op, ref_h, ref_n);
        for (k = 0; k < (op == HC_FUSED ? 3 : 1); k++)
            for (ti = 0; ti < 3; ti++) {
                char label[400];
                beam_status st;
                omp_set_num_threads(threads[ti]);
                snprintf(label, sizeof label, "seed=%llu op=%d strategy=%d threads=%d [%s]",
                         (unsigned long long)g_seed, op, (int)strats[k], threads[ti], desc);
                st = hc_lib(&d, (hc_op)op, strats[k], got_h, got_n, &guard_ok);
                CU_ASSERT_EQUAL(st, BEAM_OK);
                CU_ASSERT(guard_ok);
                CU_ASSERT_EQUAL(hu_cmp_bf16(label, got_h, ref_h, TH), 0);
                if (hc_has_normalized(&d, (hc_op)op))
                    CU_ASSERT_EQUAL(hu_cmp_bf16(label, got_n, ref_n, TH), 0);
            }
    }
    omp_set_num_threads(2);
    hc_free(&d);
    hu_free(ref_h);
    hu_free(ref_n);
    hu_free(got_h);
    hu_free(got_n);
}

static void test_thread_counts(void)
{
    int i;
    for (i = 0; i < NSHAPES; i++) {
        if (hu_quick() && SHAPES[i].T * SHAPES[i].H * SHAPES[i].K > 100000)
            continue;
        run_shape(i);
    }
}

/* omp_set_num_threads really reaches the library's runtime: a parallel
 * region of this program sees the team size (guards the premise above). */
static void test_omp_premise(void)
{
    int n = 0;
    omp_set_num_threads(3);
#pragma omp parallel
    {
#pragma omp single
        n = omp_get_num_threads();
    }
    if (omp_get_dynamic() || omp_get_thread_limit() < 3)
        fprintf(stderr, "  (OMP_DYNAMIC or OMP_THREAD_LIMIT caps the team: %d threads)\n", n);
    else
        CU_ASSERT_EQUAL(n, 3);
    omp_set_num_threads(2);
}

int main(void)
{
    static const suite_test tests[] = {{"OpenMP team size is settable", test_omp_premise},
                                    {"bits identical for 1, 2, 3 threads", test_thread_counts},
                                    {NULL, NULL}};
    g_seed = hu_seed("test_threads");
    if (beam_set_backend("cpu") != BEAM_OK) {
        fprintf(stderr, "beam_set_backend(cpu): %s\n", beam_last_error());
        return 1;
    }
    return suite_run("threads", tests);
}
