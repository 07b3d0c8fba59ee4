/*
 * rows.c - the exact per-row arithmetic of SPEC.md section 2 on the CPU.
 *
 * Every float operation is a separate IEEE binary32 operation (the build
 * passes -ffp-contract=off and never fast-math); the inner loops run over h,
 * so the compiler vectorizes them without changing any element's order.
 */
#include <math.h>

#include "bf16.h"
#include "check.h"
#include "rows.h"

/* RMSNorm N(v, w, eps) of one row of widened values, to BF16.
 * The reduction is SPEC's tree: sequential sums of chunks of 8, zero padding
 * to a power of two, then strided halving. */
static void bm_rmsnorm_row(const float *v, int32_t hidden, const bm_norm *n, uint16_t *out)
{
    float part[BM_MAX_HIDDEN / 8];
    int32_t chunks = hidden / 8, n2 = 1, c, s, h;
    float ms, inv;

    while (n2 < chunks) n2 *= 2;
    for (c = 0; c < chunks; c++) {
        const float *q = v + 8 * c;
        float p = q[0] * q[0];
        p = p + q[1] * q[1];
        p = p + q[2] * q[2];
        p = p + q[3] * q[3];
        p = p + q[4] * q[4];
        p = p + q[5] * q[5];
        p = p + q[6] * q[6];
        p = p + q[7] * q[7];
        part[c] = p;
    }
    for (c = chunks; c < n2; c++) part[c] = 0.0f;
    for (s = n2 / 2; s >= 1; s /= 2)
        for (c = 0; c < s; c++) part[c] = part[c] + part[c + s];
    ms = part[0] / (float)hidden;
    inv = 1.0f / sqrtf(ms + n->eps);
    if (n->weight) {
        const uint16_t *w = n->weight;
        for (h = 0; h < hidden; h++) out[h] = bm_bf16(bm_f(bm_bf16(v[h] * inv)) * bm_f(w[h]));
    } else {
        for (h = 0; h < hidden; h++) out[h] = bm_bf16(v[h] * inv);
    }
}

static void bm_widen_row(const uint16_t *b, int32_t hidden, float *v)
{
    int32_t h;
    for (h = 0; h < hidden; h++) v[h] = bm_f(b[h]);
}

void bm_cpu_finalize_row(const bm_args *a, int64_t row, uint16_t *out)
{
    float acc[BM_MAX_HIDDEN];
    const int32_t hidden = a->hidden, top_k = a->top_k;
    const uint16_t *x = a->experts + (size_t)row * (size_t)top_k * (size_t)hidden;
    const float *w = a->weights + (size_t)row * (size_t)top_k;
    const float rs = a->routed_scale;
    int32_t k, h;

    /* a = +0.0, then a = a + w[k] * f(x[k][h]) for k in order. */
    for (h = 0; h < hidden; h++) acc[h] = 0.0f;
    for (k = 0; k < top_k; k++) {
        const uint16_t *xk = x + (size_t)k * (size_t)hidden;
        const float wk = w[k];
        for (h = 0; h < hidden; h++) acc[h] = acc[h] + wk * bm_f(xk[h]);
    }
    /* s = bf16(f(bf16(a)) * routed_scale), always (exact when it is 1). */
    for (h = 0; h < hidden; h++) acc[h] = bm_f(bm_bf16(bm_f(bm_bf16(acc[h])) * rs));
    if (a->post.on) {
        bm_rmsnorm_row(acc, hidden, &a->post, out);
    } else {
        for (h = 0; h < hidden; h++) out[h] = bm_bf16(acc[h]); /* exact: acc holds BF16 values */
    }
}

void bm_cpu_residual_row(const bm_args *a, const uint16_t *x, const uint16_t *residual,
                         uint16_t *hidden, uint16_t *normalized)
{
    float v[BM_MAX_HIDDEN];
    uint16_t xn[BM_MAX_HIDDEN];
    const int32_t hs = a->hidden;
    int32_t h;

    if (a->pre.on) {
        bm_widen_row(x, hs, v);
        bm_rmsnorm_row(v, hs, &a->pre, xn);
        x = xn;
    }
    /* v holds f(hidden[h]); hidden is written element by element after its
     * residual element is read, so hidden == residual is safe. */
    if (a->has_scales) {
        const float sx = a->scale_x, sr = a->scale_r;
        for (h = 0; h < hs; h++) {
            float bx = bm_f(bm_bf16(bm_f(x[h]) * sx));
            float br = bm_f(bm_bf16(bm_f(residual[h]) * sr));
            v[h] = bm_f(bm_bf16(bx + br));
        }
    } else {
        for (h = 0; h < hs; h++) v[h] = bm_f(bm_bf16(bm_f(x[h]) + bm_f(residual[h])));
    }
    for (h = 0; h < hs; h++) hidden[h] = bm_bf16(v[h]);
    if (a->next.on) bm_rmsnorm_row(v, hs, &a->next, normalized);
}
