/*
 * quant_model.c - the harness's model of docs/numerics.md#fp8 and #nvfp4
 * (quant_model.h).
 */
#include <math.h>
#include <pthread.h>
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

float qm_scale(const beam_quant *q, const uint16_t *y, int n)
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

int64_t qm_nvfp4_offset(int64_t t, int64_t b, int32_t H)
{
    /* tiles of 128 rows x 4 scales, (H / 16) / 4 = H / 64 of them along a
     * row, a row of tiles after another; in a tile, row t % 128 is row
     * t % 32 of group (t % 128) / 32: 32 lines of 16 bytes, each line the
     * 4 groups' 4 scales */
    const int64_t tile = (t / 128) * (H / 64) + b / 4;
    const int64_t line = t % 32, group = (t % 128) / 32;
    return (tile * 32 + line) * 16 + group * 4 + b % 4;
}

/* NVFP4 rows 0..T: each block's largest magnitude from +0 (a NaN is never
 * greater), its scale code at its tiled place, its values' codes two a
 * byte */
static void qm_nvfp4(const beam_quant *q, const uint16_t *nrm, int64_t T, int32_t H, uint8_t *vals,
                     uint8_t *bsc)
{
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
            bsc[qm_nvfp4_offset(t, b, H)] = sf;
            for (i = 0; i < 16; i++) c[i] = qm_e2m1(qm_widen(y[i]) * os);
            for (i = 0; i < 8; i++) vals[t * (H / 2) + (int64_t)b * 8 + i] = (uint8_t)(c[2 * i] | (c[2 * i + 1] << 4));
        }
}

void qm_quant(const beam_quant *q, const uint16_t *nrm, int64_t T, int32_t H, uint8_t *vals, void *scale_array)
{
    const int n = q->kind == BEAM_QUANT_FP8_GROUP ? q->group_size : H;
    float *scales = (float *)scale_array;
    int64_t t;
    int g, i;
    if (q->kind == BEAM_QUANT_NVFP4) {
        qm_nvfp4(q, nrm, T, H, vals, (uint8_t *)scale_array);
        return;
    }
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

size_t qm_values_bytes(const beam_quant *q, int64_t T, int32_t H)
{
    return (size_t)T * (size_t)H / (q->kind == BEAM_QUANT_NVFP4 ? 2 : 1);
}

size_t qm_scale_floats(const beam_quant *q, int64_t T, int32_t H)
{
    /* whole tiles: (T rounded up to 128) * H / 16 bytes, 512 a tile */
    if (q->kind == BEAM_QUANT_NVFP4) return (size_t)((T + 127) / 128) * (size_t)(H / 64) * 128;
    if (q->kind == BEAM_QUANT_FP8_TOKEN) return (size_t)T;
    if (q->kind != BEAM_QUANT_FP8_GROUP) return 0;
    if (q->flags & BEAM_QUANT_COL_MAJOR) return (size_t)(H / q->group_size) * (size_t)q->scale_ld;
    return (size_t)T * (size_t)(H / q->group_size);
}

void qm_forms(beam_quant *q, int64_t T)
{
    memset(q, 0, QM_NFORMS * sizeof *q);
    q[0].kind = BEAM_QUANT_FP8_GROUP;
    q[0].group_size = 128;
    q[1].kind = BEAM_QUANT_FP8_GROUP;
    q[1].group_size = 64;
    q[1].flags = BEAM_QUANT_UE8M0 | BEAM_QUANT_COL_MAJOR;
    q[1].scale_ld = (T + 3) / 4 * 4;
    q[2].kind = BEAM_QUANT_FP8_TOKEN;
    q[3].kind = BEAM_QUANT_FP8_TOKEN;
    q[3].flags = BEAM_QUANT_UE8M0;
    q[4].kind = BEAM_QUANT_FP8_TENSOR;
    q[4].scale = 0.0125f;
    q[5].kind = BEAM_QUANT_NVFP4;
    q[5].group_size = 16;
    q[5].scale = 672.0f;
    q[6].kind = BEAM_QUANT_NVFP4;
    q[6].group_size = 16;
    q[6].scale = 1.0f;
}

void qm_bind(beam_quant *q, uint8_t *values, float *scales)
{
    q->values = values;
    q->scales = NULL;
    q->block_scales = NULL;
    if (q->kind == BEAM_QUANT_NVFP4)
        q->block_scales = (uint8_t *)scales;
    else if (q->kind != BEAM_QUANT_FP8_TENSOR)
        q->scales = scales;
}
