/*
 * check.c - argument checks shared by every backend (docs/contract.md).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "check.h"
#include "error.h"

#define BAD BEAM_ERR_INVALID_ARGUMENT

beam_status bm_check_top_k(const char *fn, int32_t top_k)
{
    if (top_k < 1 || top_k > BM_MAX_TOP_K)
        return bm_fail(BAD, "%s: top_k=%d must be in [1, %d]", fn, (int)top_k, BM_MAX_TOP_K);
    return BEAM_OK;
}

beam_status bm_check_hidden(const char *fn, int32_t hidden)
{
    if (hidden < BM_MIN_HIDDEN || hidden > BM_MAX_HIDDEN || hidden % 256 != 0)
        return bm_fail(BAD, "%s: hidden=%d must be a multiple of 256 in [%d, %d]", fn,
                       (int)hidden, BM_MIN_HIDDEN, BM_MAX_HIDDEN);
    return BEAM_OK;
}

beam_status bm_check_rows(const char *fn, const char *cap_name, int64_t capacity,
                          const char *live_name, int64_t live, int32_t top_k, int32_t hidden)
{
    /* The largest row count whose expert array [rows, top_k, hidden] BF16
     * still has a byte size that fits in both size_t and int64_t. */
    uint64_t limit = (uint64_t)(SIZE_MAX < INT64_MAX ? SIZE_MAX : INT64_MAX);
    uint64_t row_bytes = (uint64_t)top_k * (uint64_t)hidden * 2u;

    if (live < 0)
        return bm_fail(BAD, "%s: %s=%lld must be >= 0", fn, live_name, (long long)live);
    if (capacity < live)
        return bm_fail(BAD, "%s: %s=%lld must be >= %s=%lld", fn, cap_name,
                       (long long)capacity, live_name, (long long)live);
    if ((uint64_t)capacity > limit / row_bytes)
        return bm_fail(BAD, "%s: %s=%lld is too large for this address space", fn, cap_name,
                       (long long)capacity);
    return BEAM_OK;
}

beam_status bm_check_finite(const char *fn, const char *name, float v)
{
    if (!isfinite(v))
        return bm_fail(BAD, "%s: %s=%g must be finite", fn, name, (double)v);
    return BEAM_OK;
}

bm_norm bm_norm_of(const beam_norm *n)
{
    bm_norm out = {0, NULL, 0.0f};
    if (n) {
        out.on = 1;
        out.weight = n->weight;
        out.eps = n->eps;
    }
    return out;
}

beam_status bm_check_norm(const char *fn, const char *name, const beam_norm *n, bm_norm *out)
{
    *out = bm_norm_of(NULL);
    if (n && (!isfinite(n->eps) || !(n->eps >= 0.0f)))
        return bm_fail(BAD, "%s: %s->eps=%g must be finite and >= 0", fn, name, (double)n->eps);
    *out = bm_norm_of(n);
    return BEAM_OK;
}

beam_status bm_check_scales(const char *fn, const float *scales, int *has, float *sx, float *sr)
{
    *has = 0;
    *sx = 1.0f;
    *sr = 1.0f;
    if (!scales) return BEAM_OK;
    /* An FP32 pointer like expert_weights (docs/contract.md); checked before
     * the two values are read, since a misaligned float load is UB. */
    if ((uintptr_t)scales % 4 != 0)
        return bm_fail(BAD, "%s: scales=%p must be 4-byte aligned", fn, (const void *)scales);
    if (!isfinite(scales[0]))
        return bm_fail(BAD, "%s: scales[0]=%g must be finite", fn, (double)scales[0]);
    if (!isfinite(scales[1]))
        return bm_fail(BAD, "%s: scales[1]=%g must be finite", fn, (double)scales[1]);
    *has = 1;
    *sx = scales[0];
    *sr = scales[1];
    return BEAM_OK;
}

static int bm_overlap(const bm_ptr *a, const bm_ptr *b)
{
    uintptr_t a0 = (uintptr_t)a->ptr, b0 = (uintptr_t)b->ptr;
    if (a->bytes == 0 || b->bytes == 0) return 0;
    return a0 < b0 + b->bytes && b0 < a0 + a->bytes;
}

/* An output and an input both marked in_place may be exactly one buffer
 * (same base, same extent): the in-place residual update. */
static int bm_in_place(const bm_ptr *out, const bm_ptr *in)
{
    return out->in_place && in->in_place && out->ptr == in->ptr && out->bytes == in->bytes;
}

beam_status bm_check_pointers(const char *fn, const bm_ptr *p, int n)
{
    int i, j;
    for (i = 0; i < n; i++) {
        const size_t align = p[i].align;
        if (p[i].bytes == 0) continue; /* empty: may be NULL, never touched */
        if (!p[i].ptr)
            return bm_fail(BAD, "%s: %s must not be NULL (it has %zu bytes to %s)", fn, p[i].name, p[i].bytes, p[i].is_output ? "write" : "read");
        if ((uintptr_t)p[i].ptr % align != 0)
            return bm_fail(BAD, "%s: %s=%p must be %zu-byte aligned", fn, p[i].name, p[i].ptr, align);
        if ((uintptr_t)p[i].ptr > UINTPTR_MAX - p[i].bytes)
            return bm_fail(BAD, "%s: %s=%p plus %zu bytes wraps around the address space", fn,
                           p[i].name, p[i].ptr, p[i].bytes);
    }
    for (i = 0; i < n; i++) {
        if (!p[i].is_output) continue;
        for (j = 0; j < n; j++) {
            if (j == i || (p[j].is_output && j < i)) continue;
            if (!bm_overlap(&p[i], &p[j])) continue;
            if (!p[j].is_output && bm_in_place(&p[i], &p[j])) continue;
            if (!p[j].is_output && p[i].in_place && p[j].in_place)
                return bm_fail(BAD, "%s: %s overlaps %s without being the same buffer "
                               "(in-place needs %s == %s exactly)", fn, p[i].name, p[j].name, p[i].name,
                               p[j].name);
            return bm_fail(BAD, "%s: %s overlaps %s %s (outputs must not overlap inputs or each other)",
                           fn, p[i].name, p[j].is_output ? "output" : "input", p[j].name);
        }
    }
    return BEAM_OK;
}

const char *bm_strategy_name(beam_strategy s)
{
    switch (s) {
    case BEAM_STRATEGY_AUTO: return "AUTO";
    case BEAM_STRATEGY_FUSED: return "FUSED";
    case BEAM_STRATEGY_UNFUSED: return "UNFUSED";
    case BEAM_STRATEGY_ONESHOT: return "ONESHOT";
    case BEAM_STRATEGY_TWOSHOT: return "TWOSHOT";
    }
    return "?";
}

beam_status bm_check_strategy(const char *fn, beam_strategy s, int gather)
{
    int ok;
    switch (s) {
    case BEAM_STRATEGY_AUTO:
    case BEAM_STRATEGY_UNFUSED: ok = 1; break;
    case BEAM_STRATEGY_FUSED: ok = !gather; break;
    case BEAM_STRATEGY_ONESHOT:
    case BEAM_STRATEGY_TWOSHOT: ok = gather; break;
    default:
        return bm_fail(BAD, "%s: strategy=%d: unknown strategy", fn, (int)s);
    }
    if (!ok)
        return bm_fail(BAD, "%s: strategy=%s: unknown strategy for this operation (use %s)", fn,
                       bm_strategy_name(s), gather ? "AUTO, ONESHOT, TWOSHOT or UNFUSED"
                                                   : "AUTO, FUSED or UNFUSED");
    return BEAM_OK;
}

/* One line of lib/quant_forms.def; its scale column's codes. */
enum { BM_SCALE_COMPUTED = 0, BM_SCALE_STATIC = 1, BM_SCALE_GLOBAL = 2, BM_SCALE_E8M0 = 3 };
typedef struct bm_form_row {
    int kind;
    const char *name;
    int bits, group, scale, blocks;
} bm_form_row;

static const bm_form_row bm_forms[] = {
#define BM_FORM(kind, qf, bits, group, scale, blocks) {kind, #kind, bits, group, scale, blocks},
#include "quant_forms.def"
};
enum { BM_NFORMS = sizeof bm_forms / sizeof bm_forms[0] };

static const bm_form_row *bm_form_of(int kind)
{
    int i;
    for (i = 0; i < BM_NFORMS; i++)
        if (bm_forms[i].kind == kind) return &bm_forms[i];
    return NULL;
}

/* The kinds as a message lists them: "A (1), B (2) or C (3)" */
static const char *bm_form_list(char *buf, size_t n, int blocks_only)
{
    size_t at = 0;
    int i, k = 0, count = 0;
    for (i = 0; i < BM_NFORMS; i++) count += !blocks_only || bm_forms[i].blocks;
    buf[0] = '\0';
    for (i = 0; i < BM_NFORMS && at < n; i++) {
        if (blocks_only && !bm_forms[i].blocks) continue;
        k++;
        at += (size_t)snprintf(buf + at, n - at, blocks_only ? "%s%s" : "%s%s (%d)",
                               k == 1 ? "" : k == count ? " or " : ", ", bm_forms[i].name, bm_forms[i].kind);
    }
    return buf;
}

beam_status bm_check_quant(const char *fn, const beam_quant *quant, int next_on, int64_t tokens,
                           int32_t hidden, bm_quant *out, bm_ptr p[2])
{
    const uint32_t known = BEAM_QUANT_UE8M0 | BEAM_QUANT_COL_MAJOR;
    const bm_form_row *f;
    char list[256];
    size_t scale_count = 0;
    out->kind = 0;
    out->group = 0;
    out->ue8m0 = 0;
    out->scale = 0.0f;
    out->values = NULL;
    out->scales = NULL;
    out->block_scales = NULL;
    out->ld_t = out->ld_g = 0;
    p[0].name = "quant->values";
    p[0].ptr = NULL;
    p[0].bytes = 0;
    p[0].align = 1;
    p[0].is_output = 1;
    p[0].in_place = 0;
    p[1] = p[0];
    p[1].name = "quant->scales";
    p[1].align = 4;
    if (!quant) return BEAM_OK;
    if (!next_on)
        return bm_fail(BAD, "%s: quant needs next_norm (it quantizes normalized)", fn);
    if (quant->flags & ~known)
        return bm_fail(BAD, "%s: quant->flags=0x%x has unknown bits (known: BEAM_QUANT_UE8M0, "
                       "BEAM_QUANT_COL_MAJOR)", fn, (unsigned)quant->flags);
    f = bm_form_of(quant->kind);
    if (!f)
        return bm_fail(BAD, "%s: quant->kind=%d must be %s", fn, (int)quant->kind,
                       bm_form_list(list, sizeof list, 0));
    if (!f->blocks && quant->block_scales)
        return bm_fail(BAD, "%s: quant->block_scales must be NULL but for %s", fn,
                       bm_form_list(list, sizeof list, 1));
    if ((f->scale == BM_SCALE_COMPUTED || f->scale == BM_SCALE_E8M0) && quant->scale != 0.0f)
        return bm_fail(BAD, "%s: quant->scale=%g must be 0 for the dynamic kinds (their scales are computed)",
                       fn, (double)quant->scale);
    if (f->blocks) {
        /* one byte a group at its tiled place; no FP32 scales */
        if (quant->group_size != f->group || quant->flags != 0 || quant->scale_ld != 0 || quant->scales)
            return bm_fail(BAD, "%s: %s takes quant->group_size %d,%s quant->values and quant->block_scales "
                           "(quant->flags, quant->scale_ld must be 0, quant->scales NULL)", fn, f->name, f->group,
                           (f->scale == BM_SCALE_STATIC || f->scale == BM_SCALE_GLOBAL) ? " quant->scale," : "");
        out->group = f->group;
        out->block_scales = quant->block_scales;
        p[1].name = "quant->block_scales";
        p[1].ptr = quant->block_scales;
        p[1].bytes = (size_t)BEAM_BLOCK_SCALE_BYTES(tokens, hidden / f->group);
        p[1].align = 1;
    }
    switch (quant->kind) {
    case BEAM_QUANT_FP8_GROUP:
        if (quant->group_size != 128 && quant->group_size != 64)
            return bm_fail(BAD, "%s: quant->group_size=%d must be 128 or 64", fn, (int)quant->group_size);
        out->group = quant->group_size;
        if (quant->flags & BEAM_QUANT_COL_MAJOR) {
            if (quant->scale_ld < tokens)
                return bm_fail(BAD, "%s: quant->scale_ld=%lld must be >= tokens=%lld (column-major scales)",
                               fn, (long long)quant->scale_ld, (long long)tokens);
            /* the extent below, in bytes, must not wrap */
            if (quant->scale_ld > (INT64_MAX / 4 - tokens) / (hidden / out->group - 1))
                return bm_fail(BAD, "%s: quant->scale_ld=%lld is too large (the scales would span more than "
                               "2^63 bytes)", fn, (long long)quant->scale_ld);
            out->ld_t = 1;
            out->ld_g = quant->scale_ld;
            /* the last group's column ends at its last token */
            scale_count = tokens ? (size_t)(hidden / out->group - 1) * (size_t)quant->scale_ld + (size_t)tokens : 0;
        } else {
            if (quant->scale_ld != 0)
                return bm_fail(BAD, "%s: quant->scale_ld=%lld must be 0 without BEAM_QUANT_COL_MAJOR", fn,
                               (long long)quant->scale_ld);
            out->ld_t = hidden / out->group;
            out->ld_g = 1;
            scale_count = (size_t)tokens * (size_t)(hidden / out->group);
        }
        break;
    case BEAM_QUANT_FP8_TOKEN:
        if (quant->group_size != 0)
            return bm_fail(BAD, "%s: quant->group_size=%d must be 0 for BEAM_QUANT_FP8_TOKEN", fn,
                           (int)quant->group_size);
        if (quant->flags & BEAM_QUANT_COL_MAJOR)
            return bm_fail(BAD, "%s: quant->flags: BEAM_QUANT_COL_MAJOR is for BEAM_QUANT_FP8_GROUP", fn);
        if (quant->scale_ld != 0)
            return bm_fail(BAD, "%s: quant->scale_ld=%lld must be 0 for BEAM_QUANT_FP8_TOKEN", fn,
                           (long long)quant->scale_ld);
        out->group = hidden;
        out->ld_t = 1;
        scale_count = (size_t)tokens;
        break;
    case BEAM_QUANT_FP8_TENSOR:
        if (quant->group_size != 0 || quant->flags != 0 || quant->scale_ld != 0 || quant->scales)
            return bm_fail(BAD, "%s: BEAM_QUANT_FP8_TENSOR takes only quant->scale and quant->values "
                           "(group_size, flags, scale_ld must be 0, scales NULL)", fn);
        out->group = hidden;
        break;
    }
    switch (f->scale) {
    case BM_SCALE_STATIC:
        if (!(quant->scale > 0.0f) || !(quant->scale <= FLT_MAX))
            return bm_fail(BAD, "%s: quant->scale=%g must be > 0 and finite", fn, (double)quant->scale);
        out->scale = quant->scale;
        break;
    case BM_SCALE_GLOBAL:
        /* os = g * (1 / sf) must stay finite for the smallest scale, 2^-9 */
        if (!(quant->scale > 0.0f) || !(quant->scale < 0x1p118f))
            return bm_fail(BAD, "%s: quant->scale=%g (the global scale) must be > 0 and < 2^118", fn,
                           (double)quant->scale);
        out->scale = quant->scale;
        break;
    }
    out->kind = quant->kind;
    out->ue8m0 = (quant->flags & BEAM_QUANT_UE8M0) != 0 || f->scale == BM_SCALE_E8M0;
    out->values = quant->values;
    out->scales = quant->scales;
    p[0].ptr = quant->values;
    p[0].bytes = (size_t)tokens * (size_t)hidden * (size_t)f->bits / 8;
    if (!f->blocks) {
        p[1].ptr = quant->scales;
        p[1].bytes = scale_count * sizeof(float);
    }
    return BEAM_OK;
}
