/*
 * launch_shapes.h - the compiled launch shapes of the row kernels, one
 * list per kernel family, and each family's launcher (internal). Each
 * family is a translation unit of its own (launch_row.cu, launch_pipe.cu,
 * launch_nrn.cu), so that `make -j` compiles them side by side; launch.cu
 * picks the shape and calls the family's launcher.
 */
#ifndef BEAMMOE_GPU_LAUNCH_SHAPES_H
#define BEAMMOE_GPU_LAUNCH_SHAPES_H

#include "launch.h"

/* Every row-kernel shape (NT, J, U, CS) instantiated, each in a vector and a
 * scalar version: the shapes bm_pick_shape returns (decode: one chunk per
 * thread, clusters of 1 to 8; prefill with hidden <= 4096) and the
 * row-kernel twins of the pipelined and nrn shapes (bases not 16-byte
 * aligned). Compiled into bench/shape_sweep, beside these: the candidates
 * it times against them (bench/sweep_launch.cu, BM_SWEEP_*). */
#ifndef BM_SWEEP_SHAPES
#define BM_SWEEP_SHAPES(X)
#define BM_SWEEP_PIPES(X)
#define BM_SWEEP_NRNS(X)
#endif
#define BM_SHAPES(X)                                                          \
    X(32, 1, 8, 1) X(64, 1, 8, 1) X(128, 1, 8, 1) X(256, 1, 8, 1)              \
    X(64, 1, 8, 2) X(64, 1, 8, 4) X(64, 1, 8, 8) X(128, 1, 8, 2)               \
    X(128, 1, 8, 4) X(128, 1, 8, 8) X(256, 1, 8, 2) X(256, 1, 8, 4)            \
    X(512, 1, 8, 2)                                                            \
    X(128, 2, 4, 1) X(256, 2, 4, 1) X(256, 4, 2, 1) X(512, 2, 2, 1)            \
    X(128, 4, 2, 1) BM_SWEEP_SHAPES(X)

/* Pipelined shapes (NT, J, D, MB): prefill, vector path; MB resident blocks
 * per multiprocessor asked of the compiler (__launch_bounds__), 1: none. */
#define BM_PIPES(X)                                                           \
    X(256, 4, 2, 1) X(256, 4, 3, 1) X(256, 4, 4, 1) X(512, 2, 3, 1)            \
    X(512, 2, 4, 3) X(128, 4, 4, 1) X(256, 2, 4, 1) X(128, 2, 4, 1)            \
    X(128, 2, 4, 8) BM_SWEEP_PIPES(X)

/* norm_residual_norm's prefill shapes (NT, J, MB, HINT, PK, PF): MB
 * resident blocks per multiprocessor asked of the compiler; HINT the L2
 * policy of the row loads; PK 1: the row held as packed BF16 bits; PF 1:
 * the block's next row of the grid-stride loop requested into L2 at the
 * row's start (none with a grid of one block per row: nrn_kernel.cuh). */
#define BM_NRNS(X)                                                            \
    X(512, 2, 2, 2, 0, 0) X(256, 2, 4, 1, 0, 0) X(128, 2, 8, 1, 0, 0)          \
    X(128, 2, 8, 2, 0, 0) X(128, 8, 4, 2, 1, 0) X(128, 4, 8, 1, 1, 0)          \
    X(128, 8, 4, 1, 1, 1) BM_SWEEP_NRNS(X)

/* Multiprocessors of the current device (launch.cu), asked once per device. */
int bm_device_sms(void);

/* Each family's launch of shape s (cudaErrorInvalidConfiguration: not one
 * of its compiled shapes) with the kernels of the call's form, and the
 * loading of every kernel of the family (bm_preload_rows). */
cudaError_t bm_launch_nrn_family(const bm_row_params_q &pq, bm_shape s, unsigned blocks, cudaStream_t stream);
cudaError_t bm_launch_pipe_family(const bm_row_params_q &pq, bm_shape s, cudaStream_t stream);
cudaError_t bm_launch_row_family(const bm_row_params_q &pq, bm_shape s, unsigned blocks, int vec,
                                 cudaStream_t stream);
/* The body of a family's preload: bm_preload of every kernel that ONE(shape)
 * names, for each shape of LIST, through `pre` (one error kept). */
#define BM_PRELOAD_FAMILY(LIST, ONE)                            \
    cudaError_t e = cudaSuccess;                                \
    auto pre = [&](auto kernel) { bm_preload(e, kernel); };     \
    LIST(ONE)                                                   \
    return e;
cudaError_t bm_preload_nrn(void);
cudaError_t bm_preload_pipe(void);
cudaError_t bm_preload_row(void);

#endif
