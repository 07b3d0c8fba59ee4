/*
 * test_stack.c - the CPU backend on small thread stacks.
 *
 * A library runs on its callers' threads, whose stacks may be small: every
 * call below runs on a thread created with a 64 KiB stack, and the OpenMP
 * worker threads get 64 KiB too (OMP_STACKSIZE=64K: the program runs itself
 * again with it set, since the runtime reads it once at load). The shapes are
 * the numerics sweep's (top_k 1..32, hidden 256..8192, tokens 1, 7, 100),
 * every op and local strategy, 1, 2 and 3 OpenMP threads, plus the CPU
 * group's gather with its ranks on 64 KiB stacks; every result must equal the
 * naive reference (computed on the main thread). A kernel that keeps rows of
 * `hidden` floats on the stack dies here with SIGSEGV.
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

#include "suite.h"

/* 64 KiB, or the smallest stack the platform allows where that is more
 * (128 KiB on aarch64 Linux, for pthreads and libgomp alike) */
static size_t small_stack(void)
{
    const long min = sysconf(_SC_THREAD_STACK_MIN);
    return min > 64 * 1024 ? (size_t)min : (size_t)64 * 1024;
}
#define SMALL_STACK small_stack()

static uint64_t g_seed;

/* Run fn(arg) on a new thread with a 64 KiB stack and wait for it. */
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

typedef struct local_job {
    const hc_case *d;
    const uint16_t *ref_h[3], *ref_n[3]; /* per op */
    uint16_t *got_h, *got_n;
    int calls, failed;                   /* filled by the thread */
    char first[400];
} local_job;

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
    }
    return NULL;
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
        for (op = 0; op < 3; op++) {
            ref[2 * op] = (uint16_t *)hu_alloc(2 * TH, 0);
            ref[2 * op + 1] = (uint16_t *)hu_alloc(2 * TH, 0);
            hc_ref(&d, (hc_op)op, ref[2 * op], ref[2 * op + 1]);
            j.ref_h[op] = ref[2 * op];
            j.ref_n[op] = ref[2 * op + 1];
        }
        j.got_h = (uint16_t *)hu_alloc(2 * TH, 0);
        j.got_n = (uint16_t *)hu_alloc(2 * TH, 0);
        CU_ASSERT_FATAL(on_small_stack(local_main, &j));
        if (j.failed) fprintf(stderr, "FAIL seed=%llu [%s]: %d of %d calls, first: %s\n",
                              (unsigned long long)g_seed, desc, j.failed, j.calls, j.first);
        CU_ASSERT_EQUAL(j.failed, 0);
        cases++;
        calls += j.calls;
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
    omp_set_num_threads(2);
    j->st = beam_workspace_create_cpu(j->g, j->rank, s->T, s->H, NULL, &ws);
    if (j->st == BEAM_OK) {
        j->st = beam_moe_finalize_gather_norm_residual_norm(
            ws, j->d->experts + (size_t)start * KH, j->d->weights + (size_t)start * (size_t)s->K, L, s->T,
            s->K, s->H, j->d->rs, hu_beam_norm(&j->d->post, &post), j->d->residual, j->d->scales,
            hu_beam_norm(&j->d->next, &next), j->hid, j->nrm, j->strategy, NULL);
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
    int k, r;

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
            hu_free(jobs[r].hid);
            hu_free(jobs[r].nrm);
        }
        CU_ASSERT_EQUAL(beam_cpu_group_destroy(g), BEAM_OK);
    }
    hu_free(ref_h);
    hu_free(ref_n);
    hc_free(&d);
}

int main(int argc, char **argv)
{
    static const suite_test tests[] = {{"every op on 64 KiB stacks", test_local_ops},
                                    {"the CPU gather on 64 KiB stacks", test_gather},
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
