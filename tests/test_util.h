/*
 * test_util.h - shared helpers of the test programs (not part of any library).
 *
 * A self-contained PRNG (splitmix64) so generated inputs, and with them the
 * golden digests, never depend on the C library; FNV-1a 64 for digests;
 * random BF16/FP32 generators; buffers with guard rows to prove nothing is
 * written where it must not be.
 */
#ifndef BEAMMOE_TESTS_TEST_UTIL_H
#define BEAMMOE_TESTS_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "beammoe.h"
#include "naive_ref.h"

/* ---- PRNG: splitmix64 (Steele, Lea, Flood 2014), fixed forever ---------- */
typedef struct tu_rng {
    uint64_t s;
} tu_rng;

void tu_rng_init(tu_rng *r, uint64_t seed);
uint64_t tu_next(tu_rng *r);
/* uniform integer in [0, n) (n > 0; slight modulo bias is irrelevant here) */
uint32_t tu_below(tu_rng *r, uint32_t n);

/* A "typical" BF16 value: random sign, exponent 2^-6 .. 2^3, random
 * mantissa, a zero now and then. Built from integer bits only. */
uint16_t tu_rand_bf16(tu_rng *r);
/* A routing weight: FP32 in (0, 1) with a full random mantissa, negative
 * one time in eight. */
float tu_rand_weight(tu_rng *r);
/* A norm weight: BF16 in [0.5, 2) with random sign one time in sixteen. */
uint16_t tu_rand_norm_weight(tu_rng *r);
/* A positive scale in [0.25, 4) with a full random mantissa. */
float tu_rand_scale(tu_rng *r);

void tu_fill_bf16(tu_rng *r, uint16_t *p, size_t n);
void tu_fill_weight(tu_rng *r, float *p, size_t n);
/* Padding: NaN patterns (quiet, signalling, negative) and infinities. */
void tu_fill_bf16_nan(uint16_t *p, size_t n);
void tu_fill_f32_nan(float *p, size_t n);

/* ---- digests ------------------------------------------------------------ */
#define TU_FNV_OFFSET 0xcbf29ce484222325ULL
/* FNV-1a 64 over bytes, continuing from h (start with TU_FNV_OFFSET). */
uint64_t tu_fnv1a(uint64_t h, const void *p, size_t n);

/* ---- seeds and run size ------------------------------------------------- */
/* BEAM_TEST_SEED if set, else from the clock; printed once to stderr. */
uint64_t tu_seed(const char *prog);
/* BEAM_TEST_QUICK set (e.g. under valgrind): shrink sweeps. */
int tu_quick(void);

/* ---- buffers ------------------------------------------------------------ */
/* n bytes at an address that is 16-byte aligned plus off (0 <= off < 16);
 * free with tu_free. Contents zero. */
void *tu_alloc(size_t n, size_t off);
void tu_free(void *p);

/* n bytes that end exactly where an inaccessible page begins: any access
 * past the end faults. n must be even (BF16) or a multiple of 4 (FP32) for
 * the result to be aligned. Free with tu_free_fenced(p, n). */
void *tu_alloc_fenced(size_t n);
void tu_free_fenced(void *p, size_t n);

/* Byte pattern written into outputs before a call that must not touch them. */
#define TU_POISON 0xA5
void tu_poison(void *p, size_t n);
/* 1 when all n bytes still hold TU_POISON. */
int tu_is_poison(const void *p, size_t n);

/* Compare n BF16 values; on a mismatch print label, the first differing
 * index and both bit patterns (and how many differ). Returns the count. */
size_t tu_cmp_bf16(const char *label, const uint16_t *got,
                   const uint16_t *want, size_t n);

/* nr_norm -> beam_norm; returns dst when n->on, else NULL. */
const beam_norm *tu_beam_norm(const nr_norm *n, beam_norm *dst);

/* bit casts */
float tu_f32(uint32_t u);
uint32_t tu_u32(float v);

/* ---- CUnit driver -------------------------------------------------------- */
typedef struct tu_test {
    const char *name;
    void (*fn)(void);
} tu_test;
/* Run one suite of tests (array ends with {NULL, NULL}); returns the exit
 * status for automake: 0 all passed, 1 a failure, 99 CUnit itself failed. */
int tu_run_suite(const char *suite, const tu_test *tests);

/* Finite exotic BF16 values (subnormals, signed zeros, min normal, large
 * values) mixed one time in `rate` into p[0..n). */
void tu_sprinkle_exotic(tu_rng *r, uint16_t *p, size_t n, uint32_t rate);
/* A value that takes a whole normalized row with it: +-inf, NaNs, +-max. */
uint16_t tu_rand_killer(tu_rng *r);
/* Exotic routing weights (zeros, subnormals, 1, 2^69) one time in `rate`. */
void tu_sprinkle_exotic_weights(tu_rng *r, float *p, size_t n, uint32_t rate);

#endif
