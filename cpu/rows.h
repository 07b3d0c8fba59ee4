/*
 * rows.h - the per-row kernels of the CPU backend (internal).
 *
 * One row (one token) is processed by one thread from start to end, in the
 * fixed order of docs/numerics.md, so the bits never depend on the thread
 * count or the schedule. A row's intermediate values live in a per-thread
 * scratch area that the caller provides (cpu/run.c allocates it once per
 * call): the kernels keep under 1 KiB on the stack whatever the hidden
 * size, so they run on small caller and OpenMP thread stacks.
 */
#ifndef BEAMMOE_CPU_ROWS_H
#define BEAMMOE_CPU_ROWS_H

#include "backend.h"
#include "cpu_isa.h"

/* The operations a row runs (bm_cpu_rows, and cpu/ops.h over all rows). */
enum { BM_OP_FINALIZE = 0, BM_OP_NRN = 1, BM_OP_FUSED = 2 };

/* Bytes of scratch one thread needs for rows of `hidden` elements (a
 * multiple of 64; the area must be 64-byte aligned). */
size_t bm_cpu_row_scratch(int32_t hidden);

/* Rows [t0, t1) of one operation (BM_OP_*), all on the calling thread:
 *  BM_OP_FINALIZE: output = finalize(experts, weights)
 *  BM_OP_NRN:      hidden_out, normalized = norm_residual_norm(x, residual)
 *  BM_OP_FUSED:    hidden_out, normalized = norm_residual_norm(finalize(..),
 *                  residual) without storing the finalized row
 * hidden_out may be the residual buffer. With a quantized output (a->q.kind)
 * each row's normalized is quantized as soon as it is written, in the same
 * pass (bm_cpu_quant_row): from the caller's normalized row, or, when only
 * the quantized form is asked for (a->normalized NULL), from a row of the
 * scratch. Rows are indexed from a's pointers, q's included. */
void bm_cpu_rows(const bm_args *a, int op, int64_t t0, int64_t t1, void *scratch);

/* The quantized output (q) of row t from its BF16 normalized values y[0,
 * hidden) (cpu/quant.c); cannot fail. */
void bm_cpu_quant_row(const bm_quant *q, const uint16_t *y, int64_t t, int32_t hidden);

/* The kernels these rows run (BM_ISA_*, lib/cpu_isa.h), as picked once per
 * process. */
int bm_cpu_rows_isa(void);

#endif
