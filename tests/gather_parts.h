/*
 * gather_parts.h - what the gather test's parts (tests/gather_parts.c)
 * need from a transport driver (tests/test_gather_nccl.c,
 * tests/test_gather_group.c), and the rank their check macros print
 * (harness/checks.h). Ranks may be threads, so the per-rank state is
 * thread-local.
 */
#ifndef BEAMMOE_TESTS_GATHER_PARTS_H
#define BEAMMOE_TESTS_GATHER_PARTS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#include "beammoe.h"

extern __thread int g_rank, g_R, g_dev; /* this rank, the world size, its device */
extern __thread cudaStream_t g_stream;   /* this rank's stream (gp_run_parts) */
extern int g_ndev;                      /* devices visible */
extern int g_threads;                   /* 1: ranks are threads of one process */

/* Make this rank's workspace over the driver's transport (collective). */
typedef beam_status (*gp_make_fn)(int64_t max_tokens, int32_t hidden, const beam_workspace_config *cfg,
                                  beam_workspace **ws);
extern gp_make_fn g_make;
/* Where the transport can make ranks act as on different hosts (NCCL:
 * BEAM_GATHER_HOST per rank, NCCL over its network transport), the maker
 * of such a workspace; NULL elsewhere, and part "hosts" does not run. */
extern gp_make_fn g_make_hosts;

/* Wait until every rank got here (the driver's). */
void host_barrier(void);

/* Run the parts named in only (NULL: all; else one name) on this rank. */
void gp_run_parts(uint64_t seed, int stress, const char *only);

/* Buffers for reading outputs back (per rank, set by gp_run_parts). */
extern __thread uint16_t *g_hbuf, *g_nbuf;

/* Failures name the rank (harness/checks.h: CK, BK, FAIL; the NCCL driver
 * also uses NK). */
#define BM_CHECK_RANK g_rank
#include "checks.h"

#endif
