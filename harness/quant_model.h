/*
 * quant_model.h - the harness's own model of docs/numerics.md#fp8: the
 * quantized output of BF16 normalized rows (beam_quant), written from the
 * text of that section and nothing of the library's (the E4M3 value is the
 * nearest of the 254 finite codes, found by search). Used by
 * tests/test_quant.c (the local *_q calls), the gather's tests
 * (tests/test_group.c, tests/gather_parts.c), `beammoe audit` and
 * bench/shape_sweep check. Thread-safe: ranks that are threads call it at
 * once.
 */
#ifndef BEAMMOE_HARNESS_QUANT_MODEL_H
#define BEAMMOE_HARNESS_QUANT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "beammoe.h"

/* e4m3(clamp(v)): clamp = fminf(fmaxf(v, -448), 448) (a NaN becomes -448),
 * then the nearest finite code of v's sign, ties to the even code. */
uint8_t qm_e4m3(float v);

/* The scale of one group (GROUP), row (TOKEN) of n values y, or q->scale
 * (TENSOR). */
float qm_scale(const beam_quant *q, const uint16_t *y, int n);

/* values and scales of T rows of normalized ([T, H] BF16), into arrays laid
 * out as q says (q->values and q->scales are not used): vals [T, H],
 * scales as q's kind, flags and scale_ld place them. Nothing else of the
 * two arrays is written (column-major padding included). */
void qm_quant(const beam_quant *q, const uint16_t *nrm, int64_t T, int32_t H, uint8_t *vals, float *scales);

/* The forms the tests run, for T rows (values, scales and scale_ld's
 * arrays are the caller's): group 128 row-major, group 64 UE8M0
 * column-major with DeepGEMM's scale_ld (T rounded up to 4: rows T.. of
 * each column are padding), token, token UE8M0, tensor (scale 0.0125). */
#define QM_NFORMS 5
void qm_forms(beam_quant *q, int64_t T);

/* The floats a scales array of q's form spans for T rows of H (column-major:
 * every column of scale_ld, padding included; TENSOR: 0). */
size_t qm_scale_floats(const beam_quant *q, int64_t T, int32_t H);

#endif
