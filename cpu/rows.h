/*
 * rows.h - the per-row kernels of the CPU backend (internal).
 *
 * One row (one token) is processed by one thread from start to end, in the
 * fixed order of SPEC.md section 2, so the bits never depend on the thread
 * count. Rows are at most BM_MAX_HIDDEN wide; scratch lives on the stack.
 */
#ifndef BEAMMOE_CPU_ROWS_H
#define BEAMMOE_CPU_ROWS_H

#include "backend.h"

/* The finalize stage of one token: out = post? N(s) : s. */
void bm_cpu_finalize_row(const bm_args *a, int64_t row, uint16_t *out);

/* The residual stage of one token from its branch row x (already finalized,
 * or the caller's x, pre-normed when a->pre.on): writes hidden and
 * normalized rows. hidden may alias residual. */
void bm_cpu_residual_row(const bm_args *a, const uint16_t *x, const uint16_t *residual,
                         uint16_t *hidden, uint16_t *normalized);

/* finalize then the residual stage of token `row`, never storing the
 * finalized row. */
void bm_cpu_fused_row(const bm_args *a, int64_t row, const uint16_t *residual, uint16_t *hidden,
                      uint16_t *normalized);

#endif
