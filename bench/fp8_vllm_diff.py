#!/usr/bin/env python3
"""fp8_vllm_diff.py - how often vLLM's FP8 E4M3 formulas give other bits than beammoe's.

beammoe's quantization (docs/numerics.md, "The FP8 output"; lib/quant_bits.h,
cpu/quant.c, gpu/quant.cuh) follows vLLM's kernels but for three operations.
This counts, exhaustively where it can, where vLLM's formula gives other bits:

1. UE8M0 scales: vLLM exp2f(ceilf(log2f(fmaxf(fabsf(s), 1e-10f)))), beammoe
   the smallest power of two >= s from the bits. Over every scale beammoe
   makes (group s = max(absmax, 1e-10) / 448, token s = max(absmax / 448,
   1 / (448 * 512)), absmax every positive finite BF16 value and 0), then the
   codes of every BF16 |x| <= absmax for the scales that differ. log2/exp2 are
   torch.log2/exp2 on float32 tensors of --device: on CUDA the GPU's
   log2f/exp2f (PyTorch's aten/src/ATen/native/cuda/UnaryLogKernels.cu,
   log2_kernel_cuda: `return ::log2(a);`, CUDA's float log2 = log2f; exp2:
   ::exp2, jiterated in recent versions); on the CPU torch's CPU log2/exp2.
2. The reciprocal: x * (1 / s) (FP32 division, then FP32 multiply) against
   x / s, for every finite BF16 x and --scales scales (half log-uniform in
   [1e-6, 1e2], half fp32(bf16 / 448) as the dynamic kernels make them).
3. The clamp order: vLLM's fmaxf(-448, fminf(v, 448)) against beammoe's
   fminf(fmaxf(v, -448), 448), over every BF16 and every FP32 bit pattern.
Both sides use one exact E4M3 conversion (ties to even, subnormal step 2^-9)
and, where no NaN arises, one clamp: each row counts one difference alone.
Context rows: the UE8M0 formula on FP32 scales near powers of two (no BF16
absmax makes them), FP32 quotients before conversion, x * (1 / 2^k).

vLLM source read (github.com/vllm-project/vllm at the commit in brackets):
- csrc/quantization/w8a8/fp8/per_token_group_quant.cu [0f5257e245116449bfbe78a87c22aeef632eba8f]:
  per_token_group_quant_8bit_kernel, ComputeGroupScale:
    local_absmax = eps; local_absmax = fmaxf(local_absmax, fabsf(x));
    y_s = local_absmax / max_8bit;
    if SCALE_UE8M0: y_s = exp2f(ceilf(log2f(fmaxf(fabsf(y_s), 1e-10f))));
  QuantizeGroup: q = fminf(fmaxf(x / y_s, min_8bit), max_8bit)   (divides)
  per_token_group_quant_8bit_register_kernel (group 128, 16-bit contiguous
  aligned input): y_s = __uint_as_float((exp_bits + (mant_bits != 0u ? 1u :
  0u)) << 23) ("Bit-exact with exp2f(ceilf(log2f(...)))"), and scaled =
  SCALE_UE8M0 ? (v * inv_y) : (v / y_s), inv_y = 1.0f / y_s; the packed
  register kernel: the same bits, always v * (1.0f / y_s_q).
- csrc/quantization/w8a8/fp8/common.cuh [0f5257e2, as above], scaled_fp8_conversion:
    x = is_scale_inverted ? val * scale : val / scale;
    r = fmaxf(-quant_type_max_v, fminf(x, quant_type_max_v));   (fminf first)
- csrc/quantization/w8a8/fp8/common.cu [096d3dc9db393f459eeefc0411d806b7d3fb0635]:
    static per tensor / per channel: inv_scale = 1.0f / (*scale) (/ scale[i]),
      scaled_fp8_conversion<true>; dynamic per tensor: scale = atomicMax(
      absmax / 448), reciprocal_scale = 1.0f / (*scale), <true>; dynamic per
      token: token_scale = fmaxf(block_max / 448, min_scaling_factor), <false>
- csrc/quantization/utils.cuh [1f89a92c8c980f3cceec07d76664edd8ecf137cf]:
    min_scaling_factor = 1.0f / (quant_type_max_v<T> * 512.0f)
- csrc/quantization/w8a8/fp8/nvidia/quant_utils.cuh
  [0492a4393c52624baaff6a0f9f7759a596fbfeb7]: float -> e4m3 is
    __nv_cvt_float_to_fp8(a, __NV_SATFINITE, __NV_E4M3)   (group kernel: DST_DTYPE(q))

PyTorch's CUDA division by a CPU scalar (a Python number) multiplies by its
reciprocal (BinaryDivTrueKernel.cu): every divisor here is a tensor on
--device, and the self-check compares the quotients with numpy's.

    python3 bench/fp8_vllm_diff.py [--device cpu|cuda] [--scales N] [--seed S]
"""
import argparse
import math
import sys

import numpy as np
import torch

F32 = torch.float32
CHUNK = 1 << 24  # elements per block of work: a few hundred MB at most


def bf16_all(dev, finite=False):
    """Every BF16 bit pattern as an exact float32 (NaN and inf unless finite)."""
    b = torch.arange(65536, dtype=torch.int64) << 16
    v = torch.where(b >= 2**31, b - 2**32, b).to(torch.int32).view(F32).to(dev)
    return v[torch.isfinite(v)] if finite else v


def const(v, dev):
    """A float32 constant on the device: a Python number as divisor would make
    CUDA multiply by its reciprocal, and torch.fmax/fmin need tensors."""
    return torch.tensor(v, dtype=F32, device=dev)


def clamp_ours(v, m):
    """beammoe (and vLLM's group kernel): fminf(fmaxf(v, -448), 448)."""
    return torch.fmin(torch.fmax(v, -m), m)


def clamp_vllm(v, m):
    """vLLM's scaled_fp8_conversion: fmaxf(-448, fminf(v, 448))."""
    return torch.fmax(-m, torch.fmin(v, m))


def e4m3(v):
    """E4M3 codes of clamped values by torch (checked in self_check)."""
    return v.to(torch.float8_e4m3fn).view(torch.uint8)


def e4m3_ref(v):
    """lib/quant_bits.h's bm_e4m3 in numpy integers, independent of torch: NaN -> 0x7F,
    >= 448 -> 0x7E, below 2^-6 round(|v| * 2^9) to even, else 3 mantissa bits
    rounded to nearest even (a carry moves into the exponent)."""
    u = np.asarray(v, np.float32).view(np.uint32).astype(np.int64)
    sign, a = (u >> 24) & 0x80, u & 0x7FFFFFFF
    q = ((((a >> 23) - 127 + 7) << 3) | ((a >> 20) & 7))
    rest = a & 0xFFFFF
    q = q + ((rest > 0x80000) | ((rest == 0x80000) & ((q & 1) == 1)))
    e = a >> 23  # below 2^-6: |v| * 2^9 = m * 2^(e - 141), m with its implicit bit
    m = np.where(e > 0, (a & 0x7FFFFF) | 0x800000, a)
    sh = np.clip(141 - np.maximum(e, 1), 1, 40)
    qs, rs, half = m >> sh, m & ((1 << sh) - 1), 1 << (sh - 1)
    qs = qs + ((rs > half) | ((rs == half) & ((qs & 1) == 1)))
    q = np.where(a > 0x7F800000, 0x7F, np.where(a >= 0x43E00000, 0x7E, np.where(a < 0x3C800000, qs, q)))
    return (q | sign).astype(np.uint8)


def pow2ceil_ours(s):
    """bm_pow2_ceil: the smallest power of two >= s (s > 0 finite), from the bits."""
    u = s.view(torch.int32)
    up = torch.where((u & 0x7FFFFF) != 0, (u & ~0x7FFFFF) + 0x800000, u)
    return torch.where(u < 0x800000, torch.full_like(u, 0x800000), up).view(F32)


def pow2ceil_vllm(s):
    """vLLM: exp2f(ceilf(log2f(s))), with the device's log2 and exp2."""
    return torch.exp2(torch.ceil(torch.log2(s)))


def self_check(dev, m):
    """Torch's division, multiply, reciprocal, conversion and pow2ceil_ours on
    --device against numpy (IEEE float32) and e4m3_ref, for every finite BF16
    x over scales that give ties, subnormals, saturation and inexact quotients."""
    np.seterr(over="ignore")  # numpy's float32 overflows to inf, as torch's does
    x = bf16_all(dev, finite=True)
    xn = x.cpu().numpy()
    for sv in [1.0, 2.0**-9, 2.0**-3, 2.0**7, 3.0, 0.1, 1 / 448, 1e-4, 1e3, 7.0e-6]:
        s = const(sv, dev)
        sn, q, r = np.float32(sv), x / s, const(1.0, dev) / s
        rn = np.float32(1.0) / sn
        assert np.array_equal(q.cpu().numpy().view(np.uint32), (xn / sn).view(np.uint32)), "division"
        assert r.item() == rn and np.array_equal((x * r).cpu().numpy().view(np.uint32), (xn * rn).view(np.uint32)), "multiply"
        for v in (clamp_ours(q, m), clamp_ours(x * r, m)):
            assert np.array_equal(e4m3(v).cpu().numpy(), e4m3_ref(v.cpu().numpy())), "e4m3 conversion, s=%g" % sv
    p = x[(x > 0)]
    fr, ex = np.frexp(p.cpu().numpy().astype(np.float64))
    want = np.ldexp(1.0, np.where(fr > 0.5, ex, ex - 1)).clip(min=2.0**-126).astype(np.float32)
    assert np.array_equal(pow2ceil_ours(p).cpu().numpy(), want), "pow2ceil"


def compare(x, n, qa, qb, lim, m):
    """e4m3(clamp(qa)) against e4m3(clamp(qb)), the quotients of x by n scales,
    made by qa(rows) and qb(rows) a block of scales at a time (memory stays
    small); pairs with |x| > lim[row] left out where lim is given. Returns
    (pairs, codes differing, FP32 quotients differing, up to 5 differing pairs
    as (x, scale index, qa, qb, code a, code b))."""
    tested = dcode = dfloat = 0
    found, step = [], max(1, CHUNK // x.numel())
    for i in range(0, n, step):
        rows = slice(i, min(n, i + step))
        a, b = qa(rows), qb(rows)
        keep = torch.ones_like(a, dtype=torch.bool) if lim is None else x.abs()[None, :] <= lim[rows, None]
        ca, cb = e4m3(clamp_ours(a, m)), e4m3(clamp_ours(b, m))
        bad = (ca != cb) & keep
        tested, dcode = tested + int(keep.sum()), dcode + int(bad.sum())
        dfloat += int(((a.view(torch.int32) != b.view(torch.int32)) & keep).sum())
        for r, c in (bad.nonzero()[:5 - len(found)].tolist() if len(found) < 5 else []):
            found.append((x[c].item(), i + r, a[r, c].item(), b[r, c].item(), int(ca[r, c]), int(cb[r, c])))
    return tested, dcode, dfloat, found


def ue8m0_rows(dev, m, label):
    """Rows for difference 1: scales where the formulas differ, then codes."""
    x = bf16_all(dev, finite=True)
    absmax = torch.cat([const([0.0], dev), x[(x > 0)]])  # 0: the eps case
    eps, c448 = const(1e-10, dev), const(448.0, dev)
    forms = {"group (group 128/64)": torch.fmax(absmax, eps) / c448,
             "token": torch.fmax(absmax / c448, const(1.0, dev) / (c448 * const(512.0, dev)))}
    rows = []
    for name, s in forms.items():
        s = torch.fmax(s.abs(), eps)
        ours, theirs = pow2ceil_ours(s), pow2ceil_vllm(s)
        bad = ours != theirs
        rows.append(("UE8M0 %s scales, every BF16 absmax; %s" % (name, label), s.numel(), int(bad.sum())))
        so, sv = ours[bad], theirs[bad]
        t, d, _, _ = compare(x, so.numel(), lambda r: x / so[r, None], lambda r: x / sv[r, None], absmax[bad], m)
        rows.append(("UE8M0 %s: codes of every BF16 x, abs(x) <= absmax, of those scales" % name, t, d))
    # FP32 scales within 64 ulps of each power of two 2^-33..2^119 (the range
    # of the group scales): what the formula does where BF16 never gets
    k = torch.arange(-33, 120, device=dev, dtype=torch.int32)
    u = ((k + 127) << 23)[:, None] + torch.arange(-64, 65, device=dev, dtype=torch.int32)[None, :]
    s = u.reshape(-1).view(F32)
    bad = int((pow2ceil_ours(s) != pow2ceil_vllm(s)).sum())
    rows.append(("UE8M0 formula alone, FP32 s within 64 ulps of 2^k (not reachable from BF16); %s" % label, s.numel(), bad))
    return rows


def recip_rows(n, seed, dev, m):
    """Rows for difference 2: x / s against x * (1 / s), codes and FP32 quotients.
    The scales are made on the CPU (the same on every device): n/2 log-uniform
    in [1e-6, 1e2], n/2 fp32(a / 448), a a random positive BF16 in [2^-16,
    2^16] (as the dynamic kernels make them)."""
    x = bf16_all(dev, finite=True)
    g = torch.Generator().manual_seed(seed)
    lo, hi = math.log(1e-6), math.log(1e2)
    logu = torch.exp(torch.rand(n - n // 2, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(F32).to(dev)
    a = (torch.randint(0x3780, 0x4780 + 1, (n // 2,), generator=g, dtype=torch.int32) << 16).view(F32).to(dev)
    dyn, dyn_absmax = a / const(448.0, dev), a
    p2 = ((torch.arange(-33, 120, dtype=torch.int32, device=dev) + 127) << 23).view(F32)
    sets = [("log-uniform s in [1e-6, 1e2]", logu, None), ("s = fp32(bf16 / 448)", dyn, None),
            ("s = fp32(a / 448), only abs(x) <= a (dynamic per tensor)", dyn, dyn_absmax),
            ("s = 2^k, k = -33..119 (vLLM's UE8M0 register kernels)", p2, None)]
    rows, examples, one = [], [], const(1.0, dev)
    for name, sc, lim in sets:
        t, dcode, dfloat, found = compare(x, sc.numel(), lambda r: x / sc[r, None], lambda r: x * (one / sc[r, None]), lim, m)
        examples += [(e[0], sc[e[1]].item()) + e[2:] for e in found] if lim is None else []
        rows.append(("reciprocal, %s: E4M3 code" % name, t, dcode))
        rows.append(("reciprocal, %s: FP32 x*(1/s) != x/s" % name, t, dfloat))
    return rows, examples


def clamp_rows(dev, m):
    """Rows for difference 3: which inputs the two clamp orders treat differently.
    The kernels clamp a quotient x / s, so a signalling NaN arrives quiet; the
    patterns are fed as v / 1 likewise (exact for every other v). Torch's CPU
    fmax/fmin return NaN for a signalling NaN (IEEE 754-2008 maxNum), which
    no kernel here sees."""
    one = const(1.0, dev)
    v = bf16_all(dev)
    d = e4m3(clamp_ours(v / one, m)) != e4m3(clamp_vllm(v / one, m))
    w = v[d] / one
    codes = sorted(set(zip(e4m3(clamp_ours(w, m)).tolist(), e4m3(clamp_vllm(w, m)).tolist())))
    rows = [("clamp order, every BF16 bit pattern: differing = exactly the NaNs: %s; codes (ours, vLLM) %s"
             % (bool(torch.equal(d, torch.isnan(v))), ", ".join("(0x%02X, 0x%02X)" % c for c in codes)), v.numel(), int(d.sum()))]
    # every FP32 pattern: the same steps into buffers made once (fresh 64 MB
    # tensors each block cost the CPU more in page faults than in arithmetic)
    u, q, lo, hi = (torch.empty(CHUNK, dtype=t, device=dev) for t in (torch.int32, F32, F32, F32))
    dd, nan = (torch.empty(CHUNK, dtype=torch.bool, device=dev) for _ in range(2))
    diff, nan_only = 0, True
    for start in range(-2**31, 2**31, CHUNK):
        torch.arange(start, start + CHUNK, out=u)
        torch.div(u.view(F32), one, out=q)
        torch.ne(q, q, out=nan)  # v != v: NaN
        torch.fmin(torch.fmax(q, -m, out=lo), m, out=lo)  # ours
        torch.fmax(-m, torch.fmin(q, m, out=hi), out=hi)  # vLLM's
        torch.ne(lo.view(torch.int32), hi.view(torch.int32), out=dd)
        diff, nan_only = diff + int(dd.sum()), nan_only and torch.equal(dd, nan)
    rows.append(("clamp order, every FP32 bit pattern (clamped values): differing = exactly the NaNs: %s"
                 % nan_only, 2**32, diff))
    return rows


def main():
    """Self-check, the three measurements, the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--scales", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    dev = torch.device(args.device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    m = const(448.0, dev)
    self_check(dev, m)
    label = "torch.log2/exp2 on CUDA (log2f/exp2f)" if dev.type == "cuda" else "torch CPU log2/exp2, not CUDA's log2f"
    rows = ue8m0_rows(dev, m, label)
    rrows, examples = recip_rows(args.scales, args.seed, dev, m)
    rows += rrows + clamp_rows(dev, m)
    where = "%s (%s), torch %s" % (dev.type, name, torch.__version__)
    print("self-check passed: torch division, multiply, float8_e4m3fn conversion and pow2ceil on %s = numpy / integer reference\n" % dev.type)
    print("| what | cases tested | cases differing | fraction | device |")
    print("|---|---:|---:|---:|---|")
    for what, n, d in rows:
        print("| %s | %d | %d | %s | %s |" % (what, n, d, "%.3g" % (d / n) if n else "-", where))
    print("\nreciprocal examples (x, s, x/s, x*(1/s), code of x/s, code of x*(1/s)):")
    for x, s, qd, qm, cd, cm in examples:
        print("  x=%r s=%r x/s=%r x*(1/s)=%r codes 0x%02X 0x%02X" % (x, s, qd, qm, cd, cm))
    return 0


if __name__ == "__main__":
    sys.exit(main())
