/*
 * checks.h - the check macros of the GPU test and bench programs, defined
 * once: a CUDA runtime call (CK), an NCCL call (NK), a beam_* call (BK),
 * and a failure the program finds itself (FAIL). Each failure reports the
 * file and line, the call as written and what it returned, then ends the
 * process (bm_check_failed, checks.c), so a setup reads as its steps:
 *
 *     CK(cudaSetDevice(rank));
 *     NK(ncclCommInitRank(&comm, R, id, rank));
 *     BK(beam_workspace_create_nccl(comm, T, H, NULL, &ws));
 *
 * The macros name cudaError_t, ncclResult_t and beam_status only where
 * they expand, so this header includes none of cuda_runtime.h, nccl.h or
 * beammoe.h: the file that uses CK includes cuda_runtime.h, and so on.
 *
 * A program whose ranks share its code defines BM_CHECK_RANK, an int
 * expression for the calling thread's rank, before it includes this
 * header: its failures then start with "rank R: ", so a line says which
 * rank failed. Without it no rank is printed.
 *
 * The libraries never use these: a library returns its status (BM_CHECK,
 * lib/error.h), where a test or a bench has nothing better to do with a
 * failure than to stop with a message.
 */
#ifndef BEAMMOE_HARNESS_CHECKS_H
#define BEAMMOE_HARNESS_CHECKS_H

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define BM_CHECK_NORETURN __attribute__((noreturn, format(printf, 4, 5)))
#else
#define BM_CHECK_NORETURN
#endif

/* Print "rank R: file:line: " (no rank when rank < 0) and the message on
 * standard error in one write, then end the process with status 1. */
void bm_check_failed(int rank, const char *file, int line, const char *fmt, ...) BM_CHECK_NORETURN;

#ifdef __cplusplus
}
#endif

#ifndef BM_CHECK_RANK
#define BM_CHECK_RANK (-1)
#endif

#define FAIL(...) bm_check_failed(BM_CHECK_RANK, __FILE__, __LINE__, __VA_ARGS__)

#define CK(x)                                                                \
    do {                                                                     \
        cudaError_t ck_e_ = (x);                                             \
        if (ck_e_ != cudaSuccess) FAIL("%s: %s", #x, cudaGetErrorString(ck_e_)); \
    } while (0)

#define NK(x)                                                                \
    do {                                                                     \
        ncclResult_t nk_r_ = (x);                                            \
        if (nk_r_ != ncclSuccess) FAIL("%s: %s", #x, ncclGetErrorString(nk_r_)); \
    } while (0)

#define BK(x)                                                                \
    do {                                                                     \
        beam_status bk_s_ = (x);                                             \
        if (bk_s_ != BEAM_OK)                                                \
            FAIL("%s: %s (%s)", #x, beam_status_string(bk_s_), beam_last_error()); \
    } while (0)

#endif
