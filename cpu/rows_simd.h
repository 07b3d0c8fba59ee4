/*
 * rows_simd.h - the fused row (post-norm off) in GCC vector extensions
 * (CPU, internal). Included by cpu/rows.c once per vector width BM_W (8:
 * AVX2, 16: AVX-512F) inside a `#pragma GCC target` region; it defines
 * bm_simd_fused_<BM_W> and bm_simd_finalize_<BM_W> (post-norm off only;
 * rows.c keeps the portable code for the rest and for other compilers).
 *
 * Memory: every row is read once and written once; the expert rows are
 * prefetched BM_PF elements ahead and, during the norm pass (which loads
 * nothing), the next token's first lines; large aligned outputs use
 * streaming stores. Prefetches never fault, so a prefetch past the live
 * rows is harmless.
 *
 * Same IEEE operations in the same order per element as SPEC.md section 2
 * (and as the portable code of rows.c); only the placement of elements in
 * registers differs:
 * - a 32-bit load of two BF16 values widens without shuffles: u << 16 is the
 *   even element, u & 0xFFFF0000 the odd one. Each register of a "unit"
 *   (2*BM_W consecutive elements) is thus split into an even and an odd
 *   vector, and a rounded result packs back as (even >> 16) | odd.
 * - RMSNorm's chunk-of-8 sums need the 8 squares of one chunk in one lane:
 *   4 units hold BM_W chunks (chunk g of a unit = even and odd lanes
 *   4g..4g+3), and a 4x4 transpose inside every 128-bit lane puts element j
 *   of each of them in one vector, so the sequential sum
 *   ((q0 + q1) + q2) + ... + q7 is 7 vertical adds. One permute restores the
 *   chunks' natural order before SPEC's halving tree.
 */

#define BM_CAT2(a, b) a##b
#define BM_CAT(a, b) BM_CAT2(a, b)
#define VF BM_CAT(bm_vf, BM_W)
#define VU BM_CAT(bm_vu, BM_W)
#define VI BM_CAT(bm_vi, BM_W)

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

static inline __attribute__((always_inline)) VU BM_CAT(bm_load_, BM_W)(const uint16_t *p)
{
    VU u;
    memcpy(&u, p, sizeof u);
    return u;
}

/* nt: a streaming store (p aligned to the vector size), no read for
 * ownership of a line the row will not read again. */
static inline __attribute__((always_inline)) void BM_CAT(bm_store_, BM_W)(uint16_t *p, VU u, const int nt)
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

/* f(bf16(v)) as bits, every lane: SPEC's integer rounding, NaN -> 0x7FFF. */
static inline __attribute__((always_inline)) VU BM_CAT(bm_rnd_, BM_W)(VF v)
{
#if BM_W == 16
    /* the same formula with AVX-512 masks: u + 0x7FFF, plus 1 where bit 16
     * is set, top half kept where v is not NaN, else 0x7FFF0000 (5 vector
     * operations instead of 8: this rounding dominates the norm pass) */
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

#define LOAD BM_CAT(bm_load_, BM_W)
#define STORE BM_CAT(bm_store_, BM_W)
#define RND BM_CAT(bm_rnd_, BM_W)
#define EVEN(u) ((VF)((u) << 16))
#define ODD(u) ((VF)((u) & BM_HI16))

/* 4x4 transposes inside every 128-bit lane: t_j lane 4g+v = a_v lane 4g+j. */
static inline __attribute__((always_inline)) void BM_CAT(bm_tr4_, BM_W)(VF a0, VF a1, VF a2, VF a3, VF *t)
{
    VF l01 = __builtin_shuffle(a0, a1, BM_UNPLO), l23 = __builtin_shuffle(a2, a3, BM_UNPLO);
    VF h01 = __builtin_shuffle(a0, a1, BM_UNPHI), h23 = __builtin_shuffle(a2, a3, BM_UNPHI);
    t[0] = __builtin_shuffle(l01, l23, BM_UNPLO64);
    t[1] = __builtin_shuffle(l01, l23, BM_UNPHI64);
    t[2] = __builtin_shuffle(h01, h23, BM_UNPLO64);
    t[3] = __builtin_shuffle(h01, h23, BM_UNPHI64);
}

/* The finalize sums of the block of 8*W columns at h0 into e0..e3 (even)
 * and o0..o3 (odd): a = +0.0, then a = a + w[k] * f(x[k][h]) for k in
 * order. A macro, so that the 8 sums are plain locals kept in registers
 * while the top_k rows stream in. */
#define BM_SUMS(x, w, top_k, hs, h0)                                                               \
    do {                                                                                           \
        int32_t k_, i_;                                                                            \
        e0 = e1 = e2 = e3 = o0 = o1 = o2 = o3 = (VF){0};                                           \
        for (k_ = 0; k_ < (top_k); k_++) {                                                         \
            const uint16_t *xk_ = (x) + (size_t)k_ * (size_t)(hs) + (h0);                          \
            const float wk_ = (w)[k_];                                                             \
            VU u0_, u1_, u2_, u3_;                                                                 \
            /* BM_PF elements ahead in every expert row: +15-25% measured                          \
             * over the hardware prefetcher alone on 8 interleaved streams */                      \
            for (i_ = 0; i_ < 8 * BM_W; i_ += 32) __builtin_prefetch(xk_ + BM_PF + i_, 0, 3);     \
            u0_ = LOAD(xk_), u1_ = LOAD(xk_ + 2 * BM_W);                                           \
            u2_ = LOAD(xk_ + 4 * BM_W), u3_ = LOAD(xk_ + 6 * BM_W);                                \
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

/* The finalized row's bits from the sums: s = bf16(f(bf16(a)) * rs). */
static inline __attribute__((always_inline)) void BM_CAT(bm_fin_, BM_W)(const bm_args *a, VF e, VF o, VU *re,
                                                                     VU *ro)
{
    *re = RND(e);
    *ro = RND(o);
    if (a->routed_scale != 1.0f) { /* exact when 1: skipped like rows.c */
        *re = RND((VF)*re * a->routed_scale);
        *ro = RND((VF)*ro * a->routed_scale);
    }
}

/* One unit: finalize sums (even e, odd o) -> residual stage. Writes hidden
 * and returns the widened hidden values in *ve, *vo. */
static inline __attribute__((always_inline)) void BM_CAT(bm_unit_, BM_W)(const bm_args *a, VF e, VF o,
                                                                      const uint16_t *res, uint16_t *hid,
                                                                      VF *ve, VF *vo, const int nt)
{
    VU re, ro, r, he, ho;
    BM_CAT(bm_fin_, BM_W)(a, e, o, &re, &ro);
    r = LOAD(res); /* read before hid is written: hid may be res */
    if (a->has_scales) {
        const float sx = a->scale_x, sr = a->scale_r;
        he = RND((VF)RND((VF)re * sx) + (VF)RND(EVEN(r) * sr));
        ho = RND((VF)RND((VF)ro * sx) + (VF)RND(ODD(r) * sr));
    } else {
        he = RND((VF)re + EVEN(r));
        ho = RND((VF)ro + ODD(r));
    }
    STORE(hid, (he >> 16) | ho, nt);
    *ve = (VF)he;
    *vo = (VF)ho;
}

static inline __attribute__((always_inline)) void BM_CAT(bm_simd_fused_nt_, BM_W)(
    const bm_args *a, int64_t row, const uint16_t *residual, uint16_t *hidden, uint16_t *normalized,
    const int nt)
{
    enum { W = BM_W, U = 2 * BM_W, BLK = 8 * BM_W };
    VU hb[BM_MAX_HIDDEN / 2 / BM_W];         /* the hidden row's bits, for the norm */
    VF partv[BM_MAX_HIDDEN / 8 / BM_W];      /* chunk sums, natural order */
    float *part = (float *)partv;
    const int32_t hs = a->hidden, top_k = a->top_k, chunks = hs / 8;
    const uint16_t *x = a->experts + (size_t)row * (size_t)top_k * (size_t)hs;
    const float *w = a->weights + (size_t)row * (size_t)top_k;
    const int norm = a->next.on;
    int32_t h0, n2, s, c, i;

    for (h0 = 0; h0 < hs; h0 += BLK) {
        VF e0, e1, e2, e3, o0, o1, o2, o3, ve[4], vo[4];
        BM_SUMS(x, w, top_k, hs, h0);
        BM_CAT(bm_unit_, BM_W)(a, e0, o0, residual + h0, hidden + h0, &ve[0], &vo[0], nt);
        BM_CAT(bm_unit_, BM_W)(a, e1, o1, residual + h0 + U, hidden + h0 + U, &ve[1], &vo[1], nt);
        BM_CAT(bm_unit_, BM_W)(a, e2, o2, residual + h0 + 2 * U, hidden + h0 + 2 * U, &ve[2], &vo[2], nt);
        BM_CAT(bm_unit_, BM_W)(a, e3, o3, residual + h0 + 3 * U, hidden + h0 + 3 * U, &ve[3], &vo[3], nt);
        if (norm) {
            VF te[4], to[4], p;
            for (i = 0; i < 4; i++) hb[h0 / U + i] = ((VU)ve[i] >> 16) | (VU)vo[i];
            BM_CAT(bm_tr4_, BM_W)(ve[0], ve[1], ve[2], ve[3], te);
            BM_CAT(bm_tr4_, BM_W)(vo[0], vo[1], vo[2], vo[3], to);
            /* ((((((q0 + q1) + q2) + q3) + q4) + q5) + q6) + q7 per chunk */
            p = te[0] * te[0];
            p = p + to[0] * to[0];
            p = p + te[1] * te[1];
            p = p + to[1] * to[1];
            p = p + te[2] * te[2];
            p = p + to[2] * to[2];
            p = p + te[3] * te[3];
            p = p + to[3] * to[3];
            partv[h0 / BLK] = __builtin_shuffle(p, BM_CHUNKS);
        }
    }
    if (!norm) return;

    /* SPEC's tree: zero padding to a power of two, strided halving */
    for (n2 = 1; n2 < chunks; n2 *= 2) continue;
    for (c = chunks; c < n2; c++) part[c] = 0.0f;
    for (s = n2 / 2; s >= 1; s /= 2)
        for (c = 0; c < s; c++) part[c] = part[c] + part[c + s];
    {
        const float inv = 1.0f / sqrtf(part[0] / (float)hs + a->next.eps);
        const uint16_t *nw = a->next.weight;
        const uint16_t *nx = x + (size_t)top_k * (size_t)hs; /* the next token's rows */
        const int pf = row + 1 < a->tokens;
        for (h0 = 0, i = 0; h0 < hs; h0 += U, i++) {
            VU ue = RND(EVEN(hb[i]) * inv), uo = RND(ODD(hb[i]) * inv);
            /* no loads from memory in this pass: start the next token's
             * expert rows (one line per step, round robin over k) */
            if (pf && (i / top_k) * 32 < hs)
                __builtin_prefetch(nx + (size_t)(i % top_k) * (size_t)hs + (i / top_k) * 32, 0, 3);
            if (nw) {
                VU wu = LOAD(nw + h0);
                ue = RND((VF)ue * EVEN(wu));
                uo = RND((VF)uo * ODD(wu));
            }
            STORE(normalized + h0, (ue >> 16) | uo, nt);
        }
    }
}

/* Streaming stores when the outputs are large (they would only evict the
 * inputs' lines from the caches) and aligned to the vector size; a fence
 * orders them before anything the row's thread does next. */
static void BM_CAT(bm_simd_fused_, BM_W)(const bm_args *a, int64_t row, const uint16_t *residual,
                                         uint16_t *hidden, uint16_t *normalized)
{
    const uintptr_t mis = (uintptr_t)hidden | (a->next.on ? (uintptr_t)normalized : 0);
    if ((uint64_t)a->tokens * (uint64_t)a->hidden >= BM_NT_MIN_ELEMS && mis % (4 * BM_W) == 0) {
        BM_CAT(bm_simd_fused_nt_, BM_W)(a, row, residual, hidden, normalized, 1);
        _mm_sfence();
    } else {
        BM_CAT(bm_simd_fused_nt_, BM_W)(a, row, residual, hidden, normalized, 0);
    }
}

/* The finalize stage alone (post-norm off) of token `row` into out. */
static inline __attribute__((always_inline)) void BM_CAT(bm_simd_finalize_nt_, BM_W)(const bm_args *a,
                                                                                  int64_t row,
                                                                                  uint16_t *out,
                                                                                  const int nt)
{
    const int32_t hs = a->hidden, top_k = a->top_k;
    const uint16_t *x = a->experts + (size_t)row * (size_t)top_k * (size_t)hs;
    const float *w = a->weights + (size_t)row * (size_t)top_k;
    int32_t h0;
    for (h0 = 0; h0 < hs; h0 += 8 * BM_W) {
        VF e0, e1, e2, e3, o0, o1, o2, o3;
        VU re, ro;
        BM_SUMS(x, w, top_k, hs, h0);
        BM_CAT(bm_fin_, BM_W)(a, e0, o0, &re, &ro);
        STORE(out + h0, (re >> 16) | ro, nt);
        BM_CAT(bm_fin_, BM_W)(a, e1, o1, &re, &ro);
        STORE(out + h0 + 2 * BM_W, (re >> 16) | ro, nt);
        BM_CAT(bm_fin_, BM_W)(a, e2, o2, &re, &ro);
        STORE(out + h0 + 4 * BM_W, (re >> 16) | ro, nt);
        BM_CAT(bm_fin_, BM_W)(a, e3, o3, &re, &ro);
        STORE(out + h0 + 6 * BM_W, (re >> 16) | ro, nt);
    }
}

static void BM_CAT(bm_simd_finalize_, BM_W)(const bm_args *a, int64_t row, uint16_t *out)
{
    if ((uint64_t)a->tokens * (uint64_t)a->hidden >= BM_NT_MIN_ELEMS && (uintptr_t)out % (4 * BM_W) == 0) {
        BM_CAT(bm_simd_finalize_nt_, BM_W)(a, row, out, 1);
        _mm_sfence();
    } else {
        BM_CAT(bm_simd_finalize_nt_, BM_W)(a, row, out, 0);
    }
}

#undef BM_SUMS
#undef LOAD
#undef STORE
#undef RND
#undef EVEN
#undef ODD
#undef BM_UNPLO
#undef BM_UNPHI
#undef BM_UNPLO64
#undef BM_UNPHI64
#undef BM_CHUNKS
#undef BM_HI16
#undef VF
#undef VU
#undef VI
#undef BM_CAT
#undef BM_CAT2
