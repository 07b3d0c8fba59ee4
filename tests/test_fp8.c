/*
 * test_fp8.c - the CPU backend's FP8 E4M3 conversion and scales (cpu/fp8.h)
 * against an independent model: the nearest of the 254 finite E4M3 values
 * by exhaustive search in double precision, ties to the even code.
 *
 *   codes     every finite code converts back to itself
 *   bf16      every BF16 value, divided by a set of scales and clamped as
 *             docs/numerics.md says, converts to the model's code (NaN and
 *             infinities included: the clamp makes them +-448)
 *   floats    every 1021st FP32 bit pattern (all signs, exponents and
 *             mantissas), clamped
 *   scales    the group and token scales against double arithmetic, and
 *             the power-of-two (UE8M0) scales against a search
 *
 * Groundwork of the quantized output: this test reaches a backend's
 * internal header; once the operations take a quantized output it moves
 * behind the API (an operation that quantizes a BF16 tensor).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <CUnit/Basic.h>

#include "../cpu/fp8.h"
#include "suite.h"

static double g_val[256];

static void model_init(void)
{
    int c;
    for (c = 0; c < 256; c++) {
        const int e = (c >> 3) & 15, m = c & 7;
        double v = e ? ldexp(8.0 + m, e - 10) : ldexp((double)m, -9);
        g_val[c] = (c & 0x80) ? -v : v;
    }
}

/* The nearest finite code to v (|v| <= 448), ties to the even code (its
 * mantissa's last bit 0); v = -0.0 gives 0x80, +0.0 gives 0x00. */
static uint8_t model_e4m3(double v)
{
    int c, best = -1;
    double bd = 0.0;
    for (c = 0; c < 256; c++) {
        double d;
        if ((c & 0x7F) == 0x7F) continue;
        if (signbit(v) != ((c & 0x80) != 0)) continue;
        d = fabs(g_val[c] - v);
        if (best < 0 || d < bd || (d == bd && (c & 1) == 0 && (best & 1))) {
            best = c;
            bd = d;
        }
    }
    return (uint8_t)best;
}

static float widen_bf16(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static void test_codes(void)
{
    int c, bad = 0;
    for (c = 0; c < 256; c++) {
        if ((c & 0x7F) == 0x7F) {
            bad += !isnan(bm_e4m3_value((uint8_t)c));
            continue;
        }
        bad += bm_e4m3_value((uint8_t)c) != (float)g_val[c];
        bad += bm_e4m3((float)g_val[c]) != c;
    }
    CU_ASSERT_EQUAL(bad, 0);
}

static void test_bf16(void)
{
    static const float scales[] = {1.0f, 0.5f, 3.0f, 1.0f / 448.0f, 7.3e-3f, 1.5e-12f, 2.0e-3f, 640.0f};
    long bad = 0;
    unsigned b;
    size_t k;
    for (k = 0; k < sizeof scales / sizeof scales[0]; k++)
        for (b = 0; b < 65536u; b++) {
            const float x = widen_bf16((uint16_t)b) / scales[k];
            const float c = bm_fp8_clamp(x);
            const uint8_t got = bm_fp8_quant(widen_bf16((uint16_t)b), scales[k]);
            /* NaN: fmaxf(NaN, -448) is -448, as in vLLM's group kernel */
            const uint8_t want = isnan(x) ? 0xFE : model_e4m3((double)c);
            if (got != want && bad++ < 5)
                fprintf(stderr, "  bf16 0x%04x / %g: 0x%02x, model 0x%02x\n", b, (double)scales[k], got, want);
        }
    CU_ASSERT_EQUAL(bad, 0);
}

static void test_floats(void)
{
    long bad = 0;
    uint64_t u;
    for (u = 0; u < 0x100000000ull; u += 1021u) {
        float v, c;
        uint32_t w = (uint32_t)u;
        memcpy(&v, &w, sizeof v);
        if (isnan(v)) continue;
        c = bm_fp8_clamp(v);
        if (bm_e4m3(c) != model_e4m3((double)c) && bad++ < 5)
            fprintf(stderr, "  float 0x%08x: 0x%02x, model 0x%02x\n", w, bm_e4m3(c), model_e4m3((double)c));
    }
    CU_ASSERT_EQUAL(bad, 0);
}

static void test_scales(void)
{
    long bad = 0;
    uint64_t u;
    for (u = 0; u < 0x7F800000ull; u += 4093u) {
        float m;
        uint32_t w = (uint32_t)u;
        double p;
        memcpy(&m, &w, sizeof m);
        /* FP32 division, correctly rounded: double then float is exact
         * enough (53 >= 2 * 24 + 2 bits) */
        bad += bm_fp8_group_scale(m, 1e-10f, 0) != (float)((double)fmaxf(m, 1e-10f) / 448.0);
        bad += bm_fp8_token_scale(m) != fmaxf((float)((double)m / 448.0), 1.0f / 229376.0f);
        /* UE8M0: the smallest power of two >= max(s, 1e-10) */
        p = ldexp(1.0, -140);
        while (p < (double)fmaxf(bm_fp8_group_scale(m, 1e-10f, 0), 1e-10f)) p *= 2.0;
        bad += bm_fp8_group_scale(m, 1e-10f, 1) != (float)p;
    }
    CU_ASSERT_EQUAL(bad, 0);
}

int main(void)
{
    static const suite_test tests[] = {{"every code", test_codes},
                                       {"every BF16 value over eight scales", test_bf16},
                                       {"FP32 bit patterns", test_floats},
                                       {"scales", test_scales},
                                       {NULL, NULL}};
    model_init();
    return suite_run("fp8", tests);
}
