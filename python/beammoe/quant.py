"""The next layer's quantized input, FP8, NVFP4 or MXFP8, in the same pass (docs/numerics.md#fp8, #nvfp4, #mxfp8).

The functions are named as the C calls (beam_*_q); beammoe.fp8 and the
*_fp8 names, which this module kept as aliases, are their former names.

    quant = beammoe.FP8Quant("group", group_size=128)        # DeepGEMM / vLLM per-token-group
    hidden, normalized, q, q_scales = beammoe.beam_moe_finalize_norm_residual_norm_q(
        beammoe.MoEOutput(gemm2, weights), residual, post_w, 1e-6, next_w, 1e-6, None, 2.5, quant=quant)
    # tensor parallel: x holds this rank's tokens; q, q_scales cover all of them
    hidden, normalized, q, q_scales = beammoe.beam_moe_finalize_gather_norm_residual_norm_q(
        beammoe.MoEOutput(gemm2, weights), residual, post_w, 1e-6, next_w, 1e-6, None, workspace, 2.5,
        quant=quant)

The operations with a next norm also write that norm's output quantized to
FP8 E4M3 (torch.float8_e4m3fn; torch.uint8 bits on a torch without it),
with vLLM's semantics:

  FP8Quant("group", group_size=128 or 64, ue8m0=False, column_major=False)
      a dynamic scale per token and group: q_scales [tokens, hidden / group]
      FP32, or the same shape with strides (1, ld) where ld is tokens rounded
      up to a multiple of 4 (column_major: the layout DeepGEMM reads);
      ue8m0: scales rounded up to powers of two
  FP8Quant("token", ue8m0=False)
      a dynamic scale per token: q_scales [tokens, 1]
  FP8Quant("tensor", scale=s)
      the caller's static scale: q_scales is a one-element tensor holding s

or to NVFP4 (docs/numerics.md#nvfp4), the input of Blackwell's block-scaled
FP4 GEMMs, as vLLM's scaled_fp4_quant writes it:

  NVFP4Quant(global_scale)
      g = global_scale (vLLM's input_global_scale, usually 448 * 6 / amax;
      0 < g < 2^118 as an FP32): q [tokens, hidden / 2] two E2M1 values a
      byte, element 2i in the low four bits (torch.uint8, as vLLM's and
      FlashInfer's FP4 GEMMs take it; q.view(torch.float4_e2m1fn_x2) where
      torch has that dtype); q_scales [tokens rounded up to 128, hidden /
      16] an E4M3 scale per 16 values (torch.float8_e4m3fn, or uint8), its
      bytes in the 128 x 4 tiled layout the GEMM reads (swizzled, not row
      t, column b); the padding rows past the last token are not written

or to MXFP8 (docs/numerics.md#mxfp8), the input of Blackwell's block-scaled
FP8 GEMMs:

  MXFP8Quant()
      no arguments (its fields() are (5, 32, 0, 0.0)): q [tokens, hidden]
      E4M3 (torch.float8_e4m3fn, or uint8); q_scales [tokens rounded up to
      128, hidden / 32] an E8M0 code per 32 values, the power of two that
      scales them (torch.uint8, as FlashInfer's mxfp8_quantize gives them;
      q_scales.view(torch.float8_e8m0fnu) where torch has that dtype), in
      the same 128 x 4 tiled layout; the padding rows are not written

Each form's layout (the values' bytes a row, FP32 scales or tiled block
scale bytes, its group) follows from its line of lib/quant_forms.def, the
C library's list of forms (_forms.py).

q and q_scales equal quantizing the BF16 normalized output afterwards, bit
for bit, on every backend. keep_normalized=False (the default) writes only
the quantized form (normalized is None); True writes both. With torch >= 2.4
they are also torch operators (torch.ops.beammoe.*_fp8, whose kind,
group_size, flags and scale are quant.fields(): torch.compile, CUDA graphs),
but for inplace=True, which runs in eager calls only.

    quant = beammoe.NVFP4Quant(448 * 6 / amax)               # vLLM's scaled_fp4_quant
    hidden, _, q, q_scales = beammoe.beam_norm_residual_norm_q(
        x, residual, pre_w, 1e-6, next_w, 1e-6, None, quant=quant)

The gather's quantized form writes q and q_scales of every rank's tokens
(the gathered rows: tokens = residual.shape[0]), the same bits on every
rank, whichever runs the gather: the library's, or Python's (a CPU
workspace over a torch.distributed process group; an UNFUSED call with the
workspace's all_gather hook: _pgather.py), which hands the gathered rows
to the library's norm_residual_norm_q with the form, so the library
quantizes them there too. The all-reduce's quantized forms
(beam_allreduce_norm_residual_norm_q and its MoE form) quantize the
reduced rows, every token's, the same bits on every rank, whichever runs
the all-reduce (the library, or Python on the same workspaces as the
gather's: _pgather.py).
"""
import ctypes

import torch

from . import _forms
from . import _pgather
from . import _run
from . import _checks as A
from . import _torch_ops  # noqa: F401  (registers torch.ops.beammoe.*_fp8, which the calls below may go through)
from ._calls import HAVE_TORCH_OPS, increment_versions, no_autograd_write, route, scales_list
from ._checks import (ALLREDUCE, FUSED, FUSED_NAMES, GATHER, MOE_ALLREDUCE, NRN, NRN_NAMES, STRATEGY_NAMES,
                      check_fused, check_nrn)
from ._run import COL_MAJOR, KINDS, MXFP8, NVFP4, UE8M0, empty_outputs, struct
from ._lib import STRATEGIES
from .workspace import check_workspace, python_call


class FP8Quant:
    """How normalized is quantized (see the module's text)."""

    __slots__ = ("kind", "group_size", "ue8m0", "column_major", "scale")

    def __init__(self, kind="group", group_size=128, ue8m0=False, column_major=False, scale=None):
        if kind not in KINDS:
            raise ValueError("FP8Quant: kind=%r must be \"group\", \"token\" or \"tensor\"" % (kind,))
        A.flag("FP8Quant", "ue8m0", ue8m0)
        A.flag("FP8Quant", "column_major", column_major)
        group_size = A.integer("FP8Quant", "group_size", group_size, A.INT32)
        if kind == "group":
            if group_size not in (128, 64):
                raise ValueError("FP8Quant: group_size=%r must be 128 or 64" % (group_size,))
        elif column_major:
            raise ValueError("FP8Quant: column_major is for kind=\"group\"")
        if kind == "tensor":
            if ue8m0:
                raise ValueError("FP8Quant: ue8m0 is for the dynamic kinds (\"group\", \"token\")")
            scale = A.number("FP8Quant", "scale", scale)
            # the value the library gets is the FP32 nearest (ctypes.c_float)
            if not 0.0 < ctypes.c_float(scale).value <= A.FLT_MAX:
                raise ValueError("FP8Quant: scale=%r must be > 0 and finite as an FP32" % (scale,))
        elif scale is not None:
            raise ValueError("FP8Quant: scale is for kind=\"tensor\" (a static scale)")
        self.kind = kind
        self.group_size = group_size if kind == "group" else 0
        self.ue8m0 = ue8m0
        self.column_major = column_major
        self.scale = scale

    def __repr__(self):
        if self.kind == "tensor":
            return "FP8Quant(\"tensor\", scale=%r)" % self.scale
        return "FP8Quant(%r, group_size=%d, ue8m0=%r, column_major=%r)" % (
            self.kind, self.group_size, self.ue8m0, self.column_major)

    def fields(self):
        """(kind, group_size, flags, scale): the library's encoding (the
        torch operators' arguments)."""
        flags = (UE8M0 if self.ue8m0 else 0) | (COL_MAJOR if self.column_major else 0)
        return KINDS[self.kind], self.group_size, flags, self.scale if self.kind == "tensor" else 0.0


# The library's bound on the global scale: g / 2^-9 (the smallest nonzero
# block scale) must stay finite as an FP32.
NVFP4_SCALE_LIMIT = 2.0 ** 118


class _BlockQuant:
    """A block-scaled form: its code (_run.NVFP4 or MXFP8) and the caller's
    global scale (NVFP4's global_scale; MXFP8 has none)."""

    __slots__ = ()

    @property
    def group_size(self):
        """Values per block scale: the form's group of lib/quant_forms.def (NVFP4 16, MXFP8 32)."""
        return _forms.form(self._code).group

    def fields(self):
        """(kind, group_size, flags, scale): the library's encoding (the
        torch operators' arguments)."""
        return self._code, self.group_size, 0, getattr(self, "global_scale", 0.0)


class NVFP4Quant(_BlockQuant):
    """NVFP4 (docs/numerics.md#nvfp4): E2M1 values, an E4M3 scale per 16 and
    the caller's global scale g, 0 < g < 2^118 as an FP32 (see the module's
    text)."""

    __slots__ = ("global_scale",)

    kind = "nvfp4"
    _code = NVFP4

    def __init__(self, global_scale):
        g = A.number("NVFP4Quant", "global_scale", global_scale)
        # the value the library gets is the FP32 nearest (ctypes.c_float);
        # the comparisons are false for a NaN
        if not 0.0 < ctypes.c_float(g).value < NVFP4_SCALE_LIMIT:
            raise ValueError("NVFP4Quant: global_scale=%r must be > 0 and < 2^118 as an FP32" % (g,))
        self.global_scale = g

    def __repr__(self):
        return "NVFP4Quant(%r)" % self.global_scale


class MXFP8Quant(_BlockQuant):
    """MXFP8 (docs/numerics.md#mxfp8): E4M3 values and an E8M0 scale per 32,
    computed; no arguments (see the module's text)."""

    __slots__ = ()

    kind = "mxfp8"
    _code = MXFP8

    def __repr__(self):
        return "MXFP8Quant()"


QUANTS = (FP8Quant, NVFP4Quant, MXFP8Quant)


def _flags_and_next(fn, quant, inplace, keep_normalized, ne):
    """The arguments the functions add to the plain ones; returns quant."""
    if not isinstance(quant, QUANTS):
        raise TypeError("%s: quant must be a beammoe.FP8Quant, beammoe.NVFP4Quant or beammoe.MXFP8Quant, got %s"
                        % (fn, type(quant).__name__))
    A.flag(fn, "inplace", inplace)
    A.flag(fn, "keep_normalized", keep_normalized)
    if ne is None:
        raise ValueError("%s: next_eps must be given (the quantized output quantizes the next norm's output)" % fn)
    return quant


def _run_q(fn, quant, names, tensors, residual, tokens, hidden, inplace, keep_normalized, call, operator, args):
    """(hidden, normalized | None, q, q_scales): in an eager call the outputs
    made, then call(dev, hidden, normalized, beam_quant struct); otherwise
    through torch.ops.beammoe.<operator>(*args, *quant.fields(),
    keep_normalized)."""
    dev, eager, recording = route(fn, names, tensors)
    if not eager:
        if inplace or not HAVE_TORCH_OPS:
            raise NotImplementedError(
                "%s: %s runs in eager calls on plain CPU or CUDA tensors only (not under torch.compile, a "
                "dispatch mode or torch.jit.trace)" % (fn, "inplace=True" if HAVE_TORCH_OPS else
                                                        "with torch %s, the quantized output" % torch.__version__))
        h, n, q, qs = getattr(torch.ops.beammoe, operator)(*args, *quant.fields(), keep_normalized)
        return h, (n if keep_normalized else None), q, qs  # the operator's normalized is empty unless kept
    if inplace:
        no_autograd_write(fn, "residual", residual, recording, eager)
    kind, group, flags, scale = quant.fields()
    with torch.no_grad():
        h = residual if inplace else torch.empty_like(residual)
        n = torch.empty_like(residual) if keep_normalized else None
        q, qs = empty_outputs(kind, group, flags, scale, tokens, hidden, dev)
        call(dev, h, n, struct(kind, group, flags, scale, q, qs))
    if inplace:
        increment_versions((residual,))  # written behind torch's back: as its in-place ops do
    return h, n, q, qs


def _check_fused_q(fn, x, residual, post_weight, post_eps, next_weight, next_eps, scales, routed_scale, strategy,
                   quant, inplace, keep_normalized, gather):
    """The checks of the fused op's and the gather's FP8 forms: (g, w, what
    check_fused returns, quant)."""
    g, w = A.moe_output(fn, x)
    checked = check_fused(fn, g, w, residual, post_weight, post_eps, next_weight, next_eps, scales, routed_scale,
                          A.strategy(fn, strategy, STRATEGIES, STRATEGY_NAMES), gather=gather)
    return g, w, checked, _flags_and_next(fn, quant, inplace, keep_normalized, checked[6])


def beam_norm_residual_norm_q(x, residual, pre_weight=None, pre_eps=None, next_weight=None, next_eps=None,
                              scales=None, *, quant, inplace=False, keep_normalized=False):
    """beam_norm_residual_norm with the next norm's output also (or only) in FP8, NVFP4 or MXFP8 (quant).

    Returns (hidden, normalized | None, q, q_scales); next_eps is required."""
    fn = NRN + "_q"
    tokens, hidden, prw, pre, nw, ne, s = check_nrn(fn, x, residual, pre_weight, pre_eps, next_weight, next_eps,
                                                    scales)
    quant = _flags_and_next(fn, quant, inplace, keep_normalized, ne)
    return _run_q(fn, quant, NRN_NAMES, (x, residual, prw, nw), residual, tokens, hidden, inplace, keep_normalized,
                  lambda dev, h, n, qst: _run.norm_residual_norm(
                      dev, x, residual, tokens, hidden, prw, pre, s, nw, ne, h, n, qst),
                  "norm_residual_norm_fp8", (x, residual, prw, pre, nw, ne, scales_list(s)))


def beam_moe_finalize_norm_residual_norm_q(x, residual, post_weight, post_eps, next_weight, next_eps, scales,
                                           routed_scale=1.0, *, quant, strategy=None, inplace=False,
                                           keep_normalized=False):
    """beam_moe_finalize_norm_residual_norm with the next norm's output also (or only) in FP8, NVFP4 or MXFP8 (quant).

    Returns (hidden, normalized | None, q, q_scales); next_eps is required."""
    fn = FUSED + "_q"
    g, w, (capacity, top_k, hidden, pw, pe, nw, ne, s, scale, st), quant = _check_fused_q(
        fn, x, residual, post_weight, post_eps, next_weight, next_eps, scales, routed_scale, strategy, quant, inplace,
        keep_normalized, False)
    tokens = residual.shape[0]
    return _run_q(fn, quant, FUSED_NAMES, (g, w, residual, pw, nw), residual, tokens, hidden, inplace,
                  keep_normalized, lambda dev, h, n, qst: _run.fused(
                      dev, g, w, capacity, tokens, top_k, hidden, scale, pw, pe, residual, s, nw, ne, h, n, st, qst),
                  "moe_finalize_norm_residual_norm_fp8", (g, w, residual, pw, pe, nw, ne, scales_list(s), scale, st))


def beam_moe_finalize_gather_norm_residual_norm_q(x, residual, post_weight, post_eps, next_weight, next_eps,
                                                  scales, workspace, routed_scale=1.0, *, quant, strategy=None,
                                                  inplace=False, keep_normalized=False):
    """beam_moe_finalize_gather_norm_residual_norm with the next norm's output also (or only) in FP8, NVFP4 or MXFP8.

    Collective, with the gather's rules: x holds this rank's tokens, residual
    all T = residual.shape[0]. Returns (hidden, normalized | None, q,
    q_scales), each of all T tokens (q [T, hidden], NVFP4 [T, hidden / 2];
    q_scales as quant lays them out for T rows) and the same bits on every
    rank; next_eps is required. A workspace that gathers in Python gives
    the same bits (the module's text)."""
    return _moe_collective_q(GATHER + "_q", "moe_finalize_gather_norm_residual_norm_fp8", _pgather.GATHER, x,
                             residual, post_weight, post_eps, next_weight, next_eps, scales, workspace, routed_scale,
                             strategy, quant, inplace, keep_normalized)


def _python_q(fn, x, residual, w1, e1, next_weight, next_eps, scales, workspace, routed_scale, strategy, quant, inplace,
              keep_normalized, coll):
    """A collective _q call run in Python (_pgather), this form's checks
    among every rank's, the library quantizing the gathered or reduced rows."""
    return _pgather.gather(workspace, fn, x, residual, w1, e1, next_weight, next_eps, scales, routed_scale, strategy,
                           inplace, keep_normalized=keep_normalized, coll=coll,
                           quant=lambda ne: _flags_and_next(fn, quant, inplace, keep_normalized, ne).fields())


def _moe_collective_q(fn, operator, coll, x, residual, post_weight, post_eps, next_weight, next_eps, scales,
                      workspace, routed_scale, strategy, quant, inplace, keep_normalized):
    """A collective _q call on an MoEOutput (coll: _pgather.GATHER or
    ALLREDUCE), as ops._moe_collective: in Python where the workspace takes
    it (_pgather: every rank's checks, this form's among them, travel with
    the call, and the library quantizes the gathered or reduced rows); else
    the checks, then the library's call (Workspace._moe_run), or
    torch.ops.beammoe.<operator>."""
    if python_call(workspace, residual, strategy):
        return _python_q(fn, x, residual, post_weight, post_eps, next_weight, next_eps, scales, workspace,
                         routed_scale, strategy, quant, inplace, keep_normalized, coll)
    gather = coll == _pgather.GATHER
    g, w, (capacity, top_k, hidden, pw, pe, nw, ne, s, scale, st), quant = _check_fused_q(
        fn, x, residual, post_weight, post_eps, next_weight, next_eps, scales, routed_scale, strategy, quant, inplace,
        keep_normalized, gather)
    handle = check_workspace(fn, workspace, residual.device)  # _run_q checks that every tensor is there
    tokens = residual.shape[0]
    run = workspace._moe_run(gather)
    return _run_q(fn, quant, FUSED_NAMES, (g, w, residual, pw, nw), residual, tokens, hidden, inplace,
                  keep_normalized, lambda dev, h, n, qst: run(
                      dev, g, w, capacity, tokens, top_k, hidden, scale, pw, pe, residual, s, nw, ne, h, n, st, qst),
                  operator, (handle, g, w, residual, pw, pe, nw, ne, scales_list(s), scale, st))


def beam_allreduce_norm_residual_norm_q(x, residual, pre_weight, pre_eps, next_weight, next_eps, scales, workspace, *,
                                        quant, strategy=None, inplace=False, keep_normalized=False):
    """beam_allreduce_norm_residual_norm with the next norm's output also (or only) in FP8, NVFP4 or MXFP8 (quant).

    Collective as the plain call: returns (hidden, normalized | None, q,
    q_scales), the same bits on every rank; next_eps is required."""
    fn = ALLREDUCE + "_q"
    if python_call(workspace, residual, strategy):
        return _python_q(fn, x, residual, pre_weight, pre_eps, next_weight, next_eps, scales, workspace, 1.0, strategy,
                         quant, inplace, keep_normalized, _pgather.DENSE)
    tokens, hidden, prw, pre, nw, ne, s = check_nrn(fn, x, residual, pre_weight, pre_eps, next_weight, next_eps,
                                                    scales)
    st = A.strategy(fn, strategy, STRATEGIES, STRATEGY_NAMES)
    quant = _flags_and_next(fn, quant, inplace, keep_normalized, ne)
    handle = check_workspace(fn, workspace, residual.device)  # _run_q checks that every tensor is there
    return _run_q(fn, quant, NRN_NAMES, (x, residual, prw, nw), residual, tokens, hidden, inplace, keep_normalized,
                  lambda dev, h, n, qst: workspace._run_dense_allreduce(
                      dev, x, tokens, hidden, prw, pre, residual, s, nw, ne, h, n, st, qst),
                  "allreduce_norm_residual_norm_fp8", (handle, x, residual, prw, pre, nw, ne, scales_list(s), st))


def beam_moe_finalize_allreduce_norm_residual_norm_q(x, residual, post_weight, post_eps, next_weight, next_eps,
                                                     scales, workspace, routed_scale=1.0, *, quant, strategy=None,
                                                     inplace=False, keep_normalized=False):
    """beam_moe_finalize_allreduce_norm_residual_norm with the next norm's output also (or only) in FP8, NVFP4 or MXFP8.

    Collective as the plain call: returns (hidden, normalized | None, q,
    q_scales), the same bits on every rank; next_eps is required."""
    return _moe_collective_q(MOE_ALLREDUCE + "_q", "moe_finalize_allreduce_norm_residual_norm_fp8", _pgather.ALLREDUCE,
                             x, residual, post_weight, post_eps, next_weight, next_eps, scales, workspace,
                             routed_scale, strategy, quant, inplace, keep_normalized)


# The former names, kept.
beam_norm_residual_norm_fp8 = beam_norm_residual_norm_q
beam_moe_finalize_norm_residual_norm_fp8 = beam_moe_finalize_norm_residual_norm_q
beam_moe_finalize_gather_norm_residual_norm_fp8 = beam_moe_finalize_gather_norm_residual_norm_q
