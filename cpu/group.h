/*
 * group.h - the in-process group of ranks (threads), its gather and its
 * all-reduce.
 */
#ifndef BEAMMOE_CPU_GROUP_H
#define BEAMMOE_CPU_GROUP_H

#include "backend.h"

beam_status bm_cpu_group_create(int32_t nranks, beam_cpu_group **group);
beam_status bm_cpu_group_destroy(beam_cpu_group *group);
beam_status bm_cpu_ws_create(beam_cpu_group *group, int32_t rank, bm_ws *ws, beam_status local_status);
beam_status bm_cpu_ws_destroy(bm_ws *ws);
beam_status bm_cpu_gather(bm_ws *ws, const bm_args *a, beam_strategy strategy, beam_status local_status);
beam_status bm_cpu_allreduce(bm_ws *ws, const bm_args *a, beam_strategy strategy, beam_status local_status);

#endif
