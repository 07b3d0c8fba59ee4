"""Torch-written eager references and test data.

finalize_ref is the PyTorch eager formula of docs/numerics.md with its one
summation order made explicit: a per-k add in order, starting from +0, then
the BF16 cast, then the routed scale and its rounding. Every step is one
elementwise torch op on FP32 values (no reduction kernel whose order could
vary, no FMA contraction across ops), so it gives the bits of docs/numerics.md.

rmsnorm_hf is HF's RMSNorm (weight * (x.float() * rsqrt(var + eps)).to(bf16));
its mean() reduction order is torch's, not the tree of docs/numerics.md#halving-tree, so results that pass
through a norm are checked against the C library instead (and against
rmsnorm_hf only to within one BF16 step).

The quantized forms' models (docs/numerics.md#fp8, #nvfp4, #mxfp8) share
the E4M3 table (E4M3_VALUES, nearest_code: rounding to a format is a search
in the table of its values, not torch's conversion, so the models run on
every torch the package supports, 1.13 without float8 dtypes included),
pow2ceil and the block scales' tiled layout (block_scale_offsets);
mxfp8_model is docs/numerics.md#mxfp8 written from its text.
"""
import torch

BF16 = torch.bfloat16
F32 = torch.float32
NAN_BITS = 0x7FFF


def bf16(v):
    """FP32 -> BF16 round-to-nearest-even, every NaN as 0x7FFF (docs/numerics.md#bf16)."""
    r = v.to(BF16)
    nan = torch.isnan(v)
    if nan.any():
        bits = r.view(torch.int16).clone()
        bits[nan] = NAN_BITS
        r = bits.view(BF16)
    return r


def bits(t):
    """The BF16 tensor's bit patterns (int16) for exact comparison."""
    return t.contiguous().view(torch.int16)


def assert_bits_equal(got, want, what=""):
    """Bit for bit; tuples (hidden, normalized, ...) element by element."""
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want), "%s: %d results, not %d" % (what, len(got), len(want))
        for i, (a, b) in enumerate(zip(got, want)):
            assert_bits_equal(a, b, "%s [%d]" % (what, i))
        return
    gb, wb = bits(got.cpu()), bits(want.cpu())
    assert gb.shape == wb.shape, "%s: shape %s != %s" % (what, tuple(gb.shape), tuple(wb.shape))
    diff = (gb != wb)
    if diff.any():
        idx = diff.nonzero()[0].tolist()
        raise AssertionError("%s: %d of %d values differ, first at %s: got 0x%04x want 0x%04x"
                             % (what, int(diff.sum()), diff.numel(), idx, int(gb[tuple(idx)]) & 0xFFFF,
                                int(wb[tuple(idx)]) & 0xFFFF))


def finalize_ref(gemm2, weights, live, routed_scale=1.0):
    """bf16(bf16(sum_k w[t,k] * f(x[t,k])) * routed_scale) for t < live: [live, H] BF16."""
    capacity, top_k = weights.shape
    x = gemm2.reshape(capacity, top_k, -1)[:live].float()
    w = weights[:live]
    a = torch.zeros(live, x.shape[2], dtype=F32)  # +0.0
    for k in range(top_k):
        a = a + (w[:, k, None] * x[:, k, :])
    r = bf16(a)
    return bf16(r.float() * torch.tensor(routed_scale, dtype=F32))


def rmsnorm_hf(x, weight, eps):
    """HF's RMSNorm of BF16 rows (torch's own reduction order)."""
    v = x.float()
    var = v.pow(2).mean(-1, keepdim=True)
    u = (v * torch.rsqrt(var + eps)).to(BF16)
    return (weight * u) if weight is not None else u


def random_case(gen, capacity, top_k, hidden, tokens=None, specials=False):
    """Expert results [capacity * top_k, H] BF16 and weights [capacity, top_k]
    FP32; rows past `tokens` are NaN-filled (they must never be read)."""
    g = (torch.randn(capacity * top_k, hidden, generator=gen) * 4).to(BF16)
    w = torch.rand(capacity, top_k, generator=gen) * 2 - 0.5
    if specials:
        flat = g.view(-1)
        n = flat.numel()
        for val in (0.0, -0.0, 1e-39, -1e-39, 3e38, float("inf")):
            idx = torch.randint(0, n, (max(1, n // 500),), generator=gen)
            flat[idx] = val
    if tokens is not None and tokens < capacity:
        g.view(capacity, top_k, hidden)[tokens:] = float("nan")
        w[tokens:] = float("nan")
    return g, w


def random_bf16(gen, *shape, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(BF16)


def layer(gen, tokens, top_k, hidden, capacity=None, scale=2.0, specials=True):
    """A layer's inputs: (expert results, weights) of `capacity` tokens (default
    max(tokens, 1); given, the rows past `tokens` are NaN), a residual of
    `tokens` rows (randn * scale), a post and a next norm weight."""
    g, w = random_case(gen, capacity or max(tokens, 1), top_k, hidden, tokens=tokens if capacity else None,
                       specials=specials)
    return g, w, random_bf16(gen, tokens, hidden, scale=scale), random_bf16(gen, hidden), random_bf16(gen, hidden)


def rmsnorm_spec(v, weight, eps):
    """The RMSNorm of docs/numerics.md with its tree order, written with elementwise torch
    ops on FP32 (chunks of 8 summed in order, then strided halving), as an
    independent check of the library's norm. v: [T, H] FP32 (widened BF16)."""
    t, h = v.shape
    q = v * v
    c = h // 8
    q3 = q.reshape(t, c, 8)
    p = q3[:, :, 0]
    for i in range(1, 8):
        p = p + q3[:, :, i]
    n2 = 1
    while n2 < c:
        n2 *= 2
    if n2 > c:
        p = torch.cat([p, torch.zeros(t, n2 - c, dtype=F32)], dim=1)
    s = n2 // 2
    while s >= 1:
        p = p[:, :s] + p[:, s:2 * s]
        s //= 2
    ms = p[:, 0] / torch.tensor(float(h), dtype=F32)
    inv = torch.ones_like(ms) / torch.sqrt(ms + torch.tensor(eps, dtype=F32))
    u = bf16(v * inv[:, None])
    return bf16(u.float() * weight.float()) if weight is not None else u


def nrn_spec(x, residual, pre_weight, pre_eps, scales, next_weight, next_eps):
    """The norm_residual_norm of docs/numerics.md in torch: (hidden, normalized | None)."""
    xp = rmsnorm_spec(x.float(), pre_weight, pre_eps) if pre_eps is not None else x
    if scales is not None:
        bx = bf16(xp.float() * torch.tensor(scales[0], dtype=F32))
        br = bf16(residual.float() * torch.tensor(scales[1], dtype=F32))
    else:
        bx, br = xp, residual
    hidden = bf16(bx.float() + br.float())
    normalized = rmsnorm_spec(hidden.float(), next_weight, next_eps) if next_eps is not None else None
    return hidden, normalized


def fused_spec(gemm2, weights, live, residual, post_weight, post_eps, next_weight, next_eps, scales,
               routed_scale=1.0):
    """finalize then norm_residual_norm, all in torch: (hidden, normalized | None)."""
    f = finalize_ref(gemm2, weights, live, routed_scale)
    if post_eps is not None:
        f = rmsnorm_spec(f.float(), post_weight, post_eps)
    return nrn_spec(f, residual, None, None, scales, next_weight, next_eps)


# ---- the quantized forms -----------------------------------------------------------------

def e4m3_values():
    """The non-negative finite E4M3 values, by code 0..0x7E: bias 7, 3
    mantissa bits, subnormals on the grid of 2^-9 (0x7F is the NaN)."""
    out = []
    for code in range(0x7F):
        e, m = code >> 3, code & 7
        out.append(m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return torch.tensor(out, dtype=torch.float64)


E4M3_VALUES = e4m3_values()


def nearest_code(values, v):
    """The code of the value in `values` (increasing, by code) nearest to v
    (FP64 magnitudes >= 0, no NaN), ties to the even code; beyond the last,
    the last. Exact: the midpoints of the tables' neighbours are FP64 numbers
    and every FP32 is an FP64."""
    hi = torch.searchsorted(values, v).clamp(max=len(values) - 1)
    lo = (hi - 1).clamp(min=0)
    mid = (values[lo] + values[hi]) / 2
    even = torch.where(lo % 2 == 0, lo, hi)
    return torch.where(v < mid, lo, torch.where(v > mid, hi, even))


def pow2ceil(s):
    """The smallest power of two >= s (s > 0), by frexp (exact)."""
    m, e = torch.frexp(s)
    return torch.where(m == 0.5, s, torch.ldexp(torch.ones_like(s), e))


def block_scale_offsets(tokens, n):
    """[tokens, n]: the byte of token t's block scale b in the 128 x 4 tiled
    layout of n scales a row (the docs' formula, BEAM_BLOCK_SCALE_OFFSET)."""
    t = torch.arange(tokens, dtype=torch.int64)[:, None]
    b = torch.arange(n, dtype=torch.int64)[None, :]
    return 512 * ((t // 128) * (n // 4) + b // 4) + 16 * (t % 32) + 4 * ((t % 128) // 32) + b % 4


def mxfp8_model(normalized):
    """(values [T, H] uint8, E8M0 codes [T, H / 32] int64) of BF16 rows, as
    docs/numerics.md#mxfp8 writes them, for each group of 32 values x:
    absmax = max(1e-10, |x|) (a NaN skipped), s = the smallest power of two
    >= max(absmax / 448, 1e-10) (FP32 quotient), code = log2(s) + 127,
    values e4m3(clamp(x / s)) (a NaN clamps to -448; signed zeros keep
    their sign). For finite rows (an infinity has no power of two)."""
    t, h = normalized.shape
    x = normalized.cpu().float().view(t, h // 32, 32)
    a = x.abs()
    floor = torch.tensor(1e-10, dtype=F32)
    absmax = torch.maximum(torch.where(torch.isnan(a), torch.zeros_like(a), a).amax(-1), floor)
    s = pow2ceil(torch.maximum(absmax / torch.full_like(absmax, 448.0), floor))
    _, e = torch.frexp(s)  # s = 2^(e - 1)
    y = (x / s[..., None]).clamp(-448.0, 448.0)
    y = torch.where(torch.isnan(y), torch.full_like(y, -448.0), y)
    code = nearest_code(E4M3_VALUES, y.abs().double()) | torch.signbit(y).long() * 0x80
    return code.to(torch.uint8).view(t, h), (e - 1 + 127).long()
