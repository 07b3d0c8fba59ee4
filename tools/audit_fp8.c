/*
 * audit_fp8.c - `beammoe audit`'s rows for the quantized output of
 * normalized (audit_fp8.h). A row compares, bit for bit, the E4M3 values
 * and the FP32 scales (every float of the scales array, column-major
 * padding included: it must keep the tool's poison), or a block-scaled
 * form's values and block scales (NVFP4: E2M1 values, E4M3 scales; every
 * byte of the block scale array, the rows past T of its last tile
 * included), plus hidden and
 * normalized (normalized kept in every other form, so that the calls that
 * write only the quantized form are audited too).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "audit_fp8.h"
#include "devmem.h"
#include "quant_model.h"

#define QPOISON 0x5A /* values and scales before a call; not what a call writes there */

/* The host copies of one *_q call's outputs. */
typedef struct qres {
    hc_out o;
    uint8_t *values; /* qm_values_bytes: [T, H] (4-bit values: [T, H / 2]) */
    float *scales;   /* nsc floats (block-scaled: the block scales' bytes) */
    size_t nv, nsc;
} qres;

static int qres_make(qres *r, const hc_case *c, const beam_quant *form)
{
    memset(r, 0, sizeof *r);
    r->nv = qm_values_bytes(form, c->s.T, c->s.H);
    r->nsc = qm_scale_floats(form, c->s.T, c->s.H);
    r->values = malloc(r->nv ? r->nv : 1);
    r->scales = malloc(r->nsc ? r->nsc * sizeof(float) : 1);
    if (!r->values || !r->scales || hc_out_make(&r->o, c, 1)) return -1;
    return 0;
}

static void qres_free(qres *r)
{
    free(r->values);
    free(r->scales);
    hc_out_free(&r->o);
}

/* One *_q call through ops (on its memory) into r; 0, or -1 with msg. */
static int run_q(const beam_ops *ops, const hc_case *c, hc_op op, beam_strategy strategy, const beam_quant *form,
                 int keep, qres *r, char *msg, size_t n)
{
    const int dev = ops->device_memory;
    const float *sc = c->s.scales ? c->scales : NULL;
    beam_quant q = *form;
    hc_bound b;
    void *dv = NULL, *ds = NULL;
    beam_status st;
    int rc = -1;
    memset(r->values, QPOISON, r->nv);
    memset(r->scales, QPOISON, r->nsc * sizeof(float));
    if (hc_bind(&b, c, op, &r->o, dev ? HC_DEVICE : 0u, msg, n)) return -1;
    qm_bind(&q, r->values, r->nsc ? r->scales : NULL);
    if (dev) {
        dv = dev_alloc(r->nv ? r->nv : 1);
        ds = dev_alloc(r->nsc ? r->nsc * sizeof(float) : 1);
        if (!dv || !ds || dev_upload(dv, r->values, r->nv) ||
            dev_upload(ds, r->scales, r->nsc * sizeof(float))) {
            snprintf(msg, n, "device memory: %s", dev_last_error());
            goto done;
        }
        qm_bind(&q, dv, r->nsc ? ds : NULL);
    }
    if (op == HC_NRN)
        st = ops->norm_residual_norm_q(b.x, b.residual, c->s.T, c->s.H, b.pre_p, sc, b.next_p, b.hidden,
                                       keep ? b.normalized : NULL, &q, NULL);
    else
        st = ops->moe_finalize_norm_residual_norm_q(b.experts, b.weights, c->cap, c->s.T, c->s.K, c->s.H, c->rs,
                                                    b.post_p, b.residual, sc, b.next_p, b.hidden,
                                                    keep ? b.normalized : NULL, &q, strategy, NULL);
    if (st != BEAM_OK) {
        snprintf(msg, n, "%s", ops->last_error());
        goto done;
    }
    if (hc_finish(&b, msg, n)) goto done;
    if (dev && (dev_download(r->values, dv, r->nv) || dev_download(r->scales, ds, r->nsc * sizeof(float)))) {
        snprintf(msg, n, "device memory: %s", dev_last_error());
        goto done;
    }
    rc = 0;
done:
    if (dev) {
        dev_free(dv);
        dev_free(ds);
    }
    hc_unbind(&b);
    return rc;
}

/* values and scales of got against want, byte for byte, into c */
static void cmp_quant(hu_cmp *c, const qres *got, const uint8_t *values, const float *scales)
{
    size_t i;
    for (i = 0; i < got->nv; i++) c->mismatched += got->values[i] != values[i];
    for (i = 0; i < got->nsc; i++) c->mismatched += memcmp(&got->scales[i], &scales[i], sizeof(float)) != 0;
    c->compared += (int64_t)(got->nv + got->nsc);
}

/* The case's rows: the CPU's call against the model, every strategy of
 * every backend against the CPU's call. */
static void audit_fp8_case(tally *t, const beam_ops *const ops[BM_NBACKENDS], const char *label, const hc_case *c,
                           hc_op op, const beam_quant *form, int keep)
{
    static const beam_strategy strategies[2] = {BEAM_STRATEGY_FUSED, BEAM_STRATEGY_UNFUSED};
    static const char *const what[5] = {"fused", "unfused", "", "reference", "truth"};
    char names[5][32];
    qres truth, got;
    hc_out ref;
    uint8_t *mv = NULL;
    float *ms = NULL;
    char msg[600];
    hu_cmp cmp;
    int b, s;

    /* "fp8 fused", ..., by the form's format */
    for (s = 0; s < 5; s++)
        snprintf(names[s], sizeof names[s], "%s%s%s", qm_name(form), *what[s] ? " " : "", what[s]);
    memset(&truth, 0, sizeof truth);
    memset(&got, 0, sizeof got);
    memset(&ref, 0, sizeof ref);
    if (qres_make(&truth, c, form) || qres_make(&got, c, form) || hc_out_make(&ref, c, 1)) {
        audit_print_error(t, label, "cpu", names[2], "out of memory for the outputs");
        goto out;
    }
    if (run_q(ops[BM_CPU], c, op, BEAM_STRATEGY_FUSED, form, keep, &truth, msg, sizeof msg)) {
        audit_print_error(t, label, "cpu", names[4], msg);
        goto out;
    }
    /* the model on the naive reference's normalized */
    mv = malloc(truth.nv ? truth.nv : 1);
    ms = malloc(truth.nsc ? truth.nsc * sizeof(float) : 1);
    if (!mv || !ms) {
        audit_print_error(t, label, "cpu", names[3], "out of memory");
        goto out;
    }
    memset(mv, QPOISON, truth.nv);
    memset(ms, QPOISON, truth.nsc * sizeof(float));
    hc_reference(c, op, &ref);
    qm_quant(form, ref.normalized, c->s.T, c->s.H, mv, ms);
    hu_cmp_init(&cmp);
    cmp_quant(&cmp, &truth, mv, ms);
    audit_print_row(t, label, "cpu", names[3], &cmp);

    for (b = 0; b < BM_NBACKENDS; b++) {
        if (!ops[b]) continue;
        for (s = 0; s < (op == HC_FUSED ? 2 : 1); s++) {
            if (b == BM_CPU && s == 0) continue; /* the truth itself */
            if (run_q(ops[b], c, op, strategies[s], form, keep, &got, msg, sizeof msg)) {
                audit_print_error(t, label, ops[b]->name, op == HC_FUSED ? names[s] : names[2], msg);
                continue;
            }
            hu_cmp_init(&cmp);
            hc_out_compare(&got.o, &truth.o, op, &cmp);
            cmp_quant(&cmp, &got, truth.values, truth.scales);
            audit_print_row(t, label, ops[b]->name, op == HC_FUSED ? names[s] : names[2], &cmp);
        }
    }
out:
    free(mv);
    free(ms);
    hc_out_free(&ref);
    qres_free(&truth);
    qres_free(&got);
}

void audit_fp8(tally *t, const beam_ops *const ops[BM_NBACKENDS], int quick, uint64_t seed)
{
    static const int64_t Ts[3] = {1, 7, 64};
    static const int32_t Hs[2] = {2048, 7168};
    static const hc_mode modes[2] = {HC_MODE_NORMAL, HC_MODE_MIXED};
    const float scales[2] = {0.75f, 1.25f};
    int oi, ti, hi, mi, f, index = 0;
    for (oi = 0; oi < 2; oi++)
        for (ti = quick ? 1 : 0; ti < (quick ? 2 : 3); ti++)
            for (hi = 0; hi < (quick ? 1 : 2); hi++)
                for (mi = quick ? 1 : 0; mi < 2; mi++) {
                    const hc_op op = oi ? HC_FUSED : HC_NRN;
                    const hc_spec sp = {.K = 8, .H = Hs[hi], .T = Ts[ti], .pad = 1,
                                        .post = op == HC_FUSED ? HC_NORM_WEIGHT : HC_NORM_OFF,
                                        .next = HC_NORM_WEIGHT, .scales = op == HC_FUSED};
                    beam_quant forms[QM_NFORMS];
                    hc_case c;
                    if (hc_make_mode(&c, op, &sp, 2.5f, scales, 1e-6f, modes[mi],
                                     seed ^ (0xC2B2AE3D27D4EB4FULL * (uint64_t)++index))) {
                        audit_print_error(t, "fp8", "cpu", "-", "out of memory for the inputs");
                        continue;
                    }
                    qm_forms(forms, sp.T);
                    for (f = 0; f < QM_NFORMS; f++) {
                        char label[128], form[64];
                        const int keep = f % 2 == 0;
                        qm_label(&forms[f], form, sizeof form);
                        snprintf(label, sizeof label, "%s T%lld H%d %s %s%s", hc_op_name(op), (long long)sp.T,
                                 (int)sp.H, hc_mode_name(modes[mi]), form, keep ? " +bf16" : "");
                        audit_fp8_case(t, ops, label, &c, op, &forms[f], keep);
                    }
                    hc_free(&c);
                }
}
