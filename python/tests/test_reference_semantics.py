"""The reference's semantics, tested the way code written against the
reference uses the functions: hidden is a new tensor and residual is left
as it was (a second call, fused against unfused, a residual that is a view
of a larger buffer all see the same residual); tokens = 0 gives empty
tensors; inplace=True is the explicit opt-in, with autograd's rules for
in-place writes. Runs with every torch the package supports (1.13 too).
Then cases where the reference's behaviour was not matched before, one test
each: torch.jit.trace, routing weights with more rows than the expert
outputs, norm weights that are nn.Parameters outside no_grad, a producer's
live_tokens, `import beammoe` without torch, the wheel's tag, and NumPy's
bool_ where an int is expected."""
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

import pytest
import torch

import beammoe
from beammoe import _lib
from reference import BF16, assert_bits_equal, bits, finalize_ref, fused_spec, nrn_spec, random_bf16, random_case
from reference import layer as layer_data

T, K, H = 6, 8, 512
_here = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def layer(gen):
    g, w, residual, pw, nw = layer_data(gen, T, K, H, scale=3.0)
    return beammoe.MoEOutput(g, w), residual, pw, nw


def fused(x, residual, pw, nw, **kw):
    return beammoe.beam_moe_finalize_norm_residual_norm(x, residual, pw, 1e-6, nw, 1e-6, (0.5, 2.0), 2.5, **kw)


def test_residual_unchanged_and_hidden_new(layer):
    """Then a second call on the same residual: the same bits."""
    x, residual, pw, nw = layer
    before = residual.clone()
    version = residual._version
    hidden, normalized = fused(x, residual, pw, nw)
    assert hidden is not residual and hidden.data_ptr() != residual.data_ptr()
    assert hidden.shape == residual.shape and hidden.dtype == BF16
    assert torch.equal(bits(residual), bits(before)), "residual was written"
    assert residual._version == version
    sh, sn = fused_spec(x.gemm2_permuted, x.expert_weights, T, before, pw, 1e-6, nw, 1e-6, (0.5, 2.0), 2.5)
    assert_bits_equal((hidden, normalized), (sh, sn))
    assert_bits_equal(fused(x, residual, pw, nw), (hidden, normalized), "second call")


def test_fused_and_unfused_equal_bits(layer):
    x, residual, pw, nw = layer
    hf, nf = fused(x, residual, pw, nw, strategy="fused")
    hu, nu = fused(x, residual, pw, nw, strategy="unfused")
    ha, na = fused(x, residual, pw, nw)
    for h, n, what in ((hu, nu, "unfused"), (ha, na, "auto")):
        assert_bits_equal((h, n), (hf, nf), what)
    # the reference's unfused path written out: finalize (with the post norm),
    # then beam_norm_residual_norm(x, residual, pre_weight, pre_eps, next_weight, next_eps, scales)
    f = beammoe.beam_moe_finalize(x.gemm2_permuted, x.expert_weights, torch.empty(T, H, dtype=BF16), 2.5, pw, 1e-6)
    h, n = beammoe.beam_norm_residual_norm(f, residual, None, None, nw, 1e-6, (0.5, 2.0))
    assert_bits_equal((h, n), (hf, nf), "finalize + norm_residual_norm")


def test_residual_view_of_a_larger_buffer(layer):
    x, residual, pw, nw = layer
    buf = torch.full((T + 4, H), 7.0, dtype=BF16)
    buf[2:2 + T] = residual
    before = buf.clone()
    view = buf[2:2 + T]
    h, n = fused(x, view, pw, nw)
    assert torch.equal(bits(buf), bits(before)), "the buffer under the residual view was written"
    want_h, want_n = fused(x, residual, pw, nw)
    assert_bits_equal((h, n), (want_h, want_n))
    # in place writes exactly the view's rows
    h2, _ = fused(x, view, pw, nw, inplace=True)
    assert h2 is view
    assert_bits_equal(buf[2:2 + T], want_h, "rows of the view")
    assert torch.equal(bits(buf[:2]), bits(before[:2])) and torch.equal(bits(buf[2 + T:]), bits(before[2 + T:]))


@pytest.mark.parametrize("next_norm", [True, False])
def test_tokens_zero_gives_empty_tensors(gen, next_norm):
    g, w = random_case(gen, 3, K, H)
    residual = torch.empty(0, H, dtype=BF16)
    nw = random_bf16(gen, H) if next_norm else None
    ne = 1e-6 if next_norm else None
    for strategy in (None, "fused", "unfused"):
        h, n = beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), residual, None, None, nw, ne,
                                                            None, strategy=strategy)
        assert h.shape == (0, H) and h.dtype == BF16 and h is not residual
        if next_norm:
            assert n.shape == (0, H) and n.dtype == BF16
        else:
            assert n is None
    h, n = beammoe.beam_norm_residual_norm(residual, residual, None, None, nw, ne, None)
    assert h.shape == (0, H) and (n is None) != next_norm
    out = beammoe.beam_moe_finalize(g, w, torch.empty(0, H, dtype=BF16))
    assert out.shape == (0, H)


def test_norm_residual_norm_new_hidden(gen):
    x, residual = random_bf16(gen, T, H, scale=2.0), random_bf16(gen, T, H)
    prw, nw = random_bf16(gen, H), random_bf16(gen, H)
    before = residual.clone()
    h, n = beammoe.beam_norm_residual_norm(x, residual, prw, 1e-6, nw, 1e-5, (1.5, 0.5))
    assert h is not residual
    assert torch.equal(bits(residual), bits(before))
    sh, sn = nrn_spec(x, before, prw, 1e-6, (1.5, 0.5), nw, 1e-5)
    assert_bits_equal((h, n), (sh, sn))


def test_gather_leaves_residual(gen):
    """The gather returns a new hidden too (one rank, in this thread)."""
    g, w = random_case(gen, T, K, H)
    residual = random_bf16(gen, T, H)
    before = residual.clone()
    want_h, want_n = beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), residual, None, 1e-6,
                                                                  None, 1e-6, None)
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 16, H) as ws:
        h, n = beammoe.beam_moe_finalize_gather_norm_residual_norm(beammoe.MoEOutput(g, w), residual, None, 1e-6,
                                                                   None, 1e-6, None, ws)
        assert h is not residual and torch.equal(bits(residual), bits(before))
        assert_bits_equal((h, n), (want_h, want_n))
        v = residual._version
        h2, n2 = beammoe.beam_moe_finalize_gather_norm_residual_norm(beammoe.MoEOutput(g, w), residual, None,
                                                                     1e-6, None, 1e-6, None, ws, inplace=True)
        assert h2 is residual and residual._version > v
        assert_bits_equal(residual, want_h)


# ---- inplace=True: the explicit opt-in ------------------------------------------

def test_inplace_updates_residual_and_its_version(layer):
    x, residual, pw, nw = layer
    want_h, want_n = fused(x, residual, pw, nw)
    v = residual._version
    h, n = fused(x, residual, pw, nw, inplace=True)
    assert h is residual
    assert residual._version > v, "an in-place write must bump the version counter"
    assert_bits_equal(residual, want_h)
    assert_bits_equal(n, want_n)


def test_inplace_under_inference_mode(layer):
    x, residual, pw, nw = layer
    want_h, _ = fused(x, residual, pw, nw)
    with torch.inference_mode():
        r = residual.clone()
        h, _ = fused(x, r, pw, nw, inplace=True)
    assert h is r
    assert_bits_equal(r, want_h)


def test_inplace_refuses_a_leaf_that_requires_grad(layer):
    x, residual, pw, nw = layer
    leaf = residual.clone().requires_grad_()
    before = residual.clone()
    with pytest.raises(RuntimeError, match=r"leaf Variable that requires grad"):
        fused(x, leaf, pw, nw, inplace=True)
    assert torch.equal(bits(leaf.detach()), bits(before))
    with pytest.raises(RuntimeError, match=r"leaf Variable that requires grad"):
        beammoe.beam_norm_residual_norm(before, leaf, None, None, None, None, None, inplace=True)
    out = torch.zeros(T, H, dtype=BF16, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"beam_moe_finalize: output would be written in place"):
        beammoe.beam_moe_finalize(x.gemm2_permuted, x.expert_weights, out)
    # with a post weight that is an nn.Parameter too; nothing written
    with pytest.raises(RuntimeError, match=r"leaf Variable that requires grad"):
        beammoe.beam_moe_finalize(x.gemm2_permuted, x.expert_weights, out, 1.0, torch.nn.Parameter(pw.clone()), 1e-6)
    assert not out.detach().any()
    # under no_grad the write is an ordinary in-place update
    with torch.no_grad():
        v = leaf._version
        h, _ = fused(x, leaf, pw, nw, inplace=True)
        assert h is leaf and leaf._version > v


def test_inplace_with_inputs_that_require_grad(layer):
    """A norm weight that requires grad (a model's nn.Parameter) outside
    no_grad: the in-place forward runs with the same bits; the written
    residual then carries a backward function that refuses."""
    x, residual, pw, nw = layer
    want_h, want_n = fused(x, residual, pw, nw)
    pwg = torch.nn.Parameter(pw.clone())
    r = residual.clone()
    v = r._version
    h, n = fused(x, r, pwg, nw, inplace=True)
    assert h is r and r._version > v
    assert_bits_equal(r.detach(), want_h)
    assert_bits_equal(n.detach(), want_n)
    assert r.requires_grad and r.grad_fn is not None
    with pytest.raises(RuntimeError, match=r"no derivative"):
        r.float().sum().backward()


def test_backward_is_refused(layer):
    """New results of inputs that require grad: the forward runs and gives the
    same bits; a backward pass through them is an error, never a silent
    wrong gradient."""
    x, residual, pw, nw = layer
    want_h, want_n = fused(x, residual, pw, nw)
    r = residual.clone().requires_grad_()
    h, n = fused(x, r, pw, nw)
    assert h.requires_grad and n.requires_grad
    assert_bits_equal((h.detach(), n.detach()), (want_h, want_n))
    with pytest.raises(RuntimeError, match=r"no derivative"):
        (h.float().sum() + n.float().sum()).backward()
    h2, _ = beammoe.beam_norm_residual_norm(residual, r, None, None, None, None, None)
    with pytest.raises(RuntimeError, match=r"no derivative"):
        h2.float().sum().backward()


def test_signed_zero_scales_not_confused(gen):
    """(1, +0) and (1, -0) give different bits (x + +0 vs x + -0 for x = -0):
    each call gets its own scales."""
    x = torch.full((2, H), -0.0, dtype=BF16)
    residual = torch.ones(2, H, dtype=BF16)
    hp, _ = beammoe.beam_norm_residual_norm(x, residual, None, None, None, None, (1.0, 0.0))
    hm, _ = beammoe.beam_norm_residual_norm(x, residual, None, None, None, None, (1.0, -0.0))
    hp2, _ = beammoe.beam_norm_residual_norm(x, residual, None, None, None, None, (1.0, 0.0))
    assert int(bits(hp)[0, 0]) == 0x0000 and int(bits(hm)[0, 0]) & 0xFFFF == 0x8000
    assert torch.equal(bits(hp), bits(hp2))


# ---- torch.jit.trace ------------------------------------------------------------

def _traced_fn(g, w, r):
    return beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), r, None, 1e-6, None, 1e-6, None)


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_jit_trace_records_the_call(gen):
    """The trace holds the operator (and runs it on new inputs), or, without
    the torch operators, tracing is refused: never a trace that returns
    uninitialized tensors."""
    g, w = random_case(gen, 4, 8, H)
    r = random_bf16(gen, 4, H)
    if not beammoe.HAVE_TORCH_OPS:
        with pytest.raises(RuntimeError, match=r"torch.jit.trace cannot record a beammoe call"):
            torch.jit.trace(_traced_fn, (g, w, r), check_trace=False)
        return
    tr = torch.jit.trace(_traced_fn, (g, w, r), check_trace=False)
    kinds = [n.kind() for n in tr.graph.nodes()]
    assert "beammoe::moe_finalize_norm_residual_norm" in kinds, kinds
    g2, w2 = random_case(gen, 4, 8, H)
    r2 = random_bf16(gen, 4, H)
    got = tr(g2, w2, r2)
    want = _traced_fn(g2, w2, r2)
    assert_bits_equal(got, want)


# ---- routing weights with more rows ------------------------------------------------

def test_finalize_weights_with_more_rows(gen):
    """beam_moe_finalize(zeros(8,4,512), rand(12,4), empty(6,512)): the live
    rows of both are read."""
    out = beammoe.beam_moe_finalize(torch.zeros(8, 4, 512, dtype=BF16), torch.rand(12, 4),
                                    torch.empty(6, 512, dtype=BF16))
    assert torch.equal(out, torch.zeros(6, 512, dtype=BF16))
    g, w = random_case(gen, 8, 4, H)
    wide = torch.cat([w, torch.full((4, 4), float("nan"))])  # rows past the outputs: never read
    for outputs in (g, g.view(8, 4, H)):
        got = beammoe.beam_moe_finalize(outputs, wide, torch.empty(6, H, dtype=BF16), 1.5)
        assert_bits_equal(got, finalize_ref(g, w, 6, 1.5))
    # fewer weight rows than expert rows: the live ones still suffice
    got = beammoe.beam_moe_finalize(g, w[:6].contiguous(), torch.empty(6, H, dtype=BF16))
    assert_bits_equal(got, finalize_ref(g, w, 6))
    with pytest.raises(ValueError, match=r"^beam_moe_finalize: expert_outputs holds 8 tokens and expert_weights 5; "
                                         r"both must hold at least live_tokens=6"):
        beammoe.beam_moe_finalize(g, w[:5].contiguous(), torch.empty(6, H, dtype=BF16))


def test_fused_weights_with_more_rows(gen):
    g, w = random_case(gen, 6, 4, H)
    wide = torch.cat([w, torch.full((6, 4), float("nan"))])
    residual = random_bf16(gen, 6, H)
    want = fused_spec(g, w, 6, residual, None, None, None, 1e-6, None)
    h, n = beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, wide), residual, None, None, None, 1e-6,
                                                        None)
    assert_bits_equal((h, n), (want[0], want[1]))
    with pytest.raises(ValueError, match=r"x.gemm2_permuted holds 6 tokens and x.expert_weights 12; both must hold "
                                         r"at least residual.shape\[0\]=7"):
        beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, wide), random_bf16(gen, 7, H), None, None,
                                                     None, None, None)


# ---- nn.Parameter norm weights outside no_grad ----------------------------------------

def test_parameter_norm_weights_outside_no_grad(gen):
    """The forward runs with the same bits; a backward through a result is
    refused with a clear message."""
    g, w, residual, pw, nw = layer_data(gen, 5, 4, H, scale=1.0, specials=False)
    ppw, pnw = torch.nn.Parameter(pw.clone()), torch.nn.Parameter(nw.clone())
    assert torch.is_grad_enabled()

    want = beammoe.beam_moe_finalize(g, w, torch.empty(5, H, dtype=BF16), 2.0, pw, 1e-6)
    out = beammoe.beam_moe_finalize(g, w, torch.empty(5, H, dtype=BF16), 2.0, ppw, 1e-6)
    assert_bits_equal(out.detach(), want)
    with pytest.raises(RuntimeError, match=r"beam_moe_finalize: beammoe operations have no derivative"):
        out.float().sum().backward()

    want_h, want_n = beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), residual, pw, 1e-6, nw,
                                                                  1e-6, None)
    for inplace in (False, True):
        r = residual.clone()
        h, n = beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), r, ppw, 1e-6, pnw, 1e-6, None,
                                                            inplace=inplace)
        assert (h is r) == inplace
        assert_bits_equal((h.detach(), n.detach()), (want_h, want_n))
        with pytest.raises(RuntimeError, match=r"no derivative"):
            (h.float().sum() + n.float().sum()).backward()

    h, n = beammoe.beam_norm_residual_norm(residual, residual.clone(), ppw, 1e-6, pnw, 1e-6, None, inplace=True)
    with pytest.raises(RuntimeError, match=r"no derivative"):
        h.float().sum().backward()

    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 8, H) as ws:
        for inplace in (False, True):
            h, n = beammoe.beam_moe_finalize_gather_norm_residual_norm(
                beammoe.MoEOutput(g, w), residual.clone(), ppw, 1e-6, pnw, 1e-6, None, ws, inplace=inplace)
            assert_bits_equal(h.detach(), want_h)
            with pytest.raises(RuntimeError, match=r"no derivative"):
                h.float().sum().backward()


# ---- live_tokens -------------------------------------------------------------------

def test_live_tokens_of_the_producer_is_not_read(gen):
    """The token count is residual.shape[0], whatever x.live_tokens says."""
    g, w = random_case(gen, 8, 4, H)
    residual = random_bf16(gen, 6, H)
    want_h, want_n = beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), residual, None, 1e-6,
                                                                  None, 1e-6, (0.5, 2.0))
    for live in (3, 8, 100, None):
        h, n = beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w, live), residual, None, 1e-6,
                                                            None, 1e-6, (0.5, 2.0))
        assert h.shape == (6, H)
        assert_bits_equal((h, n), (want_h, want_n))


# ---- import without torch ------------------------------------------------------------

def test_import_without_torch_says_what_to_install():
    code = r"""
import sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("No module named %r" % name, name=name)
for m in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
    del sys.modules[m]
sys.meta_path.insert(0, Hide())
try:
    import beammoe
except ImportError as e:
    print("MESSAGE:", e)
    print("CAUSE:", type(e.__cause__).__name__, e.__cause__)
else:
    print("imported")
"""
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(beammoe.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = pkg + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "MESSAGE: beammoe needs PyTorch (pip install torch" in out.stdout, out.stdout
    assert "CAUSE: ModuleNotFoundError No module named 'torch'" in out.stdout, out.stdout


# ---- the wheel's tag ---------------------------------------------------------------------

def _have_bdist_wheel():
    try:
        import setuptools.command.bdist_wheel  # noqa: F401  (setuptools >= 70.1)
        return True
    except ImportError:
        pass
    try:
        import wheel.bdist_wheel  # noqa: F401
        return True
    except ImportError:
        return False


_SETUP = os.path.join(os.path.dirname(_here), "setup.py")


@pytest.mark.skipif(not os.path.exists(_SETUP), reason="python/setup.py is not beside the tests")
@pytest.mark.skipif(not _have_bdist_wheel(), reason="neither setuptools >= 70.1 nor `wheel` is installed")
def test_wheel_is_tagged_py3_none_platform():
    """The wheel carries native libraries but no extension module:
    py3-none-<platform>, not cpXY-cpXY-<platform>. Built from a copy of
    python/ with stand-in libraries (nothing is written into the tree);
    the list of quantized forms travels in it, as beammoe/_libs/quant_forms.def."""
    src = os.path.dirname(_SETUP)
    with tempfile.TemporaryDirectory() as d:
        pkg = os.path.join(d, "pkg")
        os.makedirs(pkg)
        for name in ("setup.py", "pyproject.toml", "README.md"):
            shutil.copy(os.path.join(src, name), pkg)
        shutil.copytree(os.path.join(src, "beammoe"), os.path.join(pkg, "beammoe"),
                        ignore=shutil.ignore_patterns("__pycache__", "_libs"))
        os.makedirs(os.path.join(d, "lib"))  # the copy's source tree: pkg/../lib
        shutil.copy(os.path.join(os.path.dirname(src), "lib", "quant_forms.def"), os.path.join(d, "lib"))
        build = os.path.join(d, "build", ".libs")
        os.makedirs(build)
        for name in ("libbeammoe" + _lib.SO_SUFFIX, "libbeammoe_cpu" + _lib.SO_SUFFIX):
            with open(os.path.join(build, name), "wb") as f:
                f.write(b"\x7fELF stand-in")
        env = dict(os.environ, BEAMMOE_BUILD_DIR=os.path.dirname(build))
        out = subprocess.run([sys.executable, "setup.py", "-q", "bdist_wheel", "-d", os.path.join(d, "dist")],
                             cwd=pkg, capture_output=True, text=True, timeout=300, env=env)
        assert out.returncode == 0, out.stdout + out.stderr
        wheels = [os.path.basename(p) for p in glob.glob(os.path.join(d, "dist", "*.whl"))]
        assert len(wheels) == 1, wheels
        parts = wheels[0][:-4].split("-")
        assert parts[2:4] == ["py3", "none"], wheels[0]
        assert parts[4] != "any", wheels[0]
        with zipfile.ZipFile(os.path.join(d, "dist", wheels[0])) as z:
            assert "beammoe/_libs/quant_forms.def" in z.namelist(), z.namelist()


# ---- NumPy's bool_ ----------------------------------------------------------------------

def test_numpy_bool_is_not_an_int():
    """NumPy < 2 hands np.bool_(True) to operator.index as 1."""
    np = pytest.importorskip("numpy")
    t = np.bool_(True)
    with pytest.raises(TypeError, match=r"^beammoe.CpuGroup: nranks must be an int, got bool"):
        beammoe.CpuGroup(t)
    with beammoe.CpuGroup(1) as grp:
        with pytest.raises(TypeError, match=r"^beammoe.Workspace.cpu: rank must be an int, got bool"):
            beammoe.Workspace.cpu(grp, np.bool_(False), 8, 256)
        with pytest.raises(TypeError, match=r"^beammoe.Workspace.cpu: timeout_ms must be an int, got bool"):
            beammoe.Workspace.cpu(grp, 0, 8, 256, timeout_ms=t)
        with pytest.raises(TypeError, match=r"^beammoe.Workspace.cpu: max_tokens must be an int, got bool"):
            beammoe.Workspace.cpu(grp, 0, t, 256)
        with beammoe.Workspace.cpu(grp, 0, 8, 256) as ws:
            with pytest.raises(TypeError, match=r"moe_gather_oneshot_max_tokens must be an int, got bool"):
                ws.moe_gather_oneshot_max_tokens = t
            with pytest.raises(TypeError, match=r"tokens must be an int, got bool"):
                ws.strategy_for(t)
    g, w = random_case(torch.Generator().manual_seed(1), 2, 4, H)
    with pytest.raises(TypeError, match=r"routed_scale must be a float, got bool"):
        beammoe.beam_moe_finalize(g, w, torch.empty(2, H, dtype=BF16), t)
    # NumPy integers stay integers
    with beammoe.CpuGroup(np.int64(1)) as grp, beammoe.Workspace.cpu(grp, np.int32(0), np.int64(8), 256) as ws:
        assert ws.max_tokens == 8 and type(ws.max_tokens) is int
