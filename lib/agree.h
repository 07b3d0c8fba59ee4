/*
 * agree.h - the arguments every rank of a gather must pass alike
 * (docs/contract.md#collective), written once (internal): each one word of
 * a call's agreement, with the name an error message gives it. The CPU
 * group compares the words rank by rank (cpu/group.c); the CUDA backend
 * hashes them into the signature its kernels compare (bm_tp_signature).
 *
 * beam_gather_agreement (include/beammoe.h) gives the words of a call's
 * public arguments, for a gather over another transport.
 *
 * A part that does not apply is one fixed word: a norm's eps without the
 * norm, the scales without scales, the quantized form's scale where its
 * kind has none.
 */
#ifndef BEAMMOE_LIB_AGREE_H
#define BEAMMOE_LIB_AGREE_H

#include <stdint.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The words, in order. */
enum {
    BM_AGREE_TOKENS,
    BM_AGREE_TOP_K,
    BM_AGREE_HIDDEN,
    BM_AGREE_STRATEGY,
    BM_AGREE_ROUTED_SCALE,
    BM_AGREE_SCALES,
    BM_AGREE_POST_NORM,
    BM_AGREE_NEXT_NORM,
    BM_AGREE_QUANT,
    BM_AGREE_N
};
typedef char bm_agree_n_is_public[BM_AGREE_N == BEAM_AGREEMENT_WORDS ? 1 : -1];

/* The names of the words, in order. */
extern const char *const bm_agree_names[BM_AGREE_N];

/* The collective a call makes, in the strategy word's second byte: a
 * gather never meets an all-reduce. */
enum { BM_COLL_GATHER = 0, BM_COLL_ALLREDUCE = 1 };
#define bm_agree_coll(strategy, coll) ((int)(strategy) | (coll) << 8)

/* The agreement of a checked call with strategy (after AUTO's choice, and
 * bm_agree_coll for an all-reduce). */
void bm_agree_words(const bm_args *a, int strategy, uint64_t words[BM_AGREE_N]);

/* Word i's argument as call a names it: its name, but the dense
 * all-reduce's norm of the reduced rows is its pre_norm. */
const char *bm_agree_arg(int i, const bm_args *a);

/* Word i's name, and its value in text (beam_gather_agreement_text). */
const char *bm_agree_text(int i, uint64_t w, char *text, size_t size);

#ifdef __cplusplus
}
#endif

#endif
