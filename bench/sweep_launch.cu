/*
 * sweep_launch.cu - gpu/launch*.cu compiled with the launch shapes that only
 * bench/shape_sweep times (candidates no row of gpu/shapes.def picks), so
 * that the library carries only the kernels it launches. A shape that
 * gpu/shapes.def comes to pick moves from here to gpu/launch_shapes.h's lists.
 */
#define BM_SWEEP_SHAPES(X) X(512, 1, 4, 1) X(1024, 1, 2, 1)
#define BM_SWEEP_PIPES(X)                                                     \
    X(512, 2, 4, 1) X(512, 2, 3, 3) X(1024, 1, 4, 1) X(1024, 1, 3, 2)          \
    X(256, 2, 4, 6) X(512, 1, 4, 1) X(256, 1, 4, 1) X(256, 1, 4, 8)
#define BM_SWEEP_NRNS(X)                                                      \
    X(512, 2, 2, 0, 0, 0) X(512, 2, 2, 1, 0, 0) X(1024, 1, 2, 1, 0, 0)         \
    X(256, 2, 4, 0, 0, 0) X(256, 2, 4, 2, 0, 0) X(128, 2, 8, 0, 0, 0)          \
    X(256, 1, 8, 1, 0, 0) X(128, 8, 4, 1, 1, 0) X(256, 4, 4, 1, 1, 0)          \
    X(512, 2, 3, 1, 1, 0) X(128, 2, 8, 1, 0, 1) X(256, 2, 4, 1, 0, 1)          \
    X(512, 2, 2, 1, 0, 1) X(128, 4, 8, 1, 1, 1)

#include "../gpu/launch.cu"
#include "../gpu/launch_row.cu"
#include "../gpu/launch_pipe.cu"
#include "../gpu/launch_nrn.cu"
