/*
 * reference.h - the tool's own scalar model of SPEC.md section 2.
 *
 * Written from the specification alone, sharing no code with cpu/ or tests/,
 * so `beammoe audit` can check the CPU backend (the ground truth of the other
 * backends) against something independent. Slow and simple on purpose.
 */
#ifndef BEAMMOE_TOOLS_REFERENCE_H
#define BEAMMOE_TOOLS_REFERENCE_H

#include <stdint.h>

#include "beammoe.h"

/* out[t] for t < tokens; x is [*, top_k, hidden], w is [*, top_k]. */
void ref_finalize(const uint16_t *x, const float *w, int64_t tokens, int32_t top_k,
                  int32_t hidden, float routed_scale, const beam_norm *post,
                  uint16_t *out);

/* hidden_out / normalized for t < tokens; normalized untouched when next is
 * NULL. hidden_out may equal residual. */
void ref_norm_residual_norm(const uint16_t *x, const uint16_t *residual, int64_t tokens,
                            int32_t hidden, const beam_norm *pre, const float *scales,
                            const beam_norm *next, uint16_t *hidden_out,
                            uint16_t *normalized);

/* finalize then norm_residual_norm without pre-norm, row by row. */
void ref_finalize_norm_residual_norm(const uint16_t *x, const float *w, int64_t tokens,
                                     int32_t top_k, int32_t hidden, float routed_scale,
                                     const beam_norm *post, const uint16_t *residual,
                                     const float *scales, const beam_norm *next,
                                     uint16_t *hidden_out, uint16_t *normalized);

/* How many bf16() roundings so far hit an exact tie (low 16 bits 0x8000):
 * lets the audit show that its tie inputs really exercise nearest-even. */
extern int64_t ref_ties_seen;

#endif
