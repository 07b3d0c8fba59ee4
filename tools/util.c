/*
 * util.c - PRNG, BF16 bits, ULP comparison, parsing and timing for the tool.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* clock_gettime, posix_memalign under -std=c99 */
#endif

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"

/* ---- splitmix64 (Steele, Lea, Flood 2014): tiny, fixed, good enough ---- */

void rng_seed(tool_rng *r, uint64_t seed) { r->s = seed; }

uint64_t rng_next(tool_rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

double rng_unit(tool_rng *r) { return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }

float rng_uniform(tool_rng *r, float lo, float hi)
{
    return (float)(lo + (hi - lo) * rng_unit(r));
}

uint32_t rng_below(tool_rng *r, uint32_t n) { return (uint32_t)(rng_unit(r) * n); }

/* ---- BF16 ---- */

uint32_t f32_bits(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

float f32_from_bits(uint32_t u)
{
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

float bf16_to_f32(uint16_t b) { return f32_from_bits((uint32_t)b << 16); }

uint16_t f32_to_bf16(float v)
{
    uint32_t u = f32_bits(v);
    if (v != v) return 0x7FFF;
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

int bf16_is_nan(uint16_t b) { return (b & 0x7FFF) > 0x7F80; }

/* ---- ULP distance ----
 * Map bits to a line where adjacent BF16 values differ by 1: positive
 * patterns keep their value, negative ones go below zero with -0 at -1, so
 * +0 vs -0 is 1 ULP (a bit mismatch is never reported as 0 ULP). */
static int32_t ordered(uint16_t b)
{
    return (b & 0x8000) ? -(int32_t)(b & 0x7FFF) - 1 : (int32_t)b;
}

void cmp_init(cmp_result *c) { memset(c, 0, sizeof *c); }

void cmp_bf16(cmp_result *c, const uint16_t *got, const uint16_t *want, size_t n)
{
    size_t i;
    c->compared += (int64_t)n;
    for (i = 0; i < n; i++) {
        uint16_t g = got[i], w = want[i];
        int gn, wn;
        int64_t d;
        if (g == w) continue;
        c->mismatched++;
        gn = bf16_is_nan(g);
        wn = bf16_is_nan(w);
        if (gn && wn) continue; /* NaN vs NaN: 0 ULP (payload differs) */
        if (gn != wn) {
            c->nan_vs_number = 1;
            continue;
        }
        d = (int64_t)ordered(g) - (int64_t)ordered(w);
        if (d < 0) d = -d;
        if (d > c->max_ulp) c->max_ulp = d;
    }
}

void cmp_ulp_text(const cmp_result *c, char *buf, size_t n)
{
    if (c->nan_vs_number)
        snprintf(buf, n, "nan");
    else
        snprintf(buf, n, "%lld", (long long)c->max_ulp);
}

/* ---- misc ---- */

uint64_t fnv1a64_bf16(uint64_t h, const uint16_t *v, size_t n)
{
    size_t i;
    /* Bytes in little-endian order, so the checksum is the same on any host. */
    for (i = 0; i < n; i++) {
        h ^= (uint64_t)(v[i] & 0xFF);
        h *= 0x100000001b3ULL;
        h ^= (uint64_t)(v[i] >> 8);
        h *= 0x100000001b3ULL;
    }
    return h;
}

double now_seconds(void)
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

double median_of(double *v, int n)
{
    if (n <= 0) return 0.0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return (n & 1) ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void *xmalloc(size_t bytes)
{
    void *p = NULL;
    /* Never ask for 0 bytes: the library must see a real pointer even for
     * empty arrays, so its own rules (not a NULL check) decide. */
    if (bytes < 64) bytes = 64;
    if (posix_memalign(&p, 64, bytes) != 0) return NULL;
    return p;
}

void fill_u16(uint16_t *p, uint16_t v, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) p[i] = v;
}

/* ---- option parsing ----
 * A number is the whole option value: no leading or trailing space, no
 * trailing text ("4x", " 4", "4 " are errors; strtoll alone would take the
 * first two). */

static int starts_like_number(const char *s)
{
    return *s && !isspace((unsigned char)*s);
}

int parse_i64(const char *cmd, const char *opt, const char *s, int64_t *out)
{
    char *end;
    long long v;
    errno = 0;
    v = starts_like_number(s) ? strtoll(s, &end, 10) : 0;
    if (!starts_like_number(s) || end == s || *end) {
        fprintf(stderr, "beammoe %s: %s: '%s' is not an integer\n", cmd, opt, s);
        return -1;
    }
    if (errno == ERANGE) {
        fprintf(stderr, "beammoe %s: %s: '%s' is out of the 64-bit range\n", cmd, opt, s);
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

int parse_i32(const char *cmd, const char *opt, const char *s, int32_t *out)
{
    int64_t v;
    if (parse_i64(cmd, opt, s, &v)) return -1;
    if (v < INT32_MIN || v > INT32_MAX) {
        fprintf(stderr, "beammoe %s: %s: '%s' is out of the 32-bit range\n", cmd, opt, s);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

int parse_u64(const char *cmd, const char *opt, const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v = 0;
    /* decimal, or hexadecimal after 0x; never octal ("010" is ten) */
    int hex = s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
    errno = 0;
    if (starts_like_number(s) && s[0] != '-' && s[0] != '+' && (!hex || isxdigit((unsigned char)s[2])))
        v = strtoull(hex ? s + 2 : s, &end, hex ? 16 : 10);
    else
        end = (char *)s;
    if (end == s || *end || errno == EINVAL) {
        fprintf(stderr, "beammoe %s: %s: '%s' is not a non-negative integer\n", cmd, opt, s);
        return -1;
    }
    if (errno == ERANGE) {
        fprintf(stderr, "beammoe %s: %s: '%s' is out of the 64-bit range\n", cmd, opt, s);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

int parse_f32(const char *cmd, const char *opt, const char *s, float *out)
{
    char *end = (char *)s;
    float v = 0.0f;
    errno = 0;
    if (starts_like_number(s)) v = strtof(s, &end);
    if (end == s || *end) {
        fprintf(stderr, "beammoe %s: %s: '%s' is not a number\n", cmd, opt, s);
        return -1;
    }
    /* Range and finiteness are the library's rules: pass the value on. */
    *out = v;
    return 0;
}

int split_f32_pair(const char *s, float out[2])
{
    char *end;
    out[0] = strtof(s, &end);
    if (end == s || *end != ',') return -1;
    s = end + 1;
    out[1] = strtof(s, &end);
    if (end == s || *end) return -1;
    return 0;
}

int parse_f32_pair(const char *cmd, const char *opt, const char *s, float out[2])
{
    const char *comma = strchr(s, ',');
    /* no space around either number (split_f32_pair, which a file's
     * metadata goes through too, lets strtof skip a leading one) */
    if (starts_like_number(s) && comma && starts_like_number(comma + 1) &&
        split_f32_pair(s, out) == 0)
        return 0;
    fprintf(stderr, "beammoe %s: %s: '%s' is not two numbers 'A,B'\n", cmd, opt, s);
    return -1;
}

int tool_exit_status(beam_status st)
{
    /* a rule of the contract broken by what was given, or a backend that
     * is not available: the caller's input; else the run itself failed */
    return st == BEAM_OK                                                ? TOOL_EXIT_OK
           : st == BEAM_ERR_INVALID_ARGUMENT || st == BEAM_ERR_UNSUPPORTED ? TOOL_EXIT_USAGE
                                                                        : TOOL_EXIT_FAIL;
}

int report_lib_error(const char *cmd, const char *what, beam_status st)
{
    fprintf(stderr, "beammoe %s: %s failed: %s: %s\n", cmd, what,
            beam_status_string(st), beam_last_error());
    return TOOL_EXIT_FAIL;
}

/* ---- TARGETS.md byte counts ---- */

double bytes_finalize(int64_t T, int32_t K, int32_t H, int post_weight)
{
    double t = (double)T, k = (double)K, h = (double)H;
    return t * k * h * 2 + t * k * 4 + t * h * 2 + (post_weight ? h * 2 : 0);
}

double bytes_fused(int64_t T, int32_t K, int32_t H, int post_weight, int next_on,
                   int next_weight)
{
    double t = (double)T, h = (double)H;
    /* TARGETS.md: the finalize bytes (their T*H*2 output stands for
     * hidden_out; the finalized row itself is never stored), plus the
     * residual read, plus normalized written when the next norm is on. */
    return bytes_finalize(T, K, H, post_weight) + t * h * 2 +
           (next_on ? t * h * 2 : 0) + (next_weight ? h * 2 : 0);
}

double bytes_nrn(int64_t T, int32_t H, int pre_weight, int next_on, int next_weight)
{
    double t = (double)T, h = (double)H;
    return t * h * 2 * 3 + (next_on ? t * h * 2 : 0) + (pre_weight ? h * 2 : 0) +
           (next_weight ? h * 2 : 0);
}
