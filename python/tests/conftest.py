"""Shared fixtures: the package and torch must import (run-pytest.sh skips
the whole suite, exit 77, when they do not)."""
import os
import sys

import pytest

# The package from this tree when it is not installed (run-pytest.sh sets
# PYTHONPATH=python too).
_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_here))
sys.path.insert(0, _here)

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
        _lib.set_backend("cuda")
    except beammoe.BeamError as e:
        return "libbeammoe's CUDA backend does not run here: %s" % e
    return None
