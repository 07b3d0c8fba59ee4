/*
 * gpu_probe.h - how many GPUs the GPU tests and benches can use here,
 * asked without touching CUDA in the calling process.
 */
#ifndef BEAMMOE_HARNESS_GPU_PROBE_H
#define BEAMMOE_HARNESS_GPU_PROBE_H

#include <stddef.h>

/* The number of CUDA devices visible here when the cuda backend can run
 * on them (beam_set_backend("cuda") succeeds: a device, a recent enough
 * driver, compute capability 9.0 or newer), else 0; why (n bytes) says
 * what was found, for the caller's "skipped" line.
 *
 * Asked in a child process, so the caller stays free of CUDA: a process
 * that forks ranks afterwards must not have initialized the runtime (a
 * child cannot use its parent's CUDA state). The caller links the beam
 * library it uses (the dispatcher or libbeammoe_cuda) and the runtime. */
int bm_gpu_probe(char *why, size_t n);

#endif
