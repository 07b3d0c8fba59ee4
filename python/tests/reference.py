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
