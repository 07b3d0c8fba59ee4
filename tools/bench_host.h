/*
 * bench_host.h - what `beammoe bench` (bench.c) measures of the host
 * itself: memcpy and read bandwidth with the bench's threads, the CPU's
 * name.
 */
#ifndef BEAMMOE_TOOLS_BENCH_HOST_H
#define BEAMMOE_TOOLS_BENCH_HOST_H

#include <stddef.h>

#define COPY_BYTES ((size_t)1 << 30)
#define COPY_REPS 5

/* Best of COPY_REPS copies of src to dst (COPY_BYTES each, touched first
 * by copy_touch with the same threads), in GB/s read plus written. */
double copy_gbs(int threads, char *src, char *dst);
void copy_touch(int threads, char *src, char *dst);
/* Best of COPY_REPS read-only passes over 1 GiB, in GB/s; 0 when out of
 * memory. */
double read_gbs(int threads);
/* The "model name" of /proc/cpuinfo, else "unknown". */
void cpu_model(char *buf, size_t n);

#endif
