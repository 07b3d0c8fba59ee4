/*
 * util.h - helpers shared by the test programs, the `beammoe` tool and its
 * benches (the harness; not part of any library).
 *
 * A self-contained PRNG (splitmix64) so generated inputs, and with them the
 * golden digests and the tool's checksums, never depend on the C library;
 * FNV-1a 64 for digests; random BF16/FP32 generators; buffers with guard
 * rows to prove nothing is written where it must not be; bit-for-bit and
 * ULP comparison; timing. BF16 travels as uint16_t bits, as in the API;
 * conversions are the reference's (nr_bf16, nr_f).
 */
#ifndef BEAMMOE_HARNESS_UTIL_H
#define BEAMMOE_HARNESS_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "beammoe.h"
#include "naive_ref.h"

/* ---- PRNG: splitmix64 (Steele, Lea, Flood 2014), fixed forever ---------- */
typedef struct hu_rng {
    uint64_t s;
} hu_rng;

void hu_rng_init(hu_rng *r, uint64_t seed);
uint64_t hu_next(hu_rng *r);
/* Two ways to draw from [0, n) (n > 0), each fixed by its own inputs:
 * hu_below takes the high 32 bits modulo n (the test suite's cases);
 * hu_below_scaled scales hu_unit (the tool's generated cases). */
uint32_t hu_below(hu_rng *r, uint32_t n);
uint32_t hu_below_scaled(hu_rng *r, uint32_t n);
double hu_unit(hu_rng *r); /* [0, 1) with 53 random bits */
float hu_uniform(hu_rng *r, float lo, float hi);

/* A "typical" BF16 value: random sign, exponent 2^-6 .. 2^3, random
 * mantissa, a zero now and then. Built from integer bits only. */
uint16_t hu_rand_bf16(hu_rng *r);
/* A routing weight: FP32 in (0, 1) with a full random mantissa, negative
 * one time in eight. */
float hu_rand_weight(hu_rng *r);
/* A norm weight: BF16 in [0.5, 2) with random sign one time in sixteen. */
uint16_t hu_rand_norm_weight(hu_rng *r);
/* A positive scale in [0.25, 4) with a full random mantissa. */
float hu_rand_scale(hu_rng *r);

void hu_fill_bf16(hu_rng *r, uint16_t *p, size_t n);
void hu_fill_weight(hu_rng *r, float *p, size_t n);
void hu_fill_u16(uint16_t *p, uint16_t v, size_t n);
/* Padding: NaN patterns (quiet, signalling, negative) and infinities. */
void hu_fill_bf16_nan(uint16_t *p, size_t n);
void hu_fill_f32_nan(float *p, size_t n);

/* Finite exotic BF16 values (subnormals, signed zeros, min normal, large
 * values) mixed one time in `rate` into p[0..n). */
void hu_sprinkle_exotic(hu_rng *r, uint16_t *p, size_t n, uint32_t rate);
/* A value that takes a whole normalized row with it: +-inf, NaNs, +-max. */
uint16_t hu_rand_killer(hu_rng *r);
/* Exotic routing weights (zeros, subnormals, 1, 2^69) one time in `rate`. */
void hu_sprinkle_exotic_weights(hu_rng *r, float *p, size_t n, uint32_t rate);

/* ---- digests ------------------------------------------------------------ */
#define HU_FNV_OFFSET 0xcbf29ce484222325ULL
/* FNV-1a 64 over bytes, continuing from h (start with HU_FNV_OFFSET). */
uint64_t hu_fnv1a(uint64_t h, const void *p, size_t n);
/* The same over n BF16 values taken as little-endian bytes on any host. */
uint64_t hu_fnv1a_bf16(uint64_t h, const uint16_t *v, size_t n);

/* ---- seeds and run size ------------------------------------------------- */
/* BEAM_TEST_SEED if set, else from the clock; printed once to stderr. */
uint64_t hu_seed(const char *prog);
/* BEAM_TEST_QUICK set (e.g. under valgrind): shrink sweeps. */
int hu_quick(void);
/* How many of the world sizes {1, 2, 3, 4, 5, 8} a test of ranks as
 * threads runs: all; the first three under BEAM_TEST_QUICK; the group of
 * one alone for a device backend under BEAM_TEST_QUICK (the sanitizer
 * runs, where several ranks on one device can stall: util.c). */
int hu_world_sizes(int device);

/* ---- buffers ------------------------------------------------------------ */
/* n bytes at an address that is 16-byte aligned plus off (0 <= off < 16);
 * never NULL (exits when out of memory); free with hu_free. Contents zero.
 * hu_try_alloc: the same, NULL when out of memory. */
void *hu_alloc(size_t n, size_t off);
void *hu_try_alloc(size_t n, size_t off);
void hu_free(void *p);
/* 64-byte aligned, at least 64 bytes (the library sees a real pointer even
 * for an empty array); NULL on failure; free with free(). */
void *hu_malloc(size_t bytes);

/* n bytes that end exactly where an inaccessible page begins: any access
 * past the end faults. n must be even (BF16) or a multiple of 4 (FP32) for
 * the result to be aligned. Free with hu_free_fenced(p, n). */
void *hu_alloc_fenced(size_t n);
void hu_free_fenced(void *p, size_t n);

/* Byte pattern written into outputs before a call that must not touch them. */
#define HU_POISON 0xA5
void hu_poison(void *p, size_t n);
/* 1 when all n bytes still hold HU_POISON. */
int hu_is_poison(const void *p, size_t n);

/* ---- comparison --------------------------------------------------------- */
/* Compare n BF16 values; on a mismatch print label, the first differing
 * index and both bit patterns (and how many differ). Returns the count. */
size_t hu_cmp_bf16(const char *label, const uint16_t *got, const uint16_t *want, size_t n);

/* Running totals in BF16 ordered-integer space (the audit's columns). */
typedef struct hu_cmp {
    int64_t compared;
    int64_t mismatched; /* bit patterns differ */
    int64_t max_ulp;    /* over number/number and NaN/NaN pairs */
    int nan_vs_number;  /* some pair had a NaN on one side only */
} hu_cmp;
void hu_cmp_init(hu_cmp *c);
void hu_cmp_add(hu_cmp *c, const uint16_t *got, const uint16_t *want, size_t n);
/* "0", "3", "nan": the max ULP column. */
void hu_cmp_ulp_text(const hu_cmp *c, char *buf, size_t n);

/* nr_norm -> beam_norm; returns dst when n->on, else NULL. */
const beam_norm *hu_beam_norm(const nr_norm *n, beam_norm *dst);

/* "A,B" -> two floats; 0, or -1 when s is not exactly that (strtof may skip
 * a leading space of either). */
int hu_split_pair(const char *s, float out[2]);

/* bit casts */
float hu_f32(uint32_t u);
uint32_t hu_u32(float v);

/* Where each code of a rounding conversion starts: for code(bits), a code
 * that never decreases over the magnitude patterns [0, top] (positive
 * floats order as their bits), lo[k] for k = 1 .. n - 1 is the first
 * pattern whose code is >= k, found by bisection; lo[0] = 0. Exhaustive
 * tests then check whole intervals. */
void hu_code_starts(unsigned (*code)(uint32_t), int n, uint32_t top, uint32_t *lo);

/* ---- time --------------------------------------------------------------- */
double hu_now(void);             /* monotonic seconds */
double hu_median(double *v, int n); /* sorts v */

#endif
