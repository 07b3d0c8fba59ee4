/*
 * common.h - shared helpers of the beammoe command-line tool (tools/).
 *
 * The tool is a client of the public API only (include/beammoe.h); nothing
 * here is part of the library. BF16 travels as uint16_t bits, as in the API.
 */
#ifndef BEAMMOE_TOOLS_COMMON_H
#define BEAMMOE_TOOLS_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "beammoe.h"

/* ---- exit statuses shared by every subcommand ----
 * One rule (beammoe --help, README): 2 for what the user gave wrong, 1 for
 * a check that failed or an error of the run itself. */
#define TOOL_EXIT_OK 0
#define TOOL_EXIT_FAIL 1  /* audit mismatch or error row; device, communication,
                             out-of-memory or other library error of the run */
#define TOOL_EXIT_USAGE 2 /* bad or missing option or value, sizes or values
                             the library rejects, a backend not available, an
                             unusable --input file or --output path */

/* ---- subcommands (one file each) ---- */
int cmd_audit(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* ---- PRNG: splitmix64, fixed so inputs are the same on every host ---- */
typedef struct tool_rng {
    uint64_t s;
} tool_rng;

void rng_seed(tool_rng *r, uint64_t seed);
uint64_t rng_next(tool_rng *r);
double rng_unit(tool_rng *r);            /* [0, 1) with 53 random bits */
float rng_uniform(tool_rng *r, float lo, float hi);
uint32_t rng_below(tool_rng *r, uint32_t n); /* [0, n), n > 0 */

/* ---- BF16 bits <-> FP32 ---- */
float bf16_to_f32(uint16_t b);
uint16_t f32_to_bf16(float v); /* nearest-even, NaN -> 0x7FFF */
int bf16_is_nan(uint16_t b);
uint32_t f32_bits(float v);
float f32_from_bits(uint32_t u);

/* ---- comparison in BF16 ordered-integer space ---- */
typedef struct cmp_result {
    int64_t compared;
    int64_t mismatched; /* bit patterns differ */
    int64_t max_ulp;    /* over number/number and NaN/NaN pairs */
    int nan_vs_number;  /* some pair had a NaN on one side only */
} cmp_result;

void cmp_init(cmp_result *c);
/* Accumulate n elements of got against want into c. */
void cmp_bf16(cmp_result *c, const uint16_t *got, const uint16_t *want, size_t n);
/* "0", "3", "nan" - the max ULP column of the audit table. */
void cmp_ulp_text(const cmp_result *c, char *buf, size_t n);

/* ---- misc ---- */
uint64_t fnv1a64_bf16(uint64_t h, const uint16_t *v, size_t n); /* h: running hash */
#define FNV1A64_INIT 0xcbf29ce484222325ULL
double now_seconds(void);                         /* monotonic */
double median_of(double *v, int n);               /* sorts v */
void *xmalloc(size_t bytes);                      /* NULL only on failure; 64-byte aligned */
void fill_u16(uint16_t *p, uint16_t v, size_t n);

/* Option values: 0 on success, else prints "<cmd>: <opt>: ..." and returns -1.
 * The whole value must be the number: no space before or after it, no
 * trailing text. */
int parse_i64(const char *cmd, const char *opt, const char *s, int64_t *out);
int parse_i32(const char *cmd, const char *opt, const char *s, int32_t *out);
int parse_f32(const char *cmd, const char *opt, const char *s, float *out);
/* "A,B" -> two floats; 0, or -1 when s is not exactly that (nothing printed). */
int split_f32_pair(const char *s, float out[2]);
int parse_f32_pair(const char *cmd, const char *opt, const char *s, float out[2]);
int parse_u64(const char *cmd, const char *opt, const char *s, uint64_t *out);

/* Library error: print "beammoe <cmd>: <what>: <status>: <beam_last_error()>";
 * returns TOOL_EXIT_FAIL. */
int report_lib_error(const char *cmd, const char *what, beam_status st);
/* The exit status for a library status under the tool's rule:
 * invalid argument or unsupported (the caller's input, or a backend that is
 * not available) 2, any other error 1. */
int tool_exit_status(beam_status st);

/* ---- byte counts of TARGETS.md ---- */
double bytes_finalize(int64_t T, int32_t K, int32_t H, int post_weight);
double bytes_fused(int64_t T, int32_t K, int32_t H, int post_weight,
                   int next_on, int next_weight);
double bytes_nrn(int64_t T, int32_t H, int pre_weight, int next_on, int next_weight);

#endif
