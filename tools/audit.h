/*
 * audit.h - pieces of `beammoe audit` shared between audit.c (cases, local
 * operations, the table) and gather.c (the tensor-parallel gather).
 */
#ifndef BEAMMOE_TOOLS_AUDIT_H
#define BEAMMOE_TOOLS_AUDIT_H

#include "common.h"
#include "problem.h"

/* Running totals of the table. */
typedef struct tally {
    int rows, bad_rows, errors;
    int64_t compared, mismatched;
} tally;

void audit_print_header(void);
void audit_print_row(tally *t, const char *label, const char *backend, const char *strategy,
                     const cmp_result *c);
void audit_print_error(tally *t, const char *label, const char *backend, const char *strategy,
                       const char *msg);

/* The fused problem p through CPU groups of R = 1, 2, 3, 4, 8 ranks and every
 * gather strategy, each rank's outputs against truth. Backend must be cpu. */
void audit_gather(tally *t, const char *label, const problem *p, const outputs *truth);

/* Every row of problem p after its CPU ground truth: the scalar reference,
 * the other CPU variants, the gather groups (fused op), CUDA if available. */
void audit_problem(tally *t, const char *label, const problem *p, const outputs *truth,
                   int quick, int have_cuda);

/* Prints the "backends:" line; 1 when CUDA can be audited. CPU selected after. */
int audit_detect_backends(void);

#endif
