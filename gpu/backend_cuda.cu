/*
 * backend_cuda.cu - the ops table of libbeammoe_cuda (lib/backend.h).
 *
 * lib/api.c has checked every argument before any of these runs; what is
 * left here is CUDA's own rule (every pointer in device memory of the
 * current device), mapping a call onto the row kernel (gpu/row_kernel.cuh)
 * and turning CUDA errors into BEAM_ERR_DEVICE with CUDA's message.
 *
 * Every entry point is stream-ordered and capturable in a CUDA graph: no
 * allocation, no synchronization, no device query per call beyond the
 * pointer attribute checks (cudaPointerGetAttributes, about 0.1 us each).
 */
#include <stdint.h>

#include <cuda_runtime.h>

#include "backend.h"
#include "error.h"
#include "launch.h"
#include "gather.h"

/* ---- availability and pointers ------------------------------------------ */

static beam_status bm_cuda_available(void)
{
    int n = 0, dev = 0, major = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || (e == cudaSuccess && n == 0)) {
        (void)cudaGetLastError();
        return bm_fail(BEAM_ERR_UNSUPPORTED, "cuda backend: no CUDA device is visible (%s)",
                       e == cudaSuccess ? "device count is 0" : cudaGetErrorString(e));
    }
    if (e != cudaSuccess)
        return bm_fail(BEAM_ERR_DEVICE, "cuda backend: cudaGetDeviceCount failed: %s",
                       cudaGetErrorString(e));
    e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e != cudaSuccess)
        return bm_fail(BEAM_ERR_DEVICE, "cuda backend: cannot query the current device: %s",
                       cudaGetErrorString(e));
    /* The kernels are built for sm_90 (plus its PTX): clusters, griddepcontrol. */
    if (major < 9)
        return bm_fail(BEAM_ERR_UNSUPPORTED,
                       "cuda backend: device %d has compute capability %d.x; the kernels need 9.0 or newer",
                       dev, major);
    return BEAM_OK;
}

static const char *bm_mem_kind(cudaMemoryType t)
{
    switch (t) {
    case cudaMemoryTypeUnregistered: return "ordinary host";
    case cudaMemoryTypeHost: return "pinned host";
    case cudaMemoryTypeDevice: return "device";
    case cudaMemoryTypeManaged: return "managed";
    }
    return "unknown";
}

/* docs/contract.md: every pointer in device memory of the current device.
 * Device and managed allocations of the current device pass; host memory
 * (pageable or pinned) and other devices' memory do not. Empty extents are
 * never touched and skipped, like lib's generic checks do. */
static beam_status bm_cuda_check_pointers(const char *fn, const bm_ptr *p, int n)
{
    int dev = -1, i;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess)
        return bm_fail(BEAM_ERR_DEVICE, "%s: cudaGetDevice failed: %s", fn, cudaGetErrorString(e));
    for (i = 0; i < n; i++) {
        cudaPointerAttributes at;
        if (p[i].bytes == 0 || !p[i].ptr)
            continue;
        e = cudaPointerGetAttributes(&at, p[i].ptr);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            if (e == cudaErrorInvalidValue)
                return bm_fail(BEAM_ERR_INVALID_ARGUMENT,
                               "%s: %s=%p must be device memory of the current device %d (not a CUDA pointer)",
                               fn, p[i].name, p[i].ptr, dev);
            return bm_fail(BEAM_ERR_DEVICE, "%s: cudaPointerGetAttributes(%s) failed: %s", fn,
                           p[i].name, cudaGetErrorString(e));
        }
        if (at.type != cudaMemoryTypeDevice && at.type != cudaMemoryTypeManaged)
            return bm_fail(BEAM_ERR_INVALID_ARGUMENT,
                           "%s: %s=%p must be device memory of the current device %d (it is %s memory)", fn,
                           p[i].name, p[i].ptr, dev, bm_mem_kind(at.type));
        if (at.device != dev)
            return bm_fail(BEAM_ERR_INVALID_ARGUMENT,
                           "%s: %s=%p must be device memory of the current device %d (it belongs to device %d)",
                           fn, p[i].name, p[i].ptr, dev, at.device);
    }
    return BEAM_OK;
}

/* ---- operations ----------------------------------------------------------- */

static beam_status bm_cuda_run(const char *fn, const bm_row_params &p, void *stream,
                               const bm_quant *q = nullptr)
{
    const bm_shape s = bm_pick_shape(p, q ? q->kind : 0);
    cudaError_t e = bm_launch_rows(p, s, bm_params_vec_ok(p, q), (cudaStream_t)stream, q);
    if (e != cudaSuccess)
        return bm_fail(BEAM_ERR_DEVICE, "%s: kernel launch failed: %s", fn, cudaGetErrorString(e));
    return BEAM_OK;
}

/* a norm as the kernels take it: on, its weight (NULL when off), eps */
static void bm_norm_of(const bm_norm &n, int &on, const uint16_t *&w, float &eps)
{
    on = n.on;
    w = n.on ? n.weight : NULL;
    eps = n.eps;
}

bm_row_params bm_params_of(const bm_args *a, unsigned parts)
{
    bm_row_params p = {};
    p.rows = a->tokens;
    p.hidden = a->hidden;
    if (parts & BM_PART_FIN) {
        p.experts = a->experts;
        p.weights = a->weights;
        p.top_k = a->top_k;
        p.routed_scale = a->routed_scale;
        bm_norm_of(a->post, p.normA, p.wA, p.epsA);
        p.out = a->output;
    }
    if (parts & BM_PART_X) {
        p.x = a->x;
        bm_norm_of(a->pre, p.normA, p.wA, p.epsA);
    }
    if (parts & BM_PART_RES) {
        p.residual = a->residual;
        p.has_scales = a->has_scales;
        p.scale_x = a->scale_x;
        p.scale_r = a->scale_r;
        bm_norm_of(a->next, p.normB, p.wB, p.epsB);
        p.out = a->hidden_out;
        p.normalized = a->next.on ? a->normalized : NULL;
    }
    return p;
}

static beam_status bm_cuda_finalize(const bm_args *a)
{
    return bm_cuda_run(a->fn, bm_params_of(a, BM_PART_FIN), a->stream);
}

static beam_status bm_cuda_norm_residual_norm(const bm_args *a)
{
    return bm_cuda_run(a->fn, bm_params_of(a, BM_PART_X | BM_PART_RES), a->stream, &a->q);
}

/* One kernel: each input byte read once, each output byte written once; the
 * finalized row stays in registers. */
static beam_status bm_cuda_fused(const bm_args *a)
{
    return bm_cuda_run(a->fn, bm_params_of(a, BM_PART_FIN | BM_PART_RES), a->stream, &a->q);
}

/* The composition: the finalize kernel writes the finalized rows into a
 * scratch buffer, then the norm_residual_norm kernel (no pre-norm) reads
 * them back. No allocation: the scratch is an output of the call itself.
 *  - hidden_out != residual: hidden_out. The second kernel then reads x from
 *    the buffer it writes; that is safe because each thread reads its own
 *    elements of a row before it writes them.
 *  - hidden_out == residual (in place) with a next norm: normalized, by the
 *    same argument.
 *  - in place without a next norm: no output is free to hold the finalized
 *    rows (hidden_out still holds the residual). Then the fused kernel runs;
 *    it computes the same composition in one pass, with the same bits by
 *    construction (docs/numerics.md). */
static beam_status bm_cuda_unfused(const bm_args *a)
{
    const char *fn = a->fn;
    uint16_t *scratch = a->hidden_out != a->residual ? a->hidden_out
                        : a->next.on                  ? a->normalized
                                                      : NULL;
    if (!scratch)
        return bm_cuda_fused(a);
    bm_row_params f = bm_params_of(a, BM_PART_FIN);
    f.out = scratch;
    BM_CHECK(bm_cuda_run(fn, f, a->stream));
    bm_row_params r = bm_params_of(a, BM_PART_RES);
    r.x = scratch;
    return bm_cuda_run(fn, r, a->stream, &a->q);
}

/* The gather (gpu/gather*.cu) brings its own defaults, measured on two
 * H200s: bm_cuda_ws_default. */
extern "C" const bm_backend bm_backend_table = {
    "cuda",
    bm_cuda_available,
    bm_cuda_check_pointers,
    bm_cuda_finalize,
    bm_cuda_norm_residual_norm,
    bm_cuda_fused,
    bm_cuda_unfused,
    bm_cuda_ws_default,
    bm_cuda_group_create, /* an in-process group: ranks are threads (gather_group.cu) */
    bm_cuda_group_destroy,
    bm_cuda_ws_create_group,
    bm_cuda_ws_create_nccl,
    bm_cuda_ws_destroy,
    bm_cuda_gather,
    bm_cuda_allreduce, /* on the gather's workspace and protocol (gpu/allreduce_fused.cu) */
};
