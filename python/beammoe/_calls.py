"""How a call runs: straight to the library, or through torch.ops.beammoe.*.

Shared by the functions (ops.py), the gather run by Python (_pgather.py) and
the prepared call (_prepared.py): where the tensors are, whether a call may
go straight to the library (route, placement), and the autograd guards of
the calls that do (no_autograd_write, NoDerivative, WriteNoDerivative,
run_eager). It imports torch and _checks.py only: every module that runs a
call can import it, and the package's imports go one way (ops.py's
docstring).
"""
import torch

from . import _checks as A
from ._checks import Tensor

# torch.library.custom_op and register_fake (torch >= 2.4): the operations
# are torch operators then (_torch_ops.py registers them when ops.py imports
# it), and a call that cannot go straight to the library goes through them.
HAVE_TORCH_OPS = hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_fake")

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


def _bump_each(tensors):
    for t in tensors:
        _increment_version(t)


def _takes_many():
    """Whether increment_version takes several tensors at once (one call
    instead of one per tensor: about 0.3 us less per prepared call)."""
    try:
        _increment_version(())
        return True
    except (TypeError, RuntimeError, AttributeError):
        return False


# Bump the version counters of several tensors written in place (none an
# inference tensor).
increment_versions = _increment_version if _takes_many() else _bump_each

_CPU = torch.device("cpu")
_Parameter = torch.nn.Parameter  # a model's weights: plain tensors for the call
_tracing = torch.jit.is_tracing


def operator_needed():
    """Whether a call must be the torch operator whatever its tensors: under
    torch.jit.trace, and (with torch.library) under torch.compile or a
    dispatch mode."""
    return _tracing() or (HAVE_TORCH_OPS and (_compiling() or (_dispatch_modes is not None
                                                               and bool(_dispatch_modes()))))


def route(fn, names, tensors):
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
                return _route_any(fn, names, tensors)
            if t.requires_grad:
                grad = True
    recording = grad and torch.is_grad_enabled()
    if _tracing() or not HAVE_TORCH_OPS or _compiling() or (_dispatch_modes is not None and _dispatch_modes()):
        return _route_any(fn, names, tensors)
    return _CPU, True, recording


def _route_any(fn, names, tensors):
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
    dev, eager, recording = route(fn, names, tensors)
    return dev, eager and not (recording and HAVE_TORCH_OPS)


def no_autograd_write(fn, name, written, recording, eager):
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


def mark_written(t):
    """Bump the version counter of a tensor written in place by the library."""
    if not t.is_inference():
        _increment_version(t)


def _refuse(name):
    raise RuntimeError("%s: beammoe operations have no derivative (inference only); call them under "
                       "torch.no_grad() or torch.inference_mode(), or on detached tensors" % name)


class NoDerivative(torch.autograd.Function):
    """New results of a call that autograd records (eager, without the
    operator): run the call, and refuse a backward pass through them."""

    @staticmethod
    def forward(ctx, name, run, *inputs):
        ctx.name = name
        return run()

    @staticmethod
    def backward(ctx, *grads):
        _refuse(ctx.name)


class WriteNoDerivative(torch.autograd.Function):
    """An in-place write that autograd records: run(), which writes `written`
    and returns a tuple of new tensors; `written` is marked dirty, so it and
    the new tensors carry this backward function, which refuses."""

    @staticmethod
    def forward(ctx, name, run, written, *inputs):
        ctx.name = name
        new = run()
        mark_written(written)
        ctx.mark_dirty(written)
        return (written,) + new

    @staticmethod
    def backward(ctx, *grads):
        _refuse(ctx.name)


def scales_list(s):
    """The checked scales (a pair or None) as the torch operators take them."""
    return list(s) if s is not None else None


def autograd_inputs(tensors, written=None):
    return [t for t in tensors if t is not None and t is not written]


def run_eager(fn, residual, inplace, ne, tensors, compute, recording=False):
    """(hidden, normalized) computed by compute(hidden, normalized) on new
    tensors, or with hidden = residual when inplace; autograd's records
    refuse a backward pass through them."""
    if inplace:
        normalized = torch.empty_like(residual) if ne is not None else None
        if recording:
            def run():
                compute(residual, normalized)
                return (normalized,) if normalized is not None else ()
            WriteNoDerivative.apply(fn, run, residual, *autograd_inputs(tensors, residual))
            return residual, normalized
        compute(residual, normalized)
        mark_written(residual)
        return residual, normalized
    if recording:
        def run():
            h = torch.empty_like(residual)
            n = torch.empty_like(residual) if ne is not None else None
            compute(h, n)
            return (h, n) if n is not None else h
        outs = NoDerivative.apply(fn, run, *autograd_inputs(tensors))
        return (outs[0], outs[1]) if ne is not None else (outs, None)
    hidden = torch.empty_like(residual)
    normalized = torch.empty_like(residual) if ne is not None else None
    compute(hidden, normalized)
    return hidden, normalized
