/*
 * launch.h - choosing and launching the row kernel (internal, C++).
 *
 * A launch shape is (NT threads per block, J chunks per thread, U expert
 * slots loaded ahead, CS blocks of a cluster per row, PDL or not). bm_pick_shape chooses one per call from the row count
 * and the hidden size only (no device query): decode sizes get one chunk per
 * thread and wide blocks (latency: every load of a row in flight at once),
 * prefill sizes get narrower blocks with several chunks per thread
 * (bandwidth: more rows resident per multiprocessor). Decode launches use
 * programmatic dependent launch, so that their start overlaps the tail of
 * the preceding kernel (the kernel waits for it before reading memory).
 */
#ifndef BEAMMOE_GPU_LAUNCH_H
#define BEAMMOE_GPU_LAUNCH_H

#include <cuda_runtime.h>

#include "pipe_kernel.cuh"
#include "row_kernel.cuh"

struct bm_shape {
    int nt;  /* threads per block: 32 .. 1024, a power of two */
    int j;   /* chunks per thread: 1, 2, 4 or 8; cs * nt * j >= hidden / 8 */
    int u;   /* expert slots loaded ahead: 1, 2, 4 or 8 */
    int cs;  /* blocks per row (a thread block cluster): 1, 2, 4 or 8 */
    int pdl; /* launch with programmatic stream serialization */
    int d;   /* > 0: the pipelined kernel (pipe_kernel.cuh) with d stages
              * (vector path, cs == 1, u unused); 0: the row kernel */
};

/* The shape the library uses for rows x hidden. */
bm_shape bm_pick_shape(int64_t rows, int hidden);

/* 1 when the shape is one of the compiled instantiations and covers hidden. */
int bm_shape_ok(bm_shape s, int hidden);

/* 1 when every BF16 base of p is 16-byte aligned (the vector path). */
int bm_params_vec_ok(const bm_row_params &p);

/* Launch on stream; returns cudaGetLastError() of the launch. rows == 0
 * launches nothing. */
cudaError_t bm_launch_rows(const bm_row_params &p, bm_shape s, int vec,
                           cudaStream_t stream);

#endif
