/*
 * rows_simd.h - every row kernel of the CPU backend in GCC vector
 * extensions (CPU, internal). Included by cpu/rows.c once per vector width
 * BM_W (8: AVX2, 16: AVX-512F) inside a `#pragma GCC target` region; it
 * defines bm_simd_rows_<BM_W>, which runs rows of any operation and any
 * configuration (post, pre and next norms, scales, routed scale).
 *
 * Memory: each row is read once from memory and written once. A row is
 * built block by block (8 * BM_W columns, sums in registers) and, when a
 * norm follows, its BF16 bits go to the thread's scratch (2 * hidden bytes,
 * in L1/L2) together with the norm's chunk sums; the norm's second pass
 * reads the scratch, not memory. While a token's passes run, the next
 * token's inputs (when the same thread takes it) are requested into L2 a
 * few lines per unit of work, so memory stays busy through passes that load
 * nothing and the next token finds its rows in the cache; the first token
 * of a range prefetches its expert rows BM_PF elements ahead instead. Large
 * aligned outputs use streaming stores. Prefetches never fault, so a
 * prefetch past the live rows is harmless.
 *
 * Same IEEE operations in the same order per element as docs/numerics.md
 * (and as the portable code of rows.c); only the placement of elements in
 * registers differs:
 * - a 32-bit load of two BF16 values widens without shuffles: u << 16 is the
 *   even element, u & 0xFFFF0000 the odd one. Each register of a "unit"
 *   (2*BM_W consecutive elements) is thus split into an even and an odd
 *   vector, and a rounded result packs back as (even >> 16) | odd.
 * - RMSNorm's chunk-of-8 sums need the 8 squares of one chunk in one lane:
 *   4 units (one block) hold 8*BM_W/8 = BM_W chunks (chunk g of a unit =
 *   even and odd lanes 4g..4g+3), and a 4x4 transpose inside every 128-bit
 *   lane puts element j of each of them in one vector, so the sequential sum
 *   ((q0 + q1) + q2) + ... + q7 is 7 vertical adds. One permute restores the
 *   chunks' natural order before the halving tree of docs/numerics.md. Every norm stage
 *   (post, pre, next) uses this one routine.
 */

#define BM_CAT2(a, b) a##b
#define BM_CAT(a, b) BM_CAT2(a, b)
#define FN(name) BM_CAT(name, BM_TAG)
#define VF BM_CAT(bm_vf, BM_TAG)
#define VU BM_CAT(bm_vu, BM_TAG)
#define VI BM_CAT(bm_vi, BM_TAG)
#define BM_U (2 * BM_W)   /* elements per unit */
#define BM_BLK (8 * BM_W) /* elements per block: 4 units */
#define BM_AI static inline __attribute__((always_inline))

typedef float VF __attribute__((vector_size(BM_W * 4)));
typedef uint32_t VU __attribute__((vector_size(BM_W * 4)));
typedef int32_t VI __attribute__((vector_size(BM_W * 4)));

#if BM_W == 8
#define BM_UNPLO ((VI){0, 8, 1, 9, 4, 12, 5, 13})
#define BM_UNPHI ((VI){2, 10, 3, 11, 6, 14, 7, 15})
#define BM_UNPLO64 ((VI){0, 1, 8, 9, 4, 5, 12, 13})
#define BM_UNPHI64 ((VI){2, 3, 10, 11, 6, 7, 14, 15})
/* natural chunk i = 2v + g sits in lane 4g + v */
#define BM_CHUNKS ((VI){0, 4, 1, 5, 2, 6, 3, 7})
#else
#define BM_UNPLO ((VI){0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29})
#define BM_UNPHI ((VI){2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31})
#define BM_UNPLO64 ((VI){0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29})
#define BM_UNPHI64 ((VI){2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31})
/* natural chunk i = 4v + g sits in lane 4g + v */
#define BM_CHUNKS ((VI){0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15})
#endif

#define BM_HI16 0xFFFF0000u

/* Where a pass takes the branch values from, and what it does with them
 * (defined once for both widths). */
#ifndef BM_SIMD_ENUMS
#define BM_SIMD_ENUMS
enum {
    BM_SRC_FIN, /* the finalize sums of the token's expert rows */
    BM_SRC_SCR, /* the row's bits in scratch, through a norm's last step */
    BM_SRC_X    /* a row of x in memory (through the pre-norm's last step when nrm) */
};
enum {
    BM_DST_OUT,  /* store to out */
    BM_DST_KEEP, /* bits to scratch, chunk sums */
    BM_DST_RES,  /* residual stage: hidden to out (and bits + chunk sums when keep) */
    BM_DST_SUM   /* chunk sums only */
};
#endif

BM_AI VU FN(bm_load_)(const uint16_t *p)
{
    VU u;
    memcpy(&u, p, sizeof u);
    return u;
}

/* nt: a streaming store (p aligned to the vector size), no read for
 * ownership of a line the row will not read again. */
BM_AI void FN(bm_store_)(uint16_t *p, VU u, const int nt)
{
    if (!nt)
        memcpy(p, &u, sizeof u);
#if BM_W == 8
    else
        _mm256_stream_si256((__m256i *)(void *)p, (__m256i)u);
#else
    else
        _mm512_stream_si512((void *)p, (__m512i)u);
#endif
}

/* f(bf16(v)) as bits, every lane: the integer rounding of docs/numerics.md#bf16, NaN -> 0x7FFF. */
BM_AI VU FN(bm_rnd_)(VF v)
{
#if BM_W == 16
    /* the same formula with AVX-512 masks: u + 0x7FFF, plus 1 where bit 16
     * is set, top half kept where v is not NaN, else 0x7FFF0000 (5 vector
     * operations instead of 8: this rounding dominates the norm passes) */
    const __m512i u = (__m512i)v;
    const __mmask16 odd = _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x10000));
    const __mmask16 num = _mm512_cmp_ps_mask((__m512)v, (__m512)v, _CMP_ORD_Q);
    __m512i r = _mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF));
    r = _mm512_mask_add_epi32(r, odd, r, _mm512_set1_epi32(1));
    return (VU)_mm512_mask_and_epi32(_mm512_set1_epi32(0x7FFF0000), num, r, _mm512_set1_epi32((int)BM_HI16));
#else
    VU u = (VU)v;
    VU r = (u + 0x7FFFu + ((u >> 16) & 1u)) & BM_HI16;
    VU nan = (VU)(v != v); /* true exactly for NaN: one compare */
    return (r & ~nan) | (nan & 0x7FFF0000u);
#endif
}

#define LOAD FN(bm_load_)
#define STORE FN(bm_store_)
#define RND FN(bm_rnd_)
#define EVEN(u) ((VF)((u) << 16))
#define ODD(u) ((VF)((u) & BM_HI16))
#define PACK(e, o) (((e) >> 16) | (o))

/* 4x4 transposes inside every 128-bit lane: t_j lane 4g+v = a_v lane 4g+j. */
BM_AI void FN(bm_tr4_)(VF a0, VF a1, VF a2, VF a3, VF *t)
{
    VF l01 = __builtin_shuffle(a0, a1, BM_UNPLO), l23 = __builtin_shuffle(a2, a3, BM_UNPLO);
    VF h01 = __builtin_shuffle(a0, a1, BM_UNPHI), h23 = __builtin_shuffle(a2, a3, BM_UNPHI);
    t[0] = __builtin_shuffle(l01, l23, BM_UNPLO64);
    t[1] = __builtin_shuffle(l01, l23, BM_UNPHI64);
    t[2] = __builtin_shuffle(h01, h23, BM_UNPLO64);
    t[3] = __builtin_shuffle(h01, h23, BM_UNPHI64);
}

/* The chunk sums of one block (4 units of widened values, even e, odd o),
 * in the chunks' natural order:
 * ((((((q0 + q1) + q2) + q3) + q4) + q5) + q6) + q7 per chunk. */
BM_AI VF FN(bm_chunks_)(const VU *e, const VU *o)
{
    VF te[4], to[4], p;
    FN(bm_tr4_)((VF)e[0], (VF)e[1], (VF)e[2], (VF)e[3], te);
    FN(bm_tr4_)((VF)o[0], (VF)o[1], (VF)o[2], (VF)o[3], to);
    p = te[0] * te[0];
    p = p + to[0] * to[0];
    p = p + te[1] * te[1];
    p = p + to[1] * to[1];
    p = p + te[2] * te[2];
    p = p + to[2] * to[2];
    p = p + te[3] * te[3];
    p = p + to[3] * to[3];
    return __builtin_shuffle(p, BM_CHUNKS);
}

/* the tree of docs/numerics.md#halving-tree over the chunk sums (hs / 8 of them, at least 32): zero
 * padding to a power of two, strided halving (vertical adds while the
 * stride spans whole vectors, the same additions per element), then
 * inv = 1 / sqrt(P[0] / H + eps). */
BM_AI float FN(bm_inv_)(VF *partv, int32_t hs, float eps)
{
    float *part = (float *)partv;
    const int32_t chunks = hs / 8;
    int32_t n2, s, c;
    for (n2 = 1; n2 < chunks; n2 *= 2) continue;
    for (c = chunks; c < n2; c++) part[c] = 0.0f;
    for (s = n2 / 2; s >= BM_W; s /= 2)
        for (c = 0; c < s / BM_W; c++) partv[c] = partv[c] + partv[c + s / BM_W];
    for (; s >= 1; s /= 2)
        for (c = 0; c < s; c++) part[c] = part[c] + part[c + s];
    return 1.0f / sqrtf(part[0] / (float)hs + eps);
}

/* The finalize sums of the block of 8*W columns at h0 into e0..e3 (even)
 * and o0..o3 (odd): a = +0.0, then a = a + w[k] * f(x[k][h]) for k in
 * order. A macro, so that the 8 sums are plain locals kept in registers
 * while the top_k rows stream in. */
#define BM_SUMS(x, w, top_k, hs, h0, ahead)                                                        \
    do {                                                                                           \
        int32_t k_, i_;                                                                            \
        e0 = e1 = e2 = e3 = o0 = o1 = o2 = o3 = (VF){0};                                           \
        for (k_ = 0; k_ < (top_k); k_++) {                                                         \
            const uint16_t *xk_ = (x) + (size_t)k_ * (size_t)(hs) + (h0);                          \
            const float wk_ = (w)[k_];                                                             \
            VU u0_, u1_, u2_, u3_;                                                                 \
            /* BM_PF elements ahead in every expert row, unless the previous                       \
             * row requested this one: the hardware prefetcher alone falls                         \
             * behind on 8 interleaved streams (docs/log/2026-12-04-constants.md) */               \
            if (ahead)                                                                             \
                for (i_ = 0; i_ < BM_BLK; i_ += 32) __builtin_prefetch(xk_ + BM_PF + i_, 0, 3);    \
            u0_ = LOAD(xk_), u1_ = LOAD(xk_ + BM_U);                                               \
            u2_ = LOAD(xk_ + 2 * BM_U), u3_ = LOAD(xk_ + 3 * BM_U);                                \
            e0 = e0 + wk_ * EVEN(u0_);                                                             \
            o0 = o0 + wk_ * ODD(u0_);                                                              \
            e1 = e1 + wk_ * EVEN(u1_);                                                             \
            o1 = o1 + wk_ * ODD(u1_);                                                              \
            e2 = e2 + wk_ * EVEN(u2_);                                                             \
            o2 = o2 + wk_ * ODD(u2_);                                                              \
            e3 = e3 + wk_ * EVEN(u3_);                                                             \
            o3 = o3 + wk_ * ODD(u3_);                                                              \
        }                                                                                          \
    } while (0)

/* The finalize stage's last operation before its last rounding, from the
 * sums a: s = bf16(f(bf16(a)) * rs), so the value to round is a when rs is
 * 1 (that multiply is exact and skipped, like rows.c), else f(bf16(a)) * rs. */
BM_AI void FN(bm_fin_raw_)(const bm_args *a, VF e, VF o, VF *re, VF *ro)
{
    if (a->routed_scale != 1.0f) {
        e = (VF)RND(e) * a->routed_scale;
        o = (VF)RND(o) * a->routed_scale;
    }
    *re = e;
    *ro = o;
}

/* A norm's last step on one unit u of bits before its last rounding:
 * v * inv without a weight, else f(bf16(v * inv)) * f(w). */
BM_AI void FN(bm_nrm_raw_)(VU u, float inv, const uint16_t *w, VF *re, VF *ro)
{
    VF ue = EVEN(u) * inv, uo = ODD(u) * inv;
    if (w) {
        VU wu = LOAD(w);
        ue = (VF)RND(ue) * EVEN(wu);
        uo = (VF)RND(uo) * ODD(wu);
    }
    *re = ue;
    *ro = uo;
}

/* bf16 of two vectors (even and odd elements of a unit), packed in the
 * unit's natural order: what a row stores. */
BM_AI VU FN(bm_rndpack_)(VF e, VF o)
{
#if BM_W == 16 && defined(BM_AVX512BF16)
    /* VCVTNE2PS2BF16 rounds exactly as the formula of docs/numerics.md#bf16 for every input but
     * NaN (it keeps the payload) and subnormals (it treats them as zero):
     * vectors holding any of those (fpclass 0xA1: quiet NaN, signalling
     * NaN, subnormal) take the integer formula. */
    const __mmask16 odd_ones = _mm512_fpclass_ps_mask((__m512)e, 0xA1) |
                               _mm512_fpclass_ps_mask((__m512)o, 0xA1);
    /* the conversion puts e's 16 results below o's: interleave them */
    const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                           23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    if (__builtin_expect(odd_ones != 0, 0)) return PACK(RND(e), RND(o));
    return (VU)_mm512_permutexvar_epi16(order, (__m512i)_mm512_cvtne2ps_pbh((__m512)o, (__m512)e));
#else
    return PACK(RND(e), RND(o));
#endif
}

/* The residual stage of one unit: branch x' (even xe, odd xo) and the
 * residual's bits at res -> hidden (widened, in place of xe, xo). res is
 * read here, before the caller stores hidden, which may be res. */
BM_AI void FN(bm_res_)(const bm_args *a, VU *xe, VU *xo, const uint16_t *res)
{
    VU r = LOAD(res);
    if (a->has_scales) {
        const float sx = a->scale_x, sr = a->scale_r;
        *xe = RND((VF)RND((VF)*xe * sx) + (VF)RND(EVEN(r) * sr));
        *xo = RND((VF)RND((VF)*xo * sx) + (VF)RND(ODD(r) * sr));
    } else {
        *xe = RND((VF)*xe + EVEN(r));
        *xo = RND((VF)*xo + ODD(r));
    }
}

#ifndef BM_SIMD_PF
#define BM_SIMD_PF
/* The next token's inputs, requested a few lines per unit of work while the
 * current token is computed, so that memory is busy during every pass (also
 * those that load nothing) and the next token's passes find their rows in
 * the cache: up to two contiguous spans (the expert rows [top_k, H] and the
 * residual row, or the x and residual rows). */
typedef struct bm_pfc {
    const char *p[2];
    size_t n[2];
    size_t off;
    int span, per_unit;
} bm_pfc;

static inline __attribute__((always_inline)) void bm_pfc_step(bm_pfc *c, int units)
{
    int i, n = units * c->per_unit;
    if (c->span < 2 && c->off + 64 * (size_t)n <= c->n[c->span]) { /* the usual case: one span */
        const char *p = c->p[c->span] + c->off;
        for (i = 0; i < n; i++) __builtin_prefetch(p + 64 * i, 0, BM_PF_HINT);
        c->off += 64 * (size_t)n;
        return;
    }
    for (i = 0; i < n && c->span < 2; i++) {
        __builtin_prefetch(c->p[c->span] + c->off, 0, BM_PF_HINT);
        c->off += 64;
        if (c->off >= c->n[c->span]) {
            c->span++;
            c->off = 0;
        }
    }
}
#endif

/* One pass over the row's blocks (src, dst: BM_SRC_*, BM_DST_*).
 *   in, w:    SRC_FIN: the token's expert rows and weights; SRC_X: its x row
 *   nrm, inv, nw: a norm's last step on the source (always for SRC_SCR)
 *   sb, part: the row's bits and chunk sums (scratch)
 *   res, out: the residual row and the output row
 * src, dst and nt are constants at every call, so each call site compiles
 * to its own loop without tests on them. */
BM_AI void FN(bm_pass_)(const bm_args *a, const int src, const int dst, const int keep, const int ahead,
                        const uint16_t *in, const float *w, const int nrm, float inv,
                        const uint16_t *nw, VU *sb, VF *part, const uint16_t *res, uint16_t *out,
                        bm_pfc *pf, const int nt)
{
    const int32_t hs = a->hidden, top_k = a->top_k;
    int32_t h0, b, i;

    for (h0 = 0, b = 0; h0 < hs; h0 += BM_BLK, b++) {
        VU e[4], o[4];
        VF fe[4], fo[4]; /* the values of the stage's last rounding */
        if (src == BM_SRC_FIN) {
            VF e0, e1, e2, e3, o0, o1, o2, o3;
            BM_SUMS(in, w, top_k, hs, h0, ahead);
            FN(bm_fin_raw_)(a, e0, o0, &fe[0], &fo[0]);
            FN(bm_fin_raw_)(a, e1, o1, &fe[1], &fo[1]);
            FN(bm_fin_raw_)(a, e2, o2, &fe[2], &fo[2]);
            FN(bm_fin_raw_)(a, e3, o3, &fe[3], &fo[3]);
        } else {
#pragma GCC unroll 4
            for (i = 0; i < 4; i++) {
                const VU u = src == BM_SRC_SCR ? sb[4 * b + i] : LOAD(in + h0 + i * BM_U);
                if (src == BM_SRC_SCR || nrm) {
                    FN(bm_nrm_raw_)(u, inv, nw ? nw + h0 + i * BM_U : NULL, &fe[i], &fo[i]);
                } else { /* x itself: already BF16 values */
                    e[i] = u << 16;
                    o[i] = u & BM_HI16;
                }
            }
        }
        if (dst != BM_DST_OUT && (src != BM_SRC_X || nrm)) {
#pragma GCC unroll 4
            for (i = 0; i < 4; i++) {
                e[i] = RND(fe[i]);
                o[i] = RND(fo[i]);
            }
        }
        bm_pfc_step(pf, 4);
        if (dst == BM_DST_RES) {
#pragma GCC unroll 4
            for (i = 0; i < 4; i++) {
                FN(bm_res_)(a, &e[i], &o[i], res + h0 + i * BM_U);
                STORE(out + h0 + i * BM_U, PACK(e[i], o[i]), nt);
            }
        } else if (dst == BM_DST_OUT) {
#pragma GCC unroll 4
            for (i = 0; i < 4; i++) STORE(out + h0 + i * BM_U, FN(bm_rndpack_)(fe[i], fo[i]), nt);
        }
        if (dst == BM_DST_KEEP || (dst == BM_DST_RES && keep)) {
#pragma GCC unroll 4
            for (i = 0; i < 4; i++) sb[4 * b + i] = PACK(e[i], o[i]);
        }
        if (dst == BM_DST_KEEP || dst == BM_DST_SUM || (dst == BM_DST_RES && keep))
            part[b] = FN(bm_chunks_)(e, o);
    }
}

/* Rows [t0, t1) of one op; nt: streaming stores. */
BM_AI void FN(bm_rows_nt_)(const bm_args *a, const int op, int64_t t0, int64_t t1, VU *sb, VF *part,
                           uint16_t *nrm_row, const int nt)
{
    const int32_t hs = a->hidden, top_k = a->top_k;
    const size_t H = (size_t)hs, KH = (size_t)top_k * H, units = H / BM_U;
    /* passes over the row: the norms' first and last passes add one each */
    const int passes = 1 + (op == BM_OP_NRN ? a->pre.on : a->post.on) + (op != BM_OP_FINALIZE && a->next.on);
    int64_t t;

    for (t = t0; t < t1; t++) {
        const size_t o = (size_t)t * H;
        const int ahead = BM_SUMS_PF_ALWAYS || t == t0; /* not requested by the previous row */
        bm_pfc pf;
        memset(&pf, 0, sizeof pf);
        if (t + 1 < t1) { /* the next token is this thread's too */
            if (op == BM_OP_NRN) {
                pf.p[0] = (const char *)(a->x + o + H);
                pf.n[0] = 2 * H;
            } else {
                pf.p[0] = (const char *)(a->experts + (size_t)(t + 1) * KH);
                pf.n[0] = 2 * KH;
            }
            if (op != BM_OP_FINALIZE) {
                pf.p[1] = (const char *)(a->residual + o + H);
                pf.n[1] = 2 * H;
            }
            pf.per_unit = (int)((pf.n[0] + pf.n[1] + 63) / 64 / (units * (size_t)passes)) + 1;
        } else {
            pf.span = 2;
        }
        if (op == BM_OP_FINALIZE) {
            const uint16_t *x = a->experts + (size_t)t * KH;
            const float *w = a->weights + (size_t)t * (size_t)top_k;
            if (!a->post.on) {
                FN(bm_pass_)(a, BM_SRC_FIN, BM_DST_OUT, 0, ahead, x, w, 0, 0.0f, NULL, sb, part, NULL,
                             a->output + o, &pf, nt);
            } else {
                float inv;
                FN(bm_pass_)(a, BM_SRC_FIN, BM_DST_KEEP, 1, ahead, x, w, 0, 0.0f, NULL, sb, part, NULL,
                             NULL, &pf,
                             nt);
                inv = FN(bm_inv_)(part, hs, a->post.eps);
                FN(bm_pass_)(a, BM_SRC_SCR, BM_DST_OUT, 0, ahead, NULL, NULL, 1, inv, a->post.weight, sb,
                             part,
                             NULL, a->output + o, &pf, nt);
            }
            continue;
        }
        if (op == BM_OP_FUSED) {
            const uint16_t *x = a->experts + (size_t)t * KH;
            const float *w = a->weights + (size_t)t * (size_t)top_k;
            if (!a->post.on) {
                FN(bm_pass_)(a, BM_SRC_FIN, BM_DST_RES, a->next.on, ahead, x, w, 0, 0.0f, NULL, sb, part,
                             a->residual + o, a->hidden_out + o, &pf, nt);
            } else {
                float inv;
                FN(bm_pass_)(a, BM_SRC_FIN, BM_DST_KEEP, 1, ahead, x, w, 0, 0.0f, NULL, sb, part, NULL,
                             NULL, &pf,
                             nt);
                inv = FN(bm_inv_)(part, hs, a->post.eps);
                FN(bm_pass_)(a, BM_SRC_SCR, BM_DST_RES, a->next.on, ahead, NULL, NULL, 1, inv,
                             a->post.weight, sb,
                             part, a->residual + o, a->hidden_out + o, &pf, nt);
            }
        } else { /* BM_OP_NRN */
            const uint16_t *x = a->x + o;
            if (!a->pre.on) {
                FN(bm_pass_)(a, BM_SRC_X, BM_DST_RES, a->next.on, ahead, x, NULL, 0, 0.0f, NULL, sb, part,
                             a->residual + o, a->hidden_out + o, &pf, nt);
            } else {
                float inv;
                /* the chunk sums first; the second read of x finds the row
                 * in the cache */
                FN(bm_pass_)(a, BM_SRC_X, BM_DST_SUM, 0, ahead, x, NULL, 0, 0.0f, NULL, sb, part, NULL,
                             NULL, &pf,
                             nt);
                inv = FN(bm_inv_)(part, hs, a->pre.eps);
                FN(bm_pass_)(a, BM_SRC_X, BM_DST_RES, a->next.on, ahead, x, NULL, 1, inv, a->pre.weight,
                             sb, part,
                             a->residual + o, a->hidden_out + o, &pf, nt);
            }
        }
        if (a->next.on) {
            const float inv = FN(bm_inv_)(part, hs, a->next.eps);
            /* the quantized form is made from the row just written, while
             * it is in the cache (nrm_row: the row of a quantized-only call) */
            uint16_t *nrm = bm_nrm_row(a, o, nrm_row);
            FN(bm_pass_)(a, BM_SRC_SCR, BM_DST_OUT, 0, ahead, NULL, NULL, 1, inv, a->next.weight, sb, part,
                         NULL, nrm, &pf, nt);
            if (a->q.kind) bm_cpu_quant_row(&a->q, nrm, t, hs);
        }
    }
}

/* Streaming stores when the outputs are large (they would only evict the
 * inputs' lines from the caches) and aligned to the vector size (every row
 * then is: a row is a multiple of 512 bytes); a fence orders them before
 * anything the thread does next. */
static void FN(bm_simd_rows_)(const bm_args *a, int op, int64_t t0, int64_t t1, void *sb, void *part,
                              uint16_t *nrm_row)
{
    const uintptr_t mis = op == BM_OP_FINALIZE
                              ? (uintptr_t)a->output
                              : (uintptr_t)a->hidden_out | (a->next.on ? (uintptr_t)a->normalized : 0);
    /* not with a quantized output: its pass reads normalized back at once,
     * which streaming stores would have sent past the cache */
    if ((uint64_t)a->tokens * (uint64_t)a->hidden >= BM_NT_MIN_ELEMS && mis % (4 * BM_W) == 0 && !a->q.kind) {
        FN(bm_rows_nt_)(a, op, t0, t1, (VU *)sb, (VF *)part, nrm_row, 1);
        _mm_sfence();
    } else {
        FN(bm_rows_nt_)(a, op, t0, t1, (VU *)sb, (VF *)part, nrm_row, 0);
    }
}

#undef BM_SUMS
#undef LOAD
#undef STORE
#undef RND
#undef EVEN
#undef ODD
#undef PACK
#undef BM_UNPLO
#undef BM_UNPHI
#undef BM_UNPLO64
#undef BM_UNPHI64
#undef BM_CHUNKS
#undef BM_HI16
#undef BM_U
#undef BM_BLK
#undef BM_AI
#undef VF
#undef VU
#undef VI
#undef FN
#undef BM_CAT
#undef BM_CAT2
