/*
 * test_edges.c - hand-checked vectors for the rounding edges of
 * docs/numerics.md. The expected bits are written here by hand (each comment shows
 * the arithmetic); both the naive reference and the library must give them,
 * so this file also guards the reference the other tests trust.
 *
 * Links libbeammoe_cpu directly (no dispatcher).
 *
 * Rows are H = 256 wide; "uniform" vectors fill every element the same way
 * and every output element must equal the expected value.
 */
#include <stdio.h>
#include <string.h>

#include <CUnit/Basic.h>

#include "suite.h"

#define H 256
#define MAXK 4

/* The H values of a row against the expected ones (want[0] for all of
 * them when uniform): the count that differ, printed with the line. */
static int row_bad(int line, const char *what, const uint16_t *got, const uint16_t *want, int uniform)
{
    int h, bad = 0;
    for (h = 0; h < H; h++)
        bad += got[h] != want[uniform ? 0 : h];
    if (bad)
        fprintf(stderr, "line %d: %s [0]=0x%04X want 0x%04X (%d differ)\n", line, what, got[0], want[0], bad);
    return bad;
}

/* A library call's status, and its output row against want; the guard
 * past the row (8 values) untouched. */
static void lib_row(int line, const char *what, beam_status st, const uint16_t *out, const uint16_t *want,
                    int uniform)
{
    CU_ASSERT_EQUAL(st, BEAM_OK);
    if (st != BEAM_OK)
        fprintf(stderr, "line %d: %s: status %d %s\n", line, what, (int)st, beam_last_error());
    CU_ASSERT_EQUAL(row_bad(line, what, out, want, uniform), 0);
}

/* finalize, one token, slot k filled with xk[k], weight wk[k]. */
static void fin_case(int line, int K, const uint16_t *xk, const float *wk, float rs,
                     const beam_norm *post, uint16_t want)
{
    uint16_t x[MAXK * H], out[H + 8], ref[H];
    float w[MAXK];
    nr_norm np;
    int k, h;

    for (k = 0; k < K; k++) {
        for (h = 0; h < H; h++)
            x[k * H + h] = xk[k];
        w[k] = wk[k];
    }
    np.on = post != NULL;
    np.weight = post ? post->weight : NULL;
    np.eps = post ? post->eps : 0.0f;
    nr_finalize(x, w, 1, K, H, rs, &np, ref);
    CU_ASSERT_EQUAL(row_bad(line, "finalize ref", ref, &want, 1), 0);
    hu_poison(out, sizeof out);
    lib_row(line, "finalize lib", beam_moe_finalize(x, w, 1, 1, K, H, rs, post, out, NULL), out, &want, 1);
    CU_ASSERT(hu_is_poison(out + H, 8 * sizeof(uint16_t)));
}

#define FIN1(x, w, rs, want)                                                                    \
    do {                                                                                        \
        uint16_t xs_[1] = {(x)};                                                                \
        float ws_[1] = {(w)};                                                                   \
        fin_case(__LINE__, 1, xs_, ws_, (rs), NULL, (want));                                    \
    } while (0)

/* norm_residual_norm of uniform rows x, residual (no norms), scales or NULL */
static void add_case(int line, uint16_t xv, uint16_t rv, const float *scales, uint16_t want)
{
    uint16_t x[H], r[H], out[H + 8], ref[H];
    int h;
    for (h = 0; h < H; h++) {
        x[h] = xv;
        r[h] = rv;
    }
    nr_norm_residual_norm(x, r, 1, H, NULL, scales, NULL, ref, NULL);
    CU_ASSERT_EQUAL(row_bad(line, "add ref", ref, &want, 1), 0);
    hu_poison(out, sizeof out);
    lib_row(line, "add lib", beam_norm_residual_norm(x, r, 1, H, NULL, scales, NULL, out, NULL, NULL), out, &want, 1);
    CU_ASSERT(hu_is_poison(out + H, 8 * sizeof(uint16_t)));
}

/* RMSNorm of one row, three ways: pre_norm (hidden = N(x) + -0), next_norm
 * (normalized = N(x + -0)), and finalize's post_norm (K = 1, w = 1; only for
 * rows without -0 and NaN payloads, which finalize's +0 start changes). */
static void norm_case(int line, const uint16_t *row, uint16_t wv, int has_w, float eps,
                      const uint16_t *want)
{
    uint16_t mz[H], wt[H], hid[H], nrm[H], ref[H];
    float fw = 1.0f;
    beam_norm bn;
    nr_norm nn;
    int h, fin_ok = 1;

    for (h = 0; h < H; h++) {
        mz[h] = 0x8000;
        wt[h] = wv;
        if (row[h] == 0x8000 || (row[h] & 0x7F80) == 0x7F80)
            fin_ok = 0;
    }
    bn.weight = has_w ? wt : NULL;
    bn.eps = eps;
    nn.on = 1;
    nn.weight = bn.weight;
    nn.eps = eps;

    nr_norm_residual_norm(row, mz, 1, H, &nn, NULL, NULL, ref, NULL);
    CU_ASSERT_EQUAL(row_bad(line, "norm ref", ref, want, 0), 0);
    lib_row(line, "pre_norm lib", beam_norm_residual_norm(row, mz, 1, H, &bn, NULL, NULL, hid, NULL, NULL), hid,
            want, 0);
    lib_row(line, "next_norm lib", beam_norm_residual_norm(row, mz, 1, H, NULL, NULL, &bn, hid, nrm, NULL), nrm,
            want, 0);
    if (fin_ok)
        lib_row(line, "post_norm lib", beam_moe_finalize(row, &fw, 1, 1, 1, H, 1.0f, &bn, hid, NULL), hid, want, 0);
}

static void uniform_norm(int line, uint16_t v, uint16_t wv, int has_w, float eps, uint16_t want)
{
    uint16_t row[H], w[H];
    int h;
    for (h = 0; h < H; h++) {
        row[h] = v;
        w[h] = want;
    }
    norm_case(line, row, wv, has_w, eps, w);
}

/* ---- bf16() itself, through the reference (the library's is internal) -- */
static void test_bf16_rule(void)
{
    /* (u + 0x7FFF + ((u >> 16) & 1)) >> 16 */
    CU_ASSERT_EQUAL(nr_bf16(hu_f32(0x3F808000u)), 0x3F80); /* tie, even below */
    CU_ASSERT_EQUAL(nr_bf16(hu_f32(0x3F818000u)), 0x3F82); /* tie, odd below  */
    CU_ASSERT_EQUAL(nr_bf16(hu_f32(0x3F808001u)), 0x3F81);
    CU_ASSERT_EQUAL(nr_bf16(hu_f32(0x3F807FFFu)), 0x3F80);
    CU_ASSERT_EQUAL(nr_bf16(hu_f32(0x7F7FFFFFu)), 0x7F80); /* FLT_MAX -> inf */
    CU_ASSERT_EQUAL(nr_bf16(hu_f32(0xFF7FFFFFu)), 0xFF80);
    CU_ASSERT_EQUAL(nr_bf16(hu_f32(0x7F7F7FFFu)), 0x7F7F);
    CU_ASSERT_EQUAL(nr_bf16(hu_f32(0x7FC00000u)), 0x7FFF);
    CU_ASSERT_EQUAL(nr_bf16(hu_f32(0xFFFFFFFFu)), 0x7FFF); /* would wrap w/o NaN rule */
    CU_ASSERT_EQUAL(nr_bf16(hu_f32(0x7F800001u)), 0x7FFF);
    CU_ASSERT_EQUAL(nr_bf16(hu_f32(0x80000000u)), 0x8000);
    CU_ASSERT_EQUAL(nr_bf16(hu_f32(0x00008000u)), 0x0000); /* subnormal tie */
    CU_ASSERT_EQUAL(nr_bf16(hu_f32(0x00018000u)), 0x0002);
    CU_ASSERT_EQUAL(nr_bf16(hu_f32(0x007FFFFFu)), 0x0080); /* to min normal */
    CU_ASSERT(hu_u32(nr_f(0x3F81)) == 0x3F810000u);
    CU_ASSERT(hu_u32(nr_f(0x8001)) == 0x80010000u);
}

static void test_finalize_ties(void)
{
    /* 1.0 * w: the product is w itself */
    FIN1(0x3F80, hu_f32(0x3F808000u), 1.0f, 0x3F80); /* tie -> even 0x3F80 */
    FIN1(0x3F80, hu_f32(0x3F818000u), 1.0f, 0x3F82); /* tie -> even 0x3F82 */
    FIN1(0x3F80, hu_f32(0x3F808001u), 1.0f, 0x3F81); /* just above the tie */
    FIN1(0x3F80, hu_f32(0x3F807FFFu), 1.0f, 0x3F80); /* just below */
    FIN1(0x3F80, hu_f32(0xBF818000u), 1.0f, 0xBF82); /* negative tie */
    FIN1(0x3F80, -1.0f, 1.0f, 0xBF80);
    /* routed_scale rounds again: r = 1.0, s = bf16(1.0 * rs) */
    FIN1(0x3F80, 1.0f, hu_f32(0x3F808000u), 0x3F80);
    FIN1(0x3F80, 1.0f, hu_f32(0x3F818000u), 0x3F82);
    /* double rounding is the rule: a = 0x3F808001 -> r = 0x3F81 (1.0078125),
     * then * 0x3F7F0000 (0.99609375) = 1.003875732421875 = 0x3F807F00 -> 0x3F80 */
    FIN1(0x3F80, hu_f32(0x3F808001u), hu_f32(0x3F7F0000u), 0x3F80);
}

static void test_finalize_order_and_fma(void)
{
    /* slots summed in k order from +0:
     * 2^-24 + 2^-24 = 2^-23; + 1 = 0x3F800001; + 2^-8 = 0x3F808001 -> 0x3F81.
     * (Summed in reverse: 1 + 2^-8 = tie point, the 2^-24s vanish -> 0x3F80.) */
    {
        uint16_t xs[4] = {0x3380, 0x3380, 0x3F80, 0x3B80};
        float ws[4] = {1.0f, 1.0f, 1.0f, 1.0f};
        fin_case(__LINE__, 4, xs, ws, 1.0f, NULL, 0x3F81);
    }
    /* no FMA: w = 0x3F2AAB56, x = 0x3BC0 (1.5 * 2^-8): the exact product is
     * a hair above 2^-8 + 2^-24 and rounds to it; 1 + that is an FP32 tie ->
     * 0x3F808000 -> BF16 tie -> 0x3F80. A fused multiply-add would see the
     * hair, give 0x3F808001 and then 0x3F81. */
    {
        uint16_t xs[2] = {0x3F80, 0x3BC0};
        float ws[2] = {1.0f, hu_f32(0x3F2AAB56u)};
        fin_case(__LINE__, 2, xs, ws, 1.0f, NULL, 0x3F80);
    }
    /* inf + -inf across slots -> NaN -> 0x7FFF */
    {
        uint16_t xs[2] = {0x7F80, 0xFF80};
        float ws[2] = {1.0f, 1.0f};
        fin_case(__LINE__, 2, xs, ws, 1.0f, NULL, 0x7FFF);
    }
    /* a NaN in one slot poisons the sum */
    {
        uint16_t xs[3] = {0x3F80, 0xFFC1, 0x3F80};
        float ws[3] = {1.0f, 0.5f, 1.0f};
        fin_case(__LINE__, 3, xs, ws, 1.0f, NULL, 0x7FFF);
    }
}

static void test_finalize_overflow_nan(void)
{
    FIN1(0x3F80, hu_f32(0x7F7FFFFFu), 1.0f, 0x7F80); /* FLT_MAX rounds to inf */
    FIN1(0x3F80, hu_f32(0xFF7FFFFFu), 1.0f, 0xFF80);
    FIN1(0x3F80, hu_f32(0x7F7F7FFFu), 1.0f, 0x7F7F); /* below the tie */
    FIN1(0x3F80, hu_f32(0x7F7F8000u), 1.0f, 0x7F80); /* tie, 0x7F7F odd -> up */
    FIN1(0x7F7F, 2.0f, 1.0f, 0x7F80);                /* FP32 product overflows */
    FIN1(0x7F7F, 1.0f, 2.0f, 0x7F80);                /* routed_scale overflows */
    FIN1(0x7F80, 1.0f, 1.0f, 0x7F80);                /* inf passes */
    FIN1(0xFF80, 1.0f, 1.0f, 0xFF80);
    FIN1(0x7FC0, 1.0f, 1.0f, 0x7FFF); /* NaN in, canonical NaN out */
    FIN1(0xFFC1, 1.0f, 1.0f, 0x7FFF);
    FIN1(0x7F81, 1.0f, 1.0f, 0x7FFF); /* signalling NaN */
    FIN1(0xFFFF, 1.0f, 1.0f, 0x7FFF);
    FIN1(0x7F80, 0.0f, 1.0f, 0x7FFF);                 /* inf * 0 */
    FIN1(0x3F80, hu_f32(0x7FC00000u), 1.0f, 0x7FFF);  /* NaN weight */
    FIN1(0x3F80, hu_f32(0xFFC00000u), 1.0f, 0x7FFF);  /* negative NaN weight */
    FIN1(0x7F80, 1.0f, 0.0f, 0x7FFF);                 /* inf * routed_scale 0 */
}

static void test_finalize_zeros_subnormals(void)
{
    FIN1(0x8000, 1.0f, 1.0f, 0x0000);  /* +0 + (-0) = +0: the sum starts at +0 */
    FIN1(0x0000, -1.0f, 1.0f, 0x0000); /* +0 + (-0) = +0 */
    FIN1(0x0000, 1.0f, -1.0f, 0x8000); /* then +0 * -1 = -0 */
    FIN1(0x3F80, 1.0f, 0.0f, 0x0000);
    FIN1(0x3F80, 1.0f, -0.0f, 0x8000);
    FIN1(0x0001, 1.0f, 1.0f, 0x0001);  /* 2^-133 survives: no flush to zero */
    FIN1(0x8001, 1.0f, 1.0f, 0x8001);
    FIN1(0x0001, 0.5f, 1.0f, 0x0000);  /* 2^-134 = 0x00008000: tie -> even 0 */
    FIN1(0x0001, 0.75f, 1.0f, 0x0001); /* 0x0000C000: above the tie */
    FIN1(0x0003, 0.5f, 1.0f, 0x0002);  /* 0x00018000: tie -> even 0x0002 */
    FIN1(0x8003, 0.5f, 1.0f, 0x8002);
    FIN1(0x0080, 0.5f, 1.0f, 0x0040);  /* min normal / 2 -> subnormal 2^-127 */
    FIN1(0x3F80, hu_f32(0x007FFFFFu), 1.0f, 0x0080); /* largest subnormal -> min normal */
    FIN1(0x3F80, 1.0f, hu_f32(0x00008000u), 0x0000); /* routed_scale subnormal tie */
    FIN1(0x0001, 1.0f, 4.0f, 0x0004);
}

static void test_add_edges(void)
{
    float sc[2];
    add_case(__LINE__, 0x3F80, 0x3B80, NULL, 0x3F80); /* 1 + 2^-8: tie -> even */
    add_case(__LINE__, 0x3F80, 0x3C40, NULL, 0x3F82); /* 1 + 3*2^-8: tie -> 0x3F82 */
    add_case(__LINE__, 0x8000, 0x8000, NULL, 0x8000); /* -0 + -0 = -0 */
    add_case(__LINE__, 0x0000, 0x8000, NULL, 0x0000); /* +0 + -0 = +0 */
    add_case(__LINE__, 0x8001, 0x0001, NULL, 0x0000); /* x + -x = +0 */
    add_case(__LINE__, 0x0001, 0x0001, NULL, 0x0002); /* subnormal sum exact */
    add_case(__LINE__, 0x7F7F, 0x7F7F, NULL, 0x7F80); /* overflow */
    add_case(__LINE__, 0xFF7F, 0xFF7F, NULL, 0xFF80);
    add_case(__LINE__, 0x7F80, 0xFF80, NULL, 0x7FFF); /* inf - inf */
    add_case(__LINE__, 0xFFC1, 0x3F80, NULL, 0x7FFF); /* NaN in */
    add_case(__LINE__, 0x3F80, 0x7F81, NULL, 0x7FFF);
    /* scales: bx = bf16(x * s0), br = bf16(r * s1), then the sum */
    sc[0] = hu_f32(0x3F808000u);
    sc[1] = 1.0f;
    add_case(__LINE__, 0x3F80, 0x0000, sc, 0x3F80); /* 1.00390625 -> tie -> 0x3F80 */
    sc[0] = hu_f32(0x3F818000u);
    add_case(__LINE__, 0x3F80, 0x0000, sc, 0x3F82);
    sc[0] = hu_f32(0x3F808001u);
    sc[1] = hu_f32(0x3F808001u);
    /* bx = br = 0x3F81 (1.0078125); sum 2.015625 = 0x4001 exactly */
    add_case(__LINE__, 0x3F80, 0x3F80, sc, 0x4001);
    sc[0] = -0.0f;
    sc[1] = 1.0f;
    add_case(__LINE__, 0x3F80, 0x8000, sc, 0x8000); /* -0 + -0 */
    sc[0] = 2.0f;
    add_case(__LINE__, 0x7F7F, 0x3F80, sc, 0x7F80); /* scaled x overflows */
    sc[0] = 1.0f;
    sc[1] = 0.0f;
    add_case(__LINE__, 0x3F80, 0x7F80, sc, 0x7FFF); /* inf * 0 in the residual */
    sc[1] = 0.5f;
    add_case(__LINE__, 0x0000, 0x0001, sc, 0x0000); /* 2^-134 tie -> +0 */
}

static void test_norm_edges(void)
{
    uint16_t row[H], want[H];
    int h;

    uniform_norm(__LINE__, 0x3F80, 0, 0, 0.0f, 0x3F80);   /* ones -> ones */
    uniform_norm(__LINE__, 0x4000, 0, 0, 0.0f, 0x3F80);   /* 2 / sqrt(4) */
    uniform_norm(__LINE__, 0xC000, 0, 0, 0.0f, 0xBF80);
    /* 3 * fl(1/3) = 3 * 0x3EAAAAAB = 1.0000000298 -> 1.0 */
    uniform_norm(__LINE__, 0x4040, 0, 0, 0.0f, 0x3F80);
    uniform_norm(__LINE__, 0x3F80, 0x4000, 1, 0.0f, 0x4000); /* weight 2 */
    uniform_norm(__LINE__, 0x3F80, 0xBF80, 1, 0.0f, 0xBF80); /* weight -1 */
    uniform_norm(__LINE__, 0x3F80, 0x7F7F, 1, 0.0f, 0x7F7F);
    uniform_norm(__LINE__, 0x3F80, 0x7FC0, 1, 0.0f, 0x7FFF); /* NaN weight */

    /* zero rows: eps = 0 gives ms = 0, inv = 1/0 = inf, 0 * inf = NaN */
    uniform_norm(__LINE__, 0x0000, 0, 0, 0.0f, 0x7FFF);
    uniform_norm(__LINE__, 0x0000, 0x3F80, 1, 0.0f, 0x7FFF);
    uniform_norm(__LINE__, 0x8000, 0, 0, 0.0f, 0x7FFF);
    /* eps > 0: inv finite, 0 * inv keeps the sign of the zero */
    uniform_norm(__LINE__, 0x0000, 0, 0, 1e-6f, 0x0000);
    uniform_norm(__LINE__, 0x8000, 0, 0, 1e-6f, 0x8000);
    uniform_norm(__LINE__, 0x8000, 0xBF80, 1, 1e-6f, 0x0000); /* -0 * -1 = +0 */
    uniform_norm(__LINE__, 0x0000, 0xBF80, 1, 1e-6f, 0x8000);
    uniform_norm(__LINE__, 0x0000, 0, 0, -0.0f, 0x7FFF); /* eps = -0 is >= 0: valid */

    /* squares overflow: ms = inf, inv = 0, u = v * 0 = +-0 */
    uniform_norm(__LINE__, 0x7F7F, 0, 0, 0.0f, 0x0000);
    uniform_norm(__LINE__, 0xFF7F, 0, 0, 1e-6f, 0x8000);
    /* subnormal row: squares underflow to 0.
     * eps = 0: inv = inf, 2^-133 * inf = inf */
    uniform_norm(__LINE__, 0x0001, 0, 0, 0.0f, 0x7F80);
    /* eps = 1e-6f (0x358637BD): sqrt = 0x3A83126F..., inv = 0x4479FFFF,
     * 2^-133 * inv = 0x01F9FFFF -> 0x01FA */
    uniform_norm(__LINE__, 0x0001, 0, 0, 1e-6f, 0x01FA);

    /* one inf among ones: ms = inf, inv = 0; inf * 0 = NaN, 1 * 0 = 0 */
    for (h = 0; h < H; h++) {
        row[h] = 0x3F80;
        want[h] = 0x0000;
    }
    row[17] = 0x7F80;
    want[17] = 0x7FFF;
    norm_case(__LINE__, row, 0, 0, 1e-6f, want);
    /* one NaN: everything NaN */
    for (h = 0; h < H; h++) {
        row[h] = 0x3F80;
        want[h] = 0x7FFF;
    }
    row[200] = 0xFFC1;
    norm_case(__LINE__, row, 0, 0, 1e-6f, want);
}

/* The summation tree is observable. Row: 4096 at [0], 1.0 at [8c] for
 * c = 1..31 and at [249], zeros elsewhere; eps = 256.640625.
 * Chunk sums: P[0] = 2^24, P[1..30] = 1, P[31] = 2. Halving tree:
 *  s=16: P[0] = 2^24 + 1 -> 2^24 (tie, even); P[1..14] = 2; P[15] = 3
 *  s=8:  P[0] = 2^24 + 2;  P[1..6] = 4; P[7] = 5
 *  s=4:  P[0] = 2^24 + 6;  P[1..2] = 8; P[3] = 9
 *  s=2:  P[0] = 2^24 + 14; P[1] = 17
 *  s=1:  P[0] = 2^24 + 31 -> 2^24 + 32 (tie, even)
 * ms = 65536.125; ms + eps = 65792.765625; sqrt -> 256.50100708 (0x43804020
 * region); inv = 0x3B7F7FFE, a hair under the BF16 tie 0x3B7F8000, so
 * 1.0 -> 0x3B7F and 4096 -> 0x417F. A plain left-to-right sum loses every
 * 1 (P = 2^24) and gives 0x3B80 / 0x4180 instead. */
static void test_norm_tree_order(void)
{
    uint16_t row[H], want[H];
    int h, c;
    for (h = 0; h < H; h++) {
        row[h] = 0x0000;
        want[h] = 0x0000;
    }
    row[0] = 0x4580;
    want[0] = 0x417F;
    for (c = 1; c < 32; c++) {
        row[8 * c] = 0x3F80;
        want[8 * c] = 0x3B7F;
    }
    row[249] = 0x3F80;
    want[249] = 0x3B7F;
    norm_case(__LINE__, row, 0, 0, 256.640625f, want);
}

/* The whole chain on one element: finalize -> post norm -> residual -> next
 * norm, in the fused op and its unfused composition. Uniform row of ones,
 * K = 2 (w = 0.5, 0.5), rs = 1, post norm (no weight), residual 1.0,
 * scales NULL, next norm weight 2: hidden = 2.0 (0x4000), normalized = 2.0. */
static void test_fused_chain(void)
{
    uint16_t x[2 * H], res[H], wt[H], hid[H], nrm[H];
    float w[2] = {0.5f, 0.5f};
    beam_norm post = {NULL, 0.0f}, next = {NULL, 1e-6f};
    static const beam_strategy s[3] = {BEAM_STRATEGY_AUTO, BEAM_STRATEGY_FUSED,
                                       BEAM_STRATEGY_UNFUSED};
    int h, k, bad;
    for (h = 0; h < H; h++) {
        x[h] = x[H + h] = 0x3F80;
        res[h] = 0x3F80;
        wt[h] = 0x4000;
    }
    next.weight = wt;
    for (k = 0; k < 3; k++) {
        beam_status st = beam_moe_finalize_norm_residual_norm(
            x, w, 1, 1, 2, H, 1.0f, &post, res, NULL, &next, hid, nrm, s[k], NULL);
        CU_ASSERT_EQUAL(st, BEAM_OK);
        bad = 0;
        /* hidden: 1 + 1 = 2; normalized: 2 / sqrt(4 + 1e-6) = 0.99999988
         * -> BF16 1.0, times weight 2 -> 0x4000 */
        for (h = 0; h < H; h++)
            bad += hid[h] != 0x4000 || nrm[h] != 0x4000;
        CU_ASSERT_EQUAL(bad, 0);
    }
}

/* This program links libbeammoe_cpu itself: it knows only its own name and
 * "auto" (docs/contract.md: a backend library accepts its own name and "auto"). */
static void test_direct_backend(void)
{
    CU_ASSERT_STRING_EQUAL(beam_backend_name(), "cpu");
    CU_ASSERT_EQUAL(beam_set_backend("cpu"), BEAM_OK);
    CU_ASSERT_EQUAL(beam_set_backend("auto"), BEAM_OK);
    CU_ASSERT_NOT_EQUAL(beam_set_backend("cuda"), BEAM_OK);
    CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "beam_set_backend"));
    CU_ASSERT_NOT_EQUAL(beam_set_backend("bogus"), BEAM_OK);
    CU_ASSERT_NOT_EQUAL(beam_set_backend(NULL), BEAM_OK);
    CU_ASSERT_STRING_EQUAL(beam_backend_name(), "cpu");
    /* its table: for its own name or NULL; another backend's name is
     * refused (libbeammoe loads any), and so is another table version */
    {
        const beam_ops *ops = beam_backend_ops(NULL, BEAM_OPS_VERSION);
        CU_ASSERT_PTR_NOT_NULL_FATAL(ops);
        CU_ASSERT_PTR_EQUAL(beam_backend_ops("cpu", BEAM_OPS_VERSION), ops);
        CU_ASSERT_STRING_EQUAL(ops->name, "cpu");
        CU_ASSERT_EQUAL(ops->version, BEAM_OPS_VERSION);
        CU_ASSERT_EQUAL(ops->size, sizeof(beam_ops));
        CU_ASSERT_EQUAL(ops->device_memory, 0);
        CU_ASSERT_PTR_NULL(beam_backend_ops("cuda", BEAM_OPS_VERSION));
        CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "holds only the cpu backend"));
        CU_ASSERT_PTR_NULL(beam_backend_ops("bogus", BEAM_OPS_VERSION));
        CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "must be"));
        CU_ASSERT_PTR_NULL(beam_backend_ops(NULL, BEAM_OPS_VERSION + 1));
        CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "table version"));
    }
}

int main(void)
{
    static const suite_test tests[] = {
        {"bf16 rounding rule (reference)", test_bf16_rule},
        {"finalize: ties to even", test_finalize_ties},
        {"finalize: k order, no FMA", test_finalize_order_and_fma},
        {"finalize: overflow, inf, NaN", test_finalize_overflow_nan},
        {"finalize: signed zeros, subnormals", test_finalize_zeros_subnormals},
        {"residual add and scales", test_add_edges},
        {"RMSNorm edges", test_norm_edges},
        {"RMSNorm summation tree", test_norm_tree_order},
        {"fused chain", test_fused_chain},
        {"libbeammoe_cpu linked directly", test_direct_backend},
        {NULL, NULL}};
    return suite_run("edges", tests);
}
