/*
 * naive_ref.c - docs/numerics.md, one element at a time.
 *
 * Each function mirrors a block of that text line by line; the comments
 * quote the rule they implement. Bit casts go through memcpy (no unions, no
 * pointer punning). Scratch rows are malloc'ed per call: speed does not
 * matter here, obviousness does.
 */
#include "naive_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int64_t *nr_ties = NULL;

static uint32_t bits_of(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* "for the FP32 bits u of a non-NaN v it is (u + 0x7FFF + ((u >> 16) & 1))
 * >> 16 (overflow becomes infinity by itself); every NaN becomes 0x7FFF." */
uint16_t nr_bf16(float v)
{
    uint32_t u;
    if (v != v)
        return 0x7FFF;
    u = bits_of(v);
    if (nr_ties && (u & 0xFFFFu) == 0x8000u)
        ++*nr_ties;
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* "f(b) widens BF16 to FP32 exactly." */
float nr_f(uint16_t b)
{
    return float_of((uint32_t)b << 16);
}

static void *xmalloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    if (!p)
        abort(); /* test code: out of memory is fatal */
    return p;
}

/* y[0..H) = N(v, w, eps) for one row of FP32 values v[0..H). H % 8 == 0. */
static void nr_rmsnorm_row(const float *v, int32_t H, const uint16_t *w, float eps, uint16_t *y)
{
    int32_t C = H / 8, N2 = 1, c, s, h;
    float *P, ms, inv;

    /* N2 = smallest power of two >= C */
    while (N2 < C)
        N2 *= 2;
    P = (float *)xmalloc(sizeof(float) * (size_t)N2);

    /* P[c] = (((((((q[8c] + q[8c+1]) + q[8c+2]) + ... ) + q[8c+7],
     * q[h] = v[h] * v[h] */
    for (c = 0; c < C; c++) {
        float acc = v[8 * c] * v[8 * c];
        int j;
        for (j = 1; j < 8; j++) {
            float q = v[8 * c + j] * v[8 * c + j];
            acc = acc + q;
        }
        P[c] = acc;
    }
    /* P[c] = +0 for C <= c < N2 */
    for (c = C; c < N2; c++)
        P[c] = 0.0f;
    /* for s = N2/2, ..., 1: P[c] = P[c] + P[c+s] for every c < s */
    for (s = N2 / 2; s >= 1; s /= 2)
        for (c = 0; c < s; c++)
            P[c] = P[c] + P[c + s];

    /* ms = P[0] / (float)H; inv = 1 / sqrt(ms + eps) */
    ms = P[0] / (float)H;
    {
        float d = ms + eps;
        float r = sqrtf(d);
        inv = 1.0f / r;
    }
    free(P);

    /* u[h] = bf16(v[h] * inv); y[h] = w ? bf16(f(u[h]) * f(w[h])) : u[h] */
    for (h = 0; h < H; h++) {
        float p = v[h] * inv;
        uint16_t u = nr_bf16(p);
        if (w) {
            float pw = nr_f(u) * nr_f(w[h]);
            y[h] = nr_bf16(pw);
        } else {
            y[h] = u;
        }
    }
}

/* out = n on ? N(f(in), n's weight, n's eps) : in, for a BF16 row of H. */
static void norm_row(const uint16_t *in, int32_t H, const nr_norm *n, uint16_t *out)
{
    float *fv;
    int32_t h;
    if (!n || !n->on) {
        for (h = 0; h < H; h++)
            out[h] = in[h];
        return;
    }
    fv = (float *)xmalloc(sizeof(float) * (size_t)H);
    for (h = 0; h < H; h++)
        fv[h] = nr_f(in[h]);
    nr_rmsnorm_row(fv, H, n->weight, n->eps, out);
    free(fv);
}

/* One row of finalize: xr is [K, H], wr is [K]; out is [H]. */
static void finalize_row(const uint16_t *xr, const float *wr, int32_t K,
                         int32_t H, float routed_scale, const nr_norm *post,
                         uint16_t *out)
{
    uint16_t *s = (uint16_t *)xmalloc(sizeof(uint16_t) * (size_t)H);
    int32_t h, k;

    for (h = 0; h < H; h++) {
        /* a = +0.0; for k: a = a + (w[t][k] * f(x[t][k][h])) */
        float a = 0.0f;
        uint16_t r;
        for (k = 0; k < K; k++) {
            float prod = wr[k] * nr_f(xr[(size_t)k * (size_t)H + (size_t)h]);
            a = a + prod;
        }
        /* r = bf16(a); s = bf16(f(r) * routed_scale) */
        r = nr_bf16(a);
        s[h] = nr_bf16(nr_f(r) * routed_scale);
    }
    /* out = post_norm ? N(f(s), post_weight, post_eps) : s */
    norm_row(s, H, post, out);
    free(s);
}

void nr_finalize(const uint16_t *x, const float *wts, int64_t live, int32_t K,
                 int32_t H, float routed_scale, const nr_norm *post,
                 uint16_t *out)
{
    int64_t t;
    for (t = 0; t < live; t++)
        finalize_row(x + (size_t)t * (size_t)K * (size_t)H,
                     wts + (size_t)t * (size_t)K, K, H, routed_scale, post,
                     out + (size_t)t * (size_t)H);
}

/* One row of norm_residual_norm. hid may equal res: every element of res is
 * read into br before anything is stored. */
static void nrn_row(const uint16_t *xr, const uint16_t *res, int32_t H,
                    const nr_norm *pre, const float *scales,
                    const nr_norm *next, uint16_t *hid, uint16_t *nrm)
{
    uint16_t *xp = (uint16_t *)xmalloc(sizeof(uint16_t) * (size_t)H);
    uint16_t *br = (uint16_t *)xmalloc(sizeof(uint16_t) * (size_t)H);
    uint16_t *out = (uint16_t *)xmalloc(sizeof(uint16_t) * (size_t)H);
    int32_t h;

    /* x' = pre_norm ? N(f(x), pre_weight, pre_eps) : x */
    norm_row(xr, H, pre, xp);
    for (h = 0; h < H; h++) {
        /* bx = scales ? bf16(f(x') * scales[0]) : x'
         * br = scales ? bf16(f(residual) * scales[1]) : residual */
        uint16_t bx = scales ? nr_bf16(nr_f(xp[h]) * scales[0]) : xp[h];
        br[h] = scales ? nr_bf16(nr_f(res[h]) * scales[1]) : res[h];
        /* hidden = bf16(f(bx) + f(br)) */
        out[h] = nr_bf16(nr_f(bx) + nr_f(br[h]));
    }
    for (h = 0; h < H; h++)
        hid[h] = out[h];
    /* normalized = next_norm ? N(f(hidden), next_weight, next_eps) */
    if (next && next->on)
        norm_row(out, H, next, nrm);
    free(out);
    free(br);
    free(xp);
}

void nr_norm_residual_norm(const uint16_t *x, const uint16_t *residual,
                           int64_t T, int32_t H, const nr_norm *pre,
                           const float *scales, const nr_norm *next,
                           uint16_t *hidden, uint16_t *normalized)
{
    int64_t t;
    for (t = 0; t < T; t++) {
        size_t o = (size_t)t * (size_t)H;
        nrn_row(x + o, residual + o, H, pre, scales, next, hidden + o,
                (next && next->on) ? normalized + o : NULL);
    }
}

void nr_finalize_norm_residual_norm(const uint16_t *x, const float *wts,
                                    int64_t live, int32_t K, int32_t H,
                                    float routed_scale, const nr_norm *post,
                                    const uint16_t *residual,
                                    const float *scales, const nr_norm *next,
                                    uint16_t *hidden, uint16_t *normalized)
{
    uint16_t *fin = (uint16_t *)xmalloc(sizeof(uint16_t) * (size_t)H);
    int64_t t;
    /* "norm_residual_norm(finalize(...), residual) with no pre-norm" */
    for (t = 0; t < live; t++) {
        size_t o = (size_t)t * (size_t)H;
        finalize_row(x + (size_t)t * (size_t)K * (size_t)H,
                     wts + (size_t)t * (size_t)K, K, H, routed_scale, post,
                     fin);
        nrn_row(fin, residual + o, H, NULL, scales, next, hidden + o,
                (next && next->on) ? normalized + o : NULL);
    }
    free(fin);
}

void nr_gather(const uint16_t *const *rank_x, const float *const *rank_w,
               int32_t R, int64_t T, int32_t K, int32_t H, float routed_scale,
               const nr_norm *post, const uint16_t *residual,
               const float *scales, const nr_norm *next, uint16_t *hidden,
               uint16_t *normalized)
{
    /* L = ceil(T / R); global row t lives on rank t / L, local row t % L */
    int64_t L = (T + R - 1) / R;
    uint16_t *fin = (uint16_t *)xmalloc(sizeof(uint16_t) * (size_t)H);
    int64_t t;
    for (t = 0; t < T; t++) {
        int64_t r = t / L, i = t - r * L;
        size_t o = (size_t)t * (size_t)H;
        finalize_row(rank_x[r] + (size_t)i * (size_t)K * (size_t)H,
                     rank_w[r] + (size_t)i * (size_t)K, K, H, routed_scale,
                     post, fin);
        nrn_row(fin, residual + o, H, NULL, scales, next, hidden + o,
                (next && next->on) ? normalized + o : NULL);
    }
    free(fin);
}

void nr_allreduce(const uint16_t *const *rank_p, const uint16_t *const *rank_x,
                  const float *weights, int32_t R, int64_t T, int32_t K,
                  int32_t H, float routed_scale, const nr_norm *norm,
                  const uint16_t *residual, const float *scales,
                  const nr_norm *next, uint16_t *hidden,
                  uint16_t *normalized)
{
    uint16_t *part = (uint16_t *)xmalloc(sizeof(uint16_t) * (size_t)H);
    uint16_t *sum = (uint16_t *)xmalloc(sizeof(uint16_t) * (size_t)H);
    float *acc = (float *)xmalloc(sizeof(float) * (size_t)H);
    nr_norm off = {0, NULL, 0.0f};
    int64_t t;
    int32_t r, h;
    for (t = 0; t < T; t++) {
        size_t o = (size_t)t * (size_t)H;
        for (r = 0; r < R; r++) {
            /* rank r's partial of row t: its rows, or its slots' finalize
             * without the post-norm */
            const uint16_t *p = part;
            if (rank_p)
                p = rank_p[r] + o;
            else
                finalize_row(rank_x[r] + o * (size_t)K, weights + (size_t)t * (size_t)K,
                             K, H, routed_scale, &off, part);
            /* the sum starts from rank 0's value, not from +0 */
            for (h = 0; h < H; h++) acc[h] = r == 0 ? nr_f(p[h]) : acc[h] + nr_f(p[h]);
        }
        for (h = 0; h < H; h++) sum[h] = nr_bf16(acc[h]);
        nrn_row(sum, residual + o, H, norm, scales, next, hidden + o,
                (next && next->on) ? normalized + o : NULL);
    }
    free(part);
    free(sum);
    free(acc);
}
