/*
 * omp_shim.h - OpenMP for the tool, or single-thread stand-ins when the build
 * has none (configure --disable-openmp: the library then runs on one thread).
 */
#ifndef BEAMMOE_TOOLS_OMP_SHIM_H
#define BEAMMOE_TOOLS_OMP_SHIM_H

#ifdef _OPENMP
#include <omp.h>
/* TOOL_OMP(omp parallel for) - a pragma that vanishes without OpenMP, so
 * -Wall (-Wunknown-pragmas) stays quiet in such builds */
#define TOOL_OMP(x) _Pragma(#x)
#else
#define TOOL_OMP(x)
static inline int omp_get_max_threads(void) { return 1; }
static inline int omp_get_num_threads(void) { return 1; }
static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_get_num_procs(void) { return 1; }
static inline void omp_set_num_threads(int n) { (void)n; }
#endif

#endif
