/*
 * agree.c - the arguments every rank of a gather must pass alike
 * (lib/agree.h).
 */
#include <string.h>

#include "agree.h"

#define BM_AGREE_NONE 0xFFFFFFFFFFFFFFFFull /* a part that does not apply */

const char *const bm_agree_names[BM_AGREE_N] = {
    "tokens", "top_k", "hidden", "strategy", "routed_scale", "scales", "post_norm", "next_norm",
    "quant (kind, group_size, BEAM_QUANT_UE8M0, scale)"};

static uint64_t bm_bits(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

/* present, weight present, eps */
static uint64_t bm_norm_word(const bm_norm *n)
{
    return n->on ? (uint64_t)(n->weight != NULL) << 32 | bm_bits(n->eps) : BM_AGREE_NONE;
}

void bm_agree_words(const bm_args *a, int strategy, uint64_t words[BM_AGREE_N])
{
    const int scaled = a->q.scale != 0.0f; /* the kinds that take quant->scale (lib/quant_forms.def) */
    words[0] = (uint64_t)a->tokens;
    words[1] = (uint64_t)(uint32_t)a->top_k;
    words[2] = (uint64_t)(uint32_t)a->hidden;
    words[3] = (uint64_t)(uint32_t)strategy;
    words[4] = bm_bits(a->routed_scale);
    words[5] = a->has_scales ? bm_bits(a->scale_x) << 32 | bm_bits(a->scale_r) : BM_AGREE_NONE;
    words[6] = bm_norm_word(&a->post);
    words[7] = bm_norm_word(&a->next);
    words[8] = a->q.kind ? (uint64_t)(uint32_t)a->q.kind | (uint64_t)(a->q.group & 0xFFFF) << 8 |
                               (uint64_t)(a->q.ue8m0 != 0) << 24 | (scaled ? bm_bits(a->q.scale) << 32 : 0)
                         : 0;
}
