/*
 * shape_sweep.cu - the CUDA kernels' launch shapes, checked and timed one by
 * one (a contributor's tool: drives gpu/launch.cu directly, without lib/).
 *
 *   shape_sweep check   the hardware BF16 conversion against the integer
 *                       formula for every FP32 value, the quantized
 *                       output's arithmetic (fp8_check.cuh), then every compiled
 *                       launch shape (gpu/launch_shapes.h BM_SHAPES, BM_PIPES,
 *                       BM_NRNS)
 *                       against harness/naive_ref.c, bit for bit, on random
 *                       cases (special values, NaN padding rows, misaligned
 *                       bases, in place, every op, a third of them with
 *                       each form of the quantized output, checked against
 *                       harness/quant_model.c)
 *   shape_sweep perf [--op N] [--T N] [--H N] [--cfg NAME] [--summary]
 *                    [--picked] [--eager N] [--quant N] [--hot]
 *                       copy bandwidth, an empty kernel per graph node, then
 *                       for each shape of docs/PERF.md (or the one of --T
 *                       and --H) and each configuration
 *                       a user can call, every compiled launch shape's time
 *                       (graph replays over rotating cold buffers); SUMMARY
 *                       lines compare bm_pick_shape's choice with the best;
 *                       --quant N times the kernels compiled with the
 *                       quantized output instead (N a beam_quant_kind, in
 *                       its first form of harness/quant_model.c's
 *                       qm_forms: 1 group 128, 2 token, 3 tensor, 4
 *                       NVFP4; normalized in that form only)
 *
 * Built by `make bench/shape_sweep` in a CUDA build; run it on a GPU host.
 */
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#include "checks.h"
#include "fp4_check.cuh"
#include "fp8_check.cuh"
#include "graph_calls.h"
#include "launch.h"
extern "C" {
#include "naive_ref.h"
#include "quant_model.h"
}

static uint64_t rng_s = 0x1234567;
static uint64_t rnd()
{
    uint64_t z = (rng_s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
static float f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint16_t rbf16(int special)
{
    if (special && rnd() % 16 == 0) {
        static const uint16_t sp[] = {0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81, 0x0000, 0x8000,
                                      0x0001, 0x8001, 0x007F, 0x7F7F, 0xFF7F, 0x0080};
        return sp[rnd() % (sizeof sp / sizeof sp[0])];
    }
    uint32_t sign = rnd() & 1, exp = 121 + rnd() % 10, man = rnd() & 0x7F;
    if (rnd() % 64 == 0) return (uint16_t)(sign << 15);
    return (uint16_t)((sign << 15) | (exp << 7) | man);
}
static float rweight(int special)
{
    if (special && rnd() % 16 == 0) {
        static const uint32_t sp[] = {0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x00000001u,
                                      0x80000000u, 0x7F7FFFFFu, 0x00800000u};
        return f32(sp[rnd() % 7]);
    }
    float w = (float)((rnd() >> 40) + 1) / (float)(1ULL << 24);
    return (rnd() % 8 == 0) ? -w : w;
}

struct dev_buf {
    void *base = nullptr;
    size_t bytes = 0;
    void *alloc(size_t n, size_t off)
    {
        bytes = n + 64;
        CK(cudaMalloc(&base, bytes));
        CK(cudaMemset(base, 0xA5, bytes));
        return (char *)base + off;
    }
    ~dev_buf() { if (base) cudaFree(base); }
};

enum op_kind { OP_FIN, OP_NRN, OP_FUSED, OP_UNFUSED };

struct case_t {
    int op, K, H;
    int64_t T, cap;
    int normA, normA_w, normB, normB_w, scales, inplace, misalign, special;
    float routed;
    int quant; /* the quantized output of normalized: 0 none, else a form of quant_form */
};

/* Form f (1..QM_NFORMS) of the harness's forms for T rows. */
static beam_quant quant_form(int f, int64_t T)
{
    beam_quant q[QM_NFORMS];
    qm_forms(q, T);
    return q[f - 1];
}

/* The kernels' view of form qf for rows of H (what lib/check.c makes of a
 * beam_quant), its values at values and its scales' array at scales
 * (block-scaled: the array's bytes are the block scales). */
static bm_quant quant_params(const beam_quant &qf, int H, uint8_t *values, void *scales)
{
    bm_quant qp;
    memset(&qp, 0, sizeof qp);
    const int col = (qf.flags & BEAM_QUANT_COL_MAJOR) != 0;
    qp.kind = qf.kind;
    qp.group = qm_group(&qf, H);
    qp.ue8m0 = qm_pow2(&qf);
    qp.scale = qf.scale;
    qp.values = values;
    qp.ld_t = qf.kind == BEAM_QUANT_FP8_GROUP && !col ? H / qf.group_size : 1;
    qp.ld_g = col ? qf.scale_ld : 1;
    if (qm_block(&qf))
        qp.block_scales = (uint8_t *)scales;
    else if (qf.kind != BEAM_QUANT_FP8_TENSOR)
        qp.scales = (float *)scales;
    return qp;
}

/* one case, one shape; returns number of mismatches */
static long run_case(const case_t &c, bm_shape sh, int force_scalar)
{
    const int H = c.H, K = c.K;
    const int64_t T = c.T, cap = c.cap;
    const size_t off = c.misalign ? 2 : 0;
    int special = c.special;
    std::vector<uint16_t> hx((size_t)cap * K * H), hres((size_t)cap * H), hxin((size_t)cap * H),
        hwA(H), hwB(H);
    std::vector<float> hw((size_t)cap * K);
    for (auto &v : hx) v = rbf16(special);
    for (auto &v : hw) v = rweight(special);
    for (auto &v : hres) v = rbf16(special);
    for (auto &v : hxin) v = rbf16(special);
    for (auto &v : hwA) v = (uint16_t)(0x3F00 + rnd() % 0x100 + ((rnd() % 16 == 0) ? 0x8000 : 0));
    for (auto &v : hwB) v = (uint16_t)(0x3F00 + rnd() % 0x100 + ((rnd() % 16 == 0) ? 0x8000 : 0));
    /* NaN padding rows past T */
    for (int64_t t = T; t < cap; ++t) {
        for (size_t i = 0; i < (size_t)K * H; ++i) hx[(size_t)t * K * H + i] = 0x7FC1;
        for (int k = 0; k < K; ++k) hw[(size_t)t * K + k] = f32(0x7FC00001u);
    }
    float sc[2] = {f32(0x3F000000u | (uint32_t)(rnd() & 0x7FFFFF)), 1.0f + (float)(rnd() % 100) / 64.0f};
    float epsA = (rnd() % 4 == 0) ? 0.0f : 1e-6f, epsB = 1e-5f;

    dev_buf bx, bw, bres, bxin, bwA, bwB, bout, bnorm;
    uint16_t *dx = (uint16_t *)bx.alloc(hx.size() * 2, off);
    float *dw = (float *)bw.alloc(hw.size() * 4, c.misalign ? 4 : 0);
    uint16_t *dres = (uint16_t *)bres.alloc(hres.size() * 2, off);
    uint16_t *dxin = (uint16_t *)bxin.alloc(hxin.size() * 2, off);
    uint16_t *dwA = (uint16_t *)bwA.alloc(H * 2, off);
    uint16_t *dwB = (uint16_t *)bwB.alloc(H * 2, off);
    uint16_t *dout = (uint16_t *)bout.alloc((size_t)cap * H * 2, off);
    uint16_t *dnorm = (uint16_t *)bnorm.alloc((size_t)cap * H * 2, off);
    CK(cudaMemcpy(dx, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dres, hres.data(), hres.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dxin, hxin.data(), hxin.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dwA, hwA.data(), H * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dwB, hwB.data(), H * 2, cudaMemcpyHostToDevice));
    uint16_t *dhid = c.inplace ? dres : dout;

    nr_norm nA = {c.normA, c.normA_w ? hwA.data() : NULL, epsA};
    nr_norm nB = {c.normB, c.normB_w ? hwB.data() : NULL, epsB};
    std::vector<uint16_t> want_out((size_t)cap * H, 0xA5A5), want_norm((size_t)cap * H, 0xA5A5);
    std::vector<uint16_t> want_res = hres;
    uint16_t *want_hid = c.inplace ? want_res.data() : want_out.data();

    bm_row_params p;
    memset(&p, 0, sizeof p);
    p.rows = T;
    p.hidden = H;
    if (c.op == OP_FIN) {
        nr_finalize(hx.data(), hw.data(), T, K, H, c.routed, &nA, want_out.data());
        p.experts = dx; p.weights = dw; p.top_k = K; p.routed_scale = c.routed;
        p.normA = c.normA; p.wA = c.normA_w ? dwA : NULL; p.epsA = epsA;
        p.out = dout;
    } else if (c.op == OP_NRN) {
        nr_norm_residual_norm(hxin.data(), want_res.data(), T, H, &nA, c.scales ? sc : NULL, &nB,
                              want_hid, want_norm.data());
        p.x = dxin;
        p.normA = c.normA; p.wA = c.normA_w ? dwA : NULL; p.epsA = epsA;
    } else {
        nr_finalize_norm_residual_norm(hx.data(), hw.data(), T, K, H, c.routed, &nA, want_res.data(),
                                       c.scales ? sc : NULL, &nB, want_hid, want_norm.data());
        p.experts = dx; p.weights = dw; p.top_k = K; p.routed_scale = c.routed;
        p.normA = c.normA; p.wA = c.normA_w ? dwA : NULL; p.epsA = epsA;
    }
    if (c.op != OP_FIN) {
        p.residual = dres; p.has_scales = c.scales; p.scale_x = sc[0]; p.scale_r = sc[1];
        p.normB = c.normB; p.wB = c.normB_w ? dwB : NULL; p.epsB = epsB;
        p.out = dhid; p.normalized = c.normB ? dnorm : NULL;
    }
    /* the quantized output: the form's arrays on the device (values one byte
     * off an 8-byte boundary when misaligned: the scalar stores), poisoned */
    beam_quant qf = quant_form(c.quant ? c.quant : 1, T);
    const int quant = c.quant && c.op != OP_FIN && c.normB;
    const size_t nsc = quant ? qm_scale_floats(&qf, T, H) : 0;
    dev_buf bqv, bqs;
    bm_quant qp;
    memset(&qp, 0, sizeof qp);
    if (quant) {
        uint8_t *values = (uint8_t *)bqv.alloc((size_t)cap * H, c.misalign ? 1 : 0);
        qp = quant_params(qf, H, values, bqs.alloc((nsc ? nsc : 1) * 4, 0));
    }
    const bm_quant *qpp = quant ? &qp : nullptr;
    /* with the quantized output, normalized is optional: half the cases
     * write only the quantized form */
    const int keep_norm = !quant || rnd() % 2;
    if (!keep_norm) p.normalized = NULL;
    int vec = bm_params_vec_ok(p, qpp) && !force_scalar;
    if (c.op == OP_UNFUSED) {
        /* finalize into the scratch, then nrn from it */
        uint16_t *scratch = (dhid != dres) ? dhid : (c.normB ? dnorm : NULL);
        if (!scratch) return 0;
        bm_row_params a = p;
        a.residual = NULL; a.normB = 0; a.out = scratch; a.normalized = NULL;
        bm_row_params b = p;
        b.experts = NULL; b.weights = NULL; b.x = scratch; b.normA = 0; b.wA = NULL;
        CK(bm_launch_rows(a, sh, bm_params_vec_ok(a) && !force_scalar, 0));
        CK(bm_launch_rows(b, sh, bm_params_vec_ok(b, qpp) && !force_scalar, 0, qpp));
    } else {
        CK(bm_launch_rows(p, sh, vec, 0, qpp));
    }
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> got_out((size_t)cap * H), got_norm((size_t)cap * H), got_res((size_t)cap * H);
    CK(cudaMemcpy(got_out.data(), dout, got_out.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(got_norm.data(), dnorm, got_norm.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(got_res.data(), dres, got_res.size() * 2, cudaMemcpyDeviceToHost));
    long bad = 0;
    auto cmp = [&](const char *nm, const std::vector<uint16_t> &g, const std::vector<uint16_t> &w) {
        for (size_t i = 0; i < g.size(); ++i)
            if (g[i] != w[i]) {
                if (bad < 3)
                    fprintf(stderr, "  MISMATCH %s[%zu] (row %zu col %zu) got %04x want %04x\n", nm, i,
                            i / H, i % H, g[i], w[i]);
                ++bad;
            }
    };
    cmp("out", got_out, want_out);
    cmp("res", got_res, want_res);
    if (c.op != OP_FIN && keep_norm) cmp("norm", got_norm, want_norm);
    if (quant) {
        /* against the tests' model on the expected normalized rows; the
         * bytes and floats it does not write (padding) stay poisoned */
        std::vector<uint8_t> gv((size_t)cap * H), wv((size_t)cap * H, 0xA5);
        std::vector<float> gs(nsc), ws(nsc);
        CK(cudaMemcpy(gv.data(), qp.values, gv.size(), cudaMemcpyDeviceToHost));
        if (nsc) CK(cudaMemcpy(gs.data(), qp.scales ? (void *)qp.scales : (void *)qp.block_scales, nsc * 4,
                               cudaMemcpyDeviceToHost));
        memset(ws.data(), 0xA5, nsc * 4);
        qm_quant(&qf, want_norm.data(), T, H, wv.data(), ws.data());
        const size_t vrow = qm_values_bytes(&qf, 1, H); /* a row's bytes: 8 / bits values a byte */
        for (size_t i = 0; i < gv.size(); ++i)
            if (gv[i] != wv[i]) {
                if (bad < 3)
                    fprintf(stderr, "  MISMATCH values[%zu] (row %zu col %zu) got %02x want %02x\n", i, i / vrow,
                            (i % vrow) * (8 / qm_bits(&qf)), gv[i], wv[i]);
                ++bad;
            }
        if (nsc && memcmp(gs.data(), ws.data(), nsc * 4) != 0) {
            fprintf(stderr, "  MISMATCH quantized scales (form %d)\n", c.quant);
            ++bad;
        }
    }
    return bad;
}

static std::vector<bm_shape> all_shapes_list()
{
    bm_shape buf[256];
    const int n = bm_shape_list(buf, 256);
    return std::vector<bm_shape>(buf, buf + (n < 256 ? n : 256));
}
static const std::vector<bm_shape> all_shapes = all_shapes_list();

/* bm_bf16x2 and bm_bf16_hw (hardware) against bm_bf16_formula for all 2^32
 * inputs: value u in the low half, u's bit complement in the high half. */
__global__ void cvt_check_kernel(unsigned long long *bad, unsigned long long *first)
{
    const uint64_t n = 1ull << 32;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const uint32_t u = (uint32_t)i, v = ~u;
        const uint32_t got = bm_bf16x2(__uint_as_float(u), __uint_as_float(v));
        const uint32_t want = bm_bf16_formula(__uint_as_float(u)) |
                              (bm_bf16_formula(__uint_as_float(v)) << 16);
        const uint32_t one = bm_bf16_hw(__uint_as_float(u));
        if (got != want || one != (want & 0xFFFFu))
            exh_bad(bad, first, u);
    }
}

/* The library's pick for an op (0 finalize, 1 norm_residual_norm, 2/3 the
 * fused op) at T rows of H, with or without the post/pre norm. */
static bm_shape pick_for(int op, int64_t T, int H, int normA, int quant = 0)
{
    static const uint16_t dummy = 0;
    bm_row_params q;
    memset(&q, 0, sizeof q);
    q.rows = T;
    q.hidden = H;
    q.experts = op == 1 ? NULL : &dummy;
    q.x = op == 1 ? &dummy : NULL;
    q.residual = op == 0 ? NULL : &dummy;
    q.normA = normA;
    return bm_pick_shape(q, quant);
}

static int check()
{
    if (exh_run(cvt_check_kernel, "bf16 conversion, every FP32 value") || check_fp8() || check_fp4()) return 1;
    long total_bad = 0, ncases = 0;
    const int Hs[] = {256, 512, 768, 2048, 4096, 7168, 8192, 1280, 6912};
    const int Ks[] = {1, 2, 6, 8, 32, 3, 7};
    for (int iter = 0; iter < 400; ++iter) {
        case_t c;
        c.op = iter % 4;
        c.H = Hs[rnd() % 9];
        c.K = Ks[rnd() % 7];
        c.T = (iter % 7 == 0) ? 0 : 1 + rnd() % 40;
        c.cap = c.T + rnd() % 3;
        c.normA = rnd() % 2; c.normA_w = rnd() % 2; c.normB = rnd() % 2; c.normB_w = rnd() % 2;
        c.scales = rnd() % 2; c.inplace = rnd() % 3 == 0; c.misalign = rnd() % 4 == 0;
        c.special = rnd() % 4 == 0;
        c.routed = (rnd() % 2) ? 1.0f : 2.5f;
        c.quant = rnd() % 3 == 0 ? 1 + (int)(rnd() % QM_NFORMS) : 0;
        if (c.op == OP_FIN) c.inplace = 0;
        /* every compiled shape that covers H (always the picked one) */
        std::vector<bm_shape> shs;
        shs.push_back(pick_for(c.op, c.T, c.H, c.normA));
        shs.push_back(pick_for(c.op, 1000, c.H, c.normA));
        for (auto s : all_shapes)
            if (bm_shape_ok(s, c.H) && rnd() % 4 == 0) { s.pdl = rnd() % 2; shs.push_back(s); }
        for (auto s : shs) {
            long b = run_case(c, s, (int)(rnd() % 5 == 0));
            ++ncases;
            if (b) {
                fprintf(stderr,
                        "FAIL op=%d K=%d H=%d T=%ld cap=%ld nA=%d/%d nB=%d/%d sc=%d inpl=%d mis=%d sp=%d q=%d shape=%d,%d,%d: %ld\n",
                        c.op, c.K, c.H, (long)c.T, (long)c.cap, c.normA, c.normA_w, c.normB, c.normB_w, c.scales,
                        c.inplace, c.misalign, c.special, c.quant, s.nt, s.j, s.st * 10000 + s.d * 1000 + s.u * 100 + s.cs * 10 + s.pdl, b);
                total_bad += b;
            }
        }
    }
    /* a few large-T cases with the picked shapes */
    for (int iter = 0; iter < 12; ++iter) {
        case_t c = {iter % 4, 8, (iter % 3 == 0) ? 7168 : 2048, 300 + (int64_t)(rnd() % 700), 0, 1, 1, 1, 1, 1, iter % 2, iter % 3 == 1, 1, 1.0f};
        c.cap = c.T + 1;
        c.quant = 1 + iter % QM_NFORMS;
        if (c.op == OP_FIN) c.inplace = 0;
        long b = run_case(c, pick_for(c.op, c.T, c.H, c.normA), 0);
        ++ncases;
        if (b) { fprintf(stderr, "FAIL big iter %d: %ld\n", iter, b); total_bad += b; }
    }
    printf("check: %ld launches, %ld mismatching elements\n", ncases, total_bad);
    return total_bad ? 1 : 0;
}

/* ---------------------------------------------------------------- perf */

__global__ void fill_kernel(uint16_t *p, size_t n, uint64_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = (i + seed) * 0x9E3779B97F4A7C15ULL;
        z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ULL;
        z ^= z >> 29;
        p[i] = (uint16_t)(((z & 1) << 15) | ((121 + (z >> 8) % 10) << 7) | ((z >> 20) & 0x7F));
    }
}


__global__ void empty_kernel(int) {}

struct perf_bufs {
    char *pool = nullptr;
    size_t set_bytes = 0;
    int nsets = 0;
    size_t o_x, o_w, o_res, o_out, o_norm;
};

static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/* The configurations a user can call: op 0 finalize, 1 norm_residual_norm,
 * 2 fused, 3 unfused; then post/pre norm (and its weight), scales, routed
 * scale. Every one has a next norm with weight where there is a residual. */
struct perf_cfg {
    const char *name;
    int op, normA, normA_w, scales;
    float routed;
};
static const perf_cfg cfgs[] = {
    {"fin", 0, 0, 0, 0, 1.0f},          {"fin+post", 0, 1, 1, 0, 1.0f},
    {"nrn", 1, 0, 0, 0, 1.0f},          {"nrn+pre", 1, 1, 1, 0, 1.0f},
    {"nrn+pre+sc", 1, 1, 1, 1, 1.0f},   {"fused", 2, 0, 0, 0, 1.0f},
    {"fused+post", 2, 1, 1, 0, 1.0f},   {"fused+post0", 2, 1, 0, 0, 1.0f},
    {"fused+post+sc", 2, 1, 1, 1, 2.5f}, {"unfused+post", 3, 1, 1, 0, 1.0f},
};
enum { NCFG = sizeof cfgs / sizeof cfgs[0] };

int perf(int argc, char **argv)
{
    int only_op = -1, only_T = -1, only_H = -1, verbose = 1, picked_only = 0, eager = 0, quant = 0, hot = 0;
    const char *only_cfg = NULL;
    for (int i = 2; i < argc; ++i) {
        if (!strcmp(argv[i], "--op") && i + 1 < argc) only_op = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--T") && i + 1 < argc) only_T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--H") && i + 1 < argc) only_H = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cfg") && i + 1 < argc) only_cfg = argv[++i];
        else if (!strcmp(argv[i], "--summary")) verbose = 0;
        else if (!strcmp(argv[i], "--picked")) picked_only = 1;
        /* --eager N: N plain launches of the picked shape, no graph, no
         * timing (for a profiler) */
        else if (!strcmp(argv[i], "--eager") && i + 1 < argc) { eager = atoi(argv[++i]); picked_only = 1; }
        /* --quant N: the next norm's output only, in the first form of kind
         * N of the harness's qm_forms (1 group 128, 2 token, 3 tensor, 4
         * NVFP4; the ops with a next norm; normalized NULL) */
        else if (!strcmp(argv[i], "--quant") && i + 1 < argc) quant = atoi(argv[++i]);
        /* --hot: every call on the same buffers (inputs found in L2, as a
         * decode step finds the expert GEMM's fresh output) */
        else if (!strcmp(argv[i], "--hot")) hot = 1;
        else { fprintf(stderr, "shape_sweep perf: unknown option %s\n", argv[i]); return 2; }
    }
    {
        beam_quant qf;
        if (quant && !qm_form_of(&qf, quant, 1)) {
            fprintf(stderr, "shape_sweep perf: --quant %d: no form of that kind\n", quant);
            return 2;
        }
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));

    /* copy bandwidth */
    double copy_gbs;
    {
        size_t n = (size_t)2 << 30;
        void *a, *b;
        CK(cudaMalloc(&a, n)); CK(cudaMalloc(&b, n));
        CK(cudaMemset(a, 1, n));
        std::vector<double> ts;
        for (int i = 0; i < 12; ++i) {
            CK(cudaEventRecord(e0, st));
            CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st));
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
            if (i >= 2) ts.push_back(ms);
        }
        copy_gbs = 2.0 * n / (median(ts) * 1e-3) / 1e9;
        printf("copy D2D %zu MB: %.1f GB/s (read+write)\n", n >> 20, copy_gbs);
        CK(cudaFree(a)); CK(cudaFree(b));
    }
    /* host cost of pointer attribute queries and launches */
    {
        void *d; CK(cudaMalloc(&d, 1 << 20));
        cudaPointerAttributes at;
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 100000; ++i) CK(cudaPointerGetAttributes(&at, (char *)d + (i & 1023)));
        auto t1 = std::chrono::steady_clock::now();
        printf("cudaPointerGetAttributes: %.1f ns/call\n",
               std::chrono::duration<double, std::nano>(t1 - t0).count() / 100000);
        int dev;
        t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 100000; ++i) CK(cudaGetDevice(&dev));
        t1 = std::chrono::steady_clock::now();
        printf("cudaGetDevice: %.1f ns/call\n", std::chrono::duration<double, std::nano>(t1 - t0).count() / 100000);
        std::vector<char> hb(4096);
        t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 100000; ++i) CK(cudaPointerGetAttributes(&at, hb.data()));
        t1 = std::chrono::steady_clock::now();
        printf("cudaPointerGetAttributes(host): %.1f ns/call type=%d\n",
               std::chrono::duration<double, std::nano>(t1 - t0).count() / 100000, (int)at.type);
        CK(cudaFree(d));
    }

    {
        for (int pdl = 0; pdl < 2; ++pdl) {
            cudaGraph_t g; cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            for (int i = 0; i < 1000; ++i) {
                cudaLaunchConfig_t cfg = {};
                cudaLaunchAttribute at[1];
                cfg.gridDim = dim3(8); cfg.blockDim = dim3(128); cfg.stream = st;
                at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                at[0].val.programmaticStreamSerializationAllowed = 1;
                cfg.attrs = at; cfg.numAttrs = pdl;
                CK(cudaLaunchKernelEx(&cfg, empty_kernel, 0));
            }
            CK(cudaStreamEndCapture(st, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            std::vector<double> ts;
            for (int r = 0; r < 12; ++r) {
                CK(cudaEventRecord(e0, st)); CK(cudaGraphLaunch(ge, st)); CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
                if (r >= 2) ts.push_back(ms);
            }
            printf("empty kernel in a graph (pdl=%d): %.2f us per node\n", pdl, median(ts));
            CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
        }
    }
    struct shp { int T, H; };
    std::vector<shp> shapes = {{1, 7168}, {8, 7168}, {64, 7168}, {512, 7168}, {4096, 7168}, {16384, 7168}, {4096, 4096}, {4096, 2048}};
    /* --T and --H together: that shape, listed above or not */
    if (only_T > 0 && only_H > 0 && only_H % 8 == 0) shapes = {{only_T, only_H}};
    const int K = 8;
    const size_t L2 = prop.l2CacheSize;
    for (auto S : shapes) {
        const int T = S.T, H = S.H;
        if ((only_T >= 0 && T != only_T) || (only_H >= 0 && H != only_H)) continue;
        size_t bx = (size_t)T * K * H * 2, bw = (size_t)T * K * 4, brow = (size_t)T * H * 2;
        auto al = [](size_t n) { return (n + 255) & ~(size_t)255; };
        perf_bufs pb;
        pb.o_x = 0; pb.o_w = al(bx); pb.o_res = pb.o_w + al(bw); pb.o_out = pb.o_res + al(brow);
        /* --quant: the form, its values and scales (block scales: whole
         * tiles) in normalized's region, the scales 256 bytes aligned past
         * the values */
        beam_quant qf;
        qm_form_of(&qf, quant, T);
        const size_t qvb = quant ? al(qm_values_bytes(&qf, T, H)) : 0;
        const size_t qbytes = quant ? qvb + qm_scale_floats(&qf, T, H) * 4 : 0;
        char qlabel[72] = "";
        if (quant) {
            qlabel[0] = ' ';
            qm_label(&qf, qlabel + 1, sizeof qlabel - 1);
        }
        pb.o_norm = pb.o_out + al(brow); pb.set_bytes = pb.o_norm + al(brow > qbytes ? brow : qbytes);
        pb.nsets = (int)std::max<size_t>(2, (3 * L2 + pb.set_bytes - 1) / pb.set_bytes);
        pb.nsets = hot ? 1 : std::min(pb.nsets, 2000);
        CK(cudaMalloc(&pb.pool, pb.set_bytes * pb.nsets));
        fill_kernel<<<1024, 256>>>((uint16_t *)pb.pool, pb.set_bytes * pb.nsets / 2, 77);
        CK(cudaGetLastError());
        /* weights: positive floats */
        {
            std::vector<float> hw((size_t)T * K);
            for (auto &w : hw) w = rweight(0);
            for (int s = 0; s < pb.nsets; ++s)
                CK(cudaMemcpy(pb.pool + s * pb.set_bytes + pb.o_w, hw.data(), bw, cudaMemcpyHostToDevice));
        }
        uint16_t *nw; CK(cudaMalloc(&nw, H * 2 * 2));
        fill_kernel<<<8, 256>>>(nw, H * 2, 5);

        std::vector<bm_shape> others;
        for (auto s : all_shapes)
            for (int pdl = 0; pdl < 2 && !picked_only; ++pdl) {
                s.pdl = pdl;
                if (!bm_shape_ok(s, H)) continue;
                long cover = (long)s.cs * s.nt * s.j;
                if (cover > std::max(32, H / 8) * 2 - 1) continue; /* more than N2 */
                if (T > 64 && s.cs > 1) continue;
                if (s.cs > 1 && (long)T * s.cs > 264) continue;
                others.push_back(s);
            }
        for (int cfgi = 0; cfgi < NCFG; ++cfgi) {
            const perf_cfg &cf = cfgs[cfgi];
            const int op = cf.op;
            if (only_op >= 0 && op != only_op) continue;
            if (only_cfg && strcmp(only_cfg, cf.name)) continue;
            if (quant && (op == 0 || op == 3)) continue;
            const double wA = cf.normA && cf.normA_w ? H * 2.0 : 0.0;
            const double base = (double)bx + bw + brow;
            /* normalized's bytes, or the quantized values and the scales
             * written (FP32 ones 4 bytes, block scales 1; TENSOR none) */
            const double nrm = !quant ? (double)brow
                                      : (double)qm_values_bytes(&qf, T, H) +
                                            (qm_block(&qf) ? (double)T * (H / qm_block(&qf))
                                                           : 4.0 * (double)qm_scale_floats(&qf, T, H));
            const double bytes = op == 0 ? base + wA : op == 1 ? 3.0 * brow + nrm + wA + H * 2.0
                                                             : base + brow + nrm + wA + H * 2.0;
            std::vector<bm_shape> cands;
            cands.push_back(pick_for(op, T, H, cf.normA, quant));
            for (auto s : others) {
                const bm_shape &c0 = cands[0];
                if (s.nt == c0.nt && s.j == c0.j && s.u == c0.u && s.cs == c0.cs && s.pdl == c0.pdl && s.d == c0.d && s.mb == c0.mb && s.st == c0.st) continue;
                cands.push_back(s);
            }
            double best = 1e30; bm_shape bs = cands[0]; double picked = 0;
            for (size_t ci = 0; ci < cands.size(); ++ci) {
                const bm_shape sh = cands[ci];
                auto mk = [&](int s) {
                    char *b = pb.pool + (size_t)s * pb.set_bytes;
                    bm_row_params p; memset(&p, 0, sizeof p);
                    p.rows = T; p.hidden = H;
                    if (op != 1) {
                        p.experts = (uint16_t *)(b + pb.o_x); p.weights = (float *)(b + pb.o_w);
                        p.top_k = K; p.routed_scale = cf.routed;
                    } else {
                        p.x = (uint16_t *)(b + pb.o_x);
                    }
                    p.normA = cf.normA; p.wA = cf.normA_w ? nw : NULL; p.epsA = 1e-6f;
                    if (op == 0) { p.out = (uint16_t *)(b + pb.o_out); }
                    else {
                        p.residual = (uint16_t *)(b + pb.o_res); p.out = (uint16_t *)(b + pb.o_out);
                        p.has_scales = cf.scales; p.scale_x = 0.75f; p.scale_r = 1.25f;
                        p.normB = 1; p.wB = nw + H; p.epsB = 1e-6f; p.normalized = (uint16_t *)(b + pb.o_norm);
                    }
                    return p;
                };
                /* set s's quantized output in normalized's place (values,
                 * then the scales, 256 bytes aligned) */
                auto mkq = [&](int s) {
                    uint8_t *v = (uint8_t *)(pb.pool + (size_t)s * pb.set_bytes + pb.o_norm);
                    return quant_params(qf, H, v, v + qvb);
                };
                auto go = [&](int s) {
                    bm_row_params p = mk(s);
                    if (!quant) return bm_launch_rows(p, sh, 1, st);
                    const bm_quant q = mkq(s);
                    p.normalized = NULL;
                    return bm_launch_rows(p, sh, 1, st, &q);
                };
                if (eager) {
                    for (int i = 0; i < eager; ++i)
                        CK(go(i % pb.nsets));
                    CK(cudaStreamSynchronize(st));
                    printf("eager T=%d H=%d %s shape %d,%d,%d,cs%d,d%d,st%d: %d launches\n", T, H, cf.name, sh.nt,
                           sh.j, sh.u, sh.cs, sh.d, sh.st, eager);
                    continue;
                }
                cudaGraph_t g; cudaGraphExec_t ge;
                CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
                const int calls = (int)bm_graph_calls((size_t)pb.nsets, bytes, copy_gbs);
                for (int c = 0; c < calls; ++c) {
                    const int s = c % pb.nsets;
                    bm_row_params p = mk(s);
                    if (op == 3) {
                        bm_row_params a = p; a.residual = NULL; a.normB = 0; a.normalized = NULL;
                        bm_row_params b2 = p; b2.experts = NULL; b2.weights = NULL; b2.x = p.out; b2.normA = 0;
                        CK(bm_launch_rows(a, sh, 1, st));
                        CK(bm_launch_rows(b2, sh, 1, st));
                    } else {
                        CK(go(s));
                    }
                }
                CK(cudaStreamEndCapture(st, &g));
                CK(cudaGraphInstantiate(&ge, g, 0));
                std::vector<double> ts;
                int reps = std::max(5, std::min(30, (int)(2e5 / (calls * bytes / 3.5e3 + 1))));
                for (int r = 0; r < reps + 2; ++r) {
                    CK(cudaEventRecord(e0, st));
                    CK(cudaGraphLaunch(ge, st));
                    CK(cudaEventRecord(e1, st));
                    CK(cudaEventSynchronize(e1));
                    float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
                    if (r >= 2) ts.push_back(ms * 1e3 / calls);
                }
                double us = median(ts);
                if (ci == 0) picked = us;
                if (us < best) { best = us; bs = sh; }
                if (verbose) printf("  T=%5d H=%d %-9s shape %4d,%d,%d,cs%d,pdl%d,d%d,mb%d,st%d: %9.2f us  %7.1f GB/s  %5.1f%% floor\n", T, H, cf.name,
                       sh.nt, sh.j, sh.u, sh.cs, sh.pdl, sh.d, sh.mb, sh.st, us, bytes / us / 1e3, 100.0 * (bytes / copy_gbs / 1e3) / us);
                CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
            }
            if (eager) continue;
            printf("SUMMARY%s%s T=%5d H=%d %-14s picked %4d,%d,%d,%d,%d,d%d,mb%d,st%d %9.2f us (%5.1f%%)  best %4d,%d,%d,%d,%d,d%d,mb%d,st%d %9.2f us (%5.1f%%) floor %.2f us\n",
                   qlabel,
                   hot ? " hot" : "", T, H,
                   cf.name, cands[0].nt, cands[0].j, cands[0].u, cands[0].cs, cands[0].pdl, cands[0].d, cands[0].mb, cands[0].st, picked,
                   100.0 * (bytes / copy_gbs / 1e3) / picked, bs.nt, bs.j, bs.u, bs.cs, bs.pdl, bs.d, bs.mb, bs.st, best,
                   100.0 * (bytes / copy_gbs / 1e3) / best, bytes / copy_gbs / 1e3);
        }
        CK(cudaFree(pb.pool)); CK(cudaFree(nw));
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "perf")) return perf(argc, argv);
    return check();
}
