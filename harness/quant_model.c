/*
 * quant_model.c - the harness's model of docs/numerics.md#fp8, #nvfp4 and
 * #mxfp8 (quant_model.h).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "quant_model.h"

/* the value of every E4M3 code (NaN codes included, never chosen) */
static double g_val[256];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void qm_fill(void)
{
    int c;
    for (c = 0; c < 256; c++) {
        const int e = (c >> 3) & 15, m = c & 7;
        const double v = e ? ldexp(8.0 + m, e - 10) : ldexp((double)m, -9);
        g_val[c] = (c & 0x80) ? -v : v;
    }
}

static float qm_widen(uint16_t b)
{
    const uint32_t u = (uint32_t)b << 16;
    float v;
    memcpy(&v, &u, 4);
    return v;
}

uint8_t qm_e4m3(float v)
{
    int c, best = -1;
    double bd = 0.0;
    pthread_once(&g_once, qm_fill);
    v = fminf(fmaxf(v, -448.0f), 448.0f);
    for (c = 0; c < 256; c++) {
        double d;
        if ((c & 0x7F) == 0x7F || (signbit(v) != 0) != ((c & 0x80) != 0)) continue;
        d = fabs(g_val[c] - (double)v);
        if (best < 0 || d < bd || (d == bd && (c & 1) == 0)) {
            best = c;
            bd = d;
        }
    }
    return (uint8_t)best;
}

/* the smallest power of two >= s (s > 0 finite), by frexpf */
static float qm_pow2ceil(float s)
{
    int e;
    const float m = frexpf(s, &e); /* s = m * 2^e, m in [0.5, 1) */
    if (isinf(s)) return s;
    return m == 0.5f ? s : ldexpf(1.0f, e);
}

/* The scale of one group (GROUP), row (TOKEN) of n values y, or q->scale
 * (TENSOR). */
static float qm_scale(const beam_quant *q, const uint16_t *y, int n)
{
    float amax = 0.0f, s;
    int i;
    if (q->kind == BEAM_QUANT_FP8_TENSOR) return q->scale;
    for (i = 0; i < n; i++) {
        const float a = fabsf(qm_widen(y[i]));
        if (a > amax) amax = a; /* a NaN is never greater */
    }
    if (q->kind == BEAM_QUANT_FP8_GROUP) {
        s = (amax > 1e-10f ? amax : 1e-10f) / 448.0f;
        if (q->flags & BEAM_QUANT_UE8M0) s = qm_pow2ceil(s > 1e-10f ? s : 1e-10f);
    } else {
        s = amax / 448.0f;
        if (s < 1.0f / (448.0f * 512.0f)) s = 1.0f / (448.0f * 512.0f);
        if (q->flags & BEAM_QUANT_UE8M0) s = qm_pow2ceil(s);
    }
    return s;
}

/* ---- NVFP4 ------------------------------------------------------------------ */

/* E2M1's magnitudes, codes 0..7 */
static const double g_e2m1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

uint8_t qm_e2m1(float p)
{
    double a;
    int c, best = 0;
    if (isnan(p)) return 0x7; /* no NaN in E2M1: +6, whatever the sign */
    /* saturation: beyond 6 (infinity too) the nearest is 6 */
    a = fmin(fabs((double)p), 6.0);
    for (c = 1; c < 8; c++) {
        const double d = fabs(g_e2m1[c] - a), bd = fabs(g_e2m1[best] - a);
        /* a tie lies between two neighbours, one of them even */
        if (d < bd || (d == bd && (c & 1) == 0)) best = c;
    }
    return (uint8_t)(best | (signbit(p) ? 8 : 0));
}

uint8_t qm_nvfp4_scale(float m, float g)
{
    /* RN(1 / 6), as the text gives it; each product rounded to FP32 (the
     * harness is built with -ffp-contract=off) */
    const float c6 = 0x1.555556p-3f, mc = m * c6, sv = g * mc;
    return qm_e4m3(sv < 448.0f ? sv : 448.0f);
}

float qm_nvfp4_factor(uint8_t sf, float g)
{
    pthread_once(&g_once, qm_fill);
    /* RN(g * RN(1 / value)): the double reciprocal rounds to the FP32 one
     * (53 >= 2 * 24 + 2 bits), and the double product of two floats is
     * exact, so its rounding is the FP32 product's */
    if (!sf) return 0.0f;
    {
        const float r = (float)(1.0 / g_val[sf]);
        return (float)((double)g * (double)r);
    }
}

/* the byte of row t's block b in the tiled layout of n block scales a row
 * (include/beammoe.h): tiles of 128 rows x 4 scales, n / 4 of them along a
 * row, a row of tiles after another; in a tile, row t % 128 is row t % 32
 * of group (t % 128) / 32: 32 lines of 16 bytes, each line the 4 groups' 4
 * scales */
static int64_t qm_tiled(int64_t t, int64_t b, int64_t n)
{
    const int64_t tile = (t / 128) * (n / 4) + b / 4;
    const int64_t line = t % 32, group = (t % 128) / 32;
    return (tile * 32 + line) * 16 + group * 4 + b % 4;
}

int64_t qm_nvfp4_offset(int64_t t, int64_t b, int32_t H) { return qm_tiled(t, b, H / 16); }

/* NVFP4 rows 0..T: each block's largest magnitude from +0 (a NaN is never
 * greater), its scale code at its tiled place, its values' codes two a
 * byte */
static void qm_nvfp4(const beam_quant *q, const uint16_t *nrm, int64_t T, int32_t H, uint8_t *vals, void *scales)
{
    uint8_t *bsc = (uint8_t *)scales;
    int64_t t;
    int b, i;
    for (t = 0; t < T; t++)
        for (b = 0; b < H / 16; b++) {
            const uint16_t *y = nrm + t * H + (int64_t)b * 16;
            float m = 0.0f, os;
            uint8_t sf, c[16];
            for (i = 0; i < 16; i++) {
                const float a = fabsf(qm_widen(y[i]));
                if (a > m) m = a;
            }
            sf = qm_nvfp4_scale(m, q->scale);
            os = qm_nvfp4_factor(sf, q->scale);
            bsc[qm_tiled(t, b, H / 16)] = sf;
            for (i = 0; i < 16; i++) c[i] = qm_e2m1(qm_widen(y[i]) * os);
            for (i = 0; i < 8; i++) vals[t * (H / 2) + (int64_t)b * 8 + i] = (uint8_t)(c[2 * i] | (c[2 * i + 1] << 4));
        }
}

/* FP8 with FP32 scales (GROUP, TOKEN) or the caller's (TENSOR), rows
 * 0..T */
static void qm_fp8(const beam_quant *q, const uint16_t *nrm, int64_t T, int32_t H, uint8_t *vals, void *scale_array)
{
    const int n = q->kind == BEAM_QUANT_FP8_GROUP ? q->group_size : H;
    float *scales = (float *)scale_array;
    int64_t t;
    int g, i;
    for (t = 0; t < T; t++)
        for (g = 0; g < H / n; g++) {
            const uint16_t *y = nrm + t * H + (int64_t)g * n;
            const float s = qm_scale(q, y, n);
            if (q->kind == BEAM_QUANT_FP8_GROUP)
                scales[(q->flags & BEAM_QUANT_COL_MAJOR) ? g * q->scale_ld + t : t * (H / n) + g] = s;
            else if (q->kind == BEAM_QUANT_FP8_TOKEN)
                scales[t] = s;
            for (i = 0; i < n; i++) vals[t * H + (int64_t)g * n + i] = qm_e4m3(qm_widen(y[i]) / s);
        }
}

/* ---- MXFP8 ------------------------------------------------------------------ */

/* MXFP8 rows 0..T (docs/numerics.md#mxfp8), each group of 32 values as the
 * text gives it: absmax = max(1e-10, |x_i|) (a NaN is never greater), s the
 * smallest power of two 2^e >= max(the FP32 quotient absmax / 448, 1e-10)
 * (found by search over the exponents of the normal floats), the scale
 * code e + 127 at its tiled place, and each value's e4m3(clamp(x_i / s)) */
static void qm_mxfp8(const beam_quant *q, const uint16_t *nrm, int64_t T, int32_t H, uint8_t *vals, void *scales)
{
    uint8_t *bsc = (uint8_t *)scales;
    int64_t t;
    int g, i;
    (void)q;
    for (t = 0; t < T; t++)
        for (g = 0; g < H / 32; g++) {
            const uint16_t *y = nrm + t * H + (int64_t)g * 32;
            float amax = 1e-10f, quot, s = INFINITY;
            int e, code = 0xFF;
            for (i = 0; i < 32; i++) {
                const float a = fabsf(qm_widen(y[i]));
                if (a > amax) amax = a;
            }
            quot = amax / 448.0f;
            if (quot < 1e-10f) quot = 1e-10f;
            for (e = -126; e <= 127; e++)
                if (ldexpf(1.0f, e) >= quot) {
                    s = ldexpf(1.0f, e);
                    code = e + 127;
                    break;
                }
            bsc[qm_tiled(t, g, H / 32)] = (uint8_t)code;
            for (i = 0; i < 32; i++) vals[t * H + (int64_t)g * 32 + i] = qm_e4m3(qm_widen(y[i]) / s);
        }
}

/* ---- the table ---------------------------------------------------------------- */

typedef void qm_rows_fn(const beam_quant *q, const uint16_t *nrm, int64_t T, int32_t H, uint8_t *vals,
                        void *scales);

/* The kinds the model knows (quant_model.h: qm_name .. qm_global). */
static const struct qm_kind {
    int kind;
    const char *name; /* qm_name */
    const char *tag;  /* qm_label's start */
    int bits, block, pow2, global;
    qm_rows_fn *rows;
} g_kinds[] = {
    {BEAM_QUANT_FP8_GROUP, "fp8", "group", 8, 0, 0, 0, qm_fp8},
    {BEAM_QUANT_FP8_TOKEN, "fp8", "token", 8, 0, 0, 0, qm_fp8},
    {BEAM_QUANT_FP8_TENSOR, "fp8", "tensor", 8, 0, 0, 0, qm_fp8},
    {BEAM_QUANT_NVFP4, "nvfp4", "nvfp4", 4, 16, 0, 1, qm_nvfp4},
    {BEAM_QUANT_MXFP8, "mxfp8", "mxfp8", 8, 32, 1, 0, qm_mxfp8},
};

static const struct qm_kind *qm_kind_of(const beam_quant *q)
{
    static const struct qm_kind none = {0, "?", "?", 8, 0, 0, 0, NULL};
    size_t i;
    for (i = 0; i < sizeof g_kinds / sizeof g_kinds[0]; i++)
        if (g_kinds[i].kind == (int)q->kind) return &g_kinds[i];
    return &none;
}

/* The forms the tests run (quant_model.h: qm_forms); a column-major one's
 * scale_ld is set for T */
static const beam_quant g_forms[] = {
    {BEAM_QUANT_FP8_GROUP, 128, 0, 0.0f, NULL, NULL, 0, NULL},
    {BEAM_QUANT_FP8_GROUP, 64, BEAM_QUANT_UE8M0 | BEAM_QUANT_COL_MAJOR, 0.0f, NULL, NULL, 0, NULL},
    {BEAM_QUANT_FP8_TOKEN, 0, 0, 0.0f, NULL, NULL, 0, NULL},
    {BEAM_QUANT_FP8_TOKEN, 0, BEAM_QUANT_UE8M0, 0.0f, NULL, NULL, 0, NULL},
    {BEAM_QUANT_FP8_TENSOR, 0, 0, 0.0125f, NULL, NULL, 0, NULL},
    {BEAM_QUANT_NVFP4, 16, 0, 672.0f, NULL, NULL, 0, NULL},
    {BEAM_QUANT_NVFP4, 16, 0, 1.0f, NULL, NULL, 0, NULL},
    {BEAM_QUANT_MXFP8, 32, 0, 0.0f, NULL, NULL, 0, NULL},
};
typedef char qm_forms_count[sizeof g_forms / sizeof g_forms[0] == QM_NFORMS ? 1 : -1];

void qm_quant(const beam_quant *q, const uint16_t *nrm, int64_t T, int32_t H, uint8_t *vals, void *scales)
{
    const struct qm_kind *k = qm_kind_of(q);
    if (k->rows) k->rows(q, nrm, T, H, vals, scales);
}

const char *qm_name(const beam_quant *q) { return qm_kind_of(q)->name; }
int qm_bits(const beam_quant *q) { return qm_kind_of(q)->bits; }
int qm_block(const beam_quant *q) { return qm_kind_of(q)->block; }
int qm_global(const beam_quant *q) { return qm_kind_of(q)->global; }

int qm_pow2(const beam_quant *q) { return qm_kind_of(q)->pow2 || (q->flags & BEAM_QUANT_UE8M0) != 0; }

int qm_group(const beam_quant *q, int32_t H)
{
    if (qm_block(q)) return qm_block(q);
    return q->kind == BEAM_QUANT_FP8_GROUP ? q->group_size : H;
}

void qm_label(const beam_quant *q, char *buf, size_t n)
{
    snprintf(buf, n, "%s", qm_kind_of(q)->tag);
    if (q->kind == BEAM_QUANT_FP8_GROUP) snprintf(buf + strlen(buf), n - strlen(buf), "%d", (int)q->group_size);
    if (q->flags & BEAM_QUANT_UE8M0) snprintf(buf + strlen(buf), n - strlen(buf), "-ue8m0");
    if (q->flags & BEAM_QUANT_COL_MAJOR) snprintf(buf + strlen(buf), n - strlen(buf), "-col");
    if (qm_global(q)) snprintf(buf + strlen(buf), n - strlen(buf), "-g%g", (double)q->scale);
}

size_t qm_values_bytes(const beam_quant *q, int64_t T, int32_t H)
{
    return (size_t)T * (size_t)H * (size_t)qm_bits(q) / 8;
}

size_t qm_block_bytes(const beam_quant *q, int64_t T, int32_t H)
{
    /* whole tiles: T rounded up to 128 rows of H / block bytes */
    const int b = qm_block(q);
    return b ? (size_t)((T + 127) / 128 * 128) * (size_t)(H / b) : 0;
}

int64_t qm_block_offset(const beam_quant *q, int64_t t, int64_t b, int32_t H)
{
    return qm_block(q) ? qm_tiled(t, b, H / qm_block(q)) : 0;
}

size_t qm_scale_floats(const beam_quant *q, int64_t T, int32_t H)
{
    if (qm_block(q)) return qm_block_bytes(q, T, H) / 4;
    if (q->kind == BEAM_QUANT_FP8_TOKEN) return (size_t)T;
    if (q->kind != BEAM_QUANT_FP8_GROUP) return 0;
    if (q->flags & BEAM_QUANT_COL_MAJOR) return (size_t)(H / q->group_size) * (size_t)q->scale_ld;
    return (size_t)T * (size_t)(H / q->group_size);
}

void qm_forms(beam_quant *q, int64_t T)
{
    int f;
    memcpy(q, g_forms, sizeof g_forms);
    for (f = 0; f < QM_NFORMS; f++)
        if (q[f].flags & BEAM_QUANT_COL_MAJOR) q[f].scale_ld = (T + 3) / 4 * 4;
}

int qm_form_of(beam_quant *q, int kind, int64_t T)
{
    beam_quant all[QM_NFORMS];
    int f;
    qm_forms(all, T);
    for (f = 0; f < QM_NFORMS; f++)
        if ((int)all[f].kind == kind) {
            *q = all[f];
            return 1;
        }
    memset(q, 0, sizeof *q);
    return 0;
}

void qm_bind(beam_quant *q, uint8_t *values, float *scales)
{
    q->values = values;
    q->scales = NULL;
    q->block_scales = NULL;
    if (qm_block(q))
        q->block_scales = (uint8_t *)scales;
    else if (q->kind != BEAM_QUANT_FP8_TENSOR)
        q->scales = scales;
}
