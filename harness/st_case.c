/*
 * st_case.c - cases from and to safetensors files (see st_case.h).
 *
 * Reading turns a file into the same case the tool's generator makes, so
 * the audit of a file is the audit of a case: same rows, same table, same
 * exit status. Everything a file can get wrong (names, dtypes, shapes,
 * metadata, the library's own argument rules) is found here, before any
 * call.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st_case.h"
#include "text.h"

/* ---- errors ---- */

typedef struct in_err {
    char msg[512];
} in_err;

static int fail(in_err *e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- metadata ---- */

/* (Values are the file's text: quoted escaped, 40 characters at most.) */
static int meta_f32(const st_file *f, const char *key, float *out, int *given, in_err *e)
{
    const char *s = st_meta(f, key);
    char *end, v[HU_ESC_NAME];
    *given = 0;
    if (!s) return 0;
    errno = 0;
    *out = strtof(s, &end);
    if (end == s || *end)
        return fail(e, "metadata %s=\"%s\" is not a number", key, hu_escape(v, sizeof v, s, 40));
    *given = 1;
    return 0;
}

static int meta_pair(const st_file *f, const char *key, float out[2], int *given, in_err *e)
{
    const char *s = st_meta(f, key);
    char v[HU_ESC_NAME];
    *given = 0;
    if (!s) return 0;
    if (hu_split_pair(s, out) != 0)
        return fail(e, "metadata %s=\"%s\" is not two numbers \"a,b\"", key,
                    hu_escape(v, sizeof v, s, 40));
    *given = 1;
    return 0;
}

/* ---- tensors ---- */

static const char *shape_text(const st_tensor *t, char *buf, size_t n)
{
    size_t used;
    int d;
    snprintf(buf, n, "[");
    for (d = 0; d < t->ndim; d++) {
        used = strlen(buf);
        snprintf(buf + used, n - used, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    }
    used = strlen(buf);
    snprintf(buf + used, n - used, "]");
    return buf;
}

/* Tensor `name` with the given dtype and rank, or NULL (absent, or e set:
 * check e->msg[0]). */
static const st_tensor *get(const st_file *f, const char *name, const char *dtype, int ndim,
                            const char *want_shape, in_err *e)
{
    const st_tensor *t = st_find(f, name);
    char sb[128];
    if (!t) return NULL;
    if (strcmp(t->dtype, dtype)) {
        fail(e, "tensor '%s' has dtype %s, expected %s %s", name, t->dtype, dtype, want_shape);
        return NULL;
    }
    if (ndim && t->ndim != ndim) {
        fail(e, "tensor '%s' has shape %s, expected %s", name, shape_text(t, sb, sizeof sb),
             want_shape);
        return NULL;
    }
    return t;
}

static int check_vec(const st_tensor *t, int64_t H, in_err *e)
{
    char sb[128];
    if (t && t->shape[0] != H)
        return fail(e, "tensor '%s' has shape %s, expected [hidden] = [%lld]", t->name,
                    shape_text(t, sb, sizeof sb), (long long)H);
    return 0;
}

static int check_rows(const st_tensor *t, int64_t T, int64_t H, in_err *e)
{
    char sb[128];
    if (t && (t->shape[0] != T || t->shape[1] != H))
        return fail(e, "tensor '%s' has shape %s, expected [live_tokens, hidden] = [%lld, %lld]",
                    t->name, shape_text(t, sb, sizeof sb), (long long)T, (long long)H);
    return 0;
}

/* Known names; anything else gets a note (a typo would otherwise turn an
 * intended norm silently off). */
static const char *const known[] = {"expert_outputs", "expert_weights", "residual",
                                    "post_norm_weight", "next_norm_weight", "output",
                                    "hidden", "normalized"};

/* The library's own rules for top_k and hidden, before anything is sized
 * from them: a call with no rows checks them and writes nothing. */
static int probe_library(int64_t K, int64_t H, in_err *e)
{
    static uint16_t x[8], out[8];
    static float w[8];
    beam_status st;
    if (K > INT32_MAX || H > INT32_MAX)
        return fail(e, "top_k=%lld, hidden=%lld: out of the 32-bit range", (long long)K,
                    (long long)H);
    st = beam_moe_finalize(x, w, 0, 0, (int32_t)K, (int32_t)H, 1.0f, NULL, out, NULL);
    if (st != BEAM_OK)
        return fail(e, "the library rejects this shape: %s: %s", beam_status_string(st),
                    beam_last_error());
    return 0;
}

static int load_case(const st_file *f, hc_case *p, hc_op *op, st_stored *s, in_err *e)
{
    const st_tensor *ex, *wt, *res, *pw, *nw;
    int64_t C, K, H, T, i;
    size_t n;
    char sb[HU_ESC_NAME];
    float rs = 1.0f, peps = 1e-6f, neps = 1e-6f, sc[2] = {1.0f, 1.0f};
    int rs_given, peps_given, neps_given, sc_given;
    const char *lt;

    memset(p, 0, sizeof *p);
    memset(s, 0, sizeof *s);
    e->msg[0] = '\0';

    ex = get(f, "expert_outputs", "BF16", 0, "[capacity, top_k, hidden]", e);
    if (!ex)
        return e->msg[0] ? -1
                         : fail(e, "missing tensor 'expert_outputs' (BF16 [capacity, top_k, hidden])");
    wt = get(f, "expert_weights", "F32", 2, "[capacity, top_k]", e);
    if (!wt)
        return e->msg[0] ? -1 : fail(e, "missing tensor 'expert_weights' (F32 [capacity, top_k])");
    C = wt->shape[0];
    K = wt->shape[1];
    if (ex->ndim == 3) {
        if (ex->shape[0] != C || ex->shape[1] != K)
            return fail(e,
                        "tensor 'expert_outputs' has shape %s, but 'expert_weights' [%lld, %lld] "
                        "says [capacity, top_k, hidden] = [%lld, %lld, hidden]",
                        shape_text(ex, sb, sizeof sb), (long long)C, (long long)K, (long long)C,
                        (long long)K);
        H = ex->shape[2];
    } else if (ex->ndim == 2) {
        /* [capacity * top_k, hidden], token-major (gemm2 output) */
        if (K == 0 || ex->shape[0] / K != C || ex->shape[0] % K != 0)
            return fail(e,
                        "tensor 'expert_outputs' has shape %s, but 'expert_weights' [%lld, %lld] "
                        "says [capacity * top_k, hidden] = [%llu, hidden]",
                        shape_text(ex, sb, sizeof sb), (long long)C, (long long)K,
                        (unsigned long long)C * (unsigned long long)K);
        H = ex->shape[1];
    } else {
        return fail(e,
                    "tensor 'expert_outputs' has shape %s, expected [capacity, top_k, hidden] "
                    "or [capacity * top_k, hidden]",
                    shape_text(ex, sb, sizeof sb));
    }
    if (probe_library(K, H, e)) return -1;

    res = get(f, "residual", "BF16", 2, "[tokens, hidden]", e);
    if (e->msg[0]) return -1;
    pw = get(f, "post_norm_weight", "BF16", 1, "[hidden]", e);
    if (e->msg[0]) return -1;
    nw = get(f, "next_norm_weight", "BF16", 1, "[hidden]", e);
    if (e->msg[0] || check_vec(pw, H, e) || check_vec(nw, H, e)) return -1;
    if (res && res->shape[1] != H)
        return fail(e, "tensor 'residual' has shape %s, expected [tokens, hidden = %lld]",
                    shape_text(res, sb, sizeof sb), (long long)H);

    if (meta_f32(f, "routed_scale", &rs, &rs_given, e) ||
        meta_f32(f, "post_eps", &peps, &peps_given, e) ||
        meta_f32(f, "next_eps", &neps, &neps_given, e) || meta_pair(f, "scales", sc, &sc_given, e))
        return -1;
    (void)rs_given;
    lt = st_meta(f, "live_tokens");
    if (lt) {
        char *end;
        long long v;
        errno = 0;
        v = strtoll(lt, &end, 10);
        if (errno || end == lt || *end || v < 0 || v > C)
            return fail(e, "metadata live_tokens=\"%s\" must be an integer in [0, capacity = %lld]",
                        hu_escape(sb, sizeof sb, lt, 40), (long long)C);
        T = v;
    } else {
        T = res ? (res->shape[0] < C ? res->shape[0] : C) : C;
    }
    if (res && res->shape[0] < T)
        return fail(e, "tensor 'residual' has %lld rows, fewer than live_tokens = %lld",
                    (long long)res->shape[0], (long long)T);
    if (!res && (nw || neps_given || sc_given))
        return fail(e, "%s needs tensor 'residual' (the fused op); without it the file is a "
                       "finalize problem",
                    nw ? "tensor 'next_norm_weight'" : neps_given ? "metadata next_eps"
                                                                  : "metadata scales");

    s->out = get(f, "output", "BF16", 2, "[live_tokens, hidden]", e);
    if (e->msg[0]) return -1;
    s->hidden = get(f, "hidden", "BF16", 2, "[live_tokens, hidden]", e);
    if (e->msg[0]) return -1;
    s->normalized = get(f, "normalized", "BF16", 2, "[live_tokens, hidden]", e);
    if (e->msg[0]) return -1;
    if (check_rows(s->out, T, H, e) || check_rows(s->hidden, T, H, e) ||
        check_rows(s->normalized, T, H, e))
        return -1;
    if (res && s->out)
        return fail(e, "tensor 'output' is the finalize result; with 'residual' (fused op) the "
                       "results are 'hidden' and 'normalized'");
    if (!res && (s->hidden || s->normalized))
        return fail(e, "tensor '%s' is a fused-op result, but the file has no 'residual'",
                    s->hidden ? "hidden" : "normalized");
    if (s->normalized && !(nw || neps_given))
        return fail(e, "tensor 'normalized' is given, but no next norm (next_norm_weight or "
                       "next_eps)");

    for (i = 0; i < f->ntensors; i++) {
        size_t k;
        int ok = 0;
        for (k = 0; k < sizeof known / sizeof known[0]; k++)
            if (!strcmp(f->tensors[i].name, known[k])) ok = 1;
        if (!ok) {
            char nm[HU_ESC_NAME];
            fprintf(stderr, "beammoe audit: note: tensor '%s' is not used\n",
                    hu_escape(nm, sizeof nm, f->tensors[i].name, 0));
        }
    }

    /* the case, laid out as the tool's generator lays it out */
    *op = res ? HC_FUSED : HC_FINALIZE;
    p->s.T = T;
    p->s.pad = C - T;
    p->cap = C;
    p->s.K = (int32_t)K;
    p->s.H = (int32_t)H;
    p->rs = rs;
    p->scales[0] = sc[0];
    p->scales[1] = sc[1];
    p->s.scales = sc_given;
    p->s.post = pw ? HC_NORM_WEIGHT : peps_given ? HC_NORM_PLAIN : HC_NORM_OFF;
    p->s.next = nw ? HC_NORM_WEIGHT : neps_given ? HC_NORM_PLAIN : HC_NORM_OFF;

    p->experts = hu_try_alloc((size_t)ex->numel * 2, 0);
    p->weights = hu_try_alloc((size_t)wt->numel * 4, 0);
    p->wpost = hu_try_alloc((size_t)H * 2, 0);
    p->wnext = hu_try_alloc((size_t)H * 2, 0);
    if (!p->experts || !p->weights || !p->wpost || !p->wnext) goto oom;
    st_get_u16(ex, p->experts);
    st_get_f32(wt, p->weights);
    if (pw) st_get_u16(pw, p->wpost);
    if (nw) st_get_u16(nw, p->wnext);
    p->post.on = p->s.post != HC_NORM_OFF;
    p->post.weight = pw ? p->wpost : NULL;
    p->post.eps = peps;
    p->next.on = p->s.next != HC_NORM_OFF;
    p->next.weight = nw ? p->wnext : NULL;
    p->next.eps = neps;
    p->pre.eps = 1e-6f;
    if (res) {
        /* capacity rows as the generated cases have; rows past the file's
         * (or past capacity) are NaN that must never be read */
        int64_t rows = res->shape[0] < C ? res->shape[0] : C;
        uint16_t *tmp;
        n = (size_t)C * (size_t)H;
        p->residual = hu_try_alloc(n * 2, 0);
        tmp = hu_try_alloc((size_t)res->numel * 2, 0);
        if (!p->residual || !tmp) {
            hu_free(tmp);
            goto oom;
        }
        st_get_u16(res, tmp);
        hu_fill_u16(p->residual, 0x7FC1, n);
        memcpy(p->residual, tmp, (size_t)rows * (size_t)H * 2);
        hu_free(tmp);
    }
    return 0;
oom:
    hc_free(p);
    return fail(e, "out of memory for the tensors");
}

int st_case_load(const st_file *f, hc_case *c, hc_op *op, st_stored *s, char *err, size_t errn)
{
    in_err e;
    int rc = load_case(f, c, op, s, &e);
    if (rc)
        snprintf(err, errn, "%s", e.msg);
    return rc;
}

/* ---- run --output ---- */

/* The shortest text that reads back as exactly v ("1e-05", not
 * "9.99999975e-06"): metadata stays readable and round-trips. */
static void fmt_f32(char *buf, size_t n, float v)
{
    int prec;
    for (prec = 1; prec <= 9; prec++) {
        snprintf(buf, n, "%.*g", prec, (double)v);
        if (strtof(buf, NULL) == v) return;
    }
}

int st_case_write(const char *path, const hc_case *p, hc_op op, const hc_out *o, char *err,
                  size_t errn)
{
    st_out t[8];
    const char *meta[16];
    char rs[32], pe[32], ne[32], lt[32], sc[64];
    int n = 0, m = 0;
    int64_t C = p->cap, K = p->s.K, H = p->s.H, T = p->s.T;

    if (op != HC_FINALIZE && op != HC_FUSED) {
        snprintf(err, errn, "--output supports --op finalize and fused only");
        return -1;
    }
    memset(t, 0, sizeof t);
#define ADD(nm, f32, ptr, nd, d0, d1, d2)                                                          \
    do {                                                                                           \
        t[n].name = (nm);                                                                          \
        t[n].is_f32 = (f32);                                                                       \
        t[n].data = (ptr);                                                                         \
        t[n].ndim = (nd);                                                                          \
        t[n].shape[0] = (d0);                                                                      \
        t[n].shape[1] = (d1);                                                                      \
        t[n].shape[2] = (d2);                                                                      \
        n++;                                                                                       \
    } while (0)
    ADD("expert_outputs", 0, p->experts, 3, C, K, H);
    ADD("expert_weights", 1, p->weights, 2, C, K, 0);
    if (op == HC_FUSED) ADD("residual", 0, p->residual, 2, T, H, 0);
    if (p->post.on && p->post.weight) ADD("post_norm_weight", 0, p->post.weight, 1, H, 0, 0);
    if (p->next.on && p->next.weight) ADD("next_norm_weight", 0, p->next.weight, 1, H, 0, 0);
    if (op == HC_FINALIZE) {
        ADD("output", 0, o->hidden, 2, T, H, 0);
    } else {
        ADD("hidden", 0, o->hidden, 2, T, H, 0);
        if (p->next.on) ADD("normalized", 0, o->normalized, 2, T, H, 0);
    }
#undef ADD
    fmt_f32(rs, sizeof rs, p->rs);
    snprintf(lt, sizeof lt, "%lld", (long long)T);
    meta[m++] = "routed_scale";
    meta[m++] = rs;
    meta[m++] = "live_tokens";
    meta[m++] = lt;
    if (p->post.on) {
        fmt_f32(pe, sizeof pe, p->post.eps);
        meta[m++] = "post_eps";
        meta[m++] = pe;
    }
    if (p->next.on) {
        fmt_f32(ne, sizeof ne, p->next.eps);
        meta[m++] = "next_eps";
        meta[m++] = ne;
    }
    if (p->s.scales) {
        char a[32], b[32];
        fmt_f32(a, sizeof a, p->scales[0]);
        fmt_f32(b, sizeof b, p->scales[1]);
        snprintf(sc, sizeof sc, "%s,%s", a, b);
        meta[m++] = "scales";
        meta[m++] = sc;
    }
    meta[m++] = "producer";
    meta[m++] = "beammoe run";
    return st_write(path, t, n, meta, m / 2, err, errn);
}
