/*
 * quant_model.h - the harness's own model of docs/numerics.md#fp8, #nvfp4
 * and #mxfp8: the quantized output of BF16 normalized rows (beam_quant),
 * written from the text of those sections and nothing of the library's
 * (the E4M3 value is the nearest of the 254 finite codes, the E2M1 value
 * the nearest of the 8 magnitudes, both found by search, MXFP8's power of
 * two scale too; the block scales' layout from the formula of the text). Used by
 * tests/test_quant.c (the local *_q calls), the gather's tests
 * (tests/test_group.c, tests/gather_parts.c), tests/test_stack.c, `beammoe
 * audit` and bench/shape_sweep check. Thread-safe: ranks that are threads
 * call it at once.
 *
 * The kinds the model knows are the lines of one table (quant_model.c,
 * g_kinds), the forms the tests run another (g_forms, qm_forms): a new form
 * is a line of each (and its rows, if its arithmetic is new). The callers
 * ask the helpers below what a form is (block-scaled or not, its arrays'
 * sizes, its name) rather than testing its kind.
 */
#ifndef BEAMMOE_HARNESS_QUANT_MODEL_H
#define BEAMMOE_HARNESS_QUANT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "beammoe.h"

/* e4m3(clamp(v)): clamp = fminf(fmaxf(v, -448), 448) (a NaN becomes -448),
 * then the nearest finite code of v's sign, ties to the even code. */
uint8_t qm_e4m3(float v);

/* NVFP4 (docs/numerics.md#nvfp4), one piece at a time:
 * qm_e2m1(p): the nearest of 0, 0.5, 1, 1.5, 2, 3, 4, 6 to |p| (ties to the
 * even code, beyond 6 saturated) with p's sign as bit 3; a NaN gives 0x7.
 * qm_nvfp4_scale(m, g): a block's scale code from its largest magnitude m
 * (not a NaN) and the global scale g: e4m3(min(RN(g * RN(m * RN(1/6))),
 * 448)). qm_nvfp4_factor(sf, g): RN(g * RN(1 / value(sf))), 0 when sf is 0.
 * qm_nvfp4_offset(t, b, H): the byte of token t's block b in the tiled
 * scale layout (qm_block_offset of an NVFP4 form). */
uint8_t qm_e2m1(float p);
uint8_t qm_nvfp4_scale(float m, float g);
float qm_nvfp4_factor(uint8_t sf, float g);
int64_t qm_nvfp4_offset(int64_t t, int64_t b, int32_t H);

/* values and scales of T rows of normalized ([T, H] BF16), into arrays laid
 * out as q says (q->values, q->scales and q->block_scales are not used):
 * vals [T, H] (4-bit values, NVFP4: [T, H / 2], two codes a byte, the even
 * element low), scales the FP32 scales as q's kind, flags and scale_ld
 * place them, or for a block-scaled form (qm_block) the block scales, bytes,
 * each at qm_block_offset of its row t of the T given (the global row in a
 * gather): hence void *. Nothing else of the two arrays is written
 * (column-major padding and the rows past T of the last 128-row tile of
 * block scales included). */
void qm_quant(const beam_quant *q, const uint16_t *nrm, int64_t T, int32_t H, uint8_t *vals, void *scales);

/* The forms the tests run, for T rows (values, scales and scale_ld's
 * arrays are the caller's): group 128 row-major, group 64 UE8M0
 * column-major with DeepGEMM's scale_ld (T rounded up to 4: rows T.. of
 * each column are padding), token, token UE8M0, tensor (scale 0.0125);
 * then the block-scaled ones: NVFP4 with the global scales 672 (448 * 6 /
 * 4: the usual one for rows whose largest magnitude is about 4) and 1,
 * MXFP8. The forms with FP32 scales (or none) are the first QM_NFP8_FORMS,
 * the block-scaled ones the rest. */
#define QM_NFP8_FORMS 5
#define QM_NFORMS 8
void qm_forms(beam_quant *q, int64_t T);

/* The first form of qm_forms(T) of kind into *q: 1, or 0 (q zeroed) when
 * none is of that kind (the benchmarks' form of a kind). */
int qm_form_of(beam_quant *q, int kind, int64_t T);

/* What q's kind is, from the model's table (an unknown kind: name "?", the
 * rest 0, or 8 bits):
 * qm_name     the format, as docs/numerics.md's sections name it: "fp8"
 *             (GROUP, TOKEN, TENSOR), "nvfp4", "mxfp8"
 * qm_bits     bits of a value (8; NVFP4 4)
 * qm_block    values per block scale, a byte in the 128 x 4 tiled layout
 *             of include/beammoe.h (NVFP4 16, MXFP8 32); 0: FP32 scales or
 *             none
 * qm_group    values per scale for rows of H: group_size (GROUP), H
 *             (TOKEN, TENSOR) or qm_block
 * qm_pow2     whether its scales are always powers of two (BEAM_QUANT_UE8M0,
 *             MXFP8)
 * qm_global   whether q->scale is a global scale of block scales (NVFP4)
 * qm_label    a short name of the form, no spaces: "group128",
 *             "group64-ue8m0-col", "token-ue8m0", "tensor", "nvfp4-g672",
 *             "mxfp8" */
const char *qm_name(const beam_quant *q);
int qm_bits(const beam_quant *q);
int qm_block(const beam_quant *q);
int qm_group(const beam_quant *q, int32_t H);
int qm_pow2(const beam_quant *q);
int qm_global(const beam_quant *q);
void qm_label(const beam_quant *q, char *buf, size_t n);

/* The bytes of q's values for T rows of H: T * H * qm_bits / 8. */
size_t qm_values_bytes(const beam_quant *q, int64_t T, int32_t H);

/* A block-scaled form's block scales for T rows of H: the bytes of the
 * array (whole tiles of 128 rows, the rows past T included), and the byte
 * of row t's block b in it; 0 for the other forms. */
size_t qm_block_bytes(const beam_quant *q, int64_t T, int32_t H);
int64_t qm_block_offset(const beam_quant *q, int64_t t, int64_t b, int32_t H);

/* The floats a scales array of q's form spans for T rows of H (column-major:
 * every column of scale_ld, padding included; TENSOR: 0; a block-scaled
 * form: qm_block_bytes / 4, whole tiles of 128 rows). */
size_t qm_scale_floats(const beam_quant *q, int64_t T, int32_t H);

/* Points q at a caller's arrays as its kind takes them: values; scales
 * (GROUP, TOKEN), block_scales (a block-scaled form: the bytes of the float
 * array) or neither (TENSOR). */
void qm_bind(beam_quant *q, uint8_t *values, float *scales);

#endif
