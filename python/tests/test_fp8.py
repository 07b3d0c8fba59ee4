"""The FP8 output of normalized (beammoe.fp8) against torch's own quantization.

The reference: the plain call's BF16 normalized, quantized with torch
operations as docs/numerics.md#fp8 writes it (the group's or token's largest
magnitude, the FP32 scale, the clamp, torch's conversion to float8_e4m3fn,
which rounds to nearest even). Every form, both operations, normalized kept
or not, in place or not, on the CPU (and CUDA where torch sees a device).
"""
import pytest
import torch

import beammoe
from conftest import compiled_and_eager

FP8 = getattr(torch, "float8_e4m3fn", None)
needs_fp8 = pytest.mark.skipif(FP8 is None, reason="torch %s has no float8_e4m3fn" % torch.__version__)
BF16 = torch.bfloat16
K = 4

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
FORMS = [
    beammoe.FP8Quant("group", 128),
    beammoe.FP8Quant("group", 64, ue8m0=True),
    beammoe.FP8Quant("group", 128, column_major=True),
    beammoe.FP8Quant("group", 64, ue8m0=True, column_major=True),
    beammoe.FP8Quant("token"),
    beammoe.FP8Quant("token", ue8m0=True),
    beammoe.FP8Quant("tensor", scale=0.0125),
]


def pow2ceil(s):
    """The smallest power of two >= s (s > 0), by frexp (exact)."""
    m, e = torch.frexp(s)
    return torch.where(m == 0.5, s, torch.ldexp(torch.ones_like(s), e))


def reference(normalized, quant):
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


def inputs(t, h, dev, seed):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(t, h, generator=gen) * 2).to(BF16).to(dev)
    r = torch.randn(t, h, generator=gen).to(BF16).to(dev)
    g = torch.randn(t * K, h, generator=gen).to(BF16).to(dev)
    w = torch.rand(t, K, generator=gen).softmax(-1).to(dev)
    nw = (1 + 0.1 * torch.randn(h, generator=gen)).to(BF16).to(dev)
    return x, r, g, w, nw


def check(quant, q, qs, normalized):
    want_q, want_s = reference(normalized, quant)
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


@needs_fp8
@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("form", range(len(FORMS)))
@pytest.mark.parametrize("t,h", [(1, 256), (7, 2048), (33, 7168)])
def test_norm_residual_norm(dev, form, t, h):
    quant = FORMS[form]
    x, r, _, _, nw = inputs(t, h, dev, 1000 * form + t)
    want_h, want_n = beammoe.beam_norm_residual_norm(x, r, nw, 1e-6, nw, 1e-5, (0.75, 1.25))
    keep = (t + form) % 2 == 0
    hid, n, q, qs = beammoe.beam_norm_residual_norm_fp8(x, r, nw, 1e-6, nw, 1e-5, (0.75, 1.25), quant=quant,
                                                         keep_normalized=keep)
    assert torch.equal(hid, want_h)
    assert (n is None) != keep and (n is None or torch.equal(n, want_n))
    check(quant, q, qs, want_n)


@needs_fp8
@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("strategy", ["fused", "unfused"])
@pytest.mark.parametrize("form", range(len(FORMS)))
def test_fused(dev, strategy, form):
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
    check(quant, q, qs, want_n)


def test_without_float8_dtype_or_with():
    """The values' dtype: float8_e4m3fn where torch has it, else uint8 bits."""
    x, r, _, _, nw = inputs(2, 256, "cpu", 3)
    _, _, q, _ = beammoe.beam_norm_residual_norm_fp8(x, r, None, None, nw, 1e-6, None,
                                                     quant=beammoe.FP8Quant("token"))
    assert q.dtype == (FP8 if FP8 is not None else torch.uint8)


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


def test_bad_calls():
    x, r, _, _, nw = inputs(2, 256, "cpu", 5)
    with pytest.raises(TypeError, match=r"quant must be a beammoe.FP8Quant or beammoe.NVFP4Quant, got dict"):
        beammoe.beam_norm_residual_norm_fp8(x, r, None, None, nw, 1e-6, None, quant={"kind": "group"})
    with pytest.raises(ValueError, match=r"next_eps must be given"):
        beammoe.beam_norm_residual_norm_fp8(x, r, None, None, None, None, None, quant=beammoe.FP8Quant())


@needs_fp8
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch._scaled_mm needs a CUDA device")
def test_scaled_mm():
    """The next layer's FP8 GEMM on the quantized output equals the GEMM on
    the eager quantization of normalized (per-token scales, row-wise)."""
    t, h, n_out = 32, 2048, 256
    x, r, _, _, nw = inputs(t, h, "cuda", 11)
    hid, n, q, qs = beammoe.beam_norm_residual_norm_fp8(x, r, None, None, nw, 1e-6, None,
                                                        quant=beammoe.FP8Quant("token"), keep_normalized=True)
    want_q, want_s = reference(n, beammoe.FP8Quant("token"))
    wgt = torch.randn(n_out, h, device="cuda").to(FP8)
    w_s = torch.ones(1, n_out, device="cuda")
    got = torch._scaled_mm(q, wgt.t(), scale_a=qs, scale_b=w_s, out_dtype=BF16)
    want = torch._scaled_mm(want_q, wgt.t(), scale_a=want_s.reshape(-1, 1), scale_b=w_s, out_dtype=BF16)
    assert torch.equal(got, want)


needs_ops = pytest.mark.skipif(not beammoe.HAVE_TORCH_OPS or FP8 is None,
                               reason="torch %s: no torch.library.custom_op or no float8" % torch.__version__)


@needs_ops
@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("form", [0, 3, 5, 6])
def test_compiled(dev, form):
    """torch.compile(fullgraph=True) through torch.ops.beammoe.*_fp8: the
    eager call's bits, shapes and strides."""
    x, r, g, w, nw = inputs(6, 512, dev, 40 + form)
    for ga, wa in compiled_and_eager(x, r, g, w, nw, FORMS[form], keep_nrn=False):
        assert ga[1] is None or torch.equal(ga[1], wa[1])
        assert torch.equal(ga[0], wa[0])
        assert torch.equal(ga[2].view(torch.uint8), wa[2].view(torch.uint8))
        assert torch.equal(ga[3], wa[3]) and ga[3].stride() == wa[3].stride()


@needs_ops
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
