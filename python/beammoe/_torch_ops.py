"""The operations as torch operators: torch.ops.beammoe.* (torch >= 2.4).

Registered with torch.library.custom_op, each with a fake implementation
(shapes only, for torch.compile, torch.export and meta tensors) and the
mutation annotations of its schema, so that torch.compile(fullgraph=True)
traces a model through them without a graph break, functionalization knows
what each writes, and CUDA graphs capture them (the calls are stream-ordered
on torch's current stream, with no host synchronization).

    moe_finalize(expert_outputs, expert_weights, output!, routed_scale, post_weight?, post_eps?) -> ()
    moe_finalize_norm_residual_norm(gemm2, weights, residual, post_weight?, post_eps?, next_weight?,
        next_eps?, scales?, routed_scale, strategy) -> (hidden, normalized)
    moe_finalize_norm_residual_norm_(... residual! ...) -> normalized          (hidden written into residual)
    norm_residual_norm(x, residual, pre_weight?, pre_eps?, next_weight?, next_eps?, scales?)
        -> (hidden, normalized)
    norm_residual_norm_(x, residual!, ...) -> normalized
    moe_finalize_gather_norm_residual_norm(workspace, gemm2, weights, residual, ...) -> (hidden, normalized)
    moe_finalize_gather_norm_residual_norm_(workspace, ... residual! ...) -> normalized
    allreduce_norm_residual_norm(workspace, x, residual, pre_weight?, pre_eps?, next_weight?, next_eps?,
        scales?, strategy) -> (hidden, normalized)         (and allreduce_norm_residual_norm_)
    moe_finalize_allreduce_norm_residual_norm(workspace, gemm2, weights, residual, ...) -> (hidden, normalized)
                                                           (and moe_finalize_allreduce_norm_residual_norm_)
    norm_residual_norm_fp8(x, residual, pre_weight?, pre_eps?, next_weight?, next_eps, scales?, kind,
        group_size, flags, scale, keep_normalized) -> (hidden, normalized, q, q_scales)
    moe_finalize_norm_residual_norm_fp8(gemm2, weights, residual, ..., routed_scale, strategy, kind,
        group_size, flags, scale, keep_normalized) -> (hidden, normalized, q, q_scales)
    moe_finalize_gather_norm_residual_norm_fp8(workspace, gemm2, weights, residual, ..., keep_normalized)
        -> (hidden, normalized, q, q_scales)
    allreduce_norm_residual_norm_fp8(workspace, x, residual, ..., scales?, strategy, kind, group_size, flags,
        scale, keep_normalized) -> (hidden, normalized, q, q_scales)
    moe_finalize_allreduce_norm_residual_norm_fp8(workspace, gemm2, weights, residual, ..., keep_normalized)
        -> (hidden, normalized, q, q_scales)

The *_fp8 operators' kind, group_size, flags and scale are the library's
beam_quant fields (FP8Quant.fields(), NVFP4Quant.fields(): kind 4 is NVFP4,
MXFP8Quant.fields(): kind 5 is MXFP8); q and q_scales are shaped as
_run.empty_outputs makes them, from the form's line of lib/quant_forms.def.

`!` marks the tensor written in place; every other tensor is read only and
every result is a new tensor. Without a next norm (next_eps None) the
`normalized` result is an empty tensor (the functions of beammoe return
None). `workspace` is the handle of an open beammoe.Workspace
(Workspace.handle), `strategy` the library's enum value. The functional
operations refuse a backward pass (the library has no derivative); the
beammoe functions refuse an in-place write while autograd records.

Call the functions of the beammoe package rather than these: they take the
reference's arguments, check them, and skip the operator dispatch on plain
eager calls.
"""
import functools
import inspect
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _pgather
from . import _run
from ._run import empty_outputs, struct as quant_struct
from . import _checks as A
from ._calls import HAVE_TORCH_OPS
from ._checks import (ALLREDUCE as _ALLREDUCE, FINALIZE as _FINALIZE, FINALIZE_NAMES as _FINALIZE_NAMES,
                      FUSED as _FUSED, FUSED_NAMES as _FUSED_NAMES, GATHER as _GATHER,
                      MOE_ALLREDUCE as _MOE_ALLREDUCE, NRN as _NRN, NRN_NAMES as _NRN_NAMES, check_finalize,
                      check_fused, check_nrn)
from .workspace import Workspace, check_workspace


_GATHER_Q = _GATHER + "_q"
_ALLREDUCE_Q = _ALLREDUCE + "_q"
_MOE_ALLREDUCE_Q = _MOE_ALLREDUCE + "_q"


def _no_normalized(residual):
    return residual.new_empty((0,))


def _fused_impl(fn, run, g, w, residual, pw, pe, nw, ne, scales, routed_scale, strategy, inplace):
    capacity, top_k, hidden, pw, pe, nw, ne, s, scale, st = check_fused(
        fn, g, w, residual, pw, pe, nw, ne, scales, routed_scale, strategy, gather=fn == _GATHER)
    dev = A.same_device(fn, _FUSED_NAMES, (g, w, residual, pw, nw))
    normalized = torch.empty_like(residual) if ne is not None else None
    out = residual if inplace else torch.empty_like(residual)
    run(dev, g, w, capacity, residual.shape[0], top_k, hidden, scale, pw, pe, residual, s, nw, ne, out,
        normalized, st)
    return out, (normalized if normalized is not None else _no_normalized(residual))


def _fake_fused(fn, g, w, residual, pw, pe, nw, ne, scales, routed_scale, strategy):
    check_fused(fn, g, w, residual, pw, pe, nw, ne, scales, routed_scale, strategy, gather=fn == _GATHER)
    A.same_device(fn, _FUSED_NAMES, (g, w, residual, pw, nw))
    return (torch.empty_like(residual),
            torch.empty_like(residual) if ne is not None else _no_normalized(residual))


def _workspace(fn, handle, dev):
    ws = Workspace.by_handle(handle)
    if ws is None:
        raise ValueError("%s: workspace=0x%x is not an open beammoe.Workspace" % (fn, handle))
    check_workspace(fn, ws, dev)
    return ws


def _in_python(ws, fn, x, residual, *args, **kw):
    """An operator's call run in Python (_pgather.gather with op=True, where
    ws._python_gather takes it): its results, normalized empty when absent."""
    out = _pgather.gather(ws, fn, x, residual, *args, op=True, **kw)
    return (out[0], out[1] if out[1] is not None else _no_normalized(residual)) + tuple(out[2:])


def _gather_impl(workspace, g, w, residual, pw, pe, nw, ne, scales, routed_scale, strategy, inplace):
    """The gather operators' implementation: the workspace's library gather,
    or the gather in Python (_pgather) where the workspace takes it."""
    ws = _workspace(_GATHER, workspace, residual.device)
    if ws._python_gather(residual, strategy):
        return _in_python(ws, _GATHER, (g, w), residual, pw, pe, nw, ne, scales, routed_scale, strategy, inplace)

    def run(dev, *args):
        ws._run_gather(dev, *args)
    return _fused_impl(_GATHER, run, g, w, residual, pw, pe, nw, ne, scales, routed_scale, strategy, inplace)


def _allreduce_impl(workspace, x, residual, pre_weight, pre_eps, next_weight, next_eps, scales, strategy, inplace):
    """The dense all-reduce operators' implementation: the library's, or
    Python's (_pgather) where the workspace takes it."""
    ws = _workspace(_ALLREDUCE, workspace, residual.device)
    if ws._python_gather(residual, strategy):
        return _in_python(ws, _ALLREDUCE, x, residual, pre_weight, pre_eps, next_weight, next_eps, scales, 1.0,
                          strategy, inplace, coll=_pgather.DENSE)
    tokens, hidden, prw, pre, nw, ne, s = check_nrn(_ALLREDUCE, x, residual, pre_weight, pre_eps, next_weight,
                                                    next_eps, scales)
    dev = A.same_device(_ALLREDUCE, _NRN_NAMES, (x, residual, prw, nw))
    normalized = torch.empty_like(residual) if ne is not None else None
    out = residual if inplace else torch.empty_like(residual)
    ws._run_dense_allreduce(dev, x, tokens, hidden, prw, pre, residual, s, nw, ne, out, normalized, strategy)
    return out, (normalized if normalized is not None else _no_normalized(residual))


def _moe_allreduce_impl(workspace, g, w, residual, pw, pe, nw, ne, scales, routed_scale, strategy, inplace):
    """The MoE all-reduce operators' implementation: the library's, or
    Python's (_pgather) where the workspace takes it."""
    ws = _workspace(_MOE_ALLREDUCE, workspace, residual.device)
    if ws._python_gather(residual, strategy):
        return _in_python(ws, _MOE_ALLREDUCE, (g, w), residual, pw, pe, nw, ne, scales, routed_scale, strategy,
                          inplace, coll=_pgather.ALLREDUCE)
    return _fused_impl(_MOE_ALLREDUCE, ws._moe_run(False), g, w, residual, pw, pe, nw, ne, scales, routed_scale,
                       strategy, inplace)


def _nrn_impl(x, residual, pre_weight, pre_eps, next_weight, next_eps, scales, inplace):
    tokens, hidden, prw, pre, nw, ne, s = check_nrn(_NRN, x, residual, pre_weight, pre_eps, next_weight, next_eps,
                                                    scales)
    dev = A.same_device(_NRN, _NRN_NAMES, (x, residual, prw, nw))
    normalized = torch.empty_like(residual) if ne is not None else None
    out = residual if inplace else torch.empty_like(residual)
    _run.norm_residual_norm(dev, x, residual, tokens, hidden, prw, pre, s, nw, ne, out, normalized)
    return out, (normalized if normalized is not None else _no_normalized(residual))


def _nrn_fake(x, residual, pre_weight, pre_eps, next_weight, next_eps, scales):
    check_nrn(_NRN, x, residual, pre_weight, pre_eps, next_weight, next_eps, scales)
    A.same_device(_NRN, _NRN_NAMES, (x, residual, pre_weight, next_weight))
    return (torch.empty_like(residual),
            torch.empty_like(residual) if next_eps is not None else _no_normalized(residual))


def _refuse_backward(name):
    def backward(ctx, *grads):
        raise RuntimeError("beammoe::%s: beammoe operations have no derivative (inference only); call them "
                           "under torch.no_grad() or torch.inference_mode(), or on detached tensors" % name)
    return backward


def _setup_context(ctx, inputs, output):
    pass


def _op(name, protos, result, impl, fake, mutates=()):
    """beammoe::<name> of impl and its fake implementation, the parameters
    of the prototypes in turn (their annotations make the schema); a
    functional one (mutates nothing) refuses a backward pass with a clear
    message (torch allows no formula on an operation that writes in place;
    the beammoe functions refuse those writes while autograd records)."""
    def run(*args):
        return impl(*args)

    params = [p for f in protos for p in inspect.signature(f).parameters.values()]
    run.__signature__ = inspect.Signature(params, return_annotation=result)
    op = torch.library.custom_op("beammoe::" + name, mutates_args=mutates)(run)
    op.register_fake(fake)
    if not mutates:
        op.register_autograd(_refuse_backward(name), setup_context=_setup_context)


def _pair(name, protos, impl, fake):
    """beammoe::<name>, which returns (hidden, normalized), and its in-place
    form beammoe::<name>_, which writes hidden into residual and returns
    normalized: impl(*args, inplace) and fake(*args) give (hidden, normalized)."""
    _op(name, protos, Tuple[Tensor, Tensor], lambda *args: impl(*args, False), fake)
    _op(name + "_", protos, Tensor, lambda *args: impl(*args, True)[1], lambda *args: fake(*args)[1], ("residual",))


def _register():
    @torch.library.custom_op("beammoe::moe_finalize", mutates_args=("output",))
    def moe_finalize(expert_outputs: Tensor, expert_weights: Tensor, output: Tensor, routed_scale: float,
                     post_weight: Optional[Tensor], post_eps: Optional[float]) -> None:
        capacity, top_k, hidden, live, pw, pe, scale = check_finalize(
            _FINALIZE, expert_outputs, expert_weights, output, post_weight, post_eps, routed_scale)
        dev = A.same_device(_FINALIZE, _FINALIZE_NAMES, (expert_outputs, expert_weights, output, pw))
        _run.finalize(dev, expert_outputs, expert_weights, capacity, live, top_k, hidden, scale, pw, pe, output)

    @moe_finalize.register_fake
    def _(expert_outputs, expert_weights, output, routed_scale, post_weight, post_eps):
        check_finalize(_FINALIZE, expert_outputs, expert_weights, output, post_weight, post_eps, routed_scale)
        A.same_device(_FINALIZE, _FINALIZE_NAMES, (expert_outputs, expert_weights, output, post_weight))

    # ---- the local fused operation, norm_residual_norm and the gather, each
    # functional and in place; the prototypes' annotations make the schemas
    def fused_args(gemm2: Tensor, weights: Tensor, residual: Tensor, post_weight: Optional[Tensor],
                   post_eps: Optional[float], next_weight: Optional[Tensor], next_eps: Optional[float],
                   scales: Optional[List[float]], routed_scale: float, strategy: int):
        pass

    def nrn_args(x: Tensor, residual: Tensor, pre_weight: Optional[Tensor], pre_eps: Optional[float],
                 next_weight: Optional[Tensor], next_eps: Optional[float], scales: Optional[List[float]]):
        pass

    def workspace_arg(workspace: int):
        pass

    def quant_args(kind: int, group_size: int, flags: int, scale: float, keep_normalized: bool):
        pass

    _pair("moe_finalize_norm_residual_norm", (fused_args,), functools.partial(_fused_impl, _FUSED, _run.fused),
          functools.partial(_fake_fused, _FUSED))
    _pair("norm_residual_norm", (nrn_args,), _nrn_impl, _nrn_fake)
    _pair("moe_finalize_gather_norm_residual_norm", (workspace_arg, fused_args), _gather_impl,
          lambda workspace, *args: _fake_fused(_GATHER, *args))

    def strategy_arg(strategy: int):
        pass

    _pair("allreduce_norm_residual_norm", (workspace_arg, nrn_args, strategy_arg), _allreduce_impl,
          lambda workspace, *args: _nrn_fake(*args[:-1]))
    _pair("moe_finalize_allreduce_norm_residual_norm", (workspace_arg, fused_args), _moe_allreduce_impl,
          lambda workspace, *args: _fake_fused(_MOE_ALLREDUCE, *args))

    # ---- the FP8 output of the next norm (beammoe.fp8): q and q_scales as
    # _run.empty_outputs makes them; normalized empty unless kept
    def need_next(next_eps):
        if next_eps is None:
            raise ValueError("the FP8 output needs next_eps (it quantizes the next norm's output)")

    def fp8_out(residual, next_eps, kind, group_size, flags, scale, keep_normalized):
        need_next(next_eps)
        tokens, hidden = residual.shape
        q, qs = empty_outputs(kind, group_size, flags, scale, tokens, hidden, residual.device)
        n = torch.empty_like(residual) if keep_normalized else _no_normalized(residual)
        return torch.empty_like(residual), n, q, qs

    def nrn_fp8(fn, run, x, residual, pre_weight, pre_eps, next_weight, next_eps, scales, kind, group_size, flags,
                scale, keep_normalized):
        """The local and the all-reduced dense FP8 operator: the checks, the
        outputs, then run(dev, ...) with _run.norm_residual_norm's arguments."""
        tokens, hidden, prw, pre, nw, ne, s = check_nrn(fn, x, residual, pre_weight, pre_eps, next_weight,
                                                        next_eps, scales)
        dev = A.same_device(fn, _NRN_NAMES, (x, residual, prw, nw))
        h, n, q, qs = fp8_out(residual, ne, kind, group_size, flags, scale, keep_normalized)
        run(dev, x, residual, tokens, hidden, prw, pre, s, nw, ne, h, n if keep_normalized else None,
            quant_struct(kind, group_size, flags, scale, q, qs))
        return h, n, q, qs

    def nrn_fp8_fake(fn, x, residual, pre_weight, pre_eps, next_weight, next_eps, scales, *quant):
        check_nrn(fn, x, residual, pre_weight, pre_eps, next_weight, next_eps, scales)
        return fp8_out(residual, next_eps, *quant)

    def fused_fp8(fn, gather, run, gemm2, weights, residual, post_weight, post_eps, next_weight, next_eps, scales,
                  routed_scale, strategy, kind, group_size, flags, scale, keep_normalized):
        """The local, the gathered and the MoE all-reduced FP8 operator: the
        checks, the outputs, then run(dev, ...) with _run.fused's arguments,
        which the gather's Workspace._run_gather takes too."""
        capacity, top_k, hidden, pw, pe, nw, ne, s, rs, st = check_fused(
            fn, gemm2, weights, residual, post_weight, post_eps, next_weight, next_eps, scales, routed_scale,
            strategy, gather=gather)
        dev = A.same_device(fn, _FUSED_NAMES, (gemm2, weights, residual, pw, nw))
        h, n, q, qs = fp8_out(residual, ne, kind, group_size, flags, scale, keep_normalized)
        run(dev, gemm2, weights, capacity, residual.shape[0], top_k, hidden, rs, pw, pe, residual, s, nw, ne, h,
            n if keep_normalized else None, st, quant_struct(kind, group_size, flags, scale, q, qs))
        return h, n, q, qs

    def fused_fp8_fake(fn, gather, gemm2, weights, residual, post_weight, post_eps, next_weight, next_eps, scales,
                       routed_scale, strategy, *quant):
        check_fused(fn, gemm2, weights, residual, post_weight, post_eps, next_weight, next_eps, scales,
                    routed_scale, strategy, gather=gather)
        return fp8_out(residual, next_eps, *quant)

    def python_fp8(ws, fn, coll, x, residual, w1, e1, next_weight, next_eps, scales, routed_scale, strategy, kind,
                   group_size, flags, scale, keep_normalized):
        """The FP8 operator in Python (_pgather), the library quantizing the
        gathered or reduced rows."""
        def fields(ne):
            need_next(ne)
            return kind, group_size, flags, scale
        return _in_python(ws, fn, x, residual, w1, e1, next_weight, next_eps, scales, routed_scale, strategy, False,
                          quant=fields, keep_normalized=keep_normalized, coll=coll)

    def gather_fp8(workspace, gemm2, weights, residual, post_weight, post_eps, next_weight, next_eps, scales,
                   routed_scale, strategy, kind, group_size, flags, scale, keep_normalized):
        ws = _workspace(_GATHER_Q, workspace, residual.device)
        if ws._python_gather(residual, strategy):
            return python_fp8(ws, _GATHER_Q, _pgather.GATHER, (gemm2, weights), residual, post_weight, post_eps,
                              next_weight, next_eps, scales, routed_scale, strategy, kind, group_size, flags, scale,
                              keep_normalized)
        return fused_fp8(_GATHER_Q, True, ws._run_gather, gemm2, weights, residual, post_weight, post_eps,
                         next_weight, next_eps, scales, routed_scale, strategy, kind, group_size, flags, scale,
                         keep_normalized)

    def allreduce_fp8(workspace, x, residual, pre_weight, pre_eps, next_weight, next_eps, scales, strategy, *quant):
        ws = _workspace(_ALLREDUCE_Q, workspace, residual.device)
        if ws._python_gather(residual, strategy):
            return python_fp8(ws, _ALLREDUCE_Q, _pgather.DENSE, x, residual, pre_weight, pre_eps, next_weight,
                              next_eps, scales, 1.0, strategy, *quant)

        def run(dev, x, residual, tokens, hidden, prw, pre, s, nw, ne, h, n, qst):
            ws._run_dense_allreduce(dev, x, tokens, hidden, prw, pre, residual, s, nw, ne, h, n, strategy, qst)
        return nrn_fp8(_ALLREDUCE_Q, run, x, residual, pre_weight, pre_eps, next_weight, next_eps, scales, *quant)

    def moe_allreduce_fp8(workspace, gemm2, weights, residual, *args):
        ws = _workspace(_MOE_ALLREDUCE_Q, workspace, residual.device)
        if ws._python_gather(residual, args[6]):  # args[6]: strategy
            return python_fp8(ws, _MOE_ALLREDUCE_Q, _pgather.ALLREDUCE, (gemm2, weights), residual, *args)
        return fused_fp8(_MOE_ALLREDUCE_Q, False, ws._moe_run(False), gemm2, weights, residual, *args)

    outputs = Tuple[Tensor, Tensor, Tensor, Tensor]
    _op("norm_residual_norm_fp8", (nrn_args, quant_args), outputs,
        functools.partial(nrn_fp8, _NRN, _run.norm_residual_norm), functools.partial(nrn_fp8_fake, _NRN))
    _op("moe_finalize_norm_residual_norm_fp8", (fused_args, quant_args), outputs,
        functools.partial(fused_fp8, _FUSED, False, _run.fused), functools.partial(fused_fp8_fake, _FUSED, False))
    _op("moe_finalize_gather_norm_residual_norm_fp8", (workspace_arg, fused_args, quant_args), outputs, gather_fp8,
        lambda workspace, *args: fused_fp8_fake(_GATHER_Q, True, *args))
    _op("allreduce_norm_residual_norm_fp8", (workspace_arg, nrn_args, strategy_arg, quant_args), outputs,
        allreduce_fp8, lambda workspace, *args: nrn_fp8_fake(_ALLREDUCE_Q, *args[:7], *args[8:]))  # not strategy
    _op("moe_finalize_allreduce_norm_residual_norm_fp8", (workspace_arg, fused_args, quant_args), outputs,
        moe_allreduce_fp8, lambda workspace, *args: fused_fp8_fake(_MOE_ALLREDUCE_Q, False, *args))


def _already_registered():
    try:
        torch.ops.beammoe.moe_finalize_norm_residual_norm
    except (AttributeError, RuntimeError):
        return False
    return True


if HAVE_TORCH_OPS and not _already_registered():
    _register()
