/*
 * problem.c - inputs, outputs and one call of a local operation (problem.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "devmem.h"
#include "problem.h"
#include "reference.h"

const char *gen_name(tool_gen g)
{
    static const char *n[GEN_COUNT] = {"normal", "nan",  "inf",  "zero",
                                       "subnormal", "ties", "huge", "mixed"};
    return (g >= 0 && g < GEN_COUNT) ? n[g] : "?";
}

const char *op_name(tool_op op)
{
    return op == OP_FINALIZE ? "finalize" : op == OP_NRN ? "nrn" : "fused";
}

/* ---- value generators ---- */

static uint16_t bf_uniform(tool_rng *r, float lo, float hi)
{
    return f32_to_bf16(rng_uniform(r, lo, hi));
}

static uint16_t pick(tool_rng *r, const uint16_t *set, uint32_t n) { return set[rng_below(r, n)]; }

/* Two draws in one expression (a[draw()] = draw(), draw() * draw()) run in
 * an order the compiler picks: GCC and clang differ. Every draw below is its
 * own statement, in the order GCC took, so a seed gives the same inputs from
 * every compiler and the same as before. */
static float rng_sign(tool_rng *r) { return rng_below(r, 2) ? -1.0f : 1.0f; }

static uint16_t bf_signed_uniform(tool_rng *r, float lo, float hi)
{
    const float sign = rng_sign(r);
    return f32_to_bf16(sign * rng_uniform(r, lo, hi));
}

static const uint16_t nan_set[] = {0x7FC0, 0xFFC0, 0x7F81, 0xFFFF, 0x7FFF};
static const uint16_t inf_set[] = {0x7F80, 0xFF80};

/* sign * (1 + m/128) * 2^e: few significant bits, so sums and products of
 * such values often fall exactly halfway between two BF16 values. */
static uint16_t bf_tie_value(tool_rng *r, int emin, int emax)
{
    uint16_t sign = (uint16_t)(rng_below(r, 2) << 15);
    int e = emin + (int)rng_below(r, (uint32_t)(emax - emin + 1));
    uint16_t m = (uint16_t)rng_below(r, 4);
    return (uint16_t)(sign | ((uint16_t)(127 + e) << 7) | m);
}

static uint16_t bf_subnormal(tool_rng *r)
{
    uint16_t sign = (uint16_t)(rng_below(r, 2) << 15);
    if (rng_below(r, 10) < 7) return (uint16_t)(sign | (1 + rng_below(r, 127)));
    return (uint16_t)(sign | (0x0080 + rng_below(r, 0x80))); /* smallest normals */
}

static uint16_t bf_huge(tool_rng *r)
{
    uint16_t sign = (uint16_t)(rng_below(r, 2) << 15);
    return (uint16_t)(sign | (0x7F7F - rng_below(r, 8)));
}

/* Put v at `count` random positions of a[0..n). */
static void sprinkle(tool_rng *r, uint16_t *a, size_t n, int count, const uint16_t *set,
                     uint32_t nset)
{
    int i;
    if (!a || n == 0) return;
    for (i = 0; i < count; i++) {
        size_t at = (size_t)(rng_unit(r) * (double)n); /* position, then value */
        a[at] = pick(r, set, nset);
    }
}

/* Fill one live row t of every input with the pattern of mode g. */
static void gen_row(problem *p, int64_t t, tool_gen g, tool_rng *r)
{
    /* negative sizes (bad options of `run`) are the library's to reject:
     * clamp them like problem_make so that nothing here runs past a buffer */
    size_t K = (size_t)(p->top_k > 0 ? p->top_k : 0), H = (size_t)(p->hidden > 0 ? p->hidden : 0), i;
    uint16_t *e = p->experts ? p->experts + (size_t)t * K * H : NULL;
    float *w = p->weights ? p->weights + (size_t)t * K : NULL;
    uint16_t *x = p->x ? p->x + (size_t)t * H : NULL;
    uint16_t *res = p->residual ? p->residual + (size_t)t * H : NULL;
    size_t ne = e ? K * H : 0, nh = H;

    /* the moderate base every mode starts from */
    for (i = 0; i < ne; i++) e[i] = bf_uniform(r, -3.0f, 3.0f);
    if (w)
        for (i = 0; i < K; i++) w[i] = rng_uniform(r, 0.0f, 1.0f);
    if (x)
        for (i = 0; i < nh; i++) x[i] = bf_uniform(r, -3.0f, 3.0f);
    if (res)
        for (i = 0; i < nh; i++) res[i] = bf_uniform(r, -10.0f, 10.0f);

    switch (g) {
    case GEN_NORMAL:
    case GEN_MIXED:
    case GEN_COUNT:
        break;
    case GEN_NAN:
    case GEN_INF: {
        /* Half the rows stay clean, so the norms (which spread one NaN over
         * a whole row) leave rows to compare; the other half get the value
         * in one kind of input only. */
        const uint16_t *set = g == GEN_NAN ? nan_set : inf_set;
        uint32_t nset = g == GEN_NAN ? 5 : 2;
        if (rng_below(r, 2)) break;
        switch (rng_below(r, 4)) {
        case 0:
            sprinkle(r, e, ne, 1 + (int)rng_below(r, 3), set, nset);
            break;
        case 1:
            if (w) {
                /* value, then position: the order GCC builds always took */
                const float v = g == GEN_NAN ? NAN : rng_below(r, 2) ? INFINITY : -INFINITY;
                w[rng_below(r, (uint32_t)K)] = v;
                /* and a zero weight against an inf element: 0 * inf */
                if (g == GEN_INF && e && K > 1) {
                    const uint16_t inf = pick(r, inf_set, 2); /* value, then position */
                    w[0] = 0.0f;
                    e[rng_below(r, (uint32_t)H)] = inf;
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
    case GEN_ZERO: {
        static const float wz[] = {0.0f, -0.0f, 0.5f, -0.5f};
        for (i = 0; i < ne; i++) e[i] = (uint16_t)(rng_below(r, 2) << 15);
        if (w)
            for (i = 0; i < K; i++) w[i] = wz[rng_below(r, 4)];
        if (x)
            for (i = 0; i < nh; i++) x[i] = (uint16_t)(rng_below(r, 2) << 15);
        if (res)
            for (i = 0; i < nh; i++) res[i] = (uint16_t)(rng_below(r, 2) << 15);
        break;
    }
    case GEN_SUBNORMAL:
        for (i = 0; i < ne; i++) e[i] = bf_subnormal(r);
        if (w)
            for (i = 0; i < K; i++)
                if (rng_below(r, 2)) w[i] = f32_from_bits(1 + rng_below(r, 0x7FFFFF));
        if (x)
            for (i = 0; i < nh; i++) x[i] = bf_subnormal(r);
        if (res)
            for (i = 0; i < nh; i++) res[i] = bf_subnormal(r);
        break;
    case GEN_TIES:
        for (i = 0; i < ne; i++) e[i] = bf_tie_value(r, -9, 0);
        if (w)
            for (i = 0; i < K; i++) {
                const float sign = rng_sign(r);
                w[i] = sign * ldexpf(1.0f, (int)rng_below(r, 4) - 2);
            }
        if (x)
            for (i = 0; i < nh; i++) x[i] = bf_tie_value(r, -9, 0);
        if (res)
            for (i = 0; i < nh; i++) res[i] = bf_tie_value(r, -9, 2);
        break;
    case GEN_HUGE: {
        /* one of three overflows per row: squares past FLT_MAX (the norm's
         * mean becomes inf, its inverse 0), a sum or product past the BF16
         * maximum (rounds to inf), an add of two near-maximum values */
        uint32_t v = rng_below(r, 3);
        if (v == 0) {
            for (i = 0; i < ne; i++)
                e[i] = bf_signed_uniform(r, 1e19f, 1e20f);
            if (x)
                for (i = 0; i < nh; i++)
                    x[i] = bf_signed_uniform(r, 1e19f, 1e20f);
        } else if (v == 1) {
            if (w)
                for (i = 0; i < K; i++) w[i] = rng_uniform(r, 0.6f, 1.4f);
            for (i = 0; i < 3 && ne; i++) {
                size_t at = (size_t)(rng_unit(r) * (double)ne);
                e[at] = bf_huge(r);
            }
            for (i = 0; i < 3 && x; i++) {
                size_t at = (size_t)(rng_unit(r) * (double)nh);
                x[at] = bf_huge(r);
            }
        } else {
            for (i = 0; i < 3 && res; i++) {
                size_t at = (size_t)(rng_unit(r) * (double)nh);
                res[at] = (uint16_t)(bf_huge(r) & 0x7FFF);
                if (x) x[at] = (uint16_t)(bf_huge(r) & 0x7FFF);
            }
        }
        break;
    }
    }
}

/* In corner-case problems a few columns get odd weights too: zeros, a
 * subnormal, a negative one; the last norm (next) also inf and BF16 max.
 * No inf or huge weight before the last norm: one such column reaches every
 * row's next norm and leaves nothing but NaN and zeros to compare. */
static void gen_norm_weight(uint16_t *nw, int32_t H, tool_gen g, int last, tool_rng *r)
{
    static const uint16_t odd[] = {0x0000, 0x8000, 0x0001, 0xBF80, 0x7F80, 0x7F7F};
    int32_t h;
    for (h = 0; h < H; h++) nw[h] = bf_uniform(r, 0.5f, 1.5f);
    if (g != GEN_NORMAL)
        for (h = 0; h < H; h++)
            if (rng_below(r, 50) == 0) nw[h] = pick(r, odd, last ? 6 : 4);
}

int problem_make(problem *p, tool_op op, int64_t tokens, int64_t capacity, int32_t top_k,
                 int32_t hidden, unsigned opts, float routed_scale, const float scales[2],
                 float eps, tool_gen gen, uint64_t seed)
{
    tool_rng r;
    int64_t t;
    size_t K = (size_t)(top_k > 0 ? top_k : 0), H = (size_t)(hidden > 0 ? hidden : 0);
    size_t C = (size_t)(capacity > 0 ? capacity : 0);

    memset(p, 0, sizeof *p);
    p->op = op;
    p->tokens = tokens;
    p->capacity = capacity;
    p->top_k = top_k;
    p->hidden = hidden;
    p->opts = opts;
    p->routed_scale = routed_scale;
    p->scales[0] = scales ? scales[0] : 1.0f;
    p->scales[1] = scales ? scales[1] : 1.0f;
    p->eps = eps;
    p->post_eps = eps;
    p->next_eps = eps;
    rng_seed(&r, seed);
    /* sizes that do not even fit the address space: fail like malloc would */
    if ((double)C * (double)(K ? K : 1) * (double)(H ? H : 1) * 4.0 > 1e15) return -1;

    if (op != OP_NRN) {
        p->experts = xmalloc(C * K * H * 2);
        p->weights = xmalloc(C * K * 4);
        if (!p->experts || !p->weights) goto oom;
    } else {
        p->x = xmalloc(C * H * 2);
        if (!p->x) goto oom;
    }
    if (op != OP_FINALIZE) {
        p->residual = xmalloc(C * H * 2);
        if (!p->residual) goto oom;
    }
    p->post_w = xmalloc(H * 2);
    p->pre_w = xmalloc(H * 2);
    p->next_w = xmalloc(H * 2);
    if (!p->post_w || !p->pre_w || !p->next_w) goto oom;
    gen_norm_weight(p->post_w, hidden, gen, 0, &r);
    gen_norm_weight(p->pre_w, hidden, gen, 0, &r);
    gen_norm_weight(p->next_w, hidden, gen, 1, &r);

    /* rows past the live ones: NaN everywhere, they must never be read */
    if (p->experts) fill_u16(p->experts, IN_PAD_NAN, C * K * H);
    if (p->weights)
        for (t = 0; t < (int64_t)(C * K); t++) p->weights[t] = NAN;
    if (p->x) fill_u16(p->x, IN_PAD_NAN, C * H);
    if (p->residual) fill_u16(p->residual, IN_PAD_NAN, C * H);

    for (t = 0; t < tokens && t < capacity; t++) {
        tool_gen g = gen;
        if (g == GEN_MIXED) g = (tool_gen)rng_below(&r, GEN_MIXED);
        gen_row(p, t, g, &r);
    }
    return 0;
oom:
    problem_free(p);
    return -1;
}

void problem_free(problem *p)
{
    free(p->experts);
    free(p->weights);
    free(p->x);
    free(p->residual);
    free(p->post_w);
    free(p->pre_w);
    free(p->next_w);
    memset(p, 0, sizeof *p);
}

const beam_norm *problem_norm(const problem *p, unsigned on_bit, beam_norm *storage,
                              const uint16_t *weight_ptr, unsigned w_bit)
{
    if (!(p->opts & on_bit)) return NULL;
    storage->weight = (p->opts & w_bit) ? weight_ptr : NULL;
    storage->eps = on_bit == OPT_POST ? p->post_eps : on_bit == OPT_NEXT ? p->next_eps : p->eps;
    return storage;
}

/* ---- outputs ---- */

static size_t out_elems(const outputs *o) { return (size_t)o->rows * (size_t)o->hidden; }

int outputs_make(outputs *o, const problem *p)
{
    int64_t t = p->tokens > 0 ? p->tokens : 0;
    memset(o, 0, sizeof *o);
    o->rows = t + OUT_GUARD_ROWS;
    o->hidden = p->hidden > 0 ? p->hidden : 0;
    if (p->op == OP_FINALIZE) {
        o->out = xmalloc(out_elems(o) * 2);
        if (!o->out) return -1;
    } else {
        o->hidden_out = xmalloc(out_elems(o) * 2);
        o->normalized = xmalloc(out_elems(o) * 2);
        if (!o->hidden_out || !o->normalized) {
            outputs_free(o);
            return -1;
        }
    }
    outputs_reset(o);
    return 0;
}

void outputs_reset(outputs *o)
{
    if (o->out) fill_u16(o->out, OUT_SENTINEL, out_elems(o));
    if (o->hidden_out) fill_u16(o->hidden_out, OUT_SENTINEL, out_elems(o));
    if (o->normalized) fill_u16(o->normalized, OUT_SENTINEL, out_elems(o));
}

void outputs_free(outputs *o)
{
    free(o->out);
    free(o->hidden_out);
    free(o->normalized);
    memset(o, 0, sizeof *o);
}

void outputs_compare(const outputs *got, const outputs *want, const problem *p, cmp_result *c)
{
    size_t n = out_elems(want);
    if (p->op == OP_FINALIZE) {
        cmp_bf16(c, got->out, want->out, n);
    } else {
        cmp_bf16(c, got->hidden_out, want->hidden_out, n);
        cmp_bf16(c, got->normalized, want->normalized, n);
    }
}

uint64_t outputs_checksum(const outputs *o, const problem *p)
{
    uint64_t h = FNV1A64_INIT;
    size_t n = (size_t)(p->tokens > 0 ? p->tokens : 0) * (size_t)o->hidden;
    if (p->op == OP_FINALIZE) return fnv1a64_bf16(h, o->out, n);
    h = fnv1a64_bf16(h, o->hidden_out, n);
    if (p->opts & OPT_NEXT) h = fnv1a64_bf16(h, o->normalized, n);
    return h;
}

void problem_reference(const problem *p, outputs *o)
{
    beam_norm sp, sr, sn;
    const beam_norm *post = problem_norm(p, OPT_POST, &sp, p->post_w, OPT_POST_W);
    const beam_norm *pre = problem_norm(p, OPT_PRE, &sr, p->pre_w, OPT_PRE_W);
    const beam_norm *next = problem_norm(p, OPT_NEXT, &sn, p->next_w, OPT_NEXT_W);
    const float *scales = (p->opts & OPT_SCALES) ? p->scales : NULL;
    switch (p->op) {
    case OP_FINALIZE:
        ref_finalize(p->experts, p->weights, p->tokens, p->top_k, p->hidden, p->routed_scale,
                     post, o->out);
        break;
    case OP_NRN:
        ref_norm_residual_norm(p->x, p->residual, p->tokens, p->hidden, pre, scales, next,
                               o->hidden_out, o->normalized);
        break;
    case OP_FUSED:
        ref_finalize_norm_residual_norm(p->experts, p->weights, p->tokens, p->top_k, p->hidden,
                                        p->routed_scale, post, p->residual, scales, next,
                                        o->hidden_out, o->normalized);
        break;
    }
}

/* ---- binding to a backend's memory ---- */

/* Host pointer as is, or a device copy of it (NULL stays NULL). */
static void *place(bound *b, const void *host, size_t bytes, int *fail, char *err, size_t errn)
{
    void *d;
    if (!host || *fail) return (void *)host;
    if (!b->on_device) return (void *)host;
    d = dev_alloc(bytes);
    if (!d || dev_upload(d, host, bytes)) {
        snprintf(err, errn, "%s", dev_last_error());
        dev_free(d);
        *fail = 1;
        return NULL;
    }
    b->dev[b->ndev++] = d;
    return d;
}

int bound_make(bound *b, const problem *p, outputs *o, int on_device, int inplace, char *err,
               size_t errn)
{
    size_t K = (size_t)(p->top_k > 0 ? p->top_k : 0), H = (size_t)o->hidden;
    size_t C = (size_t)(p->capacity > 0 ? p->capacity : 0);
    size_t ob = (size_t)o->rows * H * 2;
    int fail = 0;

    memset(b, 0, sizeof *b);
    b->p = p;
    b->o = o;
    b->on_device = on_device;
    b->inplace = inplace && p->op != OP_FINALIZE;
    outputs_reset(o);
    if (b->inplace && p->tokens > 0) /* hidden_out starts as the residual */
        memcpy(o->hidden_out, p->residual, (size_t)p->tokens * H * 2);

    b->experts = place(b, p->experts, C * K * H * 2, &fail, err, errn);
    b->weights = place(b, p->weights, C * K * 4, &fail, err, errn);
    b->x = place(b, p->x, C * H * 2, &fail, err, errn);
    b->out = place(b, o->out, ob, &fail, err, errn);
    b->hidden_out = place(b, o->hidden_out, ob, &fail, err, errn);
    b->normalized = place(b, o->normalized, ob, &fail, err, errn);
    b->residual = b->inplace ? b->hidden_out : place(b, p->residual, C * H * 2, &fail, err, errn);
    b->post_p = problem_norm(p, OPT_POST, &b->post, p->post_w, OPT_POST_W);
    b->pre_p = problem_norm(p, OPT_PRE, &b->pre, p->pre_w, OPT_PRE_W);
    b->next_p = problem_norm(p, OPT_NEXT, &b->next, p->next_w, OPT_NEXT_W);
    if (b->post_p && b->post.weight) b->post.weight = place(b, p->post_w, H * 2, &fail, err, errn);
    if (b->pre_p && b->pre.weight) b->pre.weight = place(b, p->pre_w, H * 2, &fail, err, errn);
    if (b->next_p && b->next.weight) b->next.weight = place(b, p->next_w, H * 2, &fail, err, errn);
    if (fail) {
        bound_free(b);
        return -1;
    }
    return 0;
}

beam_status bound_call(const bound *b, beam_strategy strategy)
{
    const problem *p = b->p;
    const float *scales = (p->opts & OPT_SCALES) ? p->scales : NULL;
    uint16_t *normalized = b->next_p ? b->normalized : NULL;
    switch (p->op) {
    case OP_FINALIZE:
        return beam_moe_finalize(b->experts, b->weights, p->capacity, p->tokens, p->top_k,
                                 p->hidden, p->routed_scale, b->post_p, b->out, NULL);
    case OP_NRN:
        return beam_norm_residual_norm(b->x, b->residual, p->tokens, p->hidden, b->pre_p, scales,
                                       b->next_p, b->hidden_out, normalized, NULL);
    case OP_FUSED:
        return beam_moe_finalize_norm_residual_norm(
            b->experts, b->weights, p->capacity, p->tokens, p->top_k, p->hidden, p->routed_scale,
            b->post_p, b->residual, scales, b->next_p, b->hidden_out, normalized, strategy, NULL);
    }
    return BEAM_ERR_INVALID_ARGUMENT;
}

int bound_finish(bound *b, char *err, size_t errn)
{
    size_t ob = (size_t)b->o->rows * (size_t)b->o->hidden * 2;
    if (!b->on_device) return 0;
    if (dev_sync() || (b->o->out && dev_download(b->o->out, b->out, ob)) ||
        (b->o->hidden_out && dev_download(b->o->hidden_out, b->hidden_out, ob)) ||
        (b->o->normalized && dev_download(b->o->normalized, b->normalized, ob))) {
        snprintf(err, errn, "%s", dev_last_error());
        return -1;
    }
    return 0;
}

void bound_free(bound *b)
{
    int i;
    for (i = 0; i < b->ndev; i++) dev_free(b->dev[i]);
    b->ndev = 0;
}
