/*
 * test_case.c - build a random case, run it through the reference and the
 * library (see test_case.h).
 */
#include "test_case.h"

#include <stdio.h>
#include <string.h>

static uint16_t *norm_weight(tu_rng *r, int choice, int32_t H)
{
    uint16_t *w;
    int32_t h;
    if (choice != TC_NORM_WEIGHT)
        return NULL;
    w = (uint16_t *)tu_alloc(sizeof(uint16_t) * (size_t)H, 0);
    for (h = 0; h < H; h++)
        w[h] = tu_rand_norm_weight(r);
    return w;
}

static nr_norm make_norm(int choice, const uint16_t *w, float eps)
{
    nr_norm n;
    n.on = choice != TC_NORM_OFF;
    n.weight = w;
    n.eps = eps;
    return n;
}

void tc_make(tc_data *d, const tc_spec *s, uint64_t seed)
{
    tu_rng r;
    size_t KH = (size_t)s->K * (size_t)s->H;
    size_t TH = (size_t)s->T * (size_t)s->H;
    static const float eps_choices[4] = {1e-6f, 1e-5f, 0.0f, 1e-3f};

    memset(d, 0, sizeof *d);
    d->s = *s;
    d->cap = s->T + s->pad;
    tu_rng_init(&r, seed);

    d->experts = (uint16_t *)tu_alloc(sizeof(uint16_t) * KH * (size_t)d->cap, 0);
    d->weights = (float *)tu_alloc(sizeof(float) * (size_t)s->K * (size_t)d->cap, 0);
    tu_fill_bf16(&r, d->experts, KH * (size_t)s->T);
    tu_fill_weight(&r, d->weights, (size_t)s->K * (size_t)s->T);
    /* padding rows: must never be read */
    tu_fill_bf16_nan(d->experts + KH * (size_t)s->T, KH * (size_t)s->pad);
    tu_fill_f32_nan(d->weights + (size_t)s->K * (size_t)s->T, (size_t)s->K * (size_t)s->pad);

    d->x = (uint16_t *)tu_alloc(sizeof(uint16_t) * TH, 0);
    d->residual = (uint16_t *)tu_alloc(sizeof(uint16_t) * TH, 0);
    tu_fill_bf16(&r, d->x, TH);
    tu_fill_bf16(&r, d->residual, TH);
    if (s->exotic) {
        /* finite oddities everywhere; one row-killing value (inf, NaN, max)
         * in one row of each array, so the other rows stay meaningful */
        tu_sprinkle_exotic(&r, d->experts, KH * (size_t)s->T, 31);
        tu_sprinkle_exotic_weights(&r, d->weights, (size_t)s->K * (size_t)s->T, 31);
        tu_sprinkle_exotic(&r, d->x, TH, 31);
        tu_sprinkle_exotic(&r, d->residual, TH, 31);
        if (s->T > 0) {
            /* position, then value, each draw its own statement: in
             * a[draw()] = draw() the compiler picks the order (GCC and
             * clang differ), and the golden digests need one order */
            int64_t t = s->T / 2;
            size_t at = (size_t)t * KH + tu_below(&r, (uint32_t)KH);
            d->experts[at] = tu_rand_killer(&r);
            at = (size_t)(s->T - 1) * (size_t)s->H + tu_below(&r, (uint32_t)s->H);
            d->x[at] = tu_rand_killer(&r);
            at = tu_below(&r, (uint32_t)s->H);
            d->residual[at] = tu_rand_killer(&r);
        }
    }

    d->wpost = norm_weight(&r, s->post, s->H);
    d->wpre = norm_weight(&r, s->pre, s->H);
    d->wnext = norm_weight(&r, s->next, s->H);
    d->post = make_norm(s->post, d->wpost, eps_choices[tu_below(&r, 4)]);
    d->pre = make_norm(s->pre, d->wpre, eps_choices[tu_below(&r, 4)]);
    d->next = make_norm(s->next, d->wnext, eps_choices[tu_below(&r, 4)]);
    d->scales[0] = tu_rand_scale(&r);
    d->scales[1] = tu_rand_scale(&r);
    d->rs = s->rs_one ? 1.0f : tu_rand_scale(&r);
}

void tc_free(tc_data *d)
{
    tu_free(d->experts);
    tu_free(d->weights);
    tu_free(d->x);
    tu_free(d->residual);
    tu_free(d->wpost);
    tu_free(d->wpre);
    tu_free(d->wnext);
    memset(d, 0, sizeof *d);
}

int tc_has_normalized(const tc_data *d, tc_op op)
{
    return op != TC_FINALIZE && d->next.on;
}

void tc_ref(const tc_data *d, tc_op op, uint16_t *hidden, uint16_t *normalized)
{
    const tc_spec *s = &d->s;
    const float *sc = s->scales ? d->scales : NULL;
    switch (op) {
    case TC_FINALIZE:
        nr_finalize(d->experts, d->weights, s->T, s->K, s->H, d->rs, &d->post, hidden);
        break;
    case TC_NRN:
        nr_norm_residual_norm(d->x, d->residual, s->T, s->H, &d->pre, sc, &d->next, hidden,
                              normalized);
        break;
    case TC_FUSED:
        nr_finalize_norm_residual_norm(d->experts, d->weights, s->T, s->K, s->H, d->rs, &d->post,
                                       d->residual, sc, &d->next, hidden, normalized);
        break;
    }
}

/* A copy of n elements of size sz at an address 16-aligned + off. */
static void *copy_at(const void *src, size_t bytes, size_t off)
{
    void *p = tu_alloc(bytes, off);
    memcpy(p, src, bytes);
    return p;
}

beam_status tc_lib(const tc_data *d, tc_op op, beam_strategy strategy,
                   uint16_t *hidden, uint16_t *normalized, int *guard_ok)
{
    const tc_spec *s = &d->s;
    size_t ob = s->misalign ? 2 : 0, of = s->misalign ? 4 : 0;
    size_t TH = (size_t)s->T * (size_t)s->H, row = (size_t)s->H;
    size_t KH = (size_t)s->K * (size_t)s->H;
    size_t out_bytes = sizeof(uint16_t) * (TH + TC_GUARD * row);
    beam_norm bpost, bpre, bnext;
    const float *sc = s->scales ? d->scales : NULL;
    uint16_t *ex = NULL, *xx = NULL, *res = NULL, *hid, *nrm = NULL;
    uint16_t *wpost = NULL, *wpre = NULL, *wnext = NULL;
    float *wt = NULL;
    nr_norm post = d->post, pre = d->pre, next = d->next;
    beam_status st = BEAM_OK;
    int with_nrm = tc_has_normalized(d, op);

    /* private, possibly misaligned copies of every input */
    if (op != TC_NRN) {
        ex = (uint16_t *)copy_at(d->experts, sizeof(uint16_t) * KH * (size_t)d->cap, ob);
        wt = (float *)copy_at(d->weights, sizeof(float) * (size_t)s->K * (size_t)d->cap, of);
    }
    if (op == TC_NRN)
        xx = (uint16_t *)copy_at(d->x, sizeof(uint16_t) * TH, ob);
    if (d->wpost) post.weight = wpost = (uint16_t *)copy_at(d->wpost, 2 * row, ob);
    if (d->wpre) pre.weight = wpre = (uint16_t *)copy_at(d->wpre, 2 * row, ob);
    if (d->wnext) next.weight = wnext = (uint16_t *)copy_at(d->wnext, 2 * row, ob);

    hid = (uint16_t *)tu_alloc(out_bytes, ob);
    tu_poison(hid, out_bytes);
    if (op != TC_FINALIZE) {
        if (s->inplace) {
            memcpy(hid, d->residual, sizeof(uint16_t) * TH);
            res = hid;
        } else {
            res = (uint16_t *)copy_at(d->residual, sizeof(uint16_t) * TH, ob);
        }
    }
    if (with_nrm) {
        nrm = (uint16_t *)tu_alloc(out_bytes, ob);
        tu_poison(nrm, out_bytes);
    }

    switch (op) {
    case TC_FINALIZE:
        st = beam_moe_finalize(ex, wt, d->cap, s->T, s->K, s->H, d->rs,
                               tu_beam_norm(&post, &bpost), hid, NULL);
        break;
    case TC_NRN:
        st = beam_norm_residual_norm(xx, res, s->T, s->H, tu_beam_norm(&pre, &bpre), sc,
                                     tu_beam_norm(&next, &bnext), hid, nrm, NULL);
        break;
    case TC_FUSED:
        st = beam_moe_finalize_norm_residual_norm(
            ex, wt, d->cap, s->T, s->K, s->H, d->rs, tu_beam_norm(&post, &bpost), res, sc,
            tu_beam_norm(&next, &bnext), hid, nrm, strategy, NULL);
        break;
    }

    *guard_ok = tu_is_poison(hid + TH, sizeof(uint16_t) * TC_GUARD * row);
    if (nrm && !tu_is_poison(nrm + TH, sizeof(uint16_t) * TC_GUARD * row))
        *guard_ok = 0;
    /* hand the live rows back (the guard rows were checked above) */
    memcpy(hidden, hid, sizeof(uint16_t) * TH);
    if (nrm)
        memcpy(normalized, nrm, sizeof(uint16_t) * TH);

    if (res != hid)
        tu_free(res);
    tu_free(hid);
    tu_free(nrm);
    tu_free(ex);
    tu_free(wt);
    tu_free(xx);
    tu_free(wpost);
    tu_free(wpre);
    tu_free(wnext);
    return st;
}

void tc_describe(const tc_spec *s, char *buf, size_t n)
{
    static const char *nm[3] = {"off", "plain", "weight"};
    snprintf(buf, n,
             "K=%d H=%d T=%lld pad=%lld post=%s pre=%s next=%s scales=%d rs_one=%d "
             "inplace=%d misalign=%d exotic=%d",
             (int)s->K, (int)s->H, (long long)s->T, (long long)s->pad, nm[s->post], nm[s->pre],
             nm[s->next], s->scales, s->rs_one, s->inplace, s->misalign, s->exotic);
}
