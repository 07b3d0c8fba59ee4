"""The quantized output of normalized, on the CPU and on CUDA where torch
sees a device: FP8 (beammoe.FP8Quant) against torch's own quantization of
the plain call's BF16 normalized as docs/numerics.md#fp8 writes it (the
group's or token's largest magnitude, the FP32 scale, the clamp, torch's
conversion to float8_e4m3fn); NVFP4 (beammoe.NVFP4Quant) against
nvfp4_model and MXFP8 (beammoe.MXFP8Quant) against reference.mxfp8_model,
docs/numerics.md#nvfp4 and #mxfp8 written from their text (rounding to a
format is a search in the table of its values, so the models run on every
torch the package supports, 1.13 without float8 dtypes too). Every function
(the local operations, the gather over a CPU group, run by the library or in
Python) bit for bit, q and q_scales poisoned before the call, so that a byte
not written shows, and the padding rows of q_scales (not written) keep the
poison. Then the shapes and dtypes (NVFP4's values and MXFP8's codes
uint8, E4M3 float8_e4m3fn or uint8 on a torch without it), the FP8 output
through torch._scaled_mm, torch.compile and the
fake implementations, the argument errors, and bench/fp8_compare.py's own
check of every configuration.
"""
import ctypes
import os
import re
import subprocess
import sys

import pytest
import torch

import beammoe
from beammoe import _forms, _run
from conftest import (BLOCK_QUANTS, DEVICES, FORMS, FP8, QUANT_TYPES, ThreadAllGather, compiled_and_eager, local_rows,
                      needs_fp8, run_ranks)
from reference import E4M3_VALUES, block_scale_offsets, mxfp8_model, nearest_code, pow2ceil

BF16 = torch.bfloat16
K = 4
# conftest.poisoned's: no scale code is 0xFF (E4M3's are never negative, E8M0's
# of finite groups never 2^128); q bytes are compared whole anyway
POISON = 0xFF

FP8_DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# vLLM's usual 448 * 6 / amax for amax 4; 1; so small that every block's
# scale is 0 (all zeros); so large that every scale saturates (448) and
# most quotients overflow; the largest FP32 below 2^118
GLOBAL_SCALES = [2688.0 / 4, 1.0, 1e-30, 3e35, float.fromhex("0x1.fffffep117")]


# ---- the FP8 reference ----------------------------------------------------------------

def fp8_reference(normalized, quant):
    """(q, scales) of the BF16 rows, as docs/numerics.md#fp8 writes it."""
    t, h = normalized.shape
    v = normalized.float()
    if quant.kind == "tensor":
        s = torch.tensor(quant.scale, dtype=torch.float32, device=v.device)
        q = (v / s).clamp(-448.0, 448.0)
        return q.to(FP8), s.reshape(1)
    n = quant.group_size if quant.kind == "group" else h
    g = v.view(t, h // n, n)
    amax = g.abs().amax(-1)
    # a tensor divisor: torch on CUDA divides by a Python number as a
    # multiplication by its FP32 reciprocal, which is 1 ulp off for 448
    fp8_max = torch.full_like(amax, 448.0)
    if quant.kind == "group":
        s = amax.clamp(min=1e-10) / fp8_max
        if quant.ue8m0:
            s = pow2ceil(s.clamp(min=1e-10))
    else:
        s = (amax / fp8_max).clamp(min=1.0 / (448.0 * 512.0))
        if quant.ue8m0:
            s = pow2ceil(s)
    q = (g / s[..., None]).clamp(-448.0, 448.0)
    q = torch.where(torch.isnan(q), torch.full_like(q, -448.0), q)  # the clamp's fmaxf: NaN -> -448
    return q.view(t, h).to(FP8), s


def check_fp8(quant, q, qs, normalized):
    want_q, want_s = fp8_reference(normalized, quant)
    assert q.dtype == FP8 and q.shape == normalized.shape
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    if quant.kind == "token":
        assert qs.shape == (normalized.shape[0], 1)
        want_s = want_s.reshape(-1, 1)
    elif quant.kind == "group":
        assert qs.shape == want_s.shape
        if quant.column_major:
            ld = (normalized.shape[0] + 3) // 4 * 4
            assert qs.stride() == (1, ld)
    assert torch.equal(qs.view(torch.int32), want_s.view(torch.int32))


# ---- the model of docs/numerics.md#nvfp4 ------------------------------------------------

E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def e2m1(p):
    """E2M1 codes of FP32 p: the nearest magnitude (saturating), p's sign
    bit as bit 3 (a zero keeps its sign); a NaN gives 0x7."""
    nan = torch.isnan(p)
    mag = nearest_code(E2M1_VALUES, torch.where(nan, torch.zeros_like(p), p.abs()).double())
    sign = (torch.signbit(p) & ~nan).long() * 8
    return torch.where(nan, torch.full_like(mag, 7), mag | sign)


def nvfp4_model(normalized, g):
    """(q bytes [T, H / 2] uint8, scale codes [T, H / 16] int64) of BF16 rows."""
    t, h = normalized.shape
    y = normalized.cpu().float().view(t, h // 16, 16)
    a = y.abs()
    m = torch.where(torch.isnan(a), torch.zeros_like(a), a).amax(-1)
    g32 = torch.tensor(g, dtype=torch.float32)
    c6 = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(6.0, dtype=torch.float32)
    assert c6.item() == float.fromhex("0x1.555556p-3")
    sv = g32 * (m * c6)  # two FP32 products, each rounded
    sf = nearest_code(E4M3_VALUES, sv.clamp(max=448.0).double())
    value = E4M3_VALUES[sf].float()
    # os = RN(g * RN(1 / value)): two FP32 operations, each rounded
    rcp = torch.tensor(1.0, dtype=torch.float32) / torch.where(sf == 0, torch.ones_like(value), value)
    os = torch.where(sf == 0, torch.zeros_like(value), g32 * rcp)
    c = e2m1(y * os[..., None])
    packed = (c[..., 0::2] | (c[..., 1::2] << 4)).to(torch.uint8)
    return packed.view(t, h // 2), sf


def check_block_form(quant, q, qs, normalized, poisoned=True, dtypes=True):
    """q and q_scales of `normalized`'s rows in the block form: the model's
    bits (nvfp4_model under the global scale, or mxfp8_model) at the
    layout's bytes (q_scales' at the tiled layout's offsets,
    BEAM_BLOCK_SCALE_BYTES of them); the padding rows keep the poison. The
    dtypes torch's where it has them (dtypes), else uint8."""
    t, h = normalized.shape
    nv = isinstance(quant, beammoe.NVFP4Quant)
    want_q, want_sf = nvfp4_model(normalized, quant.global_scale) if nv else mxfp8_model(normalized)
    qt, st = ((None, FP8) if nv else (FP8, None)) if dtypes else (None, None)
    assert q.dtype == (qt if qt is not None else torch.uint8) and q.shape == (t, h // 2 if nv else h)
    assert qs.dtype == (st if st is not None else torch.uint8)
    assert qs.shape == ((t + 127) // 128 * 128, h // quant.group_size)
    assert q.is_contiguous() and qs.is_contiguous()
    got_q = q.cpu().view(torch.uint8)
    assert torch.equal(got_q, want_q), "q: %d of %d bytes differ" % (int((got_q != want_q).sum()), got_q.numel())
    flat = qs.cpu().view(torch.uint8).reshape(-1)
    n = want_sf.shape[1]
    assert flat.numel() == (t + 127) // 128 * 128 * n  # BEAM_BLOCK_SCALE_BYTES
    off = block_scale_offsets(t, n)
    got_sf = flat[off].long()
    assert torch.equal(got_sf, want_sf), "q_scales: %d of %d differ" % (int((got_sf != want_sf).sum()),
                                                                        got_sf.numel())
    if poisoned:
        pad = torch.ones(flat.numel(), dtype=torch.bool)
        pad[off.reshape(-1)] = False
        assert bool((flat[pad] == POISON).all()), "q_scales: a padding byte was written"


def inputs(t, h, dev, seed, wild=False):
    """Random rows and a next norm weight near 1; wild: one whose blocks of 16
    span 2^-24 to 2^8 (blocks whose scale is 0, subnormal and saturating
    scales), with a few 0, -0, inf, -inf and NaN columns (zeros, infinities,
    NaNs in normalized); wild="mxfp8": one whose groups of 32 span 2^-40
    (below the scale's floor) to 2^110, one group of them zeros, with a few
    0, -0 and NaN columns and no infinity (MXFP8's scale of a group with an
    infinity is no power of two)."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(t, h, generator=gen) * 2).to(BF16)
    r = torch.randn(t, h, generator=gen).to(BF16)
    g = torch.randn(t * K, h, generator=gen).to(BF16)
    w = torch.rand(t, K, generator=gen).softmax(-1)
    if not wild:
        return tuple(v.to(dev) for v in (x, r, g, w, (1 + 0.1 * torch.randn(h, generator=gen)).to(BF16)))
    mx = wild == "mxfp8"
    n, lo, hi = (32, -40, 111) if mx else (16, -24, 9)
    exps = torch.randint(lo, hi, (h // n,), generator=gen).float().repeat_interleave(n)
    nw = torch.randn(h, generator=gen) * torch.pow(2.0, exps)
    cols = torch.randperm(h, generator=gen)[:5]
    nw[cols] = torch.tensor([0.0, -0.0, float("nan"), 0.0, -0.0] if mx else
                            [0.0, -0.0, float("inf"), float("-inf"), float("nan")])
    if mx:
        zeros = int(torch.randint(0, h // n, (1,), generator=gen)) * n
        nw[zeros:zeros + n] = 0.0
    x[0, : h // 4] = 0.0  # a zero times an infinite weight: NaN
    return tuple(v.to(dev) for v in (x, r, g, w, nw.to(BF16)))


def block_inputs(quant, t, h, seed, dev="cpu"):
    """inputs(), wild as the block form asks."""
    return inputs(t, h, dev, seed, wild="mxfp8" if isinstance(quant, beammoe.MXFP8Quant) else True)


def same(a, b):
    """Bit for bit (normalized holds NaNs, which torch.equal calls unequal)."""
    return a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


# ---- every function against the reference or the model ---------------------------------

@needs_fp8
@pytest.mark.parametrize("dev", FP8_DEVICES)
@pytest.mark.parametrize("form", range(len(FORMS)))
@pytest.mark.parametrize("t,h", [(1, 256), (7, 2048), (33, 7168)])
def test_fp8_norm_residual_norm(dev, form, t, h):
    quant = FORMS[form]
    x, r, _, _, nw = inputs(t, h, dev, 1000 * form + t)
    want_h, want_n = beammoe.beam_norm_residual_norm(x, r, nw, 1e-6, nw, 1e-5, (0.75, 1.25))
    keep = (t + form) % 2 == 0
    hid, n, q, qs = beammoe.beam_norm_residual_norm_fp8(x, r, nw, 1e-6, nw, 1e-5, (0.75, 1.25), quant=quant,
                                                         keep_normalized=keep)
    assert torch.equal(hid, want_h)
    assert (n is None) != keep and (n is None or torch.equal(n, want_n))
    check_fp8(quant, q, qs, want_n)


@needs_fp8
@pytest.mark.parametrize("dev", FP8_DEVICES)
@pytest.mark.parametrize("strategy", ["fused", "unfused"])
@pytest.mark.parametrize("form", range(len(FORMS)))
def test_fp8_fused(dev, strategy, form):
    quant = FORMS[form]
    t, h = 9, 2048
    _, r, g, w, nw = inputs(t, h, dev, 7 * form)
    x = beammoe.MoEOutput(g, w)
    want_h, want_n = beammoe.beam_moe_finalize_norm_residual_norm(x, r, nw, 1e-6, nw, 1e-6, None, 2.5,
                                                                   strategy=strategy)
    inplace = form % 2 == 1
    res = r.clone()
    hid, n, q, qs = beammoe.beam_moe_finalize_norm_residual_norm_fp8(x, res, nw, 1e-6, nw, 1e-6, None, 2.5,
                                                                     quant=quant, strategy=strategy,
                                                                     inplace=inplace)
    assert n is None and torch.equal(hid, want_h)
    assert (hid is res) == inplace and torch.equal(r if not inplace else want_h, res)
    check_fp8(quant, q, qs, want_n)


# NVFP4 under each global scale, then MXFP8
BLOCK_FORMS = [beammoe.NVFP4Quant(g) for g in GLOBAL_SCALES] + [beammoe.MXFP8Quant()]
MX = len(BLOCK_FORMS) - 1


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("fi", range(len(BLOCK_FORMS)))
@pytest.mark.parametrize("t,h", [(1, 256), (7, 2048), (130, 7168)])
def test_block_norm_residual_norm(poisoned, dev, fi, t, h):
    quant = BLOCK_FORMS[fi]
    x, r, _, _, nw = block_inputs(quant, t, h, 100 * fi + t, dev)
    want_h, want_n = beammoe.beam_norm_residual_norm(x, r, None, None, nw, 1e-6, (0.75, 1.25))
    keep = (t + fi) % 2 == 0
    hid, n, q, qs = beammoe.beam_norm_residual_norm_fp8(x, r, None, None, nw, 1e-6, (0.75, 1.25),
                                                        quant=quant, keep_normalized=keep)
    assert same(hid, want_h)
    assert (n is None) != keep and (n is None or same(n, want_n))
    if fi == MX:  # groups at the scale's floor (2^-33) and scales far above 1
        codes = mxfp8_model(want_n)[1]
        assert int(codes.min()) == 94 and int(codes.max()) > 127 + 64
    check_block_form(quant, q, qs, want_n)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("strategy", ["fused", "unfused"])
@pytest.mark.parametrize("fi", [0, 1, 2, MX])
@pytest.mark.parametrize("t", [7, 130])
def test_block_fused(poisoned, dev, strategy, fi, t):
    quant, h = BLOCK_FORMS[fi], 2048
    _, r, gm, w, nw = block_inputs(quant, t, h, 7 * fi + t, dev)
    x = beammoe.MoEOutput(gm, w)
    want_h, want_n = beammoe.beam_moe_finalize_norm_residual_norm(x, r, nw, 1e-6, nw, 1e-6, None, 2.5,
                                                                   strategy=strategy)
    inplace = (fi + t) % 2 == 1
    res = r.clone()
    hid, n, q, qs = beammoe.beam_moe_finalize_norm_residual_norm_fp8(x, res, nw, 1e-6, nw, 1e-6, None, 2.5,
                                                                     quant=quant, strategy=strategy,
                                                                     inplace=inplace, keep_normalized=fi == 1)
    assert same(hid, want_h) and (n is None) == (fi != 1)
    assert (hid is res) == inplace and same(r if not inplace else want_h, res)
    check_block_form(quant, q, qs, want_n)


@pytest.mark.parametrize("quant", BLOCK_QUANTS, ids=repr)
@pytest.mark.parametrize("nranks", [1, 2])
@pytest.mark.parametrize("tokens", [0, 7, 130])
def test_block_gather(poisoned, quant, nranks, tokens):
    """Over a CPU group (ranks as threads): every rank's q and q_scales
    are the model of all the gathered rows, under every strategy."""
    h = 512
    _, r, gm, w, nw = block_inputs(quant, max(tokens, 1), h, 50 + tokens)
    r = r[:tokens]  # the expert rows keep a capacity of one at least
    _, want_n = beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(gm, w), r, nw, 1e-6, nw, 1e-5,
                                                             None, 1.5)

    def body(grp, rank):
        lg, lw = local_rows(gm, w, tokens, nranks, rank)
        with beammoe.Workspace.cpu(grp, rank, 256, h, moe_gather_oneshot_max_tokens=4) as ws:
            return [beammoe.beam_moe_finalize_gather_norm_residual_norm_fp8(
                beammoe.MoEOutput(lg, lw), r, nw, 1e-6, nw, 1e-5, None, ws, 1.5, quant=quant, strategy=s)
                for s in (None, "oneshot", "twoshot", "unfused")]

    with beammoe.CpuGroup(nranks) as grp:
        results = run_ranks(nranks, lambda rank: body(grp, rank))
    for out in results:
        for _, n, q, qs in out:
            assert n is None
            check_block_form(quant, q, qs, want_n)


@pytest.mark.parametrize("quant", BLOCK_QUANTS, ids=repr)
@pytest.mark.parametrize("nranks", [1, 2, 3])
@pytest.mark.parametrize("tokens", [7, 130])
def test_block_gather_in_python(poisoned, quant, nranks, tokens):
    """The gathers run in Python (_pgather.py: here the UNFUSED calls with
    the workspace's all_gather hook, over a CPU group) give the model of
    all the gathered rows too (the library quantizes them), normalized kept
    or not, in place or not; the process groups' in
    test_gather_process_group.py."""
    h = 512
    _, r, gm, w, nw = block_inputs(quant, tokens, h, 70 + tokens)
    want_h, want_n = beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(gm, w), r, nw, 1e-6, nw, 1e-5,
                                                                   None, 1.5)
    ag = ThreadAllGather(nranks)

    def body(grp, rank):
        lg, lw = local_rows(gm, w, tokens, nranks, rank)
        out = []
        with beammoe.Workspace.cpu(grp, rank, 256, h) as ws:
            ws.all_gather = ag.hook_for(rank)
            for keep in (False, True):
                for inplace in (False, True):
                    res = r.clone()
                    got = beammoe.beam_moe_finalize_gather_norm_residual_norm_fp8(
                        beammoe.MoEOutput(lg, lw), res, nw, 1e-6, nw, 1e-5, None, ws, 1.5,
                        quant=quant, strategy="unfused", keep_normalized=keep, inplace=inplace)
                    assert (got[0] is res) == inplace and same(res, want_h if inplace else r)
                    out.append((keep, got))
        return out

    with beammoe.CpuGroup(nranks) as grp:
        results = run_ranks(nranks, lambda rank: body(grp, rank))
    assert len(ag.calls) == nranks * 4 * 2  # each call through the hook: the signature, then the rows
    for out in results:
        for keep, (hid, n, q, qs) in out:
            assert same(hid, want_h) and (n is None) != keep and (n is None or same(n, want_n))
            check_block_form(quant, q, qs, want_n)


@pytest.mark.parametrize("hook", [False, True])
def test_block_gather_ranks_differ(hook):
    """Ranks passing different global scales, or NVFP4 beside MXFP8, all
    fail, naming the rule: the library's gather, and Python's through the
    hook (its message names both forms)."""
    h = 512
    _, r, gm, w, nw = inputs(5, h, "cpu", 60, wild=True)
    ag = ThreadAllGather(2)
    nv, mx = "BEAM_QUANT_NVFP4 group 16 scale ", "BEAM_QUANT_MXFP8 group 32 UE8M0"

    def body(grp, rank):
        lg, lw = local_rows(gm, w, 5, 2, rank)
        with beammoe.Workspace.cpu(grp, rank, 8, h, timeout_ms=20000 if hook else 5000) as ws:
            ws.all_gather = ag.hook_for(rank) if hook else None
            # the library's words for each rank's form (beam_gather_agreement_text)
            for quant, (q0, q1) in ((beammoe.NVFP4Quant(1.0 + rank), (nv + "1", nv + "2")),
                                    (beammoe.MXFP8Quant() if rank else beammoe.NVFP4Quant(1.0), (nv + "1", mx)),
                                    (beammoe.NVFP4Quant(1.0) if rank else beammoe.MXFP8Quant(), (mx, nv + "1"))):
                rule = re.escape("the ranks disagree on quant: rank 0 has %s, rank 1 has %s" % (q0, q1) if hook else
                                 "rank 1 and rank 0 passed different quant (%s and %s)" % (q1, q0))
                with pytest.raises(ValueError, match=rule):
                    beammoe.beam_moe_finalize_gather_norm_residual_norm_q(
                        beammoe.MoEOutput(lg, lw), r, nw, 1e-6, nw, 1e-5, None, ws, quant=quant,
                        strategy="unfused" if hook else None)

    with beammoe.CpuGroup(2) as grp:
        run_ranks(2, lambda rank: body(grp, rank))


# ---- the layout and the dtypes ---------------------------------------------------------

def test_offsets_are_the_blocked_layout():
    """The docs' offsets are torch's to_blocked layout of the [T rounded up
    to 128, H / 16 or H / 32] scale matrix (the 128 x 4 tiles, each (4, 32,
    4) transposed to (32, 4, 4)), and each byte of it once."""
    for t, cols in ((1, 256 // 16), (130, 1024 // 16), (256, 7168 // 16), (1, 256 // 32), (130, 7168 // 32)):
        rows = (t + 127) // 128 * 128
        mat = torch.arange(rows * cols, dtype=torch.int64).view(rows, cols)
        blocked = (mat.view(rows // 128, 128, cols // 4, 4).permute(0, 2, 1, 3).reshape(-1, 4, 32, 4)
                   .transpose(1, 2).reshape(-1))
        where = torch.empty_like(blocked)
        where[blocked] = torch.arange(blocked.numel())
        assert torch.equal(block_scale_offsets(t, cols), where.view(rows, cols)[:t])


def test_model_edges():
    """The model on the docs' examples: E2M1 ties to the even code, the
    saturation, signed zeros, NaN."""
    p = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.5, float("inf"), -0.0, -0.1, -0.3,
                      float("nan"), -float("nan"), 6.0, -1e30])
    codes = e2m1(p)
    assert codes.tolist() == [0, 2, 2, 4, 4, 6, 6, 7, 7, 8, 8, 9, 7, 7, 7, 15]
    # the docs' examples are values: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4
    assert E2M1_VALUES[codes[:7] & 7].tolist() == [0, 1, 1, 2, 2, 4, 4]
    assert nearest_code(E4M3_VALUES, torch.tensor([448.0, 2.0 ** -10, 2.0 ** -10 * 3, 0.0],
                                                  dtype=torch.float64)).tolist() == [0x7E, 0, 2, 0]


def test_mxfp8_model_edges():
    """The MXFP8 model on hand-checked groups: the scale rounds up to a
    power of two (no value clamped), the floor of an all-zero group (2^-33,
    code 94), NaN skipped by the maximum and clamped to -448, signed zeros,
    ties to the even code."""
    rows = torch.zeros(4, 64)
    rows[0, :32] = 448.0  # s = 1: code 127, the values 448 (0x7E)
    rows[0, 32] = 464.0  # s = 2: 464 / 2 = 232, halfway from 224 (0x76) to 240 (0x77): 0x76
    rows[1, :32] = -0.0  # an all-zero group: s = 2^-33, -0 keeps its sign (0x80)
    rows[1, 32:] = float("nan")  # no magnitude: the floor too; NaN -> -448 (0xFE)
    rows[2, 0], rows[2, 1] = 3.0, -1.0 / 64  # s = 2^-7: 384 (0x7C), -2 (0xC0)
    rows[3, 0], rows[3, 1] = 2.0 ** -30, 2.0 ** -42 * 2.5  # s = 2^-33: 8 (0x50); 2.5 * 2^-9, subnormal: 0x02
    q, codes = mxfp8_model(rows.to(BF16))
    assert codes.tolist() == [[127, 128], [94, 94], [120, 94], [94, 94]]
    assert q[0, :2].tolist() == [0x7E, 0x7E] and q[0, 32:34].tolist() == [0x76, 0]
    assert q[1, :2].tolist() == [0x80, 0x80] and q[1, 32:34].tolist() == [0xFE, 0xFE]
    assert q[2, :3].tolist() == [0x7C, 0xC0, 0] and q[3, :2].tolist() == [0x50, 0x02]


@pytest.mark.parametrize("have", [False, True])
def test_dtypes_without_float8(poisoned, monkeypatch, have):
    """NVFP4's values and MXFP8's codes are uint8 (as vLLM's and FlashInfer's
    GEMMs take them); E4M3 values and scales float8_e4m3fn, or without it
    (an older torch) uint8 tensors of the same shapes and bits."""
    x, r, _, _, nw = inputs(2, 256, "cpu", 3)
    _, _, q, _ = beammoe.beam_norm_residual_norm_fp8(x, r, None, None, nw, 1e-6, None,
                                                     quant=beammoe.FP8Quant("token"))
    assert q.dtype == (FP8 if FP8 is not None else torch.uint8)
    if not have:
        monkeypatch.setattr(_run, "FP8", None)
    for quant, fn in ((beammoe.NVFP4Quant(1.0), beammoe.beam_norm_residual_norm_fp8),
                      (beammoe.MXFP8Quant(), beammoe.beam_norm_residual_norm_q)):
        x, r, _, _, nw = block_inputs(quant, 3, 512, 4)
        _, n, q, qs = fn(x, r, None, None, nw, 1e-6, None, quant=quant, keep_normalized=True)
        check_block_form(quant, q, qs, n, dtypes=have)


def test_layouts_follow_the_list(monkeypatch, tmp_path):
    """The forms, their fields and their outputs' layouts come from
    lib/quant_forms.def (_forms.py): the file as the package finds it, an
    edited copy (MXFP8 with groups of 64: its fields and scales follow), and
    no file at all (a clear error at the first quantized call)."""
    _forms.table()
    assert _forms._path in _forms.PLACES and os.path.isfile(_forms._path)
    assert {k: (f.bits, f.group, f.scale, f.blocks) for k, f in _forms.table().items()} == {
        1: (8, 0, 0, 0), 2: (8, -1, 0, 0), 3: (8, -1, 1, 0), 4: (4, 16, 2, 1), 5: (8, 32, 3, 1)}
    assert [_forms.name(k) for k in range(1, 7)] == ["FP8 group", "FP8 token", "FP8 tensor", "NVFP4", "MXFP8",
                                                     "kind 6"]
    with open(_forms._path, encoding="utf-8") as f:
        text = f.read()
    edited = tmp_path / "quant_forms.def"
    edited.write_text(text.replace("BM_FORM(BEAM_QUANT_MXFP8, MXFP8, 8, 32, 3, 1)",
                                   "BM_FORM(BEAM_QUANT_MXFP8, MXFP8, 8, 64, 3, 1)"))
    monkeypatch.setattr(_forms, "_table", _forms.read(str(edited)))
    assert beammoe.MXFP8Quant().fields() == (5, 64, 0, 0.0)
    q, qs = _run.empty_outputs(*beammoe.MXFP8Quant().fields(), 130, 1024, "cpu")
    assert q.shape == (130, 1024) and qs.shape == (256, 16)
    monkeypatch.setattr(_forms, "_table", None)
    monkeypatch.setattr(_forms, "PLACES", (str(tmp_path / "none" / "a.def"), str(tmp_path / "b.def")))
    x, r, _, _, nw = inputs(2, 256, "cpu", 5)
    with pytest.raises(RuntimeError, match=r"^beammoe: the list of quantized forms, quant_forms\.def, is in "
                                           r"neither .*a\.def .* nor .*b\.def"):
        beammoe.beam_norm_residual_norm_q(x, r, None, None, nw, 1e-6, None, quant=beammoe.FP8Quant("token"))
    assert _forms.name(5) == "kind 5"  # a message naming a form shows its number without the list


# ---- the quant description and the argument errors -------------------------------------

def test_quant_fields_and_repr():
    quant = beammoe.NVFP4Quant(672)
    assert quant.fields() == (4, 16, 0, 672.0) and quant.global_scale == 672.0
    assert repr(quant) == "NVFP4Quant(672.0)" and eval(repr(quant), vars(beammoe)).fields() == quant.fields()
    assert beammoe.NVFP4Quant(torch.tensor(2.0)).global_scale == 2.0
    assert beammoe.NVFP4Quant(float.fromhex("0x1.fffffep117")).fields()[3] < 2.0 ** 118
    quant = beammoe.MXFP8Quant()
    assert quant.fields() == (5, 32, 0, 0.0) and quant.group_size == 32 and beammoe.NVFP4Quant(1.0).group_size == 16
    assert repr(quant) == "MXFP8Quant()" and eval(repr(quant), vars(beammoe)).fields() == quant.fields()
    from beammoe import fp8  # the former name of beammoe.quant
    assert fp8.MXFP8Quant is beammoe.MXFP8Quant and "MXFP8Quant" in beammoe.__all__


@pytest.mark.parametrize("args,kw", [((32,), {}), ((), dict(group_size=32)), ((1.0,), {}), ((), dict(scale=0.0))])
def test_mxfp8_takes_no_arguments(args, kw):
    """MXFP8's group (32), flags and scale are the form's: MXFP8Quant takes nothing."""
    with pytest.raises(TypeError, match=r"takes 1 positional argument|unexpected keyword argument|takes no arguments"):
        beammoe.MXFP8Quant(*args, **kw)


@pytest.mark.parametrize("kw,err,msg", [
    (dict(kind="block"), ValueError, r"kind='block' must be"),
    (dict(kind="group", group_size=32), ValueError, r"group_size=32 must be 128 or 64"),
    (dict(kind="token", column_major=True), ValueError, r"column_major is for kind=\"group\""),
    (dict(kind="tensor"), TypeError, r"scale"),
    (dict(kind="tensor", scale=0.0), ValueError, r"scale=0.0 must be > 0"),
    (dict(kind="tensor", scale=1e39), ValueError, r"scale=1e\+39 is out of the float32 range"),
    (dict(kind="tensor", scale=float("inf")), ValueError, r"must be > 0 and finite as an FP32"),
    (dict(kind="tensor", scale=1e-50), ValueError, r"must be > 0 and finite as an FP32"),
    (dict(kind="tensor", scale=1.0, ue8m0=True), ValueError, r"ue8m0 is for the dynamic kinds"),
    (dict(kind="token", scale=1.0), ValueError, r"scale is for kind=\"tensor\""),
    (dict(kind="group", ue8m0=1), TypeError, r"ue8m0"),
    # group_size is an int: refused at construction, not inside torch later
    (dict(kind="group", group_size=128.0), TypeError, r"^FP8Quant: group_size must be an int, got float"),
    (dict(kind="group", group_size=True), TypeError, r"^FP8Quant: group_size must be an int, got bool"),
    (dict(kind="group", group_size=torch.tensor(128)), TypeError, r"^FP8Quant: group_size must be an int, got a "
                                                                  r"tensor"),
    (dict(kind="group", group_size="64"), TypeError, r"^FP8Quant: group_size must be an int, got str"),
    (dict(kind="token", group_size=64.0), TypeError, r"^FP8Quant: group_size must be an int, got float"),
    (dict(kind="group", group_size=2 ** 40), ValueError, r"^FP8Quant: group_size=1099511627776 is out of range"),
])
def test_bad_quant(kw, err, msg):
    with pytest.raises(err, match=msg):
        beammoe.FP8Quant(**kw)


def test_group_size_kinds_of_int():
    """An int of any integer kind (NumPy's too) is taken, and stays a Python
    int: the form's fields, as the operators take them."""
    np = pytest.importorskip("numpy")
    q = beammoe.FP8Quant("group", np.int64(64))
    assert type(q.group_size) is int and q.fields()[:2] == (1, 64)
    assert beammoe.FP8Quant("token", group_size=np.int32(7)).fields()[1] == 0  # not a group form: unused


BIG = float.fromhex("0x1.ffffffp117")  # below 2^118, but 2^118 as an FP32


@pytest.mark.parametrize("g,err,msg", [
    (0.0, ValueError, r"global_scale=0.0 must be > 0 and < 2\^118 as an FP32"),
    (-1.0, ValueError, r"global_scale=-1.0 must be > 0"),
    (1e-50, ValueError, r"global_scale=1e-50 must be > 0 and < 2\^118 as an FP32"),
    (2.0 ** 118, ValueError, r"global_scale=3.32306998946229e\+35 must be > 0 and < 2\^118"),
    (BIG, ValueError, re.escape("global_scale=%r must be > 0 and < 2^118 as an FP32" % BIG)),
    (float("inf"), ValueError, r"global_scale=inf must be"),
    (float("nan"), ValueError, r"global_scale=nan must be"),
    (1e39, ValueError, r"global_scale=1e\+39 is out of the float32 range"),
    (True, TypeError, r"global_scale must be a float, got bool"),
    ("1.0", TypeError, r"global_scale must be a float, got str"),
    (None, TypeError, r"global_scale must be a float, got NoneType"),
])
def test_bad_global_scale(g, err, msg):
    assert ctypes.c_float(BIG).value == 2.0 ** 118
    with pytest.raises(err, match=r"^NVFP4Quant: " + msg):
        beammoe.NVFP4Quant(g)


@pytest.mark.parametrize("quant,next_norm,err,msg", [
    ({"kind": "group"}, True, TypeError, QUANT_TYPES + "dict"),
    (1.0, True, TypeError, QUANT_TYPES + "float"),
    (beammoe.MXFP8Quant, True, TypeError, QUANT_TYPES + "type"),  # the class, not a form
    (beammoe.FP8Quant(), False, ValueError, r"next_eps must be given"),
    (beammoe.NVFP4Quant(1.0), False, ValueError, r"^beam_norm_residual_norm_q: next_eps must be given"),
    (beammoe.MXFP8Quant(), False, ValueError, r"^beam_norm_residual_norm_q: next_eps must be given"),
])
def test_bad_calls(quant, next_norm, err, msg):
    x, r, _, _, nw = inputs(2, 256, "cpu", 5, wild=isinstance(quant, (float, beammoe.NVFP4Quant)))
    with pytest.raises(err, match=msg):
        beammoe.beam_norm_residual_norm_fp8(x, r, None, None, nw if next_norm else None, 1e-6 if next_norm else None,
                                            None, quant=quant)


@needs_fp8
@pytest.mark.parametrize("dev", FP8_DEVICES)
@pytest.mark.parametrize("form", [beammoe.FP8Quant("token"), beammoe.FP8Quant("tensor", scale=0.05)], ids=repr)
def test_scaled_mm(dev, form):
    """q and q_scales feed torch._scaled_mm as they are (as vLLM's and
    FlashInfer's FP8 GEMMs take them: q [T, H] float8_e4m3fn row-major, its
    FP32 scale [T, 1] row-wise or one for the tensor): the GEMM equals the
    GEMM on the eager quantization of normalized, bit for bit."""
    t, h, n_out = 32, 2048, 256
    x, r, _, _, nw = inputs(t, h, dev, 11)
    hid, n, q, qs = beammoe.beam_norm_residual_norm_fp8(x, r, None, None, nw, 1e-6, None, quant=form,
                                                        keep_normalized=True)
    want_q, want_s = fp8_reference(n, form)
    wgt = torch.randn(n_out, h, generator=torch.Generator().manual_seed(3)).to(FP8).to(dev)
    rowwise = form.kind == "token"
    w_s = torch.ones(1, n_out, device=dev) if rowwise else torch.ones((), device=dev)
    shape = (-1, 1) if rowwise else ()
    try:
        got = torch._scaled_mm(q, wgt.t(), scale_a=qs.reshape(shape), scale_b=w_s, out_dtype=BF16)
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip("this torch's _scaled_mm does not take %r on %s: %s" % (form, dev, e))
    want = torch._scaled_mm(want_q, wgt.t(), scale_a=want_s.reshape(shape), scale_b=w_s, out_dtype=BF16)
    assert torch.equal(got, want)


# ---- the torch operators ----------------------------------------------------------------

needs_fp8_ops = pytest.mark.skipif(not beammoe.HAVE_TORCH_OPS or FP8 is None,
                                   reason="torch %s: no torch.library.custom_op or no float8" % torch.__version__)
needs_ops = pytest.mark.skipif(not beammoe.HAVE_TORCH_OPS,
                               reason="torch %s: no torch.library.custom_op" % torch.__version__)


@needs_fp8_ops
@pytest.mark.parametrize("dev", FP8_DEVICES)
@pytest.mark.parametrize("form", [0, 3, 5, 6])
def test_fp8_compiled(dev, form):
    """torch.compile(fullgraph=True) through torch.ops.beammoe.*_fp8: the
    eager call's bits, shapes and strides."""
    x, r, g, w, nw = inputs(6, 512, dev, 40 + form)
    for ga, wa in compiled_and_eager(x, r, g, w, nw, FORMS[form], keep_nrn=False):
        assert ga[1] is None or torch.equal(ga[1], wa[1])
        assert torch.equal(ga[0], wa[0])
        assert torch.equal(ga[2].view(torch.uint8), wa[2].view(torch.uint8))
        assert torch.equal(ga[3], wa[3]) and ga[3].stride() == wa[3].stride()


@needs_fp8_ops
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graph():
    """Captured in a CUDA graph and replayed on new inputs: the eager bits."""
    quant = beammoe.FP8Quant("group", 128)
    x, r, _, _, nw = inputs(16, 2048, "cuda", 99)
    static_x, static_r = x.clone(), r.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        beammoe.beam_norm_residual_norm_fp8(static_x, static_r, None, None, nw, 1e-6, None, quant=quant)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = beammoe.beam_norm_residual_norm_fp8(static_x, static_r, None, None, nw, 1e-6, None, quant=quant)
    x2, r2, _, _, _ = inputs(16, 2048, "cuda", 100)
    static_x.copy_(x2)
    static_r.copy_(r2)
    graph.replay()
    torch.cuda.synchronize()
    want = beammoe.beam_norm_residual_norm_fp8(x2, r2, None, None, nw, 1e-6, None, quant=quant)
    assert torch.equal(out[0], want[0])
    assert torch.equal(out[2].view(torch.uint8), want[2].view(torch.uint8)) and torch.equal(out[3], want[3])


def test_inplace_not_compiled():
    """inplace=True has no torch operator: under torch.compile it says so."""
    if not hasattr(torch, "compile"):
        pytest.skip("torch %s has no torch.compile" % torch.__version__)
    x, r, _, _, nw = inputs(2, 256, "cpu", 8)

    def f(x, r):
        return beammoe.beam_norm_residual_norm_fp8(x, r, None, None, nw, 1e-6, None,
                                                   quant=beammoe.FP8Quant("token"), inplace=True)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"runs in eager calls"):
        torch.compile(f, fullgraph=True)(x, r)


@needs_ops
@pytest.mark.parametrize("fields,msg", [
    ((4, 128, 0, 1.0), r"BEAM_QUANT_NVFP4 takes quant->group_size 16"),
    ((4, 16, 1, 1.0), r"BEAM_QUANT_NVFP4 takes quant->group_size 16"),
    ((4, 16, 0, 0.0), r"quant->scale=0 \(the global scale\) must be > 0 and < 2\^118"),
    ((4, 16, 0, 2.0 ** 118), r"must be > 0 and < 2\^118"),
    ((5, 16, 0, 0.0), r"BEAM_QUANT_MXFP8 takes quant->group_size 32"),
    ((5, 32, 1, 0.0), r"BEAM_QUANT_MXFP8 takes quant->group_size 32"),
    ((9, 32, 0, 0.0), r"quant kind=9 is none of the forms of .*quant_forms.def \(1: FP8 group, .* 5: MXFP8\)"),
])
def test_operator_refuses_bad_encoding(fields, msg):
    """The operator takes the library's encoding; the library checks it."""
    x, r, _, _, nw = inputs(2, 256, "cpu", 6, wild=True)
    with pytest.raises(ValueError, match=msg):
        torch.ops.beammoe.norm_residual_norm_fp8(x, r, None, None, nw, 1e-6, None, *fields, False)


@needs_ops
@pytest.mark.parametrize("quant", BLOCK_QUANTS, ids=repr)
@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("t", [7, 130])
def test_block_compiled(quant, dev, t):
    """torch.compile(fullgraph=True) through torch.ops.beammoe.*_fp8: the
    model's bits, the eager call's shapes, strides and dtypes."""
    x, r, g, w, nw = block_inputs(quant, t, 512, 40 + t, dev)
    for ga, wa in compiled_and_eager(x, r, g, w, nw, quant, keep_nrn=True):
        assert same(ga[0], wa[0]) and same(ga[1], wa[1])
        for a, b in zip(ga[2:], wa[2:]):
            assert (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)
        check_block_form(quant, ga[2], ga[3], wa[1], poisoned=False)


@needs_ops
def test_meta_tensors():
    """Meta tensors take the operators' fake implementations: the eager
    call's shapes, strides and dtypes (130 tokens: q_scales of 256 rows),
    for NVFP4 and MXFP8."""
    x, r, g, w, nw = inputs(130, 1024, "cpu", 9, wild=True)

    def calls(x, r, g, w, nw, quant):
        return (beammoe.beam_norm_residual_norm_fp8(x, r, None, None, nw, 1e-6, None, quant=quant),
                beammoe.beam_moe_finalize_norm_residual_norm_fp8(beammoe.MoEOutput(g, w), r, nw, 1e-6, nw, 1e-6,
                                                                 None, quant=quant, keep_normalized=True))

    for quant in BLOCK_QUANTS:
        want = calls(x, r, g, w, nw, quant)
        got = calls(*(t.to("meta") for t in (x, r, g, w, nw)), quant)
        for ga, wa in zip(got, want):
            assert wa[3].shape == (256, 1024 // quant.group_size)
            for a, b in zip(ga, wa):
                assert (a is None) == (b is None)
                if a is not None:
                    assert a.device.type == "meta"
                    assert (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)


@needs_ops
def test_opcheck():
    """torch.library.opcheck: schema, fake implementation, autograd
    registration, AOT dispatch (128 tokens: no padding rows, whose bytes
    are not written and would differ between the runs it compares; a norm
    weight with no NaN, which the comparisons would call unequal)."""
    x, r, g, w, _ = inputs(128, 256, "cpu", 12, wild=True)
    nw = (1 + 0.1 * torch.randn(256, generator=torch.Generator().manual_seed(12))).to(BF16)
    for keep in (False, True):
        torch.library.opcheck(torch.ops.beammoe.norm_residual_norm_fp8.default,
                              (x, r, None, None, nw, 1e-6, None) + beammoe.NVFP4Quant(672.0).fields() + (keep,))
        torch.library.opcheck(torch.ops.beammoe.moe_finalize_norm_residual_norm_fp8.default,
                              (g, w, r, nw, 1e-6, nw, 1e-6, [0.5, 2.0], 2.5, 0) + beammoe.NVFP4Quant(1.0).fields()
                              + (keep,))


# ---- bench/fp8_compare.py: its bit check (each operation's quantized form against the BF16 operation and a
# torch.compile'd quantization from vLLM's formulas) agrees for every configuration with a next norm, the
# group-128 and NVFP4 forms, at one small shape on the CPU; and the benchmark still works against the package

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SCRIPT = os.path.join(_ROOT, "bench", "fp8_compare.py")

@pytest.mark.skipif(FP8 is None or not hasattr(torch, "compile"),
                    reason="torch %s has no float8_e4m3fn or torch.compile" % torch.__version__)
def test_bench_every_configuration_agrees_on_cpu():
    cmd = [sys.executable, _SCRIPT, "--device", "cpu", "--ops", "all", "--forms", "group128,nvfp4",
           "--shapes", "4:2048", "--iters", "2", "--threads", "1"]
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-4000:]
    rows = re.findall(r"^(\S+) (\S+) T=4 H=2048 wall \[(\w+)\]", run.stdout, re.M)
    # torch_compare's configurations with a next norm: five of the fused op, five of nrn
    ops = {op for op, _, _ in rows}
    assert len(ops) == 10, run.stdout[-4000:]
    assert {form for _, form, _ in rows} == {"group128", "nvfp4"}
    assert len(rows) == 20
    assert all(check == "agree" for _, _, check in rows), [r for r in rows if r[2] != "agree"]
