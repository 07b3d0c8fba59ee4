/*
 * quant_model.h - the harness's own model of docs/numerics.md#fp8 and
 * docs/numerics.md#nvfp4: the quantized output of BF16 normalized rows
 * (beam_quant), written from the text of those sections and nothing of the
 * library's (the E4M3 value is the nearest of the 254 finite codes, the
 * E2M1 value the nearest of the 8 magnitudes, both found by search; the
 * NVFP4 scale layout from the formula of the text). Used by
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

/* NVFP4 (docs/numerics.md#nvfp4), one piece at a time:
 * qm_e2m1(p): the nearest of 0, 0.5, 1, 1.5, 2, 3, 4, 6 to |p| (ties to the
 * even code, beyond 6 saturated) with p's sign as bit 3; a NaN gives 0x7.
 * qm_nvfp4_scale(m, g): a block's scale code from its largest magnitude m
 * (not a NaN) and the global scale g: e4m3(min(RN(g * RN(m * RN(1/6))),
 * 448)). qm_nvfp4_factor(sf, g): RN(g * RN(1 / value(sf))), 0 when sf is 0.
 * qm_nvfp4_offset(t, b, H): the byte of token t's block b in the tiled
 * scale layout. */
uint8_t qm_e2m1(float p);
uint8_t qm_nvfp4_scale(float m, float g);
float qm_nvfp4_factor(uint8_t sf, float g);
int64_t qm_nvfp4_offset(int64_t t, int64_t b, int32_t H);

/* values and scales of T rows of normalized ([T, H] BF16), into arrays laid
 * out as q says (q->values, q->scales and q->block_scales are not used):
 * vals [T, H] (NVFP4: [T, H / 2], two codes a byte, the even element low),
 * scales the FP32 scales as q's kind, flags and scale_ld place them, or for
 * NVFP4 the E4M3 block scales, bytes, each at qm_nvfp4_offset of its row t
 * of the T given (the global row in a gather): hence void *. Nothing else
 * of the two arrays is written (column-major padding and the NVFP4 tiles'
 * rows past T included). */
void qm_quant(const beam_quant *q, const uint16_t *nrm, int64_t T, int32_t H, uint8_t *vals, void *scales);

/* The forms the tests run, for T rows (values, scales and scale_ld's
 * arrays are the caller's): group 128 row-major, group 64 UE8M0
 * column-major with DeepGEMM's scale_ld (T rounded up to 4: rows T.. of
 * each column are padding), token, token UE8M0, tensor (scale 0.0125);
 * then NVFP4 with the global scales 672 (448 * 6 / 4: the usual one for
 * rows whose largest magnitude is about 4) and 1. The FP8 forms are the
 * first QM_NFP8_FORMS. */
#define QM_NFP8_FORMS 5
#define QM_NFORMS 7
void qm_forms(beam_quant *q, int64_t T);

/* The bytes of q's values for T rows of H: T * H (NVFP4: T * H / 2). */
size_t qm_values_bytes(const beam_quant *q, int64_t T, int32_t H);

/* The floats a scales array of q's form spans for T rows of H (column-major:
 * every column of scale_ld, padding included; TENSOR: 0; NVFP4: the block
 * scales' BEAM_NVFP4_SCALE_BYTES / 4, whole tiles of 512 bytes). */
size_t qm_scale_floats(const beam_quant *q, int64_t T, int32_t H);

/* Points q at a caller's arrays as its kind takes them: values; scales
 * (GROUP, TOKEN), block_scales (NVFP4, the bytes of the float array) or
 * neither (TENSOR). */
void qm_bind(beam_quant *q, uint8_t *values, float *scales);

#endif
