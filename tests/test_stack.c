/*
 * test_stack.c - the CPU backend on small thread stacks.
 *
 * A library runs on its callers' threads, whose stacks may be small: every
 * call below runs on a thread created with a 16 KiB stack, and the OpenMP
 * worker threads get 16 KiB too (OMP_STACKSIZE=16K: the program runs itself
 * again with it set, since the runtime reads it once at load). The shapes are
 * the numerics sweep's (top_k 1..32, hidden 256..8192, tokens 1, 7, 100),
 * every op and local strategy, and the quantized calls (*_q) in every form
 * of harness/quant_model.h, on 1, 2 and 3 OpenMP threads, plus the CPU
 * group's gather, plain and quantized, with its ranks on 16 KiB stacks; every
 * result must equal the naive reference and the quantization model
 * (computed on the main thread). A kernel that keeps rows of `hidden` values
 * on the stack dies here with SIGSEGV.
 *
 * Links libbeammoe_cpu directly.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <omp.h>

#include <CUnit/Basic.h>

#include "quant_model.h"
#include "suite.h"


/* SMALL_STACK_KIB, or the smallest stack the platform allows where that is
 * more (128 KiB on aarch64 Linux, for pthreads and libgomp alike) */
static size_t small_stack(void)
{
    const long min = sysconf(_SC_THREAD_STACK_MIN);
    return min > SMALL_STACK_KIB * 1024 ? (size_t)min : (size_t)SMALL_STACK_KIB * 1024;
}
#define SMALL_STACK small_stack()

static uint64_t g_seed;

/* Run fn(arg) on a new thread with a small stack and wait for it. */
static int on_small_stack(void *(*fn)(void *), void *arg)
{
    pthread_attr_t at;
    pthread_t th;
    int rc;
    pthread_attr_init(&at);
    rc = pthread_attr_setstacksize(&at, SMALL_STACK);
    if (rc == 0) rc = pthread_create(&th, &at, fn, arg);
    pthread_attr_destroy(&at);
    if (rc != 0) {
        fprintf(stderr, "cannot start a thread with a %zu-byte stack (error %d)\n", SMALL_STACK, rc);
        return 0;
    }
    pthread_join(th, NULL);
    return 1;
}

/* ---- local ops ------------------------------------------------------------ */

/* The quantized calls: norm_residual_norm_q and
 * moe_finalize_norm_residual_norm_q, each form of qm_forms, normalized not
 * kept (the path that quantizes from a row of scratch). */
#define NQOPS 2

typedef struct local_job {
    const hc_case *d;
    const uint16_t *ref_h[3], *ref_n[3]; /* per op */
    uint16_t *got_h, *got_n;
    int index;                            /* the case's */
    beam_quant q[QM_NFORMS];              /* unbound forms */
    uint8_t *ref_v[NQOPS][QM_NFORMS];     /* the model's values and scales */
    float *ref_s[NQOPS][QM_NFORMS];
    uint8_t *got_v;
    float *got_s;
    int calls, failed;                   /* filled by the thread */
    char first[400];
} local_job;

/* The cases that also run the quantized calls: a next norm, and up to 7
 * rows (enough for a team of 3 threads at every hidden size; the model's
 * search per value makes 100 rows slow). */
static int quantized(const hc_spec *s)
{
    return s->next != HC_NORM_OFF && s->T <= 7;
}

/* The *_q calls of one case against the model (x, experts, residual as
 * the case holds them; hidden into got_h, compared with the plain op's). */
static void quant_calls(local_job *j, int ti, int threads)
{
    const hc_case *d = j->d;
    const hc_spec *s = &d->s;
    const size_t TH = (size_t)s->T * (size_t)s->H;
    beam_norm pre, post, next;
    int f, op;
    for (f = 0; f < QM_NFORMS; f++)
        for (op = 0; op < NQOPS; op++) {
            beam_quant q = j->q[f];
            if ((f + j->index) % 3 != ti) continue; /* each form on one thread count a case, in rotation */
            const size_t nv = qm_values_bytes(&q, s->T, s->H), ns = qm_scale_floats(&q, s->T, s->H);
            beam_status st;
            int bad;
            memset(j->got_v, 0xA5, nv);
            memset(j->got_s, 0xA5, 4 * ns);
            qm_bind(&q, j->got_v, j->got_s);
            if (op == 0)
                st = beam_norm_residual_norm_q(d->x, d->residual, s->T, s->H, hu_beam_norm(&d->pre, &pre),
                                               s->scales ? d->scales : NULL, hu_beam_norm(&d->next, &next),
                                               j->got_h, NULL, &q, NULL);
            else
                st = beam_moe_finalize_norm_residual_norm_q(
                    d->experts, d->weights, d->cap, s->T, s->K, s->H, d->rs, hu_beam_norm(&d->post, &post),
                    d->residual, s->scales ? d->scales : NULL, hu_beam_norm(&d->next, &next), j->got_h, NULL,
                    &q, BEAM_STRATEGY_AUTO, NULL);
            bad = st != BEAM_OK || memcmp(j->got_h, j->ref_h[op + 1], 2 * TH) != 0 ||
                  memcmp(j->got_v, j->ref_v[op][f], nv) != 0 || memcmp(j->got_s, j->ref_s[op][f], 4 * ns) != 0;
            j->calls++;
            if (bad && !j->failed++)
                snprintf(j->first, sizeof j->first, "%s_q form=%d (kind %d) threads=%d status=%d",
                         op == 0 ? "norm_residual_norm" : "moe_finalize_norm_residual_norm", f, (int)q.kind,
                         threads, (int)st);
        }
}

static void *local_main(void *p)
{
    static const beam_strategy strats[3] = {BEAM_STRATEGY_AUTO, BEAM_STRATEGY_FUSED,
                                            BEAM_STRATEGY_UNFUSED};
    static const int threads[3] = {1, 2, 3};
    local_job *j = (local_job *)p;
    const size_t TH = (size_t)j->d->s.T * (size_t)j->d->s.H;
    int op, k, ti;
    for (ti = 0; ti < 3; ti++) {
        omp_set_num_threads(threads[ti]); /* this thread's own setting */
        for (op = 0; op < 3; op++)
            for (k = 0; k < (op == HC_FUSED ? 3 : 1); k++) {
                int guard_ok = 0, bad;
                beam_status st = hc_lib(j->d, (hc_op)op, strats[k], j->got_h, j->got_n, &guard_ok);
                bad = st != BEAM_OK || !guard_ok ||
                      memcmp(j->got_h, j->ref_h[op], 2 * TH) != 0 ||
                      (hc_has_normalized(j->d, (hc_op)op) && memcmp(j->got_n, j->ref_n[op], 2 * TH) != 0);
                j->calls++;
                if (bad && !j->failed++)
                    snprintf(j->first, sizeof j->first, "op=%d strategy=%d threads=%d status=%d guard=%d",
                             op, (int)strats[k], threads[ti], (int)st, guard_ok);
            }
        if (quantized(&j->d->s)) quant_calls(j, ti, threads[ti]);
    }
    return NULL;
}

/* make (1) or free (0) the model's outputs of j's case for every form, from
 * the reference's normalized rows of nrn and of the fused op; the outputs'
 * arrays too. The model leaves padding alone: both sides start as 0xA5. */
static void quant_refs(local_job *j, int make)
{
    const hc_spec *s = &j->d->s;
    size_t most_v = 0, most_s = 0;
    int f, op;
    qm_forms(j->q, s->T);
    for (f = 0; f < QM_NFORMS; f++)
        for (op = 0; op < NQOPS; op++) {
            const size_t nv = qm_values_bytes(&j->q[f], s->T, s->H), ns = qm_scale_floats(&j->q[f], s->T, s->H);
            if (!make) {
                hu_free(j->ref_v[op][f]);
                hu_free(j->ref_s[op][f]);
                continue;
            }
            most_v = nv > most_v ? nv : most_v;
            most_s = ns > most_s ? ns : most_s;
            j->ref_v[op][f] = (uint8_t *)hu_alloc(nv + 1, 0);
            j->ref_s[op][f] = (float *)hu_alloc(4 * ns + 4, 0);
            memset(j->ref_v[op][f], 0xA5, nv);
            memset(j->ref_s[op][f], 0xA5, 4 * ns);
            if (quantized(s))
                qm_quant(&j->q[f], j->ref_n[op + 1], s->T, s->H, j->ref_v[op][f], j->ref_s[op][f]);
        }
    if (make) {
        j->got_v = (uint8_t *)hu_alloc(most_v + 1, 0);
        j->got_s = (float *)hu_alloc(4 * most_s + 4, 0);
    } else {
        hu_free(j->got_v);
        hu_free(j->got_s);
    }
}

static const int32_t KS[] = {1, 2, 6, 8, 32};
static const int32_t HS[] = {256, 2048, 4096, 7168, 8192};
static const int64_t TS[] = {1, 7, 100};

static void test_local_ops(void)
{
    const int nk = 5, nh = 5, nt = 3;
    int i, op, cases = 0, calls = 0;
    for (i = 0; i < nk * nh * nt; i++) {
        hc_spec s;
        hc_case d;
        local_job j;
        uint16_t *ref[6];
        size_t TH;
        char desc[256];
        memset(&s, 0, sizeof s);
        s.K = KS[i % nk];
        s.H = HS[(i / nk) % nh];
        s.T = TS[i / (nk * nh)];
        if (hu_quick() && (s.H > 2048 || s.T > 7)) continue;
        if (s.T == 100 && s.K > 8) continue; /* the biggest inputs add time, not coverage */
        /* norms on with weights in most cases (the widest scratch), the other
         * choices in rotation */
        s.post = i % 4 == 1 ? HC_NORM_PLAIN : i % 4 == 2 ? HC_NORM_OFF : HC_NORM_WEIGHT;
        s.pre = i % 3 == 1 ? HC_NORM_PLAIN : HC_NORM_WEIGHT;
        s.next = i % 5 == 4 ? HC_NORM_OFF : HC_NORM_WEIGHT;
        s.scales = i % 2;
        s.rs_one = i % 3 == 0;
        s.inplace = (i / 2) % 2;
        s.misalign = i % 7 == 3;
        s.pad = i % 2;
        hc_make(&d, &s, g_seed ^ (0x9E37ULL * (uint64_t)(i + 1)));
        hc_describe(&s, desc, sizeof desc);
        TH = (size_t)s.T * (size_t)s.H;
        memset(&j, 0, sizeof j);
        j.d = &d;
        j.index = i;
        for (op = 0; op < 3; op++) {
            ref[2 * op] = (uint16_t *)hu_alloc(2 * TH, 0);
            ref[2 * op + 1] = (uint16_t *)hu_alloc(2 * TH, 0);
            hc_ref(&d, (hc_op)op, ref[2 * op], ref[2 * op + 1]);
            j.ref_h[op] = ref[2 * op];
            j.ref_n[op] = ref[2 * op + 1];
        }
        j.got_h = (uint16_t *)hu_alloc(2 * TH, 0);
        j.got_n = (uint16_t *)hu_alloc(2 * TH, 0);
        quant_refs(&j, 1);
        CU_ASSERT_FATAL(on_small_stack(local_main, &j));
        if (j.failed) fprintf(stderr, "FAIL seed=%llu [%s]: %d of %d calls, first: %s\n",
                              (unsigned long long)g_seed, desc, j.failed, j.calls, j.first);
        CU_ASSERT_EQUAL(j.failed, 0);
        cases++;
        calls += j.calls;
        quant_refs(&j, 0);
        for (op = 0; op < 6; op++) hu_free(ref[op]);
        hu_free(j.got_h);
        hu_free(j.got_n);
        hc_free(&d);
    }
    fprintf(stderr, "  %d cases, %d calls on %zu-byte stacks\n", cases, calls, SMALL_STACK);
}

/* ---- the CPU group's gather --------------------------------------------- */

#define R 2

typedef struct gather_job {
    beam_cpu_group *g;
    int rank;
    const hc_case *d;
    beam_strategy strategy;
    uint16_t *hid, *nrm; /* [T, H] this rank's outputs */
    beam_quant q[QM_NFORMS]; /* bound to this rank's values and sbuf */
    float *sbuf[QM_NFORMS];
    beam_status st;
    char msg[300];
} gather_job;

static void *gather_main(void *p)
{
    gather_job *j = (gather_job *)p;
    const hc_spec *s = &j->d->s;
    const int64_t L = (s->T + R - 1) / R, start = (int64_t)j->rank * L;
    const size_t KH = (size_t)s->K * (size_t)s->H;
    beam_norm post, next;
    beam_workspace *ws = NULL;
    int f;
    omp_set_num_threads(2);
    j->st = beam_workspace_create_cpu(j->g, j->rank, s->T, s->H, NULL, &ws);
    if (j->st == BEAM_OK) {
        j->st = beam_moe_finalize_gather_norm_residual_norm(
            ws, j->d->experts + (size_t)start * KH, j->d->weights + (size_t)start * (size_t)s->K, L, s->T,
            s->K, s->H, j->d->rs, hu_beam_norm(&j->d->post, &post), j->d->residual, j->d->scales,
            hu_beam_norm(&j->d->next, &next), j->hid, j->nrm, j->strategy, NULL);
        for (f = 0; f < QM_NFORMS && j->st == BEAM_OK; f++)
            j->st = beam_moe_finalize_gather_norm_residual_norm_q(
                ws, j->d->experts + (size_t)start * KH, j->d->weights + (size_t)start * (size_t)s->K, L, s->T,
                s->K, s->H, j->d->rs, hu_beam_norm(&j->d->post, &post), j->d->residual, j->d->scales,
                hu_beam_norm(&j->d->next, &next), j->hid, NULL, &j->q[f], j->strategy, NULL);
        if (j->st != BEAM_OK) snprintf(j->msg, sizeof j->msg, "%s", beam_last_error());
        beam_workspace_destroy(ws);
    } else {
        snprintf(j->msg, sizeof j->msg, "%s", beam_last_error());
    }
    return NULL;
}

static void test_gather(void)
{
    static const beam_strategy strats[3] = {BEAM_STRATEGY_ONESHOT, BEAM_STRATEGY_TWOSHOT,
                                            BEAM_STRATEGY_UNFUSED};
    hc_spec s;
    hc_case d;
    size_t TH;
    uint16_t *ref_h, *ref_n;
    beam_quant forms[QM_NFORMS];
    uint8_t *ref_v[QM_NFORMS];
    float *ref_s[QM_NFORMS];
    size_t nv[QM_NFORMS], ns[QM_NFORMS];
    int k, r, f;

    memset(&s, 0, sizeof s);
    s.K = 8;
    s.H = 8192;
    s.T = 6;
    s.post = HC_NORM_WEIGHT;
    s.next = HC_NORM_WEIGHT;
    s.scales = 1;
    hc_make(&d, &s, g_seed + 99);
    TH = (size_t)s.T * (size_t)s.H;
    ref_h = (uint16_t *)hu_alloc(2 * TH, 0);
    ref_n = (uint16_t *)hu_alloc(2 * TH, 0);
    hc_ref(&d, HC_FUSED, ref_h, ref_n);
    qm_forms(forms, s.T);
    for (f = 0; f < QM_NFORMS; f++) {
        nv[f] = qm_values_bytes(&forms[f], s.T, s.H);
        ns[f] = qm_scale_floats(&forms[f], s.T, s.H);
        ref_v[f] = (uint8_t *)hu_alloc(nv[f] + 1, 0);
        ref_s[f] = (float *)hu_alloc(4 * ns[f] + 4, 0);
        memset(ref_v[f], 0xA5, nv[f]);
        memset(ref_s[f], 0xA5, 4 * ns[f]);
        qm_quant(&forms[f], ref_n, s.T, s.H, ref_v[f], ref_s[f]);
    }
    for (k = 0; k < 3; k++) {
        beam_cpu_group *g = NULL;
        gather_job jobs[R];
        pthread_t th[R];
        pthread_attr_t at;
        CU_ASSERT_EQUAL_FATAL(beam_cpu_group_create(R, &g), BEAM_OK);
        pthread_attr_init(&at);
        CU_ASSERT_EQUAL_FATAL(pthread_attr_setstacksize(&at, SMALL_STACK), 0);
        for (r = 0; r < R; r++) {
            memset(&jobs[r], 0, sizeof jobs[r]);
            jobs[r].g = g;
            jobs[r].rank = r;
            jobs[r].d = &d;
            jobs[r].strategy = strats[k];
            jobs[r].hid = (uint16_t *)hu_alloc(2 * TH, 0);
            jobs[r].nrm = (uint16_t *)hu_alloc(2 * TH, 0);
            for (f = 0; f < QM_NFORMS; f++) {
                uint8_t *v = (uint8_t *)hu_alloc(nv[f] + 1, 0);
                float *sc = (float *)hu_alloc(4 * ns[f] + 4, 0);
                memset(v, 0xA5, nv[f]);
                memset(sc, 0xA5, 4 * ns[f]);
                jobs[r].q[f] = forms[f];
                jobs[r].sbuf[f] = sc;
                qm_bind(&jobs[r].q[f], v, sc);
            }
            CU_ASSERT_EQUAL_FATAL(pthread_create(&th[r], &at, gather_main, &jobs[r]), 0);
        }
        pthread_attr_destroy(&at);
        for (r = 0; r < R; r++) pthread_join(th[r], NULL);
        for (r = 0; r < R; r++) {
            char label[120];
            snprintf(label, sizeof label, "seed=%llu gather strategy=%d rank=%d",
                     (unsigned long long)g_seed, (int)strats[k], r);
            if (jobs[r].st != BEAM_OK) fprintf(stderr, "FAIL %s: %s\n", label, jobs[r].msg);
            CU_ASSERT_EQUAL(jobs[r].st, BEAM_OK);
            CU_ASSERT_EQUAL(hu_cmp_bf16(label, jobs[r].hid, ref_h, TH), 0);
            CU_ASSERT_EQUAL(hu_cmp_bf16(label, jobs[r].nrm, ref_n, TH), 0);
            for (f = 0; f < QM_NFORMS; f++) {
                beam_quant *q = &jobs[r].q[f];
                if (memcmp(q->values, ref_v[f], nv[f]) != 0 || memcmp(jobs[r].sbuf[f], ref_s[f], 4 * ns[f]) != 0) {
                    fprintf(stderr, "FAIL %s: the quantized output of form %d (kind %d) differs\n", label, f,
                            (int)q->kind);
                    CU_FAIL("quantized gather output");
                }
                hu_free(q->values);
                hu_free(jobs[r].sbuf[f]);
            }
            hu_free(jobs[r].hid);
            hu_free(jobs[r].nrm);
        }
        CU_ASSERT_EQUAL(beam_cpu_group_destroy(g), BEAM_OK);
    }
    for (f = 0; f < QM_NFORMS; f++) {
        hu_free(ref_v[f]);
        hu_free(ref_s[f]);
    }
    hu_free(ref_h);
    hu_free(ref_n);
    hc_free(&d);
}

int main(int argc, char **argv)
{
    static const suite_test tests[] = {{"every op, plain and quantized, on small stacks", test_local_ops},
                                    {"the CPU gather on small stacks", test_gather},
                                    {NULL, NULL}};
    const char *ss = getenv("OMP_STACKSIZE");
    char want[32];
    (void)argc;
    snprintf(want, sizeof want, "%zuK", SMALL_STACK / 1024);
    if (!ss || strcmp(ss, want) != 0) {
        /* the OpenMP runtime reads OMP_STACKSIZE once, at load: run this
         * program again with it set (by its path, which valgrind, for one,
         * reports as the program's and not its own) */
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0) {
            perror("test_stack: readlink /proc/self/exe");
            return 99;
        }
        self[n] = 0;
        setenv("OMP_STACKSIZE", want, 1);
        if (getenv("BEAM_TEST_EXEC_WRAPPER")) {
            /* a foreign build under a user-mode emulator
             * (scripts/emulate-test.sh): the emulated program cannot run
             * itself again with the library path the emulator's loader
             * needs, and the OpenMP runtime reads OMP_STACKSIZE only at
             * start */
            fprintf(stderr, "test_stack: not run under an emulator: skipped\n");
            return 77;
        }
        execv(self, argv);
        perror("test_stack: execv");
        return 99;
    }
    g_seed = hu_seed("test_stack");
    return suite_run("stack", tests);
}
