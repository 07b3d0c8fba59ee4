/*
 * test_numerics.c - the library against the naive reference, bit for bit,
 * on fresh random inputs (seed printed; BEAM_TEST_SEED reproduces a run).
 *
 * The sweep covers every (top_k, hidden, tokens) triple of
 *   top_k 1,2,6,8,32 x hidden 256,2048,4096,7168,8192 x tokens 0,1,7,100
 * and picks the remaining axes (post/pre/next norm off|plain|weighted,
 * scales, routed_scale 1 or not, in place, misaligned bases, exotic values,
 * NaN padding rows) by a fixed rotation of the triple's index, so every
 * value of every axis appears without running the whole cross product.
 * Each case runs finalize, norm_residual_norm and the fused op under every
 * local strategy (AUTO, FUSED, UNFUSED).
 *
 * A last check runs with every buffer ending at an inaccessible page and
 * live_tokens == capacity, so any access past an array faults.
 *
 * Built twice: test_numerics links the dispatcher libbeammoe (backend "cpu"),
 * test_numerics_cpu links libbeammoe_cpu directly.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>

#include "suite.h"

static uint64_t g_seed;

/* Light cases for quick runs (valgrind): small hidden and tokens. */
static int sweep_skip(int i)
{
    hc_spec s = hc_sweep_spec(i);
    return hu_quick() && (s.H > 2048 || s.T > 7 || s.K > 8);
}

/* Run one op of one case through the library and compare with ref. */
static void check_op(const hc_case *d, int idx, hc_op op, beam_strategy strat,
                     const uint16_t *want_h, const uint16_t *want_n)
{
    size_t TH = (size_t)d->s.T * (size_t)d->s.H;
    uint16_t *got_h = (uint16_t *)hu_alloc(2 * TH, 0);
    uint16_t *got_n = (uint16_t *)hu_alloc(2 * TH, 0);
    int guard_ok = 0;
    char desc[256], label[400];
    beam_status st;

    hc_describe(&d->s, desc, sizeof desc);
    snprintf(label, sizeof label, "seed=%llu case=%d %s strategy=%d [%s]",
             (unsigned long long)g_seed, idx, hc_op_name(op), (int)strat, desc);
    st = hc_lib(d, op, strat, got_h, got_n, &guard_ok);
    if (st != BEAM_OK)
        fprintf(stderr, "FAIL %s: status %d: %s\n", label, (int)st, beam_last_error());
    CU_ASSERT_EQUAL(st, BEAM_OK);
    if (!guard_ok)
        fprintf(stderr, "FAIL %s: wrote past the live rows\n", label);
    CU_ASSERT(guard_ok);
    if (st == BEAM_OK) {
        CU_ASSERT_EQUAL(hu_cmp_bf16(label, got_h, want_h, TH), 0);
        if (hc_has_normalized(d, op)) {
            char l2[420];
            snprintf(l2, sizeof l2, "%s normalized", label);
            CU_ASSERT_EQUAL(hu_cmp_bf16(l2, got_n, want_n, TH), 0);
        }
    }
    hu_free(got_h);
    hu_free(got_n);
}

/* Case idx of spec s: every op, the fused one under every local strategy. */
static void run_case(int idx, const hc_spec *s, uint64_t seed)
{
    static const beam_strategy strats[3] = {BEAM_STRATEGY_AUTO, BEAM_STRATEGY_FUSED, BEAM_STRATEGY_UNFUSED};
    size_t TH = (size_t)s->T * (size_t)s->H;
    uint16_t *ref_h = (uint16_t *)hu_alloc(2 * TH, 0);
    uint16_t *ref_n = (uint16_t *)hu_alloc(2 * TH, 0);
    hc_case d;
    int op, k;
    hc_make(&d, s, seed);
    for (op = 0; op < 3; op++) {
        hc_ref(&d, (hc_op)op, ref_h, ref_n);
        for (k = 0; k < (op == HC_FUSED ? 3 : 1); k++)
            check_op(&d, idx, (hc_op)op, strats[k], ref_h, ref_n);
    }
    hc_free(&d);
    hu_free(ref_h);
    hu_free(ref_n);
}

static void test_sweep(void)
{
    int i, ran = 0;
    for (i = 0; i < HC_SWEEP_SIZE; i++) {
        const hc_spec s = hc_sweep_spec(i);
        if (sweep_skip(i))
            continue;
        run_case(i, &s, g_seed ^ (0x1000003ULL * (uint64_t)(i + 1)));
        ran++;
    }
    fprintf(stderr, "  sweep: %d cases x 5 calls\n", ran);
}

/* Each axis value must be present in the sweep (guards the rotation). */
static void test_sweep_covers_axes(void)
{
    int seen[8][3], i, a, v;
    memset(seen, 0, sizeof seen);
    for (i = 0; i < HC_SWEEP_SIZE; i++) {
        hc_spec s = hc_sweep_spec(i);
        seen[0][s.post]++;
        seen[1][s.pre]++;
        seen[2][s.next]++;
        seen[3][s.scales]++;
        seen[4][s.rs_one]++;
        seen[5][s.inplace]++;
        seen[6][s.misalign]++;
        seen[7][s.pad > 0]++;
    }
    for (a = 0; a < 8; a++)
        for (v = 0; v < (a < 3 ? 3 : 2); v++)
            CU_ASSERT(seen[a][v] > 0);
    /* every norm x scales combination appears with live tokens too */
    for (a = 0; a < 3; a++)
        for (v = 0; v < 3; v++) {
            int found = 0;
            for (i = 0; i < HC_SWEEP_SIZE; i++) {
                hc_spec s = hc_sweep_spec(i);
                if (s.T > 0 && s.post == a && s.next == v)
                    found = 1;
            }
            CU_ASSERT(found);
        }
}

/* Rows of a case whose live_tokens < capacity by a lot, the padding full of
 * NaN: a separate focused check on large padding with every op. */
static void test_big_padding(void)
{
    const hc_spec s = {.K = 8, .H = 1024, .T = 3, .pad = 61, .post = HC_NORM_WEIGHT, .next = HC_NORM_WEIGHT,
                       .scales = 1};
    run_case(-1, &s, g_seed + 77);
}

/* tokens == 0 with capacity > 0: valid and nothing is written. */
static void test_zero_tokens(void)
{
    uint16_t ex[8 * 256], res[256], out[256], nrm[256];
    float w[8];
    beam_norm nn = {NULL, 1e-6f};
    memset(ex, 0, sizeof ex);
    memset(w, 0, sizeof w);
    memset(res, 0, sizeof res);
    hu_poison(out, sizeof out);
    hu_poison(nrm, sizeof nrm);
    CU_ASSERT_EQUAL(beam_moe_finalize(ex, w, 1, 0, 8, 256, 1.0f, &nn, out, NULL), BEAM_OK);
    CU_ASSERT(hu_is_poison(out, sizeof out));
    CU_ASSERT_EQUAL(beam_norm_residual_norm(res, res + 0, 0, 256, &nn, NULL, &nn, out, nrm, NULL),
                    BEAM_OK);
    CU_ASSERT(hu_is_poison(out, sizeof out));
    CU_ASSERT(hu_is_poison(nrm, sizeof nrm));
    CU_ASSERT_EQUAL(beam_moe_finalize_norm_residual_norm(ex, w, 1, 0, 8, 256, 1.0f, NULL, res,
                                                         NULL, &nn, out, nrm,
                                                         BEAM_STRATEGY_FUSED, NULL),
                    BEAM_OK);
    CU_ASSERT(hu_is_poison(out, sizeof out));
    CU_ASSERT(hu_is_poison(nrm, sizeof nrm));
}

/* Every buffer ends where an inaccessible page begins and live_tokens ==
 * capacity: a read or write one element past any array faults (the test
 * then dies, which make check reports). Compared with the reference. */
static void fenced_case(int32_t K, int32_t H, int64_t T, int with_norms)
{
    static const beam_strategy strats[3] = {BEAM_STRATEGY_AUTO, BEAM_STRATEGY_FUSED, BEAM_STRATEGY_UNFUSED};
    const int norm = with_norms ? HC_NORM_WEIGHT : HC_NORM_OFF;
    const hc_spec s = {.K = K, .H = H, .T = T, .post = norm, .pre = norm, .next = norm, .scales = 1};
    const size_t TH = (size_t)T * (size_t)H;
    hc_case d;
    hc_out want, got;
    char desc[256], label[400], err[400];
    int op, k;

    hc_make(&d, &s, g_seed + 4242u + (uint64_t)H);
    if (hc_out_make(&want, &d, 0) || hc_out_make(&got, &d, 0)) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    hc_describe(&s, desc, sizeof desc);
    for (op = 0; op < 3; op++) {
        hc_reference(&d, (hc_op)op, &want);
        for (k = 0; k < (op == HC_FUSED ? 3 : 1); k++) {
            const beam_status st = hc_run(hc_ops(), &d, (hc_op)op, strats[k], HC_FENCED, &got, err, sizeof err);
            snprintf(label, sizeof label, "seed=%llu fenced %s strategy=%d [%s]", (unsigned long long)g_seed,
                     hc_op_name((hc_op)op), (int)strats[k], desc);
            if (st != BEAM_OK)
                fprintf(stderr, "FAIL %s: %s\n", label, err);
            CU_ASSERT_EQUAL(st, BEAM_OK);
            CU_ASSERT_EQUAL(hu_cmp_bf16(label, got.hidden, want.hidden, TH), 0);
            if (hc_has_normalized(&d, (hc_op)op))
                CU_ASSERT_EQUAL(hu_cmp_bf16(label, got.normalized, want.normalized, TH), 0);
        }
    }
    hc_out_free(&want);
    hc_out_free(&got);
    hc_free(&d);
}

static void test_fenced(void)
{
    fenced_case(1, 256, 1, 1);
    fenced_case(8, 7168, 3, 1);
    fenced_case(8, 7168, 3, 0);
    fenced_case(32, 8192, 2, 1);
    fenced_case(6, 2048, 5, 0);
}

int main(int argc, char **argv)
{
    static const suite_test tests[] = {
        {"sweep covers every axis value", test_sweep_covers_axes},
        {"tokens == 0 writes nothing", test_zero_tokens},
        {"NaN padding far past live rows", test_big_padding},
        {"buffers that end at an inaccessible page", test_fenced},
        {"sweep vs naive reference", test_sweep},
        {NULL, NULL}};
    beam_status st;
    const char *prog = argc > 0 && strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : "test_numerics";
    g_seed = hu_seed(prog);
    st = beam_set_backend("cpu");
    if (st != BEAM_OK) {
        fprintf(stderr, "beam_set_backend(cpu): %s\n", beam_last_error());
        return 1;
    }
    return suite_run("numerics", tests);
}
