"""The three operations with the reference signatures, over torch tensors.

Every function checks its tensors (see _tensors.py), selects the backend from
the tensors' device, and calls libbeammoe; the library checks the rest of
the contract and its message becomes the ValueError (see _errors.py).
CUDA calls run on torch's current stream of the tensors' device, with that
device made current for the call; they are asynchronous like any torch op.
"""
import contextlib
import ctypes

import torch

from . import _lib
from . import _tensors as T
from ._lib import BeamNorm

__all__ = [
    "MoEOutput",
    "beam_moe_finalize",
    "beam_moe_finalize_norm_residual_norm",
    "beam_moe_finalize_gather_norm_residual_norm",
    "norm_residual_norm",
    "beam_norm_residual_norm",
]


class MoEOutput:
    """An unfinalized MoE output: what the second grouped GEMM leaves.

    gemm2_permuted  [capacity * top_k, hidden] BF16, token-major (row
                    t * top_k + k is token t's slot k); [capacity, top_k,
                    hidden] is accepted too
    expert_weights  [capacity, top_k] FP32 routing weights
    live_tokens     rows that hold tokens (None: as many as the residual);
                    rows past them are never read
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


def _strategy(fn, s):
    if s is not None and not isinstance(s, str):
        raise TypeError("%s: strategy must be a string or None, got %s" % (fn, type(s).__name__))
    key = s.lower() if isinstance(s, str) else None
    if key not in _lib.STRATEGIES:
        raise ValueError("%s: strategy=%r: unknown strategy (use None, \"auto\", \"fused\", "
                         "\"unfused\", \"oneshot\" or \"twoshot\")" % (fn, s))
    return _lib.STRATEGIES[key]


@contextlib.contextmanager
def _device(dev, select_backend=True):
    """Run a call on `dev`: hold the backend of its device type (unless a
    workspace fixes the backend), make a CUDA device current, and yield the
    stream to pass (None for the CPU)."""
    kind = "cpu" if dev is None or dev.type == "cpu" else "cuda"
    with _lib.backend(kind) if select_backend else contextlib.nullcontext():
        if kind == "cpu":
            yield None
            return
        with torch.cuda.device(dev):
            yield ctypes.c_void_p(torch.cuda.current_stream(dev).cuda_stream)


def _norm_struct(weight, eps):
    """A pointer to a beam_norm (or None) for (weight, eps) from T.norm."""
    if eps is None:
        return None
    return ctypes.pointer(BeamNorm(_ptr(weight), eps))


def _scales_array(s):
    return (ctypes.c_float * 2)(*s) if s is not None else None


# An empty tensor's data_ptr() is 0, but the library tells "absent" (NULL)
# from "present, no rows" (e.g. normalized must be non-NULL exactly when
# next_norm is given); an empty tensor passes this address instead. The
# library never touches a pointer whose extent is zero bytes.
_EMPTY = (ctypes.c_uint64 * 2)()


def _ptr(t):
    """The address to pass for an optional tensor (None: NULL)."""
    if t is None:
        return None
    p = t.data_ptr()
    return p if p else ctypes.addressof(_EMPTY)


def beam_moe_finalize(expert_outputs, expert_weights, output, routed_scale=1.0, post_weight=None,
                      post_eps=None):
    """output[t] = post_norm(bf16(bf16(sum_k w[t,k] * x[t,k]) * routed_scale)) for t < output.shape[0].

    expert_outputs  [capacity, top_k, hidden] or [capacity * top_k, hidden] BF16
    expert_weights  [capacity, top_k] FP32
    output          [live_tokens, hidden] BF16, written (live_tokens <= capacity)
    post_eps None: no post-norm; post_weight None with an eps: no affine step.
    Returns output.
    """
    fn = "beam_moe_finalize"
    capacity, top_k, hidden = T.expert_arrays(fn, "expert_outputs", expert_outputs,
                                              "expert_weights", expert_weights)
    T.tensor(fn, "output", output, T.BF16, 2)
    if output.shape[1] != hidden:
        raise ValueError("%s: output has shape %s but the expert outputs have hidden=%d"
                         % (fn, tuple(output.shape), hidden))
    pw, pe = T.norm(fn, "post_weight", post_weight, "post_eps", post_eps, hidden)
    scale = T.number(fn, "routed_scale", routed_scale)
    dev = T.same_device(fn, [("expert_outputs", expert_outputs), ("expert_weights", expert_weights),
                             ("output", output), ("post_weight", pw)])
    lib = _lib.library()
    with _device(dev) as stream:
        st = lib.beam_moe_finalize(_ptr(expert_outputs), _ptr(expert_weights), capacity,
                                   output.shape[0], top_k, hidden, scale, _norm_struct(pw, pe),
                                   _ptr(output), stream)
    _lib.check(st, fn)
    return output


def _fused_args(fn, x, residual, post_weight, post_eps, next_weight, next_eps, scales, routed_scale,
                strategy):
    """Checks shared by the local and the gathered fused operation."""
    g, w, live = T.moe_output(fn, x)
    capacity, top_k, hidden = T.expert_arrays(fn, "x.gemm2_permuted", g, "x.expert_weights", w)
    T.tensor(fn, "residual", residual, T.BF16, 2)
    if residual.shape[1] != hidden:
        raise ValueError("%s: residual has shape %s but x.gemm2_permuted has hidden=%d"
                         % (fn, tuple(residual.shape), hidden))
    pw, pe = T.norm(fn, "post_weight", post_weight, "post_eps", post_eps, hidden)
    nw, ne = T.norm(fn, "next_weight", next_weight, "next_eps", next_eps, hidden)
    return dict(g=g, w=w, live=live, capacity=capacity, top_k=top_k, hidden=hidden, pw=pw, pe=pe,
                nw=nw, ne=ne, scales=T.scales(fn, scales),
                scale=T.number(fn, "routed_scale", routed_scale), strategy=_strategy(fn, strategy))


def beam_moe_finalize_norm_residual_norm(x, residual, post_weight, post_eps, next_weight, next_eps, scales,
                                         routed_scale=1.0, *, strategy=None):
    """Finalize x, then add into the residual stream and normalize for the next layer.

    x           an MoEOutput (gemm2_permuted, expert_weights, live_tokens)
    residual    [tokens, hidden] BF16; tokens = x.live_tokens when given (it
                must equal residual.shape[0]). hidden is written IN PLACE into
                residual (the residual-stream update of inference engines).
    post_*      the post-FFN norm of the finalized branch (post_eps None: none)
    next_*      the next layer's input norm (next_eps None: none)
    scales      (branch scale, residual scale) or None
    strategy    None/"auto", "fused" or "unfused" (identical bits)
    Returns (hidden, normalized): hidden is residual itself, normalized a new
    [tokens, hidden] BF16 tensor, or None when next_eps is None.
    """
    fn = "beam_moe_finalize_norm_residual_norm"
    a = _fused_args(fn, x, residual, post_weight, post_eps, next_weight, next_eps, scales, routed_scale,
                    strategy)
    tokens = residual.shape[0]
    if a["live"] is not None and a["live"] != tokens:
        raise ValueError("%s: x.live_tokens=%d must equal residual.shape[0]=%d"
                         % (fn, a["live"], tokens))
    dev = T.same_device(fn, [("x.gemm2_permuted", a["g"]), ("x.expert_weights", a["w"]),
                             ("residual", residual), ("post_weight", a["pw"]), ("next_weight", a["nw"])])
    normalized = torch.empty_like(residual) if a["ne"] is not None else None
    lib = _lib.library()
    with _device(dev) as stream:
        st = lib.beam_moe_finalize_norm_residual_norm(
            _ptr(a["g"]), _ptr(a["w"]), a["capacity"], tokens, a["top_k"], a["hidden"],
            a["scale"], _norm_struct(a["pw"], a["pe"]), _ptr(residual), _scales_array(a["scales"]),
            _norm_struct(a["nw"], a["ne"]), _ptr(residual), _ptr(normalized), a["strategy"], stream)
    _lib.check(st, fn)
    return residual, normalized


def beam_moe_finalize_gather_norm_residual_norm(x, residual, post_weight, post_eps, next_weight, next_eps,
                                                scales, workspace, routed_scale=1.0, *, strategy=None):
    """The tensor-parallel version: finalize this rank's tokens, all-gather, add, normalize.

    Collective over the workspace's ranks: every rank calls it with the same
    tokens, norms, scales and strategy. tokens T = residual.shape[0]; rank r
    of R owns L = ceil(T / R) tokens, global rows [r*L, min((r+1)*L, T)), and
    x holds only those (local row i = global row r*L + i; capacity >= L;
    x.live_tokens is not used). residual is the full replicated [T, hidden]
    array; hidden is written IN PLACE into it, and every rank gets the same
    bits. strategy: None/"auto", "oneshot", "twoshot" or "unfused".
    Returns (hidden, normalized) as beam_moe_finalize_norm_residual_norm.
    """
    fn = "beam_moe_finalize_gather_norm_residual_norm"
    from .workspace import Workspace  # a late import: workspace imports this module's helpers
    if not isinstance(workspace, Workspace):
        raise TypeError("%s: workspace must be a beammoe.Workspace, got %s" % (fn, type(workspace).__name__))
    a = _fused_args(fn, x, residual, post_weight, post_eps, next_weight, next_eps, scales, routed_scale,
                    strategy)
    dev = T.same_device(fn, [("x.gemm2_permuted", a["g"]), ("x.expert_weights", a["w"]),
                             ("residual", residual), ("post_weight", a["pw"]), ("next_weight", a["nw"])])
    if dev != workspace.device:
        raise ValueError("%s: the tensors are on %s but the workspace is on %s"
                         % (fn, dev, workspace.device))
    handle = workspace.handle  # raises once closed
    normalized = torch.empty_like(residual) if a["ne"] is not None else None
    lib = _lib.library()
    # The workspace holds its backend: no global backend switch here, so
    # threads of a CPU group and other devices do not disturb each other.
    with _device(dev, select_backend=False) as stream:
        st = lib.beam_moe_finalize_gather_norm_residual_norm(
            handle, _ptr(a["g"]), _ptr(a["w"]), a["capacity"], residual.shape[0], a["top_k"],
            a["hidden"], a["scale"], _norm_struct(a["pw"], a["pe"]), _ptr(residual),
            _scales_array(a["scales"]), _norm_struct(a["nw"], a["ne"]), _ptr(residual),
            _ptr(normalized), a["strategy"], stream)
    _lib.check(st, fn)
    return residual, normalized


def norm_residual_norm(x, residual, pre_weight=None, pre_eps=None, scales=None, next_weight=None,
                       next_eps=None, *, out=None):
    """hidden = bf16(bf16(N(x) * s0) + bf16(residual * s1)); normalized = N(hidden).

    x, residual  [tokens, hidden] BF16; pre_*/next_* optional norms as above.
    hidden goes to `out` when given (it may be residual itself), else to a
    new tensor. Returns (hidden, normalized | None).
    """
    fn = "beam_norm_residual_norm"
    T.tensor(fn, "x", x, T.BF16, 2)
    T.tensor(fn, "residual", residual, T.BF16, 2)
    T.shape(fn, "residual", residual, tuple(x.shape))
    tokens, hidden = x.shape
    prw, pre = T.norm(fn, "pre_weight", pre_weight, "pre_eps", pre_eps, hidden)
    nw, ne = T.norm(fn, "next_weight", next_weight, "next_eps", next_eps, hidden)
    s = T.scales(fn, scales)
    if out is None:
        out = torch.empty_like(residual)
    else:
        T.tensor(fn, "out", out, T.BF16, 2)
        T.shape(fn, "out", out, tuple(x.shape))
    dev = T.same_device(fn, [("x", x), ("residual", residual), ("pre_weight", prw), ("next_weight", nw),
                             ("out", out)])
    normalized = torch.empty_like(residual) if ne is not None else None
    lib = _lib.library()
    with _device(dev) as stream:
        st = lib.beam_norm_residual_norm(_ptr(x), _ptr(residual), tokens, hidden,
                                         _norm_struct(prw, pre), _scales_array(s), _norm_struct(nw, ne),
                                         _ptr(out), _ptr(normalized), stream)
    _lib.check(st, fn)
    return out, normalized


# The C API's name for the same operation.
beam_norm_residual_norm = norm_residual_norm
