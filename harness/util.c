/*
 * util.c - PRNG, digests, generators, guarded buffers, comparison and timing
 * (see util.h). The suite's generators work on integer bits, so the values
 * they yield are the same on every host and compiler (the golden digests
 * depend on that).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* MAP_ANONYMOUS, clock_gettime, posix_memalign under -std=c99 */
#endif

#include "util.h"

#include <sys/mman.h>
#include <unistd.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


void hu_rng_init(hu_rng *r, uint64_t seed)
{
    r->s = seed;
}

uint64_t hu_next(hu_rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint32_t hu_below(hu_rng *r, uint32_t n)
{
    return (uint32_t)(hu_next(r) >> 32) % n;
}

double hu_unit(hu_rng *r)
{
    return (double)(hu_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

uint32_t hu_below_scaled(hu_rng *r, uint32_t n)
{
    return (uint32_t)(hu_unit(r) * n);
}

float hu_uniform(hu_rng *r, float lo, float hi)
{
    return (float)(lo + (hi - lo) * hu_unit(r));
}

int hu_split_pair(const char *s, float out[2])
{
    char *end;
    out[0] = strtof(s, &end);
    if (end == s || *end != ',')
        return -1;
    s = end + 1;
    out[1] = strtof(s, &end);
    if (end == s || *end)
        return -1;
    return 0;
}

float hu_f32(uint32_t u)
{
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

uint32_t hu_u32(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

uint16_t hu_rand_bf16(hu_rng *r)
{
    uint64_t b = hu_next(r);
    uint32_t sign = (uint32_t)(b & 1u) << 15;
    uint32_t exp = 121u + (uint32_t)((b >> 8) % 10u); /* 2^-6 .. 2^3 */
    uint32_t man = (uint32_t)(b >> 20) & 0x7Fu;
    if (((b >> 40) & 63u) == 0)
        return (uint16_t)sign; /* +-0 one time in 64 */
    return (uint16_t)(sign | (exp << 7) | man);
}

float hu_rand_weight(hu_rng *r)
{
    uint64_t b = hu_next(r);
    /* exponent 2^-8 .. 2^-1, full 23-bit mantissa: (0, 1) */
    uint32_t exp = 119u + (uint32_t)((b >> 3) % 8u);
    uint32_t man = (uint32_t)(b >> 32) & 0x7FFFFFu;
    uint32_t sign = ((b & 7u) == 0) ? 0x80000000u : 0u;
    return hu_f32(sign | (exp << 23) | man);
}

uint16_t hu_rand_norm_weight(hu_rng *r)
{
    uint64_t b = hu_next(r);
    uint32_t exp = 126u + (uint32_t)((b >> 4) & 1u); /* [0.5, 2) */
    uint32_t man = (uint32_t)(b >> 24) & 0x7Fu;
    uint32_t sign = ((b & 15u) == 0) ? 0x8000u : 0u;
    return (uint16_t)(sign | (exp << 7) | man);
}

float hu_rand_scale(hu_rng *r)
{
    uint64_t b = hu_next(r);
    uint32_t exp = 125u + (uint32_t)((b >> 4) % 4u); /* [0.25, 4) */
    uint32_t man = (uint32_t)(b >> 32) & 0x7FFFFFu;
    return hu_f32((exp << 23) | man);
}

void hu_fill_bf16(hu_rng *r, uint16_t *p, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++)
        p[i] = hu_rand_bf16(r);
}

void hu_fill_weight(hu_rng *r, float *p, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++)
        p[i] = hu_rand_weight(r);
}

void hu_fill_u16(uint16_t *p, uint16_t v, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++)
        p[i] = v;
}

void hu_fill_bf16_nan(uint16_t *p, size_t n)
{
    static const uint16_t pat[] = {0x7FC0, 0xFFC1, 0x7F81, 0x7F80, 0xFF80,
                                   0x7FFF};
    size_t i;
    for (i = 0; i < n; i++)
        p[i] = pat[i % (sizeof pat / sizeof pat[0])];
}

void hu_fill_f32_nan(float *p, size_t n)
{
    static const uint32_t pat[] = {0x7FC00000u, 0xFFC00001u, 0x7F800001u,
                                   0x7F800000u};
    size_t i;
    for (i = 0; i < n; i++)
        p[i] = hu_f32(pat[i % 4]);
}

void hu_code_starts(unsigned (*code)(uint32_t), int n, uint32_t top, uint32_t *lo)
{
    int k;
    lo[0] = 0;
    for (k = 1; k < n; k++) {
        uint32_t a = 0, b = top; /* code(a) < k <= code(b) */
        while (b - a > 1) {
            const uint32_t m = a + (b - a) / 2;
            if (code(m) >= (unsigned)k)
                b = m;
            else
                a = m;
        }
        lo[k] = b;
    }
}

uint64_t hu_fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    size_t i;
    for (i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

uint64_t hu_fnv1a_bf16(uint64_t h, const uint16_t *v, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        unsigned char b[2];
        b[0] = (unsigned char)(v[i] & 0xFF);
        b[1] = (unsigned char)(v[i] >> 8);
        h = hu_fnv1a(h, b, 2);
    }
    return h;
}

uint64_t hu_seed(const char *prog)
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

int hu_quick(void)
{
    const char *e = getenv("BEAM_TEST_QUICK");
    return e && *e && *e != '0';
}

/* The scripts run the tests under compute-sanitizer with BEAM_TEST_QUICK.
 * The tool instruments a kernel at its first launch and waits for the
 * device meanwhile; with the ranks on one device, a peer's kernel waiting
 * for this rank then holds that launch until the workspace's timeout.
 * scripts/gpu-run.sh checks several ranks' kernels under the tools with
 * the parts of test_gather_group that launch each kernel alone first. */
int hu_world_sizes(int device)
{
    return !hu_quick() ? 6 : device ? 1 : 3;
}

/* The block holds the original malloc pointer just below the returned one. */
void *hu_alloc(size_t n, size_t off)
{
    void *p = hu_try_alloc(n, off);
    if (!p) {
        fprintf(stderr, "hu_alloc: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

void *hu_try_alloc(size_t n, size_t off)
{
    unsigned char *raw = n > SIZE_MAX - 64 ? NULL : (unsigned char *)calloc(1, n + 32 + sizeof(void *));
    uintptr_t a;
    unsigned char *p;
    if (!raw)
        return NULL;
    a = (uintptr_t)(raw + sizeof(void *) + 15) & ~(uintptr_t)15;
    p = (unsigned char *)a + off;
    memcpy((unsigned char *)a - sizeof(void *), &raw, sizeof raw);
    return p;
}

void hu_free(void *p)
{
    unsigned char *raw;
    uintptr_t a;
    if (!p)
        return;
    a = (uintptr_t)p & ~(uintptr_t)15;
    memcpy(&raw, (unsigned char *)a - sizeof(void *), sizeof raw);
    free(raw);
}

void *hu_malloc(size_t bytes)
{
    void *p = NULL;
    if (bytes < 64)
        bytes = 64;
    if (posix_memalign(&p, 64, bytes) != 0)
        return NULL;
    return p;
}

void hu_poison(void *p, size_t n)
{
    memset(p, HU_POISON, n);
}

int hu_is_poison(const void *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    size_t i;
    for (i = 0; i < n; i++)
        if (b[i] != HU_POISON)
            return 0;
    return 1;
}

size_t hu_cmp_bf16(const char *label, const uint16_t *got,
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

/* Bits on a line where adjacent BF16 values differ by 1: positive patterns
 * keep their value, negative ones go below zero with -0 at -1, so +0 vs -0
 * is 1 ULP (a bit mismatch is never reported as 0 ULP). */
static int32_t ordered(uint16_t b)
{
    return (b & 0x8000) ? -(int32_t)(b & 0x7FFF) - 1 : (int32_t)b;
}

static int is_nan_bf16(uint16_t b)
{
    return (b & 0x7FFF) > 0x7F80;
}

void hu_cmp_init(hu_cmp *c)
{
    memset(c, 0, sizeof *c);
}

void hu_cmp_add(hu_cmp *c, const uint16_t *got, const uint16_t *want, size_t n)
{
    size_t i;
    c->compared += (int64_t)n;
    for (i = 0; i < n; i++) {
        int gn = is_nan_bf16(got[i]), wn = is_nan_bf16(want[i]);
        int64_t d;
        if (got[i] == want[i])
            continue;
        c->mismatched++;
        if (gn && wn)
            continue; /* NaN vs NaN: 0 ULP (payload differs) */
        if (gn != wn) {
            c->nan_vs_number = 1;
            continue;
        }
        d = (int64_t)ordered(got[i]) - (int64_t)ordered(want[i]);
        if (d < 0)
            d = -d;
        if (d > c->max_ulp)
            c->max_ulp = d;
    }
}

void hu_cmp_ulp_text(const hu_cmp *c, char *buf, size_t n)
{
    if (c->nan_vs_number)
        snprintf(buf, n, "nan");
    else
        snprintf(buf, n, "%lld", (long long)c->max_ulp);
}

double hu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double hu_median(double *v, int n)
{
    if (n <= 0)
        return 0.0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return (n & 1) ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

const beam_norm *hu_beam_norm(const nr_norm *n, beam_norm *dst)
{
    if (!n || !n->on)
        return NULL;
    dst->weight = n->weight;
    dst->eps = n->eps;
    return dst;
}

void hu_sprinkle_exotic(hu_rng *r, uint16_t *p, size_t n, uint32_t rate)
{
    /* finite and harmless to a whole row: subnormals, zeros, min normal,
     * 2^-24, large values whose squares still fit FP32 sums */
    static const uint16_t ex[] = {0x0001, 0x8001, 0x007F, 0x0080, 0x0040, 0x00FF,
                                  0x8080, 0x0000, 0x8000, 0x4F00, 0xCF00, 0x3380};
    size_t i;
    for (i = 0; i < n; i++)
        if (hu_below(r, rate) == 0)
            p[i] = ex[hu_below(r, (uint32_t)(sizeof ex / sizeof ex[0]))];
}

uint16_t hu_rand_killer(hu_rng *r)
{
    static const uint16_t ex[] = {0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81, 0x7F7F, 0xFF7F};
    return ex[hu_below(r, (uint32_t)(sizeof ex / sizeof ex[0]))];
}

void hu_sprinkle_exotic_weights(hu_rng *r, float *p, size_t n, uint32_t rate)
{
    static const uint32_t ex[] = {0x00000000u, 0x80000000u, 0x00000400u, 0x80000001u,
                                  0x3F800000u, 0x00800000u, 0x60000000u};
    size_t i;
    for (i = 0; i < n; i++)
        if (hu_below(r, rate) == 0)
            p[i] = hu_f32(ex[hu_below(r, (uint32_t)(sizeof ex / sizeof ex[0]))]);
}

/* Layout: [pad][n bytes][PROT_NONE page]; the mapping starts one page-sized
 * header before, which stores nothing (size recomputed from n). */
void *hu_alloc_fenced(size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size_t body = (n + pg - 1) / pg * pg;
    unsigned char *m = (unsigned char *)mmap(NULL, body + pg, PROT_READ | PROT_WRITE,
                                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == (unsigned char *)MAP_FAILED) {
        fprintf(stderr, "hu_alloc_fenced: mmap failed\n");
        exit(1);
    }
    if (mprotect(m + body, pg, PROT_NONE) != 0) {
        fprintf(stderr, "hu_alloc_fenced: mprotect failed\n");
        exit(1);
    }
    return m + body - n;
}

void hu_free_fenced(void *p, size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size_t body = (n + pg - 1) / pg * pg;
    unsigned char *end = (unsigned char *)p + n; /* == m + body */
    munmap(end - body, body + pg);
}
