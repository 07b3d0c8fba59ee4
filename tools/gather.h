/*
 * gather.h - the tensor-parallel gather part of `beammoe audit`: a fused
 * case through CPU groups of R = 1, 2, 3, 4, 8 ranks, every gather
 * strategy, each rank's outputs against the ground truth.
 */
#ifndef BEAMMOE_TOOLS_GATHER_H
#define BEAMMOE_TOOLS_GATHER_H

#include "case.h"

#define GATHER_NSTRAT 4

/* One table row per strategy: its name, the comparison over every rank and
 * group, the first failing group (detail) or the first error (error). */
typedef struct gather_row {
    char name[40];
    hu_cmp cmp;
    int errors;
    char error[500];
    char detail[600];
} gather_row;

/* The fused case c on CPU groups (the CPU backend selected). */
void audit_gather(const hc_case *c, const hc_out *truth, gather_row rows[GATHER_NSTRAT]);

#endif
