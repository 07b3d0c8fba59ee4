"""Cases where the reference's behaviour was not matched before, one test
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
from reference import BF16, assert_bits_equal, finalize_ref, fused_spec, layer, random_bf16, random_case

H, K = 512, 4
_here = os.path.dirname(os.path.abspath(__file__))


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
    for a, b in zip(got, want):
        assert_bits_equal(a, b)


# ---- routing weights with more rows ------------------------------------------------

def test_finalize_weights_with_more_rows(gen):
    """beam_moe_finalize(zeros(8,4,512), rand(12,4), empty(6,512)): the live
    rows of both are read."""
    out = beammoe.beam_moe_finalize(torch.zeros(8, 4, 512, dtype=BF16), torch.rand(12, 4),
                                    torch.empty(6, 512, dtype=BF16))
    assert torch.equal(out, torch.zeros(6, 512, dtype=BF16))
    g, w = random_case(gen, 8, K, H)
    wide = torch.cat([w, torch.full((4, K), float("nan"))])  # rows past the outputs: never read
    for outputs in (g, g.view(8, K, H)):
        got = beammoe.beam_moe_finalize(outputs, wide, torch.empty(6, H, dtype=BF16), 1.5)
        assert_bits_equal(got, finalize_ref(g, w, 6, 1.5))
    # fewer weight rows than expert rows: the live ones still suffice
    got = beammoe.beam_moe_finalize(g, w[:6].contiguous(), torch.empty(6, H, dtype=BF16))
    assert_bits_equal(got, finalize_ref(g, w, 6))
    with pytest.raises(ValueError, match=r"^beam_moe_finalize: expert_outputs holds 8 tokens and expert_weights 5; "
                                         r"both must hold at least live_tokens=6"):
        beammoe.beam_moe_finalize(g, w[:5].contiguous(), torch.empty(6, H, dtype=BF16))


def test_fused_weights_with_more_rows(gen):
    g, w = random_case(gen, 6, K, H)
    wide = torch.cat([w, torch.full((6, K), float("nan"))])
    residual = random_bf16(gen, 6, H)
    want = fused_spec(g, w, 6, residual, None, None, None, 1e-6, None)
    h, n = beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, wide), residual, None, None, None, 1e-6,
                                                        None)
    assert_bits_equal(h, want[0])
    assert_bits_equal(n, want[1])
    with pytest.raises(ValueError, match=r"x.gemm2_permuted holds 6 tokens and x.expert_weights 12; both must hold "
                                         r"at least residual.shape\[0\]=7"):
        beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, wide), random_bf16(gen, 7, H), None, None,
                                                     None, None, None)


# ---- nn.Parameter norm weights outside no_grad ----------------------------------------

def test_parameter_norm_weights_outside_no_grad(gen):
    """The forward runs with the same bits; a backward through a result is
    refused with a clear message."""
    g, w, residual, pw, nw = layer(gen, 5, K, H, scale=1.0, specials=False)
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
        assert_bits_equal(h.detach(), want_h)
        assert_bits_equal(n.detach(), want_n)
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


def test_a_leaf_that_requires_grad_is_still_not_written(gen):
    g, w = random_case(gen, 2, K, H)
    out = torch.zeros(2, H, dtype=BF16, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"leaf Variable that requires grad"):
        beammoe.beam_moe_finalize(g, w, out, 1.0, torch.nn.Parameter(random_bf16(gen, H)), 1e-6)
    assert not out.detach().any()


# ---- live_tokens -------------------------------------------------------------------

def test_live_tokens_of_the_producer_is_not_read(gen):
    """The token count is residual.shape[0], whatever x.live_tokens says."""
    g, w = random_case(gen, 8, K, H)
    residual = random_bf16(gen, 6, H)
    want_h, want_n = beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), residual, None, 1e-6,
                                                                  None, 1e-6, (0.5, 2.0))
    for live in (3, 8, 100, None):
        h, n = beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w, live), residual, None, 1e-6,
                                                            None, 1e-6, (0.5, 2.0))
        assert h.shape == (6, H)
        assert_bits_equal(h, want_h)
        assert_bits_equal(n, want_n)


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
    g, w = random_case(torch.Generator().manual_seed(1), 2, K, H)
    with pytest.raises(TypeError, match=r"routed_scale must be a float, got bool"):
        beammoe.beam_moe_finalize(g, w, torch.empty(2, H, dtype=BF16), t)
    # NumPy integers stay integers
    with beammoe.CpuGroup(np.int64(1)) as grp, beammoe.Workspace.cpu(grp, np.int32(0), np.int64(8), 256) as ws:
        assert ws.max_tokens == 8 and type(ws.max_tokens) is int
