"""A prepared call of the fused operation: checked once, then one ctypes call.

prepare_finalize_norm_residual_norm(...) takes the arguments of
beam_moe_finalize_norm_residual_norm, with preallocated outputs, checks them
all once (the Python checks and the library's own, on zero rows) and
returns a PreparedCall. Calling it runs the library on the same tensors: an
inference engine refills its buffers in place (the expert results, the
routing weights, the residual stream) and calls it once per step. Per call
it only checks that no tensor was reallocated (its data pointer), makes the
one ctypes call with the arguments it built, and bumps the version counter
of the written tensors; it costs about as much as the library's call itself.
"""
import torch

from . import _calls
from . import _lib
from . import _run
from . import _checks as A
from ._checks import BF16, Tensor

__all__ = ["PreparedCall", "prepare_finalize_norm_residual_norm"]

_FN = "prepare_finalize_norm_residual_norm"
_STRATEGY_NAMES = '"auto", "fused" or "unfused"'


class PreparedCall:
    """One operation with every argument checked and converted once.

    call() runs it and returns (hidden, normalized | None): the same tensors
    every call (hidden is the residual itself with inplace=True). The
    tensors it was prepared with must keep their storage (no resize_, set_
    or .data =): a tensor whose data pointer changed is refused
    (RuntimeError; prepare again). It is for inference: tensors that
    require grad are refused when it is prepared.
    """

    __slots__ = ("name", "_f", "_args", "_ops", "_check", "_written", "_result", "_keep", "_cuda", "_index")

    def __init__(self, name, ops, member, args, check, written, result, keep, cuda_index):
        self.name = name
        self._ops = ops  # the backend's table: its last_error explains a failure
        self._f = getattr(ops, member)
        self._args = args
        self._check = check  # ((tensor, data_ptr), ...)
        self._written = written  # tensors to bump (not inference tensors)
        self._result = result
        self._keep = keep  # norm structs, scales: alive as long as the call
        self._cuda = cuda_index is not None
        self._index = cuda_index

    def __call__(self):
        for t, p in self._check:
            if t.data_ptr() != p:
                raise RuntimeError("%s: a tensor of the prepared call now has another data pointer (reallocated by "
                                   "resize_, set_ or .data =); prepare the call again" % self.name)
        if self._cuda:
            st = _run.cuda_call(self._f, self._index, self._args)
        else:
            st = self._f(*self._args)
        if st:
            _lib.check(st, self.name, self._ops)
        if self._written:
            _calls.increment_versions(self._written)
        return self._result

    def __repr__(self):
        return "PreparedCall(%s)" % self.name


def _output(fn, name, t, like):
    """The output t, checked to be like `like`; a new one where t is None."""
    if t is None:
        return torch.empty_like(like)
    A.tensor(fn, name, t, BF16, 2)
    if t.shape != like.shape:
        A.shape(fn, name, t, tuple(like.shape))
    if t.device != like.device:
        raise ValueError("%s: %s is on %s but residual is on %s" % (fn, name, t.device, like.device))
    return t


def prepare_finalize_norm_residual_norm(x, residual, post_weight, post_eps, next_weight, next_eps, scales,
                                        routed_scale=1.0, *, strategy=None, inplace=True, hidden=None,
                                        normalized=None):
    """A PreparedCall of beam_moe_finalize_norm_residual_norm on these tensors.

    The arguments are the function's. inplace=True (the default) writes
    hidden into residual; inplace=False writes it into `hidden` (a
    [tokens, hidden] BF16 tensor, allocated here when None). `normalized`:
    the next norm's output, allocated here when None (next_eps given), and
    None without a next norm. The call returns (hidden, normalized | None),
    the same tensors every time, with the bits of the function.
    """
    fn = _FN
    g, w = A.moe_output(fn, x)
    capacity, top_k, hidden_size, pw, pe, nw, ne, s, scale, st = A.check_fused(
        fn, g, w, residual, post_weight, post_eps, next_weight, next_eps, scales, routed_scale,
        A.strategy(fn, strategy, _lib.STRATEGIES, _STRATEGY_NAMES))
    A.flag(fn, "inplace", inplace)
    tensors = (g, w, residual, pw, nw)
    dev, eager, _ = _calls.route(fn, A.FUSED_NAMES, tensors)
    if not eager or dev.type == "meta":
        raise ValueError("%s: a prepared call takes plain CPU or CUDA tensors, outside torch.compile and "
                         "dispatch modes" % fn)
    if inplace:
        if hidden is not None:
            raise ValueError("%s: hidden is residual itself with inplace=True; pass hidden=None" % fn)
        hidden = residual
    else:
        hidden = _output(fn, "hidden", hidden, residual)
    if ne is None:
        if normalized is not None:
            raise ValueError("%s: normalized is given but next_eps is None (it would not be written)" % fn)
    else:
        normalized = _output(fn, "normalized", normalized, residual)
    every = [t for t in (g, w, residual, pw, nw, hidden, normalized) if t is not None]
    for t in every:
        if t.requires_grad:
            raise RuntimeError("%s: a prepared call is for inference: a tensor requires grad (call .detach(), or "
                               "prepare under torch.no_grad())" % fn)
    # The library's own checks (eps, scales, top_k, hidden, overlap), once.
    _run.fused(dev, g, w, capacity, 0, top_k, hidden_size, scale, pw, pe, residual, s, nw, ne, hidden,
               normalized, st)
    tokens = residual.shape[0]

    keep_post, post = _run._norm(pw, pe)  # the structs the function's calls take too
    keep_next, nxt = _run._norm(nw, ne)
    keep_s, sp = _run._scales_ref(s)
    args = (_run.addr(g), _run.addr(w), capacity, tokens, top_k, hidden_size, scale, post, _run.addr(residual), sp,
            nxt, _run.addr(hidden), _run.addr(normalized) if normalized is not None else None, st)
    cuda = None
    if dev.type == "cpu":
        args = args + (None,)
    else:
        cuda = dev.index if dev.index is not None else torch.cuda.current_device()
    check = tuple((t, t.data_ptr()) for t in {id(t): t for t in every}.values())
    written = tuple(t for t in ((hidden, normalized) if not inplace else (residual, normalized))
                    if t is not None and not t.is_inference())
    return PreparedCall(fn, _run._backend(dev), "moe_finalize_norm_residual_norm", args, check, written,
                        (hidden, normalized), (keep_post, keep_next, keep_s, g, w, residual, pw, nw), cuda)
