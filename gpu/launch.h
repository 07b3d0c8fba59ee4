/*
 * launch.h - choosing and launching the row kernels (internal, C++).
 *
 * A launch shape is (NT threads per block, J chunks per thread, U expert
 * slots loaded ahead, CS blocks of a cluster per row, PDL or not, D stages
 * of the pipelined kernel or 0, MB blocks per multiprocessor for the
 * compiler's register budget). bm_pick_shape chooses one per call from the
 * row count, the hidden size and what a row holds, by the table
 * gpu/shapes.def (no device query per call beyond the multiprocessor
 * count, asked once per device):
 *  - decode (rows <= 64): the row kernel, one chunk per thread, the row
 *    spread over a cluster of up to 8 blocks (latency: every load of the row
 *    in flight at once, on up to 8 multiprocessors), or for most of
 *    norm_residual_norm's calls at H > 4096 the nrn kernel (one block per
 *    row);
 *  - prefill: the pipelined kernel (pipe_kernel.cuh) for finalize and the
 *    fused op, the nrn kernel (nrn_kernel.cuh) for norm_residual_norm,
 *    the row kernel where it measured faster.
 * Every shape is launched with programmatic dependent launch, so that a
 * kernel's launch overlaps the tail of the preceding kernel of the stream
 * (each kernel waits for that one before touching memory).
 * The measurements behind each row of the table, from bench/shape_sweep:
 * docs/log/2026-12-04-shapes.md.
 */
#ifndef BEAMMOE_GPU_LAUNCH_H
#define BEAMMOE_GPU_LAUNCH_H

#include <cuda_runtime.h>

#include "params.cuh"

struct bm_shape {
    int nt;  /* threads per block: 32 .. 1024, a power of two */
    int j;   /* chunks per thread: 1, 2, 4 or 8; cs * nt * j >= hidden / 8 */
    int u;   /* expert slots loaded ahead: 1, 2, 4 or 8 */
    int cs;  /* blocks per row (a thread block cluster): 1, 2, 4 or 8 */
    int pdl; /* launch with programmatic stream serialization */
    int d;   /* > 0: the pipelined kernel (pipe_kernel.cuh) with d stages
              * (vector path, cs == 1, u unused); 0: the row kernel */
    int mb;  /* pipelined and nrn kernels: resident blocks per
              * multiprocessor asked of the compiler (its register budget);
              * 1 otherwise */
    int st;  /* > 0: norm_residual_norm's prefill kernel (nrn_kernel.cuh;
              * vector path, cs == 1, u and d unused), its row loads with
              * L2 policy (st - 1) % 3 (0 none, 1 evict_last, 2
              * evict_first), the row held packed when (st - 1) / 3 is
              * odd, the next row requested into L2 when st > 6 */
};

/* The st of the nrn kernel with L2 policy hint (0 none, 1 evict_last,
 * 2 evict_first), its row packed (pk 1) or not, the next row requested
 * into L2 (pf 1) or not: the one place that encodes it. */
constexpr int bm_nrn_st(int hint, int pk, int pf = 0)
{
    return 1 + hint + 3 * pk + 6 * pf;
}

/* The shape the library uses for the launch p (rows, hidden, and what the
 * row holds: finalize or not, a pre-norm or not, quant: the kind of its
 * quantized output, BEAM_QUANT_*, or 0). shared 1: ranks of an in-process
 * group share the device, where the peers' gather blocks, waiting for this
 * rank, may hold multiprocessors in every GPC; then no clusters, the
 * prefill shapes at decode too. A cluster of CS blocks starts only when
 * one GPC has CS multiprocessors with room at once, so a rank's clusters
 * could wait for its peers while they wait for it (tests/test_gather_group
 * timed out so: docs/log/2026-12-04-shapes.md, shared). */
bm_shape bm_pick_shape(const bm_row_params &p, int quant = 0, int shared = 0);

/* The row-kernel shape that stands in for a pipelined or nrn one when a
 * base is not 16-byte aligned (both load 16 bytes at a time), and for an
 * nrn one on rows it does not take (expert slots, no residual); other
 * shapes as is. */
bm_shape bm_row_twin(bm_shape s);

/* 1 when the shape is one of the compiled instantiations and covers hidden. */
int bm_shape_ok(bm_shape s, int hidden);

/* The compiled shapes (row kernel, then pipelined), at most max of them
 * into out; returns how many there are. For bench/shape_sweep. */
int bm_shape_list(bm_shape *out, int max);

/* 1 when every BF16 base of p is 16-byte aligned and the quantized values
 * (q, when not NULL) 8-byte aligned (the vector path). */
int bm_params_vec_ok(const bm_row_params &p, const bm_quant *q = nullptr);

/* Load every row kernel (lazy module loading would otherwise load one at
 * its first launch, which can wait for the device to be idle). */
cudaError_t bm_preload_rows(void);

/* Load kernel now (cudaFuncGetAttributes loads a function); its error, if
 * any, into e. */
template <class K>
inline void bm_preload(cudaError_t &e, K kernel)
{
    cudaFuncAttributes fa;
    const cudaError_t r = cudaFuncGetAttributes(&fa, kernel);
    if (r != cudaSuccess)
        e = r;
}

/* Launch on stream; returns cudaGetLastError() of the launch. rows == 0
 * launches nothing. q: the quantized output of normalized (NULL or kind 0:
 * none), which launches the kernels compiled with it. */
cudaError_t bm_launch_rows(const bm_row_params &p, bm_shape s, int vec,
                           cudaStream_t stream, const bm_quant *q = nullptr);

/* The one launch helper: grid of `blocks` blocks of nt threads, clusters
 * of cs blocks, smem bytes of dynamic shared memory, programmatic
 * dependent launch when pdl (the row kernels' and the gather's). */
template <typename K, typename P>
inline cudaError_t bm_launch(K kernel, const P &p, unsigned blocks, int nt, int cs,
                             size_t smem, int pdl, cudaStream_t stream)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[2];
    int n = 0;
    cfg.gridDim = dim3(blocks, 1, 1);
    cfg.blockDim = dim3((unsigned)nt, 1, 1);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    if (cs > 1) {
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = (unsigned)cs;
        at[n].val.clusterDim.y = 1;
        at[n].val.clusterDim.z = 1;
        ++n;
    }
    if (pdl) {
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n].val.programmaticStreamSerializationAllowed = 1;
        ++n;
    }
    cfg.attrs = at;
    cfg.numAttrs = n;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, p);
    return e != cudaSuccess ? e : cudaGetLastError();
}

#endif
