/*
 * gather.c - the tensor-parallel gather part of `beammoe audit`.
 *
 * One CPU group of R ranks per R; every rank is a thread that creates its
 * workspace, runs every strategy on it (so workspace reuse across calls is
 * exercised too) and destroys it. Rank r gets only its own rows
 * [r*L, min((r+1)*L, T)) of the expert inputs, followed by one NaN row past
 * them; residual is the full replicated array. Every rank's hidden_out and
 * normalized (with a guard row) must equal the single-device ground truth.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gather.h"

#define NSTRAT GATHER_NSTRAT
static const beam_strategy strat[NSTRAT] = {BEAM_STRATEGY_AUTO, BEAM_STRATEGY_ONESHOT,
                                            BEAM_STRATEGY_TWOSHOT, BEAM_STRATEGY_UNFUSED};
static const char *strat_name[NSTRAT] = {"gather/auto", "gather/oneshot", "gather/twoshot",
                                         "gather/unfused"};
static const int32_t world_sizes[] = {1, 2, 3, 4, 8};
#define NWORLD 5

typedef struct rank_job {
    const hc_case *c;
    beam_cpu_group *group;
    int32_t rank, nranks;
    int64_t L, local_cap;
    uint16_t *experts; /* [local_cap, K, H] */
    float *weights;    /* [local_cap, K]    */
    hc_out out[NSTRAT];
    beam_status st[NSTRAT];
    char msg[NSTRAT][400];
} rank_job;

static void set_all(rank_job *j, beam_status st, const char *msg)
{
    int s;
    for (s = 0; s < NSTRAT; s++) {
        j->st[s] = st;
        snprintf(j->msg[s], sizeof j->msg[s], "%s", msg);
    }
}

/* Every strategy of rank j failed at `what` with st. */
static void fail_all(rank_job *j, const char *what, beam_status st)
{
    char m[400];
    snprintf(m, sizeof m, "rank %d: %s: %s: %s", (int)j->rank, what, beam_status_string(st), beam_last_error());
    set_all(j, st, m);
}

static void *gather_rank_main(void *arg)
{
    rank_job *j = arg;
    const hc_case *c = j->c;
    beam_workspace *ws = NULL;
    beam_workspace_config cfg = beam_workspace_config_default();
    beam_norm sp, sn;
    const beam_norm *post = hu_beam_norm(&c->post, &sp);
    const beam_norm *next = hu_beam_norm(&c->next, &sn);
    const float *scales = c->s.scales ? c->scales : NULL;
    beam_status st;
    int s;

    /* generous: 8 ranks share 2 cores here; a lost peer still ends */
    if (cfg.timeout_ms < 30000) cfg.timeout_ms = 30000;
    st = beam_workspace_create_cpu(j->group, j->rank, c->s.T + 3, c->s.H, &cfg, &ws);
    if (st != BEAM_OK) {
        fail_all(j, "beam_workspace_create_cpu", st);
        return NULL;
    }
    for (s = 0; s < NSTRAT; s++) {
        hc_out *o = &j->out[s];
        st = beam_moe_finalize_gather_norm_residual_norm(
            ws, j->experts, j->weights, j->local_cap, c->s.T, c->s.K, c->s.H, c->rs, post,
            c->residual, scales, next, o->hidden,
            next ? o->normalized : NULL, strat[s], NULL);
        j->st[s] = st;
        if (st != BEAM_OK)
            snprintf(j->msg[s], sizeof j->msg[s], "rank %d: %s: %s", (int)j->rank,
                     beam_status_string(st), beam_last_error());
    }
    st = beam_workspace_destroy(ws);
    if (st != BEAM_OK) fail_all(j, "beam_workspace_destroy", st);
    return NULL;
}

static int job_make(rank_job *j, const hc_case *c, int32_t rank, int32_t R)
{
    size_t K = (size_t)c->s.K, H = (size_t)c->s.H, i;
    int64_t T = c->s.T, first, count;
    int s;

    *j = (rank_job){.c = c, .rank = rank, .nranks = R, .L = (T + R - 1) / R};
    j->local_cap = j->L + 1;
    first = rank * j->L;
    count = T - first;
    if (count > j->L) count = j->L;
    if (count < 0) count = 0;
    j->experts = hu_try_alloc((size_t)j->local_cap * K * H * 2, 0);
    j->weights = hu_try_alloc((size_t)j->local_cap * K * 4, 0);
    if (!j->experts || !j->weights) return -1;
    hu_fill_u16(j->experts, 0x7FC1, (size_t)j->local_cap * K * H);
    for (i = 0; i < (size_t)j->local_cap * K; i++) j->weights[i] = NAN;
    if (count > 0) {
        memcpy(j->experts, c->experts + (size_t)first * K * H, (size_t)count * K * H * 2);
        memcpy(j->weights, c->weights + (size_t)first * K, (size_t)count * K * 4);
    }
    for (s = 0; s < NSTRAT; s++) {
        if (hc_out_make(&j->out[s], c, 1)) return -1;
        j->st[s] = BEAM_OK;
    }
    return 0;
}

static void job_free(rank_job *j)
{
    int s;
    hu_free(j->experts);
    hu_free(j->weights);
    for (s = 0; s < NSTRAT; s++) hc_out_free(&j->out[s]);
}

void audit_gather(const hc_case *p, const hc_out *truth, gather_row rows[NSTRAT])
{
    int s, w;

    for (s = 0; s < NSTRAT; s++) {
        memset(&rows[s], 0, sizeof rows[s]);
        hu_cmp_init(&rows[s].cmp);
        snprintf(rows[s].name, sizeof rows[s].name, "%s R1-8", strat_name[s]);
    }

    for (w = 0; w < NWORLD; w++) {
        int32_t R = world_sizes[w], r;
        beam_cpu_group *group = NULL;
        rank_job *jobs = calloc((size_t)R, sizeof *jobs);
        pthread_t *th = calloc((size_t)R, sizeof *th);
        beam_status st;
        int oom = !jobs || !th;

        for (r = 0; r < R && !oom; r++) oom = job_make(&jobs[r], p, r, R);
        st = oom ? BEAM_ERR_OUT_OF_MEMORY : beam_cpu_group_create(R, &group);
        if (st != BEAM_OK) {
            for (s = 0; s < NSTRAT; s++) {
                if (!rows[s].errors++)
                    snprintf(rows[s].error, sizeof rows[s].error, "R=%d: %s: %s", (int)R,
                             oom ? "out of memory" : "beam_cpu_group_create",
                             oom ? "" : beam_last_error());
            }
        } else {
            for (r = 0; r < R; r++) {
                jobs[r].group = group;
                if (pthread_create(&th[r], NULL, gather_rank_main, &jobs[r]) != 0) {
                    /* cannot happen at these sizes; the peers time out */
                    set_all(&jobs[r], BEAM_ERR_COMM, "pthread_create failed");
                    th[r] = pthread_self();
                }
            }
            for (r = 0; r < R; r++)
                if (!pthread_equal(th[r], pthread_self())) pthread_join(th[r], NULL);
            st = beam_cpu_group_destroy(group);
            if (st != BEAM_OK && !rows[0].errors++)
                snprintf(rows[0].error, sizeof rows[0].error, "R=%d: beam_cpu_group_destroy: %s",
                         (int)R, beam_last_error());

            for (s = 0; s < NSTRAT; s++)
                for (r = 0; r < R; r++) {
                    hu_cmp c;
                    if (jobs[r].st[s] != BEAM_OK) {
                        if (!rows[s].errors++)
                            snprintf(rows[s].error, sizeof rows[s].error, "R=%d %s", (int)R,
                                     jobs[r].msg[s]);
                        continue;
                    }
                    hu_cmp_init(&c);
                    hc_out_compare(&jobs[r].out[s], truth, HC_FUSED, &c);
                    if (c.mismatched && !rows[s].detail[0]) {
                        char u[32];
                        hu_cmp_ulp_text(&c, u, sizeof u);
                        snprintf(rows[s].detail, sizeof rows[s].detail,
                                 "first failing: R=%d rank %d: %lld of %lld differ, max ulp %s",
                                 (int)R, (int)r, (long long)c.mismatched, (long long)c.compared,
                                 u);
                    }
                    rows[s].cmp.compared += c.compared;
                    rows[s].cmp.mismatched += c.mismatched;
                    if (c.max_ulp > rows[s].cmp.max_ulp) rows[s].cmp.max_ulp = c.max_ulp;
                    rows[s].cmp.nan_vs_number |= c.nan_vs_number;
                }
        }
        for (r = 0; jobs && r < R; r++) job_free(&jobs[r]);
        free(jobs);
        free(th);
    }
}
