"""Shared fixtures: the package and torch must import (run-pytest.sh skips
the whole suite, exit 77, when they do not)."""
import os
import sys

import pytest

# reference.py and the workers beside this file; the package from this tree
# only when none is importable (run-pytest.sh sets PYTHONPATH=python; an
# installed package, e.g. `pip install ./python`, is tested as installed).
_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _here)
try:
    import beammoe  # noqa: F401
except ImportError:
    sys.path.insert(1, os.path.dirname(_here))

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

torch = pytest.importorskip("torch")


@pytest.fixture
def gen():
    """A seeded generator: every test draws reproducible data."""
    g = torch.Generator()
    g.manual_seed(int(os.environ.get("BEAM_TEST_SEED", "20261130")))
    return g


def cuda_backend_skip_reason():
    """None when torch sees a GPU and libbeammoe's CUDA backend runs here,
    else why not (shown in pytest's skip reasons: run with -rs)."""
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    import beammoe
    from beammoe import _lib
    try:
        _lib.backend_ops("cuda")
    except beammoe.BeamError as e:
        return "libbeammoe's CUDA backend does not run here: %s" % e
    return None


def compiled_and_eager(x, r, g, w, nw, quant, keep_nrn):
    """[(compiled, eager)] results of norm_residual_norm_fp8 (keep_normalized=
    keep_nrn) and moe_finalize_norm_residual_norm_fp8 with a next norm, under
    torch.compile(fullgraph=True) (through torch.ops.beammoe.*_fp8) and eager."""
    import beammoe

    def both(x, r, g, w):
        a = beammoe.beam_norm_residual_norm_fp8(x, r, nw, 1e-6, nw, 1e-6, None, quant=quant,
                                                keep_normalized=keep_nrn)
        b = beammoe.beam_moe_finalize_norm_residual_norm_fp8(beammoe.MoEOutput(g, w), r, nw, 1e-6, nw, 1e-6,
                                                             (0.5, 2.0), 2.5, quant=quant, keep_normalized=True)
        return a, b

    torch._dynamo.reset()
    got = torch.compile(both, fullgraph=True)(x, r, g, w)
    return list(zip(got, both(x, r, g, w)))
