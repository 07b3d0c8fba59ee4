/*
 * suite.h - the CUnit driver of the test programs (their other helpers are
 * the harness's: harness/util.h, harness/case.h).
 */
#ifndef BEAMMOE_TESTS_SUITE_H
#define BEAMMOE_TESTS_SUITE_H

#include "case.h"

/* BEAM_TEST_ASAN: built with AddressSanitizer, which puts redzones around
 * every stack variable and shares no stack slots, so the CPU row kernel's
 * frame of 512 bytes takes about 35 KB under it (bm_simd_rows_16b, gcc 12,
 * AVX-512), and which replaces malloc. The small-stack tests then check
 * 64 KiB instead of 16 (SMALL_STACK_KIB): 16 KiB overflows in the
 * sanitized build only, and not always where a guard page catches it. */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BEAM_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(BEAM_TEST_ASAN)
#define BEAM_TEST_ASAN 1
#endif
#ifdef BEAM_TEST_ASAN
#define SMALL_STACK_KIB 64
#else
#define SMALL_STACK_KIB 16
#endif

/* A test's body for every backend the program tests: the entries of its
 * own `const beam_ops *g_ops[BM_NBACKENDS]` that are not NULL. */
#define FOR_EACH_BACKEND(ops)                        \
    for (int b_ = 0; b_ < BM_NBACKENDS; b_++)        \
        for (const beam_ops *ops = g_ops[b_]; ops; ops = NULL)

typedef struct suite_test {
    const char *name;
    void (*fn)(void);
} suite_test;

/* Run one suite of tests (array ends with {NULL, NULL}); returns the exit
 * status for automake: 0 all passed, 1 a failure, 99 CUnit itself failed. */
int suite_run(const char *suite, const suite_test *tests);

#endif
