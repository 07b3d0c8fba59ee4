/*
 * error.h - status values and the thread-local error message (internal).
 *
 * Every failing path calls bm_fail(), which formats "function: argument ...
 * rule" into a per-thread buffer and returns the status, so a check reads
 *     if (top_k < 1) return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: top_k=%d ...", fn, top_k);
 * Modelled on NCCL's CHECK macros: BM_CHECK propagates a non-OK status.
 */
#ifndef BEAMMOE_LIB_ERROR_H
#define BEAMMOE_LIB_ERROR_H

#include "beammoe.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define BM_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define BM_PRINTF(a, b)
#endif

/* Set the calling thread's message and return status. */
beam_status bm_fail(beam_status status, const char *fmt, ...) BM_PRINTF(2, 3);
/* Clear the calling thread's message (start of every public call). */
void bm_clear_error(void);
/* The calling thread's message, "" when none (beam_last_error, for a
 * caller inside the library: exported names are never called from within). */
const char *bm_last_error(void);

#define BM_CHECK(call)                               \
    do {                                             \
        beam_status bm_check_st_ = (call);           \
        if (bm_check_st_ != BEAM_OK) return bm_check_st_; \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
