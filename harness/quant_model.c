/*
 * quant_model.c - the harness's model of docs/numerics.md#fp8 (quant_model.h).
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

void qm_quant(const beam_quant *q, const uint16_t *nrm, int64_t T, int32_t H, uint8_t *vals, float *scales)
{
    const int n = q->kind == BEAM_QUANT_FP8_GROUP ? q->group_size : H;
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

size_t qm_scale_floats(const beam_quant *q, int64_t T, int32_t H)
{
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
}
