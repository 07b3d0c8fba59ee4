/*
 * ops.h - the CPU backend's local operations over all rows of a bm_args
 * (cpu/run.c), used by the table (backend_cpu.c) and the group gather
 * (group.c).
 *
 * The row kernels work in per-thread scratch from the heap (never on the
 * stack: a library runs on its callers' threads, whose stacks may be
 * small). It is allocated before anything is written, so an allocation
 * failure is BEAM_ERR_OUT_OF_MEMORY with every output untouched.
 */
#ifndef BEAMMOE_CPU_OPS_H
#define BEAMMOE_CPU_OPS_H

#include "backend.h"
#include "rows.h" /* BM_OP_* */

/* Scratch of one call: `slots` areas of `stride` bytes, 64-byte aligned. */
typedef struct bm_scratch {
    void *raw;
    unsigned char *mem;
    size_t stride;
    int slots;
} bm_scratch;

/* The number of threads a call of op (BM_OP_*) over a's rows runs on: 1
 * (the calling thread alone, no OpenMP team) when the work is too small to
 * share, else at most the OpenMP thread count. */
int bm_cpu_team(const bm_args *a, int op);
/* The most threads any call may use (the scratch of a gather). */
int bm_cpu_max_team(void);
/* The rule of both: rows of row_bytes each (read and written) over
 * per_thread bytes a thread, at most rows and bm_cpu_max_team(); 1 below
 * two. */
int bm_cpu_team_of(int64_t rows, int64_t row_bytes, int64_t per_thread);
/* The consecutive rows a team's threads take at a time: a quarter of each
 * thread's share, 1 .. BM_CPU_CHUNK (run.c says why). */
int64_t bm_cpu_chunk(int64_t rows, int team);

/* Scratch for `slots` threads of rows `hidden` wide; fn names the public
 * function in the message when there is no memory. */
beam_status bm_cpu_scratch_alloc(bm_scratch *s, int slots, int32_t hidden, const char *fn);
void bm_cpu_scratch_free(bm_scratch *s);

/* Every row of op over a, on at most s->slots threads; cannot fail. */
void bm_cpu_run(const bm_args *a, int op, const bm_scratch *s);

/* a->q's quantized output from the [tokens, hidden] BF16 rows of
 * normalized (cpu/quant.c); cannot fail. */
void bm_cpu_quant_rows(const bm_args *a, const uint16_t *normalized);

/* b = *a, and when a asks for the quantized form only (a->q.kind with no
 * normalized) a [tokens, hidden] normalized of the call's own in
 * b->normalized, to be freed with free(*tmp) (NULL otherwise). Out of
 * memory: an error naming a->fn, nothing allocated. */
beam_status bm_cpu_quant_target(const bm_args *a, bm_args *b, uint16_t **tmp);

#endif
