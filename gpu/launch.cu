/*
 * launch.cu - the choice among the row kernels' compiled shapes
 * (launch_shapes.h, gpu/shapes.def) and the one helper that launches any of
 * them through its family's launcher (launch_row.cu, launch_pipe.cu,
 * launch_nrn.cu) (internal).
 */
#include <limits.h>

#include <atomic>

#include "launch_shapes.h"
#include "tp_shape.h"

static int next_pow2(int c)
{
    int n = 1;
    while (n < c)
        n *= 2;
    return n;
}

/* Multiprocessors of the current device, asked once per device (a host-side
 * attribute query, legal during graph capture). */
int bm_device_sms(void)
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

static constexpr bm_shape row_twin(bm_shape s)
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

static constexpr int shape_ok(bm_shape s, int hidden)
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

bm_shape bm_row_twin(bm_shape s)
{
    return row_twin(s);
}

int bm_shape_ok(bm_shape s, int hidden)
{
    return shape_ok(s, hidden);
}

/* Every row of gpu/shapes.def that names its shape (all but the decode
 * clusters, whose size bm_pick_shape fits to the device and checks at run
 * time) names a compiled one, and so does the row kernel that stands in
 * for it on bases not 16-byte aligned: a row that did not would fail its
 * calls with cudaErrorInvalidConfiguration. */
static constexpr bool rows_compiled()
{
    for (const bm_pick::row &r : bm_pick::rows)
        if (r.s.nt != 0 && !(shape_ok(r.s, 0) && shape_ok(row_twin(r.s), 0)))
            return false;
    return true;
}
static_assert(rows_compiled(), "a row of gpu/shapes.def names a shape that launch_shapes.h does not compile");

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
        return bm_launch_nrn_family(pq, s, blocks, stream);
    }
    if (s.d > 0 && vec && s.cs == 1)
        return bm_launch_pipe_family(pq, s, stream);
    if (s.d > 0 || s.st > 0)
        s = bm_row_twin(s); /* a base not 16-byte aligned, or rows the nrn kernel does not take */
    /* One row (or one cluster per row) per block; rows beyond the grid are
     * taken by a grid-stride loop. */
    const int64_t cap = (int64_t)(INT_MAX / 8);
    const unsigned blocks = (unsigned)(p.rows < cap ? p.rows : cap) * (unsigned)s.cs;
    return bm_launch_row_family(pq, s, blocks, vec, stream);
}

/* Load every row kernel now. Under CUDA's lazy module loading (the default
 * since CUDA 12) the first launch of a kernel loads it, and loading can wait
 * until the device is idle; a gather rank whose peer on the same device is
 * spinning in a gather kernel, waiting for this rank's next kernel, would
 * then wait for the peer's timeout. Gather workspaces call this at creation
 * (cudaFuncGetAttributes loads a function). */
cudaError_t bm_preload_rows(void)
{
    cudaError_t e = bm_preload_row();
    if (e == cudaSuccess) e = bm_preload_pipe();
    if (e == cudaSuccess) e = bm_preload_nrn();
    return e;
}
