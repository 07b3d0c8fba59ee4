/*
 * audit_rows.h - the rows of `beammoe audit`'s report: a comparison's row,
 * an error's row, the running totals of the summary line, and the totals
 * per backend and strategy of the default report.
 *
 * Three ways to show them (docs/tool.md):
 *   default    the table per backend and strategy at the end; a row that
 *              mismatches or fails is printed in full as it happens
 *   verbose    every row as it happens, then the same table
 *   json       rows into the "rows" array of a JSON document (every row
 *              with verbose, else those that mismatch or fail), the table
 *              into "groups"
 */
#ifndef BEAMMOE_TOOLS_AUDIT_ROWS_H
#define BEAMMOE_TOOLS_AUDIT_ROWS_H

#include <stdint.h>

#include "json_out.h"
#include "util.h" /* hu_cmp */

/* One backend and strategy, summed over the cases. */
typedef struct agroup {
    char backend[16], strategy[40];
    int rows, bad_rows, errors;
    hu_cmp cmp;
    const char *skipped; /* not run here, and why (a static string) */
} agroup;

typedef struct tally {
    int rows, bad_rows, errors;
    int64_t compared, mismatched;
    /* how rows are shown (set before the first row) */
    int verbose;  /* every row; else only those that mismatch or fail */
    int one_case; /* the rows are the whole report: no table of totals in text */
    jw *json;    /* a JSON document whose "rows" array is open; NULL: text */
    int shown;   /* rows printed in text so far: the header comes first */
    agroup *groups;
    int ngroups, cap;
    double progress_start, last_progress; /* hu_now(): the first call, the last line */
    int progress_lines;
} tally;

void audit_print_row(tally *t, const char *label, const char *backend, const char *strategy, const hu_cmp *c);
/* The same with a line of detail under it (the gather's first failing
 * group; NULL or "": none). */
void audit_print_row_detail(tally *t, const char *label, const char *backend, const char *strategy,
                            const hu_cmp *c, const char *detail);
void audit_print_error(tally *t, const char *label, const char *backend, const char *strategy, const char *msg);
/* A backend and strategy that the audit cannot run here, and why. */
void audit_skipped(tally *t, const char *backend, const char *strategy, const char *why);

/* The end of the rows: in text, the table per backend and strategy; in
 * JSON, the "rows" array closed and the "groups" array written. */
void audit_print_groups(tally *t);
/* A line on stderr, at most one every 2 s, while a long audit runs:
 * "beammoe audit: <done> of <total> <what>, <seconds> s, ..." (the first
 * call, done 0, starts the clock; done == total ends, with a line only
 * when there were others). */
void audit_progress(tally *t, int done, int total, const char *what);
void audit_tally_free(tally *t);

#endif
