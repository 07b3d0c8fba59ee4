/*
 * test_util.c - PRNG, digests, generators and guarded buffers for the tests.
 * Every generator works on integer bits, so the values it yields are the same
 * on every host and compiler (the golden digests depend on that).
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS under -std=c99 */

#include "test_util.h"

#include <sys/mman.h>
#include <unistd.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <CUnit/Basic.h>

void tu_rng_init(tu_rng *r, uint64_t seed)
{
    r->s = seed;
}

uint64_t tu_next(tu_rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint32_t tu_below(tu_rng *r, uint32_t n)
{
    return (uint32_t)(tu_next(r) >> 32) % n;
}

float tu_f32(uint32_t u)
{
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

uint32_t tu_u32(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

uint16_t tu_rand_bf16(tu_rng *r)
{
    uint64_t b = tu_next(r);
    uint32_t sign = (uint32_t)(b & 1u) << 15;
    uint32_t exp = 121u + (uint32_t)((b >> 8) % 10u); /* 2^-6 .. 2^3 */
    uint32_t man = (uint32_t)(b >> 20) & 0x7Fu;
    if (((b >> 40) & 63u) == 0)
        return (uint16_t)sign; /* +-0 one time in 64 */
    return (uint16_t)(sign | (exp << 7) | man);
}

float tu_rand_weight(tu_rng *r)
{
    uint64_t b = tu_next(r);
    /* exponent 2^-8 .. 2^-1, full 23-bit mantissa: (0, 1) */
    uint32_t exp = 119u + (uint32_t)((b >> 3) % 8u);
    uint32_t man = (uint32_t)(b >> 32) & 0x7FFFFFu;
    uint32_t sign = ((b & 7u) == 0) ? 0x80000000u : 0u;
    return tu_f32(sign | (exp << 23) | man);
}

uint16_t tu_rand_norm_weight(tu_rng *r)
{
    uint64_t b = tu_next(r);
    uint32_t exp = 126u + (uint32_t)((b >> 4) & 1u); /* [0.5, 2) */
    uint32_t man = (uint32_t)(b >> 24) & 0x7Fu;
    uint32_t sign = ((b & 15u) == 0) ? 0x8000u : 0u;
    return (uint16_t)(sign | (exp << 7) | man);
}

float tu_rand_scale(tu_rng *r)
{
    uint64_t b = tu_next(r);
    uint32_t exp = 125u + (uint32_t)((b >> 4) % 4u); /* [0.25, 4) */
    uint32_t man = (uint32_t)(b >> 32) & 0x7FFFFFu;
    return tu_f32((exp << 23) | man);
}

void tu_fill_bf16(tu_rng *r, uint16_t *p, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++)
        p[i] = tu_rand_bf16(r);
}

void tu_fill_weight(tu_rng *r, float *p, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++)
        p[i] = tu_rand_weight(r);
}

void tu_fill_bf16_nan(uint16_t *p, size_t n)
{
    static const uint16_t pat[] = {0x7FC0, 0xFFC1, 0x7F81, 0x7F80, 0xFF80,
                                   0x7FFF};
    size_t i;
    for (i = 0; i < n; i++)
        p[i] = pat[i % (sizeof pat / sizeof pat[0])];
}

void tu_fill_f32_nan(float *p, size_t n)
{
    static const uint32_t pat[] = {0x7FC00000u, 0xFFC00001u, 0x7F800001u,
                                   0x7F800000u};
    size_t i;
    for (i = 0; i < n; i++)
        p[i] = tu_f32(pat[i % 4]);
}

uint64_t tu_fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    size_t i;
    for (i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

uint64_t tu_seed(const char *prog)
{
    const char *e = getenv("BEAM_TEST_SEED");
    uint64_t s;
    if (e && *e)
        s = strtoull(e, NULL, 0);
    else
        s = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    fprintf(stderr, "%s: seed %llu (rerun with BEAM_TEST_SEED=%llu)\n", prog,
            (unsigned long long)s, (unsigned long long)s);
    return s;
}

int tu_quick(void)
{
    const char *e = getenv("BEAM_TEST_QUICK");
    return e && *e && *e != '0';
}

/* The block holds the original malloc pointer just below the returned one. */
void *tu_alloc(size_t n, size_t off)
{
    unsigned char *raw = (unsigned char *)calloc(1, n + 32 + sizeof(void *));
    uintptr_t a;
    unsigned char *p;
    if (!raw) {
        fprintf(stderr, "tu_alloc: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    a = (uintptr_t)(raw + sizeof(void *) + 15) & ~(uintptr_t)15;
    p = (unsigned char *)a + off;
    memcpy((unsigned char *)a - sizeof(void *), &raw, sizeof raw);
    return p;
}

void tu_free(void *p)
{
    unsigned char *raw;
    uintptr_t a;
    if (!p)
        return;
    a = (uintptr_t)p & ~(uintptr_t)15;
    memcpy(&raw, (unsigned char *)a - sizeof(void *), sizeof raw);
    free(raw);
}

void tu_poison(void *p, size_t n)
{
    memset(p, TU_POISON, n);
}

int tu_is_poison(const void *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    size_t i;
    for (i = 0; i < n; i++)
        if (b[i] != TU_POISON)
            return 0;
    return 1;
}

size_t tu_cmp_bf16(const char *label, const uint16_t *got,
                   const uint16_t *want, size_t n)
{
    size_t i, bad = 0, first = 0;
    for (i = 0; i < n; i++)
        if (got[i] != want[i]) {
            if (!bad)
                first = i;
            bad++;
        }
    if (bad)
        fprintf(stderr,
                "MISMATCH %s: %zu of %zu differ; first at [%zu]: got 0x%04X "
                "want 0x%04X\n",
                label, bad, n, first, got[first], want[first]);
    return bad;
}

const beam_norm *tu_beam_norm(const nr_norm *n, beam_norm *dst)
{
    if (!n || !n->on)
        return NULL;
    dst->weight = n->weight;
    dst->eps = n->eps;
    return dst;
}

void tu_sprinkle_exotic(tu_rng *r, uint16_t *p, size_t n, uint32_t rate)
{
    /* finite and harmless to a whole row: subnormals, zeros, min normal,
     * 2^-24, large values whose squares still fit FP32 sums */
    static const uint16_t ex[] = {0x0001, 0x8001, 0x007F, 0x0080, 0x0040, 0x00FF,
                                  0x8080, 0x0000, 0x8000, 0x4F00, 0xCF00, 0x3380};
    size_t i;
    for (i = 0; i < n; i++)
        if (tu_below(r, rate) == 0)
            p[i] = ex[tu_below(r, (uint32_t)(sizeof ex / sizeof ex[0]))];
}

uint16_t tu_rand_killer(tu_rng *r)
{
    static const uint16_t ex[] = {0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81, 0x7F7F, 0xFF7F};
    return ex[tu_below(r, (uint32_t)(sizeof ex / sizeof ex[0]))];
}

void tu_sprinkle_exotic_weights(tu_rng *r, float *p, size_t n, uint32_t rate)
{
    static const uint32_t ex[] = {0x00000000u, 0x80000000u, 0x00000400u, 0x80000001u,
                                  0x3F800000u, 0x00800000u, 0x60000000u};
    size_t i;
    for (i = 0; i < n; i++)
        if (tu_below(r, rate) == 0)
            p[i] = tu_f32(ex[tu_below(r, (uint32_t)(sizeof ex / sizeof ex[0]))]);
}

int tu_run_suite(const char *suite, const tu_test *tests)
{
    CU_pSuite s;
    unsigned failed;
    int i;
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 99;
    s = CU_add_suite(suite, NULL, NULL);
    if (!s) {
        CU_cleanup_registry();
        return 99;
    }
    for (i = 0; tests[i].name; i++)
        if (!CU_add_test(s, tests[i].name, tests[i].fn)) {
            CU_cleanup_registry();
            return 99;
        }
    CU_basic_set_mode(CU_BRM_VERBOSE);
    if (CU_basic_run_tests() != CUE_SUCCESS) {
        CU_cleanup_registry();
        return 99;
    }
    failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}

/* Layout: [pad][n bytes][PROT_NONE page]; the mapping starts one page-sized
 * header before, which stores nothing (size recomputed from n). */
void *tu_alloc_fenced(size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size_t body = (n + pg - 1) / pg * pg;
    unsigned char *m = (unsigned char *)mmap(NULL, body + pg, PROT_READ | PROT_WRITE,
                                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == (unsigned char *)MAP_FAILED) {
        fprintf(stderr, "tu_alloc_fenced: mmap failed\n");
        exit(1);
    }
    if (mprotect(m + body, pg, PROT_NONE) != 0) {
        fprintf(stderr, "tu_alloc_fenced: mprotect failed\n");
        exit(1);
    }
    return m + body - n;
}

void tu_free_fenced(void *p, size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size_t body = (n + pg - 1) / pg * pg;
    unsigned char *end = (unsigned char *)p + n; /* == m + body */
    munmap(end - body, body + pg);
}
