/*
 * test_fp4.c - the NVFP4 pieces of the CPU backend (cpu/fp4.h) and the
 * harness's model of docs/numerics.md#nvfp4 (harness/quant_model.c), each
 * against hand-checked vectors, and against each other exhaustively.
 *
 *   e2m1      the hand-checked table: every rounding boundary of E2M1 (0.25,
 *             0.75, 1.25, 1.75, 2.5, 3.5, 5) and one ulp either side, 6,
 *             7, infinities, zeros of both signs, a negative tiny value,
 *             NaN of both signs, products y * os; the model (qm_e2m1) and
 *             the library (bm_e2m1) must both give the code worked out by
 *             hand
 *   blocks    blocks of 16 values with a global scale, scale code and the
 *             16 codes worked out by hand: the usual case, a scale that
 *             ties to zero (os = 0) and one just above, an infinite value
 *             (sf = 448), the E4M3 ties of the scale (down, up, at 432),
 *             a subnormal scale, the largest global scale below 2^118 with
 *             the largest and the smallest scale, a tiny global scale; the
 *             model and the library's pieces composed as cpu/quant.c does
 *   every     bm_e2m1 on every FP32 bit pattern (2^32): the model's code
 *   float     only grows with |p|, so each code k is one interval of
 *             magnitude patterns, found by bisection with the model and
 *             checked by hand (the boundaries' bits); bm_e2m1 must give k
 *             (k | 8 for the negative ones) on every pattern of it and 0x7
 *             on every NaN, in a vectorized count; and the model itself on
 *             every 61st pattern
 *   scales    bm_nvfp4_scale_code and bm_nvfp4_factor against the model for
 *             every BF16 maximum (0 to infinity) and every 4093rd FP32 one,
 *             under global scales from 2^-149 to the largest below 2^118
 *             (1, 672 = 448 * 6 / 4, a 2688 / amax-like one, tie makers)
 *   layout    the model's offset (written from the text) against
 *             BEAM_NVFP4_SCALE_OFFSET for t < 1100 and every block of
 *             H = 256, 2048, 7168; every byte of BEAM_NVFP4_SCALE_BYTES
 *             taken exactly once when T fills its tiles
 *   random    random blocks (the test's seed) with random global scales:
 *             the model's row (qm_quant) against the library's pieces
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>

#include "../cpu/fp4.h"
#include "beammoe.h"
#include "quant_model.h"
#include "suite.h"
#include "util.h"

static uint64_t g_seed;

/* the BF16 bits of v (v must be a BF16 value) */
static uint16_t bf(float v)
{
    return (uint16_t)(hu_u32(v) >> 16);
}

/* ---- hand-checked E2M1 ---------------------------------------------------- */

#define DN(x) nextafterf((x), 0.0f)      /* one ulp toward zero */
#define UP(x) nextafterf((x), INFINITY)   /* one ulp away from zero (x > 0) */

static void test_e2m1(void)
{
    /* codes: 0 1 2 3 4 5 6 7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 the sign */
    const struct {
        float y, os;
        uint8_t code;
    } v[] = {
        {0.25f, 1, 0x0},      /* halfway 0 | 0.5: ties to the even code, 0 */
        {DN(0.25f), 1, 0x0},  {UP(0.25f), 1, 0x1}, /* past it: 0.5 */
        {0.75f, 1, 0x2},      /* halfway 0.5 (1) | 1 (2): 1 */
        {DN(0.75f), 1, 0x1},  {UP(0.75f), 1, 0x2},
        {1.25f, 1, 0x2},      /* halfway 1 (2) | 1.5 (3): 1 */
        {DN(1.25f), 1, 0x2},  {UP(1.25f), 1, 0x3},
        {1.75f, 1, 0x4},      /* halfway 1.5 (3) | 2 (4): 2 */
        {DN(1.75f), 1, 0x3},  {UP(1.75f), 1, 0x4},
        {2.5f, 1, 0x4},       /* halfway 2 (4) | 3 (5): 2 */
        {DN(2.5f), 1, 0x4},   {UP(2.5f), 1, 0x5},
        {3.5f, 1, 0x6},       /* halfway 3 (5) | 4 (6): 4 */
        {DN(3.5f), 1, 0x5},   {UP(3.5f), 1, 0x6},
        {5.0f, 1, 0x6},       /* halfway 4 (6) | 6 (7): 4 */
        {DN(5.0f), 1, 0x6},   {UP(5.0f), 1, 0x7}, /* past it: 6, saturated from here on */
        {6.0f, 1, 0x7},       {7.0f, 1, 0x7},        {FLT_MAX, 1, 0x7}, {INFINITY, 1, 0x7},
        {-INFINITY, 1, 0xF},  {-0.75f, 1, 0xA},     {-UP(5.0f), 1, 0xF}, {-DN(0.25f), 1, 0x8},
        {0.0f, 1, 0x0},       {-0.0f, 1, 0x8},      /* zeros keep their sign */
        {-1e-30f, 1, 0x8},    {-0x1p-149f, 1, 0x8}, /* negative tiny: -0 */
        {0x1p-149f, 1, 0x0},
        {NAN, 1, 0x7},        {-NAN, 1, 0x7},       /* no NaN in E2M1: +6, sign dropped */
        /* products y * os (rounded to FP32 first) */
        {0.5f, 1.5f, 0x2},    /* 0.75: the tie, up to 1 */
        {3.0f, 0.5f, 0x3},    /* 1.5 */
        {1.0f, 0.0f, 0x0},    {-1.0f, 0.0f, 0x8}, /* os = 0: zeros of the sign */
        {INFINITY, 0.0f, 0x7},                    /* inf * 0 = NaN */
        {0x1p100f, 0x1p100f, 0x7},                /* overflows to inf */
        {-0x1p-100f, 0x1p-100f, 0x8},             /* underflows to -0 */
        {3.0f, 0x1.aaaaaap-1f, 0x4},              /* 3 * RN(5/6) = 2.4999998: below 2.5 */
        {10.0f, 0.5f, 0x6},                       /* 5: the tie, down to 4 */
    };
    int i, bad = 0;
    for (i = 0; i < (int)(sizeof v / sizeof v[0]); i++) {
        const float p = v[i].y * v[i].os;
        const uint8_t m = qm_e2m1(p), l = (uint8_t)bm_e2m1(p);
        if (m != v[i].code || l != v[i].code) {
            fprintf(stderr, "  e2m1 case %d: y %a * os %a = %a: model 0x%x, library 0x%x, want 0x%x\n", i,
                    (double)v[i].y, (double)v[i].os, (double)p, m, l, v[i].code);
            ++bad;
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* ---- hand-checked blocks -------------------------------------------------- */

/* The library's block as cpu/quant.c computes it, from cpu/fp4.h's pieces:
 * its scale code, and the 16 codes. */
static uint8_t lib_block(const uint16_t *y, float g, uint8_t *codes)
{
    const uint8_t sf = bm_nvfp4_scale_code(bm_fp8_absmax_bf16(y, 16), g);
    const float os = bm_nvfp4_factor(sf, g);
    int i;
    for (i = 0; i < 16; i++) {
        codes[i] = (uint8_t)bm_e2m1(hu_f32((uint32_t)y[i] << 16) * os);
    }
    return sf;
}

/* The model's block: one row of H = 16 * 16 through qm_quant with the block
 * in place b (the others zeros), its scale code from the tiled array. */
static uint8_t model_block(const uint16_t *y, float g, int b, uint8_t *codes)
{
    enum { H = 256 };
    static uint16_t row[H];
    static uint8_t vals[H / 2], sc[128 * H / 16];
    beam_quant q;
    int i;
    memset(&q, 0, sizeof q);
    q.kind = BEAM_QUANT_NVFP4;
    q.group_size = 16;
    q.scale = g;
    memset(row, 0, sizeof row);
    memcpy(row + 16 * b, y, 32);
    memset(vals, 0xA5, sizeof vals);
    memset(sc, 0xA5, sizeof sc);
    qm_quant(&q, row, 1, H, vals, sc);
    for (i = 0; i < 16; i++) codes[i] = (uint8_t)((vals[8 * b + i / 2] >> (4 * (i & 1))) & 0xF);
    return sc[BEAM_NVFP4_SCALE_OFFSET(0, b, H)];
}

static void test_blocks(void)
{
    /* m * RN(1/6) with m = 6 is RN(1 + 2^-25) = 1, so with m = 6 the scale
     * before rounding is g itself. Values not listed are +0 (code 0). */
    static const struct {
        const char *what;
        float g;
        float y[16];
        uint8_t sf, c[16];
    } v[] = {
        {"the boundaries, m = 6, g = 1: sv = 1, sf = 1 (0x38), os = 1",
         1.0f,
         {0.0f, -0.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, -0.5f, -1.5f, -3.0f, -4.0f, 0.125f, -6.0f},
         0x38,
         {0x0, 0x8, 0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6, 0x7, 0x9, 0xB, 0xD, 0xE, 0x0, 0xF}},
        {"sv = 2^-10, halfway 0 | 2^-9: sf = 0 (even), os = 0, zeros of the signs",
         0x1p-10f,
         {6.0f, -6.0f, 3.0f, 1.0f, -0.5f},
         0x00,
         {0x0, 0x8, 0x0, 0x0, 0x8}},
        {"sv one ulp above 2^-10: sf = 2^-9 (0x01), os = 0x1.000002p-1",
         0x1.000002p-10f,
         /* 6 -> 3.0000004 (3); 5 -> 2.5000002, past the tie (3); 0.5 ->
          * 0.25000001, past the tie (0.5); 1 -> 0.5 */
         {6.0f, -6.0f, 5.0f, 0.5f, 1.0f, -0.5f},
         0x01,
         {0x5, 0xD, 0x5, 0x1, 0x1, 0x9}},
        {"an infinite value: m = inf, sv = inf, sf = 448 (0x7E), os = RN(1/448)",
         1.0f,
         /* 1 -> 0.0022 (0); 224 -> 0.5 (1); 400 -> 0.89 (1: code 2); NaN
          * (skipped by the maximum) -> NaN (6); -inf -> -6 */
         {INFINITY, 1.0f, -1.0f, 0.0f, NAN, -INFINITY, 224.0f, 400.0f},
         0x7E,
         {0x7, 0x0, 0x8, 0x0, 0x7, 0xF, 0x1, 0x2}},
        {"sv = 1.0625, halfway 1 | 1.125: sf = 1 (0x38, even), os = 1.0625",
         1.0625f,
         /* 6.375 (6), 4.25 (4), 2.125 (2), 1.0625 (1), 0.53125 (0.5),
          * -3.1875 (-3), 2.65625 (3) */
         {6.0f, 4.0f, 2.0f, 1.0f, 0.5f, -3.0f, 2.5f},
         0x38,
         {0x7, 0x6, 0x4, 0x2, 0x1, 0xD, 0x5}},
        {"sv = 1.1875, halfway 1.125 | 1.25: sf = 1.25 (0x3A, even), os = RN(0.95)",
         1.1875f,
         /* 5.7 (6), 3.8 (4), 1.9 (2), 0.95 (1), -2.85 (-3) */
         {6.0f, 4.0f, 2.0f, 1.0f, -3.0f},
         0x3A,
         {0x7, 0x6, 0x4, 0x2, 0xD}},
        {"sv = 432, halfway 416 | 448: sf = 448 (0x7E, even), os = RN(27/28)",
         432.0f,
         /* 5.79 (6), 3.86 (4), 1.93 (2), -0.96 (-1) */
         {6.0f, 4.0f, 2.0f, -1.0f},
         0x7E,
         {0x7, 0x6, 0x4, 0xA}},
        {"sv = 1000 > 448: sf = 448 (0x7E), os = RN(1000/448) = 2.232",
         1000.0f,
         /* 13.4 (6), 4.46 (4), 2.23 (2), 1.116 (1) */
         {6.0f, 2.0f, 1.0f, 0.5f},
         0x7E,
         {0x7, 0x6, 0x4, 0x2}},
        {"a subnormal scale: sv = 3 * 2^-9 (0x03), os = 1",
         0x1.8p-8f,
         {6.0f, 1.75f, -0.25f, 2.5f},
         0x03,
         {0x7, 0x4, 0x8, 0x4}},
        {"g = 0x1.fffffep117, m = 1: sv = 5.5e34, sf = 448, os = RN(g / 448)",
         0x1.fffffep117f,
         /* 1 -> 7.6e32 (6); 2^-133 -> 6.9e-8 (0); -2^-108 -> -2.29 (-2) */
         {1.0f, 0x1p-133f, 0.0f, -0x1p-108f},
         0x7E,
         {0x7, 0x0, 0x0, 0xC}},
        {"g = 0x1.fffffep117, m = 3 * 2^-126: RN(m / 6) = 2^-127, sv = 0x1.fffffep-10, sf = 2^-9 (0x01), "
         "os = 0x1.fffffep126",
         0x1.fffffep117f,
         /* 3 * 2^-126 -> 6 (6); 2^-126 -> 1.9999999 (2); -2^-127 ->
          * -0.99999994 (-1); 1.25 * 2^-126 -> 2.4999998 (2, below the tie) */
         {0x1.8p-125f, 0x1p-126f, -0x1p-127f, 0x1.4p-126f},
         0x01,
         {0x7, 0x4, 0xA, 0x4}},
        {"g = 1e-30: sv = 1e-30, sf = 0, os = 0",
         1e-30f,
         {1.0f, -2.0f, 4.0f, -0.0f, 0x1p30f}, /* m = 2^30: sv = 1.8e-22 */
         0x00,
         {0x0, 0x8, 0x0, 0x8, 0x0}},
    };
    int i, j, b, bad = 0;
    for (i = 0; i < (int)(sizeof v / sizeof v[0]); i++) {
        uint16_t y[16];
        uint8_t lc[16], mc[16], lsf, msf;
        for (j = 0; j < 16; j++) y[j] = bf(v[i].y[j]);
        lsf = lib_block(y, v[i].g, lc);
        for (b = 0; b < 16; b += 5) { /* the model at a few places of the row */
            msf = model_block(y, v[i].g, b, mc);
            if (msf != v[i].sf || lsf != v[i].sf) {
                fprintf(stderr, "  block \"%s\" (place %d): scale code model 0x%02x, library 0x%02x, want 0x%02x\n",
                        v[i].what, b, msf, lsf, v[i].sf);
                ++bad;
            }
            for (j = 0; j < 16; j++)
                if (mc[j] != v[i].c[j] || lc[j] != v[i].c[j]) {
                    fprintf(stderr, "  block \"%s\" (place %d) value %d (%a): model 0x%x, library 0x%x, want 0x%x\n",
                            v[i].what, b, j, (double)v[i].y[j], mc[j], lc[j], v[i].c[j]);
                    ++bad;
                }
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* ---- bm_e2m1 on every FP32 value ------------------------------------------ */

static unsigned model_bits(uint32_t a)
{
    return qm_e2m1(hu_f32(a));
}

/* bm_e2m1 of every pattern of a code's interval */
#define E2M1_CODE(u) bm_e2m1(bm_fp8_float(u))
HC_CODE_SWEEP(e2m1_sweep, E2M1_CODE)

static void test_every_float(void)
{
    /* the first magnitude pattern of each code, by hand: just past 0.25
     * (ties go down), 0.75 (ties go up), past 1.25, 1.75, past 2.5, 3.5,
     * past 5; code 7 runs to infinity */
    static const uint32_t hand[8] = {0x00000000u, 0x3E800001u, 0x3F400000u, 0x3FA00001u,
                                     0x3FE00000u, 0x40200001u, 0x40600000u, 0x40A00001u};
    uint32_t lo[9];
    long bad = hc_code_intervals(model_bits, 8, lo);
    int k;
    uint64_t u;
    for (k = 0; k < 8; k++)
        if (lo[k] != hand[k]) {
            fprintf(stderr, "  the model's code %d starts at 0x%08x, by hand 0x%08x\n", k, lo[k], hand[k]);
            ++bad;
        }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(e2m1_sweep(lo, 8, 8, 0x7, "bm_e2m1"), 0);
    /* the model's search itself on every 61st pattern, NaNs included */
    bad = 0;
    for (u = 0; u < 0x100000000ull; u += 61u) {
        const uint32_t w = (uint32_t)u;
        if (qm_e2m1(hu_f32(w)) != bm_e2m1(hu_f32(w)) && bad++ < 5)
            fprintf(stderr, "  0x%08x: model 0x%x, library 0x%x\n", w, qm_e2m1(hu_f32(w)), bm_e2m1(hu_f32(w)));
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* ---- the block scale and factor -------------------------------------------- */

/* 1 when the library's scale code and factor of maximum m under g are the
 * model's (else prints the first few) */
static int scale_ok(float m, float g, long *bad)
{
    const uint8_t ls = bm_nvfp4_scale_code(m, g), ms = qm_nvfp4_scale(m, g);
    const float lf = bm_nvfp4_factor(ls, g), mf = qm_nvfp4_factor(ms, g);
    if (ls == ms && hu_u32(lf) == hu_u32(mf)) return 1;
    if ((*bad)++ < 5)
        fprintf(stderr, "  m %a, g %a: scale code 0x%02x, model 0x%02x; factor %a, model %a\n", (double)m,
                (double)g, ls, ms, (double)lf, (double)mf);
    return 0;
}

static void test_scales(void)
{
    static const float gs[] = {
        0x1p-149f, 1e-30f, 0x1p-10f, 0x1.8p-8f, 0.0125f, 1.0f, 1.0625f, 1.1875f, 432.0f, 672.0f,
        2688.0f / 3.7f,  /* 448 * 6 / amax with amax 3.7 */
        2688.0f / 1e-3f, 1.5e20f, 0x1p117f, 0x1.fffffep117f};
    long bad = 0;
    int gi, c;
    uint32_t b;
    uint64_t u;
    for (gi = 0; gi < (int)(sizeof gs / sizeof gs[0]); gi++) {
        const float g = gs[gi];
        /* every non-negative BF16 maximum, +0 to infinity */
        for (b = 0; b <= 0x7F80u; b++) scale_ok(hu_f32(b << 16), g, &bad);
        /* every 4093rd FP32 one */
        for (u = 0; u <= 0x7F800000u; u += 4093u) scale_ok(hu_f32((uint32_t)u), g, &bad);
        /* the factor of every scale code this g can meet */
        for (c = 0; c < 0x7F; c++) {
            const float lf = bm_nvfp4_factor((uint8_t)c, g), mf = qm_nvfp4_factor((uint8_t)c, g);
            if (hu_u32(lf) != hu_u32(mf) && bad++ < 5)
                fprintf(stderr, "  factor of 0x%02x under g %a: %a, model %a\n", c, (double)g, (double)lf,
                        (double)mf);
            if (c && !isfinite(mf) && bad++ < 5)
                fprintf(stderr, "  factor of 0x%02x under g %a is not finite\n", c, (double)g);
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* ---- the layout ------------------------------------------------------------- */

static void test_layout(void)
{
    static const int32_t hs[] = {256, 2048, 7168};
    long bad = 0;
    int hi;
    for (hi = 0; hi < 3; hi++) {
        const int32_t H = hs[hi];
        const int64_t T = 384; /* three whole tiles of rows */
        const size_t n = (size_t)BEAM_NVFP4_SCALE_BYTES(T, H);
        unsigned char *hit = calloc(n, 1);
        int64_t t, b;
        if (!hit) exit(1);
        for (t = 0; t < 1100; t++)
            for (b = 0; b < H / 16; b++) {
                const int64_t m = qm_nvfp4_offset(t, b, H), l = BEAM_NVFP4_SCALE_OFFSET(t, b, H);
                if (m != l && bad++ < 5)
                    fprintf(stderr, "  H %d t %lld b %lld: model offset %lld, header %lld\n", (int)H, (long long)t,
                            (long long)b, (long long)m, (long long)l);
                if (t < T) {
                    if (m < 0 || (size_t)m >= n) {
                        if (bad++ < 5) fprintf(stderr, "  H %d t %lld b %lld: offset %lld out of %zu\n", (int)H,
                                               (long long)t, (long long)b, (long long)m, n);
                    } else {
                        hit[m]++;
                    }
                }
            }
        for (t = 0; t < (int64_t)n; t++)
            if (hit[t] != 1 && bad++ < 5)
                fprintf(stderr, "  H %d: byte %lld taken %d times\n", (int)H, (long long)t, hit[t]);
        /* whole tiles: 1 row is one tile of rows, 129 two */
        bad += BEAM_NVFP4_SCALE_BYTES(1, H) != 128 * (H / 16) || BEAM_NVFP4_SCALE_BYTES(129, H) != 256 * (H / 16) ||
               BEAM_NVFP4_SCALE_BYTES(0, H) != 0;
        free(hit);
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* ---- random blocks ---------------------------------------------------------- */

static void test_random(void)
{
    enum { H = 256, T = 3, ROWS = 2000 };
    static uint16_t rows[T * H];
    static uint8_t vals[T * H / 2], sc[128 * H / 16];
    hu_rng r;
    long bad = 0;
    int it, t, b, i;
    hu_rng_init(&r, g_seed);
    for (it = 0; it < ROWS / T; it++) {
        beam_quant q;
        memset(&q, 0, sizeof q);
        q.kind = BEAM_QUANT_NVFP4;
        q.group_size = 16;
        /* global scales 2^-40 .. 2^100, random mantissas */
        q.scale = ldexpf(1.0f + (float)hu_unit(&r), (int)hu_below(&r, 141) - 40);
        hu_fill_bf16(&r, rows, T * H);
        hu_sprinkle_exotic(&r, rows, T * H, 64);
        /* blocks of one magnitude now and then: exact ties more often */
        for (i = 0; i < T * H; i += 16)
            if (hu_below(&r, 4) == 0) {
                const uint16_t e = (uint16_t)((hu_below(&r, 40) + 100) << 7);
                for (b = 0; b < 16; b++) rows[i + b] = (uint16_t)(e | (rows[i + b] & 0x807Fu & (hu_below(&r, 2) ? 0x8000u : 0xFFFFu)));
            }
        memset(vals, 0xA5, sizeof vals);
        memset(sc, 0xA5, sizeof sc);
        qm_quant(&q, rows, T, H, vals, sc);
        for (t = 0; t < T; t++)
            for (b = 0; b < H / 16; b++) {
                uint8_t lc[16];
                const uint8_t lsf = lib_block(rows + t * H + 16 * b, q.scale, lc);
                const uint8_t msf = sc[qm_nvfp4_offset(t, b, H)];
                int ok = lsf == msf;
                for (i = 0; i < 16; i++) ok &= lc[i] == ((vals[t * H / 2 + 8 * b + i / 2] >> (4 * (i & 1))) & 0xF);
                if (!ok && bad++ < 5)
                    fprintf(stderr, "  random block (g %a, row %d, block %d): scale 0x%02x, model 0x%02x; seed %llu\n",
                            (double)q.scale, t, b, lsf, msf, (unsigned long long)g_seed);
            }
    }
    CU_ASSERT_EQUAL(bad, 0);
}

int main(void)
{
    static const suite_test tests[] = {{"hand-checked E2M1", test_e2m1},
                                       {"hand-checked blocks", test_blocks},
                                       {"bm_e2m1 on every FP32 value", test_every_float},
                                       {"block scales and factors", test_scales},
                                       {"the scale layout", test_layout},
                                       {"random blocks", test_random},
                                       {NULL, NULL}};
    g_seed = hu_seed("test_fp4");
    return suite_run("fp4", tests);
}
