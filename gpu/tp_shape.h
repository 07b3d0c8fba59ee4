/*
 * tp_shape.h - the cluster size of decode launches and the layout of the
 * launch caps (internal): plain C, so that gpu/gather_fused.cu (the
 * gather), gpu/launch.cu (the single-device rows) and the all-reduce use
 * them and tests/test_tp_shape.c checks them on any host.
 *
 * At decode sizes (few rows per rank) a row is spread over a cluster of up
 * to 8 blocks, so that its loads come from several multiprocessors, while
 * the grid (rows times cluster size) stays within one wave of the device;
 * at least 64 threads per block; one block per row when the quantized
 * output keeps one scale per token (its maximum is over the whole row).
 *
 * sms is the workspace's multiprocessor count, the fewest of any rank's
 * device (agreed at creation), so that every rank of a workspace picks the
 * same shape from the same (rows, hidden): the ranks' blocks exchange data
 * by shape.
 */
#ifndef BEAMMOE_GPU_TP_SHAPE_H
#define BEAMMOE_GPU_TP_SHAPE_H

#include <stdint.h>

/* Blocks per row: the largest power of two up to `most` whose grid (rows
 * times it) fits `room` blocks and leaves each block at least 64 threads,
 * for n2 threads' worth of chunks per row (a power of two, hidden / 8
 * rounded up); 1 at the least. */
static inline int bm_cluster_size(int most, int64_t rows, int n2, int64_t room)
{
    int cs = most;
    while (cs > 1 && (rows * cs > room || n2 / cs < 64))
        cs /= 2;
    return cs;
}

/* The gather's: up to 8 blocks per row of a rank within one wave of sms
 * multiprocessors; one when token_scale (the quantized output has a scale
 * per token). */
static inline int bm_tp_cluster_size(int64_t rows, int n2, int token_scale, int sms)
{
    return token_scale ? 1 : bm_cluster_size(8, rows, n2, sms);
}

/* The launch caps (bm_tp_ws.gcap, 4 ns + 1 of them for ns launch shapes):
 * [0, ns) the gather's kernels of each shape, [ns] the in-process
 * all-gather kernel, [ns + 1 + i] the gather's kernels of shape i compiled
 * with the quantized output (more registers: their own cap), then the
 * all-reduce's kernels likewise, [2 ns + 1 + i] without and [3 ns + 1 + i]
 * with it (their own caps, so that neither family's grids depend on the
 * other's registers). */
static inline int bm_tp_cap_index(int ns, int shape, int q, int ar)
{
    return ar ? 2 * ns + 1 + (q ? ns : 0) + shape : q ? ns + 1 + shape : shape;
}

/* Its inverse: the shape of cap `index` (ns: the all-gather kernel's), and
 * whether its kernels have the quantized output (*q) and are the
 * all-reduce's (*ar). A search of bm_tp_cap_index, so that the layout is
 * written once (a second formula for it once read the all-reduce's caps
 * from other shapes' entries); asked only when a workspace is created. */
static inline int bm_tp_cap_shape(int ns, int index, int *q, int *ar)
{
    int shape;
    for (*ar = 0; *ar < 2; ++*ar)
        for (*q = 0; *q < 2; ++*q)
            for (shape = 0; shape < ns; ++shape)
                if (bm_tp_cap_index(ns, shape, *q, *ar) == index)
                    return shape;
    *q = *ar = 0;
    return ns;
}

#endif
