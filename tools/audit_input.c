/*
 * audit_input.c - `beammoe audit --input FILE`: the rows of audit.c for the
 * one case a safetensors file holds (harness/st_case.c), and the results
 * stored in the file against the ground truth.
 *
 * One case: the report has every row (the Python wrapper,
 * python/beammoe/audit.py, hands that table to its caller), in text or in
 * the JSON document of --json.
 */
#include <stdlib.h>
#include <string.h>

#include "audit.h"
#include "common.h"
#include "st_case.h"
#include "text.h"

/* A tensor of the file's stored results against the ground truth: a row
 * "file stored:<name>". */
static int compare_stored(tally *t, const char *label, const st_tensor *st, const uint16_t *truth)
{
    hu_cmp c;
    uint16_t *buf;
    char strat[40];
    if (!st) return 0;
    buf = hu_try_alloc((size_t)st->numel * 2, 0);
    snprintf(strat, sizeof strat, "stored:%s", st->name);
    if (!buf) {
        audit_print_error(t, label, "file", strat, "out of memory");
        return -1;
    }
    st_get_u16(st, buf);
    hu_cmp_init(&c);
    hu_cmp_add(&c, buf, truth, (size_t)st->numel);
    audit_print_row(t, label, "file", strat, &c);
    hu_free(buf);
    return 0;
}

int audit_input(const char *path, int quick, const audit_view *v)
{
    st_file f;
    hc_case p;
    hc_op op;
    st_stored s;
    hc_out truth;
    beam_status st;
    tally t;
    char label[160], o[64] = "", msg[600];
    /* the path as printed: a file name may hold escape sequences too */
    char shown[1024];
    unsigned others;
    int rc;
    double t0;
    jw json, *w = v->json ? &json : NULL;

    audit_ops[BM_CPU] = beam_backend_ops("cpu", BEAM_OPS_VERSION);
    if (!audit_ops[BM_CPU])
        return report_lib_error(NULL, "audit", "beam_backend_ops(\"cpu\")", BEAM_ERR_UNSUPPORTED);
    if ((rc = load_input_case("audit", path, &f, &p, &op, &s)) != 0) return rc;
    hu_escape(shown, sizeof shown, path, 0);

    /* ground truth: the CPU backend's call; an argument it rejects (eps,
     * scales, ...) is the file's fault, said in the library's words */
    memset(&truth, 0, sizeof truth);
    if (hc_out_make(&truth, &p, 1)) {
        fprintf(stderr, "beammoe audit: %s: out of memory for the outputs\n", shown);
        rc = TOOL_EXIT_FAIL;
        goto out;
    }
    st = hc_run(audit_ops[BM_CPU], &p, op, BEAM_STRATEGY_FUSED, 0, &truth, msg, sizeof msg);
    if (st != BEAM_OK) {
        fprintf(stderr, "beammoe audit: %s: the library rejects these tensors: %s: %s\n", shown,
                beam_status_string(st), audit_ops[BM_CPU]->last_error());
        rc = tool_exit_status(st);
        goto out;
    }

    audit_begin(w, v, path, 0, quick);
    others = audit_detect_backends(w, v->verbose);
    /* the case column: the case alone; the file's whole name is on the
     * first line (it was cut to what the column left over) */
    if (p.post.on) strcat(o, p.post.weight ? "post:w " : "post ");
    if (p.next.on) strcat(o, p.next.weight ? "next:w " : "next ");
    if (p.s.scales) strcat(o, "sc ");
    snprintf(label, sizeof label, "%s T%lld K%d H%d c%lld %srs%g", hc_op_name(op), (long long)p.s.T,
             (int)p.s.K, (int)p.s.H, (long long)p.cap, o, (double)p.rs);
    t = (tally){.verbose = 1, .one_case = 1, .json = w};
    if (w)
        jw_begin_arr(w, "rows");
    else
        printf("\n");
    t0 = hu_now();
    audit_problem(&t, label, &p, op, &truth, quick, others);
    compare_stored(&t, label, s.out, truth.hidden);
    compare_stored(&t, label, s.hidden, truth.hidden);
    compare_stored(&t, label, s.normalized, truth.normalized);
    rc = audit_end(w, &t, 1, "file", -1, hu_now() - t0);
out:
    hc_out_free(&truth);
    hc_free(&p);
    st_close(&f);
    return rc;
}
