/*
 * streams.c - the tool's standard streams, checked when it starts and when
 * it ends: a report that never reached its reader (stdout on a full disk, a
 * closed stdout) fails the run, exit status 1, with a message on stderr.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

/* Descriptor fd is open. */
static int fd_open(int fd)
{
    return fcntl(fd, F_GETFD) != -1 || errno != EBADF;
}

int tool_streams_open(void)
{
    int fd, stdout_closed = 0;
    /* A closed 0, 1 or 2 gets /dev/null, in that order (open returns the
     * lowest free descriptor), so no file the tool opens later takes its
     * number: run --output's temporary file as descriptor 1 would receive
     * the report, as descriptor 2 the messages. */
    for (fd = 0; fd <= 2; fd++) {
        if (fd_open(fd)) continue;
        if (fd == 1) stdout_closed = 1;
        if (open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY) != fd) return -1;
    }
    /* A closed stdout cannot carry the report: refuse before doing
     * anything (a closed stderr only means no messages are wanted). */
    if (stdout_closed) {
        fprintf(stderr, "beammoe: write error on the standard output: %s (it is closed); "
                        "nothing was done\n", strerror(EBADF));
        return -1;
    }
    return 0;
}

int tool_streams_close(int rc)
{
    int e = 0, failed = 0;
    /* what is still buffered, then what an earlier write left (ferror:
     * its errno is gone), then the close itself */
    if (fflush(stdout) != 0) {
        e = errno;
        failed = 1;
    } else if (ferror(stdout)) {
        failed = 1;
    }
    if (fclose(stdout) != 0 && !failed) {
        e = errno;
        failed = 1;
    }
    if (!failed) return rc;
    if (e)
        fprintf(stderr, "beammoe: write error on the standard output: %s\n", strerror(e));
    else
        fprintf(stderr, "beammoe: write error on the standard output (an earlier write failed)\n");
    /* a usage error (2) or a failed run (1) keeps its own status */
    return rc == TOOL_EXIT_OK ? TOOL_EXIT_FAIL : rc;
}
