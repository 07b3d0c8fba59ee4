"""The operations with the reference signatures and semantics, over torch tensors.

Every function checks its arguments (_checks.py), then either calls the
library at once (eager calls on plain CPU or CUDA tensors: the short path,
_run.py) or goes through the registered torch operation torch.ops.beammoe.*
(_torch_ops.py): under torch.compile or torch.jit.trace, on tensor
subclasses or meta tensors, under a dispatch mode, and when autograd records
a call with new results (so that it refuses a backward pass; an in-place
write that autograd records runs eagerly and marks the written tensor, whose
backward refuses). Both paths check the same rules, give the same bits and
write the same tensors. The gather and the all-reduce of a CPU workspace
over a process group, and of any workspace with an all_gather hook on their
unfused calls, run in _pgather.py.

Results are new tensors, as in the reference: hidden is torch.empty_like
(residual), and residual is left as it was. inplace=True writes hidden into
residual instead (the residual-stream update of inference engines) and
returns residual itself, with its version counter bumped like any in-place
torch op.

The package's imports go one way: this module imports _torch_ops.py (which
registers the operators); both import workspace.py, _pgather.py, _calls.py
(how a call runs: the short path or the operator, the autograd guards) and
_checks.py (the argument rules), none of which imports either of them back
(python/tests/test_prototypes.py checks that no import comes back around).
"""
import torch

from . import _lib
from . import _pgather
from . import _run
from . import _checks as A
from . import _torch_ops  # noqa: F401  (registers torch.ops.beammoe.*, which the calls below may go through)
from ._calls import (HAVE_TORCH_OPS, WriteNoDerivative, autograd_inputs, mark_written, no_autograd_write,
                     route, run_eager, scales_list)
from ._checks import (ALLREDUCE as _ALLREDUCE, FINALIZE as _FINALIZE, FINALIZE_NAMES as _FINALIZE_NAMES,
                      FUSED as _FUSED, FUSED_NAMES as _FUSED_NAMES, GATHER as _GATHER,
                      MOE_ALLREDUCE as _MOE_ALLREDUCE, NRN as _NRN, NRN_NAMES as _NRN_NAMES,
                      STRATEGY_NAMES as _STRATEGY_NAMES, check_finalize, check_fused, check_nrn)
from .workspace import check_workspace, python_call

__all__ = [
    "MoEOutput",
    "beam_moe_finalize",
    "beam_moe_finalize_norm_residual_norm",
    "beam_moe_finalize_gather_norm_residual_norm",
    "beam_allreduce_norm_residual_norm",
    "beam_moe_finalize_allreduce_norm_residual_norm",
    "beam_norm_residual_norm",
    "norm_residual_norm",
]

class MoEOutput:
    """An unfinalized MoE output: what the second grouped GEMM leaves.

    gemm2_permuted  [capacity * top_k, hidden] BF16, token-major (row
                    t * top_k + k is token t's slot k); [capacity, top_k,
                    hidden] is accepted too
    expert_weights  [capacity, top_k] FP32 routing weights (it may hold more
                    rows than gemm2_permuted; only the live ones are read)
    live_tokens     what the producer says; not read: as in the reference,
                    the operations take the token count from the residual,
                    and rows past it are never read
    Any object with these attributes is accepted where an MoEOutput is.
    """

    __slots__ = ("gemm2_permuted", "expert_weights", "live_tokens")

    def __init__(self, gemm2_permuted, expert_weights, live_tokens=None):
        self.gemm2_permuted = gemm2_permuted
        self.expert_weights = expert_weights
        self.live_tokens = live_tokens

    def __repr__(self):
        return "MoEOutput(gemm2_permuted=%s%s, expert_weights=%s%s, live_tokens=%r)" % (
            tuple(self.gemm2_permuted.shape), self.gemm2_permuted.dtype,
            tuple(self.expert_weights.shape), self.expert_weights.dtype, self.live_tokens)


def _finish(fn, name, residual, inplace, ne, tensors, eager, recording, run, args):
    """(hidden, normalized | None) of an operation with a residual: the short
    path run(hidden, normalized) (_run.py), or torch.ops.beammoe.<name>(*args),
    or its in-place form <name>_ (which writes hidden into residual)."""
    if inplace:
        no_autograd_write(fn, "residual", residual, recording, eager)
    if eager and not (recording and HAVE_TORCH_OPS and not inplace):
        return run_eager(fn, residual, inplace, ne, tensors, run, recording)
    if inplace:
        n = getattr(torch.ops.beammoe, name + "_")(*args)
        return residual, (n if ne is not None else None)
    h, n = getattr(torch.ops.beammoe, name)(*args)
    return h, (n if ne is not None else None)


# ---- the operations ------------------------------------------------------------

def beam_moe_finalize(expert_outputs, expert_weights, output, routed_scale=1.0, post_weight=None,
                      post_eps=None):
    """output[t] = post_norm(bf16(bf16(sum_k w[t,k] * x[t,k]) * routed_scale)) for t < output.shape[0].

    expert_outputs  [capacity, top_k, hidden] or [capacity * top_k, hidden] BF16
    expert_weights  [capacity, top_k] FP32 (it may hold more or fewer rows
                    than expert_outputs; only the live ones are read)
    output          [live_tokens, hidden] BF16, written (live_tokens <= capacity)
    post_eps None: no post-norm; post_weight None with an eps: no affine step.
    Returns output.
    """
    fn = _FINALIZE
    capacity, top_k, hidden, live, pw, pe, scale = check_finalize(
        fn, expert_outputs, expert_weights, output, post_weight, post_eps, routed_scale)
    tensors = (expert_outputs, expert_weights, output, pw)
    dev, eager, recording = route(fn, _FINALIZE_NAMES, tensors)
    no_autograd_write(fn, "output", output, recording, eager)
    if eager:
        def run():
            _run.finalize(dev, expert_outputs, expert_weights, capacity, live, top_k, hidden, scale, pw, pe, output)
            return ()
        if recording:
            WriteNoDerivative.apply(fn, run, output, *autograd_inputs(tensors, output))
        else:
            run()
            mark_written(output)
    else:
        torch.ops.beammoe.moe_finalize(expert_outputs, expert_weights, output, scale, pw, pe)
    return output


def beam_moe_finalize_norm_residual_norm(x, residual, post_weight, post_eps, next_weight, next_eps, scales,
                                         routed_scale=1.0, *, strategy=None, inplace=False):
    """Finalize x, then add into the residual stream and normalize for the next layer.

    x           an MoEOutput (gemm2_permuted, expert_weights); its live_tokens
                is not read: as in the reference, tokens = residual.shape[0]
    residual    [tokens, hidden] BF16; read only, unless inplace
    post_*      the post-FFN norm of the finalized branch (post_eps None: none)
    next_*      the next layer's input norm (next_eps None: none)
    scales      (branch scale, residual scale) or None
    strategy    None/"auto", "fused" or "unfused" (identical bits)
    inplace     False: hidden is a new tensor (torch.empty_like(residual)) and
                residual is unchanged. True: hidden is written into residual,
                and the returned hidden is residual itself.
    Returns (hidden, normalized): normalized a new [tokens, hidden] BF16
    tensor, or None when next_eps is None.
    """
    fn = _FUSED
    g, w = A.moe_output(fn, x)
    capacity, top_k, hidden, pw, pe, nw, ne, s, scale, st = check_fused(
        fn, g, w, residual, post_weight, post_eps, next_weight, next_eps, scales, routed_scale,
        A.strategy(fn, strategy, _lib.STRATEGIES, _STRATEGY_NAMES))
    A.flag(fn, "inplace", inplace)
    tokens = residual.shape[0]
    tensors = (g, w, residual, pw, nw)
    dev, eager, recording = route(fn, _FUSED_NAMES, tensors)
    return _finish(fn, "moe_finalize_norm_residual_norm", residual, inplace, ne, tensors, eager, recording,
                   lambda h, n: _run.fused(dev, g, w, capacity, tokens, top_k, hidden, scale, pw, pe, residual, s,
                                           nw, ne, h, n, st),
                   (g, w, residual, pw, pe, nw, ne, scales_list(s), scale, st))


def beam_moe_finalize_gather_norm_residual_norm(x, residual, post_weight, post_eps, next_weight, next_eps,
                                                scales, workspace, routed_scale=1.0, *, strategy=None,
                                                inplace=False):
    """The tensor-parallel version: finalize this rank's tokens, all-gather, add, normalize.

    Collective over the workspace's ranks: every rank calls it with the same
    tokens, norms, scales and strategy. tokens T = residual.shape[0]; rank r
    of R owns L = ceil(T / R) tokens, global rows [r*L, min((r+1)*L, T)), and
    x holds only those (local row i = global row r*L + i; capacity >= L;
    x.live_tokens is not used). residual is the full replicated [T, hidden]
    array, read only unless inplace; every rank gets the same bits.
    strategy: None/"auto" (the workspace's rule), "oneshot", "twoshot" or
    "unfused". Returns (hidden, normalized) as
    beam_moe_finalize_norm_residual_norm.
    """
    return _moe_collective(_GATHER, "moe_finalize_gather_norm_residual_norm", _pgather.GATHER, x, residual,
                           post_weight, post_eps, next_weight, next_eps, scales, workspace, routed_scale, strategy,
                           inplace)


def _moe_collective(fn, name, coll, x, residual, post_weight, post_eps, next_weight, next_eps, scales, workspace,
                    routed_scale, strategy, inplace):
    """A collective call on an MoEOutput (coll: _pgather.GATHER or
    ALLREDUCE): in Python where the workspace takes it (a torch.distributed
    group on the CPU, or the all_gather hook: every rank's checks travel
    with the call, _pgather); else through the library: the fused
    operation's checks (gather: x holds a rank's share of the tokens), then
    Workspace._moe_run, or torch.ops.beammoe.<name>."""
    if python_call(workspace, residual, strategy):
        return _pgather.gather(workspace, fn, x, residual, post_weight, post_eps, next_weight, next_eps, scales,
                               routed_scale, strategy, inplace, coll=coll)
    gather = coll == _pgather.GATHER
    g, w = A.moe_output(fn, x)
    capacity, top_k, hidden, pw, pe, nw, ne, s, scale, st = check_fused(
        fn, g, w, residual, post_weight, post_eps, next_weight, next_eps, scales, routed_scale,
        A.strategy(fn, strategy, _lib.STRATEGIES, _STRATEGY_NAMES), gather=gather)
    A.flag(fn, "inplace", inplace)
    tensors = (g, w, residual, pw, nw)
    dev, eager, recording = route(fn, _FUSED_NAMES, tensors)
    handle = check_workspace(fn, workspace, dev)
    tokens = residual.shape[0]
    return _finish(fn, name, residual, inplace, ne, tensors, eager, recording,
                   lambda h, n: workspace._moe_run(gather)(dev, g, w, capacity, tokens, top_k, hidden, scale, pw, pe,
                                                           residual, s, nw, ne, h, n, st),
                   (handle, g, w, residual, pw, pe, nw, ne, scales_list(s), scale, st))


def beam_allreduce_norm_residual_norm(x, residual, pre_weight, pre_eps, next_weight, next_eps, scales, workspace, *,
                                      strategy=None, inplace=False):
    """The dense layer's tensor-parallel ending: the sum over the ranks of
    their partials x, then norm_residual_norm (docs/numerics.md#all-reduce).

    Collective over the workspace's ranks, each with its partial x of every
    token ([tokens, hidden] BF16, tokens = residual.shape[0]) and the same
    residual, norms, scales and strategy (None/"auto", "oneshot", "twoshot"
    or "unfused"); pre_* is the norm of the reduced sum. Every rank gets the
    same bits; one rank gives beam_norm_residual_norm's. Returns (hidden,
    normalized) as beam_norm_residual_norm. A workspace that gathers in
    Python runs it there too (_pgather), with the same bits.
    """
    fn = _ALLREDUCE
    if python_call(workspace, residual, strategy):
        return _pgather.gather(workspace, fn, x, residual, pre_weight, pre_eps, next_weight, next_eps, scales, 1.0,
                               strategy, inplace, coll=_pgather.DENSE)
    tokens, hidden, prw, pre, nw, ne, s = check_nrn(fn, x, residual, pre_weight, pre_eps, next_weight, next_eps,
                                                    scales)
    st = A.strategy(fn, strategy, _lib.STRATEGIES, _STRATEGY_NAMES)
    A.flag(fn, "inplace", inplace)
    tensors = (x, residual, prw, nw)
    dev, eager, recording = route(fn, _NRN_NAMES, tensors)
    handle = check_workspace(fn, workspace, dev)
    return _finish(fn, "allreduce_norm_residual_norm", residual, inplace, ne, tensors, eager, recording,
                   lambda h, n: workspace._run_dense_allreduce(dev, x, tokens, hidden, prw, pre, residual, s, nw,
                                                               ne, h, n, st),
                   (handle, x, residual, prw, pre, nw, ne, scales_list(s), st))


def beam_moe_finalize_allreduce_norm_residual_norm(x, residual, post_weight, post_eps, next_weight, next_eps, scales,
                                                   workspace, routed_scale=1.0, *, strategy=None, inplace=False):
    """The MoE layer's tensor-parallel ending with experts sharded along
    their intermediate dimension: each rank's x (an MoEOutput of every
    token's slots, its partial sums; capacity >= tokens) finalized without
    the post-norm, the sum over the ranks, then the post-norm, residual and
    next norm (docs/numerics.md#all-reduce). Collective as
    beam_allreduce_norm_residual_norm; one rank gives
    beam_moe_finalize_norm_residual_norm's bits. Returns (hidden, normalized).
    """
    return _moe_collective(_MOE_ALLREDUCE, "moe_finalize_allreduce_norm_residual_norm", _pgather.ALLREDUCE, x,
                           residual, post_weight, post_eps, next_weight, next_eps, scales, workspace, routed_scale,
                           strategy, inplace)


def beam_norm_residual_norm(x, residual, pre_weight=None, pre_eps=None, next_weight=None, next_eps=None,
                            scales=None, *, inplace=False):
    """hidden = bf16(bf16(N(x) * s0) + bf16(residual * s1)); normalized = N(hidden).

    The reference's argument order: (x, residual, pre_weight, pre_eps,
    next_weight, next_eps, scales). x, residual [tokens, hidden] BF16;
    pre_*/next_* optional norms as above; scales None or a pair. hidden is a
    new tensor, or residual itself with inplace=True. Returns
    (hidden, normalized | None).
    """
    fn = _NRN
    tokens, hidden, prw, pre, nw, ne, s = check_nrn(fn, x, residual, pre_weight, pre_eps, next_weight, next_eps,
                                                    scales)
    A.flag(fn, "inplace", inplace)
    tensors = (x, residual, prw, nw)
    dev, eager, recording = route(fn, _NRN_NAMES, tensors)
    return _finish(fn, "norm_residual_norm", residual, inplace, ne, tensors, eager, recording,
                   lambda h, n: _run.norm_residual_norm(dev, x, residual, tokens, hidden, prw, pre, s, nw, ne, h, n),
                   (x, residual, prw, pre, nw, ne, scales_list(s)))


# The same function under the short name.
norm_residual_norm = beam_norm_residual_norm
