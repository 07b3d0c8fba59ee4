/*
 * test_quant.c - the quantized output of normalized (the local beam_*_q
 * calls), every backend that runs here, against the tests' own model of
 * docs/numerics.md#fp8, #nvfp4 and #mxfp8 (harness/quant_model.c, which
 * the gather's tests share).
 *
 *   The model: the backend's own plain call gives hidden and normalized
 *   (test_backends checks those against the naive reference and the CPU);
 *   each row of normalized is quantized here: the group's (or token's)
 *   largest magnitude, its FP32 scale, and the nearest of the 254 finite
 *   E4M3 values found by search (ties to the even code), after the clamp;
 *   NVFP4: each block's maximum, its E4M3 scale code at its tiled place
 *   and the nearest E2M1 magnitude of each value times the block's factor;
 *   MXFP8: each group of 32's power of two scale, its E8M0 code at its
 *   tiled place and the values' E4M3 codes as above. Then the backend's
 *   *_q call must give the same hidden and normalized and the model's
 *   values and scales bit for bit, with every byte past them (guards,
 *   column-major padding, the rows of the last 128-row tile of the block
 *   scales past T) untouched.
 *
 *   forms     GROUP 128 and 64, row- and column-major scales, with and
 *             without UE8M0; TOKEN with and without UE8M0; TENSOR; the
 *             block-scaled forms of the model's qm_forms (NVFP4 with the
 *             global scales 672 (448 * 6 / 4) and 1, MXFP8), and NVFP4
 *             with 1e-30 (most scales round to 0) and the largest below
 *             2^118 (most saturate), at T = 1, 7, 100, 130 and 300 (one
 *             tile of rows, a tile and a bit, three)
 *   ops       norm_residual_norm_q (with and without a pre-norm), and the
 *             fused op's _q under FUSED and UNFUSED; normalized written too
 *             or only the quantized form (normalized NULL)
 *   values    random rows with zeros, subnormals, infinities and NaN
 *   threads   the CPU's calls under test take 1, 2 and 3 OpenMP threads in
 *             turn: each row is quantized inside the threaded row loop
 *             (cpu/rows.c), so its bytes must not depend on the team
 *   errors    each rule of the quant argument: INVALID_ARGUMENT, nothing
 *             written
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "beammoe.h"
#include "devmem.h"
#include "quant_model.h"
#include "suite.h"
#include "util.h"

#define GUARD 64
#define POISON8 0xA5u
#define POISON32 0x7FA5A5A5u /* a NaN no scale can be */

static uint64_t g_seed;
static hu_rng g_rng;
static const beam_ops *g_ops[2]; /* cpu, cuda (NULL: not here) */
static long g_calls;

/* the harness's splitmix64 */
static uint64_t rnd(void)
{
    return hu_next(&g_rng);
}

/* a BF16 input value: mostly normal numbers of a few magnitudes, sometimes
 * zeros, subnormals, infinities or NaN */
static uint16_t rbf16(int exotic)
{
    static const uint16_t sp[] = {0x0000, 0x8000, 0x0001, 0x8003, 0x7F80, 0xFF80, 0x7FC0, 0x7F7F, 0x0080};
    if (exotic && rnd() % 64 == 0) return sp[rnd() % (sizeof sp / sizeof sp[0])];
    return (uint16_t)(((rnd() & 1) << 15) | ((118 + rnd() % 14) << 7) | (rnd() & 0x7F));
}

/* ---- buffers on the backend's memory ------------------------------------------ */

typedef struct buf {
    void *host, *dev; /* dev: the backend's pointer (== host on the CPU) */
    size_t bytes;
} buf;

static void buf_make(buf *b, const beam_ops *ops, size_t bytes, const void *init, int poison)
{
    b->bytes = bytes;
    b->host = malloc(bytes ? bytes : 1);
    if (!b->host) exit(1);
    if (init)
        memcpy(b->host, init, bytes);
    else
        memset(b->host, poison, bytes);
    b->dev = b->host;
    if (ops->device_memory) {
        b->dev = dev_alloc(bytes ? bytes : 1);
        if (!b->dev || dev_upload(b->dev, b->host, bytes)) {
            fprintf(stderr, "device memory: %s\n", dev_last_error());
            exit(1);
        }
    }
}

static void buf_fetch(buf *b, const beam_ops *ops)
{
    if (ops->device_memory && dev_download(b->host, b->dev, b->bytes)) {
        fprintf(stderr, "device memory: %s\n", dev_last_error());
        exit(1);
    }
}

static void buf_free(buf *b, const beam_ops *ops)
{
    if (ops->device_memory) dev_free(b->dev);
    free(b->host);
}

/* ---- one case ------------------------------------------------------------------- */

enum { OP_NRN, OP_NRN_PRE, OP_FUSED, OP_UNFUSED, NOPS };
static const char *const op_names[NOPS] = {"nrn", "nrn+pre", "fused FUSED", "fused UNFUSED"};

static void describe(char *d, size_t n, const beam_quant *q, int op, int64_t T, int32_t H, int with_nrm, int off)
{
    char label[64];
    qm_label(q, label, sizeof label);
    snprintf(d, n, "%s T=%lld H=%d kind=%d (%s) group=%d flags=%u ld=%lld scale=%a normalized=%s values+%d",
             op_names[op], (long long)T, (int)H, (int)q->kind, label, (int)q->group_size, (unsigned)q->flags,
             (long long)q->scale_ld, (double)q->scale, with_nrm ? "yes" : "NULL", off);
}

/* Where block scale byte i of q's form for T rows of H belongs: "row t
 * block b", or "padding" (a row past T of the last tile) or "guard" (past
 * the array). */
static void block_place(char *d, size_t n, const beam_quant *q, size_t i, int64_t T, int32_t H)
{
    int64_t t, b;
    if (i >= qm_block_bytes(q, T, H)) {
        snprintf(d, n, "guard");
        return;
    }
    for (t = 0; t < (T + 127) / 128 * 128; t++)
        for (b = 0; b < H / qm_block(q); b++)
            if ((size_t)qm_block_offset(q, t, b, H) == i) {
                snprintf(d, n, t < T ? "row %lld block %lld" : "padding row %lld block %lld", (long long)t,
                         (long long)b);
                return;
            }
    snprintf(d, n, "no place");
}

/* 1 when the backend's *_q call matches the model */
static int run_case(const beam_ops *ops, int op, int64_t T, int32_t H, beam_quant q, int with_nrm, int off)
{
    const int K = 6;
    const size_t TH = (size_t)T * (size_t)H;
    const int per = 8 / qm_bits(&q); /* values a byte */
    const size_t nv = qm_values_bytes(&q, T, H), vrow = qm_values_bytes(&q, 1, H);
    const size_t nsc = qm_scale_floats(&q, T, H); /* block-scaled: the block scales' bytes / 4 */
    uint16_t *x = malloc((TH + 1) * 2), *res = malloc((TH + 1) * 2), *ex = malloc(((size_t)K * TH + 1) * 2);
    uint16_t *wpre = malloc((size_t)H * 2), *wnext = malloc((size_t)H * 2);
    float *wts = malloc(((size_t)K * T + 1) * 4);
    uint16_t *hid_ref = malloc((TH + 1) * 2), *nrm_ref = malloc((TH + 1) * 2);
    uint8_t *vals_ref = malloc(nv + GUARD);
    float *sc_ref = malloc((nsc + GUARD) * 4);
    buf bx, bres, bex, bwts, bwpre, bwnext, bhid, bnrm, bvals, bsc;
    beam_norm pre = {NULL, 1e-6f}, next = {NULL, 1e-5f};
    const float scales2[2] = {0.75f, 1.25f};
    const float *scales = rnd() % 2 ? scales2 : NULL;
    beam_status st;
    size_t i;
    int ok = 1;
    char d[256];

    if (!x || !res || !ex || !wpre || !wnext || !wts || !hid_ref || !nrm_ref || !vals_ref || !sc_ref) exit(1);
    for (i = 0; i < TH; i++) {
        x[i] = rbf16(1);
        res[i] = rbf16(1);
    }
    for (i = 0; i < (size_t)K * TH; i++) ex[i] = rbf16(1);
    for (i = 0; i < (size_t)K * (size_t)T; i++) wts[i] = (float)(rnd() % 1000 + 1) / 1000.0f;
    for (i = 0; i < (size_t)H; i++) {
        wpre[i] = (uint16_t)(0x3F00 + rnd() % 0x100);
        wnext[i] = (uint16_t)(0x3F00 + rnd() % 0x100 + (rnd() % 16 == 0 ? 0x8000 : 0));
    }
    buf_make(&bx, ops, TH * 2, x, 0);
    buf_make(&bres, ops, TH * 2, res, 0);
    buf_make(&bex, ops, (size_t)K * TH * 2, ex, 0);
    buf_make(&bwts, ops, (size_t)K * (size_t)T * 4, wts, 0);
    buf_make(&bwpre, ops, (size_t)H * 2, wpre, 0);
    buf_make(&bwnext, ops, (size_t)H * 2, wnext, 0);
    pre.weight = bwpre.dev;
    next.weight = bwnext.dev;

    /* the reference: the same backend's plain call */
    buf_make(&bhid, ops, TH * 2, NULL, 0xEE);
    buf_make(&bnrm, ops, TH * 2, NULL, 0xEE);
    if (op == OP_NRN || op == OP_NRN_PRE)
        st = ops->norm_residual_norm(bx.dev, bres.dev, T, H, op == OP_NRN_PRE ? &pre : NULL, scales, &next,
                                     bhid.dev, bnrm.dev, NULL);
    else
        st = ops->moe_finalize_norm_residual_norm(bex.dev, bwts.dev, T, T, K, H, 2.5f, NULL, bres.dev, scales,
                                                  &next, bhid.dev, bnrm.dev,
                                                  op == OP_FUSED ? BEAM_STRATEGY_FUSED : BEAM_STRATEGY_UNFUSED,
                                                  NULL);
    if (st != BEAM_OK) {
        fprintf(stderr, "  plain %s: status %d (%s)\n", op_names[op], (int)st, ops->last_error());
        exit(1);
    }
    if (ops->device_memory) dev_sync();
    buf_fetch(&bhid, ops);
    buf_fetch(&bnrm, ops);
    memcpy(hid_ref, bhid.host, TH * 2);
    memcpy(nrm_ref, bnrm.host, TH * 2);
    memset(vals_ref, POISON8, nv + GUARD);
    for (i = 0; i < nsc + GUARD; i++) memcpy(&sc_ref[i], &(uint32_t){POISON32}, 4);
    qm_quant(&q, nrm_ref, T, H, vals_ref, sc_ref);
    buf_free(&bhid, ops);
    buf_free(&bnrm, ops);

    /* the call under test, on poisoned outputs with guards */
    buf_make(&bhid, ops, TH * 2, NULL, 0xEE);
    buf_make(&bnrm, ops, TH * 2, NULL, 0xEE);
    /* off: the values' base that many bytes past an aligned one (the
     * kernels' byte-store path) */
    buf_make(&bvals, ops, (size_t)off + nv + GUARD, NULL, POISON8);
    {
        float *p = malloc((nsc + GUARD) * 4);
        if (!p) exit(1);
        for (i = 0; i < nsc + GUARD; i++) memcpy(&p[i], &(uint32_t){POISON32}, 4);
        buf_make(&bsc, ops, (nsc + GUARD) * 4, p, 0);
        free(p);
    }
    /* block-scaled: the scales array's bytes are the block scales, poisoned
     * the same (every byte of a padding row of the last tile must stay so) */
    qm_bind(&q, (uint8_t *)bvals.dev + off, bsc.dev);
#ifdef _OPENMP
    if (!ops->device_memory) omp_set_num_threads(1 + (int)(g_calls % 3));
#endif
    if (op == OP_NRN || op == OP_NRN_PRE) {
        /* x and residual again: an in-place reference never ran, inputs are intact */
        st = ops->norm_residual_norm_q(bx.dev, bres.dev, T, H, op == OP_NRN_PRE ? &pre : NULL, scales, &next,
                                       bhid.dev, with_nrm ? bnrm.dev : NULL, &q, NULL);
    } else {
        st = ops->moe_finalize_norm_residual_norm_q(
            bex.dev, bwts.dev, T, T, K, H, 2.5f, NULL, bres.dev, scales, &next, bhid.dev,
            with_nrm ? bnrm.dev : NULL, &q, op == OP_FUSED ? BEAM_STRATEGY_FUSED : BEAM_STRATEGY_UNFUSED, NULL);
    }
    ++g_calls;
    describe(d, sizeof d, &q, op, T, H, with_nrm, off);
#ifdef _OPENMP
    if (!ops->device_memory) {
        const size_t l = strlen(d);
        snprintf(d + l, sizeof d - l, " threads=%d", 1 + (int)((g_calls - 1) % 3));
    }
#endif
    if (st != BEAM_OK) {
        fprintf(stderr, "  %s %s: status %d (%s)\n", ops->name, d, (int)st, ops->last_error());
        ok = 0;
    } else {
        if (ops->device_memory) dev_sync();
        buf_fetch(&bhid, ops);
        buf_fetch(&bnrm, ops);
        buf_fetch(&bvals, ops);
        buf_fetch(&bsc, ops);
        if (memcmp(bhid.host, hid_ref, TH * 2)) {
            fprintf(stderr, "  %s %s: hidden differs from the plain call's\n", ops->name, d);
            ok = 0;
        }
        for (i = 0; i < TH && ok; i++)
            if (((uint16_t *)bnrm.host)[i] != (with_nrm ? nrm_ref[i] : 0xEEEEu)) {
                fprintf(stderr, "  %s %s: normalized[%zu] = %04x, want %04x\n", ops->name, d, i,
                        ((uint16_t *)bnrm.host)[i], with_nrm ? nrm_ref[i] : 0xEEEEu);
                ok = 0;
            }
        for (i = 0; i < (size_t)off && ok; i++)
            if (((uint8_t *)bvals.host)[i] != POISON8) {
                fprintf(stderr, "  %s %s: wrote before values\n", ops->name, d);
                ok = 0;
            }
        for (i = 0; i < nv + GUARD && ok; i++)
            if (((uint8_t *)bvals.host)[off + i] != vals_ref[i]) {
                /* 4-bit values: byte i holds columns 2c (low) and 2c + 1 (high) */
                const size_t r = i / vrow, c = (i % vrow) * (size_t)per;
                fprintf(stderr, "  %s %s: values[%zu] (row %zu col %zu%s) = %02x, want %02x (normalized %04x%s)\n",
                        ops->name, d, i, r, c, per > 1 ? " and the next" : "", ((uint8_t *)bvals.host)[off + i],
                        vals_ref[i], i < nv ? nrm_ref[r * H + c] : 0, i >= nv ? ": a guard" : "");
                ok = 0;
            }
        if (qm_block(&q)) {
            const uint8_t *got = bsc.host, *want = (const uint8_t *)sc_ref;
            for (i = 0; i < 4 * (nsc + GUARD) && ok; i++)
                if (got[i] != want[i]) {
                    char where[64];
                    block_place(where, sizeof where, &q, i, T, H);
                    fprintf(stderr, "  %s %s: block_scales[%zu] (%s) = %02x, want %02x\n", ops->name, d, i, where,
                            got[i], want[i]);
                    ok = 0;
                }
        }
        for (i = 0; i < nsc + GUARD && ok; i++)
            if (hu_u32(((float *)bsc.host)[i]) != hu_u32(sc_ref[i])) {
                fprintf(stderr, "  %s %s: scales[%zu] = %08x, want %08x\n", ops->name, d, i,
                        hu_u32(((float *)bsc.host)[i]), hu_u32(sc_ref[i]));
                ok = 0;
            }
    }
    if (!ok) fprintf(stderr, "  ^ seed %llu\n", (unsigned long long)g_seed);
    buf_free(&bx, ops);
    buf_free(&bres, ops);
    buf_free(&bex, ops);
    buf_free(&bwts, ops);
    buf_free(&bwpre, ops);
    buf_free(&bwnext, ops);
    buf_free(&bhid, ops);
    buf_free(&bnrm, ops);
    buf_free(&bvals, ops);
    buf_free(&bsc, ops);
    free(x), free(res), free(ex), free(wpre), free(wnext), free(wts);
    free(hid_ref), free(nrm_ref), free(vals_ref), free(sc_ref);
    return ok;
}

/* the forms of the quantized output for T rows */
static int forms(beam_quant *out, int64_t T)
{
    int n = 0, g, f;
    const int groups[2] = {128, 64};
    for (g = 0; g < 2; g++)
        for (f = 0; f < 4; f++) {
            beam_quant q;
            memset(&q, 0, sizeof q);
            q.kind = BEAM_QUANT_FP8_GROUP;
            q.group_size = groups[g];
            q.flags = (f & 1 ? BEAM_QUANT_UE8M0 : 0u) | (f & 2 ? BEAM_QUANT_COL_MAJOR : 0u);
            /* column-major: DeepGEMM's leading dimension, T rounded up to 4 */
            if (f & 2) q.scale_ld = (T + 3) / 4 * 4;
            out[n++] = q;
        }
    for (f = 0; f < 2; f++) {
        memset(&out[n], 0, sizeof out[n]);
        out[n].kind = BEAM_QUANT_FP8_TOKEN;
        out[n++].flags = f ? BEAM_QUANT_UE8M0 : 0u;
    }
    memset(&out[n], 0, sizeof out[n]);
    out[n].kind = BEAM_QUANT_FP8_TENSOR;
    out[n++].scale = 0.0125f;
    /* static scales at the edges of the CUDA quotient's fast form: the
     * largest it takes (its reciprocal is the smallest normal number), the
     * first it divides for, the largest float, and a subnormal (every
     * nonzero value saturates) */
    {
        const float edges[4] = {0x1.fffffep125f, 0x1p126f, FLT_MAX, 0x1p-140f};
        for (f = 0; f < 4; f++) {
            memset(&out[n], 0, sizeof out[n]);
            out[n].kind = BEAM_QUANT_FP8_TENSOR;
            out[n++].scale = edges[f];
        }
    }
    /* the block-scaled forms of the model's (NVFP4 under the global scales
     * 448 * 6 / amax for amax 4 and 1); after the last of a kind with a
     * global scale, that kind under one so small that most blocks' scales
     * round to 0 (os = 0) and the largest below 2^118, where most scales
     * saturate at 448 */
    {
        beam_quant qf[QM_NFORMS];
        const float gs[2] = {1e-30f, 0x1.fffffep117f};
        qm_forms(qf, T);
        for (f = QM_NFP8_FORMS; f < QM_NFORMS; f++) {
            int e;
            out[n++] = qf[f];
            if (!qm_global(&qf[f]) || (f + 1 < QM_NFORMS && qf[f + 1].kind == qf[f].kind)) continue;
            for (e = 0; e < 2; e++) {
                out[n] = qf[f];
                out[n++].scale = gs[e];
            }
        }
    }
    return n;
}

static void test_forms(void)
{
    static const int32_t hs[] = {256, 2048, 7168};
    /* 130: the block scales take a second 128-row tile, of which rows
     * 130..255 are padding (the forms with FP32 scales skip it) */
    static const int64_t ts[] = {1, 7, 100, 130};
    int b, hi, ti, fi, bad = 0;
    for (b = 0; b < 2; b++) {
        const beam_ops *ops = g_ops[b];
        if (!ops) continue;
        for (hi = 0; hi < 3; hi++)
            for (ti = 0; ti < 4; ti++) {
                beam_quant qs[32];
                const int nf = forms(qs, ts[ti]);
                CU_ASSERT_FATAL(nf <= 32);
                for (fi = 0; fi < nf; fi++) {
                    if (ts[ti] == 130 && !qm_block(&qs[fi])) continue;
                    /* every form once per shape, under a rotating op and
                     * normalized given or not */
                    const int op = (int)((hi * 3 + ti + fi) % NOPS);
                    if (!run_case(ops, op, ts[ti], hs[hi], qs[fi], (int)((hi + ti + fi) % 2),
                                  (hi + ti + fi) % 4 == 0 ? 3 : 0))
                        ++bad;
                }
            }
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* every op with every form, at one shape with many rows (the prefill
 * kernels) */
static void test_prefill(void)
{
    int b, fi, op, bad = 0;
    for (b = 0; b < 2; b++) {
        const beam_ops *ops = g_ops[b];
        if (!ops) continue;
        for (op = 0; op < NOPS; op++) {
            beam_quant qs[32];
            const int nf = forms(qs, 300);
            CU_ASSERT_FATAL(nf <= 32);
            /* on the CPU every third form with FP32 scales (the model's
             * E4M3 search is slow), every block-scaled one */
            for (fi = 0; fi < nf; fi++)
                if ((ops->device_memory || fi % 3 == 0 || qm_block(&qs[fi])) &&
                    !run_case(ops, op, 300, fi % 2 ? 4096 : 2048, qs[fi], fi % 2, 0))
                    ++bad;
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* ---- errors ----------------------------------------------------------------------- */

static void test_errors(void)
{
    const int32_t H = 256;
    const int64_t T = 2;
    uint16_t x[512], res[512], hid[512], nrm[512], w[256];
    uint8_t vals[512], bsc[2048]; /* bsc: BEAM_NVFP4_SCALE_BYTES(2, 256), the most of a form */
    float sc[64];
    beam_norm next = {w, 1e-6f};
    const beam_ops *ops = g_ops[0];
    struct {
        const char *what, *need; /* need: what the message says */
        beam_quant q;
        int next_on;
    } bad[64];
    int n = 0, i;
    for (i = 0; i < 512; i++) x[i] = res[i] = 0x3F80;
    for (i = 0; i < 256; i++) w[i] = 0x3F80;
#define BADM(WHAT, NEED, NEXT, ...)                                                   \
    do {                                                                              \
        beam_quant q_ = {__VA_ARGS__};                                                \
        CU_ASSERT_FATAL(n < (int)(sizeof bad / sizeof bad[0]));                       \
        bad[n].what = WHAT;                                                           \
        bad[n].need = NEED;                                                           \
        bad[n].q = q_;                                                                \
        bad[n].next_on = NEXT;                                                        \
        ++n;                                                                          \
    } while (0)
#define BAD(WHAT, NEXT, ...) BADM(WHAT, "quant", NEXT, __VA_ARGS__)
    BAD("kind 0", 1, 0, 0, 0, 0.0f, vals, sc, 0, NULL);
    BADM("kind 6", "quant->kind=6 must be", 1, 6, 0, 0, 0.0f, vals, sc, 0, NULL);
    BAD("group 32", 1, BEAM_QUANT_FP8_GROUP, 32, 0, 0.0f, vals, sc, 0, NULL);
    BAD("unknown flag", 1, BEAM_QUANT_FP8_GROUP, 128, 4u, 0.0f, vals, sc, 0, NULL);
    BAD("col-major ld < tokens", 1, BEAM_QUANT_FP8_GROUP, 128, BEAM_QUANT_COL_MAJOR, 0.0f, vals, sc, 1, NULL);
    BAD("row-major with an ld", 1, BEAM_QUANT_FP8_GROUP, 128, 0, 0.0f, vals, sc, 4, NULL);
    BAD("token with a group", 1, BEAM_QUANT_FP8_TOKEN, 128, 0, 0.0f, vals, sc, 0, NULL);
    BAD("tensor scale 0", 1, BEAM_QUANT_FP8_TENSOR, 0, 0, 0.0f, vals, NULL, 0, NULL);
    BAD("tensor scale inf", 1, BEAM_QUANT_FP8_TENSOR, 0, 0, INFINITY, vals, NULL, 0, NULL);
    BAD("tensor scale nan", 1, BEAM_QUANT_FP8_TENSOR, 0, 0, NAN, vals, NULL, 0, NULL);
    BAD("tensor scale < 0", 1, BEAM_QUANT_FP8_TENSOR, 0, 0, -1.0f, vals, NULL, 0, NULL);
    BAD("group with a scale", 1, BEAM_QUANT_FP8_GROUP, 128, 0, 0.5f, vals, sc, 0, NULL);
    BAD("token with a scale", 1, BEAM_QUANT_FP8_TOKEN, 0, 0, 0.5f, vals, sc, 0, NULL);
    /* (G - 1) * scale_ld * 4 bytes wraps 64 bits: must not pass as a small extent */
    BAD("col-major ld wrapping", 1, BEAM_QUANT_FP8_GROUP, 64, BEAM_QUANT_COL_MAJOR, 0.0f, vals, sc,
        3074457345618258603LL, NULL);
    BAD("tensor with scales", 1, BEAM_QUANT_FP8_TENSOR, 0, 0, 1.0f, vals, sc, 0, NULL);
    BAD("values NULL", 1, BEAM_QUANT_FP8_GROUP, 128, 0, 0.0f, NULL, sc, 0, NULL);
    BAD("no next norm", 0, BEAM_QUANT_FP8_GROUP, 128, 0, 0.0f, vals, sc, 0, NULL);
    /* NVFP4: group_size 16, flags and scale_ld 0, scales NULL, a global
     * scale 0 < g < 2^118, values and block_scales */
    BAD("nvfp4 group 0", 1, BEAM_QUANT_NVFP4, 0, 0, 672.0f, vals, NULL, 0, bsc);
    BAD("nvfp4 group 32", 1, BEAM_QUANT_NVFP4, 32, 0, 672.0f, vals, NULL, 0, bsc);
    BAD("nvfp4 group 128", 1, BEAM_QUANT_NVFP4, 128, 0, 672.0f, vals, NULL, 0, bsc);
    BAD("nvfp4 UE8M0", 1, BEAM_QUANT_NVFP4, 16, BEAM_QUANT_UE8M0, 672.0f, vals, NULL, 0, bsc);
    BAD("nvfp4 col-major", 1, BEAM_QUANT_NVFP4, 16, BEAM_QUANT_COL_MAJOR, 672.0f, vals, NULL, 4, bsc);
    BAD("nvfp4 unknown flag", 1, BEAM_QUANT_NVFP4, 16, 4u, 672.0f, vals, NULL, 0, bsc);
    BAD("nvfp4 with an ld", 1, BEAM_QUANT_NVFP4, 16, 0, 672.0f, vals, NULL, 4, bsc);
    BAD("nvfp4 with scales", 1, BEAM_QUANT_NVFP4, 16, 0, 672.0f, vals, sc, 0, bsc);
    BAD("nvfp4 g 0", 1, BEAM_QUANT_NVFP4, 16, 0, 0.0f, vals, NULL, 0, bsc);
    BAD("nvfp4 g -0", 1, BEAM_QUANT_NVFP4, 16, 0, -0.0f, vals, NULL, 0, bsc);
    BAD("nvfp4 g < 0", 1, BEAM_QUANT_NVFP4, 16, 0, -672.0f, vals, NULL, 0, bsc);
    BAD("nvfp4 g nan", 1, BEAM_QUANT_NVFP4, 16, 0, NAN, vals, NULL, 0, bsc);
    BAD("nvfp4 g inf", 1, BEAM_QUANT_NVFP4, 16, 0, INFINITY, vals, NULL, 0, bsc);
    BAD("nvfp4 g 2^118", 1, BEAM_QUANT_NVFP4, 16, 0, 0x1p118f, vals, NULL, 0, bsc);
    BAD("nvfp4 g FLT_MAX", 1, BEAM_QUANT_NVFP4, 16, 0, FLT_MAX, vals, NULL, 0, bsc);
    BAD("nvfp4 block_scales NULL", 1, BEAM_QUANT_NVFP4, 16, 0, 672.0f, vals, NULL, 0, NULL);
    BAD("nvfp4 values NULL", 1, BEAM_QUANT_NVFP4, 16, 0, 672.0f, NULL, NULL, 0, bsc);
    BAD("nvfp4 no next norm", 0, BEAM_QUANT_NVFP4, 16, 0, 672.0f, vals, NULL, 0, bsc);
    /* MXFP8: group_size 32, scale 0, flags and scale_ld 0, scales NULL,
     * values and block_scales */
#define MX_TAKES "BEAM_QUANT_MXFP8 takes quant->group_size 32"
    BADM("mxfp8 group 0", MX_TAKES, 1, BEAM_QUANT_MXFP8, 0, 0, 0.0f, vals, NULL, 0, bsc);
    BADM("mxfp8 group 16", MX_TAKES, 1, BEAM_QUANT_MXFP8, 16, 0, 0.0f, vals, NULL, 0, bsc);
    BADM("mxfp8 group 128", MX_TAKES, 1, BEAM_QUANT_MXFP8, 128, 0, 0.0f, vals, NULL, 0, bsc);
    BADM("mxfp8 UE8M0", MX_TAKES, 1, BEAM_QUANT_MXFP8, 32, BEAM_QUANT_UE8M0, 0.0f, vals, NULL, 0, bsc);
    BADM("mxfp8 col-major", MX_TAKES, 1, BEAM_QUANT_MXFP8, 32, BEAM_QUANT_COL_MAJOR, 0.0f, vals, NULL, 4, bsc);
    BADM("mxfp8 unknown flag", "quant->flags=0x4 has unknown bits", 1, BEAM_QUANT_MXFP8, 32, 4u, 0.0f, vals, NULL, 0,
         bsc);
    BADM("mxfp8 scale 1", "quant->scale=1 must be 0", 1, BEAM_QUANT_MXFP8, 32, 0, 1.0f, vals, NULL, 0, bsc);
    BADM("mxfp8 scale nan", "must be 0 for the dynamic kinds", 1, BEAM_QUANT_MXFP8, 32, 0, NAN, vals, NULL, 0, bsc);
    BADM("mxfp8 with an ld", MX_TAKES, 1, BEAM_QUANT_MXFP8, 32, 0, 0.0f, vals, NULL, 4, bsc);
    BADM("mxfp8 with scales", MX_TAKES, 1, BEAM_QUANT_MXFP8, 32, 0, 0.0f, vals, sc, 0, bsc);
    BADM("mxfp8 block_scales NULL", "quant->block_scales must not be NULL", 1, BEAM_QUANT_MXFP8, 32, 0, 0.0f, vals,
         NULL, 0, NULL);
    BADM("mxfp8 values NULL", "quant->values must not be NULL", 1, BEAM_QUANT_MXFP8, 32, 0, 0.0f, NULL, NULL, 0,
         bsc);
    BADM("mxfp8 no next norm", "quant needs next_norm", 0, BEAM_QUANT_MXFP8, 32, 0, 0.0f, vals, NULL, 0, bsc);
#undef MX_TAKES
    /* block_scales with the FP8 kinds */
    BAD("group with block_scales", 1, BEAM_QUANT_FP8_GROUP, 128, 0, 0.0f, vals, sc, 0, bsc);
    BAD("token with block_scales", 1, BEAM_QUANT_FP8_TOKEN, 0, 0, 0.0f, vals, sc, 0, bsc);
    BAD("tensor with block_scales", 1, BEAM_QUANT_FP8_TENSOR, 0, 0, 1.0f, vals, NULL, 0, bsc);
#undef BAD
#undef BADM
    for (i = 0; i < n; i++) {
        beam_status st;
        memset(hid, 0xEE, sizeof hid);
        memset(nrm, 0xEE, sizeof nrm);
        memset(vals, POISON8, sizeof vals);
        memset(bsc, POISON8, sizeof bsc);
        st = ops->norm_residual_norm_q(x, res, T, H, NULL, NULL, bad[i].next_on ? &next : NULL, hid,
                                       bad[i].next_on ? nrm : NULL, &bad[i].q, NULL);
        if (st != BEAM_ERR_INVALID_ARGUMENT || hid[0] != 0xEEEE || vals[0] != POISON8 || bsc[0] != POISON8) {
            fprintf(stderr, "  %s: status %d (%s), hidden[0] %04x, values[0] %02x, block_scales[0] %02x\n",
                    bad[i].what, (int)st, ops->last_error(), hid[0], vals[0], bsc[0]);
            CU_FAIL("a bad quant argument was taken");
        } else if (!strstr(ops->last_error(), bad[i].need)) {
            fprintf(stderr, "  %s: message \"%s\" does not say \"%s\"\n", bad[i].what, ops->last_error(),
                    bad[i].need);
            CU_FAIL("message");
        }
    }
    /* NVFP4's global scale at the ends of its range is taken: the smallest
     * subnormal and the largest float below 2^118 */
    {
        const float gs[2] = {0x1p-149f, 0x1.fffffep117f};
        for (i = 0; i < 2; i++) {
            beam_quant q = {BEAM_QUANT_NVFP4, 16, 0, gs[i], vals, NULL, 0, bsc};
            const beam_status st = ops->norm_residual_norm_q(x, res, T, H, NULL, NULL, &next, hid, NULL, &q, NULL);
            if (st != BEAM_OK) fprintf(stderr, "  nvfp4 g %a: status %d (%s)\n", (double)gs[i], (int)st, ops->last_error());
            CU_ASSERT_EQUAL(st, BEAM_OK);
        }
    }
    /* MXFP8 as it must be: taken */
    {
        beam_quant q = {BEAM_QUANT_MXFP8, 32, 0, 0.0f, vals, NULL, 0, bsc};
        const beam_status st = ops->norm_residual_norm_q(x, res, T, H, NULL, NULL, &next, hid, NULL, &q, NULL);
        if (st != BEAM_OK) fprintf(stderr, "  mxfp8: status %d (%s)\n", (int)st, ops->last_error());
        CU_ASSERT_EQUAL(st, BEAM_OK);
    }
    /* normalized NULL without a quant: still an error */
    CU_ASSERT_EQUAL(ops->norm_residual_norm_q(x, res, T, H, NULL, NULL, &next, hid, NULL, NULL, NULL),
                    BEAM_ERR_INVALID_ARGUMENT);
}

int main(void)
{
    static const suite_test tests[] = {{"every form on every backend", test_forms},
                                       {"prefill shapes", test_prefill},
                                       {"bad quant arguments", test_errors},
                                       {NULL, NULL}};
    char why[256];
    g_seed = hu_seed("test_quant");
    hu_rng_init(&g_rng, g_seed);
    g_ops[0] = beam_backend_ops("cpu", BEAM_OPS_VERSION);
    if (!g_ops[0]) {
        fprintf(stderr, "test_quant: no CPU backend: %s\n", beam_last_error());
        return 1;
    }
    g_ops[1] = beam_backend_ops("cuda", BEAM_OPS_VERSION);
    if (g_ops[1] && dev_open(why, sizeof why)) {
        fprintf(stderr, "test_quant: cuda runs here, but the test cannot reach its memory: %s\n", why);
        return 1;
    }
    printf("test_quant: backends cpu%s\n", g_ops[1] ? ", cuda" : "");
    {
        const int rc = suite_run("test_quant", tests);
        printf("test_quant: %ld quantized calls checked, seed %llu\n", g_calls, (unsigned long long)g_seed);
        return rc;
    }
}
