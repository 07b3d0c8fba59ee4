/*
 * checks.c - the one failure action of the check macros (checks.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* write, _exit under -std=c99 */
#endif

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "checks.h"

void bm_check_failed(int rank, const char *file, int line, const char *fmt, ...)
{
    char msg[2048];
    size_t n = 0;
    int k;
    va_list ap;
    if (rank >= 0) {
        k = snprintf(msg, sizeof msg, "rank %d: ", rank);
        n = k > 0 ? (size_t)k : 0;
    }
    k = snprintf(msg + n, sizeof msg - n, "%s:%d: ", file, line);
    n += k > 0 ? (size_t)k : 0;
    if (n < sizeof msg) {
        va_start(ap, fmt);
        k = vsnprintf(msg + n, sizeof msg - n, fmt, ap);
        va_end(ap);
        n += k > 0 ? (size_t)k : 0;
    }
    /* a message cut at the buffer still ends its line */
    if (n > sizeof msg - 2) n = sizeof msg - 2;
    msg[n++] = '\n';
    /* What the program printed so far comes out first: _exit below skips
     * stdio. One write for the line, so that ranks failing at once do not
     * interleave their messages. */
    fflush(stdout);
    if (write(2, msg, n) < 0) _exit(1);
    /* _exit, not exit: a rank is a forked process or a thread beside other
     * ranks, where exit's handlers would tear down the CUDA runtime and
     * NCCL under peers that may still wait in a kernel or a collective. */
    _exit(1);
}
