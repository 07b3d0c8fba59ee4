/*
 * test_dispatch.c - the run-time dispatcher libbeammoe: backend selection by
 * beam_set_backend() and BEAM_BACKEND, errors for unknown or unavailable
 * backends, and that the library keeps working after such an error.
 *
 * "cuda" must be refused on a host without a GPU (no /dev/nvidiactl), and
 * "auto" must fall back to the CPU there. On a GPU host asking for "cuda"
 * may succeed; then the name must say so and switching back must work.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CUnit/Basic.h>


#include "suite.h"

static int g_gpu_host;

/* A tiny finalize that must work on whatever backend is selected (CPU). */
static void small_call_works(void)
{
    uint16_t x[2 * 256], out[256];
    float w[2] = {0.5f, 0.25f};
    int h, bad = 0;
    for (h = 0; h < 2 * 256; h++)
        x[h] = 0x3F80; /* 1.0 */
    CU_ASSERT_EQUAL(beam_moe_finalize(x, w, 1, 1, 2, 256, 1.0f, NULL, out, NULL), BEAM_OK);
    for (h = 0; h < 256; h++)
        bad += out[h] != 0x3F40; /* 0.75 */
    CU_ASSERT_EQUAL(bad, 0);
}

/* Every backend's table through libbeammoe: the CPU's always, by name; the
 * calls through it run on that backend and report with its last_error. */
static void test_tables(void)
{
    const beam_ops *cpu = beam_backend_ops("cpu", BEAM_OPS_VERSION), *cur;
    uint16_t x[256], out[256];
    float w = 1.0f;
    int h;
    CU_ASSERT_PTR_NOT_NULL_FATAL(cpu);
    CU_ASSERT_STRING_EQUAL(cpu->name, "cpu");
    CU_ASSERT_EQUAL(cpu->version, BEAM_OPS_VERSION);
    CU_ASSERT(cpu->size >= sizeof(beam_ops));
    CU_ASSERT_EQUAL(cpu->device_memory, 0);
    CU_ASSERT_EQUAL(beam_set_backend("cpu"), BEAM_OK);
    cur = beam_backend_ops(NULL, BEAM_OPS_VERSION);
    CU_ASSERT_PTR_EQUAL(cur, cpu);
    for (h = 0; h < 256; h++)
        x[h] = 0x4000; /* 2.0 */
    CU_ASSERT_EQUAL(cpu->moe_finalize(x, &w, 1, 1, 1, 256, 1.0f, NULL, out, NULL), BEAM_OK);
    CU_ASSERT_EQUAL(out[0], 0x4000);
    CU_ASSERT_EQUAL(cpu->moe_finalize(x, &w, 1, 1, 1, 100, 1.0f, NULL, out, NULL), BEAM_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(cpu->last_error(), "hidden=100"));
    /* refusals: unknown name, another version, a backend that cannot run */
    CU_ASSERT_PTR_NULL(beam_backend_ops("tpu", BEAM_OPS_VERSION));
    CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "must be"));
    CU_ASSERT_PTR_NULL(beam_backend_ops("cpu", BEAM_OPS_VERSION + 1));
    CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "table version"));
    if (!g_gpu_host) {
        CU_ASSERT_PTR_NULL(beam_backend_ops("cuda", BEAM_OPS_VERSION));
        CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "cuda backend"));
    }
}

static void test_version(void)
{
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", BEAM_VERSION_MAJOR, BEAM_VERSION_MINOR,
             BEAM_VERSION_PATCH);
    CU_ASSERT_PTR_NOT_NULL(beam_version());
    if (beam_version())
        CU_ASSERT_STRING_EQUAL(beam_version(), want);
}

static void test_select_cpu(void)
{
    CU_ASSERT_EQUAL(beam_set_backend("cpu"), BEAM_OK);
    CU_ASSERT_PTR_NOT_NULL(beam_backend_name());
    if (beam_backend_name())
        CU_ASSERT_STRING_EQUAL(beam_backend_name(), "cpu");
    small_call_works();
}

static void test_bogus(void)
{
    static const char *bad[] = {"bogus", "", "CPU ", "cpux", "cud", NULL};
    int i;
    CU_ASSERT_EQUAL(beam_set_backend("cpu"), BEAM_OK);
    for (i = 0; bad[i]; i++) {
        beam_status st = beam_set_backend(bad[i]);
        CU_ASSERT_EQUAL(st, BEAM_ERR_INVALID_ARGUMENT);
        CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "beam_set_backend"));
        if (st == BEAM_OK)
            fprintf(stderr, "beam_set_backend(\"%s\") accepted\n", bad[i]);
    }
    CU_ASSERT_NOT_EQUAL(beam_set_backend(NULL), BEAM_OK);
    /* still the CPU, still working */
    CU_ASSERT_STRING_EQUAL(beam_backend_name(), "cpu");
    small_call_works();
}

static void test_cuda(void)
{
    beam_status st = beam_set_backend("cuda");
    if (g_gpu_host && st == BEAM_OK) {
        /* a CUDA build on a GPU host: the switch worked */
        CU_ASSERT_STRING_EQUAL(beam_backend_name(), "cuda");
        CU_ASSERT_EQUAL(beam_set_backend("cpu"), BEAM_OK);
    } else {
        CU_ASSERT_NOT_EQUAL(st, BEAM_OK);
        CU_ASSERT(strlen(beam_last_error()) > 0);
        CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "cuda"));
        if (!g_gpu_host)
            fprintf(stderr, "  (no GPU: beam_set_backend(\"cuda\") -> %d \"%s\")\n", (int)st,
                    beam_last_error());
    }
    /* whatever happened, the CPU is (back) in charge and works */
    CU_ASSERT_STRING_EQUAL(beam_backend_name(), "cpu");
    small_call_works();
}

static void test_auto(void)
{
    CU_ASSERT_EQUAL(beam_set_backend("auto"), BEAM_OK);
    /* a successful call leaves no message, also when auto fell back */
    CU_ASSERT_STRING_EQUAL(beam_last_error(), "");
    if (!g_gpu_host)
        CU_ASSERT_STRING_EQUAL(beam_backend_name(), "cpu");
    CU_ASSERT_EQUAL(beam_set_backend("cpu"), BEAM_OK);
    small_call_works();
}

/* Run this program again with BEAM_BACKEND set; the child prints the name
 * of the backend its first call found. BEAM_TEST_EXEC_WRAPPER names a
 * program that runs it where the host cannot (a cross build's emulator,
 * scripts/cross-check.sh): execlp(wrapper, wrapper, this program, mode). */
static char g_self[4096];

static int child_run(const char *value, const char *mode, char *name, size_t n)
{
    int fd[2], status = 0;
    pid_t pid;
    ssize_t got;
    if (pipe(fd) != 0)
        return -1;
    pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        if (value)
            setenv("BEAM_BACKEND", value, 1);
        else
            unsetenv("BEAM_BACKEND");
        {
            const char *wrap = getenv("BEAM_TEST_EXEC_WRAPPER");
            if (wrap && *wrap)
                execlp(wrap, wrap, g_self, mode, (char *)NULL);
            else
                execl(g_self, "test_dispatch", mode, (char *)NULL);
        }
        _exit(127);
    }
    close(fd[1]);
    got = read(fd[0], name, n - 1);
    close(fd[0]);
    name[got > 0 ? got : 0] = '\0';
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int child_backend(const char *value, char *name, size_t n)
{
    return child_run(value, "--print-backend", name, n);
}

static void test_env(void)
{
    char name[64];
    CU_ASSERT_EQUAL(child_backend("cpu", name, sizeof name), 0);
    CU_ASSERT_STRING_EQUAL(name, "cpu");
    CU_ASSERT_EQUAL(child_backend("auto", name, sizeof name), 0);
    if (!g_gpu_host)
        CU_ASSERT_STRING_EQUAL(name, "cpu");
    CU_ASSERT_EQUAL(child_backend(NULL, name, sizeof name), 0);
    if (!g_gpu_host)
        CU_ASSERT_STRING_EQUAL(name, "cpu");
    /* a bad BEAM_BACKEND: calls fail with a status (no crash), and
     * beam_set_backend("cpu") recovers */
    CU_ASSERT_EQUAL(child_run("bogus", "--call", name, sizeof name), 0);
    CU_ASSERT_NOT_EQUAL(strncmp(name, "0 ", 2), 0);
    CU_ASSERT_STRING_EQUAL(name + (name[0] ? 2 : 0), "0 0");
    if (!g_gpu_host) {
        CU_ASSERT_EQUAL(child_run("cuda", "--call", name, sizeof name), 0);
        CU_ASSERT_NOT_EQUAL(strncmp(name, "0 ", 2), 0);
        CU_ASSERT_STRING_EQUAL(name + (name[0] ? 2 : 0), "0 0");
    }
    CU_ASSERT_EQUAL(child_run("cpu", "--call", name, sizeof name), 0);
    CU_ASSERT_STRING_EQUAL(name, "0 0 0");
}

/* The first call of the process on a thread with a 16 KiB stack (64 KiB
 * under AddressSanitizer, above; or the platform's smallest where that is
 * more): the dispatcher loads its backend
 * there (dlopen), and once kept two 4 KiB paths on that stack and died. */
typedef struct small_job {
    char out[128];
} small_job;

static void *small_stack_main(void *p)
{
    small_job *j = (small_job *)p;
    uint16_t x[256], out[256];
    float w = 1.0f;
    const char *v = beam_version(), *name = beam_backend_name();
    beam_status st;
    memset(x, 0, sizeof x);
    st = beam_moe_finalize(x, &w, 1, 1, 1, 256, 1.0f, NULL, out, NULL);
    snprintf(j->out, sizeof j->out, "%s %s %d", v ? v : "(null)", name ? name : "(null)", (int)st);
    return NULL;
}

static int first_call_on_small_stack(void)
{
    long min = sysconf(_SC_THREAD_STACK_MIN);
    const size_t want = (size_t)SMALL_STACK_KIB * 1024;
    size_t size = min > 0 && (size_t)min > want ? (size_t)min : want;
    pthread_attr_t at;
    pthread_t th;
    small_job j;
    int rc;
    memset(&j, 0, sizeof j);
    pthread_attr_init(&at);
    rc = pthread_attr_setstacksize(&at, size);
    if (rc == 0) rc = pthread_create(&th, &at, small_stack_main, &j);
    pthread_attr_destroy(&at);
    if (rc != 0) {
        fprintf(stderr, "cannot start a thread with a %zu-byte stack (error %d)\n", size, rc);
        return 1;
    }
    pthread_join(th, NULL);
    printf("%zu %s", size, j.out);
    return 0;
}

static void test_small_stack(void)
{
    char out[160], want[64];
    const char *rest;
    int rc = child_run(NULL, "--small-stack", out, sizeof out);
    if (rc != 0) fprintf(stderr, "  first call on a small stack: child status %d, \"%s\"\n", rc, out);
    CU_ASSERT_EQUAL(rc, 0);
    rest = strchr(out, ' ');
    snprintf(want, sizeof want, "%d.%d.%d %s 0", BEAM_VERSION_MAJOR, BEAM_VERSION_MINOR,
             BEAM_VERSION_PATCH, g_gpu_host ? (rest && strstr(rest, "cuda") ? "cuda" : "cpu") : "cpu");
    CU_ASSERT_PTR_NOT_NULL(rest);
    if (rest) CU_ASSERT_STRING_EQUAL(rest + 1, want);
    if (rest) fprintf(stderr, "  first call on a %.*s-byte stack: %s\n", (int)(rest - out), out, rest + 1);
}

/* The gather's agreement words (beam_gather_agreement): a call's own words
 * again for the same arguments, and each argument changed alone changes its
 * word only, which beam_gather_agreement_text names and shows. */
static void test_agreement(void)
{
    static const uint16_t wt[1] = {0x3F80};
    beam_norm post = {NULL, 1e-6f}, next = {wt, 1e-5f}, other_eps = {wt, 2e-5f}, no_weight = {NULL, 1e-5f};
    float scales[2] = {0.75f, 1.25f}, scales2[2] = {0.75f, 1.5f};
    beam_quant q = {BEAM_QUANT_FP8_GROUP, 128, BEAM_QUANT_UE8M0, 0.0f, NULL, NULL, 0, NULL};
    beam_quant q64 = q, token = {BEAM_QUANT_FP8_TOKEN, 0, 0, 0.0f, NULL, NULL, 0, NULL};
    uint64_t base[BEAM_AGREEMENT_WORDS], w[BEAM_AGREEMENT_WORDS];
    struct {
        int word;
        const char *text;
    } const want[] = {{0, "6"},
                      {1, "4"},
                      {2, "2048"},
                      {3, "TWOSHOT"},
                      {4, "0.5"},
                      {5, "(0.75, 1.5)"},
                      {6, "none"},
                      {7, "eps 2e-05 with weight"},
                      {7, "eps 1e-05 without weight"},
                      {8, "BEAM_QUANT_FP8_GROUP group 64 UE8M0"},
                      {8, "BEAM_QUANT_FP8_TOKEN group 7168"},
                      {8, "none"}};
    char text[128];
    int c, i;
    q64.group_size = 64;
    CU_ASSERT_EQUAL(beam_gather_agreement(5, 8, 7168, 2.5f, &post, scales, &next, &q, BEAM_STRATEGY_ONESHOT, base),
                    BEAM_OK);
    CU_ASSERT_STRING_EQUAL(beam_gather_agreement_text(8, base[8], text, sizeof text), "quant");
    CU_ASSERT_STRING_EQUAL(text, "BEAM_QUANT_FP8_GROUP group 128 UE8M0");
    for (c = 0; c < (int)(sizeof want / sizeof want[0]); c++) {
        CU_ASSERT_EQUAL(beam_gather_agreement(c == 0 ? 6 : 5, c == 1 ? 4 : 8, c == 2 ? 2048 : 7168,
                                              c == 4 ? 0.5f : 2.5f, c == 6 ? NULL : &post,
                                              c == 5 ? scales2 : scales,
                                              c == 7 ? &other_eps : c == 8 ? &no_weight : &next,
                                              c == 9 ? &q64 : c == 10 ? &token : c == 11 ? NULL : &q,
                                              c == 3 ? BEAM_STRATEGY_TWOSHOT : BEAM_STRATEGY_ONESHOT, w),
                        BEAM_OK);
        for (i = 0; i < BEAM_AGREEMENT_WORDS; i++)
            CU_ASSERT_EQUAL(w[i] != base[i], i == want[c].word);
        beam_gather_agreement_text(want[c].word, w[want[c].word], text, sizeof text);
        if (strcmp(text, want[c].text) != 0) fprintf(stderr, "  word %d: \"%s\", want \"%s\"\n", want[c].word, text,
                                                     want[c].text);
        CU_ASSERT_STRING_EQUAL(text, want[c].text);
    }
    CU_ASSERT_PTR_NULL(beam_gather_agreement_text(BEAM_AGREEMENT_WORDS, 0, text, sizeof text));
    CU_ASSERT_EQUAL(beam_gather_agreement(5, 8, 7168, 2.5f, NULL, NULL, NULL, NULL, BEAM_STRATEGY_AUTO, NULL),
                    BEAM_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "beam_gather_agreement: words must not be NULL"));
    /* the form as the gather checks it */
    CU_ASSERT_EQUAL(beam_gather_agreement(5, 8, 7168, 2.5f, NULL, NULL, NULL, &q, BEAM_STRATEGY_AUTO, w),
                    BEAM_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(beam_last_error(), "beam_gather_agreement: quant needs next_norm"));
}

int main(int argc, char **argv)
{
    static const suite_test tests[] = {{"version", test_version},
                                    {"backend tables", test_tables},
                                    {"select cpu", test_select_cpu},
                                    {"unknown backend names", test_bogus},
                                    {"cuda", test_cuda},
                                    {"auto", test_auto},
                                    {"BEAM_BACKEND", test_env},
                                    {"first call on a small stack", test_small_stack},
                                    {"the gather's agreement words", test_agreement},
                                    {NULL, NULL}};
    if (argc > 1 && strcmp(argv[1], "--print-backend") == 0) {
        const char *n = beam_backend_name();
        printf("%s", n ? n : "(null)");
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--small-stack") == 0) return first_call_on_small_stack();
    if (argc > 1 && strcmp(argv[1], "--call") == 0) {
        /* first use under the given BEAM_BACKEND: the status of a call,
         * then of beam_set_backend("cpu") and of the same call again */
        uint16_t x[256], out[256];
        float w = 1.0f;
        int a, b, c;
        memset(x, 0, sizeof x);
        a = (int)beam_moe_finalize(x, &w, 1, 1, 1, 256, 1.0f, NULL, out, NULL);
        b = (int)beam_set_backend("cpu");
        c = (int)beam_moe_finalize(x, &w, 1, 1, 1, 256, 1.0f, NULL, out, NULL);
        printf("%d %d %d", a, b, c);
        return 0;
    }
    g_gpu_host = access("/dev/nvidiactl", F_OK) == 0;
    /* the path of this program, resolved now: under valgrind the kernel's
     * /proc/self/exe would name valgrind itself */
    {
        ssize_t n = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
        g_self[n > 0 ? n : 0] = '\0';
    }
    /* before any failing call, the message is empty (and not NULL) */
    if (!beam_last_error() || beam_last_error()[0] != '\0') {
        fprintf(stderr, "beam_last_error() before any failure: not \"\"\n");
        return 1;
    }
    return suite_run("dispatch", tests);
}
