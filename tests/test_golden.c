/*
 * test_golden.c - golden digests: FNV-1a 64 of the outputs of fixed cases,
 * checked into this file, so the ground truth cannot drift with the code.
 *
 * Inputs come from fixed seeds through splitmix64 and integer-only
 * generators (harness/util.c), so they are the same bits on every host. The
 * digests were produced by the naive reference (run this program with
 * BEAM_GOLDEN_PRINT=1 to print them again); both the reference and the
 * library must reproduce them. A changed digest means the numerics changed:
 * that is a change of docs/numerics.md, never a test update.
 *
 * Digests hash the bytes in memory: little-endian hosts (x86-64, arm64).
 *
 * Links libbeammoe_cpu directly (no dispatcher).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>

#include "suite.h"

typedef struct golden {
    hc_spec spec;
    uint64_t seed;
    uint64_t fin, nrn, fused; /* digests of finalize, norm_residual_norm, fused */
} golden;

/* spec fields: K, H, T, pad, post, pre, next, scales, rs_one, inplace,
 * misalign, exotic */
static const golden GOLDEN[] = {
    {{8, 7168, 5, 2, 2, 2, 2, 1, 0, 0, 0, 0}, 0x5EED0001ULL,
     0xBCA6558CC231BE86ULL, 0xDAEA3C011046B893ULL, 0x5829FDE28132F266ULL},
    {{1, 256, 3, 0, 0, 0, 0, 0, 1, 1, 0, 0}, 0x5EED0002ULL,
     0x20E701CE5E20DE17ULL, 0xD69416BFA14310E0ULL, 0x6835286E2B327D9BULL},
    {{32, 512, 2, 1, 1, 1, 1, 0, 1, 0, 1, 0}, 0x5EED0003ULL,
     0x4BC2C9644F467B35ULL, 0x8E87245CD0F4A303ULL, 0xF3C39475CA72EF11ULL},
    {{6, 4096, 4, 1, 2, 0, 2, 1, 0, 1, 0, 1}, 0x5EED0004ULL,
     0x01788B3B0DCE08BAULL, 0x897861D8709721ECULL, 0x7B2DEE126DCA1661ULL},
    {{2, 8192, 3, 0, 0, 0, 2, 1, 0, 0, 1, 0}, 0x5EED0005ULL,
     0xC0EEAB9624AE3B37ULL, 0x113E98805297482BULL, 0x702C8DD67AAC31BDULL},
    {{8, 2048, 9, 3, 2, 2, 2, 1, 0, 1, 0, 1}, 0x5EED0006ULL,
     0x873FA18A12FFD031ULL, 0x39687CDC3910A0DEULL, 0xEEA447CE59DE2250ULL},
    {{4, 1024, 16, 0, 1, 2, 0, 0, 0, 0, 0, 1}, 0x5EED0007ULL,
     0x61EC63C6EF32C494ULL, 0xC21F1E8F50AAB08BULL, 0x4487CBF030944059ULL},
    {{8, 8192, 64, 0, 2, 2, 2, 1, 0, 0, 0, 0}, 0x5EED0008ULL,
     0x148C831182F0074AULL, 0xDB456E4E5AEB76D4ULL, 0x5A7A9A5FC8A66E62ULL},
};
#define NGOLDEN ((int)(sizeof GOLDEN / sizeof GOLDEN[0]))

static uint64_t want_of(const golden *g, int op)
{
    return op == HC_FINALIZE ? g->fin : op == HC_NRN ? g->nrn : g->fused;
}

/* The digest of op on golden case g: the reference's, or (lib) the
 * library's under strategy s, which must leave the guard rows alone. */
static uint64_t digest_of(const golden *g, hc_op op, int lib, beam_strategy s)
{
    hc_case d;
    size_t TH;
    uint16_t *h, *n;
    uint64_t x;
    int guard_ok = 0;
    hc_make(&d, &g->spec, g->seed);
    TH = (size_t)d.s.T * (size_t)d.s.H;
    h = (uint16_t *)hu_alloc(2 * TH, 0);
    n = (uint16_t *)hu_alloc(2 * TH, 0);
    if (lib) {
        CU_ASSERT_EQUAL(hc_lib(&d, op, s, h, n, &guard_ok), BEAM_OK);
        CU_ASSERT(guard_ok);
    } else {
        hc_ref(&d, op, h, n);
    }
    x = hu_fnv1a(HU_FNV_OFFSET, h, 2 * TH);
    if (hc_has_normalized(&d, op))
        x = hu_fnv1a(x, n, 2 * TH);
    hu_free(h);
    hu_free(n);
    hc_free(&d);
    return x;
}

/* Every case and op: the reference (lib 0), or the library under every
 * strategy (the fused op) or AUTO (the others). */
static void check_all(int lib)
{
    static const beam_strategy s[3] = {BEAM_STRATEGY_AUTO, BEAM_STRATEGY_FUSED, BEAM_STRATEGY_UNFUSED};
    int i, op, k;
    for (i = 0; i < NGOLDEN; i++)
        for (op = 0; op < 3; op++)
            for (k = 0; k < (lib && op == HC_FUSED ? 3 : 1); k++) {
                const uint64_t got = digest_of(&GOLDEN[i], (hc_op)op, lib, s[k]), want = want_of(&GOLDEN[i], op);
                CU_ASSERT_EQUAL(got, want);
                if (got != want)
                    fprintf(stderr, "golden %d op %d (%s, strategy %d): got 0x%016llX want 0x%016llX\n", i, op,
                            lib ? "library" : "reference", (int)s[k], (unsigned long long)got,
                            (unsigned long long)want);
            }
}

static void test_reference(void)
{
    check_all(0);
}

static void test_library(void)
{
    check_all(1);
}

/* The generators themselves are pinned: a change there would silently
 * change every golden input. */
static void test_generators(void)
{
    hu_rng r;
    uint64_t h = HU_FNV_OFFSET;
    int i;
    hu_rng_init(&r, 1234567);
    CU_ASSERT_EQUAL(hu_next(&r), 0x599ED017FB08FC85ULL); /* splitmix64(1234567) */
    hu_rng_init(&r, 42);
    for (i = 0; i < 1000; i++) {
        uint16_t b = hu_rand_bf16(&r);
        float w = hu_rand_weight(&r);
        h = hu_fnv1a(h, &b, 2);
        h = hu_fnv1a(h, &w, 4);
    }
    CU_ASSERT_EQUAL(h, 0x266457962A075970ULL);
    if (h != 0x266457962A075970ULL)
        fprintf(stderr, "generator digest 0x%016llX\n", (unsigned long long)h);
}

static void print_table(void)
{
    int i;
    for (i = 0; i < NGOLDEN; i++) {
        const hc_spec *s = &GOLDEN[i].spec;
        printf("    {{%d, %d, %lld, %lld, %d, %d, %d, %d, %d, %d, %d, %d}, 0x%llXULL,\n"
               "     0x%016llXULL, 0x%016llXULL, 0x%016llXULL},\n",
               (int)s->K, (int)s->H, (long long)s->T, (long long)s->pad, s->post, s->pre, s->next,
               s->scales, s->rs_one, s->inplace, s->misalign, s->exotic, (unsigned long long)GOLDEN[i].seed,
               (unsigned long long)digest_of(&GOLDEN[i], HC_FINALIZE, 0, BEAM_STRATEGY_AUTO),
               (unsigned long long)digest_of(&GOLDEN[i], HC_NRN, 0, BEAM_STRATEGY_AUTO),
               (unsigned long long)digest_of(&GOLDEN[i], HC_FUSED, 0, BEAM_STRATEGY_AUTO));
    }
}

int main(void)
{
    static const suite_test tests[] = {{"generators pinned", test_generators},
                                    {"reference reproduces the digests", test_reference},
                                    {"library reproduces the digests", test_library},
                                    {NULL, NULL}};
    const char *p = getenv("BEAM_GOLDEN_PRINT");
    if (p && *p && *p != '0') {
        print_table();
        return 0;
    }
    return suite_run("golden", tests);
}
