"""beammoe: the exact MoE finalize, residual and RMSNorm step, over torch tensors.

A pure-Python front end (ctypes) to libbeammoe, the run-time dispatcher that
runs each call on the CPU or CUDA backend according to the tensors' device.
Every result follows docs/numerics.md's one rounding order, so CPU, CUDA, every
strategy and every world size give the same bits.

    beam_moe_finalize(expert_outputs, expert_weights, output, routed_scale=1.0,
                      post_weight=None, post_eps=None) -> output
    beam_moe_finalize_norm_residual_norm(x, residual, post_weight, post_eps,
                      next_weight, next_eps, scales, routed_scale=1.0, *,
                      strategy=None, inplace=False) -> (hidden, normalized | None)
    beam_moe_finalize_gather_norm_residual_norm(x, residual, post_weight, post_eps,
                      next_weight, next_eps, scales, workspace, routed_scale=1.0,
                      *, strategy=None, inplace=False) -> (hidden, normalized | None)
    beam_norm_residual_norm(x, residual, pre_weight, pre_eps, next_weight,
                      next_eps, scales, *, inplace=False) -> (hidden, normalized | None)
    beam_allreduce_norm_residual_norm(x, residual, pre_weight, pre_eps, next_weight,
                      next_eps, scales, workspace, *, strategy=None, inplace=False)
    beam_moe_finalize_allreduce_norm_residual_norm(x, residual, post_weight, post_eps,
                      next_weight, next_eps, scales, workspace, routed_scale=1.0, *,
                      strategy=None, inplace=False)   (the all-reduce layout: every
                      rank's x a partial of every token)

x is an MoEOutput(gemm2_permuted, expert_weights, live_tokens=None). hidden
is a new tensor and residual is left unchanged, as in the reference;
inplace=True writes hidden into residual instead. The _q forms of the
operations with a next norm (beammoe.quant; the C calls' names, the former
*_fp8 names of the first three kept) take quant=FP8Quant(...),
NVFP4Quant(global_scale) or MXFP8Quant() and also return the next norm's
output quantized to FP8, NVFP4 or MXFP8. With torch >= 2.4 the
operations are also torch operators, torch.ops.beammoe.* (torch.compile,
CUDA graphs). Errors: ValueError/TypeError for broken rules (the library's
message where the library checks the rule), BeamError (a RuntimeError with
.status) for the rest.
"""
import importlib as _importlib
import re as _re

try:
    import torch as _torch
except ImportError as _e:  # the original error stays as __cause__
    raise ImportError("beammoe needs PyTorch (pip install torch; on Debian: apt-get install python3-torch), "
                      "which cannot be imported: %s" % _e, name="torch") from _e

# The oldest torch the package supports and tests (Debian 12's python3-torch);
# torch.ops.beammoe.* and torch.compile need torch >= 2.4 (HAVE_TORCH_OPS).
MIN_TORCH = (1, 13)


def _torch_release(v):
    """(major, minor) of a torch version string such as "2.15.0+cu132" or "1.13.0a0"."""
    m = _re.match(r"(\d+)\.(\d+)", v)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


if _torch_release(_torch.__version__) < MIN_TORCH:
    raise ImportError("beammoe needs torch >= %d.%d, found %s" % (MIN_TORCH + (_torch.__version__,)))

from ._errors import (BeamArgumentError, BeamCommError, BeamDeviceError, BeamError, BeamOutOfMemoryError,
                      BeamUnsupportedError)
from ._lib import backend_name, library_path, version
from .quant import (FP8Quant, MXFP8Quant, NVFP4Quant, beam_allreduce_norm_residual_norm_q,
                    beam_moe_finalize_allreduce_norm_residual_norm_q, beam_moe_finalize_gather_norm_residual_norm_q,
                    beam_moe_finalize_norm_residual_norm_q, beam_norm_residual_norm_q)
from .quant import (beam_moe_finalize_gather_norm_residual_norm_fp8, beam_moe_finalize_norm_residual_norm_fp8,
                    beam_norm_residual_norm_fp8)  # the former names of the _q functions
from .ops import (HAVE_TORCH_OPS, MoEOutput, beam_allreduce_norm_residual_norm, beam_moe_finalize,
                  beam_moe_finalize_allreduce_norm_residual_norm, beam_moe_finalize_gather_norm_residual_norm,
                  beam_moe_finalize_norm_residual_norm, beam_norm_residual_norm, norm_residual_norm)
from .workspace import CpuGroup, Workspace
from ._prepared import PreparedCall, prepare_finalize_norm_residual_norm

# The safetensors audit (audit.py: it runs the C tool) is loaded on first use.
_AUDIT = ("AuditReport", "audit_file")


def __getattr__(name):
    # __version__ is the loaded library's beam_version(): the version set once
    # in configure.ac (loading the library on first use, as every call does).
    if name == "__version__":
        return version()
    if name == "audit" or name in _AUDIT:
        audit = _importlib.import_module(__name__ + ".audit")
        return audit if name == "audit" else getattr(audit, name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


__all__ = [
    "MoEOutput",
    "FP8Quant",
    "NVFP4Quant",
    "MXFP8Quant",
    "beam_moe_finalize_norm_residual_norm_q",
    "beam_moe_finalize_gather_norm_residual_norm_q",
    "beam_norm_residual_norm_q",
    "beam_allreduce_norm_residual_norm_q",
    "beam_moe_finalize_allreduce_norm_residual_norm_q",
    "beam_moe_finalize_norm_residual_norm_fp8",
    "beam_moe_finalize_gather_norm_residual_norm_fp8",
    "beam_norm_residual_norm_fp8",
    "beam_moe_finalize",
    "beam_moe_finalize_norm_residual_norm",
    "beam_moe_finalize_gather_norm_residual_norm",
    "beam_allreduce_norm_residual_norm",
    "beam_moe_finalize_allreduce_norm_residual_norm",
    "norm_residual_norm",
    "beam_norm_residual_norm",
    "prepare_finalize_norm_residual_norm",
    "PreparedCall",
    "Workspace",
    "CpuGroup",
    "BeamError",
    "BeamArgumentError",
    "BeamUnsupportedError",
    "BeamDeviceError",
    "BeamCommError",
    "BeamOutOfMemoryError",
    "backend_name",
    "library_path",
    "version",
    "HAVE_TORCH_OPS",
    "MIN_TORCH",
    "audit_file",
    "AuditReport",
]
