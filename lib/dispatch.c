/*
 * dispatch.c - libbeammoe: the same beam_* API, forwarded at run time to a
 * backend library (libbeammoe_cpu or libbeammoe_cuda).
 *
 * Each backend library is loaded with dlopen(RTLD_LOCAL) and reached only
 * through its table (beam_ops of beammoe.h), which its one entry point,
 * beam_backend_ops, returns; so this library never calls its own exported
 * names, and one symbol is looked up per backend. The backend checks the
 * arguments; after a failed call its message is copied into this library's
 * thread-local message. The choice: BEAM_BACKEND=cpu|cuda|auto at first use,
 * or beam_set_backend(); "auto" takes CUDA when that library loads and sees a
 * device, else the CPU. The backends, their libraries and the order "auto"
 * tries them come from the one list, lib/backends.def.
 *
 * Backends are searched in $BEAM_BACKEND_DIR, then beside this library
 * (dladdr), then in the configured libdir, then by the loader's own search.
 */
#define _GNU_SOURCE /* dladdr */
#include "config.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"
#include "beammoe.h"
#include "error.h"

#ifndef BEAM_LIBDIR
#define BEAM_LIBDIR "/usr/local/lib"
#endif
/* The backends' soname suffix (".so.0"): config.h's, from the ABI set in
 * configure.ac, which also versions the libraries. */
#ifndef BEAM_SO_SUFFIX
#error "BEAM_SO_SUFFIX comes from config.h (configure.ac)"
#endif

typedef beam_ops const *bm_entry_fn(const char *, uint32_t);

typedef struct bm_loaded {
    int tried;
    void *handle;
    const beam_ops *ops; /* the backend library's own table */
    char why[384];       /* why it did not load or cannot run */
} bm_loaded;

static pthread_mutex_t bm_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t bm_once = PTHREAD_ONCE_INIT;
static bm_loaded bm_backends[BM_NBACKENDS];
static const beam_ops *bm_current;  /* read with __atomic_load_n */
static beam_status bm_init_status;   /* of BEAM_BACKEND at first use */
static char bm_init_msg[512];

/* A workspace of this library: the backend that made it and its handle. */
struct beam_workspace {
    const beam_ops *be;
    beam_workspace *inner;
};

/* The paths bm_load builds, off the stack: the first call may come from a
 * thread with a small stack (16 KiB is allowed), and dlopen itself needs
 * most of it. Used under bm_mu only (bm_load). */
static char bm_path[4096], bm_self_dir[4096];

static void *bm_try_open(const char *dir, const char *file, char *why, size_t n)
{
    void *h;
    if (dir)
        snprintf(bm_path, sizeof bm_path, "%s/%s", dir, file);
    else
        snprintf(bm_path, sizeof bm_path, "%s", file);
    h = dlopen(bm_path, RTLD_NOW | RTLD_LOCAL);
    if (!h && why[0] == '\0') snprintf(why, n, "%s", dlerror());
    return h;
}

/* Load backend b once (under bm_mu). */
static bm_loaded *bm_load(int b)
{
    bm_loaded *l = &bm_backends[b];
    char file[64];
    const char *env = getenv("BEAM_BACKEND_DIR");
    Dl_info info;
    void *h = NULL;

    if (l->tried) return l->ops ? l : NULL;
    l->tried = 1;
    snprintf(file, sizeof file, "libbeammoe_%s%s", bm_backend_name(b), BEAM_SO_SUFFIX);
    if (env && *env) h = bm_try_open(env, file, l->why, sizeof l->why);
    if (!h && dladdr((void *)&bm_load, &info) && info.dli_fname) {
        char *slash;
        snprintf(bm_self_dir, sizeof bm_self_dir, "%s", info.dli_fname);
        slash = strrchr(bm_self_dir, '/');
        if (slash) {
            *slash = '\0';
            h = bm_try_open(bm_self_dir, file, l->why, sizeof l->why);
        }
    }
    if (!h) h = bm_try_open(BEAM_LIBDIR, file, l->why, sizeof l->why);
    if (!h) h = bm_try_open(NULL, file, l->why, sizeof l->why);
    if (!h) return NULL;
    /* one entry point: the backend's table, for this library's layout */
    {
        bm_entry_fn *entry;
        *(void **)(&entry) = dlsym(h, "beam_backend_ops");
        if (!entry) {
            snprintf(l->why, sizeof l->why, "%s lacks the symbol beam_backend_ops", file);
            dlclose(h);
            return NULL;
        }
        l->ops = entry(bm_backend_name(b), BEAM_OPS_VERSION);
        if (!l->ops) {
            /* loaded, but cannot serve: its own message says why (no
             * device, another table version); keep the library, it may
             * hold the only copy of a message for later */
            const char *(*msg)(void);
            *(void **)(&msg) = dlsym(h, "beam_last_error");
            snprintf(l->why, sizeof l->why, "%s", msg ? msg() : "beam_backend_ops returned NULL");
            l->handle = h;
            return NULL;
        }
        if (l->ops->version != BEAM_OPS_VERSION || l->ops->size < sizeof(beam_ops)) {
            snprintf(l->why, sizeof l->why, "%s has table version %u (%u bytes); this library needs %u", file,
                     (unsigned)l->ops->version, (unsigned)l->ops->size, (unsigned)BEAM_OPS_VERSION);
            l->ops = NULL;
            dlclose(h);
            return NULL;
        }
    }
    l->handle = h;
    return l;
}

/* Why backend b has no table (after bm_load returned NULL): unsupported,
 * with the message set. */
static beam_status bm_load_failed(int b, const char *fn)
{
    return bm_fail(BEAM_ERR_UNSUPPORTED, "%s: the %s backend %s: %s", fn, bm_backend_name(b),
                   bm_backends[b].handle ? "cannot run here" : "did not load", bm_backends[b].why);
}

/* Backend b's table, loading it once; NULL with the message set. */
static const beam_ops *bm_table(int b, const char *fn)
{
    bm_loaded *l;
    pthread_mutex_lock(&bm_mu);
    l = bm_load(b);
    pthread_mutex_unlock(&bm_mu);
    if (!l) {
        bm_load_failed(b, fn);
        return NULL;
    }
    return l->ops;
}

/* Make `name` current; BEAM_OK or an error with the message set. */
static beam_status bm_select(const char *name, const char *fn)
{
    bm_loaded *l;
    beam_status st = BEAM_OK;
    int b, is_auto;

    if (!name) return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: name must not be NULL", fn);
    is_auto = strcmp(name, "auto") == 0;
    b = is_auto ? BM_NBACKENDS - 1 : bm_backend_find(name);
    if (b < 0)
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: backend \"%s\" must be %s or \"auto\"", fn, name,
                       bm_backend_choices(1));
    pthread_mutex_lock(&bm_mu);
    /* "auto" tries the list from the bottom up, the CPU last */
    for (; b >= 0; b--) {
        l = bm_load(b);
        if (!l) {
            st = bm_load_failed(b, fn);
        } else {
            st = BEAM_OK;
            __atomic_store_n(&bm_current, l->ops, __ATOMIC_RELEASE);
            /* "auto" that fell back to the CPU succeeded: no stale message
             * about the CUDA attempt may be left for beam_last_error() */
            bm_clear_error();
            break;
        }
        if (!is_auto) break; /* an explicit choice does not fall back */
    }
    pthread_mutex_unlock(&bm_mu);
    return st;
}

static void bm_init(void)
{
    const char *env = getenv("BEAM_BACKEND");
    bm_init_status = bm_select(env && *env ? env : "auto", "libbeammoe (BEAM_BACKEND)");
    if (bm_init_status != BEAM_OK) snprintf(bm_init_msg, sizeof bm_init_msg, "%s", bm_last_error());
}

/* The current backend, or NULL (then bm_no_backend() says why). */
static const beam_ops *bm_be(void)
{
    const beam_ops *be;
    pthread_once(&bm_once, bm_init);
    be = __atomic_load_n(&bm_current, __ATOMIC_ACQUIRE);
    return be;
}

static beam_status bm_no_backend(void)
{
    return bm_fail(bm_init_status ? bm_init_status : BEAM_ERR_UNSUPPORTED, "%s", bm_init_msg);
}

/* Forward a call's status; on failure copy the backend's message. */
static beam_status bm_ret(const beam_ops *be, beam_status st)
{
    if (st != BEAM_OK) return bm_fail(st, "%s", be->last_error());
    return BEAM_OK;
}

/* ---- the public API (errors and the version: lib/error.c) -------------- */

BEAM_API const char *beam_backend_name(void)
{
    const beam_ops *be = bm_be();
    return be ? be->name : "none";
}

BEAM_API beam_status beam_set_backend(const char *name)
{
    bm_clear_error();
    pthread_once(&bm_once, bm_init);
    return bm_select(name, "beam_set_backend");
}

BEAM_API beam_status beam_moe_finalize(const uint16_t *expert_outputs, const float *expert_weights,
                                       int64_t capacity, int64_t live_tokens, int32_t top_k,
                                       int32_t hidden, float routed_scale, const beam_norm *post_norm,
                                       uint16_t *output, void *stream)
{
    const beam_ops *be = bm_be();
    bm_clear_error();
    if (!be) return bm_no_backend();
    return bm_ret(be, be->moe_finalize(expert_outputs, expert_weights, capacity, live_tokens, top_k,
                                       hidden, routed_scale, post_norm, output, stream));
}

BEAM_API beam_status beam_norm_residual_norm(const uint16_t *x, const uint16_t *residual, int64_t tokens,
                                             int32_t hidden, const beam_norm *pre_norm, const float *scales,
                                             const beam_norm *next_norm, uint16_t *hidden_out,
                                             uint16_t *normalized, void *stream)
{
    const beam_ops *be = bm_be();
    bm_clear_error();
    if (!be) return bm_no_backend();
    return bm_ret(be, be->norm_residual_norm(x, residual, tokens, hidden, pre_norm, scales, next_norm,
                                             hidden_out, normalized, stream));
}

BEAM_API beam_status beam_moe_finalize_norm_residual_norm(
    const uint16_t *expert_outputs, const float *expert_weights, int64_t capacity, int64_t live_tokens,
    int32_t top_k, int32_t hidden, float routed_scale, const beam_norm *post_norm,
    const uint16_t *residual, const float *scales, const beam_norm *next_norm, uint16_t *hidden_out,
    uint16_t *normalized, beam_strategy strategy, void *stream)
{
    const beam_ops *be = bm_be();
    bm_clear_error();
    if (!be) return bm_no_backend();
    return bm_ret(be, be->moe_finalize_norm_residual_norm(
                          expert_outputs, expert_weights, capacity, live_tokens, top_k, hidden, routed_scale,
                          post_norm, residual, scales, next_norm, hidden_out, normalized, strategy, stream));
}

BEAM_API beam_status beam_norm_residual_norm_q(const uint16_t *x, const uint16_t *residual, int64_t tokens,
                                               int32_t hidden, const beam_norm *pre_norm, const float *scales,
                                               const beam_norm *next_norm, uint16_t *hidden_out,
                                               uint16_t *normalized, const beam_quant *quant, void *stream)
{
    const beam_ops *be = bm_be();
    bm_clear_error();
    if (!be) return bm_no_backend();
    return bm_ret(be, be->norm_residual_norm_q(x, residual, tokens, hidden, pre_norm, scales, next_norm,
                                               hidden_out, normalized, quant, stream));
}

BEAM_API beam_status beam_moe_finalize_norm_residual_norm_q(
    const uint16_t *expert_outputs, const float *expert_weights, int64_t capacity, int64_t live_tokens,
    int32_t top_k, int32_t hidden, float routed_scale, const beam_norm *post_norm,
    const uint16_t *residual, const float *scales, const beam_norm *next_norm, uint16_t *hidden_out,
    uint16_t *normalized, const beam_quant *quant, beam_strategy strategy, void *stream)
{
    const beam_ops *be = bm_be();
    bm_clear_error();
    if (!be) return bm_no_backend();
    return bm_ret(be, be->moe_finalize_norm_residual_norm_q(
                          expert_outputs, expert_weights, capacity, live_tokens, top_k, hidden, routed_scale,
                          post_norm, residual, scales, next_norm, hidden_out, normalized, quant, strategy,
                          stream));
}

BEAM_API beam_workspace_config beam_workspace_config_default(void)
{
    const beam_ops *be = bm_be();
    beam_workspace_config c;
    if (be) return be->workspace_config_default();
    memset(&c, 0, sizeof c);
    return c;
}

/* The CPU group and its workspaces are the CPU backend's, whichever
 * backend is current: bm_table(BM_CPU, ...) below. */

BEAM_API beam_status beam_cpu_group_create(int32_t nranks, beam_cpu_group **group)
{
    const beam_ops *be;
    bm_clear_error();
    be = bm_table(BM_CPU, "beam_cpu_group_create");
    if (!be) return BEAM_ERR_UNSUPPORTED;
    return bm_ret(be, be->cpu_group_create(nranks, group));
}

BEAM_API beam_status beam_cpu_group_destroy(beam_cpu_group *group)
{
    const beam_ops *be;
    bm_clear_error();
    if (!group) return BEAM_OK;
    be = bm_table(BM_CPU, "beam_cpu_group_destroy");
    if (!be) return BEAM_ERR_UNSUPPORTED;
    return bm_ret(be, be->cpu_group_destroy(group));
}

/* Wrap a backend's new workspace so later calls reach the same backend. */
static beam_status bm_wrap(const beam_ops *be, beam_status st, beam_workspace *inner, beam_workspace **out,
                           const char *fn)
{
    struct beam_workspace *w;
    if (st != BEAM_OK) return bm_ret(be, st);
    w = (struct beam_workspace *)malloc(sizeof *w);
    if (!w) {
        /* Collective destroy is fine here: the CPU group's destroy is local. */
        be->workspace_destroy(inner);
        return bm_fail(BEAM_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    }
    w->be = be;
    w->inner = inner;
    *out = w;
    return BEAM_OK;
}

BEAM_API beam_status beam_workspace_create_cpu(beam_cpu_group *group, int32_t rank, int64_t max_tokens,
                                               int32_t hidden, const beam_workspace_config *cfg,
                                               beam_workspace **workspace)
{
    static const char fn[] = "beam_workspace_create_cpu";
    const beam_ops *be;
    beam_workspace *inner = NULL;
    struct beam_workspace *w = NULL;
    beam_status st;
    bm_clear_error();
    if (workspace) *workspace = NULL;
    be = bm_table(BM_CPU, fn);
    if (!be)
        return workspace ? BEAM_ERR_UNSUPPORTED
                         : bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: workspace must not be NULL", fn);
    /* The wrapper before the collective call: a rank that has no out-
     * parameter or no memory for it still joins its peers (the backend
     * takes a NULL out-parameter as this rank's failure), so that every
     * rank fails at once instead of the others waiting for it, or holding
     * workspaces this rank does not. */
    if (workspace) w = (struct beam_workspace *)malloc(sizeof *w);
    st = be->workspace_create_cpu(group, rank, max_tokens, hidden, cfg, w ? &inner : NULL);
    if (workspace && !w) return bm_fail(BEAM_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    if (st != BEAM_OK || !w) {
        free(w);
        return bm_ret(be, st);
    }
    w->be = be;
    w->inner = inner;
    *workspace = w;
    return BEAM_OK;
}

BEAM_API beam_status beam_workspace_create_nccl(void *nccl_comm, int64_t max_tokens, int32_t hidden,
                                                const beam_workspace_config *cfg, beam_workspace **workspace)
{
    static const char fn[] = "beam_workspace_create_nccl";
    const beam_ops *be = bm_be();
    beam_workspace *inner = NULL;
    beam_status st;
    bm_clear_error();
    if (!workspace) return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: workspace must not be NULL", fn);
    *workspace = NULL;
    if (!be) return bm_no_backend();
    st = be->workspace_create_nccl(nccl_comm, max_tokens, hidden, cfg, &inner);
    return bm_wrap(be, st, inner, workspace, fn);
}

BEAM_API beam_status beam_workspace_destroy(beam_workspace *workspace)
{
    beam_status st;
    bm_clear_error();
    if (!workspace) return BEAM_OK;
    st = bm_ret(workspace->be, workspace->be->workspace_destroy(workspace->inner));
    /* The backend refused (an argument error: a call on the workspace is
     * still in progress) and kept its handle: keep ours too. */
    if (st == BEAM_ERR_INVALID_ARGUMENT) return st;
    free(workspace);
    return st;
}

BEAM_API beam_status beam_workspace_info(const beam_workspace *workspace, int32_t *rank, int32_t *nranks)
{
    bm_clear_error();
    if (!workspace)
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "beam_workspace_info: workspace must not be NULL");
    return bm_ret(workspace->be, workspace->be->workspace_info(workspace->inner, rank, nranks));
}

BEAM_API beam_status beam_moe_finalize_gather_norm_residual_norm(
    beam_workspace *workspace, const uint16_t *expert_outputs, const float *expert_weights, int64_t capacity,
    int64_t tokens, int32_t top_k, int32_t hidden, float routed_scale, const beam_norm *post_norm,
    const uint16_t *residual, const float *scales, const beam_norm *next_norm, uint16_t *hidden_out,
    uint16_t *normalized, beam_strategy strategy, void *stream)
{
    bm_clear_error();
    if (!workspace)
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT,
                       "beam_moe_finalize_gather_norm_residual_norm: workspace must not be NULL");
    return bm_ret(workspace->be, workspace->be->moe_finalize_gather_norm_residual_norm(
                                     workspace->inner, expert_outputs, expert_weights, capacity, tokens,
                                     top_k, hidden, routed_scale, post_norm, residual, scales, next_norm,
                                     hidden_out, normalized, strategy, stream));
}

BEAM_API beam_status beam_moe_finalize_gather_norm_residual_norm_q(
    beam_workspace *workspace, const uint16_t *expert_outputs, const float *expert_weights, int64_t capacity,
    int64_t tokens, int32_t top_k, int32_t hidden, float routed_scale, const beam_norm *post_norm,
    const uint16_t *residual, const float *scales, const beam_norm *next_norm, uint16_t *hidden_out,
    uint16_t *normalized, const beam_quant *quant, beam_strategy strategy, void *stream)
{
    bm_clear_error();
    if (!workspace)
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT,
                       "beam_moe_finalize_gather_norm_residual_norm_q: workspace must not be NULL");
    return bm_ret(workspace->be, workspace->be->moe_finalize_gather_norm_residual_norm_q(
                                     workspace->inner, expert_outputs, expert_weights, capacity, tokens,
                                     top_k, hidden, routed_scale, post_norm, residual, scales, next_norm,
                                     hidden_out, normalized, quant, strategy, stream));
}

BEAM_API beam_status beam_allreduce_norm_residual_norm(beam_workspace *workspace, const uint16_t *partial,
                                                       int64_t tokens, int32_t hidden, const beam_norm *pre_norm,
                                                       const uint16_t *residual, const float *scales,
                                                       const beam_norm *next_norm, uint16_t *hidden_out,
                                                       uint16_t *normalized, const beam_quant *quant,
                                                       beam_strategy strategy, void *stream)
{
    bm_clear_error();
    if (!workspace)
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT, "beam_allreduce_norm_residual_norm: workspace must not be NULL");
    return bm_ret(workspace->be, workspace->be->allreduce_norm_residual_norm(
                                     workspace->inner, partial, tokens, hidden, pre_norm, residual, scales,
                                     next_norm, hidden_out, normalized, quant, strategy, stream));
}

BEAM_API beam_status beam_moe_finalize_allreduce_norm_residual_norm(
    beam_workspace *workspace, const uint16_t *expert_outputs, const float *expert_weights, int64_t capacity,
    int64_t tokens, int32_t top_k, int32_t hidden, float routed_scale, const beam_norm *post_norm,
    const uint16_t *residual, const float *scales, const beam_norm *next_norm, uint16_t *hidden_out,
    uint16_t *normalized, const beam_quant *quant, beam_strategy strategy, void *stream)
{
    bm_clear_error();
    if (!workspace)
        return bm_fail(BEAM_ERR_INVALID_ARGUMENT,
                       "beam_moe_finalize_allreduce_norm_residual_norm: workspace must not be NULL");
    return bm_ret(workspace->be, workspace->be->moe_finalize_allreduce_norm_residual_norm(
                                     workspace->inner, expert_outputs, expert_weights, capacity, tokens,
                                     top_k, hidden, routed_scale, post_norm, residual, scales, next_norm,
                                     hidden_out, normalized, quant, strategy, stream));
}

BEAM_API const beam_ops *beam_backend_ops(const char *name, uint32_t version)
{
    static const char fn[] = "beam_backend_ops";
    const beam_ops *be;
    int b;
    bm_clear_error();
    if (version < 1 || version > BEAM_OPS_VERSION) {
        bm_fail(BEAM_ERR_UNSUPPORTED, "%s: version=%u: this library serves table versions 1 to %u", fn,
                (unsigned)version, (unsigned)BEAM_OPS_VERSION);
        return NULL;
    }
    if (!name) {
        be = bm_be();
        if (!be) bm_no_backend();
        return be;
    }
    b = bm_backend_find(name);
    if (b < 0) {
        bm_fail(BEAM_ERR_INVALID_ARGUMENT, "%s: name=\"%s\" must be %s", fn, name, bm_backend_choices(1));
        return NULL;
    }
    return bm_table(b, fn);
}
