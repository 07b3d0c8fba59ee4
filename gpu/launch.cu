/*
 * launch.cu - the compiled launch shapes of the row kernels, the choice
 * among them, and the one helper that launches any of them (internal).
 */
#include <limits.h>

#include <atomic>

#include "launch.h"

/* Every row-kernel shape (NT, J, U, CS) instantiated, each in a vector and a
 * scalar version: the shapes bm_pick_shape returns (decode: one chunk per
 * thread, clusters of 1 to 8; prefill with hidden <= 4096), the row-kernel
 * twins of the pipelined shapes (bases not 16-byte aligned) and the
 * candidates bench/shape_sweep times against them. */
#define BM_SHAPES(X)                                                          \
    X(32, 1, 8, 1) X(64, 1, 8, 1) X(128, 1, 8, 1) X(256, 1, 8, 1)              \
    X(64, 1, 8, 2) X(64, 1, 8, 4) X(64, 1, 8, 8) X(128, 1, 8, 2)               \
    X(128, 1, 8, 4) X(128, 1, 8, 8) X(256, 1, 8, 2) X(256, 1, 8, 4)            \
    X(512, 1, 8, 2)                                                            \
    X(128, 2, 4, 1) X(256, 2, 4, 1) X(256, 4, 2, 1) X(512, 2, 2, 1)            \
    X(512, 1, 4, 1) X(1024, 1, 2, 1) X(128, 4, 2, 1)

/* Pipelined shapes (NT, J, D, MB): prefill, vector path; MB resident blocks
 * per multiprocessor asked of the compiler (__launch_bounds__), 1: none. */
#define BM_PIPES(X)                                                           \
    X(256, 4, 2, 1) X(256, 4, 3, 1) X(256, 4, 4, 1) X(512, 2, 3, 1)            \
    X(512, 2, 4, 1) X(512, 2, 3, 3) X(512, 2, 4, 3) X(1024, 1, 4, 1)           \
    X(1024, 1, 3, 2) X(128, 4, 4, 1) X(256, 2, 4, 1) X(256, 2, 4, 6)           \
    X(512, 1, 4, 1) X(128, 2, 4, 1) X(128, 2, 4, 8) X(256, 1, 4, 1)            \
    X(256, 1, 4, 8)

/* norm_residual_norm's prefill shapes (NT, J, MB, HINT, PK, PF): MB
 * resident blocks per multiprocessor asked of the compiler; HINT the L2
 * policy of the row loads; PK 1: the row held as packed BF16 bits; PF 1:
 * the block's next row of the grid-stride loop requested into L2 at the
 * row's start (none with a grid of one block per row: nrn_kernel.cuh). */
#define BM_NRNS(X)                                                            \
    X(512, 2, 2, 0, 0, 0) X(512, 2, 2, 1, 0, 0) X(512, 2, 2, 2, 0, 0)          \
    X(1024, 1, 2, 1, 0, 0) X(256, 2, 4, 0, 0, 0) X(256, 2, 4, 1, 0, 0)         \
    X(256, 2, 4, 2, 0, 0) X(128, 2, 8, 0, 0, 0) X(128, 2, 8, 1, 0, 0)          \
    X(128, 2, 8, 2, 0, 0) X(256, 1, 8, 1, 0, 0)                                \
    X(128, 8, 4, 1, 1, 0) X(128, 8, 4, 2, 1, 0) X(256, 4, 4, 1, 1, 0)          \
    X(512, 2, 3, 1, 1, 0) X(128, 4, 8, 1, 1, 0)                                \
    X(128, 8, 4, 1, 1, 1) X(128, 2, 8, 1, 0, 1) X(256, 2, 4, 1, 0, 1)          \
    X(512, 2, 2, 1, 0, 1) X(128, 4, 8, 1, 1, 1)

static int next_pow2(int c)
{
    int n = 1;
    while (n < c)
        n *= 2;
    return n;
}

/* Multiprocessors of the current device, asked once per device (a host-side
 * attribute query, legal during graph capture). */
static int bm_device_sms(void)
{
    enum { MAX_DEV = 64 };
    static std::atomic<int> sms[MAX_DEV];
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= MAX_DEV)
        return 132;
    n = sms[dev].load(std::memory_order_relaxed);
    if (n == 0) {
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) {
            (void)cudaGetLastError();
            return 132;
        }
        sms[dev].store(n, std::memory_order_relaxed);
    }
    return n;
}

bm_shape bm_pick_shape(const bm_row_params &p, int quant, int shared)
{
    const int64_t rows = p.rows;
    const int n2 = next_pow2(p.hidden / 8); /* 32 .. 1024 */
    const bool fin = p.experts != NULL;
    bm_shape s;
    /* Every launch asks for programmatic dependent launch: each kernel waits
     * (griddepcontrol.wait) for the preceding one before touching memory, so
     * only its launch and scheduling overlap that kernel's tail. Measured
     * beyond decode too (bench/shape_sweep perf, one H200, same shape
     * without and with): T = 512, H = 7168, norm_residual_norm 8.90-9.00 ->
     * 8.46-8.49 us, with a pre-norm 9.63-9.77 -> 9.54-9.56, finalize 18.32
     * -> 17.61, fused 23.13 -> 22.34, FP8 group 128 nrn 12.19 -> 11.81;
     * T = 4096: nrn with a pre-norm 58.89 -> 58.06 (H = 7168), 18.19 ->
     * 17.88 (H = 2048); at T >= 4096 the fused op and finalize move by
     * -1.2% to +0.7% (docs/PERF.md). */
    s.pdl = 1;
    s.cs = 1;
    s.d = 0;
    s.u = 0;
    s.mb = 1;
    s.st = 0;
    /* norm_residual_norm (no expert slots, a residual): the nrn kernel
     * (nrn_kernel.cuh), one row per block, an L2 policy on its row loads
     * (below). Measured (bench/shape_sweep, cuda_bench): at decode for
     * H > 4096 it beats the cluster row kernel without a pre-norm at
     * T = 1, 8, 64 and with one from T = 64 (at T = 1 the cluster's eight
     * multiprocessors do the two reductions' loads sooner: 2.91 against
     * 3.04 us); in prefill it beats every other kernel (below: which of
     * its shapes) */
    const bool nrn_decode = n2 >= 1024 && (!p.normA || rows > 8);
    /* With a quantized output (quant: its kind) norm_residual_norm's rows
     * take other kernels (shape_sweep perf --quant 1 and 4, FP8 group 128
     * and NVFP4, one H200; FP8's token and tensor scales take FP8 group
     * 128's kernels), the cluster row kernel at decode (T = 1: 2.61
     * against 3.37 us; T = 64: 3.93 against 4.24; below), and in prefill:
     *  - H = 7168, FP8: the row kernel of 256 threads x 4 chunks (T = 512
     *    next norm 12.03 us against 12.34 for the pipelined kernel of
     *    512 x 2; T = 4096 58.21 / 70.50 with a pre-norm against 60.48 /
     *    77.47 for the pipelined 256 x 4; T = 16384 211.07 / 257.78
     *    against 223.37 / 290.57), but with a pre-norm up to T = 512 the
     *    pipelined 256 x 4, depth 2 (T = 512: 13.75 against 14.02 us,
     *    token 12.83 against 13.12, tensor 12.23 against 12.60; NVFP4
     *    15.14 against 15.63 for depth 3);
     *  - H = 7168, NVFP4: the pipelined kernel of 512 x 2, depth 3 for
     *    T <= 512 without a pre-norm (T = 512: 14.42 against 16.53 for the
     *    nrn kernel), of 256 x 4, depth 3 otherwise (T = 16384: 287.91
     *    against 317.34 for the row kernel);
     *  - H = 4096 and 2048, NVFP4: the pipelined kernel of 128 threads,
     *    depth 4 (T = 4096, H = 2048: next norm 22.92 against 23.77 us for
     *    the row kernel, pre-norm 27.07 against 27.90 for the nrn kernel;
     *    H = 4096: 42.41 / 51.51 against 44.41 / 53.73 for the row kernel);
     *  - H = 2048 with a pre-norm, FP8: the nrn kernel's float rows,
     *    128 x 2, evict_first (T = 4096: 23.52 against 25.26 us);
     *  - else at H = 4096 and 2048 the row kernel, 128 threads (T = 4096
     *    next norm: 37.33 against 38.72 us for the pipelined; 21.49
     *    against 25.68). */
    if (quant && !fin && p.residual && rows > 64 && n2 >= 256) {
        if (n2 >= 1024 && p.normA && rows <= 512) {
            s.nt = 256; s.j = 4; s.d = 2;
        } else if (n2 >= 1024 && quant != BM_QUANT_NVFP4) {
            s.nt = 256; s.j = 4; s.u = 2;
        } else if (n2 >= 1024 && rows <= 512 && !p.normA) {
            s.nt = 512; s.j = 2; s.d = 3;
        } else if (n2 >= 1024) {
            s.nt = 256; s.j = 4; s.d = 3;
        } else if (quant == BM_QUANT_NVFP4) {
            s.nt = 128; s.j = n2 / 128; s.d = 4;
        } else if (n2 == 256 && p.normA) {
            s.nt = 128; s.j = 2; s.mb = 8;
            s.st = bm_nrn_st(2, 0);
        } else {
            s.nt = 128; s.j = n2 / 128; s.u = n2 == 512 ? 2 : 4;
        }
        return s;
    }
    /* ... and the fused op's (one H200, since the pipelined kernel holds
     * or early-loads its norm weights): at H = 7168 in prefill the
     * pipelined kernel of 256 x 4, depth 4 (fused + post, FP8 group 128:
     * T = 512 26.45 against 26.88 us for the plain rows' 512 x 2, depth 3;
     * T = 4096 155.92 against 160.67; T = 16384 589.31 against 611.86,
     * 588.58 at depth 3; NVFP4 27.05 / 162.27 / 603.19 against 27.51 /
     * 174.16 / 659.50); at H = 2048 beyond T = 512 FP8's the row kernel
     * of 256 x 1 (fused + post, group 128, T = 4096: 48.89 against 51.38
     * for the pipelined 128 x 2; token 49.08 against 51.09), NVFP4's the
     * pipelined 128 x 2, depth 4 (46.38 against 50.95 with 8 blocks a
     * multiprocessor asked of the compiler) */
    if (quant && fin && p.residual && ((rows > 64 && n2 >= 1024) || (rows > 512 && n2 == 256))) {
        if (n2 >= 1024) {
            s.nt = 256; s.j = 4; s.d = 4;
        } else if (quant == BM_QUANT_NVFP4) {
            s.nt = 128; s.j = 2; s.d = 4;
        } else {
            s.nt = 256; s.j = 1; s.u = 8;
        }
        return s;
    }
    /* In prefill at H > 4096 the nrn kernel holds its rows packed (PK),
     * four per multiprocessor, with or without a pre-norm (bench/shape_sweep
     * perf --op 1, one H200; the float rows of 512 x 2, two per
     * multiprocessor, or the pipelined kernel before): T = 512 next norm
     * 9.77 against 10.34 us, pre + next 10.98 against 13.18; T = 4096 pre +
     * next 60.22 against 64.86 (91.5% of the floor); T = 16384 pre + next
     * 222.78 against 241.86 (99.1%), next norm 222.18 against 226.16. At
     * decode, and at H = 4096 and 2048, the float rows stay ahead or level,
     * but for H = 4096 with scales: there 128 x 4 packed, eight rows a
     * multiprocessor (T = 4096 pre + next + scales 35.54 against 36.58
     * us; without scales the float rows are faster, 34.59 against 35.19).
     * Its row loads evict_first up to T = 512 at H > 4096, evict_last
     * beyond (the same tool: T = 512 pre + next 10.67 against 10.93 us,
     * with scales 11.29 against 11.79, next norm 9.71 against 9.74;
     * T = 4096 60.78 against 58.91, T = 16384 240.46 against 223.07).
     * Beyond T = 512 at H > 4096 the PF twin of that shape, which measured
     * faster (two runs of the same tool, T = 4096: pre + next 58.52-58.54
     * against 59.31-59.39 us, with scales 58.93-58.99 against
     * 59.72-59.87, next norm level; T = 16384 pre + next 222.17 against
     * 223.05) though with a grid of one block per row it issues no
     * prefetch (nrn_kernel.cuh): the difference is the compiled code's or
     * the order of the runs, not the prefetch's. */
    if (!fin && p.residual && rows > 64 && !quant && (n2 >= 1024 || (n2 == 512 && p.has_scales))) {
        s.nt = 128;
        s.j = n2 >= 1024 ? 8 : 4;
        s.mb = n2 >= 1024 ? 4 : 8;
        s.st = n2 >= 1024 && rows <= 512 ? bm_nrn_st(2, 1) : bm_nrn_st(1, 1, n2 >= 1024);
        return s;
    }
    if (!fin && p.residual && n2 >= 256 && (rows > 64 || (nrn_decode && !quant))) {
        s.nt = n2 >= 1024 ? 512 : n2 == 512 ? 256 : 128;
        s.j = 2;
        s.mb = n2 >= 1024 ? 2 : n2 == 512 ? 4 : 8;
        /* the row loads evict_last in prefill (HINT 1), evict_first at
         * decode (HINT 2): at T = 64, H = 7168 (shape_sweep perf, two runs)
         * 2.94 against 3.10-3.12 us, with a pre-norm 3.72 against
         * 3.90-3.93, with scales too 3.85-3.87 against 4.07-4.08 */
        s.st = bm_nrn_st(rows <= 64 ? 2 : 1, 0);
        return s;
    }
    if (rows <= 64 && !shared) {
        /* decode: one chunk per thread, the whole row loaded at once, the
         * row spread over a cluster of up to 8 multiprocessors as long as
         * the grid stays within one wave */
        const int sms = bm_device_sms();
        /* Clusters of 8 blocks (bench/shape_sweep perf, cold and --hot, one
         * H200; fused + post, H = 7168, against 4 blocks a row):
         *  - finalize rows (the fused op, finalize) up to T = 8: T = 2
         *    3.15 against 3.42 us (hot 2.92 / 3.26), T = 8 3.34 / 3.60 (hot
         *    2.96 / 3.32); with a quantized output FP8 4.47 against 4.81,
         *    NVFP4 4.09 against 5.03 (T = 8);
         *  - without a quantized output also at T = 17..32 for H = 7168,
         *    two blocks a multiprocessor (T = 32: 4.73 against 4.85, hot
         *    3.98 / 4.19; finalize 2.79 / 2.84), though not at T = 16
         *    (level cold, hot 3.42 against 3.36, finalize 1.83 / 1.71),
         *    and at T <= 16 for H = 4096 (T = 16: 3.30 against 3.39);
         *  - for rows without expert slots (norm_residual_norm at decode
         *    where the nrn kernel does not take it) only at T = 1. */
        const bool plain_fin = fin && !quant;
        const bool two_per_sm = plain_fin && n2 >= 1024 && rows > 16 && rows <= 32;
        const bool wide = fin ? rows <= 8 || two_per_sm || (plain_fin && n2 == 512 && rows <= 16) : rows <= 1;
        int cs = wide ? 8 : 4;
        while (cs > 1 && (rows * cs > (two_per_sm ? 2 * sms : sms) || n2 / cs < 64))
            cs /= 2;
        s.cs = cs;
        s.nt = n2 / cs;
        s.j = 1;
        s.u = 8;
        return s;
    }
    /* prefill: the fastest shape of bench/shape_sweep on an H200 for each
     * kind of row (docs/PERF.md): the pipelined kernel where a row has many
     * items (finalize: K slots and the residual); for rows of neither
     * (norm_residual_norm's took the nrn kernel above) at H > 4096, the
     * pipeline with 3 blocks per multiprocessor. Finalize and the fused op
     * at H = 7168: 512 x 2, depth 3 up to T = 512 (fused + post, T = 512:
     * 24.46 against 24.60 us for 256 x 4), 256 x 4, depth 3 beyond (T =
     * 4096: 157.07 against 158.34; T = 16384: 611.23 against 619.00); at
     * H = 2048 128 x 2, depth 4 (T = 4096: 45.58 against 47.05 for
     * 256 x 1) */
    if (n2 >= 1024) {
        if (fin && rows > 512) {
            s.nt = 256; s.j = 4; s.d = 3;
        } else if (fin) {
            s.nt = 512; s.j = 2; s.d = 3;
        } else {
            s.nt = 512; s.j = 2; s.d = 4; s.mb = 3;
        }
    } else if (n2 == 512) {
        s.nt = 256; s.j = 2; s.d = 4; /* fin (nrn rows took the nrn kernel) */
    } else if (n2 == 256) {
        if (fin) {
            s.nt = 128; s.j = 2; s.d = 4;
        } else {
            s.nt = 128; s.j = 2; s.d = 4; s.mb = 8;
        }
    } else {
        s.nt = n2; s.j = 1; s.u = 8;
    }
    return s;
}

bm_shape bm_row_twin(bm_shape s)
{
    if (s.st > 0 && s.j == 8) { /* no row kernel of 8 chunks: the same cover */
        s.nt *= 2;
        s.j = 4;
    }
    if (s.d > 0 || s.st > 0) {
        s.d = 0;
        s.st = 0;
        s.mb = 1;
        s.u = s.j >= 4 ? 2 : s.j == 2 ? (s.nt >= 512 ? 2 : 4) : (s.nt >= 1024 ? 2 : s.nt >= 512 ? 4 : 8);
    }
    return s;
}

int bm_shape_ok(bm_shape s, int hidden)
{
    if ((long)s.cs * s.nt * s.j < hidden / 8)
        return 0;
    if (s.st > 0) {
        if (s.cs != 1 || s.d != 0)
            return 0;
#define BM_SOK(NT, J, MB, HINT, PK, PF) \
    if (s.nt == NT && s.j == J && s.mb == MB && s.st == bm_nrn_st(HINT, PK, PF)) return 1;
        BM_NRNS(BM_SOK)
#undef BM_SOK
        return 0;
    }
    if (s.d > 0) {
        if (s.cs != 1)
            return 0;
#define BM_POK(NT, J, D, MB) \
    if (s.nt == NT && s.j == J && s.d == D && s.mb == MB) return 1;
        BM_PIPES(BM_POK)
#undef BM_POK
        return 0;
    }
#define BM_OK(NT, J, U, CS) \
    if (s.nt == NT && s.j == J && s.u == U && s.cs == CS) return 1;
    BM_SHAPES(BM_OK)
#undef BM_OK
    return 0;
}

int bm_shape_list(bm_shape *out, int max)
{
    int n = 0;
#define BM_LROW(NT, J, U, CS) \
    if (n < max) out[n] = bm_shape{NT, J, U, CS, CS > 1, 0, 1, 0}; ++n;
#define BM_LPIPE(NT, J, D, MB) \
    if (n < max) out[n] = bm_shape{NT, J, 0, 1, 0, D, MB, 0}; ++n;
#define BM_LNRN(NT, J, MB, HINT, PK, PF) \
    if (n < max) out[n] = bm_shape{NT, J, 0, 1, 0, 0, MB, bm_nrn_st(HINT, PK, PF)}; ++n;
    BM_SHAPES(BM_LROW)
    BM_PIPES(BM_LPIPE)
    BM_NRNS(BM_LNRN)
#undef BM_LROW
#undef BM_LPIPE
#undef BM_LNRN
    return n;
}

static int aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

int bm_params_vec_ok(const bm_row_params &p, const bm_quant_params *q)
{
    const void *ptrs[] = {p.experts, p.x, p.wA, p.residual, p.wB, p.out, p.normalized};
    for (const void *q : ptrs)
        if (q && !aligned16(q))
            return 0;
    /* the quantized values: 8 bytes per chunk (NVFP4: 4) */
    if (q && q->kind && ((uintptr_t)q->values & (q->kind == BM_QUANT_NVFP4 ? 3u : 7u)) != 0)
        return 0;
    return 1;
}

/* The one launch helper: grid of `blocks` blocks of nt threads, clusters
 * of cs blocks, smem bytes of dynamic shared memory, programmatic
 * dependent launch when pdl. */
template <typename K, typename P>
static cudaError_t bm_launch(K kernel, const P &p, unsigned blocks, int nt, int cs,
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

/* The pipelined kernel: its dynamic shared memory limit raised once per
 * device, and a persistent grid of one wave (multiprocessors x resident
 * blocks from the occupancy API), both cached per device (host-side
 * attribute calls, not stream work: legal during graph capture). */
template <int NT, int J, int D, int MB, bool FIN, int Q>
static cudaError_t bm_go_pipe(const typename bm_kparams<Q>::type &p, int pdl, cudaStream_t stream)
{
    enum { MAX_DEV = 64 };
    static std::atomic<int> wave[MAX_DEV];
    const size_t smem = (size_t)D * J * NT * 16;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess)
        return e;
    if (dev < 0 || dev >= MAX_DEV)
        return cudaErrorInvalidDevice;
    int w = wave[dev].load(std::memory_order_relaxed);
    if (w == 0) {
        int per_sm = 0;
        e = cudaFuncSetAttribute(bm_pipe_kernel<NT, J, D, MB, FIN, Q>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e == cudaSuccess)
            e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, bm_pipe_kernel<NT, J, D, MB, FIN, Q>,
                                                              NT, smem);
        if (e != cudaSuccess)
            return e;
        w = bm_device_sms() * (per_sm > 0 ? per_sm : 1);
        wave[dev].store(w, std::memory_order_relaxed);
    }
    const int64_t grid = p.rows < (int64_t)w ? p.rows : (int64_t)w;
    return bm_launch(bm_pipe_kernel<NT, J, D, MB, FIN, Q>, p, (unsigned)grid, NT, 1, smem, pdl, stream);
}

/* ... finalize or not, with or without (which) quantized output */
template <int NT, int J, int D, int MB>
static cudaError_t bm_go_pipe_fin(const bm_row_params &p, const bm_row_params_q *pq, int pdl, cudaStream_t stream)
{
    if (!pq)
        return p.experts ? bm_go_pipe<NT, J, D, MB, true, BM_QF_NONE>(p, pdl, stream)
                         : bm_go_pipe<NT, J, D, MB, false, BM_QF_NONE>(p, pdl, stream);
    if (pq->q.kind == BM_QUANT_NVFP4)
        return p.experts ? bm_go_pipe<NT, J, D, MB, true, BM_QF_NVFP4>(*pq, pdl, stream)
                         : bm_go_pipe<NT, J, D, MB, false, BM_QF_NVFP4>(*pq, pdl, stream);
    return p.experts ? bm_go_pipe<NT, J, D, MB, true, BM_QF_FP8>(*pq, pdl, stream)
                     : bm_go_pipe<NT, J, D, MB, false, BM_QF_FP8>(*pq, pdl, stream);
}

/* The row kernel of one shape: vector or scalar path, finalize or not. */
template <int NT, int J, int U, int CS, int Q>
static cudaError_t bm_go_row_q(const typename bm_kparams<Q>::type &p, unsigned blocks, int pdl, int vec,
                               cudaStream_t stream)
{
    if (p.experts)
        return vec ? bm_launch(bm_row_kernel<NT, J, U, CS, true, true, Q>, p, blocks, NT, CS, 0, pdl, stream)
                   : bm_launch(bm_row_kernel<NT, J, U, CS, false, true, Q>, p, blocks, NT, CS, 0, pdl, stream);
    return vec ? bm_launch(bm_row_kernel<NT, J, U, CS, true, false, Q>, p, blocks, NT, CS, 0, pdl, stream)
               : bm_launch(bm_row_kernel<NT, J, U, CS, false, false, Q>, p, blocks, NT, CS, 0, pdl, stream);
}

/* ... with or without the quantized output compiled in */
template <int NT, int J, int U, int CS>
static cudaError_t bm_go_row(const bm_row_params &p, const bm_row_params_q *pq, unsigned blocks, int pdl,
                             int vec, cudaStream_t stream)
{
    if (pq)
        return pq->q.kind == BM_QUANT_NVFP4 ? bm_go_row_q<NT, J, U, CS, BM_QF_NVFP4>(*pq, blocks, pdl, vec, stream)
                                            : bm_go_row_q<NT, J, U, CS, BM_QF_FP8>(*pq, blocks, pdl, vec, stream);
    return bm_go_row_q<NT, J, U, CS, BM_QF_NONE>(p, blocks, pdl, vec, stream);
}

cudaError_t bm_launch_rows(const bm_row_params &p, bm_shape s, int vec,
                           cudaStream_t stream, const bm_quant_params *q)
{
    /* with a quantized output: the kernels compiled with it, their larger
     * parameter block */
    bm_row_params_q pqv;
    const bm_row_params_q *pq = NULL;
    if (p.rows <= 0)
        return cudaSuccess;
    if (q && q->kind) {
        static_cast<bm_row_params &>(pqv) = p;
        pqv.q = *q;
        pq = &pqv;
    }
    if (s.st > 0 && vec && s.cs == 1 && !p.experts && p.residual) {
        /* one row per block; rows beyond the grid: a grid-stride loop */
        const int64_t cap = (int64_t)(INT_MAX / 8);
        const unsigned blocks = (unsigned)(p.rows < cap ? p.rows : cap);
#define BM_SGO(NT, J, MB, HINT, PK, PF)                                           \
        if (s.nt == NT && s.j == J && s.mb == MB && s.st == bm_nrn_st(HINT, PK, PF)) \
            return !pq ? bm_launch(bm_nrn_kernel<NT, J, MB, HINT, BM_QF_NONE, PK, PF>, p, blocks, NT, 1, 0, s.pdl, stream) \
                   : pq->q.kind == BM_QUANT_NVFP4                                                                    \
                       ? bm_launch(bm_nrn_kernel<NT, J, MB, HINT, BM_QF_NVFP4, PK, PF>, *pq, blocks, NT, 1, 0, s.pdl, stream) \
                       : bm_launch(bm_nrn_kernel<NT, J, MB, HINT, BM_QF_FP8, PK, PF>, *pq, blocks, NT, 1, 0, s.pdl, stream);
        BM_NRNS(BM_SGO)
#undef BM_SGO
        return cudaErrorInvalidConfiguration;
    }
    if (s.d > 0 && vec && s.cs == 1) {
#define BM_PGO(NT, J, D, MB)                                                      \
        if (s.nt == NT && s.j == J && s.d == D && s.mb == MB)                     \
            return bm_go_pipe_fin<NT, J, D, MB>(p, pq, s.pdl, stream);
        BM_PIPES(BM_PGO)
#undef BM_PGO
        return cudaErrorInvalidConfiguration;
    }
    if (s.d > 0 || s.st > 0)
        s = bm_row_twin(s); /* a base not 16-byte aligned, or rows the nrn kernel does not take */
    /* One row (or one cluster per row) per block; rows beyond the grid are
     * taken by a grid-stride loop. */
    const int64_t cap = (int64_t)(INT_MAX / 8);
    const unsigned blocks = (unsigned)(p.rows < cap ? p.rows : cap) * (unsigned)s.cs;
#define BM_GO(NT, J, U, CS)                                                       \
    if (s.nt == NT && s.j == J && s.u == U && s.cs == CS)                         \
        return bm_go_row<NT, J, U, CS>(p, pq, blocks, s.pdl, vec, stream);
    BM_SHAPES(BM_GO)
#undef BM_GO
    return cudaErrorInvalidConfiguration;
}

/* Load every row kernel now. Under CUDA's lazy module loading (the default
 * since CUDA 12) the first launch of a kernel loads it, and loading can wait
 * until the device is idle; a gather rank whose peer on the same device is
 * spinning in a gather kernel, waiting for this rank's next kernel, would
 * then wait for the peer's timeout. Gather workspaces call this at creation
 * (cudaFuncGetAttributes loads a function). */
cudaError_t bm_preload_rows(void)
{
    cudaFuncAttributes fa;
    cudaError_t e = cudaSuccess, r;
#define BM_PRE(K)                                                                     \
    if ((r = cudaFuncGetAttributes(&fa, K)) != cudaSuccess)                           \
        e = r;
#define BM_PRE_ROW_Q(NT, J, U, CS, Q)                                                 \
    BM_PRE((bm_row_kernel<NT, J, U, CS, true, true, Q>))                              \
    BM_PRE((bm_row_kernel<NT, J, U, CS, false, true, Q>))                             \
    BM_PRE((bm_row_kernel<NT, J, U, CS, true, false, Q>))                             \
    BM_PRE((bm_row_kernel<NT, J, U, CS, false, false, Q>))
#define BM_PRE_ROW(NT, J, U, CS) \
    BM_PRE_ROW_Q(NT, J, U, CS, BM_QF_NONE) BM_PRE_ROW_Q(NT, J, U, CS, BM_QF_FP8) BM_PRE_ROW_Q(NT, J, U, CS, BM_QF_NVFP4)
#define BM_PRE_PIPE(NT, J, D, MB)                                                     \
    BM_PRE((bm_pipe_kernel<NT, J, D, MB, true, BM_QF_NONE>))                          \
    BM_PRE((bm_pipe_kernel<NT, J, D, MB, false, BM_QF_NONE>))                         \
    BM_PRE((bm_pipe_kernel<NT, J, D, MB, true, BM_QF_FP8>))                           \
    BM_PRE((bm_pipe_kernel<NT, J, D, MB, false, BM_QF_FP8>))                          \
    BM_PRE((bm_pipe_kernel<NT, J, D, MB, true, BM_QF_NVFP4>))                         \
    BM_PRE((bm_pipe_kernel<NT, J, D, MB, false, BM_QF_NVFP4>))
#define BM_PRE_NRN(NT, J, MB, HINT, PK, PF)                                           \
    BM_PRE((bm_nrn_kernel<NT, J, MB, HINT, BM_QF_NONE, PK, PF>))                      \
    BM_PRE((bm_nrn_kernel<NT, J, MB, HINT, BM_QF_FP8, PK, PF>))                       \
    BM_PRE((bm_nrn_kernel<NT, J, MB, HINT, BM_QF_NVFP4, PK, PF>))
    BM_SHAPES(BM_PRE_ROW)
    BM_PIPES(BM_PRE_PIPE)
    BM_NRNS(BM_PRE_NRN)
#undef BM_PRE
#undef BM_PRE_ROW_Q
#undef BM_PRE_ROW
#undef BM_PRE_PIPE
#undef BM_PRE_NRN
    return e;
}
