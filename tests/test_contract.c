/*
 * test_contract.c - every rule of docs/contract.md, for each local function.
 *
 * Each violation must return the right status, leave a message that names
 * the function ("fn:") and the argument, and change no byte anywhere: all
 * buffers of a call live in one arena that is compared byte for byte with a
 * copy taken before the call (inputs and poisoned outputs alike). Overlaps
 * are built inside the arena.
 *
 * Links the dispatcher (backend "cpu"). The gather's contract is in
 * test_group.c (it needs a group of ranks).
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>

#include "suite.h"

#define K 2
#define H 256
#define T 3
#define CAP 4

/* Arena offsets in bytes; every array 16-byte aligned. */
enum {
    OFF_EX = 0,                      /* [CAP, K, H] BF16: 4096 bytes */
    OFF_WT = OFF_EX + CAP * K * H * 2, /* [CAP, K] FP32: 32 bytes */
    OFF_X = OFF_WT + 64,             /* [T, H] BF16: 1536 */
    OFF_RES = OFF_X + T * H * 2,
    OFF_OUT = OFF_RES + T * H * 2,   /* output / hidden_out */
    OFF_NRM = OFF_OUT + T * H * 2 + 2048,
    OFF_WPOST = OFF_NRM + T * H * 2 + 2048,
    OFF_WPRE = OFF_WPOST + H * 2,
    OFF_WNEXT = OFF_WPRE + H * 2,
    OFF_SC = OFF_WNEXT + H * 2,
    ARENA = OFF_SC + 64
};

static unsigned char *g_arena, *g_copy;

#define AT(off) ((void *)(g_arena + (off)))

typedef enum fnid { F_FIN, F_NRN, F_FUSED } fnid;

typedef struct call {
    fnid fn;
    const uint16_t *ex;
    const float *wt;
    int64_t cap, live;
    int32_t k, h;
    float rs;
    beam_norm post_v, pre_v, next_v;
    int has_post, has_pre, has_next;
    const float *scales;
    const uint16_t *x, *res;
    uint16_t *out, *nrm;
    beam_strategy strat;
} call;

static const char *FN_NAME[3] = {"beam_moe_finalize:", "beam_norm_residual_norm:",
                                 "beam_moe_finalize_norm_residual_norm:"};

static void arena_reset(void)
{
    hu_rng r;
    size_t i;
    hu_rng_init(&r, 99);
    hu_fill_bf16(&r, (uint16_t *)AT(OFF_EX), (size_t)CAP * K * H);
    hu_fill_weight(&r, (float *)AT(OFF_WT), (size_t)CAP * K);
    hu_fill_bf16(&r, (uint16_t *)AT(OFF_X), (size_t)T * H);
    hu_fill_bf16(&r, (uint16_t *)AT(OFF_RES), (size_t)T * H);
    hu_poison(AT(OFF_OUT), (size_t)T * H * 2 + 2048);
    hu_poison(AT(OFF_NRM), (size_t)T * H * 2 + 2048);
    for (i = 0; i < H; i++) {
        ((uint16_t *)AT(OFF_WPOST))[i] = hu_rand_norm_weight(&r);
        ((uint16_t *)AT(OFF_WPRE))[i] = hu_rand_norm_weight(&r);
        ((uint16_t *)AT(OFF_WNEXT))[i] = hu_rand_norm_weight(&r);
    }
    ((float *)AT(OFF_SC))[0] = 0.5f;
    ((float *)AT(OFF_SC))[1] = 2.0f;
}

/* A valid call of fn with every optional part present. */
static call base(fnid fn)
{
    call c;
    memset(&c, 0, sizeof c);
    c.fn = fn;
    c.ex = (const uint16_t *)AT(OFF_EX);
    c.wt = (const float *)AT(OFF_WT);
    c.cap = CAP;
    c.live = T;
    c.k = K;
    c.h = H;
    c.rs = 2.5f;
    c.post_v.weight = (const uint16_t *)AT(OFF_WPOST);
    c.post_v.eps = 1e-6f;
    c.pre_v.weight = (const uint16_t *)AT(OFF_WPRE);
    c.pre_v.eps = 1e-6f;
    c.next_v.weight = (const uint16_t *)AT(OFF_WNEXT);
    c.next_v.eps = 1e-6f;
    c.has_post = fn != F_NRN;
    c.has_pre = fn == F_NRN;
    c.has_next = fn != F_FIN;
    c.scales = fn != F_FIN ? (const float *)AT(OFF_SC) : NULL;
    c.x = (const uint16_t *)AT(OFF_X);
    c.res = (const uint16_t *)AT(OFF_RES);
    c.out = (uint16_t *)AT(OFF_OUT);
    c.nrm = fn != F_FIN ? (uint16_t *)AT(OFF_NRM) : NULL;
    c.strat = BEAM_STRATEGY_AUTO;
    return c;
}

static beam_status invoke(const call *c)
{
    const beam_norm *post = c->has_post ? &c->post_v : NULL;
    const beam_norm *pre = c->has_pre ? &c->pre_v : NULL;
    const beam_norm *next = c->has_next ? &c->next_v : NULL;
    switch (c->fn) {
    case F_FIN:
        return beam_moe_finalize(c->ex, c->wt, c->cap, c->live, c->k, c->h, c->rs, post, c->out,
                                 NULL);
    case F_NRN:
        return beam_norm_residual_norm(c->x, c->res, c->live, c->h, pre, c->scales, next, c->out,
                                       c->nrm, NULL);
    case F_FUSED:
        return beam_moe_finalize_norm_residual_norm(c->ex, c->wt, c->cap, c->live, c->k, c->h,
                                                    c->rs, post, c->res, c->scales, next, c->out,
                                                    c->nrm, c->strat, NULL);
    }
    return BEAM_OK;
}

static int g_bad_count;

static void expect_bad_(int line, call c, const char *arg)
{
    beam_status st;
    const char *msg;
    arena_reset();
    memcpy(g_copy, g_arena, ARENA);
    st = invoke(&c);
    msg = beam_last_error();
    g_bad_count++;
    CU_ASSERT_EQUAL(st, BEAM_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(msg);
    if (!msg)
        return;
    CU_ASSERT_PTR_NOT_NULL(strstr(msg, FN_NAME[c.fn]));
    CU_ASSERT_PTR_NOT_NULL(strstr(msg, arg));
    CU_ASSERT(memcmp(g_copy, g_arena, ARENA) == 0);
    if (st != BEAM_ERR_INVALID_ARGUMENT || !strstr(msg, FN_NAME[c.fn]) || !strstr(msg, arg) ||
        memcmp(g_copy, g_arena, ARENA) != 0)
        fprintf(stderr, "line %d: %s want error naming '%s': status %d, message \"%s\"%s\n", line,
                FN_NAME[c.fn], arg, (int)st, msg,
                memcmp(g_copy, g_arena, ARENA) ? ", and memory changed" : "");
}
#define expect_bad(c, arg) expect_bad_(__LINE__, (c), (arg))

static void expect_ok_(int line, call c)
{
    beam_status st;
    arena_reset();
    st = invoke(&c);
    CU_ASSERT_EQUAL(st, BEAM_OK);
    if (st != BEAM_OK)
        fprintf(stderr, "line %d: %s want OK: status %d, %s\n", line, FN_NAME[c.fn], (int)st,
                beam_last_error());
}
#define expect_ok(c) expect_ok_(__LINE__, (c))
/* fn's valid call with `change` made to it (statements on c): must fail
 * naming arg, or succeed (in a function with fnid fn and call c). */
#define BAD(change, arg) do { c = base(fn); change; expect_bad(c, arg); } while (0)
#define OK(change) do { c = base(fn); change; expect_ok(c); } while (0)

static float g_nan, g_inf; /* set in main from their bits */

/* ---- rules shared by the ops that take experts (finalize, fused) ------ */
static void expert_rules(fnid fn)
{
    const char *out = fn == F_FIN ? "output" : "hidden_out";
    call c;
    int i;
    static const int32_t bad_k[] = {0, -1, 33, 64, INT32_MIN};
    static const int32_t bad_h[] = {0, 128, 255, 300, 1000, 8448, 16384, -256, 8192 + 256};

    expect_ok(base(fn));
    for (i = 0; i < (int)(sizeof bad_k / sizeof bad_k[0]); i++)
        BAD(c.k = bad_k[i], "top_k");
    for (i = 0; i < (int)(sizeof bad_h / sizeof bad_h[0]); i++)
        BAD(c.h = bad_h[i], "hidden");
    /* 0 <= live_tokens <= capacity */
    BAD(c.live = -1, "live_tokens");
    BAD(c.cap = 2, "capacity");
    BAD((c.cap = -1, c.live = 0), "capacity");
    if (fn == F_FIN)
        OK((c.live = CAP, c.cap = CAP)); /* live == capacity is fine */
    /* required pointers */
    BAD(c.ex = NULL, "expert_outputs");
    BAD(c.wt = NULL, "expert_weights");
    BAD(c.out = NULL, out);
    /* alignment: BF16 2 bytes, FP32 4 bytes */
    BAD(c.ex = (const uint16_t *)((const char *)c.ex + 1), "expert_outputs");
    BAD(c.wt = (const float *)((const char *)c.wt + 2), "expert_weights");
    BAD(c.wt = (const float *)((const char *)c.wt + 1), "expert_weights");
    BAD(c.out = (uint16_t *)((char *)c.out + 1), out);
    BAD(c.post_v.weight = (const uint16_t *)((const char *)c.post_v.weight + 1), "post_norm");
    /* eps finite and >= 0; routed_scale finite */
    for (i = 0; i < 4; i++) {
        float bad = i == 0 ? g_nan : i == 1 ? g_inf : i == 2 ? -g_inf : -1e-6f;
        BAD(c.post_v.eps = bad, "post_norm");
        if (i < 3)
            BAD(c.rs = bad, "routed_scale");
    }
    OK(c.post_v.eps = -0.0f); /* -0 >= 0 */
    OK(c.post_v.weight = NULL); /* no affine step: fine */
    OK(c.rs = -3.0f); /* any finite scale */
    /* outputs must not overlap inputs */
    BAD(c.out = (uint16_t *)AT(OFF_EX), out);
    BAD(c.out = (uint16_t *)AT(OFF_EX + 256), out); /* inside the first live row */
    /* one live row: experts [0, 1024), weights [OFF_WT, +8); a one-row
     * output [OFF_WT + 16 - 512, OFF_WT + 16) hits only the weights */
    BAD((c.cap = 1, c.live = 1, c.out = (uint16_t *)AT(OFF_WT + 16 - 2 * H)), out);
    BAD(c.out = (uint16_t *)AT(OFF_WPOST - 2 * H * T + 2), out); /* last row hits post weight */
}

/* ---- rules of the residual part (norm_residual_norm, fused) ----------- */
static void residual_rules(fnid fn)
{
    call c;
    int i;
    const char *outname = "hidden_out";
    if (fn == F_NRN) {
        static const int32_t bad_h[] = {0, 128, 300, 8448, -256};
        expect_ok(base(fn));
        for (i = 0; i < 5; i++)
            BAD(c.h = bad_h[i], "hidden");
        BAD(c.live = -1, "tokens");
        BAD(c.x = NULL, "x");
        BAD(c.x = (const uint16_t *)((const char *)c.x + 1), "x");
        BAD(c.pre_v.weight = (const uint16_t *)((const char *)c.pre_v.weight + 1), "pre_norm");
        for (i = 0; i < 4; i++)
            BAD(c.pre_v.eps = i == 0 ? g_nan : i == 1 ? g_inf : i == 2 ? -g_inf : -1.0f, "pre_norm");
        BAD(c.out = NULL, outname);
        BAD(c.out = (uint16_t *)((char *)c.out + 1), outname);
        /* hidden_out must not overlap x */
        BAD(c.out = (uint16_t *)AT(OFF_X), outname);
        BAD(c.nrm = (uint16_t *)AT(OFF_X + 2), "normalized");
        BAD(c.out = (uint16_t *)AT(OFF_WPRE - 2 * H * T + 2), outname); /* hits pre weight */
    }
    /* residual: required, aligned */
    BAD(c.res = NULL, "residual");
    BAD(c.res = (const uint16_t *)((const char *)c.res + 1), "residual");
    /* normalized non-NULL exactly when next_norm is given */
    BAD(c.nrm = NULL, "normalized");
    BAD(c.has_next = 0, "normalized");
    OK((c.has_next = 0, c.nrm = NULL));
    BAD(c.nrm = (uint16_t *)((char *)c.nrm + 1), "normalized");
    BAD(c.next_v.weight = (const uint16_t *)((const char *)c.next_v.weight + 1), "next_norm");
    for (i = 0; i < 4; i++)
        BAD(c.next_v.eps = i == 0 ? g_nan : i == 1 ? g_inf : i == 2 ? -g_inf : -1.0f, "next_norm");
    /* scales finite; scales misaligned */
    for (i = 0; i < 4; i++) {
        static float bad[2];
        bad[0] = 1.0f;
        bad[1] = 1.0f;
        bad[i % 2] = i < 2 ? g_nan : i == 2 ? g_inf : -g_inf;
        BAD(c.scales = bad, "scales"); /* scales[0] NaN, [1] NaN, [0] inf, [1] -inf */
    }
    {
        /* FP32 pointer: 4-byte aligned (the values themselves are fine) */
        static float sc_bytes[4];
        float one = 1.0f;
        memcpy((char *)sc_bytes + 2, &one, sizeof one);
        memcpy((char *)sc_bytes + 6, &one, sizeof one);
        BAD(c.scales = (const float *)(const void *)((const char *)sc_bytes + 2), "scales");
    }
    OK(c.scales = NULL);
    /* in place: hidden_out == residual exactly is fine */
    OK(c.out = (uint16_t *)AT(OFF_RES));
    /* a partial overlap of hidden_out and residual is not */
    BAD(c.out = (uint16_t *)AT(OFF_RES + 2), outname);
    BAD(c.out = (uint16_t *)AT(OFF_RES - 2 * H), outname);
    /* normalized must not be the residual, in place or not */
    BAD(c.nrm = (uint16_t *)AT(OFF_RES), "normalized");
    BAD((c.out = (uint16_t *)AT(OFF_RES), c.nrm = (uint16_t *)AT(OFF_RES)), "normalized");
    /* outputs must not overlap each other */
    BAD(c.nrm = c.out, "normalized");
    BAD(c.nrm = c.out + H, "normalized"); /* second row of hidden_out */
    /* normalized must not overlap a norm weight */
    BAD(c.nrm = (uint16_t *)AT(OFF_WNEXT - 2 * H * T + 2), "normalized");
    /* strategies of the local op: AUTO, FUSED, UNFUSED only */
    if (fn == F_FUSED) {
        static const beam_strategy bad_s[4] = {BEAM_STRATEGY_ONESHOT, BEAM_STRATEGY_TWOSHOT,
                                               (beam_strategy)99, (beam_strategy)-1};
        for (i = 0; i < 4; i++)
            BAD(c.strat = bad_s[i], "strategy");
        OK(c.strat = BEAM_STRATEGY_FUSED);
        OK(c.strat = BEAM_STRATEGY_UNFUSED);
        /* normalized overlapping expert data */
        BAD(c.nrm = (uint16_t *)AT(OFF_EX + 2), "normalized");
    }
}

static void test_finalize(void)
{
    expert_rules(F_FIN);
}

static void test_nrn(void)
{
    residual_rules(F_NRN);
}

static void test_fused(void)
{
    expert_rules(F_FUSED);
    residual_rules(F_FUSED);
}

/* tokens == 0 / live_tokens == 0: valid, nothing written, even where the
 * other arguments would matter for a real row. */
static void test_empty(void)
{
    call c;
    int fn;
    for (fn = 0; fn < 3; fn++) {
        c = base((fnid)fn);
        c.live = 0;
        arena_reset();
        memcpy(g_copy, g_arena, ARENA);
        CU_ASSERT_EQUAL(invoke(&c), BEAM_OK);
        CU_ASSERT(memcmp(g_copy, g_arena, ARENA) == 0);
        /* an invalid top_k is still an error with no rows */
        c.k = 0;
        if (fn != F_NRN)
            expect_bad(c, "top_k");
    }
}

/* The message is per thread: another thread's failure does not show here,
 * and this thread's failure does not show there. */
static char g_other_msg[512];
static void *fail_in_thread(void *p)
{
    (void)p;
    beam_moe_finalize(NULL, NULL, 1, 1, 99, 256, 1.0f, NULL, NULL, NULL); /* top_k */
    snprintf(g_other_msg, sizeof g_other_msg, "%s", beam_last_error());
    return NULL;
}

static void test_thread_local_message(void)
{
    call c = base(F_FIN);
    pthread_t th;
    char mine[512];
    c.h = 300;
    arena_reset();
    CU_ASSERT_EQUAL(invoke(&c), BEAM_ERR_INVALID_ARGUMENT);
    snprintf(mine, sizeof mine, "%s", beam_last_error());
    CU_ASSERT_PTR_NOT_NULL(strstr(mine, "hidden"));
    CU_ASSERT_EQUAL(pthread_create(&th, NULL, fail_in_thread, NULL), 0);
    pthread_join(th, NULL);
    CU_ASSERT_PTR_NOT_NULL(strstr(g_other_msg, "top_k"));
    CU_ASSERT_PTR_NULL(strstr(g_other_msg, "hidden"));
    CU_ASSERT_STRING_EQUAL(beam_last_error(), mine);
}

/* Status strings: fixed, distinct, never NULL. */
static void test_status_strings(void)
{
    int i, j;
    for (i = 0; i <= 5; i++) {
        const char *a = beam_status_string((beam_status)i);
        CU_ASSERT_PTR_NOT_NULL(a);
        if (!a)
            continue;
        CU_ASSERT(strlen(a) > 0);
        for (j = 0; j < i; j++) {
            const char *b = beam_status_string((beam_status)j);
            if (b)
                CU_ASSERT(strcmp(a, b) != 0);
        }
    }
    CU_ASSERT_PTR_NOT_NULL(beam_status_string((beam_status)1234));
    CU_ASSERT_PTR_NOT_NULL(strstr(beam_status_string(BEAM_ERR_INVALID_ARGUMENT), "invalid"));
}

int main(void)
{
    static const suite_test tests[] = {{"beam_moe_finalize", test_finalize},
                                    {"beam_norm_residual_norm", test_nrn},
                                    {"beam_moe_finalize_norm_residual_norm", test_fused},
                                    {"empty calls", test_empty},
                                    {"status strings", test_status_strings},
                                    {"error message is per thread", test_thread_local_message},
                                    {NULL, NULL}};
    int rc;
    g_nan = hu_f32(0x7FC00000u);
    g_inf = hu_f32(0x7F800000u);
    g_arena = (unsigned char *)hu_alloc(ARENA, 0);
    g_copy = (unsigned char *)hu_alloc(ARENA, 0);
    if (beam_set_backend("cpu") != BEAM_OK) {
        fprintf(stderr, "beam_set_backend(cpu): %s\n", beam_last_error());
        return 1;
    }
    rc = suite_run("contract", tests);
    fprintf(stderr, "contract: %d violations checked\n", g_bad_count);
    hu_free(g_arena);
    hu_free(g_copy);
    return rc;
}
