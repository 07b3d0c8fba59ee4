/*
 * params.cuh - the parameter block of every kernel (internal, C++): the
 * row kernels (row_kernel.cuh, pipe_kernel.cuh, nrn_kernel.cuh) take
 * bm_row_params, the gather's (gather_fused.cu) bm_tp_params, which is
 * bm_row_params and the gather's own fields (gather_impl.h); both are
 * filled from a checked call by bm_params_of. A kernel compiled with the
 * quantized output of normalized (its template argument Q) takes the block
 * with lib/backend.h's bm_quant appended (bm_kparams).
 */
#ifndef BEAMMOE_GPU_PARAMS_CUH
#define BEAMMOE_GPU_PARAMS_CUH

#include <stdint.h>

#include <type_traits>

#include "backend.h" /* bm_args, bm_quant; beammoe.h: BEAM_QUANT_* */

/* Arguments of one launch (passed by value). */
struct bm_row_params {
    /* stage A: finalize when experts != NULL, else the rows of x */
    const uint16_t *experts; /* [rows, top_k, hidden] */
    const float *weights;    /* [rows, top_k] */
    int32_t top_k;
    float routed_scale;
    const uint16_t *x;       /* [rows, hidden]; may alias out/normalized */

    int normA;               /* post-norm (finalize) or pre-norm */
    const uint16_t *wA;
    float epsA;

    /* stage B, when residual != NULL */
    const uint16_t *residual; /* may equal out */
    int has_scales;
    float scale_x, scale_r;
    int normB;
    const uint16_t *wB;
    float epsB;

    uint16_t *out;        /* finalize output, or hidden */
    uint16_t *normalized; /* written when normB (with a quantized output:
                           * when not NULL) */

    int64_t rows;         /* the gather: the call's tokens T */
    int32_t hidden;
};

/* The parts of a checked call that bm_params_of takes: stage A as
 * finalize (experts, weights, routed scale, post-norm; out: output), stage
 * A as the rows of x with the pre-norm, stage B (scales, residual, next
 * norm; out: hidden_out, normalized). Rows and hidden always. */
enum { BM_PART_FIN = 1, BM_PART_X = 2, BM_PART_RES = 4 };
bm_row_params bm_params_of(const bm_args *a, unsigned parts);

/* The quantized output of normalized (norm B) is bm_quant (bm_args.q as
 * checked). Only the kernels compiled with it take it, in
 * bm_row_params_q: a larger parameter block changed how the compiler laid
 * out the plain kernels [2026-12-04-constants: params]. */
struct bm_row_params_q : bm_row_params {
    bm_quant q;
};

/* Which quantized output a kernel is compiled with (its template argument
 * Q): none, or a BM_QF line of lib/quant_forms.def (FP8, NVFP4, MXFP8).
 * Each its own kernels: a kernel holds registers only for the code it can
 * run [2026-12-04-constants: forms]. bm_qf_of: the form of a kind
 * (0 or BEAM_QUANT_*), bm_value_bits its values' width, both read from
 * that list. */
enum {
    BM_QF_NONE,
#define BM_QF(qf, shapes) BM_QF_##qf,
#include "quant_forms.def"
    BM_QF_COUNT
};
constexpr int bm_qf_of(int kind)
{
#define BM_FORM(k, qf, bits, group, scale, blocks) kind == k ? BM_QF_##qf:
    return
#include "quant_forms.def"
        BM_QF_NONE;
}
/* the qf whose rows of gpu/shapes.def the kernels of qf take */
constexpr int bm_shape_form(int qf)
{
#define BM_QF(q, shapes) qf == BM_QF_##q ? BM_QF_##shapes:
    return
#include "quant_forms.def"
        qf;
}
constexpr int bm_value_bits(int kind)
{
#define BM_FORM(k, qf, bits, group, scale, blocks) kind == k ? bits:
    return
#include "quant_forms.def"
        8;
}
/* whether q's values take the vector stores: a chunk's eight values, 8
 * bytes (NVFP4: 4) */
inline bool bm_quant_vec_ok(const bm_quant &q)
{
    return ((uintptr_t)q.values & (uintptr_t)(bm_value_bits(q.kind) - 1)) == 0;
}

/* The parameter block of a kernel compiled with (Q) or without the
 * quantized output: Plain, or WithQ (Plain and a bm_quant q). */
template <class Plain, class WithQ, int Q>
struct bm_params_for {
    typedef WithQ type;
};
template <class Plain, class WithQ>
struct bm_params_for<Plain, WithQ, BM_QF_NONE> {
    typedef Plain type;
};
template <int Q>
struct bm_kparams : bm_params_for<bm_row_params, bm_row_params_q, Q> {
};

/* The dispatch by form: f(bm_qf_t<Q>()) with Q the kernels of kind (0:
 * none), a switch over lib/quant_forms.def's BM_QF lines, so that every
 * form's kernels are instantiated wherever a family dispatches; f's
 * parameter block is bm_kp<Q>(plain, with_q). bm_each_form: f for every
 * Q, none first (a family's preload). */
template <int Q>
using bm_qf_t = std::integral_constant<int, Q>;
template <class F>
inline auto bm_with_form(int kind, F &&f) -> decltype(f(bm_qf_t<BM_QF_NONE>()))
{
    switch (bm_qf_of(kind)) {
#define BM_QF(qf, shapes) \
    case BM_QF_##qf: return f(bm_qf_t<BM_QF_##qf>());
#include "quant_forms.def"
    }
    return f(bm_qf_t<BM_QF_NONE>());
}
template <class F>
inline void bm_each_form(F &&f)
{
    f(bm_qf_t<BM_QF_NONE>());
#define BM_QF(qf, shapes) f(bm_qf_t<BM_QF_##qf>());
#include "quant_forms.def"
}
template <int Q, class Plain, class WithQ>
inline const typename bm_params_for<Plain, WithQ, Q>::type &bm_kp(const Plain &p, const WithQ &pq)
{
    if constexpr (Q != BM_QF_NONE)
        return pq;
    else
        return p;
}

#endif
