/*
 * check.h - the contract of docs/contract.md, checked once for every backend.
 *
 * Each helper returns BEAM_OK or sets the message "fn: argument=value rule"
 * and returns BEAM_ERR_INVALID_ARGUMENT. Nothing here writes user memory.
 */
#ifndef BEAMMOE_LIB_CHECK_H
#define BEAMMOE_LIB_CHECK_H

#include "backend.h"

#define BM_MIN_HIDDEN 256
#define BM_MAX_HIDDEN 8192
#define BM_MAX_TOP_K 32

beam_status bm_check_top_k(const char *fn, int32_t top_k);
beam_status bm_check_hidden(const char *fn, int32_t hidden);
/* 0 <= live <= capacity, and every extent in bytes fits in a size_t. */
beam_status bm_check_rows(const char *fn, const char *cap_name, int64_t capacity,
                          const char *live_name, int64_t live, int32_t top_k, int32_t hidden);
beam_status bm_check_finite(const char *fn, const char *name, float v);
/* NULL norm -> out->on = 0; else eps finite and >= 0. */
/* A norm as the backends take it (NULL: off), unchecked; bm_check_norm
 * checks its eps first. */
bm_norm bm_norm_of(const beam_norm *n);
beam_status bm_check_norm(const char *fn, const char *name, const beam_norm *n, bm_norm *out);
/* NULL -> *has = 0; else both finite. */
beam_status bm_check_scales(const char *fn, const float *scales, int *has, float *sx, float *sr);
/* Non-NULL when the extent is not empty, aligned to `align`, no wrap-around,
 * no output overlapping an input or another output (exception: an output and
 * an input both marked in_place may be exactly the same buffer). */
beam_status bm_check_pointers(const char *fn, const bm_ptr *p, int n);
/* quant NULL -> out->kind = 0; else its form, sizes and flags against
 * tokens and hidden (next_on: a next norm is given). Fills p[0] (values)
 * and p[1] (scales) for the pointer checks. */
beam_status bm_check_quant(const char *fn, const beam_quant *quant, int next_on, int64_t tokens,
                           int32_t hidden, bm_quant *out, bm_ptr p[2]);
/* Local ops: AUTO, FUSED, UNFUSED. Gather: AUTO, ONESHOT, TWOSHOT, UNFUSED. */
beam_status bm_check_strategy(const char *fn, beam_strategy s, int gather);
const char *bm_strategy_name(beam_strategy s);

#endif
