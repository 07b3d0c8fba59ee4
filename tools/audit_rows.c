/*
 * audit_rows.c - the rows of `beammoe audit`'s report and their totals
 * (audit_rows.h), from the audit of the operations (tools/audit.c), of a
 * file (tools/audit_input.c) and of the quantized output
 * (tools/audit_fp8.c), and the report's first and last lines.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "audit.h"
#include "common.h"
#include "omp_shim.h"
#include "text.h"

#define ROW_FMT "%-56s %-7s %-18s %11s %10s %7s"

/* The backend and strategy's totals, added at its first row (NULL: out of
 * memory; the summary line still counts the row). */
static agroup *group_of(tally *t, const char *backend, const char *strategy)
{
    agroup *g;
    int i;
    for (i = 0; i < t->ngroups; i++)
        if (!strcmp(t->groups[i].backend, backend) && !strcmp(t->groups[i].strategy, strategy))
            return &t->groups[i];
    if (t->ngroups == t->cap) {
        int cap = t->cap ? 2 * t->cap : 32;
        agroup *v = realloc(t->groups, sizeof *v * (size_t)cap);
        if (!v) return NULL;
        t->groups = v;
        t->cap = cap;
    }
    g = &t->groups[t->ngroups++];
    memset(g, 0, sizeof *g);
    snprintf(g->backend, sizeof g->backend, "%s", backend);
    snprintf(g->strategy, sizeof g->strategy, "%s", strategy);
    hu_cmp_init(&g->cmp);
    return g;
}

/* Before the first row printed in text: the column names (and, in the
 * default report, what the rows are). */
static void text_header(tally *t)
{
    if (t->shown++) return;
    if (!t->verbose) printf("rows that mismatch or fail (every row: --verbose):\n");
    printf(ROW_FMT "\n", "case", "backend", "strategy", "compared", "mismatch", "maxulp");
}

/* A row in JSON: its case, backend, strategy and numbers or error. */
static void json_row(tally *t, const char *label, const char *backend, const char *strategy, const hu_cmp *c,
                     const char *error, const char *detail)
{
    jw_begin_row(t->json, NULL);
    jw_str(t->json, "case", label);
    jw_str(t->json, "backend", backend);
    jw_str(t->json, "strategy", strategy);
    if (error) {
        jw_str(t->json, "error", error);
    } else {
        jw_int(t->json, "compared", c->compared);
        jw_int(t->json, "mismatched", c->mismatched);
        jw_int(t->json, "max_ulp", c->max_ulp);
        jw_bool(t->json, "nan_vs_number", c->nan_vs_number);
        if (detail && *detail) jw_str(t->json, "detail", detail);
    }
    jw_end(t->json);
}

void audit_print_row_detail(tally *t, const char *label, const char *backend, const char *strategy,
                            const hu_cmp *c, const char *detail)
{
    agroup *g = group_of(t, backend, strategy);
    t->rows++;
    t->compared += c->compared;
    t->mismatched += c->mismatched;
    if (c->mismatched) t->bad_rows++;
    if (g) {
        g->rows++;
        g->bad_rows += c->mismatched != 0;
        g->cmp.compared += c->compared;
        g->cmp.mismatched += c->mismatched;
        if (c->max_ulp > g->cmp.max_ulp) g->cmp.max_ulp = c->max_ulp;
        g->cmp.nan_vs_number |= c->nan_vs_number;
    }
    if (!t->verbose && !c->mismatched) return;
    if (t->json) {
        json_row(t, label, backend, strategy, c, NULL, detail);
    } else {
        char ulp[32], compared[24], mismatched[24];
        hu_cmp_ulp_text(c, ulp, sizeof ulp);
        snprintf(compared, sizeof compared, "%lld", (long long)c->compared);
        snprintf(mismatched, sizeof mismatched, "%lld", (long long)c->mismatched);
        text_header(t);
        printf(ROW_FMT "%s\n", label, backend, strategy, compared, mismatched, ulp,
               c->mismatched ? "  <-- MISMATCH" : "");
        if (detail && *detail) printf("      %s\n", detail);
    }
}

void audit_print_row(tally *t, const char *label, const char *backend, const char *strategy, const hu_cmp *c)
{
    audit_print_row_detail(t, label, backend, strategy, c, NULL);
}

void audit_print_error(tally *t, const char *label, const char *backend, const char *strategy, const char *msg)
{
    agroup *g = group_of(t, backend, strategy);
    t->rows++;
    t->errors++;
    if (g) {
        g->rows++;
        g->errors++;
    }
    if (t->json) {
        json_row(t, label, backend, strategy, NULL, msg, NULL);
        return;
    }
    text_header(t);
    printf(ROW_FMT "  <-- ERROR\n      %s\n", label, backend, strategy, "-", "ERROR", "-", msg);
}

void audit_skipped(tally *t, const char *backend, const char *strategy, const char *why)
{
    agroup *g = group_of(t, backend, strategy);
    if (g) g->skipped = why;
    if (t->verbose && !t->json) {
        text_header(t);
        printf(ROW_FMT "  skipped: %s\n", "(every fused case)", backend, strategy, "-", "-", "-", why);
    }
}

void audit_print_groups(tally *t)
{
    int i;
    if (t->json) {
        jw_end(t->json); /* "rows" */
        jw_begin_arr(t->json, "groups");
        for (i = 0; i < t->ngroups; i++) {
            const agroup *g = &t->groups[i];
            jw_begin_row(t->json, NULL);
            jw_str(t->json, "backend", g->backend);
            jw_str(t->json, "strategy", g->strategy);
            if (g->skipped) {
                jw_str(t->json, "skipped", g->skipped);
            } else {
                jw_int(t->json, "cases", g->rows);
                jw_int(t->json, "compared", g->cmp.compared);
                jw_int(t->json, "mismatched", g->cmp.mismatched);
                jw_int(t->json, "mismatched_cases", g->bad_rows);
                jw_int(t->json, "errors", g->errors);
                jw_int(t->json, "max_ulp", g->cmp.max_ulp);
                jw_bool(t->json, "nan_vs_number", g->cmp.nan_vs_number);
            }
            jw_end(t->json);
        }
        jw_end(t->json);
        return;
    }
    if (t->one_case) return;
    if (t->shown) printf("\n");
    printf("%-7s %-20s %6s %13s %10s %7s\n", "backend", "strategy", "cases", "compared", "mismatch", "maxulp");
    for (i = 0; i < t->ngroups; i++) {
        const agroup *g = &t->groups[i];
        char ulp[32];
        if (g->skipped) {
            printf("%-7s %-20s %6s %13s %10s %7s  skipped: %s\n", g->backend, g->strategy, "-", "-", "-", "-",
                   g->skipped);
            continue;
        }
        hu_cmp_ulp_text(&g->cmp, ulp, sizeof ulp);
        printf("%-7s %-20s %6d %13lld %10lld %7s", g->backend, g->strategy, g->rows, (long long)g->cmp.compared,
               (long long)g->cmp.mismatched, ulp);
        if (g->bad_rows) printf("  <-- MISMATCH in %d case%s", g->bad_rows, g->bad_rows > 1 ? "s" : "");
        if (g->errors) printf("  <-- ERROR in %d case%s", g->errors, g->errors > 1 ? "s" : "");
        printf("\n");
    }
}

void audit_progress(tally *t, int done, int total, const char *what)
{
    const double now = hu_now();
    if (!t->progress_start) t->progress_start = t->last_progress = now;
    /* every 2 s; the last step only after others (a quick run says nothing) */
    if (done < total ? now - t->last_progress < 2.0 : !t->progress_lines) return;
    fprintf(stderr, "beammoe audit: %d of %d %s, %.0f s, %d mismatching rows, %d errors so far\n", done, total,
            what, now - t->progress_start, t->bad_rows, t->errors);
    t->progress_lines++;
    t->last_progress = now;
}

void audit_begin(jw *w, const audit_view *v, const char *input, uint64_t seed, int quick)
{
    if (w) {
        jw_init(w, stdout);
        jw_begin_obj(w, NULL);
        jw_str(w, "format", "beammoe-audit/1");
        jw_str(w, "library", beam_version());
        jw_str(w, "input", input);
        if (input)
            jw_null(w, "seed");
        else
            jw_uint(w, "seed", seed);
        jw_str(w, "sweep", input ? NULL : quick ? "quick" : "full");
        jw_bool(w, "quick", quick);
        jw_bool(w, "verbose", v->verbose);
        jw_int(w, "openmp_threads", omp_get_max_threads());
        return;
    }
    if (input) {
        char shown[1024];
        printf("beammoe audit: library %s, input %s, OpenMP threads %d\n", beam_version(),
               hu_escape(shown, sizeof shown, input, 0), omp_get_max_threads());
    } else {
        printf("beammoe audit: library %s, seed %llu, %s sweep, OpenMP threads %d\n", beam_version(),
               (unsigned long long)seed, quick ? "quick" : "full", omp_get_max_threads());
    }
}

int audit_end(jw *w, tally *t, int cases, const char *what, int64_t ties, double seconds)
{
    const int fail = t->mismatched || t->errors;
    audit_print_groups(t);
    if (w) {
        jw_begin_row(w, "summary");
        jw_int(w, "cases", cases);
        jw_int(w, "rows", t->rows);
        jw_int(w, "compared", t->compared);
        jw_int(w, "mismatched", t->mismatched);
        jw_int(w, "mismatched_rows", t->bad_rows);
        jw_int(w, "errors", t->errors);
        if (ties >= 0)
            jw_int(w, "rounding_ties", ties);
        else
            jw_null(w, "rounding_ties");
        jw_num(w, "seconds", seconds);
        jw_str(w, "result", fail ? "FAIL" : "PASS");
        jw_end(w);
        jw_end(w);
    } else {
        char ties_text[64] = "";
        if (ties >= 0) {
            /* the count alone read as a warning: say what it is */
            printf("\nrounding ties: %lld results of the naive reference lay exactly halfway between two\n"
                   "  BF16 values and were rounded to even; the tie inputs make them on purpose, so\n"
                   "  a count above 0 shows that rule was exercised (not a problem)\n",
                   (long long)ties);
            snprintf(ties_text, sizeof ties_text, "reference met %lld rounding ties, ", (long long)ties);
        }
        printf("\nsummary: %d %s%s, %d rows, %lld elements compared, %lld mismatching in %d rows, "
               "%d errors, %s%.1f s: %s\n",
               cases, what, cases == 1 ? "" : "s", t->rows, (long long)t->compared, (long long)t->mismatched,
               t->bad_rows, t->errors, ties_text, seconds, fail ? "FAIL" : "PASS");
    }
    audit_tally_free(t);
    return fail ? TOOL_EXIT_FAIL : TOOL_EXIT_OK;
}

void audit_tally_free(tally *t)
{
    free(t->groups);
    t->groups = NULL;
    t->ngroups = t->cap = 0;
}
