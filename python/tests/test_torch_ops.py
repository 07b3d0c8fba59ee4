"""The operations as torch operators (torch.ops.beammoe.*, torch >= 2.4):
torch.library's own checks of each operator (schema and mutation
annotations, fake implementation, autograd registration, AOT dispatch),
torch.compile(fullgraph=True) of a module that calls the beammoe functions
(no graph break, the same bits as eager), meta tensors. On a GPU host the
same on CUDA tensors, and CUDA graph capture and replay."""
import pytest
import torch

import beammoe
from conftest import DEVICES, needs_cuda
from reference import BF16, assert_bits_equal, layer, random_bf16, random_case

pytestmark = pytest.mark.skipif(
    not beammoe.HAVE_TORCH_OPS,
    reason="torch %s has no torch.library.custom_op (torch >= 2.4 registers torch.ops.beammoe.*)"
    % torch.__version__)

T, K, H = 9, 8, 512


@pytest.fixture
def data(gen):
    return layer(gen, T, K, H, capacity=T + 2, scale=3.0)


def test_operators_exist():
    ops = torch.ops.beammoe
    for name in ("moe_finalize", "moe_finalize_norm_residual_norm", "moe_finalize_norm_residual_norm_",
                 "norm_residual_norm", "norm_residual_norm_", "moe_finalize_gather_norm_residual_norm",
                 "moe_finalize_gather_norm_residual_norm_"):
        op = getattr(ops, name).default
        mutable = [a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        want = {"moe_finalize": ["output"]}.get(name, ["residual"] if name.endswith("_") else [])
        assert mutable == want, (name, mutable)


def _opcheck_cases(g, w, residual, pw, nw):
    ops = torch.ops.beammoe
    gl = g[: T * K]  # capacity == live: torch.library's checks compare whole tensors
    wl = w[:T]
    return [
        (ops.moe_finalize.default, (gl, wl, torch.empty(T, H, dtype=BF16, device=g.device), 2.5, pw, 1e-6)),
        (ops.moe_finalize.default, (gl, wl, torch.empty(T, H, dtype=BF16, device=g.device), 1.0, None, None)),
        (ops.moe_finalize_norm_residual_norm.default, (gl, wl, residual, pw, 1e-6, nw, 1e-5, [0.5, 2.0], 2.5, 0)),
        (ops.moe_finalize_norm_residual_norm.default, (gl, wl, residual, None, None, None, None, None, 1.0, 2)),
        (ops.moe_finalize_norm_residual_norm_.default, (gl, wl, residual.clone(), pw, 1e-6, nw, 1e-5, None, 2.5, 1)),
        (ops.norm_residual_norm.default, (residual, residual.flip(0).contiguous(), pw, 1e-6, nw, 1e-6, [1.5, 0.5])),
        (ops.norm_residual_norm_.default, (residual, residual.clone(), None, None, nw, 1e-6, None)),
    ]


def _to(dev, ts):
    return [t.to(dev) for t in ts]


@pytest.fixture
def finite(gen):
    """Data without NaN: torch.library.opcheck compares results with
    assert_close, for which NaN != NaN."""
    return layer(gen, T, K, H, scale=3.0, specials=False)


@pytest.mark.parametrize("dev", DEVICES)
def test_opcheck(finite, dev):
    """torch.library.opcheck: schema (mutations as annotated, no aliasing),
    fake tensors, autograd registration, AOT dispatch with dynamic shapes."""
    for op, args in _opcheck_cases(*_to(dev, finite)):
        torch.library.opcheck(op, args)


def test_opcheck_gather(finite):
    g, w, residual, pw, nw = finite
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 32, H) as ws:
        ops = torch.ops.beammoe
        gl, wl = g[: T * K], w[:T]
        torch.library.opcheck(ops.moe_finalize_gather_norm_residual_norm.default,
                              (ws.handle, gl, wl, residual, pw, 1e-6, nw, 1e-6, [0.5, 2.0], 2.5, 0))
        torch.library.opcheck(ops.moe_finalize_gather_norm_residual_norm_.default,
                              (ws.handle, gl, wl, residual.clone(), None, None, nw, 1e-6, None, 1.0, 4))


def test_operator_checks_its_arguments(data):
    """Called directly, an operator checks the same rules as the function."""
    g, w, residual, pw, nw = data
    with pytest.raises(ValueError, match=r"residual has shape \(9, 256\) but x.gemm2_permuted has hidden=512"):
        torch.ops.beammoe.moe_finalize_norm_residual_norm(g, w, residual[:, :256].contiguous(), None, None, None,
                                                          None, None, 1.0, 0)
    with pytest.raises(ValueError, match=r"is not an open beammoe.Workspace"):
        torch.ops.beammoe.moe_finalize_gather_norm_residual_norm(12345, g, w, residual, None, None, None, None,
                                                                 None, 1.0, 0)


class Layer(torch.nn.Module):
    """A layer boundary as a model writes it: the fused op, then more torch."""

    def __init__(self, pw, nw, inplace=False, strategy=None):
        super().__init__()
        self.register_buffer("post_w", pw)
        self.register_buffer("next_w", nw)
        self.inplace = inplace
        self.strategy = strategy

    def forward(self, gemm2, weights, residual):
        x = beammoe.MoEOutput(gemm2, weights, residual.shape[0])
        hidden, normalized = beammoe.beam_moe_finalize_norm_residual_norm(
            x, residual, self.post_w, 1e-6, self.next_w, 1e-5, (0.5, 2.0), 2.5, strategy=self.strategy,
            inplace=self.inplace)
        h2, n2 = beammoe.beam_norm_residual_norm(normalized, hidden, self.post_w, 1e-6, self.next_w, 1e-6, None)
        return torch.cat([hidden, normalized]), normalized, h2, n2  # torch ops that keep every bit


def _compiled_equals_eager(module, args, inplace_arg=None):
    import copy

    eager_args = [a.clone() for a in args]
    comp_args = [a.clone() for a in args]
    want = module(*eager_args)
    torch._dynamo.reset()
    got = torch.compile(copy.deepcopy(module), fullgraph=True)(*comp_args)
    assert_bits_equal(got, want, "compiled output")
    assert_bits_equal(comp_args, eager_args, "arguments after the call")


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("strategy", [None, "unfused"])
def test_compile_fullgraph(data, dev, inplace, strategy):
    g, w, residual, pw, nw = _to(dev, data)
    _compiled_equals_eager(Layer(pw, nw, inplace, strategy), (g, w, residual))


def test_compile_dynamic_tokens(gen, data):
    """One compiled graph with dynamic shapes serves several token counts."""
    _, _, _, pw, nw = data
    m = torch.compile(Layer(pw, nw), fullgraph=True, dynamic=True)
    torch._dynamo.reset()
    for tokens in (3, 17, 1):
        g, w = random_case(gen, tokens, K, H)
        r = random_bf16(gen, tokens, H)
        got = m(g, w, r)
        want = Layer(pw, nw)(g, w, r)
        assert_bits_equal(got, want, "tokens=%d" % tokens)


def test_compile_finalize_and_gather(data):
    g, w, residual, pw, nw = data

    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 32, H) as ws:
        def f(g, w, residual):
            out = torch.empty(residual.shape, dtype=BF16)
            beammoe.beam_moe_finalize(g, w, out, 2.5, pw, 1e-6)
            h, n = beammoe.beam_moe_finalize_gather_norm_residual_norm(
                beammoe.MoEOutput(g, w), residual, pw, 1e-6, nw, 1e-6, None, ws, 2.5)
            return out.clone(), h, n

        want = f(g, w, residual)
        torch._dynamo.reset()
        got = torch.compile(f, fullgraph=True)(g, w, residual)
        assert_bits_equal(got, want)


def test_meta_tensors(data):
    """Meta tensors take the operators' fake implementations: shapes only."""
    g, w, residual, pw, nw = [t.to("meta") for t in data]
    h, n = beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w, T), residual, pw, 1e-6, nw, 1e-6,
                                                        None)
    assert h.device.type == "meta" and h.shape == (T, H) and n.shape == (T, H)
    h, n = beammoe.beam_norm_residual_norm(residual, residual, None, None, None, None, None)
    assert h.shape == (T, H) and n is None
    with pytest.raises(ValueError, match=r"residual has shape"):
        beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), residual[:, :256].contiguous(), None,
                                                     None, None, None, None)


def test_backward_refused_through_operator(data):
    g, w, residual, pw, nw = data
    r = residual.clone().requires_grad_()
    h, n = torch.ops.beammoe.moe_finalize_norm_residual_norm(g, w, r, pw, 1e-6, nw, 1e-6, None, 1.0, 0)
    with pytest.raises(RuntimeError, match=r"beammoe::moe_finalize_norm_residual_norm: .*no derivative"):
        h.float().sum().backward()


# ---- CUDA ---------------------------------------------------------------------

@needs_cuda
@pytest.mark.parametrize("inplace", [False, True])
def test_cuda_graph_capture_and_replay(gen, inplace):
    """The functions called during a CUDA graph capture are recorded; each
    replay on new inputs (copied into the captured buffers) gives the eager
    CPU bits."""
    dev = torch.device("cuda")
    pw, nw = random_bf16(gen, H).to(dev), random_bf16(gen, H).to(dev)
    g0, w0 = random_case(gen, T, K, H)
    sg, sw, sr = g0.to(dev), w0.to(dev), random_bf16(gen, T, H).to(dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up outside the capture (library loading, first calls)
        for _ in range(2):
            beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(sg, sw), sr.clone(), pw, 1e-6, nw, 1e-6,
                                                         (0.5, 2.0), 2.5)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        h, n = beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(sg, sw), sr, pw, 1e-6, nw, 1e-6,
                                                            (0.5, 2.0), 2.5, inplace=inplace)
        f = beammoe.beam_moe_finalize(sg, sw, torch.empty(T, H, dtype=BF16, device=dev), 2.5, pw, 1e-6)
        h2, n2 = beammoe.beam_norm_residual_norm(f, n, None, None, nw, 1e-6, None)
    for step in range(3):
        g, w = random_case(gen, T, K, H, specials=True)
        r = random_bf16(gen, T, H, scale=2.0)
        sg.copy_(g)
        sw.copy_(w)
        sr.copy_(r)
        graph.replay()
        torch.cuda.synchronize()
        pwc, nwc = pw.cpu(), nw.cpu()
        wh, wn = beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), r, pwc, 1e-6, nwc, 1e-6,
                                                              (0.5, 2.0), 2.5)
        wf = beammoe.beam_moe_finalize(g, w, torch.empty(T, H, dtype=BF16), 2.5, pwc, 1e-6)
        wh2, wn2 = beammoe.beam_norm_residual_norm(wf, wn, None, None, nwc, 1e-6, None)
        assert_bits_equal((h, n), (wh, wn), "replay %d" % step)
        assert_bits_equal((h2, n2), (wh2, wn2), "replay %d norm_residual_norm" % step)
        if inplace:
            assert_bits_equal(sr, wh, "replay %d residual updated in place" % step)
        else:
            assert_bits_equal(sr, r, "replay %d residual unchanged" % step)


@needs_cuda
def test_compile_reduce_overhead_cuda(data):
    """torch.compile's CUDA graphs (mode="reduce-overhead") around the operators."""
    g, w, residual, pw, nw = _to("cuda", data)
    m = Layer(pw, nw)
    want = m(g, w, residual)
    torch._dynamo.reset()
    cm = torch.compile(Layer(pw, nw), mode="reduce-overhead", fullgraph=True)
    for _ in range(3):
        got = cm(g, w, residual)
        assert_bits_equal(got, want)


def test_parameters_take_the_short_path(data):
    """A model's norm weights are nn.Parameters: under no_grad the call goes
    straight to the library (no operator dispatch), with the same bits; with
    autograd recording it goes through the operator."""
    from beammoe import _calls

    g, w, residual, pw, nw = data
    want = beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w, T), residual, pw, 1e-6, nw, 1e-6,
                                                        None)
    ppw, pnw = torch.nn.Parameter(pw.clone()), torch.nn.Parameter(nw.clone())
    names = ("g", "w", "residual", "post_weight", "next_weight")
    with torch.no_grad():
        assert _calls.placement("f", names, (g, w, residual, ppw, pnw)) == (torch.device("cpu"), True)
        got = beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w, T), residual, ppw, 1e-6, pnw,
                                                           1e-6, None)
    assert_bits_equal(got, want)
    assert _calls.placement("f", names, (g, w, residual, ppw, pnw)) == (torch.device("cpu"), False)
    got = beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w, T), residual, ppw, 1e-6, pnw, 1e-6,
                                                       None)
    assert got[0].requires_grad
    for a, b in zip(got, want):
        assert_bits_equal(a.detach(), b)
