/*
 * case.h - one case: the inputs of the three local operations, made from a
 * seed by one of two generators, run through the naive reference and
 * through the library on a backend's memory, compared bit for bit. Used by
 * the CUnit tests (CPU and CUDA), `beammoe audit` and `beammoe run`.
 *
 * Inputs have cap = T + pad rows; the rows past the live ones hold NaN and
 * infinities that must never be read. Outputs (hc_out) have guard rows past
 * the live ones, and a normalized buffer also when the call gets none; all
 * hold HC_SENTINEL before a call, and must still hold it after.
 */
#ifndef BEAMMOE_HARNESS_CASE_H
#define BEAMMOE_HARNESS_CASE_H

#include "util.h"

#define HC_SENTINEL ((uint16_t)0xFFC1) /* a NaN the library never writes */

typedef enum hc_op { HC_FINALIZE = 0, HC_NRN = 1, HC_FUSED = 2 } hc_op;

/* norm choice of a case */
enum { HC_NORM_OFF = 0, HC_NORM_PLAIN = 1, HC_NORM_WEIGHT = 2 };

typedef struct hc_spec {
    int32_t K, H;
    int64_t T;   /* live rows */
    int64_t pad; /* NaN rows past them: capacity = T + pad */
    int post, pre, next; /* HC_NORM_* */
    int scales;          /* pass scales (else NULL) */
    int rs_one;          /* routed_scale 1 (else a random scale) */
    int inplace;         /* hidden_out == residual */
    int misalign;        /* bases 2 (BF16) / 4 (FP32) bytes off 16 */
    int exotic;          /* sprinkle subnormals, infinities, NaNs, zeros */
} hc_spec;

/* The tool's input patterns (docs/numerics.md#special-values), one per
 * generated row. */
typedef enum hc_mode {
    HC_MODE_NORMAL = 0, /* moderate random values                          */
    HC_MODE_NAN,        /* a few NaNs (several payloads) in every kind of input */
    HC_MODE_INF,        /* +-inf, and zero weights so inf * 0 = NaN happens */
    HC_MODE_ZERO,       /* signed zeros everywhere: all-zero rows for the norm */
    HC_MODE_SUBNORMAL,  /* BF16 subnormals, FP32-subnormal products           */
    HC_MODE_TIES,       /* powers of two: sums land on BF16 rounding ties   */
    HC_MODE_HUGE,       /* near BF16 max: sums and squares overflow          */
    HC_MODE_MIXED,      /* each row picks one of the above                  */
    HC_MODE_COUNT
} hc_mode;

typedef struct hc_case {
    hc_spec s;
    int64_t cap;
    uint16_t *experts; /* [cap, K, H] */
    float *weights;    /* [cap, K] */
    uint16_t *x;       /* [cap, H] */
    uint16_t *residual;/* [cap, H] */
    uint16_t *wpost, *wpre, *wnext; /* [H] */
    float scales[2];
    float rs;
    nr_norm post, pre, next; /* weight: the w* array or NULL */
} hc_case;

/* The sweep of the suite (the CPU tests and the CUDA test run it): case i of
 * top_k 1,2,6,8,32 x hidden 256,2048,4096,7168,8192 x tokens 0,1,7,100;
 * the other axes rotate with i so each value of each axis appears. */
#define HC_SWEEP_SIZE 100
hc_spec hc_sweep_spec(int i);

/* The suite's generator: the same (spec, seed) gives the same bits (the
 * golden digests pin it). */
void hc_make(hc_case *c, const hc_spec *s, uint64_t seed);
/* The tool's generator: every live row of the inputs op reads in pattern
 * `mode` (x for nrn, experts and weights otherwise, residual unless
 * finalize), NaN rows past them; the norm weights of s are drawn always;
 * eps of every norm. Sizes may be negative (the library rejects them:
 * nothing is allocated for them). 0, or -1 when out of memory. */
int hc_make_mode(hc_case *c, hc_op op, const hc_spec *s, float rs, const float scales[2],
                 float eps, hc_mode mode, uint64_t seed);
void hc_free(hc_case *c);

const char *hc_op_name(hc_op op);
const char *hc_mode_name(hc_mode m);
/* One-line description of a case for failure messages. */
void hc_describe(const hc_spec *s, char *buf, size_t n);
/* 1 when op writes normalized */
int hc_has_normalized(const hc_case *c, hc_op op);

/* ---- the gather over R ranks (docs/numerics.md#gather) ----
 * Rank r of R owns L = ceil(T / R) tokens from global row r * L, and passes
 * the case's expert rows from there with capacity cap - (R - 1) * L (the
 * same on every rank: what the last one has room for). hc_make_gather's
 * case (the suite's generator) holds T live rows and NaN rows up to
 * R * L + s->pad, so that every rank has L + s->pad rows, NaN past the
 * live ones. A call with fewer tokens T' takes the same arrays: the result
 * is the first T' rows of the one for T. */
void hc_make_gather(hc_case *c, const hc_spec *s, int R, uint64_t seed);
/* nr_gather over the rank slices of a call with T tokens (at most the
 * case's): hidden and (with a next norm) normalized, [T, H]. */
void hc_gather_ref(const hc_case *c, int R, int64_t T, uint16_t *hidden, uint16_t *normalized);

/* ---- outputs ---- */
typedef struct hc_out {
    int64_t rows; /* live rows + guard rows */
    int32_t H;
    uint16_t *hidden;     /* finalize: its output */
    uint16_t *normalized; /* also without a next norm: must stay untouched */
} hc_out;

int hc_out_make(hc_out *o, const hc_case *c, int guard_rows); /* 0, or -1 out of memory */
void hc_out_free(hc_out *o);
/* Every element op writes or must leave alone (guard rows included) into cmp. */
void hc_out_compare(const hc_out *got, const hc_out *want, hc_op op, hu_cmp *cmp);
/* 1 when the guard rows, and normalized where op gives none, hold HC_SENTINEL. */
int hc_out_untouched(const hc_out *o, const hc_case *c, hc_op op);
/* FNV-1a 64 of the live rows op writes (little-endian bytes). */
uint64_t hc_out_checksum(const hc_out *o, const hc_case *c, hc_op op);

/* The naive reference into o (whose guard rows it leaves alone). */
void hc_reference(const hc_case *c, hc_op op, hc_out *o);

/* ---- one call on the memory of a backend ---- */
typedef struct hc_bound {
    const hc_case *c;
    hc_op op;
    hc_out *o;
    unsigned how;
    const uint16_t *experts, *x, *residual;
    const float *weights;
    beam_norm post, pre, next;
    const beam_norm *post_p, *pre_p, *next_p;
    uint16_t *hidden, *normalized;
    const float *scales;
    void *blocks[12]; /* what hc_unbind frees */
    size_t sizes[12]; /* their bytes (HC_FENCED) */
    int nblocks;
} hc_bound;

/* How a call lays out its buffers (or'ed): */
enum {
    HC_DEVICE = 1,   /* device memory through harness/devmem.h (dev_open done) */
    HC_INPLACE = 2,  /* hidden_out is the residual buffer (nrn, fused) */
    HC_MISALIGN = 4, /* bases 2 (BF16) / 4 (FP32) bytes off 16 */
    HC_FENCED = 8    /* host: every array (scales too) ends where an
                      * inaccessible page begins (hu_alloc_fenced) */
};
/* The layout a spec asks for (inplace, misalign). */
unsigned hc_how(const hc_spec *s);

/* Resets o and lays the case out for one call: host memory (the case's own
 * arrays, or misaligned or fenced copies), or device memory. In place: hidden starts
 * as the residual. 0, or -1 with a message in err. */
int hc_bind(hc_bound *b, const hc_case *c, hc_op op, hc_out *o, unsigned how, char *err,
            size_t errn);
/* One call through a backend's table (strategy: HC_FUSED only). */
beam_status hc_call(const beam_ops *ops, const hc_bound *b, beam_strategy strategy, void *stream);
/* Wait for the work (device) and copy the outputs back into o. 0, or -1. */
int hc_finish(hc_bound *b, char *err, size_t errn);
void hc_unbind(hc_bound *b);

/* bind, call, finish, unbind: the library's status, or BEAM_ERR_DEVICE /
 * BEAM_ERR_OUT_OF_MEMORY for the harness's own memory, with err set. */
beam_status hc_run(const beam_ops *ops, const hc_case *c, hc_op op, beam_strategy strategy, unsigned how,
                   hc_out *o, char *err, size_t errn);

/* The table of the backend that runs the calls now (beam_backend_ops(NULL));
 * exits with a message when there is none. */
const beam_ops *hc_ops(void);

/* The tests' shorthand: run on host memory laid out as the spec asks
 * (through hc_ops()), and
 * hand back the live rows; *untouched as hc_out_untouched. */
beam_status hc_lib(const hc_case *c, hc_op op, beam_strategy strategy, uint16_t *hidden,
                   uint16_t *normalized, int *untouched);
/* The reference's live rows, the same way. */
void hc_ref(const hc_case *c, hc_op op, uint16_t *hidden, uint16_t *normalized);

/* ---- exhaustive checks of a rounding conversion (tests/test_fp8.c, test_fp4.c) ----
 * hc_code_intervals: the intervals [lo[k], lo[k+1]) of magnitude patterns
 * of the codes k < n of model (hu_code_starts; lo[n] just past +infinity),
 * each checked at both ends and just before it; the number of wrong ends
 * (inline: those tests link no library that case.c needs).
 * HC_CODE_SWEEP(name, code) defines `static long name(lo, n, sign, nan,
 * what)`: code(u) on every FP32 pattern u, against the intervals for both
 * signs (sign or'ed into the negative ones' codes), and nan on every NaN;
 * the number of intervals that miss, the first five printed. Its count has
 * no branch and code must inline, so that the compiler vectorizes it
 * (cloned on x86-64 GCC for the instruction sets of cpu/quant.c's loops):
 * a few seconds for all 2^32 patterns. */
static inline long hc_code_intervals(unsigned (*model)(uint32_t), int n, uint32_t *lo)
{
    long bad = 0;
    int k;
    hu_code_starts(model, n, 0x7F800000u, lo);
    lo[n] = 0x7F800001u;
    for (k = 0; k < n; k++) {
        bad += model(lo[k]) != (unsigned)k || model(lo[k + 1] - 1) != (unsigned)k || lo[k + 1] <= lo[k];
        if (k > 0) bad += model(lo[k] - 1) != (unsigned)k - 1;
    }
    return bad;
}
#if defined(__GNUC__) && __GNUC__ >= 11 && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define HC_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define HC_CLONES
#endif
#define HC_CODE_SWEEP(name, code)                                                                  \
    HC_CLONES static long name##_misses(uint32_t u, uint32_t hi, uint8_t c)                        \
    {                                                                                              \
        long bad = 0;                                                                              \
        for (;;) { /* blocks of 2^16: the loop's count and misses are ints */                      \
            const uint32_t end = hi - u > 0xFFFFu ? u + 0xFFFFu : hi;                              \
            const int n = (int)(end - u) + 1;                                                      \
            int i, nb = 0;                                                                         \
            for (i = 0; i < n; i++) nb += code(u + (uint32_t)i) != c;                              \
            bad += nb;                                                                             \
            if (end == hi) return bad;                                                             \
            u = end + 1;                                                                           \
        }                                                                                          \
    }                                                                                              \
    static long name(const uint32_t *lo, int n, unsigned sign, unsigned nan, const char *what)     \
    {                                                                                              \
        long bad = 0, m;                                                                           \
        int k, neg;                                                                                \
        for (neg = 0; neg < 2; neg++) {                                                            \
            const uint32_t s = neg ? 0x80000000u : 0u;                                             \
            for (k = 0; k < n; k++) {                                                              \
                const unsigned c = (unsigned)k | (neg ? sign : 0u);                                \
                if ((m = name##_misses(s | lo[k], s | (lo[k + 1] - 1), (uint8_t)c)) && bad++ < 5)  \
                    fprintf(stderr, "  %s: code 0x%02x, %ld patterns miss\n", what, c, m);         \
            }                                                                                      \
            if (name##_misses(s | 0x7F800001u, s | 0x7FFFFFFFu, (uint8_t)nan) && bad++ < 5)        \
                fprintf(stderr, "  %s: a NaN (sign %d) is not 0x%02x\n", what, neg, nan);          \
        }                                                                                          \
        return bad;                                                                                \
    }

#endif
