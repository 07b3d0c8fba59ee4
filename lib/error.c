/*
 * error.c - the thread-local error message, the status strings and the
 * version: beam_status_string, beam_last_error and beam_version, the public
 * calls that every library (backend or dispatcher) answers the same way.
 *
 * Each library has its own copy; the dispatcher copies a backend's message
 * into its own after a failed forwarded call.
 */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>

#include "error.h"

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define BM_THREAD_LOCAL _Thread_local
#else
#define BM_THREAD_LOCAL __thread /* GCC, Clang, ICC: C99 has no keyword */
#endif

#define BM_MSG_LEN 512

static BM_THREAD_LOCAL char bm_msg[BM_MSG_LEN];

beam_status bm_fail(beam_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(bm_msg, sizeof bm_msg, fmt, ap);
    va_end(ap);
    return status;
}

void bm_clear_error(void)
{
    bm_msg[0] = '\0';
}

const char *bm_last_error(void)
{
    return bm_msg;
}

BEAM_API const char *beam_last_error(void)
{
    return bm_msg;
}

BEAM_API const char *beam_version(void)
{
    return PACKAGE_VERSION;
}

BEAM_API const char *beam_status_string(beam_status status)
{
    switch (status) {
    case BEAM_OK: return "ok";
    case BEAM_ERR_INVALID_ARGUMENT: return "invalid argument";
    case BEAM_ERR_UNSUPPORTED: return "unsupported";
    case BEAM_ERR_DEVICE: return "device error";
    case BEAM_ERR_COMM: return "communication error or timeout";
    case BEAM_ERR_OUT_OF_MEMORY: return "out of memory";
    }
    return "unknown status";
}
