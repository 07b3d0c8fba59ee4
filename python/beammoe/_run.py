"""The library calls themselves, on arguments already checked.

Each function takes checked Python values and tensors, picks the table of
the backend of the tensors' device (the CPU backend's for CPU tensors, the
CUDA backend's for CUDA tensors, the workspace's own for the gather), and
makes one ctypes call through it. CUDA calls run on torch's current stream
of the tensors' device, with that device made current for the call. Both the eager functions of
ops.py and the torch.library operations (_torch_ops.py) end here.

Norm structs and scales arrays are cached by their contents (the weight's
address and eps; the two scales): a model passes the same few every call.
A cached object is never changed and stays referenced for the duration of
each call that uses it. Zeros and NaN are not cached: 0.0 == -0.0 as keys,
but a scale of -0.0 gives other bits than +0.0, and NaN is no key at all.
"""
import ctypes

import torch

from . import _lib
from ._lib import BeamNorm, BeamQuant  # noqa: F401  (BeamQuant: for fp8.py)

# An empty tensor's data_ptr() is 0, but the library tells "absent" (NULL)
# from "present, no rows" (e.g. normalized must be non-NULL exactly when
# next_norm is given); an empty tensor passes this address instead. The
# library never touches a pointer whose extent is zero bytes.
_EMPTY = (ctypes.c_uint64 * 2)()
_EMPTY_ADDR = ctypes.addressof(_EMPTY)

_CACHE_MAX = 512
_norms = {}
_scales = {}


def addr(t):
    """The address to pass for a tensor (never NULL)."""
    p = t.data_ptr()
    return p if p else _EMPTY_ADDR


def _norm(weight, eps):
    """(object to keep alive, address of a beam_norm) for (weight, eps); (None, None) without a norm."""
    if eps is None:
        return _NONE
    key = (addr(weight) if weight is not None else 0, eps)
    hit = _norms.get(key)
    if hit is None:
        s = BeamNorm(key[0] or None, eps)
        hit = (s, ctypes.addressof(s))
        if eps == 0.0 or eps != eps:
            return hit
        if len(_norms) >= _CACHE_MAX:
            _norms.clear()
        _norms[key] = hit
    return hit


def _scales_ref(s):
    """(object to keep alive, address of a float[2]) for a pair; (None, None) for None."""
    if s is None:
        return _NONE
    hit = _scales.get(s)
    if hit is None:
        a = (ctypes.c_float * 2)(*s)
        hit = (a, ctypes.addressof(a))
        if s[0] == 0.0 or s[1] == 0.0 or s[0] != s[0] or s[1] != s[1]:
            return hit
        if len(_scales) >= _CACHE_MAX:
            _scales.clear()
        _scales[s] = hit
    return hit


_NONE = (None, None)
_CPU_DEVICE = torch.device("cpu")
_cpu_ops = None
_cuda_ops = None

if hasattr(torch._C, "_cuda_getCurrentRawStream"):
    def _raw_stream(index):
        return torch._C._cuda_getCurrentRawStream(index)
else:  # older torch
    def _raw_stream(index):
        return torch.cuda.current_stream(index).cuda_stream

if hasattr(torch._C, "_cuda_getDevice"):
    def _current_device():
        return torch._C._cuda_getDevice()  # CUDA is initialized: the call has CUDA tensors
else:  # pragma: no cover - older torch
    _current_device = torch.cuda.current_device


def _backend(dev):
    """The table of the backend of the tensors' device (a _lib.Backend)."""
    global _cpu_ops, _cuda_ops
    if dev == _CPU_DEVICE:
        if _cpu_ops is None:
            _cpu_ops = _lib.backend_ops("cpu")
        return _cpu_ops
    if _cuda_ops is None:
        _cuda_ops = _lib.backend_ops("cuda")
    return _cuda_ops


def _invoke(ops, member, dev, args):
    """ops.member(*args, stream) on device `dev`; raise on a failed status
    with the message of that table's library. CPU calls pass no stream; CUDA
    calls pass torch's current stream of the tensors' device, which is made
    current for the call when it is not."""
    f = getattr(ops, member)
    if dev == _CPU_DEVICE:
        st = f(*args, None)
    else:
        current = _current_device()
        index = dev.index if dev.index is not None else current
        if current != index:
            with torch.cuda.device(index):
                st = f(*args, _raw_stream(index))
        else:
            st = f(*args, _raw_stream(index))
    if st:
        _lib.check(st, "beam_" + member, ops)


def finalize(dev, g, w, capacity, live, top_k, hidden, routed_scale, pw, pe, out):
    keep_post, post = _norm(pw, pe)
    _invoke(_backend(dev), "moe_finalize", dev,
            (addr(g), addr(w), capacity, live, top_k, hidden, routed_scale, post, addr(out)))
    del keep_post


def fused(dev, g, w, capacity, tokens, top_k, hidden, routed_scale, pw, pe, residual, s, nw, ne, hidden_out,
          normalized, strategy):
    keep_post, post = _norm(pw, pe)
    keep_next, nxt = _norm(nw, ne)
    keep_s, sp = _scales_ref(s)
    _invoke(_backend(dev), "moe_finalize_norm_residual_norm", dev,
            (g.data_ptr() or _EMPTY_ADDR, w.data_ptr() or _EMPTY_ADDR, capacity, tokens, top_k, hidden,
             routed_scale, post, residual.data_ptr() or _EMPTY_ADDR, sp, nxt, hidden_out.data_ptr() or _EMPTY_ADDR,
             (normalized.data_ptr() or _EMPTY_ADDR) if normalized is not None else None, strategy))
    del keep_post, keep_next, keep_s


def norm_residual_norm(dev, x, residual, tokens, hidden, prw, pre, s, nw, ne, hidden_out, normalized):
    keep_pre, pre_p = _norm(prw, pre)
    keep_next, nxt = _norm(nw, ne)
    keep_s, sp = _scales_ref(s)
    _invoke(_backend(dev), "norm_residual_norm", dev,
            (addr(x), addr(residual), tokens, hidden, pre_p, sp, nxt, addr(hidden_out),
             addr(normalized) if normalized is not None else None))
    del keep_pre, keep_next, keep_s


def norm_residual_norm_q(dev, x, residual, tokens, hidden, prw, pre, s, nw, ne, hidden_out, normalized, quant):
    """norm_residual_norm with the quantized output described by quant (a
    BeamQuant, kept alive by the caller)."""
    keep_pre, pre_p = _norm(prw, pre)
    keep_next, nxt = _norm(nw, ne)
    keep_s, sp = _scales_ref(s)
    _invoke(_backend(dev), "norm_residual_norm_q", dev,
            (addr(x), addr(residual), tokens, hidden, pre_p, sp, nxt, addr(hidden_out),
             addr(normalized) if normalized is not None else None, ctypes.addressof(quant)))
    del keep_pre, keep_next, keep_s


def fused_q(dev, g, w, capacity, tokens, top_k, hidden, routed_scale, pw, pe, residual, s, nw, ne, hidden_out,
            normalized, strategy, quant):
    keep_post, post = _norm(pw, pe)
    keep_next, nxt = _norm(nw, ne)
    keep_s, sp = _scales_ref(s)
    _invoke(_backend(dev), "moe_finalize_norm_residual_norm_q", dev,
            (addr(g), addr(w), capacity, tokens, top_k, hidden, routed_scale, post, addr(residual), sp, nxt,
             addr(hidden_out), addr(normalized) if normalized is not None else None, ctypes.addressof(quant),
             strategy))
    del keep_post, keep_next, keep_s


def gather(dev, ops, handle, g, w, capacity, tokens, top_k, hidden, routed_scale, pw, pe, residual, s, nw, ne,
           hidden_out, normalized, quant, strategy):
    """The gather on workspace `handle` through `ops`, the table that made it;
    with quant (a BeamQuant, kept alive by the caller; None: the plain
    gather), its _q form. quant comes before strategy, as in the C call."""
    keep_post, post = _norm(pw, pe)
    keep_next, nxt = _norm(nw, ne)
    keep_s, sp = _scales_ref(s)
    args = (handle, addr(g), addr(w), capacity, tokens, top_k, hidden, routed_scale, post, addr(residual), sp, nxt,
            addr(hidden_out), addr(normalized) if normalized is not None else None)
    if quant is None:
        _invoke(ops, "moe_finalize_gather_norm_residual_norm", dev, args + (strategy,))
    else:
        _invoke(ops, "moe_finalize_gather_norm_residual_norm_q", dev, args + (ctypes.addressof(quant), strategy))
    del keep_post, keep_next, keep_s
