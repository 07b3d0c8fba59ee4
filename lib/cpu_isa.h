/*
 * cpu_isa.h - which row kernels the CPU backend runs: the pure decision
 * from how the library was compiled, the CPU, and the BEAM_CPU_ISA
 * environment variable (internal).
 *
 * Read by the CPU backend (cpu/rows.c, which makes the decision once per
 * process) and by `beammoe bench` (tools/bench.c, which reports the
 * kernels of every row it times): both make the same decision from the
 * same inputs, so what the bench prints is what the library ran. It lives
 * in lib/, not in cpu/ or harness/: lib/ holds what the libraries share
 * and what tools may read of the library's own decisions (as backends.h,
 * the list of backends), while cpu/ is the backend's private folder and
 * harness/ is the tests' and tools' side, which no library may depend on.
 * Header-only, with nothing of the backend's internals (no bm_args, no
 * kernels), so including it gives a tool the decision and nothing else.
 *
 * Kernels (same bits on every path, docs/numerics.md):
 *   avx512bf16, avx512, avx2
 *                 the vector rows of cpu/rows_simd.h (x86-64, GCC): every
 *                 configuration, each row streamed once from memory, its
 *                 intermediate rows kept in the thread's scratch
 *                 (avx512bf16: AVX-512 with BW, DQ and BF16, whose
 *                 conversion rounds stored values where it gives docs/numerics.md's
 *                 bits);
 *   portable      the C loops of cpu/rows.c, the ground truth (other
 *                 compilers and CPUs; -DBEAM_SCALAR_ROWS builds only them).
 * BEAM_CPU_ISA=portable|avx2|avx512|avx512bf16 caps the choice (for tests and
 * comparisons); unset, "auto" or anything else: the widest the CPU has.
 */
#ifndef BEAMMOE_LIB_CPU_ISA_H
#define BEAMMOE_LIB_CPU_ISA_H

#include <stdlib.h>
#include <string.h>

enum { BM_ISA_PORTABLE = 0, BM_ISA_AVX2 = 1, BM_ISA_AVX512 = 2, BM_ISA_AVX512BF16 = 3 };

/* The build has the vector kernels (cpu/rows.c compiles them under this). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(BEAM_NO_CLONES) && \
    !defined(BEAM_SCALAR_ROWS)
#define BM_HAVE_SIMD 1
#endif

/* The kernels for this process: the build, the CPU, then BEAM_CPU_ISA. */
static inline int bm_cpu_pick_isa(void)
{
    int isa = BM_ISA_PORTABLE, cap = BM_ISA_AVX512BF16;
    const char *env = getenv("BEAM_CPU_ISA");
    if (env && !strcmp(env, "portable")) cap = BM_ISA_PORTABLE;
    if (env && !strcmp(env, "avx2")) cap = BM_ISA_AVX2;
    if (env && !strcmp(env, "avx512")) cap = BM_ISA_AVX512;
#ifdef BM_HAVE_SIMD
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bf16"))
        isa = BM_ISA_AVX512BF16;
    else if (__builtin_cpu_supports("avx512f"))
        isa = BM_ISA_AVX512;
    else if (__builtin_cpu_supports("avx2"))
        isa = BM_ISA_AVX2;
#endif
    return isa < cap ? isa : cap;
}

static inline const char *bm_isa_name(int isa)
{
    return isa == BM_ISA_AVX512BF16 ? "avx512bf16"
           : isa == BM_ISA_AVX512   ? "avx512"
           : isa == BM_ISA_AVX2     ? "avx2"
                                    : "portable";
}

#endif
