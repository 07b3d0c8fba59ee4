/*
 * launch.cu - the compiled launch shapes of the row kernels, the choice
 * among them, and the one helper that launches any of them (internal).
 */
#include <limits.h>

#include <atomic>

#include "launch.h"
#include "nrn_kernel.cuh"
#include "pipe_kernel.cuh"
#include "row_kernel.cuh"
#include "tp_shape.h"

/* Every row-kernel shape (NT, J, U, CS) instantiated, each in a vector and a
 * scalar version: the shapes bm_pick_shape returns (decode: one chunk per
 * thread, clusters of 1 to 8; prefill with hidden <= 4096) and the
 * row-kernel twins of the pipelined and nrn shapes (bases not 16-byte
 * aligned). Compiled into bench/shape_sweep, beside these: the candidates
 * it times against them (bench/sweep_launch.cu, BM_SWEEP_*). */
#ifndef BM_SWEEP_SHAPES
#define BM_SWEEP_SHAPES(X)
#define BM_SWEEP_PIPES(X)
#define BM_SWEEP_NRNS(X)
#endif
#define BM_SHAPES(X)                                                          \
    X(32, 1, 8, 1) X(64, 1, 8, 1) X(128, 1, 8, 1) X(256, 1, 8, 1)              \
    X(64, 1, 8, 2) X(64, 1, 8, 4) X(64, 1, 8, 8) X(128, 1, 8, 2)               \
    X(128, 1, 8, 4) X(128, 1, 8, 8) X(256, 1, 8, 2) X(256, 1, 8, 4)            \
    X(512, 1, 8, 2)                                                            \
    X(128, 2, 4, 1) X(256, 2, 4, 1) X(256, 4, 2, 1) X(512, 2, 2, 1)            \
    X(128, 4, 2, 1) BM_SWEEP_SHAPES(X)

/* Pipelined shapes (NT, J, D, MB): prefill, vector path; MB resident blocks
 * per multiprocessor asked of the compiler (__launch_bounds__), 1: none. */
#define BM_PIPES(X)                                                           \
    X(256, 4, 2, 1) X(256, 4, 3, 1) X(256, 4, 4, 1) X(512, 2, 3, 1)            \
    X(512, 2, 4, 3) X(128, 4, 4, 1) X(256, 2, 4, 1) X(128, 2, 4, 1)            \
    X(128, 2, 4, 8) BM_SWEEP_PIPES(X)

/* norm_residual_norm's prefill shapes (NT, J, MB, HINT, PK, PF): MB
 * resident blocks per multiprocessor asked of the compiler; HINT the L2
 * policy of the row loads; PK 1: the row held as packed BF16 bits; PF 1:
 * the block's next row of the grid-stride loop requested into L2 at the
 * row's start (none with a grid of one block per row: nrn_kernel.cuh). */
#define BM_NRNS(X)                                                            \
    X(512, 2, 2, 2, 0, 0) X(256, 2, 4, 1, 0, 0) X(128, 2, 8, 1, 0, 0)          \
    X(128, 2, 8, 2, 0, 0) X(128, 8, 4, 2, 1, 0) X(128, 4, 8, 1, 1, 0)          \
    X(128, 8, 4, 1, 1, 1) BM_SWEEP_NRNS(X)

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

/* The choice of shape: the rows of gpu/shapes.def and the names they use. */
namespace bm_pick {
enum { ANY = -1 };
enum { FIN = 1, FUSED = 2, RES = 4, BARE = 8, SLOTS = FIN | FUSED, NOSLOTS = RES | BARE };
enum { H1K = 1, H2K = 2, H4K = 4, H8K = 8 };
/* 1 << bm_shape_form(bm_qf_of(kind)): the forms of lib/quant_forms.def
 * whose rows these are (a form may take a like form's); QUANT any of them */
enum { NOQ = 1 << BM_QF_NONE, FP8 = 1 << BM_QF_FP8, NVFP4 = 1 << BM_QF_NVFP4, QUANT = (1 << BM_QF_COUNT) - 2 };
static_assert(BM_QF_COUNT <= 4, "a row's quant field holds four forms");
constexpr int64_t MAXT = INT64_MAX;

/* A row's conditions as one set of bits, one bit a value: kind 0-3,
 * width 4-7, quant 8-11, nA 12-13, sc 14-15, sh 16-17. A call's values are
 * one bit each; a row takes the call when it holds them all. */
constexpr uint32_t tri(int want, int shift) { return (want == ANY ? 3u : 1u << want) << shift; }
constexpr uint32_t conds(int kind, int width, int quant, int na, int sc, int sh)
{
    return (uint32_t)(kind & 15) | (uint32_t)(width & 15) << 4 | (uint32_t)(quant & 15) << 8 | tri(na, 12) |
           tri(sc, 14) | tri(sh, 16);
}

struct row {
    uint32_t conds;
    int64_t from, to;
    bm_shape s; /* nt 0: n2 / cs */
    int w;      /* cs > 1: blocks per multiprocessor the cluster's grid may take */
};

#define ROW(NT, J, U) {NT, J, U, 1, 1, 0, 1, 0}, 1
#define PIPE(NT, J, D, MB) {NT, J, 0, 1, 1, D, MB, 0}, 1
#define NRN(NT, J, MB, HINT, PK, PF) {NT, J, 0, 1, 1, 0, MB, bm_nrn_st(HINT, PK, PF)}, 1
#define CLUSTER(CS, W) {0, 1, 8, CS, 1, 0, 1, 0}, W
#define BM_PICK(kind, width, from, to, quant, na, sc, sh, shape) {conds(kind, width, quant, na, sc, sh), from, to, shape},
constexpr row rows[] = {
#include "shapes.def"
};
#undef BM_PICK
#undef CLUSTER
#undef NRN
#undef PIPE
#undef ROW

constexpr row last = rows[sizeof rows / sizeof rows[0] - 1];
static_assert(last.conds == conds(ANY, ANY, ANY, ANY, ANY, ANY) && last.from == 0 && last.to == MAXT,
              "the last row of gpu/shapes.def takes every call");
} // namespace bm_pick

/* Decode: the largest cluster up to cs whose rows x cs blocks fit w a multiprocessor, 64 threads a block. */
static int bm_decode_cs(int cs, int64_t rows, int n2, int w)
{
    return bm_cluster_size(cs, rows, n2, (int64_t)w * bm_device_sms());
}

bm_shape bm_pick_shape(const bm_row_params &p, int quant, int shared)
{
    using namespace bm_pick;
    const int n2 = next_pow2(p.hidden / 8); /* 32 .. 1024 */
    const int64_t t = p.rows > 0 ? p.rows : 0; /* rows <= 0 launch nothing */
    const int kind = p.experts ? (p.residual ? FUSED : FIN) : (p.residual ? RES : BARE);
    const int width = n2 >= 1024 ? H8K : n2 == 512 ? H4K : n2 == 256 ? H2K : H1K;
    const int q = 1 << bm_shape_form(bm_qf_of(quant));
    const uint32_t c = conds(kind, width, q, p.normA != 0, p.has_scales != 0, shared != 0);
    /* the first row that takes the call; the last takes every call. A
     * decode row whose cluster shrinks, on a device with few
     * multiprocessors, to a shape that is not compiled gives way to the
     * next row that takes the call. */
    for (const row *r = rows;; ++r) {
        if ((r->conds & c) != c || t < r->from || t > r->to)
            continue;
        bm_shape s = r->s;
        if (s.cs > 1)
            s.cs = bm_decode_cs(s.cs, t, n2, r->w);
        if (s.nt == 0)
            s.nt = n2 / s.cs;
        if (r->s.cs <= 1 || bm_shape_ok(s, p.hidden))
            return s;
    }
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

int bm_params_vec_ok(const bm_row_params &p, const bm_quant *q)
{
    const void *ptrs[] = {p.experts, p.x, p.wA, p.residual, p.wB, p.out, p.normalized};
    for (const void *q : ptrs)
        if (q && !aligned16(q))
            return 0;
    if (q && q->kind && !bm_quant_vec_ok(*q))
        return 0;
    return 1;
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

/* ... finalize or not, with the kernels of the call's form */
template <int NT, int J, int D, int MB>
static cudaError_t bm_go_pipe_fin(const bm_row_params_q &pq, int pdl, cudaStream_t stream)
{
    return bm_with_form(pq.q.kind, [&](auto qf) {
        constexpr int Q = decltype(qf)::value;
        return pq.experts ? bm_go_pipe<NT, J, D, MB, true, Q>(bm_kp<Q>(static_cast<const bm_row_params &>(pq), pq), pdl, stream)
                          : bm_go_pipe<NT, J, D, MB, false, Q>(bm_kp<Q>(static_cast<const bm_row_params &>(pq), pq), pdl, stream);
    });
}

/* The row kernel of one shape: vector or scalar path, finalize or not,
 * the kernels of the call's form. */
template <int NT, int J, int U, int CS>
static cudaError_t bm_go_row(const bm_row_params_q &pq, unsigned blocks, int pdl, int vec, cudaStream_t stream)
{
    return bm_with_form(pq.q.kind, [&](auto qf) {
        constexpr int Q = decltype(qf)::value;
        const typename bm_kparams<Q>::type &p = bm_kp<Q>(static_cast<const bm_row_params &>(pq), pq);
        if (p.experts)
            return vec ? bm_launch(bm_row_kernel<NT, J, U, CS, true, true, Q>, p, blocks, NT, CS, 0, pdl, stream)
                       : bm_launch(bm_row_kernel<NT, J, U, CS, false, true, Q>, p, blocks, NT, CS, 0, pdl, stream);
        return vec ? bm_launch(bm_row_kernel<NT, J, U, CS, true, false, Q>, p, blocks, NT, CS, 0, pdl, stream)
                   : bm_launch(bm_row_kernel<NT, J, U, CS, false, false, Q>, p, blocks, NT, CS, 0, pdl, stream);
    });
}

cudaError_t bm_launch_rows(const bm_row_params &p, bm_shape s, int vec,
                           cudaStream_t stream, const bm_quant *q)
{
    /* the call and its quantized output (kind 0: none), from which each
     * family takes the block of the kernels it launches */
    bm_row_params_q pq;
    static_cast<bm_row_params &>(pq) = p;
    pq.q = q ? *q : bm_quant{};
    if (p.rows <= 0)
        return cudaSuccess;
    if (s.st > 0 && vec && s.cs == 1 && !p.experts && p.residual) {
        /* one row per block; rows beyond the grid: a grid-stride loop */
        const int64_t cap = (int64_t)(INT_MAX / 8);
        const unsigned blocks = (unsigned)(p.rows < cap ? p.rows : cap);
#define BM_SGO(NT, J, MB, HINT, PK, PF)                                                             \
        if (s.nt == NT && s.j == J && s.mb == MB && s.st == bm_nrn_st(HINT, PK, PF))                  \
            return bm_with_form(pq.q.kind, [&](auto qf) {                                             \
                constexpr int Q = decltype(qf)::value;                                                \
                return bm_launch(bm_nrn_kernel<NT, J, MB, HINT, Q, PK, PF>, bm_kp<Q>(p, pq), blocks, NT, 1, 0, \
                                 s.pdl, stream);                                                      \
            });
        BM_NRNS(BM_SGO)
#undef BM_SGO
        return cudaErrorInvalidConfiguration;
    }
    if (s.d > 0 && vec && s.cs == 1) {
#define BM_PGO(NT, J, D, MB)                                                      \
        if (s.nt == NT && s.j == J && s.d == D && s.mb == MB)                     \
            return bm_go_pipe_fin<NT, J, D, MB>(pq, s.pdl, stream);
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
        return bm_go_row<NT, J, U, CS>(pq, blocks, s.pdl, vec, stream);
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
    cudaError_t e = cudaSuccess;
    auto pre = [&](auto kernel) { bm_preload(e, kernel); };
#define BM_PRE_ROW(NT, J, U, CS)                                                      \
    bm_each_form([&](auto qf) {                                                       \
        constexpr int Q = decltype(qf)::value;                                        \
        pre(bm_row_kernel<NT, J, U, CS, true, true, Q>);                              \
        pre(bm_row_kernel<NT, J, U, CS, false, true, Q>);                             \
        pre(bm_row_kernel<NT, J, U, CS, true, false, Q>);                             \
        pre(bm_row_kernel<NT, J, U, CS, false, false, Q>);                            \
    });
#define BM_PRE_PIPE(NT, J, D, MB)                                                     \
    bm_each_form([&](auto qf) {                                                       \
        constexpr int Q = decltype(qf)::value;                                        \
        pre(bm_pipe_kernel<NT, J, D, MB, true, Q>);                                   \
        pre(bm_pipe_kernel<NT, J, D, MB, false, Q>);                                  \
    });
#define BM_PRE_NRN(NT, J, MB, HINT, PK, PF)                                           \
    bm_each_form([&](auto qf) { pre(bm_nrn_kernel<NT, J, MB, HINT, decltype(qf)::value, PK, PF>); });
    BM_SHAPES(BM_PRE_ROW)
    BM_PIPES(BM_PRE_PIPE)
    BM_NRNS(BM_PRE_NRN)
#undef BM_PRE_ROW
#undef BM_PRE_PIPE
#undef BM_PRE_NRN
    return e;
}
