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

The quantized output's tensors and its beam_quant struct (empty_outputs,
struct; every form of lib/quant_forms.def, its layout from its line there:
_forms.py) are made here for the functions (quant.py), the torch operators
(_torch_ops.py) and the gather run by Python alike: the same shapes,
strides and dtype in a call, its fake implementation and a CUDA graph.
"""
import ctypes

import torch

from . import _forms
from . import _lib
from ._lib import BeamNorm, BeamQuant

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


def cuda_call(f, index, args):
    """f(*args, stream) with torch's current stream of CUDA device `index`,
    which is made current for the call when it is not."""
    if _current_device() != index:
        with torch.cuda.device(index):
            return f(*args, _raw_stream(index))
    return f(*args, _raw_stream(index))


def _invoke(ops, member, dev, args):
    """ops.member(*args, stream) on device `dev`; raise on a failed status
    with the message of that table's library. CPU calls pass no stream; CUDA
    calls torch's current stream of the tensors' device (cuda_call)."""
    f = getattr(ops, member)
    if dev == _CPU_DEVICE:
        st = f(*args, None)
    else:
        st = cuda_call(f, dev.index if dev.index is not None else _current_device(), args)
    if st:
        _lib.check(st, "beam_" + member, ops)


def library_rules(top_k, hidden, fn=None):
    """The library's own rules for top_k and hidden (lib/check.c), asked of
    the CPU backend through a moe_finalize of no rows, which checks them and
    writes nothing: None, or (status, the library's message; naming fn in
    place of beam_moe_finalize when fn is given)."""
    ops = _backend(_CPU_DEVICE)
    st = ops.moe_finalize(_EMPTY_ADDR, _EMPTY_ADDR, 0, 0, top_k, hidden, 1.0, None, _EMPTY_ADDR, None)
    if not st:
        return None
    msg = _lib.last_error(ops)
    return st, fn + msg[len("beam_moe_finalize"):] if fn and msg.startswith("beam_moe_finalize:") else msg


def finalize(dev, g, w, capacity, live, top_k, hidden, routed_scale, pw, pe, out):
    keep_post, post = _norm(pw, pe)
    _invoke(_backend(dev), "moe_finalize", dev,
            (addr(g), addr(w), capacity, live, top_k, hidden, routed_scale, post, addr(out)))
    del keep_post


def fused(dev, g, w, capacity, tokens, top_k, hidden, routed_scale, pw, pe, residual, s, nw, ne, hidden_out,
          normalized, strategy, quant=None):
    """The local fused operation; with quant (a BeamQuant, kept alive by the
    caller), its _q form, quant before strategy as in the C call."""
    keep_post, post = _norm(pw, pe)
    keep_next, nxt = _norm(nw, ne)
    keep_s, sp = _scales_ref(s)
    args = (g.data_ptr() or _EMPTY_ADDR, w.data_ptr() or _EMPTY_ADDR, capacity, tokens, top_k, hidden, routed_scale,
            post, residual.data_ptr() or _EMPTY_ADDR, sp, nxt, hidden_out.data_ptr() or _EMPTY_ADDR,
            (normalized.data_ptr() or _EMPTY_ADDR) if normalized is not None else None)
    if quant is None:
        _invoke(_backend(dev), "moe_finalize_norm_residual_norm", dev, args + (strategy,))
    else:
        _invoke(_backend(dev), "moe_finalize_norm_residual_norm_q", dev, args + (ctypes.addressof(quant), strategy))
    del keep_post, keep_next, keep_s


def norm_residual_norm(dev, x, residual, tokens, hidden, prw, pre, s, nw, ne, hidden_out, normalized, quant=None):
    """norm_residual_norm; with quant (a BeamQuant, kept alive by the
    caller), its _q form."""
    keep_pre, pre_p = _norm(prw, pre)
    keep_next, nxt = _norm(nw, ne)
    keep_s, sp = _scales_ref(s)
    args = (addr(x), addr(residual), tokens, hidden, pre_p, sp, nxt, addr(hidden_out),
            addr(normalized) if normalized is not None else None)
    if quant is None:
        _invoke(_backend(dev), "norm_residual_norm", dev, args)
    else:
        _invoke(_backend(dev), "norm_residual_norm_q", dev, args + (ctypes.addressof(quant),))
    del keep_pre, keep_next, keep_s


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


def allreduce(dev, ops, handle, x, g, w, capacity, tokens, top_k, hidden, routed_scale, nw1, ne1, residual, s, nw,
              ne, hidden_out, normalized, quant, strategy):
    """The all-reduce on workspace `handle` through `ops`, the table that
    made it: the dense form's partial x (g, w None), or the MoE form's slots
    g, w (x None); (nw1, ne1) the norm of the reduced sum (pre_norm, or
    post_norm); quant a BeamQuant (kept alive by the caller) or None (no
    quantized output), before strategy as in the C call."""
    keep_1, first = _norm(nw1, ne1)
    keep_next, nxt = _norm(nw, ne)
    keep_s, sp = _scales_ref(s)
    tail = (addr(residual), sp, nxt, addr(hidden_out), addr(normalized) if normalized is not None else None,
            ctypes.addressof(quant) if quant is not None else None, strategy)
    if x is not None:
        _invoke(ops, "allreduce_norm_residual_norm", dev, (handle, addr(x), tokens, hidden, first) + tail)
    else:
        _invoke(ops, "moe_finalize_allreduce_norm_residual_norm", dev,
                (handle, addr(g), addr(w), capacity, tokens, top_k, hidden, routed_scale, first) + tail)
    del keep_1, keep_next, keep_s


# ---- the quantized output: each form's layout from its line of lib/quant_forms.def (_forms) ----

KINDS = {"group": _forms.FP8_GROUP, "token": _forms.FP8_TOKEN, "tensor": _forms.FP8_TENSOR}  # FP8Quant's kinds
NVFP4 = _forms.NVFP4  # NVFP4Quant's kind
MXFP8 = _forms.MXFP8  # MXFP8Quant's kind
UE8M0 = 1
COL_MAJOR = 2
# The dtypes the consuming GEMMs take (docs/python.md): E4M3 values and
# scales torch.float8_e4m3fn (torch >= 2.1; uint8 bits on an older torch);
# NVFP4's value pairs and MXFP8's E8M0 codes uint8, as vLLM's
# scaled_fp4_quant and FlashInfer's fp4_quantize / mxfp8_quantize give them
# (views as torch.float4_e2m1fn_x2 / torch.float8_e8m0fnu where torch has them).
FP8 = getattr(torch, "float8_e4m3fn", None)


def _bits(dtype):
    return dtype if dtype is not None else torch.uint8


def empty_outputs(kind, group_size, flags, scale, tokens, hidden, device):
    """(q, q_scales) of form `kind` for tokens x hidden: q [tokens, hidden *
    bits / 8], E4M3 (8 bits) or E2M1 pairs (4 bits); q_scales, by the
    form's scales: block bytes [tokens rounded up to 128, hidden / group],
    E8M0 codes or E4M3, whose bytes are the 128 x 4 tiled layout (the rows
    past the last token's are padding the library does not write); FP32 [1]
    holding the caller's static scale; [tokens, 1] per row; or [tokens,
    hidden / group] (column-major: strides (1, ld), ld = tokens rounded up
    to 4, DeepGEMM's layout)."""
    f = _forms.form(kind)
    q = torch.empty(tokens, hidden * f.bits // 8, dtype=_bits(None if f.bits == 4 else FP8), device=device)
    if f.blocks:
        rows = (tokens + 127) // 128 * 128
        return q, torch.empty(rows, hidden // f.group, dtype=_bits(None if f.scale == _forms.E8M0 else FP8),
                              device=device)
    if f.scale == _forms.STATIC:
        return q, torch.full((1,), scale, dtype=torch.float32, device=device)
    if f.group == _forms.ROW:
        return q, torch.empty(tokens, 1, dtype=torch.float32, device=device)
    group = f.group or group_size
    groups = hidden // group if group > 0 else 0  # the library names a group_size it refuses
    if flags & COL_MAJOR:
        ld = (tokens + 3) // 4 * 4
        return q, torch.empty_strided((tokens, groups), (1, ld), dtype=torch.float32, device=device)
    return q, torch.empty(tokens, groups, dtype=torch.float32, device=device)


def _given(f, scale):
    return scale if f.scale in (_forms.STATIC, _forms.GLOBAL) else 0.0


def struct(kind, group_size, flags, scale, q, scales):
    """The beam_quant of a call writing q and scales (keep it alive for the
    call): block scales in block_scales, FP32 ones in scales (NULL for a
    static scale); the scale field the caller's where the form takes one."""
    f = _forms.form(kind)
    given = _given(f, scale)
    if f.blocks:
        return BeamQuant(kind, group_size, flags, given, addr(q), None, 0, addr(scales))
    if f.scale == _forms.STATIC:
        return BeamQuant(kind, group_size, flags, given, addr(q), None, 0)
    ld = scales.stride(1) if f.group == 0 and flags & COL_MAJOR else 0
    return BeamQuant(kind, group_size, flags, given, addr(q), addr(scales), ld)


AGREEMENT_WORDS = 9  # BEAM_AGREEMENT_WORDS


def agreement(tokens, top_k, hidden, routed_scale, pw, pe, s, nw, ne, qf, strategy):
    """The words a gather call's collective arguments come to
    (beam_gather_agreement: what the library's own groups compare), as
    int64 values; qf: None or the form's (kind, group_size, flags, scale)."""
    post, next_, sc = _norm(pw, pe), _norm(nw, ne), _scales_ref(s)
    q = None
    if qf is not None:
        q = BeamQuant(qf[0], qf[1], qf[2], _given(_forms.form(qf[0]), qf[3]))
    words = (ctypes.c_uint64 * AGREEMENT_WORDS)()
    _lib.check(_lib.library().beam_gather_agreement(tokens, top_k, hidden, routed_scale, post[1], sc[1], next_[1],
                                                    ctypes.byref(q) if q is not None else None, strategy, words),
               "beam_gather_agreement")
    return tuple(w - (1 << 64) if w >= 1 << 63 else w for w in words)


def agreement_text(i, word):
    """(name, value as text) of agreement word i (beam_gather_agreement_text)."""
    buf = ctypes.create_string_buffer(128)
    name = _lib.library().beam_gather_agreement_text(i, word & ((1 << 64) - 1), buf, len(buf))
    return name.decode(), buf.value.decode()
