/*
 * rows.c - the exact per-row arithmetic of SPEC.md section 2 on the CPU.
 *
 * Every float operation is a separate IEEE binary32 operation (the build
 * passes -ffp-contract=off and never fast-math). Rows travel between the
 * stages as FP32 arrays that hold exact BF16 values ("widened rows"), so a
 * BF16 result is rounded once and its bits are then a plain shift. All inner
 * loops run over h (or over chunks), so the compiler vectorizes them without
 * changing any element's order of operations. On x86-64 GCC the finalize and
 * fused rows without post-norm run hand-vectorized kernels instead
 * (cpu/rows_simd.h, about 2x faster), with the same operations per element;
 * the code here stays the portable path and the reference they are tested
 * against (build with -DBEAM_SCALAR_ROWS to run the suite on it alone).
 */
#include <math.h>

#include "bf16.h"
#include "check.h"
#include "rows.h"

/* x86-64 with GCC and glibc: the row kernels are compiled for AVX-512, AVX2
 * and the baseline, picked at load time (ifunc). Every variant performs the
 * same IEEE operations in the same order (no FMA: -ffp-contract=off), so the
 * bits do not depend on the machine. The clones are static (a hidden
 * non-static clone set does not link) behind plain wrappers. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(BEAM_NO_CLONES)
#define BM_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#define BM_INLINE static inline __attribute__((always_inline))
#else
#define BM_CPU_CLONES
#define BM_INLINE static inline
#endif

/* Columns per block of the finalize sum: divides every valid hidden (a
 * multiple of 256), and the block's sums stay in registers. */
#define BM_FIN_BLOCK 64

/* bf16 bits of a widened row element (exact: it already holds a BF16 value;
 * a NaN there is 0x7FFF0000, whose top half is 0x7FFF). */
BM_INLINE uint16_t bm_top(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return (uint16_t)(u >> 16);
}

/* f(bf16(v)) in one step. */
BM_INLINE float bm_round(float v)
{
    return bm_f(bm_bf16(v));
}

/* RMSNorm N(v, w, eps) of a widened row; writes the widened result to outf
 * and/or its bits to outb (either may be NULL). The reduction is SPEC's tree:
 * sequential sums of chunks of 8, zero padding to a power of two, strided
 * halving. */
BM_INLINE void bm_rmsnorm(const float *v, int32_t hidden, const bm_norm *n, float *outf, uint16_t *outb)
{
    float part[BM_MAX_HIDDEN / 8];
    const int32_t chunks = hidden / 8;
    int32_t n2 = 1, c, j, s, h;
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
        if (outf)
            for (h = 0; h < hidden; h++) outf[h] = bm_round(bm_round(v[h] * inv) * bm_f(w[h]));
        if (outb)
            for (h = 0; h < hidden; h++) outb[h] = bm_bf16(bm_round(v[h] * inv) * bm_f(w[h]));
    } else {
        if (outf)
            for (h = 0; h < hidden; h++) outf[h] = bm_round(v[h] * inv);
        if (outb)
            for (h = 0; h < hidden; h++) outb[h] = bm_bf16(v[h] * inv);
    }
}

/* The finalize stage of token `row` into a widened row s (post-norm done). */
BM_INLINE void bm_finalize(const bm_args *a, int64_t row, float *s)
{
    float tmp[BM_MAX_HIDDEN];
    const int32_t hidden = a->hidden, top_k = a->top_k;
    const uint16_t *x = a->experts + (size_t)row * (size_t)top_k * (size_t)hidden;
    const float *w = a->weights + (size_t)row * (size_t)top_k;
    const float rs = a->routed_scale;
    float *dst = a->post.on ? tmp : s;
    int32_t k, h, h0;

    /* a = +0.0, then a = a + w[k] * f(x[k][h]) for k in order; then
     * s = bf16(f(bf16(a)) * routed_scale), always (exact when it is 1, so
     * that multiply is skipped: x * 1 == x for every BF16 value, and the
     * only NaN a rounded sum holds is already 0x7FFF). Blocks of columns keep
     * the sums in registers while the top_k expert rows stream in. */
    for (h0 = 0; h0 < hidden; h0 += BM_FIN_BLOCK) {
        float sum[BM_FIN_BLOCK];
        for (h = 0; h < BM_FIN_BLOCK; h++) sum[h] = 0.0f;
        for (k = 0; k < top_k; k++) {
            const uint16_t *xk = x + (size_t)k * (size_t)hidden + h0;
            const float wk = w[k];
            for (h = 0; h < BM_FIN_BLOCK; h++) sum[h] = sum[h] + wk * bm_f(xk[h]);
        }
        if (rs == 1.0f)
            for (h = 0; h < BM_FIN_BLOCK; h++) dst[h0 + h] = bm_round(sum[h]);
        else
            for (h = 0; h < BM_FIN_BLOCK; h++) dst[h0 + h] = bm_round(bm_round(sum[h]) * rs);
    }
    if (a->post.on) bm_rmsnorm(tmp, hidden, &a->post, s, NULL);
}

/* The residual stage from a widened branch row xf: hidden and normalized.
 * residual is read before hidden is written element by element, so hidden
 * may be the residual buffer. */
BM_INLINE void bm_residual(const bm_args *a, const float *xf, const uint16_t *residual, uint16_t *hidden,
                           uint16_t *normalized)
{
    float v[BM_MAX_HIDDEN];
    const int32_t hs = a->hidden;
    int32_t h;

    if (a->has_scales) {
        const float sx = a->scale_x, sr = a->scale_r;
        for (h = 0; h < hs; h++) v[h] = bm_round(bm_round(xf[h] * sx) + bm_round(bm_f(residual[h]) * sr));
    } else {
        for (h = 0; h < hs; h++) v[h] = bm_round(xf[h] + bm_f(residual[h]));
    }
    for (h = 0; h < hs; h++) hidden[h] = bm_top(v[h]);
    if (a->next.on) bm_rmsnorm(v, hs, &a->next, NULL, normalized);
}

static BM_CPU_CLONES void bm_finalize_row(const bm_args *a, int64_t row, uint16_t *out)
{
    float s[BM_MAX_HIDDEN];
    int32_t h;
    bm_finalize(a, row, s);
    for (h = 0; h < a->hidden; h++) out[h] = bm_top(s[h]);
}

static BM_CPU_CLONES void bm_residual_row(const bm_args *a, const uint16_t *x, const uint16_t *residual,
                                          uint16_t *hidden, uint16_t *normalized)
{
    float xf[BM_MAX_HIDDEN];
    int32_t h;
    for (h = 0; h < a->hidden; h++) xf[h] = bm_f(x[h]);
    if (a->pre.on) bm_rmsnorm(xf, a->hidden, &a->pre, xf, NULL); /* in place: read fully first */
    bm_residual(a, xf, residual, hidden, normalized);
}

static BM_CPU_CLONES void bm_fused_row(const bm_args *a, int64_t row, const uint16_t *residual,
                                       uint16_t *hidden, uint16_t *normalized)
{
    float s[BM_MAX_HIDDEN];
    bm_finalize(a, row, s);
    bm_residual(a, s, residual, hidden, normalized);
}


void bm_cpu_residual_row(const bm_args *a, const uint16_t *x, const uint16_t *residual, uint16_t *hidden,
                         uint16_t *normalized)
{
    bm_residual_row(a, x, residual, hidden, normalized);
}

/* The vector kernels of the fused row (cpu/rows_simd.h), x86-64 GCC only;
 * -DBEAM_NO_CLONES or -DBEAM_SCALAR_ROWS builds the portable code alone
 * (how the fallback is tested). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(BEAM_NO_CLONES) && \
    !defined(BEAM_SCALAR_ROWS)
#define BM_SIMD 1
#include <immintrin.h>
/* Outputs of at least this many elements per array are stored with
 * streaming stores (4M BF16 = 8 MiB, past any per-core cache). */
#ifndef BM_NT_MIN_ELEMS
#define BM_NT_MIN_ELEMS ((uint64_t)1 << 22)
#endif
/* Software prefetch distance of the expert rows, in elements (512 bytes):
 * 128..512 measured alike, 0 and >= 768 slower. */
#define BM_PF 256
#pragma GCC push_options
#pragma GCC target("avx2")
#define BM_W 8
#include "rows_simd.h"
#undef BM_W
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f")
#define BM_W 16
#include "rows_simd.h"
#undef BM_W
#pragma GCC pop_options
#endif

void bm_cpu_finalize_row(const bm_args *a, int64_t row, uint16_t *out)
{
#ifdef BM_SIMD
    if (!a->post.on) {
        if (__builtin_cpu_supports("avx512f")) {
            bm_simd_finalize_16(a, row, out);
            return;
        }
        if (__builtin_cpu_supports("avx2")) {
            bm_simd_finalize_8(a, row, out);
            return;
        }
    }
#endif
    bm_finalize_row(a, row, out);
}

void bm_cpu_fused_row(const bm_args *a, int64_t row, const uint16_t *residual, uint16_t *hidden,
                      uint16_t *normalized)
{
#ifdef BM_SIMD
    if (!a->post.on) {
        if (__builtin_cpu_supports("avx512f")) {
            bm_simd_fused_16(a, row, residual, hidden, normalized);
            return;
        }
        if (__builtin_cpu_supports("avx2")) {
            bm_simd_fused_8(a, row, residual, hidden, normalized);
            return;
        }
    }
#endif
    bm_fused_row(a, row, residual, hidden, normalized);
}
