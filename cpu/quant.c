/*
 * quant.c - the quantized output of normalized on the CPU: the ground truth
 * of docs/numerics.md#fp8, one row at a time from the row's BF16
 * normalized values (so it equals quantizing the BF16 output afterwards).
 * The local operations call it per row from cpu/rows.c, right after the
 * row's normalized is written (bm_cpu_quant_row); the group gather, whose
 * ranks compute windows of rows into shared stages, quantizes all its
 * normalized rows after the call's last barrier (bm_cpu_quant_rows).
 *
 * Both loops of a group are branch-free so that the compiler vectorizes
 * them (plain C, every architecture): the group's largest magnitude as an
 * integer maximum of BF16 bits, then e4m3(clamp(x / s)) per value with
 * cpu/fp8.h's select forms, which equal the definitions bit for bit (a true
 * FP32 division per value, never a reciprocal), several times faster than
 * the scalar conversion, whose branches mispredict on real data
 * [2026-12-04-constants: cpu-quant]. On x86-64 GCC the row loop is compiled for AVX-512, AVX2
 * and the baseline as in cpu/rows.c; each performs the same operations per
 * value, so the bits do not depend on the machine.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "bf16.h"
#include "error.h"
#include "fp4.h"
#include "fp8.h"
#include "ops.h"

/* The row loop's clones, x86-64 GCC (as cpu/rows.c): AVX-512 as x86-64-v4,
 * whose byte and word operations give the loops 512-bit vectors over their
 * 16-bit inputs and 8-bit codes (with avx512f alone GCC picks 256-bit
 * ones); GCC before 11 has no x86-64-v4. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(BEAM_NO_CLONES)
#if __GNUC__ >= 11
#define BM_QUANT_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define BM_QUANT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#define BM_QUANT_INLINE static inline __attribute__((always_inline))
#else
#define BM_QUANT_CLONES
#define BM_QUANT_INLINE static inline
#endif

/* Threads as cpu/run.c picks them for the row operations (bm_cpu_team_of,
 * bm_cpu_chunk): each thread of a team must have BM_QUANT_BYTES_PER_THREAD
 * bytes to read and write, else fewer threads, down to the calling thread
 * alone (no team); rows handed out dynamically. Half run.c's bytes:
 * quantizing moves a byte about half as fast as norm_residual_norm does,
 * so a thread gets about the same time of work
 * [2026-12-04-constants: cpu-quant].
 */
#ifndef BM_QUANT_BYTES_PER_THREAD
#define BM_QUANT_BYTES_PER_THREAD ((int64_t)64 * 1024)
#endif

/* The scale of one group (GROUP, TOKEN) from its values y[0..n). */
BM_QUANT_INLINE float bm_quant_scale(const bm_quant *q, const uint16_t *y, int n)
{
    const float absmax = bm_fp8_absmax_bf16(y, n);
    if (q->kind == BEAM_QUANT_FP8_GROUP) return bm_fp8_group_scale(absmax, BM_FP8_GROUP_EPS, q->ue8m0);
    return bm_fp8_token_scale(absmax, q->ue8m0);
}

/* out[i] = e4m3(clamp(y[i] / s)) for i in [0, n). */
BM_QUANT_INLINE void bm_quant_values(const uint16_t *restrict y, float s, uint8_t *restrict out, int n)
{
    int i;
    for (i = 0; i < n; i++) out[i] = (uint8_t)bm_fp8_quant_sel(bm_f(y[i]), s);
}

/* Values of an NVFP4 row handled per piece: the piece's arrays (a few
 * hundred bytes) stay on the caller's stack whatever the hidden size, since
 * a library runs on its callers' threads and their stacks may be 16 KiB
 * (tests/test_stack.c). A multiple of 64 (four blocks' scales are one
 * 4-byte word of the tiled layout) that divides every hidden size (a
 * multiple of 256). */
#define BM_NVFP4_PIECE 256

/* NVFP4 rows t0..t1: two values a byte, an E4M3 scale a block of 16 at its
 * tiled place. Three passes over each piece of a row: the blocks' scales
 * and factors, every value's code, then the pairs: branch-free loops the
 * compiler vectorizes whole (one loop doing a block's codes and scale
 * together does not vectorize). */
BM_QUANT_INLINE void bm_nvfp4_rows(const bm_quant *q, const uint16_t *y0, int64_t t0, int64_t t1,
                                   int32_t hidden)
{
    float os[BM_NVFP4_PIECE / 16];
    uint8_t sf[BM_NVFP4_PIECE / 16], c[BM_NVFP4_PIECE];
    int64_t t;
    int p, b, i;
    for (t = t0; t < t1; t++)
        for (p = 0; p < hidden; p += BM_NVFP4_PIECE) {
            const uint16_t *y = y0 + (size_t)(t - t0) * (size_t)hidden + p;
            uint8_t *out = q->values + (size_t)t * (size_t)(hidden / 2) + p / 2;
            for (b = 0; b < BM_NVFP4_PIECE / 16; b++)
                sf[b] = bm_nvfp4_scale_code(bm_fp8_absmax_bf16(y + 16 * b, 16), q->scale);
            for (b = 0; b < BM_NVFP4_PIECE / 16; b++) os[b] = bm_nvfp4_factor(sf[b], q->scale);
            for (b = 0; b < BM_NVFP4_PIECE / 16; b += 4)
                memcpy(q->block_scales + BEAM_NVFP4_SCALE_OFFSET(t, p / 16 + b, hidden), sf + b, 4);
            for (i = 0; i < BM_NVFP4_PIECE; i++) c[i] = (uint8_t)bm_e2m1(bm_f(y[i]) * os[i >> 4]);
            for (i = 0; i < BM_NVFP4_PIECE / 2; i++) out[i] = (uint8_t)(c[2 * i] | (c[2 * i + 1] << 4));
        }
}

/* The FP8 kinds' rows t0..t1: FP32 scales (none for TENSOR) and E4M3 codes. */
static BM_QUANT_CLONES void bm_rows_FP8(const bm_quant *q, const uint16_t *y0, int64_t t0, int64_t t1,
                                        int32_t hidden)
{
    const int n = q->group;
    int64_t t;
    int g;
    for (t = t0; t < t1; t++) {
        const uint16_t *y = y0 + (size_t)(t - t0) * (size_t)hidden;
        uint8_t *out = q->values + (size_t)t * (size_t)hidden;
        for (g = 0; g < hidden / n; g++) {
            const uint16_t *yg = y + (size_t)g * n;
            float s = q->scale;
            if (q->kind != BEAM_QUANT_FP8_TENSOR) {
                s = bm_quant_scale(q, yg, n);
                q->scales[t * q->ld_t + g * q->ld_g] = s;
            }
            bm_quant_values(yg, s, out + (size_t)g * n, n);
        }
    }
}

static BM_QUANT_CLONES void bm_rows_NVFP4(const bm_quant *q, const uint16_t *y0, int64_t t0, int64_t t1,
                                          int32_t hidden)
{
    bm_nvfp4_rows(q, y0, t0, t1, hidden);
}

/* MXFP8 rows t0..t1 (docs/numerics.md#mxfp8): FP8 group 32 with UE8M0
 * scales, each scale's E8M0 code (its FP32 exponent field: the scale is a
 * normal power of two) at its tiled place. */
static BM_QUANT_CLONES void bm_rows_MXFP8(const bm_quant *q, const uint16_t *y0, int64_t t0, int64_t t1,
                                          int32_t hidden)
{
    int64_t t;
    int g;
    for (t = t0; t < t1; t++) {
        const uint16_t *y = y0 + (size_t)(t - t0) * (size_t)hidden;
        uint8_t *out = q->values + (size_t)t * (size_t)hidden;
        for (g = 0; g < hidden / 32; g++) {
            const uint16_t *yg = y + (size_t)g * 32;
            const float s = bm_fp8_group_scale(bm_fp8_absmax_bf16(yg, 32), BM_FP8_GROUP_EPS, 1);
            q->block_scales[BEAM_MXFP8_SCALE_OFFSET(t, g, hidden)] = (uint8_t)(bm_fp8_bits(s) >> 23);
            bm_quant_values(yg, s, out + (size_t)g * 32, 32);
        }
    }
}

/* Rows t0..t1 into values and scales, by the kind's line of
 * lib/quant_forms.def; row t's normalized values are at y0 + (t - t0) *
 * hidden. */
static void bm_quant_rows(const bm_quant *q, const uint16_t *y0, int64_t t0, int64_t t1, int32_t hidden)
{
    switch (q->kind) {
#define BM_FORM(kind, qf, bits, group, scale, blocks) \
    case kind: bm_rows_##qf(q, y0, t0, t1, hidden); return;
#include "quant_forms.def"
    }
}

/* Threads for T rows of H values: bytes read (2 H) and written (H values,
 * 4 per scale; the block forms write less, and count as FP8 of their
 * group). */
static int bm_quant_team(int64_t T, int32_t H, int group)
{
    return bm_cpu_team_of(T, 3 * (int64_t)H + 4 * (int64_t)(H / group), BM_QUANT_BYTES_PER_THREAD);
}

beam_status bm_cpu_quant_target(const bm_args *a, bm_args *b, uint16_t **tmp)
{
    *b = *a;
    *tmp = NULL;
    if (!a->q.kind || a->normalized || a->tokens == 0) return BEAM_OK;
    *tmp = (uint16_t *)malloc((size_t)a->tokens * (size_t)a->hidden * sizeof **tmp);
    if (!*tmp)
        return bm_fail(BEAM_ERR_OUT_OF_MEMORY, "%s: no host memory for the %lld x %d normalized rows to "
                       "quantize", a->fn, (long long)a->tokens, (int)a->hidden);
    b->normalized = *tmp;
    return BEAM_OK;
}

void bm_cpu_quant_rows(const bm_args *a, const uint16_t *normalized)
{
    const int64_t T = a->tokens;
    const int32_t H = a->hidden;
    const int team = bm_quant_team(T, H, a->q.group);
    if (team <= 1) {
        bm_quant_rows(&a->q, normalized, 0, T, H);
        return;
    }
#ifdef _OPENMP
    {
        /* each row by one thread: the bits do not depend on the schedule
         * (dynamic chunks, as cpu/run.c hands out rows) */
        const int64_t chunk = bm_cpu_chunk(T, team), nchunks = (T + chunk - 1) / chunk;
        int64_t c;
#pragma omp parallel for num_threads(team) schedule(dynamic, 1)
        for (c = 0; c < nchunks; c++) {
            const int64_t t0 = c * chunk;
            bm_quant_rows(&a->q, normalized + (size_t)t0 * (size_t)H, t0, t0 + chunk < T ? t0 + chunk : T, H);
        }
    }
#endif
}

void bm_cpu_quant_row(const bm_quant *q, const uint16_t *y, int64_t t, int32_t hidden)
{
    bm_quant_rows(q, y, t, t + 1, hidden);
}
