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
 *   select    the branch-free conversion cpu/quant.c vectorizes, on every
 *             FP32 value (all 2^32 bit patterns): the model's code of
 *             clamp(v) only grows with |v|, so each positive code k is the
 *             code of one interval of bit patterns |v| in [lo_k, hi_k],
 *             found by bisection with the model and checked by it at both
 *             ends and just past them; bm_e4m3_clamp_sel must give k (and
 *             k | 0x80 for -v) on every pattern of the interval (beyond 448
 *             too: 0x7E) and 0xFE on every NaN, in a vectorized count
 *             (about 2 s; the subnormal range, every rounding boundary and
 *             all of [-448, 448] included); bm_e4m3_sel against bm_e4m3 on
 *             64 patterns around each boundary and every 61st pattern
 *   quotients bm_fp8_quant_sel(x, s) == bm_fp8_quant(x, s) for every BF16
 *             x (NaN and infinities included) and 64 scales: every 7th
 *             power of two from 2^-133 (subnormal) to 2^126, the eight
 *             above, scales just off 1 and 3 and others whose quotients
 *             land next to E4M3 midpoints, 1e-30, 3.4e38, infinity
 *   absmax    bm_fp8_absmax_bf16 against the float comparison loop (which
 *             skips a NaN as fmaxf does a quiet one), each BF16 value among
 *             zeros, NaN, infinities and others, at each place
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
#include "util.h"

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
    return hu_f32((uint32_t)b << 16);
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
        bad += (int)bm_e4m3((float)g_val[c]) != c;
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
        const uint32_t w = (uint32_t)u;
        const float v = hu_f32(w);
        float c;
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
        const float m = hu_f32((uint32_t)u);
        double p;
        /* FP32 division, correctly rounded: double then float is exact
         * enough (53 >= 2 * 24 + 2 bits) */
        bad += bm_fp8_group_scale(m, 1e-10f, 0) != (float)((double)fmaxf(m, 1e-10f) / 448.0);
        bad += bm_fp8_token_scale(m, 0) != fmaxf((float)((double)m / 448.0), 1.0f / 229376.0f);
        /* UE8M0: the smallest power of two >= max(s, 1e-10) */
        p = ldexp(1.0, -140);
        while (p < (double)fmaxf(bm_fp8_group_scale(m, 1e-10f, 0), 1e-10f)) p *= 2.0;
        bad += bm_fp8_group_scale(m, 1e-10f, 1) != (float)p;
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* ---- the branch-free forms ---------------------------------------------------- */

/* The model's code of clamp(v) for the magnitude bits a (NaN excluded). */
static unsigned model_bits(uint32_t a)
{
    return model_e4m3((double)bm_fp8_clamp(hu_f32(a)));
}

/* bm_e4m3_clamp_sel of every pattern of a code's interval */
#define SEL_CODE(u) bm_e4m3_clamp_sel(bm_fp8_float(u))
HC_CODE_SWEEP(sel_sweep, SEL_CODE)

static void test_select(void)
{
    uint32_t lo[128];
    long bad = 0;
    int k, sign;
    /* lo[k]: the first magnitude pattern whose code is >= k; the code of
     * +infinity (0x7F800000) is 0x7E. Every code is taken, and the ends are
     * right. */
    CU_ASSERT_EQUAL(hc_code_intervals(model_bits, 127, lo), 0);
    CU_ASSERT_EQUAL(lo[126], 0x43D80000u); /* 432, halfway from 416: ties to 448 (even) */
    /* bm_e4m3_clamp_sel on every pattern of both signs, 0xFE on every NaN */
    CU_ASSERT_EQUAL(sel_sweep(lo, 127, 0x80, 0xFE, "select"), 0);
    /* bm_e4m3_sel (the same code without the NaN case) against bm_e4m3:
     * 64 patterns around each interval's start, every 61st pattern, both
     * signs, to infinity */
    for (sign = 0; sign < 2; sign++) {
        const uint32_t s = sign ? 0x80000000u : 0u;
        uint32_t a;
        for (k = 1; k < 127; k++)
            for (a = lo[k] - 32; a < lo[k] + 32; a++)
                bad += bm_e4m3_sel(bm_fp8_float(s | a)) != bm_e4m3(bm_fp8_float(s | a));
        for (a = 0; a <= 0x7F800000u; a += 61u)
            bad += bm_e4m3_sel(bm_fp8_float(s | a)) != bm_e4m3(bm_fp8_float(s | a));
    }
    /* a quiet NaN through the definition's clamp, and through the select */
    bad += bm_e4m3(bm_fp8_clamp(bm_fp8_float(0x7FC00000u))) != 0xFE || bm_e4m3_clamp_sel(NAN) != 0xFE;
    CU_ASSERT_EQUAL(bad, 0);
}

static void test_quotients(void)
{
    float scales[64];
    long bad = 0;
    unsigned b;
    int k, n = 0;
    static const float more[] = {1.0f, 0.5f, 3.0f, 1.0f / 448.0f, 7.3e-3f, 1.5e-12f, 2.0e-3f, 640.0f,
                                 /* quotients near the midpoints 2^-10, 3 * 2^-10, 15 * 2^-8, 27 and 432 */
                                 1.0009765625f, 0.99951171875f, 3.00048828125f, 0.0625f / 0.05859375f,
                                 27.0f / 26.999998f, 432.0f / 431.99997f, 1.0e-30f, 3.4e38f};
    for (k = -133; k <= 127; k += 7) scales[n++] = ldexpf(1.0f, k); /* 38 */
    for (k = 0; k < (int)(sizeof more / sizeof more[0]); k++) scales[n++] = more[k];
    while (n < 63) scales[n] = scales[n - 1] * 1.37f, n++;
    scales[n++] = INFINITY;
    for (k = 0; k < n; k++)
        for (b = 0; b < 65536u; b++) {
            const float x = widen_bf16((uint16_t)b);
            const uint8_t got = (uint8_t)bm_fp8_quant_sel(x, scales[k]), want = bm_fp8_quant(x, scales[k]);
            if (got != want && bad++ < 5)
                fprintf(stderr, "  quotient bf16 0x%04x / %g: 0x%02x, definition 0x%02x\n", b,
                        (double)scales[k], got, want);
        }
    CU_ASSERT_EQUAL(n, 64);
    CU_ASSERT_EQUAL(bad, 0);
}

static void test_absmax(void)
{
    static const uint16_t others[] = {0x0000, 0x8000, 0x7FC0, 0xFF81, 0x0001, 0x3F80, 0xC2F0, 0x7F80, 0xFF80, 0x7F7F};
    const int no = (int)(sizeof others / sizeof others[0]);
    long bad = 0;
    unsigned b;
    int j, n;
    for (b = 0; b < 65536u; b++)
        for (j = 0; j < no; j++)
            for (n = 1; n <= 4; n++) {
                /* b among n - 1 of the others, at each place */
                uint16_t y[4];
                float want = 0.0f;
                int i, p;
                for (p = 0; p < n; p++) {
                    for (i = 0; i < n; i++) y[i] = others[(j + i) % no];
                    y[p] = (uint16_t)b;
                    want = 0.0f;
                    for (i = 0; i < n; i++)
                        if (fabsf(widen_bf16(y[i])) > want) want = fabsf(widen_bf16(y[i]));
                    bad += bm_fp8_bits(bm_fp8_absmax_bf16(y, n)) != bm_fp8_bits(want);
                }
            }
    CU_ASSERT_EQUAL(bad, 0);
}

int main(void)
{
    static const suite_test tests[] = {{"every code", test_codes},
                                       {"every BF16 value over eight scales", test_bf16},
                                       {"FP32 bit patterns", test_floats},
                                       {"scales", test_scales},
                                       {"branch-free forms on every FP32 value", test_select},
                                       {"branch-free quotients of every BF16 value", test_quotients},
                                       {"BF16 absmax", test_absmax},
                                       {NULL, NULL}};
    model_init();
    return suite_run("fp8", tests);
}
