/*
 * case.c - make a case, run it through the reference and the library
 * (see case.h).
 */
#include "case.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devmem.h"

const char *hc_op_name(hc_op op)
{
    return op == HC_FINALIZE ? "finalize" : op == HC_NRN ? "nrn" : "fused";
}

const char *hc_mode_name(hc_mode m)
{
    static const char *n[HC_MODE_COUNT] = {"normal", "nan",  "inf",  "zero",
                                           "subnormal", "ties", "huge", "mixed"};
    return (m >= 0 && m < HC_MODE_COUNT) ? n[m] : "?";
}

static nr_norm make_norm(int choice, const uint16_t *w, float eps)
{
    nr_norm n;
    n.on = choice != HC_NORM_OFF;
    n.weight = choice == HC_NORM_WEIGHT ? w : NULL;
    n.eps = eps;
    return n;
}

/* ---- the suite's generator ---- */

hc_spec hc_sweep_spec(int i)
{
    static const int32_t KS[5] = {1, 2, 6, 8, 32};
    static const int32_t HS[5] = {256, 2048, 4096, 7168, 8192};
    static const int64_t TS[4] = {0, 1, 7, 100};
    hc_spec s;
    memset(&s, 0, sizeof s);
    s.K = KS[i % 5];
    s.H = HS[(i / 5) % 5];
    s.T = TS[(i / 25) % 4];
    s.pad = i % 3; /* 0, 1 or 2 NaN rows past the live ones */
    s.post = i % 3;
    s.next = (i / 3) % 3;
    s.pre = (i / 2 + 1) % 3;
    s.scales = (i / 4) % 2;
    s.rs_one = (i / 5) % 2;
    s.inplace = (i / 7 + i) % 2;
    s.misalign = (i % 4) == 3;
    s.exotic = (i % 6) == 5;
    return s;
}

static uint16_t *norm_weight(hu_rng *r, int choice, int32_t H)
{
    uint16_t *w;
    int32_t h;
    if (choice != HC_NORM_WEIGHT)
        return NULL;
    w = (uint16_t *)hu_alloc(sizeof(uint16_t) * (size_t)H, 0);
    for (h = 0; h < H; h++)
        w[h] = hu_rand_norm_weight(r);
    return w;
}

void hc_make(hc_case *c, const hc_spec *s, uint64_t seed)
{
    hu_rng r;
    size_t KH = (size_t)s->K * (size_t)s->H;
    size_t TH = (size_t)s->T * (size_t)s->H;
    size_t pad = (size_t)s->pad * (size_t)s->H;
    static const float eps_choices[4] = {1e-6f, 1e-5f, 0.0f, 1e-3f};

    memset(c, 0, sizeof *c);
    c->s = *s;
    c->cap = s->T + s->pad;
    hu_rng_init(&r, seed);

    c->experts = (uint16_t *)hu_alloc(sizeof(uint16_t) * KH * (size_t)c->cap, 0);
    c->weights = (float *)hu_alloc(sizeof(float) * (size_t)s->K * (size_t)c->cap, 0);
    hu_fill_bf16(&r, c->experts, KH * (size_t)s->T);
    hu_fill_weight(&r, c->weights, (size_t)s->K * (size_t)s->T);
    /* padding rows: must never be read */
    hu_fill_bf16_nan(c->experts + KH * (size_t)s->T, KH * (size_t)s->pad);
    hu_fill_f32_nan(c->weights + (size_t)s->K * (size_t)s->T, (size_t)s->K * (size_t)s->pad);

    c->x = (uint16_t *)hu_alloc(sizeof(uint16_t) * (TH + pad), 0);
    c->residual = (uint16_t *)hu_alloc(sizeof(uint16_t) * (TH + pad), 0);
    hu_fill_bf16(&r, c->x, TH);
    hu_fill_bf16(&r, c->residual, TH);
    hu_fill_bf16_nan(c->x + TH, pad);
    hu_fill_bf16_nan(c->residual + TH, pad);
    if (s->exotic) {
        /* finite oddities everywhere; one row-killing value (inf, NaN, max)
         * in one row of each array, so the other rows stay meaningful */
        hu_sprinkle_exotic(&r, c->experts, KH * (size_t)s->T, 31);
        hu_sprinkle_exotic_weights(&r, c->weights, (size_t)s->K * (size_t)s->T, 31);
        hu_sprinkle_exotic(&r, c->x, TH, 31);
        hu_sprinkle_exotic(&r, c->residual, TH, 31);
        if (s->T > 0) {
            /* position, then value, each draw its own statement: in
             * a[draw()] = draw() the compiler picks the order (GCC and
             * clang differ), and the golden digests need one order */
            int64_t t = s->T / 2;
            size_t at = (size_t)t * KH + hu_below(&r, (uint32_t)KH);
            c->experts[at] = hu_rand_killer(&r);
            at = (size_t)(s->T - 1) * (size_t)s->H + hu_below(&r, (uint32_t)s->H);
            c->x[at] = hu_rand_killer(&r);
            at = hu_below(&r, (uint32_t)s->H);
            c->residual[at] = hu_rand_killer(&r);
        }
    }

    c->wpost = norm_weight(&r, s->post, s->H);
    c->wpre = norm_weight(&r, s->pre, s->H);
    c->wnext = norm_weight(&r, s->next, s->H);
    c->post = make_norm(s->post, c->wpost, eps_choices[hu_below(&r, 4)]);
    c->pre = make_norm(s->pre, c->wpre, eps_choices[hu_below(&r, 4)]);
    c->next = make_norm(s->next, c->wnext, eps_choices[hu_below(&r, 4)]);
    c->scales[0] = hu_rand_scale(&r);
    c->scales[1] = hu_rand_scale(&r);
    c->rs = s->rs_one ? 1.0f : hu_rand_scale(&r);
}

void hc_make_gather(hc_case *c, const hc_spec *s, int R, uint64_t seed)
{
    hc_spec g = *s;
    g.pad = R * ((s->T + R - 1) / R) - s->T + s->pad;
    hc_make(c, &g, seed);
}

void hc_gather_ref(const hc_case *c, int R, int64_t T, uint16_t *hidden, uint16_t *normalized)
{
    const int64_t L = (T + R - 1) / R;
    const uint16_t **x = (const uint16_t **)hu_alloc(sizeof *x * (size_t)R, 0);
    const float **w = (const float **)hu_alloc(sizeof *w * (size_t)R, 0);
    int r;
    for (r = 0; r < R; r++) {
        x[r] = c->experts + (size_t)(r * L) * (size_t)c->s.K * (size_t)c->s.H;
        w[r] = c->weights + (size_t)(r * L) * (size_t)c->s.K;
    }
    nr_gather(x, w, R, T, c->s.K, c->s.H, c->rs, &c->post, c->residual, c->s.scales ? c->scales : NULL,
              &c->next, hidden, normalized);
    hu_free((void *)x);
    hu_free((void *)w);
}

/* ---- the tool's generator ---- */

/* Two draws in one expression (a[draw()] = draw(), draw() * draw()) run in
 * an order the compiler picks: GCC and clang differ. Every draw below is its
 * own statement, in the order GCC took, so a seed gives the same inputs from
 * every compiler and the same as before. */
static uint16_t bf_uniform(hu_rng *r, float lo, float hi)
{
    return nr_bf16(hu_uniform(r, lo, hi));
}

static uint16_t pick(hu_rng *r, const uint16_t *set, uint32_t n)
{
    return set[hu_below_scaled(r, n)];
}

static float rng_sign(hu_rng *r)
{
    return hu_below_scaled(r, 2) ? -1.0f : 1.0f;
}

static uint16_t bf_signed_uniform(hu_rng *r, float lo, float hi)
{
    const float sign = rng_sign(r);
    return nr_bf16(sign * hu_uniform(r, lo, hi));
}

static const uint16_t nan_set[] = {0x7FC0, 0xFFC0, 0x7F81, 0xFFFF, 0x7FFF};
static const uint16_t inf_set[] = {0x7F80, 0xFF80};

/* sign * (1 + m/128) * 2^e: few significant bits, so sums and products of
 * such values often fall exactly halfway between two BF16 values. */
static uint16_t bf_tie_value(hu_rng *r, int emin, int emax)
{
    uint16_t sign = (uint16_t)(hu_below_scaled(r, 2) << 15);
    int e = emin + (int)hu_below_scaled(r, (uint32_t)(emax - emin + 1));
    uint16_t m = (uint16_t)hu_below_scaled(r, 4);
    return (uint16_t)(sign | ((uint16_t)(127 + e) << 7) | m);
}

static uint16_t bf_subnormal(hu_rng *r)
{
    uint16_t sign = (uint16_t)(hu_below_scaled(r, 2) << 15);
    if (hu_below_scaled(r, 10) < 7) return (uint16_t)(sign | (1 + hu_below_scaled(r, 127)));
    return (uint16_t)(sign | (0x0080 + hu_below_scaled(r, 0x80))); /* smallest normals */
}

static uint16_t bf_huge(hu_rng *r)
{
    uint16_t sign = (uint16_t)(hu_below_scaled(r, 2) << 15);
    return (uint16_t)(sign | (0x7F7F - hu_below_scaled(r, 8)));
}

/* Put a value of set at `count` random positions of a[0..n). */
static void sprinkle(hu_rng *r, uint16_t *a, size_t n, int count, const uint16_t *set,
                     uint32_t nset)
{
    int i;
    if (!a || n == 0) return;
    for (i = 0; i < count; i++) {
        size_t at = (size_t)(hu_unit(r) * (double)n); /* position, then value */
        a[at] = pick(r, set, nset);
    }
}

/* Fill one live row t of every input with the pattern of mode g. */
static void gen_row(hc_case *c, int64_t t, hc_mode g, hu_rng *r)
{
    size_t K = (size_t)(c->s.K > 0 ? c->s.K : 0), H = (size_t)(c->s.H > 0 ? c->s.H : 0), i;
    uint16_t *e = c->experts ? c->experts + (size_t)t * K * H : NULL;
    float *w = c->weights ? c->weights + (size_t)t * K : NULL;
    uint16_t *x = c->x ? c->x + (size_t)t * H : NULL;
    uint16_t *res = c->residual ? c->residual + (size_t)t * H : NULL;
    size_t ne = e ? K * H : 0, nh = H;

    /* the moderate base every mode starts from */
    for (i = 0; i < ne; i++) e[i] = bf_uniform(r, -3.0f, 3.0f);
    if (w)
        for (i = 0; i < K; i++) w[i] = hu_uniform(r, 0.0f, 1.0f);
    if (x)
        for (i = 0; i < nh; i++) x[i] = bf_uniform(r, -3.0f, 3.0f);
    if (res)
        for (i = 0; i < nh; i++) res[i] = bf_uniform(r, -10.0f, 10.0f);

    switch (g) {
    case HC_MODE_NORMAL:
    case HC_MODE_MIXED:
    case HC_MODE_COUNT:
        break;
    case HC_MODE_NAN:
    case HC_MODE_INF: {
        /* Half the rows stay clean, so the norms (which spread one NaN over
         * a whole row) leave rows to compare; the other half get the value
         * in one kind of input only. */
        const uint16_t *set = g == HC_MODE_NAN ? nan_set : inf_set;
        uint32_t nset = g == HC_MODE_NAN ? 5 : 2;
        if (hu_below_scaled(r, 2)) break;
        switch (hu_below_scaled(r, 4)) {
        case 0:
            sprinkle(r, e, ne, 1 + (int)hu_below_scaled(r, 3), set, nset);
            break;
        case 1:
            if (w) {
                /* value, then position: the order GCC builds always took */
                const float v = g == HC_MODE_NAN ? NAN : hu_below_scaled(r, 2) ? INFINITY : -INFINITY;
                w[hu_below_scaled(r, (uint32_t)K)] = v;
                /* and a zero weight against an inf element: 0 * inf */
                if (g == HC_MODE_INF && e && K > 1) {
                    const uint16_t inf = pick(r, inf_set, 2); /* value, then position */
                    w[0] = 0.0f;
                    e[hu_below_scaled(r, (uint32_t)H)] = inf;
                }
            }
            break;
        case 2:
            sprinkle(r, res, res ? nh : 0, 1, set, nset);
            break;
        default:
            if (x)
                sprinkle(r, x, nh, 1, set, nset);
            else
                sprinkle(r, e, ne, 1, set, nset);
            break;
        }
        break;
    }
    case HC_MODE_ZERO: {
        static const float wz[] = {0.0f, -0.0f, 0.5f, -0.5f};
        for (i = 0; i < ne; i++) e[i] = (uint16_t)(hu_below_scaled(r, 2) << 15);
        if (w)
            for (i = 0; i < K; i++) w[i] = wz[hu_below_scaled(r, 4)];
        if (x)
            for (i = 0; i < nh; i++) x[i] = (uint16_t)(hu_below_scaled(r, 2) << 15);
        if (res)
            for (i = 0; i < nh; i++) res[i] = (uint16_t)(hu_below_scaled(r, 2) << 15);
        break;
    }
    case HC_MODE_SUBNORMAL:
        for (i = 0; i < ne; i++) e[i] = bf_subnormal(r);
        if (w)
            for (i = 0; i < K; i++)
                if (hu_below_scaled(r, 2)) w[i] = hu_f32(1 + hu_below_scaled(r, 0x7FFFFF));
        if (x)
            for (i = 0; i < nh; i++) x[i] = bf_subnormal(r);
        if (res)
            for (i = 0; i < nh; i++) res[i] = bf_subnormal(r);
        break;
    case HC_MODE_TIES:
        for (i = 0; i < ne; i++) e[i] = bf_tie_value(r, -9, 0);
        if (w)
            for (i = 0; i < K; i++) {
                const float sign = rng_sign(r);
                w[i] = sign * ldexpf(1.0f, (int)hu_below_scaled(r, 4) - 2);
            }
        if (x)
            for (i = 0; i < nh; i++) x[i] = bf_tie_value(r, -9, 0);
        if (res)
            for (i = 0; i < nh; i++) res[i] = bf_tie_value(r, -9, 2);
        break;
    case HC_MODE_HUGE: {
        /* one of three overflows per row: squares past FLT_MAX (the norm's
         * mean becomes inf, its inverse 0), a sum or product past the BF16
         * maximum (rounds to inf), an add of two near-maximum values */
        uint32_t v = hu_below_scaled(r, 3);
        if (v == 0) {
            for (i = 0; i < ne; i++)
                e[i] = bf_signed_uniform(r, 1e19f, 1e20f);
            if (x)
                for (i = 0; i < nh; i++)
                    x[i] = bf_signed_uniform(r, 1e19f, 1e20f);
        } else if (v == 1) {
            if (w)
                for (i = 0; i < K; i++) w[i] = hu_uniform(r, 0.6f, 1.4f);
            for (i = 0; i < 3 && ne; i++) {
                size_t at = (size_t)(hu_unit(r) * (double)ne);
                e[at] = bf_huge(r);
            }
            for (i = 0; i < 3 && x; i++) {
                size_t at = (size_t)(hu_unit(r) * (double)nh);
                x[at] = bf_huge(r);
            }
        } else {
            for (i = 0; i < 3 && res; i++) {
                size_t at = (size_t)(hu_unit(r) * (double)nh);
                res[at] = (uint16_t)(bf_huge(r) & 0x7FFF);
                if (x) x[at] = (uint16_t)(bf_huge(r) & 0x7FFF);
            }
        }
        break;
    }
    }
}

/* In corner-case modes a few columns get odd weights too: zeros, a
 * subnormal, a negative one; the last norm (next) also inf and BF16 max.
 * No inf or huge weight before the last norm: one such column reaches every
 * row's next norm and leaves nothing but NaN and zeros to compare. */
static void gen_norm_weight(uint16_t *nw, int32_t H, hc_mode g, int last, hu_rng *r)
{
    static const uint16_t odd[] = {0x0000, 0x8000, 0x0001, 0xBF80, 0x7F80, 0x7F7F};
    int32_t h;
    for (h = 0; h < H; h++) nw[h] = bf_uniform(r, 0.5f, 1.5f);
    if (g != HC_MODE_NORMAL)
        for (h = 0; h < H; h++)
            if (hu_below_scaled(r, 50) == 0) nw[h] = pick(r, odd, last ? 6 : 4);
}

int hc_make_mode(hc_case *c, hc_op op, const hc_spec *s, float rs, const float scales[2],
                 float eps, hc_mode mode, uint64_t seed)
{
    hu_rng r;
    int64_t t;
    size_t K = (size_t)(s->K > 0 ? s->K : 0), H = (size_t)(s->H > 0 ? s->H : 0);
    int64_t cap = s->T + s->pad;
    size_t C = (size_t)(cap > 0 ? cap : 0);

    memset(c, 0, sizeof *c);
    c->s = *s;
    c->cap = cap;
    c->rs = rs;
    c->scales[0] = scales ? scales[0] : 1.0f;
    c->scales[1] = scales ? scales[1] : 1.0f;
    hu_rng_init(&r, seed);
    /* sizes that do not even fit the address space: fail like malloc would */
    if ((double)C * (double)(K ? K : 1) * (double)(H ? H : 1) * 4.0 > 1e15) return -1;

    if (op != HC_NRN) {
        c->experts = hu_try_alloc(C * K * H * 2, 0);
        c->weights = hu_try_alloc(C * K * 4, 0);
        if (!c->experts || !c->weights) goto oom;
    } else {
        c->x = hu_try_alloc(C * H * 2, 0);
        if (!c->x) goto oom;
    }
    if (op != HC_FINALIZE) {
        c->residual = hu_try_alloc(C * H * 2, 0);
        if (!c->residual) goto oom;
    }
    c->wpost = hu_try_alloc(H * 2, 0);
    c->wpre = hu_try_alloc(H * 2, 0);
    c->wnext = hu_try_alloc(H * 2, 0);
    if (!c->wpost || !c->wpre || !c->wnext) goto oom;
    gen_norm_weight(c->wpost, s->H, mode, 0, &r);
    gen_norm_weight(c->wpre, s->H, mode, 0, &r);
    gen_norm_weight(c->wnext, s->H, mode, 1, &r);
    c->post = make_norm(s->post, c->wpost, eps);
    c->pre = make_norm(s->pre, c->wpre, eps);
    c->next = make_norm(s->next, c->wnext, eps);

    /* rows past the live ones: NaN everywhere, they must never be read */
    if (c->experts) hu_fill_u16(c->experts, 0x7FC1, C * K * H);
    if (c->weights)
        for (t = 0; t < (int64_t)(C * K); t++) c->weights[t] = NAN;
    if (c->x) hu_fill_u16(c->x, 0x7FC1, C * H);
    if (c->residual) hu_fill_u16(c->residual, 0x7FC1, C * H);

    for (t = 0; t < s->T && t < cap; t++) {
        hc_mode g = mode;
        if (g == HC_MODE_MIXED) g = (hc_mode)hu_below_scaled(&r, HC_MODE_MIXED);
        gen_row(c, t, g, &r);
    }
    return 0;
oom:
    hc_free(c);
    return -1;
}

void hc_free(hc_case *c)
{
    hu_free(c->experts);
    hu_free(c->weights);
    hu_free(c->x);
    hu_free(c->residual);
    hu_free(c->wpost);
    hu_free(c->wpre);
    hu_free(c->wnext);
    memset(c, 0, sizeof *c);
}

int hc_has_normalized(const hc_case *c, hc_op op)
{
    return op != HC_FINALIZE && c->next.on;
}

void hc_describe(const hc_spec *s, char *buf, size_t n)
{
    static const char *nm[3] = {"off", "plain", "weight"};
    snprintf(buf, n,
             "K=%d H=%d T=%lld pad=%lld post=%s pre=%s next=%s scales=%d rs_one=%d "
             "inplace=%d misalign=%d exotic=%d",
             (int)s->K, (int)s->H, (long long)s->T, (long long)s->pad, nm[s->post], nm[s->pre],
             nm[s->next], s->scales, s->rs_one, s->inplace, s->misalign, s->exotic);
}

/* ---- outputs ---- */

static size_t out_elems(const hc_out *o)
{
    return (size_t)o->rows * (size_t)o->H;
}

/* every element := HC_SENTINEL */
static void out_reset(hc_out *o)
{
    hu_fill_u16(o->hidden, HC_SENTINEL, out_elems(o));
    hu_fill_u16(o->normalized, HC_SENTINEL, out_elems(o));
}

int hc_out_make(hc_out *o, const hc_case *c, int guard_rows)
{
    memset(o, 0, sizeof *o);
    o->rows = (c->s.T > 0 ? c->s.T : 0) + guard_rows;
    o->H = c->s.H > 0 ? c->s.H : 0;
    o->hidden = hu_try_alloc(out_elems(o) * 2, 0);
    o->normalized = hu_try_alloc(out_elems(o) * 2, 0);
    if (!o->hidden || !o->normalized) {
        hc_out_free(o);
        return -1;
    }
    out_reset(o);
    return 0;
}

void hc_out_free(hc_out *o)
{
    hu_free(o->hidden);
    hu_free(o->normalized);
    memset(o, 0, sizeof *o);
}

void hc_out_compare(const hc_out *got, const hc_out *want, hc_op op, hu_cmp *cmp)
{
    hu_cmp_add(cmp, got->hidden, want->hidden, out_elems(want));
    if (op != HC_FINALIZE)
        hu_cmp_add(cmp, got->normalized, want->normalized, out_elems(want));
}

static int all_sentinel(const uint16_t *p, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++)
        if (p[i] != HC_SENTINEL)
            return 0;
    return 1;
}

int hc_out_untouched(const hc_out *o, const hc_case *c, hc_op op)
{
    size_t live = (size_t)(c->s.T > 0 ? c->s.T : 0) * (size_t)o->H;
    return all_sentinel(o->hidden + live, out_elems(o) - live) &&
           (hc_has_normalized(c, op) ? all_sentinel(o->normalized + live, out_elems(o) - live)
                                     : all_sentinel(o->normalized, out_elems(o)));
}

uint64_t hc_out_checksum(const hc_out *o, const hc_case *c, hc_op op)
{
    size_t n = (size_t)(c->s.T > 0 ? c->s.T : 0) * (size_t)o->H;
    uint64_t h = hu_fnv1a_bf16(HU_FNV_OFFSET, o->hidden, n);
    if (hc_has_normalized(c, op))
        h = hu_fnv1a_bf16(h, o->normalized, n);
    return h;
}

void hc_reference(const hc_case *c, hc_op op, hc_out *o)
{
    const hc_spec *s = &c->s;
    const float *sc = s->scales ? c->scales : NULL;
    switch (op) {
    case HC_FINALIZE:
        nr_finalize(c->experts, c->weights, s->T, s->K, s->H, c->rs, &c->post, o->hidden);
        break;
    case HC_NRN:
        nr_norm_residual_norm(c->x, c->residual, s->T, s->H, &c->pre, sc, &c->next, o->hidden,
                              o->normalized);
        break;
    case HC_FUSED:
        nr_finalize_norm_residual_norm(c->experts, c->weights, s->T, s->K, s->H, c->rs, &c->post,
                                       c->residual, sc, &c->next, o->hidden, o->normalized);
        break;
    }
}

/* ---- binding to a backend's memory ---- */

unsigned hc_how(const hc_spec *s)
{
    return (s->inplace ? HC_INPLACE : 0u) | (s->misalign ? HC_MISALIGN : 0u);
}

/* Host pointer as is, or a copy at 16-aligned + off (device memory with
 * HC_DEVICE). NULL stays NULL. */
static void *place(hc_bound *b, const void *host, size_t bytes, size_t off, int *fail,
                   char *err, size_t errn)
{
    unsigned char *base;
    if (!host || *fail)
        return (void *)host;
    if (!(b->how & HC_DEVICE)) {
        if (!off && !(b->how & HC_FENCED))
            return (void *)host;
        base = (b->how & HC_FENCED) ? hu_alloc_fenced(bytes) : hu_try_alloc(bytes, off);
        if (!base) {
            snprintf(err, errn, "out of memory");
            *fail = 1;
            return NULL;
        }
        memcpy(base, host, bytes);
        b->sizes[b->nblocks] = bytes;
        b->blocks[b->nblocks++] = base;
        return base;
    }
    base = dev_alloc(bytes + 16);
    if (!base || dev_upload(base + off, host, bytes)) {
        snprintf(err, errn, "%s", dev_last_error());
        dev_free(base);
        *fail = 1;
        return NULL;
    }
    b->blocks[b->nblocks++] = base;
    return base + off;
}

int hc_bind(hc_bound *b, const hc_case *c, hc_op op, hc_out *o, unsigned how, char *err,
            size_t errn)
{
    const hc_spec *s = &c->s;
    size_t K = (size_t)(s->K > 0 ? s->K : 0), H = (size_t)o->H;
    size_t C = (size_t)(c->cap > 0 ? c->cap : 0);
    size_t ob = (size_t)o->rows * H * 2;
    size_t mb = (how & HC_MISALIGN) ? 2 : 0, mf = (how & HC_MISALIGN) ? 4 : 0;
    int fail = 0;

    memset(b, 0, sizeof *b);
    b->c = c;
    b->op = op;
    b->o = o;
    b->how = how;
    if (op == HC_FINALIZE)
        b->how &= ~(unsigned)HC_INPLACE;
    out_reset(o);
    if ((b->how & HC_INPLACE) && s->T > 0) /* hidden_out starts as the residual */
        memcpy(o->hidden, c->residual, (size_t)s->T * H * 2);

    if (op != HC_NRN) {
        b->experts = place(b, c->experts, C * K * H * 2, mb, &fail, err, errn);
        b->weights = place(b, c->weights, C * K * 4, mf, &fail, err, errn);
    } else {
        b->x = place(b, c->x, C * H * 2, mb, &fail, err, errn);
    }
    b->hidden = place(b, o->hidden, ob, mb, &fail, err, errn);
    if (hc_has_normalized(c, op))
        b->normalized = place(b, o->normalized, ob, mb, &fail, err, errn);
    if (op != HC_FINALIZE)
        b->residual = (b->how & HC_INPLACE) ? b->hidden
                                            : place(b, c->residual, C * H * 2, mb, &fail, err, errn);
    /* the scales where the case holds them, but for a fenced call */
    if (op != HC_FINALIZE && s->scales)
        b->scales = (b->how & HC_FENCED) ? place(b, c->scales, 8, 0, &fail, err, errn) : c->scales;
    b->post_p = hu_beam_norm(&c->post, &b->post);
    b->pre_p = hu_beam_norm(&c->pre, &b->pre);
    b->next_p = hu_beam_norm(&c->next, &b->next);
    if (b->post_p && b->post.weight)
        b->post.weight = place(b, c->post.weight, H * 2, mb, &fail, err, errn);
    if (b->pre_p && b->pre.weight)
        b->pre.weight = place(b, c->pre.weight, H * 2, mb, &fail, err, errn);
    if (b->next_p && b->next.weight)
        b->next.weight = place(b, c->next.weight, H * 2, mb, &fail, err, errn);
    if (fail) {
        hc_unbind(b);
        return -1;
    }
    return 0;
}

beam_status hc_call(const beam_ops *ops, const hc_bound *b, beam_strategy strategy, void *stream)
{
    const hc_case *c = b->c;
    const hc_spec *s = &c->s;
    const float *sc = b->scales;
    switch (b->op) {
    case HC_FINALIZE:
        return ops->moe_finalize(b->experts, b->weights, c->cap, s->T, s->K, s->H, c->rs, b->post_p,
                                 b->hidden, stream);
    case HC_NRN:
        return ops->norm_residual_norm(b->x, b->residual, s->T, s->H, b->pre_p, sc, b->next_p, b->hidden,
                                       b->normalized, stream);
    case HC_FUSED:
        return ops->moe_finalize_norm_residual_norm(
            b->experts, b->weights, c->cap, s->T, s->K, s->H, c->rs, b->post_p, b->residual, sc,
            b->next_p, b->hidden, b->normalized, strategy, stream);
    }
    return BEAM_ERR_INVALID_ARGUMENT;
}

int hc_finish(hc_bound *b, char *err, size_t errn)
{
    size_t ob = (size_t)b->o->rows * (size_t)b->o->H * 2;
    if (!(b->how & HC_DEVICE)) {
        if (b->hidden != b->o->hidden)
            memcpy(b->o->hidden, b->hidden, ob);
        if (b->normalized && b->normalized != b->o->normalized)
            memcpy(b->o->normalized, b->normalized, ob);
        return 0;
    }
    if (dev_sync() || dev_download(b->o->hidden, b->hidden, ob) ||
        (b->normalized && dev_download(b->o->normalized, b->normalized, ob))) {
        snprintf(err, errn, "%s", dev_last_error());
        return -1;
    }
    return 0;
}

void hc_unbind(hc_bound *b)
{
    int i;
    for (i = 0; i < b->nblocks; i++) {
        if (b->how & HC_DEVICE)
            dev_free(b->blocks[i]);
        else if (b->how & HC_FENCED)
            hu_free_fenced(b->blocks[i], b->sizes[i]);
        else
            hu_free(b->blocks[i]);
    }
    b->nblocks = 0;
}

beam_status hc_run(const beam_ops *ops, const hc_case *c, hc_op op, beam_strategy strategy, unsigned how,
                   hc_out *o, char *err, size_t errn)
{
    hc_bound b;
    beam_status st;
    if (hc_bind(&b, c, op, o, how, err, errn))
        return (how & HC_DEVICE) ? BEAM_ERR_DEVICE : BEAM_ERR_OUT_OF_MEMORY;
    st = hc_call(ops, &b, strategy, NULL);
    if (st != BEAM_OK)
        snprintf(err, errn, "%s: %s", beam_status_string(st), ops->last_error());
    else if (hc_finish(&b, err, errn))
        st = BEAM_ERR_DEVICE;
    hc_unbind(&b);
    return st;
}

const beam_ops *hc_ops(void)
{
    const beam_ops *ops = beam_backend_ops(NULL, BEAM_OPS_VERSION);
    if (!ops) {
        fprintf(stderr, "beam_backend_ops: %s\n", beam_last_error());
        exit(1);
    }
    return ops;
}

/* The live rows of op on c: the library's through hc_ops() on host memory
 * laid out as the spec asks (*untouched as hc_out_untouched), or (ref) the
 * reference's. */
static beam_status live_rows(const hc_case *c, hc_op op, beam_strategy strategy, int ref, uint16_t *hidden,
                             uint16_t *normalized, int *untouched)
{
    size_t TH = (size_t)c->s.T * (size_t)c->s.H;
    char err[300];
    hc_out o;
    beam_status st = BEAM_OK;
    if (hc_out_make(&o, c, ref ? 0 : 2)) {
        fprintf(stderr, "%s: out of memory\n", ref ? "hc_ref" : "hc_lib");
        exit(1);
    }
    if (ref) {
        hc_reference(c, op, &o);
    } else {
        st = hc_run(hc_ops(), c, op, strategy, hc_how(&c->s), &o, err, sizeof err);
        *untouched = hc_out_untouched(&o, c, op);
    }
    /* hand the live rows back (the guard rows were checked above) */
    memcpy(hidden, o.hidden, sizeof(uint16_t) * TH);
    if (hc_has_normalized(c, op))
        memcpy(normalized, o.normalized, sizeof(uint16_t) * TH);
    hc_out_free(&o);
    return st;
}

beam_status hc_lib(const hc_case *c, hc_op op, beam_strategy strategy, uint16_t *hidden,
                   uint16_t *normalized, int *untouched)
{
    return live_rows(c, op, strategy, 0, hidden, normalized, untouched);
}

void hc_ref(const hc_case *c, hc_op op, uint16_t *hidden, uint16_t *normalized)
{
    live_rows(c, op, BEAM_STRATEGY_AUTO, 1, hidden, normalized, NULL);
}
