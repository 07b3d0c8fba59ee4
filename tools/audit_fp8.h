/*
 * audit_fp8.h - `beammoe audit`'s rows for the quantized output of
 * normalized (the *_q calls, docs/numerics.md#fp8).
 */
#ifndef BEAMMOE_TOOLS_AUDIT_FP8_H
#define BEAMMOE_TOOLS_AUDIT_FP8_H

#include <stdint.h>

#include "audit_rows.h"
#include "backends.h"
#include "case.h"

/* Every form of the harness (quant_model.h) on norm_residual_norm and the
 * fused op with a next norm, special-value inputs included: the CPU
 * backend's *_q call is the ground truth, checked against the model on the
 * naive reference's normalized; every strategy of every backend in ops
 * (NULL: not audited) against it: values, scales, hidden and normalized. */
void audit_fp8(tally *t, const beam_ops *const ops[BM_NBACKENDS], int quick, uint64_t seed);

#endif
