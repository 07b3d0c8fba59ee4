/*
 * audit.h - what `beammoe audit`'s built-in sweep (audit.c) and its audit
 * of a file (audit_input.c) share: the backends' tables, the rows of one
 * case, the backends line; and the two entries its command (audit_cmd.c)
 * takes.
 */
#ifndef BEAMMOE_TOOLS_AUDIT_H
#define BEAMMOE_TOOLS_AUDIT_H

#include "audit_rows.h"
#include "backends.h"
#include "case.h"
#include "json_out.h"

/* Every backend's table, from audit_detect_backends (NULL: not audited);
 * the calls of the audit go through these. */
extern const beam_ops *audit_ops[BM_NBACKENDS];

/* How the report is shown (the options --verbose, --json). */
typedef struct audit_view {
    int verbose, json;
} audit_view;

/* Every row of one case after its ground truth (the CPU backend's
 * fused/plain call) is known: the naive reference, the other CPU variants,
 * the CPU gather groups (fused op) and every other backend that can be
 * audited here (bit b of `others`). */
void audit_problem(tally *t, const char *label, const hc_case *p, hc_op op, const hc_out *truth, int quick,
                   unsigned others);

/* Which backends of lib/backends.def besides the CPU the audit reaches,
 * bit b for backend b; says which in text ("backends: cpu, cuda", then a
 * line in plain words for each one that cannot be audited, with the
 * library's own words under it when verbose) or as the "backends" array of
 * the JSON document w (NULL: text). Leaves the CPU backend selected. */
unsigned audit_detect_backends(jw *w, int verbose);

/* The JSON document's and the text report's first part: the command, the
 * library, and what was audited (input: the file, or NULL for the sweep
 * with its seed). */
void audit_begin(jw *w, const audit_view *v, const char *input, uint64_t seed, int quick);

/* The summary: the totals of t, the cases, the reference's rounding ties
 * (-1: not counted), the seconds; closes the JSON document. Returns the
 * exit status (0 every row matches, 1 a mismatch or an error row). */
int audit_end(jw *w, tally *t, int cases, const char *what, int64_t ties, double seconds);

/* The built-in sweep (audit.c): the exit status (0 all match, 1 a mismatch
 * or library error). */
int audit_sweep(const audit_view *v, int quick, uint64_t seed);

/* `beammoe audit --input path`: the exit status (0 all match, 1 a
 * mismatch or library error, 2 the file cannot be used). */
int audit_input(const char *path, int quick, const audit_view *v);

#endif
