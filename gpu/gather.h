/*
 * gather.h - the tensor-parallel finalize_gather_norm_residual_norm and
 * all-reduce of the CUDA backend over NCCL (internal). The backend table
 * (gpu/backend_cuda.cu) points at these functions; lib/api.c has checked every argument
 * before.
 *
 * A workspace is made collectively from the caller's ncclComm_t. On one host
 * (every rank's device reachable through CUDA IPC) it holds peer-visible
 * buffers and flags for the fused ONESHOT and TWOSHOT strategies; otherwise
 * (ranks on several hosts) only UNFUSED is available, AUTO's thresholds are
 * set to 0 so that it always picks UNFUSED, and ONESHOT/TWOSHOT return
 * BEAM_ERR_UNSUPPORTED.
 */
#ifndef BEAMMOE_GPU_GATHER_H
#define BEAMMOE_GPU_GATHER_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Thresholds measured on two H200s over NVLink (docs/PERF.md) and the
 * timeout of a rank waiting for its peers. */
beam_workspace_config bm_cuda_ws_default(void);

/* Collective over comm (an ncclComm_t); the current device must be the
 * communicator's. ws->max_tokens, hidden and cfg are set by lib; this fills
 * ws->rank, nranks and impl. local_status != BEAM_OK (lib's checks failed):
 * this rank still takes part in the exchange, so every rank fails. Ranks
 * that pass different max_tokens, hidden or cfg all fail. */
beam_status bm_cuda_ws_create_nccl(void *comm, bm_ws *ws, beam_status local_status);

/* In-process groups (gather_group.cu): each rank a thread of this process,
 * on the device current on its thread when it makes its workspace; ranks
 * may share a device. */
beam_status bm_cuda_group_create(int32_t nranks, beam_cpu_group **group);
beam_status bm_cuda_group_destroy(beam_cpu_group *group);
beam_status bm_cuda_ws_create_group(beam_cpu_group *group, int32_t rank, bm_ws *ws, beam_status local_status);

/* Collective (device sync, barrier over the communicator, which must still
 * be alive); NULL impl is a no-op. Returns BEAM_ERR_COMM when a call on the
 * workspace failed on the device (a wait for a peer timed out, or a peer
 * rejected its arguments): such a failure is sticky, every later call on
 * the workspace returns it too. */
beam_status bm_cuda_ws_destroy(bm_ws *ws);

/* One collective call; strategy is never AUTO. Calls on one workspace
 * must be stream-ordered (one stream, or events between streams), like
 * NCCL calls on one communicator. */
beam_status bm_cuda_gather(bm_ws *ws, const bm_args *a, beam_strategy strategy,
                           beam_status local_status);
/* The all-reduce (docs/numerics.md#all-reduce) on the same workspace, with
 * the same rules. */
beam_status bm_cuda_allreduce(bm_ws *ws, const bm_args *a, beam_strategy strategy,
                              beam_status local_status);

#ifdef __cplusplus
}
#endif

#endif
