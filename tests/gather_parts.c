/*
 * gather_parts.c - the parts of the tensor-parallel gather's test, shared
 * by its two transports: tests/test_gather_nccl.c (one process per GPU
 * over NCCL) and tests/test_gather_group.c (ranks as threads of one
 * process, any number of them on one GPU). Every part runs on every rank,
 * against harness/naive_ref.c (the model of docs/numerics.md that the CPU
 * backend's tests also check against, bit for bit), on inputs of the
 * harness's generator (hc_make: the same on every rank, seeded alike).
 *
 * The reference does not depend on T: rank r's owned rows are the
 * contiguous slice [r*L, r*L + L) of one global expert array, so the result
 * of a call with T tokens is the first T rows of the fused op over all rows.
 * One reference per problem and weight set therefore checks every T,
 * strategy and replay.
 *
 * What the CUDA gather does over every transport: stress (calls with
 * random T and strategy, eager and as CUDA graph replays, cycling 3 weight
 * sets so that consecutive calls differ, outputs reset to a NaN sentinel
 * the library never writes before every checked call; arstress: the
 * same of the MoE all-reduce, each rank its own partial slots), bad input
 * (mismatched hidden, T > max_tokens, wrong device, one rank rejecting a
 * call with T = 0 then a normal call, one rank rejecting its arguments
 * under every strategy), mismatch (one rank passing other arguments,
 * rejecting its own or its quant, every strategy: every rank fails,
 * without waiting for the timeout), concurrent (two calls of one rank on
 * two unordered streams: refused on the device), wrap (epochs across the
 * LL tag's 32-bit wrap and the clearing epochs), timeout (a peer that
 * never comes, under ONESHOT and under UNFUSED).
 *
 * Over NCCL only (the in-process group's are test_backends' gather part,
 * every backend's group through the backend tables): sweep (every strategy,
 * UNFUSED first, x T x problem, outputs past T untouched, NaN rows past T),
 * large (T up to 16384), quant (the _q gather: every form of beam_quant x
 * strategy x normalized kept, NULL or kept on some ranks only, against the
 * plain gather's reference and harness/quant_model.c's quantization of
 * it, padding untouched), hosts (ranks acting as on different hosts,
 * where the transport has g_make_hosts).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "case.h"
#include "gather_parts.h"
#include "quant_model.h"

__thread int g_rank, g_R, g_dev;
__thread cudaStream_t g_stream;
int g_ndev, g_threads;
gp_make_fn g_make, g_make_hosts;

/* ---- one problem ---------------------------------------------------------- */

typedef struct problem {
    const char *name;
    int H, K;
    int post, next; /* HC_NORM_*: none, without weight, with weight */
    int scales, special, inplace, unaligned;
    float rs;
} problem;

#define GP_MAX_RANKS 8 /* the most ranks a transport runs */

/* Weight sets of a problem: calls of the stress part cycle through them,
 * so that a stale row (from an earlier call) differs from the right one. */
enum { NV = 3 };

typedef struct data {
    problem pb;
    int64_t maxt;
    int nv;               /* weight sets made (1 or NV) */
    hc_case c[NV];        /* set v: the weights of c[v], the rest c[0]'s */
    /* the all-reduce (MoE form) in place of the gather: rank r's partial
     * slots of every token are ar[r]'s experts */
    int allreduce;
    hc_case ar[GP_MAX_RANKS];
    uint16_t *ref_h, *ref_n; /* of the set in use */
    uint16_t *rh[NV], *rn[NV];
    beam_norm post, next;
    /* device */
    uint16_t *dx0, *dres0, *dpw, *dnw, *dh0, *dn0, *dx, *dres, *dh, *dn;
    float *dw, *dwv[NV];
} data;

/* Output sentinel: a NaN pattern the library never writes (its NaN is
 * 0x7FFF), so that a skipped store cannot pass for a result. */
static const uint16_t SENT = 0xFFFF;

/* Use weight set v (< d->nv) in the next calls and checks. */
static void use_set(data *d, int v)
{
    d->dw = d->dwv[v];
    d->ref_h = d->rh[v];
    d->ref_n = d->rn[v];
}

/* The host side of a problem: maxt rows and R NaN rows past them, and the
 * references (the same on every rank: the generator is seeded alike). */
static void make_host(data *d, const problem *pb, int64_t maxt, uint64_t seed, int nv)
{
    const hc_case *c = &d->c[0];
    const hc_spec s = {.K = pb->K, .H = pb->H, .T = maxt, .pad = g_R, .post = pb->post, .next = pb->next,
                       .scales = pb->scales, .exotic = pb->special};
    const uint16_t *slots[GP_MAX_RANKS];
    int v, r;
    for (r = 0; d->allreduce && r < g_R; ++r) {
        hc_make(&d->ar[r], &s, seed + 1000 + (uint64_t)r);
        slots[r] = d->ar[r].experts;
    }
    for (v = 0; v < nv; ++v) {
        hc_make(&d->c[v], &s, seed + (uint64_t)v);
        d->rh[v] = hu_alloc((size_t)maxt * pb->H * 2, 0);
        d->rn[v] = hu_alloc((size_t)maxt * pb->H * 2, 0);
        if (d->allreduce)
            nr_allreduce(NULL, slots, d->c[v].weights, g_R, maxt, pb->K, pb->H, pb->rs, &c->post, c->residual,
                         pb->scales ? c->scales : NULL, &c->next, d->rh[v], d->rn[v]);
        else
            nr_finalize_norm_residual_norm(c->experts, d->c[v].weights, maxt, pb->K, pb->H, pb->rs, &c->post,
                                           c->residual, pb->scales ? c->scales : NULL, &c->next, d->rh[v], d->rn[v]);
    }
}

/* Ranks that are threads share the host side of the problem they all make
 * (computed once, by the first of them; parts end with a barrier after
 * free_data, so one problem at a time is alive). */
static pthread_mutex_t g_cache_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    const char *name;
    int64_t maxt;
    uint64_t seed;
    int nv, R, users, allreduce;
    data host;
} g_cache;

/* allreduce: the MoE all-reduce's data (data.ar) instead of the gather's */
static void make_data_for(data *d, const problem *pb, int64_t maxt, uint64_t seed, int nv, int allreduce)
{
    int v;
    const int H = pb->H, K = pb->K, off = pb->unaligned ? 1 : 0;
    const size_t rows = (size_t)(maxt + g_R);
    const hc_case *c;
    memset(d, 0, sizeof *d);
    d->pb = *pb;
    d->maxt = maxt;
    d->nv = nv;
    d->allreduce = allreduce;
    if (!g_threads) {
        make_host(d, pb, maxt, seed, nv);
    } else {
        pthread_mutex_lock(&g_cache_mu);
        if (g_cache.users > 0 && (g_cache.name != pb->name || g_cache.maxt != maxt || g_cache.seed != seed ||
                                  g_cache.nv != nv || g_cache.R != g_R || g_cache.allreduce != allreduce))
            FAIL("test: two problems alive at once (%s, %s)", g_cache.name, pb->name);
        if (g_cache.users == 0) {
            make_host(d, pb, maxt, seed, nv);
            g_cache.name = pb->name;
            g_cache.maxt = maxt;
            g_cache.seed = seed;
            g_cache.nv = nv;
            g_cache.R = g_R;
            g_cache.allreduce = allreduce;
            g_cache.host = *d;
        } else {
            *d = g_cache.host;
        }
        ++g_cache.users;
        pthread_mutex_unlock(&g_cache_mu);
    }

    /* device copies; the unaligned problem offsets every row base by one
     * element (2-byte aligned only) */
    c = &d->c[0];
    CK(cudaMalloc((void **)&d->dx0, (rows * K * H + 8) * 2));
    for (v = 0; v < nv; ++v) CK(cudaMalloc((void **)&d->dwv[v], rows * K * 4));
    CK(cudaMalloc((void **)&d->dres0, ((size_t)maxt * H + 8) * 2));
    CK(cudaMalloc((void **)&d->dh0, ((size_t)maxt * H + 8) * 2));
    CK(cudaMalloc((void **)&d->dn0, ((size_t)maxt * H + 8) * 2));
    CK(cudaMalloc((void **)&d->dpw, (size_t)H * 2));
    CK(cudaMalloc((void **)&d->dnw, (size_t)H * 2));
    d->dx = d->dx0 + off;
    d->dres = d->dres0 + off;
    d->dh = d->dh0 + off;
    d->dn = d->dn0 + off;
    CK(cudaMemcpy(d->dx, allreduce ? d->ar[g_rank].experts : c->experts, rows * K * H * 2, cudaMemcpyHostToDevice));
    for (v = 0; v < nv; ++v) CK(cudaMemcpy(d->dwv[v], d->c[v].weights, rows * K * 4, cudaMemcpyHostToDevice));
    use_set(d, 0);
    CK(cudaMemcpy(d->dres, c->residual, (size_t)maxt * H * 2, cudaMemcpyHostToDevice));
    if (c->wpost) CK(cudaMemcpy(d->dpw, c->wpost, (size_t)H * 2, cudaMemcpyHostToDevice));
    if (c->wnext) CK(cudaMemcpy(d->dnw, c->wnext, (size_t)H * 2, cudaMemcpyHostToDevice));
    d->post.weight = c->wpost ? d->dpw : NULL;
    d->post.eps = c->post.eps;
    d->next.weight = c->wnext ? d->dnw : NULL;
    d->next.eps = c->next.eps;
    /* the copies ran on the legacy stream, which the ranks' own
     * (non-blocking) streams do not wait for */
    CK(cudaStreamSynchronize(0));
}

static void make_data(data *d, const problem *pb, int64_t maxt, uint64_t seed, int nv)
{
    make_data_for(d, pb, maxt, seed, nv, 0);
}

static void free_data(data *d)
{
    int v;
    cudaFree(d->dx0);
    cudaFree(d->dres0);
    cudaFree(d->dh0);
    cudaFree(d->dn0);
    cudaFree(d->dpw);
    cudaFree(d->dnw);
    for (v = 0; v < d->nv; ++v) cudaFree(d->dwv[v]);
    if (g_threads) {
        int last;
        pthread_mutex_lock(&g_cache_mu);
        last = --g_cache.users == 0;
        pthread_mutex_unlock(&g_cache_mu);
        if (!last) return;
    }
    for (v = 0; v < d->nv; ++v) {
        hc_free(&d->c[v]);
        hu_free(d->rh[v]);
        hu_free(d->rn[v]);
    }
    for (v = 0; d->allreduce && v < g_R; ++v) hc_free(&d->ar[v]);
}

/* One call of this rank with T tokens (hidden_arg: the hidden passed). */
static __thread double g_call_ms; /* when the last call was made (for messages) */
static __thread beam_workspace *g_call_ws; /* and on which workspace */

static double now_ms(void)
{
    return hu_now() * 1e3;
}

static beam_status call(beam_workspace *ws, data *d, int64_t T, int32_t hidden_arg, beam_strategy st,
                        cudaStream_t stream)
{
    g_call_ms = now_ms();
    g_call_ws = ws;
    const int H = d->pb.H, K = d->pb.K;
    const int64_t L = (T + g_R - 1) / g_R;
    const int64_t lo = (int64_t)g_rank * L;
    uint16_t *hid = d->pb.inplace ? d->dres : d->dh;
    if (d->allreduce)
        return beam_moe_finalize_allreduce_norm_residual_norm(
            ws, d->dx, d->dw, d->maxt, T, K, hidden_arg, d->pb.rs, d->pb.post ? &d->post : NULL, d->dres,
            d->pb.scales ? d->c[0].scales : NULL, d->pb.next ? &d->next : NULL, hid, d->pb.next ? d->dn : NULL, NULL,
            st, stream);
    return beam_moe_finalize_gather_norm_residual_norm(
        ws, d->dx + (size_t)lo * K * H, d->dw + (size_t)lo * K, L, T, K, hidden_arg, d->pb.rs,
        d->pb.post ? &d->post : NULL, d->dres, d->pb.scales ? d->c[0].scales : NULL, d->pb.next ? &d->next : NULL, hid,
        d->pb.next ? d->dn : NULL, st, stream);
}

/* For a failure message: what the last call's workspace reports now (a
 * call with no rows launches nothing; on a workspace that recorded a
 * failure it returns that failure). */
static const char *ws_state(data *d)
{
    if (!g_call_ws || call(g_call_ws, d, 0, d->pb.H, BEAM_STRATEGY_AUTO, g_stream) == BEAM_OK)
        return "no failure recorded";
    return beam_last_error();
}

/* Reset the outputs to the sentinel (and the in-place residual). */
static void reset_outputs(data *d, cudaStream_t s)
{
    const size_t n = (size_t)d->maxt * d->pb.H * 2;
    CK(cudaMemsetAsync(d->dh, 0xFF, n, s));
    CK(cudaMemsetAsync(d->dn, 0xFF, n, s));
    if (d->pb.inplace) CK(cudaMemcpyAsync(d->dres, d->c[0].residual, n, cudaMemcpyHostToDevice, s));
}

__thread uint16_t *g_hbuf, *g_nbuf;

/* Rows < T equal the reference; rows >= T untouched (sentinel, or the
 * residual for the in-place problem). what: for the message. */
static void verify(data *d, int64_t T, int64_t untouched_from, const char *what)
{
    const int H = d->pb.H;
    const size_t n = (size_t)d->maxt * H;
    int64_t i;
    CK(cudaStreamSynchronize(g_stream));
    CK(cudaMemcpy(g_hbuf, d->pb.inplace ? d->dres : d->dh, n * 2, cudaMemcpyDeviceToHost));
    if (d->pb.next) CK(cudaMemcpy(g_nbuf, d->dn, n * 2, cudaMemcpyDeviceToHost));
    for (i = 0; i < T * H; ++i) {
        if (g_hbuf[i] != d->ref_h[i])
            FAIL("%s [%s] T=%lld: hidden[%lld][%lld] = 0x%04x, reference 0x%04x (%.0f ms after the call; "
                 "workspace: %s)",
                 what, d->pb.name, (long long)T, (long long)(i / H), (long long)(i % H), g_hbuf[i], d->ref_h[i],
                 now_ms() - g_call_ms, ws_state(d));
        if (d->pb.next && g_nbuf[i] != d->ref_n[i])
            FAIL("%s [%s] T=%lld: normalized[%lld][%lld] = 0x%04x, reference 0x%04x", what, d->pb.name,
                 (long long)T, (long long)(i / H), (long long)(i % H), g_nbuf[i], d->ref_n[i]);
    }
    if (untouched_from < 0) return;
    for (i = untouched_from * H; i < (int64_t)n; ++i) {
        const uint16_t want_h = d->pb.inplace ? d->c[0].residual[i] : SENT;
        if (g_hbuf[i] != want_h)
            FAIL("%s [%s] T=%lld: hidden[%lld] past T was written (0x%04x)", what, d->pb.name, (long long)T,
                 (long long)(i / H), g_hbuf[i]);
        if (d->pb.next && g_nbuf[i] != SENT)
            FAIL("%s [%s] T=%lld: normalized[%lld] past T was written", what, d->pb.name, (long long)T,
                 (long long)(i / H));
    }
}

static beam_workspace *make_ws(data *d, int64_t one, int64_t two, int32_t timeout_ms)
{
    beam_workspace *ws = NULL;
    beam_workspace_config c = beam_workspace_config_default();
    int32_t r = -1, n = -1;
    if (one >= 0) c.oneshot_max_tokens = one;
    if (two >= 0) c.twoshot_max_tokens = two;
    if (timeout_ms > 0) c.timeout_ms = timeout_ms;
    BK(g_make(d->maxt, d->pb.H, &c, &ws));
    BK(beam_workspace_info(ws, &r, &n));
    if (r != g_rank || n != g_R) FAIL("beam_workspace_info: rank %d of %d, expected %d of %d", r, n, g_rank, g_R);
    return ws;
}

/* UNFUSED first: a workspace's first call (the all-gather on its own) */
static const beam_strategy STRATS[4] = {BEAM_STRATEGY_UNFUSED, BEAM_STRATEGY_AUTO, BEAM_STRATEGY_ONESHOT,
                                        BEAM_STRATEGY_TWOSHOT};
static const char *const SNAMES[4] = {"UNFUSED", "AUTO", "ONESHOT", "TWOSHOT"};

static void expect(beam_status got, beam_status want, const char *needle, const char *what)
{
    if (got != want)
        FAIL("%s: status %s, expected %s (%s)", what, beam_status_string(got), beam_status_string(want),
             beam_last_error());
    if (needle && !strstr(beam_last_error(), needle))
        FAIL("%s: message \"%s\" lacks \"%s\"", what, beam_last_error(), needle);
    if (g_rank == 0 && want != BEAM_OK) printf("  %s -> %s: %s\n", what, beam_status_string(got), beam_last_error());
}

/* ---- the quantized output ------------------------------------------------- */

enum { NQFORMS = QM_NFORMS, QGUARD = 64 };
#define QPOISON8 0x5A /* values; scales get 0xFF bytes, a NaN no scale is */

/* This rank's quantized output on the device (the largest extent of any
 * form, guards included), its host copy, and the model's. */
typedef struct qdata {
    size_t nv, ns; /* bytes of values, floats of scales */
    uint8_t *dv, *hv, *want_v;
    float *ds, *hs, *want_s;
} qdata;

static void qdata_make(qdata *q, int64_t maxt, int H)
{
    /* the largest values and scales of any form for maxt rows (the
     * column-major scales' padding and the block scales' whole tiles of
     * 128 rows included) */
    beam_quant forms[NQFORMS];
    int f;
    qm_forms(forms, maxt);
    q->nv = q->ns = 0;
    for (f = 0; f < NQFORMS; ++f) {
        const size_t nv = qm_values_bytes(&forms[f], maxt, H), ns = qm_scale_floats(&forms[f], maxt, H);
        if (nv > q->nv) q->nv = nv;
        if (ns > q->ns) q->ns = ns;
    }
    q->nv += QGUARD;
    q->ns += QGUARD;
    CK(cudaMalloc((void **)&q->dv, q->nv));
    CK(cudaMalloc((void **)&q->ds, q->ns * 4));
    /* host: the copy of the device's, then the model's */
    q->hv = hu_alloc(2 * q->nv, 0);
    q->hs = hu_alloc(2 * q->ns * 4, 0);
    q->want_v = q->hv + q->nv;
    q->want_s = q->hs + q->ns;
}

static void qdata_free(qdata *q)
{
    cudaFree(q->dv);
    cudaFree(q->ds);
    hu_free(q->hv);
    hu_free(q->hs);
}

/* The model's quantization of the reference's first T normalized rows, in
 * arrays poisoned as the device's are before a call. */
static void qdata_model(qdata *q, const data *d, const beam_quant *form, int64_t T)
{
    memset(q->want_v, QPOISON8, q->nv);
    memset(q->want_s, 0xFF, q->ns * 4);
    qm_quant(form, d->ref_n, T, d->pb.H, q->want_v, q->want_s);
}

static void qdata_poison(qdata *q, cudaStream_t s)
{
    CK(cudaMemsetAsync(q->dv, QPOISON8, q->nv, s));
    CK(cudaMemsetAsync(q->ds, 0xFF, q->ns * 4, s));
}

/* One _q call of this rank: quant form with this rank's arrays, normalized
 * kept or NULL. */
static beam_status call_q(beam_workspace *ws, data *d, int64_t T, beam_strategy st, const beam_quant *form,
                          qdata *qd, int keep)
{
    const int H = d->pb.H, K = d->pb.K;
    const int64_t L = (T + g_R - 1) / g_R;
    const int64_t lo = (int64_t)g_rank * L;
    beam_quant q = *form;
    /* block-scaled: the scales array's bytes are the block scales, each at
     * its token's row of the gathered output */
    qm_bind(&q, qd->dv, qd->ds);
    g_call_ms = now_ms();
    g_call_ws = ws;
    return beam_moe_finalize_gather_norm_residual_norm_q(
        ws, d->dx + (size_t)lo * K * H, d->dw + (size_t)lo * K, L, T, K, H, d->pb.rs,
        d->pb.post ? &d->post : NULL, d->dres, d->pb.scales ? d->c[0].scales : NULL, &d->next, d->dh,
        keep ? d->dn : NULL, &q, st, g_stream);
}

/* hidden_out as the plain gather's (and normalized too when kept; else
 * untouched), values and scales as the model's, every byte past them
 * (column-major padding included) untouched. */
static void verify_q(data *d, qdata *qd, int64_t T, int keep, const char *what)
{
    const size_t n = (size_t)d->maxt * d->pb.H;
    size_t i;
    if (keep) {
        verify(d, T, T, what);
    } else {
        const int next = d->pb.next;
        d->pb.next = 0; /* hidden only */
        verify(d, T, T, what);
        d->pb.next = next;
        CK(cudaMemcpy(g_nbuf, d->dn, n * 2, cudaMemcpyDeviceToHost));
        for (i = 0; i < n; ++i)
            if (g_nbuf[i] != SENT)
                FAIL("%s [%s] T=%lld: normalized was NULL, yet normalized[%zu][%zu] was written", what, d->pb.name,
                     (long long)T, i / (size_t)d->pb.H, i % (size_t)d->pb.H);
    }
    CK(cudaMemcpy(qd->hv, qd->dv, qd->nv, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(qd->hs, qd->ds, qd->ns * 4, cudaMemcpyDeviceToHost));
    for (i = 0; i < qd->nv; ++i)
        if (qd->hv[i] != qd->want_v[i])
            FAIL("%s [%s] T=%lld: values[%zu] (row %zu) = 0x%02x, model 0x%02x (0x%02x: untouched)", what, d->pb.name,
                 (long long)T, i, i / (size_t)d->pb.H, qd->hv[i], qd->want_v[i], QPOISON8);
    for (i = 0; i < qd->ns; ++i)
        if (memcmp(&qd->hs[i], &qd->want_s[i], 4))
            FAIL("%s [%s] T=%lld: scales[%zu] = %g, model %g (NaN: untouched)", what, d->pb.name, (long long)T, i,
                 (double)qd->hs[i], (double)qd->want_s[i]);
}

/* Every rank checks nothing of its own was written (a call it rejected). */
static void verify_q_untouched(data *d, qdata *qd, const char *what)
{
    size_t i;
    CK(cudaStreamSynchronize(g_stream));
    CK(cudaMemcpy(g_hbuf, d->dh, (size_t)d->maxt * d->pb.H * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(qd->hv, qd->dv, qd->nv, cudaMemcpyDeviceToHost));
    for (i = 0; i < (size_t)d->maxt * d->pb.H; ++i)
        if (g_hbuf[i] != SENT) FAIL("%s: the rejecting rank wrote hidden[%zu]", what, i / (size_t)d->pb.H);
    for (i = 0; i < qd->nv; ++i)
        if (qd->hv[i] != QPOISON8) FAIL("%s: the rejecting rank wrote values[%zu]", what, i);
}

/* One rank (the last) passes a bad quant (group_size 96) under each
 * strategy: it returns BEAM_ERR_INVALID_ARGUMENT having written nothing,
 * and its peers learn it as for any other rejection (part "mismatch"):
 * their next call and destroy fail with BEAM_ERR_COMM, in-band. */
/* ---- over NCCL: what test_backends runs over the in-process groups ----------- */

/* Problem pb at every T of Ts under every strategy: the plain gather (AUTO:
 * ONESHOT up to 64, TWOSHOT up to 200, then UNFUSED), with nan_rows then
 * also the rows past T = 2R + 1 made NaN (expert rows and weights: no
 * effect); or (quant) the _q gather (AUTO: ONESHOT up to 2, TWOSHOT up to
 * 8) with every form x normalized NULL, kept, or kept on the even ranks
 * only (each rank's own choice), against the plain gather's reference and
 * the model of its normalized. The calls made. */
static int sweep_problem(const problem *pb, int64_t maxt, const int64_t *Ts, int nT, uint64_t seed, int nan_rows,
                         int quant)
{
    static const char *const kept[3] = {"NULL", "kept", "kept on even ranks"};
    const int64_t Tn = 2 * g_R + 1;
    const size_t kh = (size_t)pb->K * pb->H;
    data d;
    qdata qd;
    beam_workspace *ws;
    int t, s, f, keep, calls = 0;
    make_data(&d, pb, maxt, seed, 1);
    if (quant) qdata_make(&qd, maxt, pb->H);
    ws = make_ws(&d, quant ? 2 : 64, quant ? 8 : 200, 0);
    for (t = 0; t < nT + nan_rows; ++t) {
        const int64_t T = t < nT ? Ts[t] : Tn;
        beam_quant forms[NQFORMS];
        qm_forms(forms, T);
        if (t == nT) {
            CK(cudaMemsetAsync(d.dx + (size_t)Tn * kh, 0xFF, (size_t)(maxt + g_R - Tn) * kh * 2, g_stream));
            CK(cudaMemsetAsync(d.dw + (size_t)Tn * pb->K, 0xFF, (size_t)(maxt + g_R - Tn) * pb->K * 4, g_stream));
        }
        for (f = 0; f < (quant ? NQFORMS : 1); ++f) {
            if (quant) qdata_model(&qd, &d, &forms[f], T);
            for (s = 0; s < 4; ++s)
                for (keep = quant ? 0 : 1; keep < (quant ? 3 : 2); ++keep, ++calls) {
                    const int mine = keep == 2 ? g_rank % 2 == 0 : keep;
                    char what[128], label[64];
                    reset_outputs(&d, g_stream);
                    if (!quant) {
                        BK(call(ws, &d, T, d.pb.H, STRATS[s], g_stream));
                        verify(&d, T, T, t < nT ? SNAMES[s] : "NaN rows past T");
                        continue;
                    }
                    qm_label(&forms[f], label, sizeof label);
                    snprintf(what, sizeof what, "_q %s %s normalized %s", SNAMES[s], label, kept[keep]);
                    qdata_poison(&qd, g_stream);
                    BK(call_q(ws, &d, T, STRATS[s], &forms[f], &qd, mine));
                    verify_q(&d, &qd, T, mine, what);
                }
        }
    }
    BK(beam_workspace_destroy(ws));
    if (quant) qdata_free(&qd);
    free_data(&d);
    host_barrier();
    return calls;
}

static void part_sweep(uint64_t seed)
{
    static const problem pbs[] = {
        {"H7168 K8 post+w next+w scales rs2.5", 7168, 8, 2, 2, 1, 0, 0, 0, 2.5f},
        {"H256 K1 plain", 256, 1, 0, 0, 0, 0, 0, 0, 1.0f},
        {"H2304 K3 post next+w scales special", 2304, 3, 1, 2, 1, 1, 0, 0, 1.0f},
        {"H8192 K32 next special", 8192, 32, 0, 1, 0, 1, 0, 0, 0.5f},
        {"H1024 K6 in-place all", 1024, 6, 2, 2, 1, 0, 1, 0, 1.25f},
        {"H512 K8 unaligned all special", 512, 8, 2, 2, 1, 1, 0, 1, 1.0f},
        {"H4096 K2 next only", 4096, 2, 0, 2, 0, 0, 0, 0, 1.0f},
    };
    const int64_t Ts[] = {1, 0, g_R - 1, g_R, g_R + 1, 2 * g_R + 1, 63, 64, 65, 129, 200, 332, 333};
    int p, calls = 0;
    for (p = 0; p < (int)(sizeof pbs / sizeof pbs[0]); ++p)
        calls += sweep_problem(&pbs[p], 333, Ts, (int)(sizeof Ts / sizeof Ts[0]), seed + (uint64_t)p, 1, 0);
    if (g_rank == 0) printf("sweep: %d calls per rank, every output bit-identical to the reference\n", calls);
}

/* T up to 16384, T not divisible by R among them. */
static void part_large(uint64_t seed)
{
    static const problem pb = {"H4096 K8 post+w next+w scales, T to 16384", 4096, 8, 2, 2, 1, 0, 0, 0, 1.5f};
    static const int64_t Ts[] = {1, 4095, 4096, 8191, 16383, 16384};
    const int calls = sweep_problem(&pb, 16384, Ts, 6, seed + 101, 0, 0);
    if (g_rank == 0) printf("large: %d calls per rank up to T = 16384, bit-identical\n", calls);
}

/* The _q gather at T = 1, T < R, T not divisible by R and T near
 * max_tokens. */
static void part_quant(uint64_t seed)
{
    static const problem pb = {"quant H1024 K4 post+w next+w scales special", 1024, 4, 2, 2, 1, 1, 0, 0, 1.0f};
    const int64_t Ts[4] = {1, g_R + 1, 159, g_R - 1};
    const int calls = sweep_problem(&pb, 160, Ts, g_R > 2 ? 4 : 3, seed + 23, 0, 1);
    if (g_rank == 0)
        printf("quant: %d _q calls per rank, hidden and normalized bit-identical to the plain gather, values and "
               "scales to the model\n", calls);
}

/* The first kernel launched into a stream may wait for the device's other
 * work (the runtime sets the stream up). With ranks sharing a device, that
 * work can be a peer's gather kernel waiting for this rank: the rank's
 * first launch would wait for the peer's timeout. So every rank launches a
 * small kernel (a local operation) into its stream before any rank makes a
 * gather call. */
static int64_t pick_T(hu_rng *r, int64_t maxt)
{
    uint32_t u = hu_below(r, 8);
    if (u == 0) return 0;
    if (u < 4) return 1 + (int64_t)hu_below(r, 16);
    return (int64_t)hu_below(r, (uint32_t)maxt + 1);
}

/* Rows written by a sequence of calls (call c: tokens Tc[c], weight set
 * vc[c]): row i holds the set of the last call with i < Tc[c]; rows past
 * every call still hold the sentinel (the outputs were reset before). */
static void verify_seq(data *d, int n, const int64_t *Tc, const int *vc, const char *what)
{
    const int H = d->pb.H;
    int64_t i, lo = 0, tmax = 0;
    int c;
    for (c = 0; c < n; ++c)
        if (Tc[c] > tmax) tmax = Tc[c];
    CK(cudaStreamSynchronize(g_stream));
    CK(cudaMemcpy(g_hbuf, d->dh, (size_t)d->maxt * H * 2, cudaMemcpyDeviceToHost));
    if (d->pb.next) CK(cudaMemcpy(g_nbuf, d->dn, (size_t)d->maxt * H * 2, cudaMemcpyDeviceToHost));
    /* rows [lo, Tc[c]) are last written by call c when no later call
     * reaches past lo: walk the calls from the last one */
    for (c = n - 1; c >= 0; --c) {
        const uint16_t *rh = d->rh[vc[c]], *rn = d->rn[vc[c]];
        for (i = lo * H; i < Tc[c] * H; ++i) {
            if (g_hbuf[i] != rh[i])
                FAIL("%s [%s] call %d of %d (T=%lld, set %d): hidden[%lld][%lld] = 0x%04x, reference 0x%04x",
                     what, d->pb.name, c + 1, n, (long long)Tc[c], vc[c], (long long)(i / H), (long long)(i % H),
                     g_hbuf[i], rh[i]);
            if (d->pb.next && g_nbuf[i] != rn[i])
                FAIL("%s [%s] call %d of %d (T=%lld, set %d): normalized[%lld][%lld] = 0x%04x, reference 0x%04x",
                     what, d->pb.name, c + 1, n, (long long)Tc[c], vc[c], (long long)(i / H), (long long)(i % H),
                     g_nbuf[i], rn[i]);
        }
        if (Tc[c] > lo) lo = Tc[c];
    }
    for (i = tmax * H; i < d->maxt * H; ++i)
        if (g_hbuf[i] != SENT || (d->pb.next && g_nbuf[i] != SENT))
            FAIL("%s [%s]: row %lld past every call's T (%lld) was written", what, d->pb.name, (long long)(i / H),
                 (long long)tmax);
}

/* Whether a call launches a fused kernel (the stress workspace's AUTO
 * thresholds: ONESHOT up to 48, TWOSHOT up to 160). */
static int launches_fused(int s, int64_t T)
{
    if (T == 0) return 0;
    if (STRATS[s] == BEAM_STRATEGY_AUTO) return T <= 160;
    return STRATS[s] != BEAM_STRATEGY_UNFUSED;
}

/* The weight set of the next call: neither of the last two fused calls'
 * (last[0] the latest), so that rows left over from epoch E-1 or E-2 (the
 * other parity, the same parity) cannot pass for this call's. */
static int next_set(int last[2], int s, int64_t T)
{
    const int v = last[0] != last[1] ? 3 - last[0] - last[1] : (last[0] + 1) % NV;
    if (launches_fused(s, T)) {
        last[1] = last[0];
        last[0] = v;
    }
    return v;
}

/* n eager calls and n graph replays of the gather, or with allreduce of
 * the MoE all-reduce (name: the part's, for the messages) */
static void stress_calls(const char *name, int allreduce, uint64_t seed, int n)
{
    static const problem pb = {"stress H2048 K8 post+w next+w scales", 2048, 8, 2, 2, 1, 1, 0, 0, 1.0f};
    const int check_every = 97;
    data d;
    beam_workspace *ws;
    /* the rank's own stream: with ranks as threads, every extra stream is
     * another hardware queue to share (test_gather_group.c) */
    cudaStream_t st = g_stream;
    hu_rng r;
    int i, g, last[2] = {0, 1};
    make_data_for(&d, &pb, 333, seed, NV, allreduce);
    ws = make_ws(&d, 48, 160, 0);

    /* eager: the same random sequence on every rank; the weight set changes
     * from call to call, and a checked call starts from the sentinel, so
     * that a stale row or a skipped store fails */
    hu_rng_init(&r, seed * 31 + 7);
    for (i = 1; i <= n; ++i) {
        const int64_t T = pick_T(&r, d.maxt);
        const int s = (int)hu_below(&r, 4);
        const int v = next_set(last, s, T);
        use_set(&d, v);
        if (i % check_every == 0) reset_outputs(&d, st);
        BK(call(ws, &d, T, d.pb.H, STRATS[s], st));
        if (i % check_every == 0) {
            CK(cudaStreamSynchronize(st));
            verify(&d, T, T, "stress eager");
        }
    }
    CK(cudaStreamSynchronize(st));
    if (g_rank == 0) printf("%s: %d eager calls (%d weight sets), checked every %d\n", name, n, NV, check_every);

    /* graphs of 3 calls each (different weight sets), replayed in a random
     * order; the outputs reset to the sentinel (outside the graph) before a
     * checked replay */
    {
        enum { NG = 8 };
        cudaGraphExec_t ex[NG];
        int64_t gT[NG][3];
        int gv[NG][3];
        for (g = 0; g < NG; ++g) {
            cudaGraph_t graph;
            int c;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            for (c = 0; c < 3; ++c) {
                int64_t T = pick_T(&r, d.maxt);
                const int s = (int)hu_below(&r, 4);
                if (c == 2 && T == 0) T = 1;
                gT[g][c] = T;
                gv[g][c] = next_set(last, s, T);
                use_set(&d, gv[g][c]);
                BK(call(ws, &d, T, d.pb.H, STRATS[s], st));
            }
            CK(cudaStreamEndCapture(st, &graph));
            CK(cudaGraphInstantiate(&ex[g], graph, 0));
            CK(cudaGraphDestroy(graph));
            CK(cudaGraphUpload(ex[g], st));
        }
        /* With ranks sharing a device (test_gather_group), instantiating,
         * uploading or destroying a graph may wait for the device's other
         * work, a peer's gather kernel included, which waits for this rank:
         * no rank does so while a peer may have a call in flight. */
        CK(cudaStreamSynchronize(st));
        host_barrier();
        for (i = 1; i <= n; ++i) {
            g = (int)hu_below(&r, NG);
            if (i % check_every == 0) reset_outputs(&d, st);
            CK(cudaGraphLaunch(ex[g], st));
            if (i % check_every == 0) {
                CK(cudaStreamSynchronize(st));
                verify_seq(&d, 3, gT[g], gv[g], "stress graph");
            }
        }
        CK(cudaStreamSynchronize(st));
        host_barrier();
        for (g = 0; g < NG; ++g) CK(cudaGraphExecDestroy(ex[g]));
        host_barrier();
    }
    /* the workspace is still in step: one more eager call of each kind */
    for (i = 0; i < 4; ++i) {
        use_set(&d, i % NV);
        reset_outputs(&d, st);
        BK(call(ws, &d, d.maxt, d.pb.H, STRATS[i], st));
        CK(cudaStreamSynchronize(st));
        verify(&d, d.maxt, d.maxt, "after stress");
    }
    if (g_rank == 0) printf("%s: %d graph replays (3 calls each), checked every %d\n", name, n, check_every);
    BK(beam_workspace_destroy(ws));
    free_data(&d);
    host_barrier();
}

static void part_stress(uint64_t seed, int n)
{
    stress_calls("stress", 0, seed, n);
}

/* The all-reduce's stress: every rank its own partial slots of every
 * token, the same calls, graphs and checks as the gather's. */
static void part_arstress(uint64_t seed, int n)
{
    stress_calls("arstress", 1, seed + 5, n);
}

static void part_bad(uint64_t seed)
{
    static const problem pb = {"bad H512 K4", 512, 4, 2, 2, 1, 0, 0, 0, 1.0f};
    data d;
    beam_workspace *ws;
    int s;
    make_data(&d, &pb, 100, seed, 1);
    ws = make_ws(&d, -1, -1, 0);

    /* every rank makes the same mistake: all fail, the workspace stays in step */
    for (s = 0; s < 4; ++s) {
        expect(call(ws, &d, 10, 768, STRATS[s], g_stream), BEAM_ERR_INVALID_ARGUMENT, "hidden", "mismatched hidden");
        expect(call(ws, &d, 101, 512, STRATS[s], g_stream), BEAM_ERR_INVALID_ARGUMENT, "max_tokens", "T > max_tokens");
    }
    if (g_ndev > 1) {
        int other = (g_dev + 1) % g_ndev;
        CK(cudaSetDevice(other));
        expect(call(ws, &d, 10, 512, BEAM_STRATEGY_ONESHOT, g_stream), BEAM_ERR_INVALID_ARGUMENT, "device",
               "workspace used from another device");
        CK(cudaSetDevice(g_dev));
    }
    for (s = 0; s < 4; ++s) {
        reset_outputs(&d, g_stream);
        BK(call(ws, &d, 77, 512, STRATS[s], g_stream));
        verify(&d, 77, 77, "after collective bad input");
    }

    /* one rank rejects a call with T == 0 while its peers' (valid) call has
     * no rows and launches nothing: the rejecting rank must launch nothing
     * either, so the workspace stays in step and the next call succeeds */
    for (s = 0; s < 4; ++s) {
        if (g_rank == g_R - 1)
            expect(call(ws, &d, 0, 768, STRATS[s], g_stream), BEAM_ERR_INVALID_ARGUMENT, "hidden",
                   "one rank rejecting a call with T = 0");
        else
            BK(call(ws, &d, 0, 512, STRATS[s], g_stream));
        reset_outputs(&d, g_stream);
        BK(call(ws, &d, 77, 512, STRATS[s], g_stream));
        verify(&d, 77, 77, "after one rank rejected a call with T = 0");
    }

    /* one rank rejects its arguments: the others learn it at their next call */
    host_barrier();
    if (g_rank == g_R - 1) {
        expect(call(ws, &d, 10, 768, BEAM_STRATEGY_ONESHOT, g_stream), BEAM_ERR_INVALID_ARGUMENT, "hidden",
               "one rank with mismatched hidden");
        CK(cudaStreamSynchronize(g_stream));
        host_barrier();
        BK(beam_workspace_destroy(ws));
    } else {
        BK(call(ws, &d, 10, 512, BEAM_STRATEGY_ONESHOT, g_stream));
        CK(cudaStreamSynchronize(g_stream));
        host_barrier();
        expect(call(ws, &d, 10, 512, BEAM_STRATEGY_ONESHOT, g_stream), BEAM_ERR_COMM, "rejected",
               "next call after a peer rejected its arguments");
        expect(beam_workspace_destroy(ws), BEAM_ERR_COMM, "rejected", "destroy after a peer rejected");
    }
    free_data(&d);
    host_barrier();
    if (g_rank == 0)
        printf("bad input: clear errors, workspace in step after collective errors and a lone T = 0 reject\n");
}

/* Rank 0 calls with strategy s while its peers never come: the stream
 * moves on after about the timeout (300 ms), and the next call, with
 * strategy next, and the destroy say why (the message holds `why`). */
static void timeout_case(data *d, beam_strategy s, beam_strategy next, const char *why, const char *what)
{
    beam_workspace *ws = make_ws(d, -1, -1, 300);
    host_barrier();
    if (g_rank == 0) {
        const double t0 = now_ms();
        double ms;
        BK(call(ws, d, 5, 512, s, g_stream)); /* the peers never come */
        CK(cudaStreamSynchronize(g_stream));
        ms = now_ms() - t0;
        if (ms < 250 || ms > 5000) FAIL("%s timeout: the stream moved on after %.0f ms, expected about 300", what, ms);
        printf("  %s: the waiting call ended after %.0f ms (timeout 300 ms)\n", what, ms);
        expect(call(ws, d, 5, 512, s, g_stream), BEAM_ERR_COMM, why, "next call after a timeout");
        expect(call(ws, d, 5, 512, next, g_stream), BEAM_ERR_COMM, why, "any later call after a timeout");
    }
    host_barrier();
    expect(beam_workspace_destroy(ws), g_rank == 0 ? BEAM_ERR_COMM : BEAM_OK, g_rank == 0 ? why : NULL,
           "destroy after a timeout");
}

/* ONESHOT's kernel times out itself; UNFUSED's all-gather over NCCL waits
 * inside NCCL, where the workspace's watchdog aborts its own communicator
 * (in a group the all-gather kernel times out itself). */
static void part_timeout(uint64_t seed)
{
    static const problem pb = {"timeout H512 K4", 512, 4, 2, 2, 1, 0, 0, 0, 1.0f};
    data d;
    make_data(&d, &pb, 64, seed, 1);
    timeout_case(&d, BEAM_STRATEGY_ONESHOT, BEAM_STRATEGY_UNFUSED, "timed out", "ONESHOT");
    timeout_case(&d, BEAM_STRATEGY_UNFUSED, BEAM_STRATEGY_ONESHOT, "300 ms", "UNFUSED");
    free_data(&d);
    host_barrier();
    if (g_rank == 0) printf("timeout: reported as BEAM_ERR_COMM, no hang (ONESHOT, UNFUSED)\n");
}

/* One rank (the last) passes another routed_scale, rejects its arguments
 * (bad hidden), or rejects its quant (group_size 96, having written
 * nothing), under each strategy and both ONESHOT paths (LL rows at T = 5,
 * flags when ceil(T/R) > 64): every other rank's next call and destroy
 * fail with BEAM_ERR_COMM naming it, well before the timeout (5 s) where
 * the failure is seen on the device. */
static void part_mismatch(uint64_t seed)
{
    static const problem pb = {"mismatch H512 K4", 512, 4, 2, 2, 1, 0, 0, 0, 1.0f};
    const beam_strategy st[4] = {BEAM_STRATEGY_ONESHOT, BEAM_STRATEGY_ONESHOT, BEAM_STRATEGY_TWOSHOT,
                                 BEAM_STRATEGY_UNFUSED};
    const char *const names[4] = {"ONESHOT (LL)", "ONESHOT (flags)", "TWOSHOT", "UNFUSED"};
    const char *const kinds[3] = {"one rank differs", "one rank rejects", "one rank's bad quant"};
    data d;
    qdata qd;
    int kind, s;
    make_data(&d, &pb, 65 * 8 + 8, seed + 7, 1);
    qdata_make(&qd, d.maxt, pb.H);
    for (kind = 0; kind < 3; ++kind)
        for (s = 0; s < 4; ++s) {
            const int64_t T = s == 1 ? 65 * g_R : (s == 0 ? 5 : 40);
            const int odd = g_rank == g_R - 1;
            char what[96];
            beam_workspace *ws = make_ws(&d, -1, -1, 5000);
            beam_quant forms[NQFORMS], bad;
            double t0;
            qm_forms(forms, T);
            bad = forms[0]; /* group 128, with group_size 96 */
            bad.group_size = 96;
            snprintf(what, sizeof what, "%s: %s", kinds[kind], names[s]);
            reset_outputs(&d, g_stream);
            qdata_poison(&qd, g_stream);
            CK(cudaStreamSynchronize(g_stream));
            host_barrier();
            t0 = now_ms();
            if (kind == 0) {
                const float rs = d.pb.rs;
                if (odd) d.pb.rs = 2.0f * rs;
                BK(call(ws, &d, T, d.pb.H, st[s], g_stream));
                d.pb.rs = rs;
            } else if (!odd) {
                BK(kind == 1 ? call(ws, &d, T, d.pb.H, st[s], g_stream) : call_q(ws, &d, T, st[s], &forms[0], &qd, 0));
            } else if (kind == 1) {
                expect(call(ws, &d, T, 768, st[s], g_stream), BEAM_ERR_INVALID_ARGUMENT, "hidden", what);
            } else {
                expect(call_q(ws, &d, T, st[s], &bad, &qd, 0), BEAM_ERR_INVALID_ARGUMENT, "quant->group_size", what);
                verify_q_untouched(&d, &qd, what);
            }
            CK(cudaStreamSynchronize(g_stream));
            if (now_ms() - t0 > 2500) FAIL("%s: the call took %.0f ms (timeout 5000): not seen in-band", what, now_ms() - t0);
            host_barrier();
            if (kind > 0 && odd) {
                /* the rejecting rank reported its own error; nothing recorded */
                BK(beam_workspace_destroy(ws));
            } else {
                /* the rank's own finding, or a peer's that gave the call up
                 * (with three ranks or more) */
                expect(call(ws, &d, T, d.pb.H, st[s], g_stream), BEAM_ERR_COMM, NULL, what);
                if (!strstr(beam_last_error(), kind ? "rejected" : "differ") && !strstr(beam_last_error(), "gave"))
                    FAIL("%s: message \"%s\" names neither the cause nor a peer that gave up", what,
                         beam_last_error());
                expect(beam_workspace_destroy(ws), BEAM_ERR_COMM, NULL, what);
            }
            host_barrier();
        }
    qdata_free(&qd);
    free_data(&d);
    host_barrier();
    if (g_rank == 0)
        printf("mismatch: a rank that differs or rejects (its arguments, its quant) fails every rank, in-band, "
               "every strategy\n");
}

/* Rank 0 makes two calls on two streams with nothing ordering them while
 * its peers have not called yet: the second kernel finds the first one's
 * claim, computes nothing, and the workspace reports it; the first call
 * completes with the peers' (their bits are right). */
static void part_concurrent(uint64_t seed)
{
    static const problem pb = {"concurrent H512 K4", 512, 4, 2, 2, 1, 0, 0, 0, 1.0f};
    data d;
    beam_workspace *ws;
    cudaStream_t a, b;
    make_data(&d, &pb, 64, seed + 11, 1);
    ws = make_ws(&d, -1, -1, 2000);
    CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    reset_outputs(&d, g_stream);
    CK(cudaStreamSynchronize(g_stream));
    if (g_rank == 0) {
        BK(call(ws, &d, 20, d.pb.H, BEAM_STRATEGY_ONESHOT, a));
        BK(call(ws, &d, 20, d.pb.H, BEAM_STRATEGY_ONESHOT, b));
        usleep(20000); /* both kernels on the device, the first one waiting */
        host_barrier();
        CK(cudaStreamSynchronize(a));
        CK(cudaStreamSynchronize(b));
        expect(call(ws, &d, 20, d.pb.H, BEAM_STRATEGY_ONESHOT, a), BEAM_ERR_COMM, "same time",
               "a call after two overlapping calls");
        host_barrier();
        expect(beam_workspace_destroy(ws), BEAM_ERR_COMM, "same time", "destroy after overlapping calls");
    } else {
        host_barrier();
        BK(call(ws, &d, 20, d.pb.H, BEAM_STRATEGY_ONESHOT, a));
        CK(cudaStreamSynchronize(a));
        verify(&d, 20, 20, "the peers of two overlapping calls");
        host_barrier();
        BK(beam_workspace_destroy(ws));
    }
    CK(cudaStreamDestroy(a));
    CK(cudaStreamDestroy(b));
    free_data(&d);
    host_barrier();
    if (g_rank == 0) printf("concurrent: overlapping calls on one workspace refused on the device\n");
}

/* Epochs across the LL tag's 32-bit wrap and the epochs that clear the LL
 * rows (k * 2^30, k * 2^30 + 1): the workspace starts at a given epoch
 * (BEAM_GATHER_EPOCH, read at creation), calls alternate LL and flag sizes
 * and the weight sets, every call checked. */
static void part_wrap(uint64_t seed)
{
    static const problem pb = {"wrap H1024 K4", 1024, 4, 2, 2, 1, 0, 0, 0, 1.0f};
    static const char *const starts[2] = {"0xFFFFFFF9", "0x3FFFFFFD"};
    data d;
    int k, i;
    make_data(&d, &pb, 65 * 8 + 8, seed + 13, NV);
    for (k = 0; k < 2; ++k) {
        beam_workspace *ws;
        if (!g_threads || g_rank == 0) setenv("BEAM_GATHER_EPOCH", starts[k], 1);
        host_barrier();
        ws = make_ws(&d, -1, -1, 0);
        host_barrier();
        if (!g_threads || g_rank == 0) unsetenv("BEAM_GATHER_EPOCH");
        for (i = 0; i < 14; ++i) {
            const int64_t T = i % 3 == 2 ? 65 * g_R : 1 + i;
            const beam_strategy s = i % 4 == 3 ? BEAM_STRATEGY_TWOSHOT : BEAM_STRATEGY_ONESHOT;
            use_set(&d, i % NV);
            reset_outputs(&d, g_stream);
            BK(call(ws, &d, T, d.pb.H, s, g_stream));
            verify(&d, T, T, "across the epoch wrap");
        }
        BK(beam_workspace_destroy(ws));
        host_barrier();
    }
    free_data(&d);
    host_barrier();
    if (g_rank == 0) printf("wrap: calls across the LL tag wrap and the clearing epochs, bit-identical\n");
}

/* Ranks that act as if on different hosts (g_make_hosts): no peer memory,
 * so AUTO (the default thresholds) must take UNFUSED and give the
 * reference's bits, UNFUSED too, and ONESHOT is refused as unsupported. */
static void part_hosts(uint64_t seed)
{
    static const problem pb = {"hosts H2048 K8 next+w", 2048, 8, 0, 2, 0, 0, 0, 0, 1.0f};
    const int64_t Ts[] = {1, (int64_t)g_R + 1, 200};
    const gp_make_fn same_host = g_make;
    data d;
    beam_workspace *ws;
    int t;
    make_data(&d, &pb, 256, seed + 19, 1);
    g_make = g_make_hosts;
    ws = make_ws(&d, -1, -1, 0);
    g_make = same_host;
    for (t = 0; t < 3; ++t) {
        reset_outputs(&d, g_stream);
        BK(call(ws, &d, Ts[t], d.pb.H, BEAM_STRATEGY_AUTO, g_stream));
        verify(&d, Ts[t], Ts[t], "AUTO across hosts");
        reset_outputs(&d, g_stream);
        BK(call(ws, &d, Ts[t], d.pb.H, BEAM_STRATEGY_UNFUSED, g_stream));
        verify(&d, Ts[t], Ts[t], "UNFUSED across hosts");
        expect(call(ws, &d, Ts[t], d.pb.H, BEAM_STRATEGY_ONESHOT, g_stream), BEAM_ERR_UNSUPPORTED, "peer memory",
               "ONESHOT across hosts");
    }
    BK(beam_workspace_destroy(ws));
    free_data(&d);
    host_barrier();
    if (g_rank == 0) printf("hosts: ranks on different hosts take UNFUSED over NCCL's network transport, bit-identical\n");
}

/* The first kernel launched into a stream may wait for the device's other
 * work (the runtime sets the stream up). With ranks sharing a device, that
 * work can be a peer's gather kernel waiting for this rank: the rank's
 * first launch would wait for the peer's timeout. So every rank launches a
 * small kernel (a local operation) into its stream before any rank makes a
 * gather call. */
static void warm_stream(void)
{
    enum { H = 256 }; /* the smallest hidden size an operation takes */
    uint16_t *buf;
    CK(cudaMalloc((void **)&buf, 3 * H * 2));
    CK(cudaMemsetAsync(buf, 0, 3 * H * 2, g_stream));
    BK(beam_norm_residual_norm(buf, buf + H, 1, H, NULL, NULL, NULL, buf + 2 * H, NULL, g_stream));
    CK(cudaStreamSynchronize(g_stream));
    CK(cudaFree(buf));
    host_barrier();
}

void gp_run_parts(uint64_t seed, int stress, const char *only)
{
    /* the largest outputs: part_large's 16384 x 4096 */
    g_hbuf = malloc((size_t)16384 * 4096 * 2);
    g_nbuf = malloc((size_t)16384 * 4096 * 2);
    if (!g_hbuf || !g_nbuf) FAIL("out of host memory");
    /* each rank its own stream: ranks that are threads must never share
     * the legacy default stream, which would serialize their kernels */
    CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    warm_stream();
    /* the in-process group's sweep, large T and quantized forms are
     * test_backends' gather part */
    if (!g_threads && (!only || !strcmp(only, "sweep"))) part_sweep(seed);
    if (!g_threads && (!only || !strcmp(only, "large"))) part_large(seed);
    if (!g_threads && (!only || !strcmp(only, "quant"))) part_quant(seed);
    if (!only || !strcmp(only, "stress")) part_stress(seed, stress);
    if (!only || !strcmp(only, "arstress")) part_arstress(seed, stress);
    if (!only || !strcmp(only, "bad")) part_bad(seed);
    if (!only || !strcmp(only, "mismatch")) part_mismatch(seed);
    if (!only || !strcmp(only, "concurrent")) part_concurrent(seed);
    if (!only || !strcmp(only, "wrap")) part_wrap(seed);
    if (!only || !strcmp(only, "timeout")) part_timeout(seed);
    if (g_make_hosts && (!only || !strcmp(only, "hosts"))) part_hosts(seed);
    CK(cudaStreamDestroy(g_stream));
    free(g_hbuf);
    free(g_nbuf);
}
