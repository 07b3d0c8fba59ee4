/*
 * audit_rows.h - the rows of `beammoe audit`'s table: a comparison's row,
 * an error's row, and the running totals the summary line reports.
 */
#ifndef BEAMMOE_TOOLS_AUDIT_ROWS_H
#define BEAMMOE_TOOLS_AUDIT_ROWS_H

#include <stdint.h>

#include "util.h" /* hu_cmp */

typedef struct tally {
    int rows, bad_rows, errors;
    int64_t compared, mismatched;
} tally;

void audit_print_header(void);
void audit_print_row(tally *t, const char *label, const char *backend, const char *strategy, const hu_cmp *c);
void audit_print_error(tally *t, const char *label, const char *backend, const char *strategy, const char *msg);

#endif
