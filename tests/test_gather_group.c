/*
 * test_gather_group.c - the CUDA tensor-parallel gather with every world
 * size on the GPUs this host has, one GPU included: R ranks as threads of
 * this process in an in-process group of the CUDA backend
 * (beam_cpu_group_create + beam_workspace_create_cpu), all on one device
 * by default, each with its own stream and buffers. The same kernels and
 * flags run as on R GPUs over NCCL; UNFUSED's all-gather is a kernel over
 * the peers' buffers instead of NCCL. Runs the parts of
 * tests/gather_parts.c that every transport runs (stress, arstress, bad,
 * mismatch, concurrent, wrap, timeout: the CUDA-specific streams, graphs,
 * epochs and in-band failures) for R = 2, 3, 4, 5 and 8 in turn, then the group's own
 * part "repeat" (a rank that creates a second workspace). The group's
 * results over every R, T, strategy, problem and quantized form are
 * tests/test_backends' gather part (every backend's in-process group).
 *
 * Environment: BEAM_TEST_RANKS (one world size instead of the list),
 * BEAM_TEST_DEVICES (spread the ranks over this many devices, rank r on
 * device r % n; default 1), BEAM_TEST_SEED, BEAM_TEST_STRESS (calls per
 * stress part, default 10000), BEAM_TEST_ONLY (one part), BEAM_TEST_DEADLINE
 * (seconds for the whole run, default 1800: past it the process ends with
 * a failure, so nothing hangs).
 * Exit 0 pass, 1 fail, 77 skip (no GPU).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "beammoe.h"
#include "devmem.h"
#include "gather_parts.h"
#include "util.h"

static pthread_barrier_t g_bar;
static beam_cpu_group *g_group;
static int g_ndev_used;
static uint64_t g_seed;
static int g_stress;
static const char *g_only;

void host_barrier(void)
{
    pthread_barrier_wait(&g_bar);
}

static beam_status make_group(int64_t max_tokens, int32_t hidden, const beam_workspace_config *cfg,
                              beam_workspace **ws)
{
    return beam_workspace_create_cpu(g_group, g_rank, max_tokens, hidden, cfg, ws);
}

struct rank_arg {
    int rank, R;
};

struct second_make {
    const beam_workspace_config *cfg;
    beam_workspace *ws;
    beam_status st;
    char msg[300];
};

/* Rank 0's second thread: the same rank's creation, at once. */
static void *second_make_main(void *p)
{
    struct second_make *m = (struct second_make *)p;
    g_rank = 0;
    CK(cudaSetDevice(0));
    m->st = make_group(8, 512, m->cfg, &m->ws);
    snprintf(m->msg, sizeof m->msg, "%s", m->st == BEAM_OK ? "" : beam_last_error());
    return NULL;
}

/* A rank that already holds a workspace and creates another is refused at
 * once with that reason, without meeting its peers; so is a second thread
 * creating for a rank whose creation is in progress (its peers still meet
 * the first). The group's meetings stay in step: the workspaces are
 * destroyed together and made again. */
static void part_repeat(void)
{
    beam_workspace_config cfg = beam_workspace_config_default();
    beam_workspace *ws = NULL, *again = NULL;
    cfg.timeout_ms = 400;
    BK(make_group(8, 512, &cfg, &ws));
    host_barrier();
    if (g_rank == 0) {
        const double t0 = hu_now();
        const beam_status st = make_group(8, 512, NULL, &again); /* the default timeout: 10 s */
        const double ms = (hu_now() - t0) * 1e3;
        if (st != BEAM_ERR_INVALID_ARGUMENT || again || !strstr(beam_last_error(), "already holds a workspace") ||
            ms > 200)
            FAIL("a repeated creation: status %d after %.0f ms: %s", (int)st, ms, beam_last_error());
    }
    host_barrier();
    BK(beam_workspace_destroy(ws));
    ws = NULL;
    /* rank 0 on two threads while its peers come 200 ms later: one thread
     * is refused at once, the other meets the peers */
    if (g_rank == 0) {
        struct second_make m;
        pthread_t th;
        memset(&m, 0, sizeof m);
        m.cfg = &cfg;
        if (pthread_create(&th, NULL, second_make_main, &m) != 0) FAIL("pthread_create");
        const beam_status st = make_group(8, 512, &cfg, &ws);
        char msg[300];
        snprintf(msg, sizeof msg, "%s", st == BEAM_OK ? "" : beam_last_error());
        pthread_join(th, NULL);
        if ((st == BEAM_OK) == (m.st == BEAM_OK))
            FAIL("two creations of rank 0: statuses %d and %d (%s / %s)", (int)st, (int)m.st, msg, m.msg);
        if (st != BEAM_OK && !strstr(msg, "in progress on another thread"))
            FAIL("the refused creation said: %s", msg);
        if (m.st != BEAM_OK && !strstr(m.msg, "in progress on another thread"))
            FAIL("the refused creation said: %s", m.msg);
        if (st != BEAM_OK) ws = m.ws;
    } else {
        struct timespec nap = {0, 200000000L};
        nanosleep(&nap, NULL);
        BK(make_group(8, 512, &cfg, &ws));
    }
    host_barrier();
    BK(beam_workspace_destroy(ws));
    BK(make_group(8, 512, &cfg, &ws));
    BK(beam_workspace_destroy(ws));
    host_barrier();
    if (g_rank == 0) printf("repeat: a repeated or concurrent creation refused at once, the group in step\n");
}

static void *rank_main(void *p)
{
    const struct rank_arg *a = (const struct rank_arg *)p;
    g_rank = a->rank;
    g_R = a->R;
    g_dev = a->rank % g_ndev_used;
    CK(cudaSetDevice(g_dev));
    gp_run_parts(g_seed, g_stress, g_only);
    if (!g_only || !strcmp(g_only, "repeat")) part_repeat();
    return NULL;
}

static void on_deadline(int sig)
{
    static const char msg[] = "test_gather_group: deadline passed: a rank hangs\n";
    (void)sig;
    if (write(2, msg, sizeof msg - 1) < 0) _exit(1);
    _exit(1);
}

static void run_world(int R)
{
    pthread_t th[8];
    struct rank_arg args[8];
    int r;
    if (beam_cpu_group_create(R, &g_group) != BEAM_OK) {
        fprintf(stderr, "beam_cpu_group_create(%d): %s\n", R, beam_last_error());
        exit(1);
    }
    pthread_barrier_init(&g_bar, NULL, (unsigned)R);
    printf("test_gather_group: %d ranks on %d device(s), seed %llu\n", R, g_ndev_used,
           (unsigned long long)g_seed);
    fflush(stdout);
    for (r = 0; r < R; ++r) {
        args[r].rank = r;
        args[r].R = R;
        if (pthread_create(&th[r], NULL, rank_main, &args[r]) != 0) {
            perror("pthread_create");
            exit(1);
        }
    }
    for (r = 0; r < R; ++r) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&g_bar);
    if (beam_cpu_group_destroy(g_group) != BEAM_OK) {
        fprintf(stderr, "beam_cpu_group_destroy: %s\n", beam_last_error());
        exit(1);
    }
}

int main(void)
{
    static const int worlds[] = {2, 3, 4, 5, 8};
    const char *rs = getenv("BEAM_TEST_RANKS");
    const char *ds = getenv("BEAM_TEST_DEVICES");
    const int deadline_s = getenv("BEAM_TEST_DEADLINE") ? atoi(getenv("BEAM_TEST_DEADLINE")) : 1800;
    int ndev = 0, i;
    /* the ranks share a GPU (the library loads its own kernels at workspace
     * creation; EAGER covers the test's and the runtime's) */
    dev_shared_gpu_env();
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("test_gather_group: no GPU visible: skipped\n");
        return 77;
    }
    g_ndev = ndev;
    g_threads = 1;
    g_make = make_group;
    g_ndev_used = ds ? atoi(ds) : 1;
    if (g_ndev_used < 1) g_ndev_used = 1;
    if (g_ndev_used > ndev) g_ndev_used = ndev;
    g_seed = hu_seed("test_gather_group"); /* BEAM_TEST_SEED, else a fresh one */
    g_stress = getenv("BEAM_TEST_STRESS") ? atoi(getenv("BEAM_TEST_STRESS")) : 10000;
    g_only = getenv("BEAM_TEST_ONLY");
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGALRM, on_deadline);
    alarm((unsigned)deadline_s);
    if (rs) {
        const int R = atoi(rs);
        if (R < 2 || R > 8) {
            fprintf(stderr, "test_gather_group: BEAM_TEST_RANKS=%s must be in [2, 8]\n", rs);
            return 1;
        }
        run_world(R);
    } else {
        for (i = 0; i < (int)(sizeof worlds / sizeof worlds[0]); ++i) run_world(worlds[i]);
    }
    printf("test_gather_group: PASS\n");
    return 0;
}
