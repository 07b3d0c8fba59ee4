/*
 * audit_rows.c - the rows of `beammoe audit`'s table and their running
 * totals (audit_rows.h), printed by the audit of the operations
 * (tools/audit.c) and of the quantized output (tools/audit_fp8.c).
 */
#include <stdio.h>

#include "audit_rows.h"

void audit_print_header(void)
{
    printf("%-56s %-7s %-18s %11s %10s %7s\n", "case", "backend", "strategy", "compared",
           "mismatch", "maxulp");
}

void audit_print_row(tally *t, const char *label, const char *backend, const char *strategy, const hu_cmp *c)
{
    char ulp[32];
    hu_cmp_ulp_text(c, ulp, sizeof ulp);
    printf("%-56s %-7s %-18s %11lld %10lld %7s%s\n", label, backend, strategy,
           (long long)c->compared, (long long)c->mismatched, ulp, c->mismatched ? "  <-- MISMATCH" : "");
    t->rows++;
    t->compared += c->compared;
    t->mismatched += c->mismatched;
    if (c->mismatched) t->bad_rows++;
}

void audit_print_error(tally *t, const char *label, const char *backend, const char *strategy, const char *msg)
{
    printf("%-56s %-7s %-18s %11s %10s %7s  <-- ERROR\n      %s\n", label, backend, strategy, "-",
           "ERROR", "-", msg);
    t->rows++;
    t->errors++;
}
