/*
 * graph_calls.h - how many calls one cold graph of bench/cuda_bench and
 * bench/shape_sweep perf makes (C and CUDA C++; internal to the
 * benchmarks).
 *
 * Every buffer set once, and more calls (up to 20, cycling through the
 * sets) while the graph's bytes would take under half a millisecond at
 * the copy bandwidth. Below that the graph's own launch latency (one per
 * replay, on the GPU's clock between the two events) showed in the time
 * per call: a graph of the two sets of T = 4096 (H = 2048 or 7168, one
 * H200) timed each call 1.2-1.5 us slower than one of twenty calls. Longer
 * graphs gain nothing, and twenty calls of T = 16384 timed some
 * configurations 10-18% slower, erratically.
 */
#ifndef BEAMMOE_BENCH_GRAPH_CALLS_H
#define BEAMMOE_BENCH_GRAPH_CALLS_H

#include <stddef.h>

/* nsets buffer sets, bytes moved per call, copy bandwidth in GB/s */
static inline size_t bm_graph_calls(size_t nsets, double bytes, double copy_gbs)
{
    const double floor_us = bytes / copy_gbs / 1e3;
    size_t n = nsets;
    while (n < 20 && (double)n * floor_us < 500.0)
        n++;
    return n;
}

#endif
