"""The operations with the reference signatures and semantics, over torch tensors.

Every function checks its arguments (_tensors.py), then either calls the
library at once (eager calls on plain CPU or CUDA tensors: the short path,
_run.py) or goes through the registered torch operation torch.ops.beammoe.*
(_torch_ops.py): under torch.compile or torch.jit.trace, on tensor
subclasses or meta tensors, under a dispatch mode, and when autograd records
a call with new results (so that it refuses a backward pass; an in-place
write that autograd records runs eagerly and marks the written tensor, whose
backward refuses). Both paths check the same rules, give the same bits and
write the same tensors. The gather of a CPU workspace over a process group,
and of any workspace with an all_gather hook on its unfused calls, runs in
_pgather.py.

Results are new tensors, as in the reference: hidden is torch.empty_like
(residual), and residual is left as it was. inplace=True writes hidden into
residual instead (the residual-stream update of inference engines) and
returns residual itself, with its version counter bumped like any in-place
torch op.
"""
import torch

from . import _lib
from . import _run
from . import _tensors as A
from ._tensors import BF16, Tensor

__all__ = [
    "MoEOutput",
    "beam_moe_finalize",
    "beam_moe_finalize_norm_residual_norm",
    "beam_moe_finalize_gather_norm_residual_norm",
    "beam_norm_residual_norm",
    "norm_residual_norm",
]

_FINALIZE = "beam_moe_finalize"
_FUSED = "beam_moe_finalize_norm_residual_norm"
_GATHER = "beam_moe_finalize_gather_norm_residual_norm"
_NRN = "beam_norm_residual_norm"
_STRATEGY_NAMES = '"auto", "fused", "unfused", "oneshot" or "twoshot"'
_FINALIZE_NAMES = ("expert_outputs", "expert_weights", "output", "post_weight")
_FUSED_NAMES = ("x.gemm2_permuted", "x.expert_weights", "residual", "post_weight", "next_weight")
_NRN_NAMES = ("x", "residual", "pre_weight", "next_weight")

HAVE_TORCH_OPS = False  # set at the end of this module when torch.library takes the operations

if hasattr(torch, "compiler") and hasattr(torch.compiler, "is_compiling"):
    _compiling = torch.compiler.is_compiling
elif hasattr(torch, "_dynamo") and hasattr(torch._dynamo, "is_compiling"):  # pragma: no cover
    _compiling = torch._dynamo.is_compiling
else:
    def _compiling():
        return False

_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", None)
if hasattr(torch.autograd, "graph") and hasattr(torch.autograd.graph, "increment_version"):
    _increment_version = torch.autograd.graph.increment_version
else:  # torch < 2.1: a copy onto itself bumps the counter and changes no bit
    def _increment_version(t):
        t.copy_(t)


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


# ---- checks shared by the functions and the torch.library operations --------

def check_finalize(fn, g, w, output, pw, pe, routed_scale):
    """(capacity, top_k, hidden, live, pw, pe, scale) or an exception."""
    capacity, top_k, hidden = A.expert_arrays(fn, "expert_outputs", g, "expert_weights", w)
    A.tensor(fn, "output", output, BF16, 2)
    live, oh = output.shape
    if oh != hidden:
        raise ValueError("%s: output has shape %s but the expert outputs have hidden=%d"
                         % (fn, tuple(output.shape), hidden))
    A.rows_cover(fn, "expert_outputs", g, "expert_weights", w, top_k, live, "live_tokens")
    pw, pe = A.norm(fn, "post_weight", pw, "post_eps", pe, hidden)
    scale = A.number(fn, "routed_scale", routed_scale)
    return capacity, top_k, hidden, live, pw, pe, scale


def _plain_norm(weight, eps, hidden):
    """True when A.norm accepts (weight, eps) as they are: no norm, or a
    Python float eps in the float32 range with no weight or a contiguous
    [hidden] BF16 weight."""
    if eps is None:
        return weight is None
    if type(eps) is not float or not -A.FLT_MAX <= eps <= A.FLT_MAX:
        return False
    return weight is None or (isinstance(weight, Tensor) and weight.dtype is BF16 and weight.dim() == 1
                              and weight.shape[0] == hidden and weight.is_contiguous())


def check_fused(fn, g, w, residual, pw, pe, nw, ne, scales, routed_scale, strategy, gather=False):
    """The rules of the local and the gathered fused operation (strategy: the
    enum value): (capacity, top_k, hidden, pw, pe, nw, ne, scales, scale, strategy).
    The local operation reads residual.shape[0] tokens of the expert arrays;
    the gather a rank's share (checked with the workspace)."""
    # The common case in one expression (a subset of what the checks below
    # accept); anything else takes the checks, which name the broken rule.
    if isinstance(g, Tensor) and isinstance(w, Tensor) and isinstance(residual, Tensor) and g.dtype is BF16 \
            and w.dtype is A.FP32 and residual.dtype is BF16 and g.dim() == 2 and w.dim() == 2 \
            and residual.dim() == 2 and g.is_contiguous() and w.is_contiguous() and residual.is_contiguous() \
            and type(routed_scale) is float and -A.FLT_MAX <= routed_scale <= A.FLT_MAX \
            and type(strategy) is int:
        capacity, top_k = w.shape
        hidden = g.shape[1]
        if g.shape[0] == capacity * top_k and residual.shape[1] == hidden and _plain_norm(pw, pe, hidden) \
                and _plain_norm(nw, ne, hidden):
            return (capacity, top_k, hidden, pw, pe, nw, ne, None if scales is None else A.scales(fn, scales),
                    routed_scale, strategy)
    capacity, top_k, hidden = A.expert_arrays(fn, "x.gemm2_permuted", g, "x.expert_weights", w)
    A.tensor(fn, "residual", residual, BF16, 2)
    if residual.shape[1] != hidden:
        raise ValueError("%s: residual has shape %s but x.gemm2_permuted has hidden=%d"
                         % (fn, tuple(residual.shape), hidden))
    if not gather:
        A.rows_cover(fn, "x.gemm2_permuted", g, "x.expert_weights", w, top_k, residual.shape[0],
                     "residual.shape[0]")
    pw, pe = A.norm(fn, "post_weight", pw, "post_eps", pe, hidden)
    nw, ne = A.norm(fn, "next_weight", nw, "next_eps", ne, hidden)
    s = A.scales(fn, scales)
    scale = A.number(fn, "routed_scale", routed_scale)
    if type(strategy) is not int:  # the functions pass the enum value of the strategy's name
        raise TypeError("%s: strategy must be the library's enum value (an int), got %s"
                        % (fn, type(strategy).__name__))
    return capacity, top_k, hidden, pw, pe, nw, ne, s, scale, strategy


def check_nrn(fn, x, residual, prw, pre, nw, ne, scales):
    """(tokens, hidden, prw, pre, nw, ne, scales)."""
    A.tensor(fn, "x", x, BF16, 2)
    A.tensor(fn, "residual", residual, BF16, 2)
    if residual.shape != x.shape:
        A.shape(fn, "residual", residual, tuple(x.shape))
    tokens, hidden = x.shape
    prw, pre = A.norm(fn, "pre_weight", prw, "pre_eps", pre, hidden)
    nw, ne = A.norm(fn, "next_weight", nw, "next_eps", ne, hidden)
    s = A.scales(fn, scales)
    return tokens, hidden, prw, pre, nw, ne, s


def check_workspace(fn, workspace, dev):
    """The workspace's handle, for tensors on `dev`."""
    from .workspace import Workspace  # a late import: workspace imports this module
    if not isinstance(workspace, Workspace):
        raise TypeError("%s: workspace must be a beammoe.Workspace, got %s" % (fn, type(workspace).__name__))
    if dev.type != "meta" and dev != workspace.device:
        raise ValueError("%s: the tensors are on %s but the workspace is on %s" % (fn, dev, workspace.device))
    return workspace.handle  # raises once closed


# ---- how a call runs -----------------------------------------------------------

def _placement(fn, names, tensors):
    """(device, eager, recording): the one device of the tensors (None
    skipped; a ValueError names two that differ); whether the call may go
    straight to the library: plain CPU or CUDA tensors (or parameters), no
    torch.compile, dispatch mode or torch.jit.trace (or no torch.library to
    go through); and whether autograd records it (a tensor requires grad
    and grad mode is on)."""
    grad = False
    for t in tensors:  # the common case first: plain CPU tensors
        if t is not None:
            if not t.is_cpu or (type(t) is not Tensor and type(t) is not _Parameter):
                return _placement_any(fn, names, tensors)
            if t.requires_grad:
                grad = True
    recording = grad and torch.is_grad_enabled()
    if _tracing() or not HAVE_TORCH_OPS or _compiling() or (_dispatch_modes is not None and _dispatch_modes()):
        return _placement_any(fn, names, tensors)
    return _CPU, True, recording


def _placement_any(fn, names, tensors):
    dev = None
    plain = True
    grad = False
    for t in tensors:
        if t is None:
            continue
        if dev is None:
            dev = t.device
        elif t.device != dev:
            A.same_device(fn, names, tensors)  # names the two
        if type(t) is not Tensor and type(t) is not _Parameter:
            plain = False
        if t.requires_grad:
            grad = True
    if dev != _CPU and dev.type not in A.DEVICES:
        A.same_device(fn, names, tensors)  # names the device
    recording = grad and torch.is_grad_enabled()
    if _tracing():
        if not HAVE_TORCH_OPS:
            raise RuntimeError("%s: torch.jit.trace cannot record a beammoe call with torch %s: it records the "
                               "torch.ops.beammoe operators, which need torch >= 2.4 (the trace would hold no "
                               "call and return uninitialized tensors); call the function outside the trace"
                               % (fn, torch.__version__))
        return dev, False, recording
    if not HAVE_TORCH_OPS:
        if dev.type == "meta":
            raise ValueError("%s: meta tensors need torch.library (torch >= 2.4)" % fn)
        return dev, True, recording
    if not plain or dev.type == "meta" or _compiling():
        return dev, False, recording
    if _dispatch_modes is not None and _dispatch_modes():
        return dev, False, recording
    return dev, True, recording


def placement(fn, names, tensors):
    """(device, direct): the one device of the tensors and whether the call
    goes straight to the library (see _placement); with torch.library, a
    call that autograd records goes through the operator, whose backward
    refuses."""
    dev, eager, recording = _placement(fn, names, tensors)
    return dev, eager and not (recording and HAVE_TORCH_OPS)


_CPU = torch.device("cpu")
_Parameter = torch.nn.Parameter  # a model's weights: plain tensors for the call
_tracing = torch.jit.is_tracing


def _no_autograd_write(fn, name, written, recording, eager):
    """An in-place write while autograd records. Refused, as torch refuses
    it, for a leaf that requires grad; and outside plain eager calls (under
    torch.compile, a dispatch mode, on tensor subclasses). An eager call
    runs: the written tensor then carries a backward function that refuses
    (the library has no derivative), never a silently wrong gradient."""
    if not recording:
        return
    if written.requires_grad and written.is_leaf:
        raise RuntimeError("%s: %s would be written in place while autograd records (a leaf Variable that "
                           "requires grad is being used in an in-place operation); call it under torch.no_grad() "
                           "or torch.inference_mode()" % (fn, name))
    if not eager:
        raise RuntimeError("%s: %s would be written in place while autograd records (a tensor of the call requires "
                           "grad) outside a plain eager call; beammoe operations have no derivative: call them "
                           "under torch.no_grad() or torch.inference_mode()" % (fn, name))


def _written(t):
    """Bump the version counter of a tensor written in place by the library."""
    if not t.is_inference():
        _increment_version(t)


def _refuse(name):
    raise RuntimeError("%s: beammoe operations have no derivative (inference only); call them under "
                       "torch.no_grad() or torch.inference_mode(), or on detached tensors" % name)


class _NoDerivative(torch.autograd.Function):
    """New results of a call that autograd records (eager, without the
    operator): run the call, and refuse a backward pass through them."""

    @staticmethod
    def forward(ctx, name, run, *inputs):
        ctx.name = name
        return run()

    @staticmethod
    def backward(ctx, *grads):
        _refuse(ctx.name)


class _WriteNoDerivative(torch.autograd.Function):
    """An in-place write that autograd records: run(), which writes `written`
    and returns a tuple of new tensors; `written` is marked dirty, so it and
    the new tensors carry this backward function, which refuses."""

    @staticmethod
    def forward(ctx, name, run, written, *inputs):
        ctx.name = name
        new = run()
        _written(written)
        ctx.mark_dirty(written)
        return (written,) + new

    @staticmethod
    def backward(ctx, *grads):
        _refuse(ctx.name)


def _inputs(tensors, written=None):
    return [t for t in tensors if t is not None and t is not written]


def _eager(fn, residual, inplace, ne, tensors, compute, recording=False):
    """(hidden, normalized) computed by compute(hidden, normalized) on new
    tensors, or with hidden = residual when inplace; autograd's records
    refuse a backward pass through them."""
    if inplace:
        normalized = torch.empty_like(residual) if ne is not None else None
        if recording:
            def run():
                compute(residual, normalized)
                return (normalized,) if normalized is not None else ()
            _WriteNoDerivative.apply(fn, run, residual, *_inputs(tensors, residual))
            return residual, normalized
        compute(residual, normalized)
        _written(residual)
        return residual, normalized
    if recording:
        def run():
            h = torch.empty_like(residual)
            n = torch.empty_like(residual) if ne is not None else None
            compute(h, n)
            return (h, n) if n is not None else h
        outs = _NoDerivative.apply(fn, run, *_inputs(tensors))
        return (outs[0], outs[1]) if ne is not None else (outs, None)
    hidden = torch.empty_like(residual)
    normalized = torch.empty_like(residual) if ne is not None else None
    compute(hidden, normalized)
    return hidden, normalized


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
    dev, eager, recording = _placement(fn, _FINALIZE_NAMES, tensors)
    _no_autograd_write(fn, "output", output, recording, eager)
    if eager:
        if recording:
            def run():
                _run.finalize(dev, expert_outputs, expert_weights, capacity, live, top_k, hidden, scale, pw, pe,
                              output)
                return ()
            _WriteNoDerivative.apply(fn, run, output, *_inputs(tensors, output))
        else:
            _run.finalize(dev, expert_outputs, expert_weights, capacity, live, top_k, hidden, scale, pw, pe,
                          output)
            _written(output)
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
    dev, eager, recording = _placement(fn, _FUSED_NAMES, tensors)
    if inplace:
        _no_autograd_write(fn, "residual", residual, recording, eager)
    if eager and not (recording and HAVE_TORCH_OPS and not inplace):
        if not inplace and not recording:  # the common eager call, written out
            h = torch.empty_like(residual)
            n = torch.empty_like(residual) if ne is not None else None
            _run.fused(dev, g, w, capacity, tokens, top_k, hidden, scale, pw, pe, residual, s, nw, ne, h, n, st)
            return h, n
        return _eager(fn, residual, inplace, ne, tensors, lambda h, n: _run.fused(
            dev, g, w, capacity, tokens, top_k, hidden, scale, pw, pe, residual, s, nw, ne, h, n, st), recording)
    sl = list(s) if s is not None else None
    if inplace:
        n = torch.ops.beammoe.moe_finalize_norm_residual_norm_(g, w, residual, pw, pe, nw, ne, sl, scale, st)
        return residual, (n if ne is not None else None)
    h, n = torch.ops.beammoe.moe_finalize_norm_residual_norm(g, w, residual, pw, pe, nw, ne, sl, scale, st)
    return h, (n if ne is not None else None)


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
    fn = _GATHER
    ws = workspace
    if isinstance(ws, _Workspace) and ws._python_gather(residual, strategy) and not _tracing() \
            and not (HAVE_TORCH_OPS and (_compiling() or (_dispatch_modes is not None and _dispatch_modes()))):
        # Over a torch.distributed group on the CPU, or through the workspace's
        # all_gather hook: every rank's checks travel with the call (_pgather).
        return _pgather.gather(ws, fn, x, residual, post_weight, post_eps, next_weight, next_eps, scales,
                               routed_scale, strategy, inplace)
    g, w = A.moe_output(fn, x)
    capacity, top_k, hidden, pw, pe, nw, ne, s, scale, st = check_fused(
        fn, g, w, residual, post_weight, post_eps, next_weight, next_eps, scales, routed_scale,
        A.strategy(fn, strategy, _lib.STRATEGIES, _STRATEGY_NAMES), gather=True)
    A.flag(fn, "inplace", inplace)
    tensors = (g, w, residual, pw, nw)
    dev, eager, recording = _placement(fn, _FUSED_NAMES, tensors)
    handle = check_workspace(fn, workspace, dev)
    tokens = residual.shape[0]
    if inplace:
        _no_autograd_write(fn, "residual", residual, recording, eager)
    if eager and not (recording and HAVE_TORCH_OPS and not inplace):
        return _eager(fn, residual, inplace, ne, tensors, lambda h, n: workspace._run_gather(
            dev, g, w, capacity, tokens, top_k, hidden, scale, pw, pe, residual, s, nw, ne, h, n, st), recording)
    sl = list(s) if s is not None else None
    if inplace:
        n = torch.ops.beammoe.moe_finalize_gather_norm_residual_norm_(handle, g, w, residual, pw, pe, nw, ne, sl,
                                                                      scale, st)
        return residual, (n if ne is not None else None)
    h, n = torch.ops.beammoe.moe_finalize_gather_norm_residual_norm(handle, g, w, residual, pw, pe, nw, ne, sl,
                                                                    scale, st)
    return h, (n if ne is not None else None)


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
    dev, eager, recording = _placement(fn, _NRN_NAMES, tensors)
    if inplace:
        _no_autograd_write(fn, "residual", residual, recording, eager)
    if eager and not (recording and HAVE_TORCH_OPS and not inplace):
        return _eager(fn, residual, inplace, ne, tensors, lambda h, n: _run.norm_residual_norm(
            dev, x, residual, tokens, hidden, prw, pre, s, nw, ne, h, n), recording)
    sl = list(s) if s is not None else None
    if inplace:
        n = torch.ops.beammoe.norm_residual_norm_(x, residual, prw, pre, nw, ne, sl)
        return residual, (n if ne is not None else None)
    h, n = torch.ops.beammoe.norm_residual_norm(x, residual, prw, pre, nw, ne, sl)
    return h, (n if ne is not None else None)


# The same function under the short name.
norm_residual_norm = beam_norm_residual_norm

from . import _pgather  # noqa: E402  (the gather in Python; needs the checks above)
from . import _torch_ops  # noqa: E402  (registers torch.ops.beammoe.*; needs the checks above)
from .workspace import Workspace as _Workspace  # noqa: E402

HAVE_TORCH_OPS = _torch_ops.REGISTERED
