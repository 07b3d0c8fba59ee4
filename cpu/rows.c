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

/* x86-64 with GCC and glibc: the row kernels are compiled for AVX-512, AVX2
 * and the baseline, picked at load time (ifunc). Every variant performs the
 * same IEEE operations in the same order (no FMA: -ffp-contract=off), so the
 * bits do not depend on the machine. The clones are static (a hidden
 * non-static clone set does not link) behind plain exported-to-cpu/ wrappers. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(BEAM_NO_CLONES)
#define BM_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define BM_CPU_CLONES
#endif

/* Columns per block of the finalize sum: divides every valid hidden (a
 * multiple of 256). */
#define BM_FIN_BLOCK 64

/* RMSNorm N(v, w, eps) of one row of widened values, to BF16.
 * The reduction is SPEC's tree: sequential sums of chunks of 8, zero padding
 * to a power of two, then strided halving. */
static inline __attribute__((always_inline)) void bm_rmsnorm_row(const float *v, int32_t hidden, const bm_norm *n, uint16_t *out)
{
    float part[BM_MAX_HIDDEN / 8];
    int32_t chunks = hidden / 8, n2 = 1, c, j, s, h;
    float ms, inv;

    while (n2 < chunks) n2 *= 2;
    /* part[c] = ((q[8c] + q[8c+1]) + ...) + q[8c+7], built column by column:
     * the same additions in the same order per chunk, but independent across
     * chunks, so the loops over c vectorize instead of one serial chain. */
    for (c = 0; c < chunks; c++) part[c] = v[8 * c] * v[8 * c];
    for (j = 1; j < 8; j++)
        for (c = 0; c < chunks; c++) part[c] = part[c] + v[8 * c + j] * v[8 * c + j];
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

static inline __attribute__((always_inline)) void bm_widen_row(const uint16_t *b, int32_t hidden, float *v)
{
    int32_t h;
    for (h = 0; h < hidden; h++) v[h] = bm_f(b[h]);
}

static BM_CPU_CLONES void bm_finalize_row(const bm_args *a, int64_t row, uint16_t *out)
{
    float acc[BM_MAX_HIDDEN];
    const int32_t hidden = a->hidden, top_k = a->top_k;
    const uint16_t *x = a->experts + (size_t)row * (size_t)top_k * (size_t)hidden;
    const float *w = a->weights + (size_t)row * (size_t)top_k;
    const float rs = a->routed_scale;
    int32_t k, h, h0;

    /* a = +0.0, then a = a + w[k] * f(x[k][h]) for k in order; then
     * s = bf16(f(bf16(a)) * routed_scale), always (exact when it is 1).
     * Blocks of BM_FIN_BLOCK columns keep the sums in registers while the
     * top_k expert rows stream in side by side. */
    for (h0 = 0; h0 < hidden; h0 += BM_FIN_BLOCK) {
        float sum[BM_FIN_BLOCK];
        for (h = 0; h < BM_FIN_BLOCK; h++) sum[h] = 0.0f;
        for (k = 0; k < top_k; k++) {
            const uint16_t *xk = x + (size_t)k * (size_t)hidden + h0;
            const float wk = w[k];
            for (h = 0; h < BM_FIN_BLOCK; h++) sum[h] = sum[h] + wk * bm_f(xk[h]);
        }
        for (h = 0; h < BM_FIN_BLOCK; h++) acc[h0 + h] = bm_f(bm_bf16(bm_f(bm_bf16(sum[h])) * rs));
    }
    if (a->post.on) {
        bm_rmsnorm_row(acc, hidden, &a->post, out);
    } else {
        for (h = 0; h < hidden; h++) out[h] = bm_bf16(acc[h]); /* exact: acc holds BF16 values */
    }
}

static BM_CPU_CLONES void bm_residual_row(const bm_args *a, const uint16_t *x, const uint16_t *residual,
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

void bm_cpu_finalize_row(const bm_args *a, int64_t row, uint16_t *out)
{
    bm_finalize_row(a, row, out);
}

void bm_cpu_residual_row(const bm_args *a, const uint16_t *x, const uint16_t *residual, uint16_t *hidden,
                         uint16_t *normalized)
{
    bm_residual_row(a, x, residual, hidden, normalized);
}
