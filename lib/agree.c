/*
 * agree.c - the arguments every rank of a gather must pass alike
 * (lib/agree.h), and their public form (beam_gather_agreement), which the
 * dispatching library serves too: it needs no backend, only lib/check.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agree.h"
#include "check.h"
#include "error.h"

#define BM_AGREE_NONE 0xFFFFFFFFFFFFFFFFull /* a part that does not apply */

const char *const bm_agree_names[BM_AGREE_N] = {
    "tokens", "top_k", "hidden", "strategy", "routed_scale", "scales", "post_norm", "next_norm", "quant"};

static const char *bm_kind_name(int kind)
{
    switch (kind) {
#define BM_FORM(kind, qf, bits, group, scale, blocks) \
    case kind: return #kind;
#include "quant_forms.def"
    }
    return "unknown kind";
}

static uint64_t bm_bits(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

static double bm_float(uint64_t w)
{
    float v;
    uint32_t u = (uint32_t)w;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* The shortest of 6 to 9 digits that reads back as the same float. */
static const char *bm_float_text(uint64_t w, char *buf, size_t size)
{
    const double v = bm_float(w);
    int digits;
    for (digits = 6; digits < 9; digits++) {
        snprintf(buf, size, "%.*g", digits, v);
        if ((float)strtod(buf, NULL) == (float)v) return buf;
    }
    snprintf(buf, size, "%.9g", v);
    return buf;
}

/* present, weight present, eps */
static uint64_t bm_norm_word(const bm_norm *n)
{
    return n->on ? (uint64_t)(n->weight != NULL) << 32 | bm_bits(n->eps) : BM_AGREE_NONE;
}

void bm_agree_words(const bm_args *a, int strategy, uint64_t words[BM_AGREE_N])
{
    const int scaled = a->q.scale != 0.0f; /* the kinds that take quant->scale (lib/quant_forms.def) */
    words[BM_AGREE_TOKENS] = (uint64_t)a->tokens;
    words[BM_AGREE_TOP_K] = (uint64_t)(uint32_t)a->top_k;
    words[BM_AGREE_HIDDEN] = (uint64_t)(uint32_t)a->hidden;
    words[BM_AGREE_STRATEGY] = (uint64_t)(uint32_t)strategy;   /* with the collective: bm_agree_coll */
    words[BM_AGREE_ROUTED_SCALE] = bm_bits(a->routed_scale);
    words[BM_AGREE_SCALES] = a->has_scales ? bm_bits(a->scale_x) << 32 | bm_bits(a->scale_r) : BM_AGREE_NONE;
    /* the norm of the reduced rows: the all-reduces carry it as a->pre
     * (lib/backend.h), the gather as a->post, and neither has the other */
    words[BM_AGREE_POST_NORM] = bm_norm_word(a->post.on ? &a->post : &a->pre);
    words[BM_AGREE_NEXT_NORM] = bm_norm_word(&a->next);
    words[BM_AGREE_QUANT] = a->q.kind ? (uint64_t)(a->q.kind & 0xFF) | (uint64_t)(a->q.group & 0xFFFF) << 8 |
                                            (uint64_t)(a->q.ue8m0 != 0) << 24 |
                                            (scaled ? bm_bits(a->q.scale) << 32 : 0)
                                      : 0;
}

BEAM_API beam_status beam_gather_agreement(int64_t tokens, int32_t top_k, int32_t hidden, float routed_scale,
                                           const beam_norm *post_norm, const float *scales,
                                           const beam_norm *next_norm, const beam_quant *quant,
                                           beam_strategy strategy, uint64_t *words)
{
    bm_args a;
    if (!words) return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "beam_gather_agreement: words must not be NULL");
    memset(&a, 0, sizeof a);
    a.tokens = tokens;
    a.top_k = top_k;
    a.hidden = hidden;
    a.routed_scale = routed_scale;
    a.post = bm_norm_of(post_norm);
    a.next = bm_norm_of(next_norm);
    a.has_scales = scales != NULL;
    if (scales) {
        a.scale_x = scales[0];
        a.scale_r = scales[1];
    }
    {
        /* the form as the call's check makes it, without what is each
         * rank's own (where its scales lie) and its pointers */
        bm_ptr unused[2];
        beam_quant form;
        beam_status st;
        if (quant) {
            form = *quant;
            form.flags &= ~BEAM_QUANT_COL_MAJOR;
            form.scale_ld = 0;
        }
        st = bm_check_quant("beam_gather_agreement", quant ? &form : NULL, next_norm != NULL, tokens, hidden, &a.q,
                            unused);
        if (st != BEAM_OK) return st;
    }
    bm_agree_words(&a, (int)strategy, words);
    return BEAM_OK;
}

const char *bm_agree_arg(int i, const bm_args *a)
{
    return i == BM_AGREE_POST_NORM && a->x ? "pre_norm" : bm_agree_names[i];
}

const char *bm_agree_text(int i, uint64_t w, char *text, size_t size)
{
    char a[32], b[32];
    if (i < 0 || i >= BM_AGREE_N) return NULL;
    if (!text || size == 0) return bm_agree_names[i];
    if (w == BM_AGREE_NONE || (i == BM_AGREE_QUANT && w == 0)) {
        snprintf(text, size, "none");
        return bm_agree_names[i];
    }
    switch (i) {
    case BM_AGREE_STRATEGY:
        snprintf(text, size, "%s%s", w >> 8 & 0xFF ? "all-reduce " : "",
                 bm_strategy_name((beam_strategy)(uint32_t)(w & 0xFF)));
        break;
    case BM_AGREE_ROUTED_SCALE: bm_float_text(w, text, size); break;
    case BM_AGREE_SCALES:
        snprintf(text, size, "(%s, %s)", bm_float_text(w >> 32, a, sizeof a), bm_float_text(w, b, sizeof b));
        break;
    case BM_AGREE_POST_NORM:
    case BM_AGREE_NEXT_NORM:
        snprintf(text, size, "eps %s %s weight", bm_float_text(w, a, sizeof a), w >> 32 ? "with" : "without");
        break;
    case BM_AGREE_QUANT:
        snprintf(text, size, "%s group %d%s%s%s", bm_kind_name((int)(w & 0xFF)), (int)(w >> 8 & 0xFFFF),
                 w >> 24 & 1 ? " UE8M0" : "", w >> 32 ? " scale " : "",
                 w >> 32 ? bm_float_text(w >> 32, a, sizeof a) : "");
        break;
    default: snprintf(text, size, "%lld", (long long)w); break;
    }
    return bm_agree_names[i];
}

BEAM_API const char *beam_gather_agreement_text(int32_t i, uint64_t word, char *text, size_t size)
{
    return bm_agree_text(i, word, text, size);
}
