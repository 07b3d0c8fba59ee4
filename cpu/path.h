/*
 * path.h - which row kernels the CPU backend runs (internal; also read by
 * `beammoe bench`, which reports the path of every row it times).
 *
 * Header-only on purpose: the library and the bench make the same decision
 * from the same inputs (how the library was compiled, the CPU, and the
 * BEAM_CPU_ISA environment variable), so what the bench prints is what the
 * library ran.
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
#ifndef BEAMMOE_CPU_PATH_H
#define BEAMMOE_CPU_PATH_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BM_OP_FINALIZE = 0, BM_OP_NRN = 1, BM_OP_FUSED = 2 };
enum { BM_ISA_PORTABLE = 0, BM_ISA_AVX2 = 1, BM_ISA_AVX512 = 2, BM_ISA_AVX512BF16 = 3 };

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

/* A short description of the passes over one row that an op runs; pre is
 * the pre-norm (nrn) or the post-norm (finalize, fused). */
static inline void bm_cpu_path_text(int isa, int op, int pre, int next, char *buf, size_t n)
{
    const char *p;
    if (op == BM_OP_FINALIZE)
        p = pre ? "sum+chunks -> post-norm" : "sum";
    else if (op == BM_OP_FUSED)
        p = pre ? (next ? "sum+chunks -> post-norm+residual+chunks -> next-norm"
                        : "sum+chunks -> post-norm+residual")
                : (next ? "sum+residual+chunks -> next-norm" : "sum+residual");
    else
        p = pre ? (next ? "chunks -> pre-norm+residual+chunks -> next-norm" : "chunks -> pre-norm+residual")
                : (next ? "residual+chunks -> next-norm" : "residual");
    if (isa == BM_ISA_PORTABLE)
        snprintf(buf, n, "portable loops");
    else
        snprintf(buf, n, "%s %s", bm_isa_name(isa), p);
}

#endif
