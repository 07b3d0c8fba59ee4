/*
 * gpu_probe.c - the GPU probe of the GPU tests and benches (gpu_probe.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* fork, pipe, waitpid under -std=c99 */
#endif

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "beammoe.h"
#include "gpu_probe.h"

/* What the child hands back through the pipe. */
typedef struct probe_answer {
    int count;
    char why[256];
} probe_answer;

static void probe_child(int fd)
{
    probe_answer a;
    cudaError_t e;
    memset(&a, 0, sizeof a);
    e = cudaGetDeviceCount(&a.count);
    if (e != cudaSuccess) {
        snprintf(a.why, sizeof a.why, "no CUDA device is usable (cudaGetDeviceCount: %s)", cudaGetErrorString(e));
        a.count = 0;
    } else if (a.count < 1) {
        snprintf(a.why, sizeof a.why, "no CUDA device is visible (device count is 0)");
        a.count = 0;
    } else if (beam_set_backend("cuda") != BEAM_OK) {
        /* the backend's own rule of a usable device, not a copy of it */
        snprintf(a.why, sizeof a.why, "%d device(s), but %s", a.count, beam_last_error());
        a.count = 0;
    } else {
        snprintf(a.why, sizeof a.why, "%d usable device(s)", a.count);
    }
    /* _exit: the child leaves stdio buffers and CUDA teardown to the parent */
    if (write(fd, &a, sizeof a) != (ssize_t)sizeof a) _exit(1);
    _exit(0);
}

int bm_gpu_probe(char *why, size_t n)
{
    probe_answer a;
    int fd[2], status = 0;
    ssize_t got;
    pid_t p;
    if (n) why[0] = '\0';
    if (pipe(fd) != 0) {
        snprintf(why, n, "GPU probe: pipe: %s", strerror(errno));
        return 0;
    }
    p = fork();
    if (p == 0) {
        close(fd[0]);
        probe_child(fd[1]);
    }
    close(fd[1]);
    if (p < 0) {
        snprintf(why, n, "GPU probe: fork: %s", strerror(errno));
        close(fd[0]);
        return 0;
    }
    do
        got = read(fd[0], &a, sizeof a);
    while (got < 0 && errno == EINTR);
    close(fd[0]);
    while (waitpid(p, &status, 0) < 0 && errno == EINTR) {
    }
    if (got != (ssize_t)sizeof a) {
        snprintf(why, n, "GPU probe: the probing process ended without an answer (status 0x%x)", status);
        return 0;
    }
    a.why[sizeof a.why - 1] = '\0';
    snprintf(why, n, "%s", a.why);
    return a.count > 0 ? a.count : 0;
}
