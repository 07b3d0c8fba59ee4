/*
 * ops.h - the CPU backend's local operations over all rows of a bm_args,
 * shared by the table (backend_cpu.c) and the group gather (group.c).
 */
#ifndef BEAMMOE_CPU_OPS_H
#define BEAMMOE_CPU_OPS_H

#include "backend.h"

beam_status bm_cpu_finalize(const bm_args *a);
beam_status bm_cpu_norm_residual_norm(const bm_args *a);
beam_status bm_cpu_fused(const bm_args *a);

#endif
