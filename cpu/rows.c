/*
 * rows.c - the exact per-row arithmetic of docs/numerics.md on the CPU.
 *
 * Every float operation is a separate IEEE binary32 operation (the build
 * passes -ffp-contract=off and never fast-math). Rows travel between the
 * stages as FP32 arrays that hold exact BF16 values ("widened rows"), so a
 * BF16 result is rounded once and its bits are then a plain shift. All inner
 * loops run over h (or over chunks), so the compiler vectorizes them without
 * changing any element's order of operations. On x86-64 GCC every row runs
 * hand-vectorized kernels instead (cpu/rows_simd.h, 2-4x faster), with the
 * same operations per element; the code here stays the portable path and the
 * reference they are tested against (build with -DBEAM_SCALAR_ROWS to run
 * the suite on it alone, or set BEAM_CPU_ISA=portable, lib/cpu_isa.h).
 *
 * Intermediate rows live in the caller's per-thread scratch (rows.h), never
 * on the stack.
 */
#include <math.h>

#include "bf16.h"
#include "check.h"
#include "rows.h"

/* x86-64 with GCC and glibc: the portable kernels are compiled for AVX-512,
 * AVX2 and the baseline, picked at load time (ifunc). Every variant performs
 * the same IEEE operations in the same order (no FMA: -ffp-contract=off), so
 * the bits do not depend on the machine. The clones are static (a hidden
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

/* The chunk sums of the widest row: BM_MAX_HIDDEN / 8 floats. */
#define BM_PART_BYTES ((size_t)BM_MAX_HIDDEN / 8 * sizeof(float))

static size_t bm_round64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* Scratch of one thread: two widened rows (portable kernels; the vector
 * kernels use the first hidden * 2 bytes for the row's bits), the chunk
 * sums, and one BF16 row for normalized when only its quantized form is
 * asked for, each part 64-byte aligned. */
size_t bm_cpu_row_scratch(int32_t hidden)
{
    return 2 * bm_round64((size_t)hidden * sizeof(float)) + BM_PART_BYTES +
           bm_round64((size_t)hidden * sizeof(uint16_t));
}

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
 * and/or its bits to outb (either may be NULL; outf may be v). The reduction
 * is the tree of docs/numerics.md#halving-tree: sequential sums of chunks of 8, zero padding to a power of
 * two, strided halving; part holds BM_MAX_HIDDEN / 8 floats. */
BM_INLINE void bm_rmsnorm(const float *v, int32_t hidden, const bm_norm *n, float *outf, uint16_t *outb,
                          float *part)
{
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
        if (outb)
            for (h = 0; h < hidden; h++) outb[h] = bm_bf16(bm_round(v[h] * inv) * bm_f(w[h]));
        if (outf)
            for (h = 0; h < hidden; h++) outf[h] = bm_round(bm_round(v[h] * inv) * bm_f(w[h]));
    } else {
        if (outb)
            for (h = 0; h < hidden; h++) outb[h] = bm_bf16(v[h] * inv);
        if (outf)
            for (h = 0; h < hidden; h++) outf[h] = bm_round(v[h] * inv);
    }
}

/* The finalize stage of token `row` into a widened row s (post-norm done);
 * tmp: a second row of scratch, used when there is a post-norm. */
BM_INLINE void bm_finalize_stage(const bm_args *a, int64_t row, float *s, float *tmp, float *part)
{
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
    if (a->post.on) bm_rmsnorm(tmp, hidden, &a->post, s, NULL, part);
}

/* The residual stage from a widened branch row xf: hidden and normalized,
 * with v a row of scratch (not xf). residual is read before hidden is
 * written element by element, so hidden may be the residual buffer. */
BM_INLINE void bm_residual(const bm_args *a, const float *xf, const uint16_t *residual, uint16_t *hidden,
                           uint16_t *normalized, float *v, float *part)
{
    const int32_t hs = a->hidden;
    int32_t h;

    if (a->has_scales) {
        const float sx = a->scale_x, sr = a->scale_r;
        for (h = 0; h < hs; h++) v[h] = bm_round(bm_round(xf[h] * sx) + bm_round(bm_f(residual[h]) * sr));
    } else {
        for (h = 0; h < hs; h++) v[h] = bm_round(xf[h] + bm_f(residual[h]));
    }
    for (h = 0; h < hs; h++) hidden[h] = bm_top(v[h]);
    if (a->next.on) bm_rmsnorm(v, hs, &a->next, NULL, normalized, part);
}

/* The scratch of one thread as two widened rows, the chunk sums and the
 * normalized row of a quantized-only call. */
typedef struct bm_rowbuf {
    float *r0, *r1, *part;
    uint16_t *nrm;
} bm_rowbuf;

static bm_rowbuf bm_rowbuf_of(void *scratch, int32_t hidden)
{
    bm_rowbuf b;
    size_t row = bm_round64((size_t)hidden * sizeof(float));
    b.r0 = (float *)scratch;
    b.r1 = (float *)(void *)((unsigned char *)scratch + row);
    b.part = (float *)(void *)((unsigned char *)scratch + 2 * row);
    b.nrm = (uint16_t *)(void *)((unsigned char *)scratch + 2 * row + BM_PART_BYTES);
    return b;
}

/* Where row o's normalized goes: the caller's array, or the scratch row
 * when only the quantized form is asked for. */
static uint16_t *bm_nrm_row(const bm_args *a, size_t o, uint16_t *scratch_row)
{
    return a->normalized ? a->normalized + o : a->q.kind ? scratch_row : NULL;
}

static BM_CPU_CLONES void bm_finalize_rows(const bm_args *a, int64_t t0, int64_t t1, void *scratch)
{
    const bm_rowbuf b = bm_rowbuf_of(scratch, a->hidden);
    const size_t hs = (size_t)a->hidden;
    int64_t t;
    size_t h;
    for (t = t0; t < t1; t++) {
        uint16_t *out = a->output + (size_t)t * hs;
        bm_finalize_stage(a, t, b.r0, b.r1, b.part);
        for (h = 0; h < hs; h++) out[h] = bm_top(b.r0[h]);
    }
}

static BM_CPU_CLONES void bm_nrn_rows(const bm_args *a, int64_t t0, int64_t t1, void *scratch)
{
    const bm_rowbuf b = bm_rowbuf_of(scratch, a->hidden);
    const size_t hs = (size_t)a->hidden;
    int64_t t;
    size_t h;
    for (t = t0; t < t1; t++) {
        const size_t o = (size_t)t * hs;
        const uint16_t *x = a->x + o;
        uint16_t *nrm = bm_nrm_row(a, o, b.nrm);
        for (h = 0; h < hs; h++) b.r0[h] = bm_f(x[h]);
        if (a->pre.on) bm_rmsnorm(b.r0, a->hidden, &a->pre, b.r0, NULL, b.part); /* in place */
        bm_residual(a, b.r0, a->residual + o, a->hidden_out + o, nrm, b.r1, b.part);
        if (a->q.kind) bm_cpu_quant_row(&a->q, nrm, t, a->hidden);
    }
}

static BM_CPU_CLONES void bm_fused_rows(const bm_args *a, int64_t t0, int64_t t1, void *scratch)
{
    const bm_rowbuf b = bm_rowbuf_of(scratch, a->hidden);
    const size_t hs = (size_t)a->hidden;
    int64_t t;
    for (t = t0; t < t1; t++) {
        const size_t o = (size_t)t * hs;
        uint16_t *nrm = bm_nrm_row(a, o, b.nrm);
        bm_finalize_stage(a, t, b.r0, b.r1, b.part);
        bm_residual(a, b.r0, a->residual + o, a->hidden_out + o, nrm, b.r1, b.part);
        if (a->q.kind) bm_cpu_quant_row(&a->q, nrm, t, a->hidden);
    }
}

/* The vector kernels (cpu/rows_simd.h), x86-64 GCC only; -DBEAM_NO_CLONES
 * or -DBEAM_SCALAR_ROWS builds the portable code alone (how the fallback is
 * tested). */
#ifdef BM_HAVE_SIMD
#include <immintrin.h>
/* Outputs of at least this many elements per array are stored with
 * streaming stores (4M BF16 = 8 MiB, past any per-core cache). */
#ifndef BM_NT_MIN_ELEMS
#define BM_NT_MIN_ELEMS ((uint64_t)1 << 22)
#endif
/* Software prefetch distance of the expert rows, in elements (512 bytes):
 * 128..512 measured alike, 0 and >= 768 slower. */
#define BM_PF 256
#ifndef BM_PF_HINT
#define BM_PF_HINT 2
#endif
#ifndef BM_SUMS_PF_ALWAYS
#define BM_SUMS_PF_ALWAYS 0
#endif
#pragma GCC push_options
#pragma GCC target("avx2")
#define BM_W 8
#define BM_TAG 8
#include "rows_simd.h"
#undef BM_TAG
#undef BM_W
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f")
#define BM_W 16
#define BM_TAG 16
#include "rows_simd.h"
#undef BM_TAG
#undef BM_W
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512bf16")
#define BM_W 16
#define BM_TAG 16b
#define BM_AVX512BF16 1
#include "rows_simd.h"
#undef BM_AVX512BF16
#undef BM_TAG
#undef BM_W
#pragma GCC pop_options
#endif

/* Picked once: the CPU does not change, and BEAM_CPU_ISA is read once. A
 * race between two first calls stores the same value twice. */
int bm_cpu_rows_isa(void)
{
#ifdef BM_HAVE_SIMD
    static int isa = -1;
    int v = __atomic_load_n(&isa, __ATOMIC_RELAXED);
    if (v < 0) {
        v = bm_cpu_pick_isa();
        __atomic_store_n(&isa, v, __ATOMIC_RELAXED);
    }
    return v;
#else
    return BM_ISA_PORTABLE;
#endif
}

void bm_cpu_rows(const bm_args *a, int op, int64_t t0, int64_t t1, void *scratch)
{
#ifdef BM_HAVE_SIMD
    const int isa = bm_cpu_rows_isa();
    if (isa != BM_ISA_PORTABLE) {
        /* the row's bits where the first widened row would be */
        const bm_rowbuf b = bm_rowbuf_of(scratch, a->hidden);
        if (isa == BM_ISA_AVX512BF16)
            bm_simd_rows_16b(a, op, t0, t1, b.r0, b.part, b.nrm);
        else if (isa == BM_ISA_AVX512)
            bm_simd_rows_16(a, op, t0, t1, b.r0, b.part, b.nrm);
        else
            bm_simd_rows_8(a, op, t0, t1, b.r0, b.part, b.nrm);
        return;
    }
#endif
    if (op == BM_OP_FINALIZE)
        bm_finalize_rows(a, t0, t1, scratch);
    else if (op == BM_OP_NRN)
        bm_nrn_rows(a, t0, t1, scratch);
    else
        bm_fused_rows(a, t0, t1, scratch);
}
