/*
 * reference.c - scalar model of SPEC.md section 2 (see reference.h).
 *
 * Each line below is one FP32 operation of the specification, in its order.
 * The build uses -ffp-contract=off (no FMA contraction) and x86-64/AArch64
 * evaluate float in float (FLT_EVAL_METHOD 0), so C float arithmetic here is
 * exactly the IEEE binary32 rounding the specification asks for.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "reference.h"

int64_t ref_ties_seen = 0;

/* SPEC: bf16(v) = (u + 0x7FFF + ((u >> 16) & 1)) >> 16, every NaN -> 0x7FFF. */
static uint16_t rbf16(float v)
{
    uint32_t u;
    if (isnan(v)) return 0x7FFF;
    memcpy(&u, &v, sizeof u);
    if ((u & 0xFFFFu) == 0x8000u) ref_ties_seen++;
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* SPEC: f(b) widens exactly. */
static float rf(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* SPEC: N(v, w, eps) on one row of FP32 values; y gets BF16 bits. */
static void rnorm(const float *v, int32_t H, const beam_norm *n, uint16_t *y)
{
    int32_t C = H / 8, N2 = 1, c, s, h;
    float P[1024]; /* C <= 8192 / 8 */
    float ms, inv;

    for (c = 0; c < C; c++) {
        float acc = v[8 * c] * v[8 * c];
        int j;
        for (j = 1; j < 8; j++) {
            float q = v[8 * c + j] * v[8 * c + j];
            acc = acc + q;
        }
        P[c] = acc;
    }
    while (N2 < C) N2 *= 2;
    for (c = C; c < N2; c++) P[c] = +0.0f;
    for (s = N2 / 2; s >= 1; s /= 2)
        for (c = 0; c < s; c++) P[c] = P[c] + P[c + s];

    ms = P[0] / (float)H;
    inv = 1.0f / sqrtf(ms + n->eps);
    for (h = 0; h < H; h++) {
        uint16_t u = rbf16(v[h] * inv);
        y[h] = n->weight ? rbf16(rf(u) * rf(n->weight[h])) : u;
    }
}

/* One finalized row (before the optional post-norm is applied by caller). */
static void rfinalize_row(const uint16_t *x, const float *w, int32_t K, int32_t H,
                          float routed_scale, const beam_norm *post, float *tmp,
                          uint16_t *out)
{
    int32_t h, k;
    for (h = 0; h < H; h++) {
        float a = +0.0f;
        uint16_t r;
        for (k = 0; k < K; k++) {
            float p = w[k] * rf(x[(size_t)k * H + h]);
            a = a + p;
        }
        r = rbf16(a);
        out[h] = rbf16(rf(r) * routed_scale);
    }
    if (post) {
        for (h = 0; h < H; h++) tmp[h] = rf(out[h]);
        rnorm(tmp, H, post, out);
    }
}

static void rnrn_row(const uint16_t *x, const uint16_t *res, int32_t H, const beam_norm *pre,
                     const float *scales, const beam_norm *next, float *tmp, uint16_t *xn,
                     uint16_t *hid, uint16_t *nor)
{
    int32_t h;
    const uint16_t *xp = x;
    if (pre) {
        for (h = 0; h < H; h++) tmp[h] = rf(x[h]);
        rnorm(tmp, H, pre, xn);
        xp = xn;
    }
    for (h = 0; h < H; h++) {
        uint16_t bx = scales ? rbf16(rf(xp[h]) * scales[0]) : xp[h];
        uint16_t br = scales ? rbf16(rf(res[h]) * scales[1]) : res[h];
        hid[h] = rbf16(rf(bx) + rf(br)); /* may overwrite res[h]: read above */
    }
    if (next) {
        for (h = 0; h < H; h++) tmp[h] = rf(hid[h]);
        rnorm(tmp, H, next, nor);
    }
}

void ref_finalize(const uint16_t *x, const float *w, int64_t tokens, int32_t top_k,
                  int32_t hidden, float routed_scale, const beam_norm *post, uint16_t *out)
{
    float *tmp = malloc(sizeof(float) * (size_t)hidden);
    int64_t t;
    for (t = 0; t < tokens; t++)
        rfinalize_row(x + (size_t)t * top_k * hidden, w + (size_t)t * top_k, top_k, hidden,
                      routed_scale, post, tmp, out + (size_t)t * hidden);
    free(tmp);
}

void ref_norm_residual_norm(const uint16_t *x, const uint16_t *residual, int64_t tokens,
                            int32_t hidden, const beam_norm *pre, const float *scales,
                            const beam_norm *next, uint16_t *hidden_out, uint16_t *normalized)
{
    float *tmp = malloc(sizeof(float) * (size_t)hidden);
    uint16_t *xn = malloc(sizeof(uint16_t) * (size_t)hidden);
    int64_t t;
    for (t = 0; t < tokens; t++) {
        size_t o = (size_t)t * hidden;
        rnrn_row(x + o, residual + o, hidden, pre, scales, next, tmp, xn, hidden_out + o,
                 next ? normalized + o : NULL);
    }
    free(xn);
    free(tmp);
}

void ref_finalize_norm_residual_norm(const uint16_t *x, const float *w, int64_t tokens,
                                     int32_t top_k, int32_t hidden, float routed_scale,
                                     const beam_norm *post, const uint16_t *residual,
                                     const float *scales, const beam_norm *next,
                                     uint16_t *hidden_out, uint16_t *normalized)
{
    float *tmp = malloc(sizeof(float) * (size_t)hidden);
    uint16_t *row = malloc(sizeof(uint16_t) * (size_t)hidden);
    int64_t t;
    for (t = 0; t < tokens; t++) {
        size_t o = (size_t)t * hidden;
        rfinalize_row(x + (size_t)t * top_k * hidden, w + (size_t)t * top_k, top_k, hidden,
                      routed_scale, post, tmp, row);
        rnrn_row(row, residual + o, hidden, NULL, scales, next, tmp, NULL, hidden_out + o,
                 next ? normalized + o : NULL);
    }
    free(row);
    free(tmp);
}
