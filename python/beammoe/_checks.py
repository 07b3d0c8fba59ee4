"""The rules of the operations' arguments, before they reach the library:
shared by the functions (ops.py, quant.py), the torch operators
(_torch_ops.py), the gather run by Python (_pgather.py) and the prepared
call (_prepared.py). It imports only torch: every module that calls an
operation can import it, and the package's imports go one way (ops.py's
docstring).

The library checks every rule it can see (sizes, top_k, hidden, eps, scales,
overlap, device memory); what it cannot see from raw pointers, or what ctypes
would silently convert, is checked here: that an argument is a tensor, its
dtype, its rank and shape against the other tensors, contiguity, a common
device; and that numbers are numbers of the right kind and range (no bool
where an int is expected, no string where a float or a pair is, no integer
that its C type would wrap). Messages follow the library's form:
"function: argument ... rule". Types are a TypeError, values a ValueError.
The primitives come first; each check_* then takes an operation's arguments
as the caller has them and returns what the library call needs.

Every function is written for the common case first (a plain tensor, a
Python float or int): one call costs a few hundred nanoseconds.
"""
import math
import numbers
import operator

import torch

BF16 = torch.bfloat16
FP32 = torch.float32
Tensor = torch.Tensor

INT32 = (-(2 ** 31), 2 ** 31 - 1)
INT64 = (-(2 ** 63), 2 ** 63 - 1)
FLT_MAX = 3.4028234663852886e38
DEVICES = ("cpu", "cuda", "meta")  # meta: shapes only (torch.library's fake tensors)


def _type_name(v):
    return type(v).__name__


def tensor(fn, name, t, dtype, ndim):
    """Check that `t` is a contiguous tensor of `dtype` and rank `ndim` (an
    int or a tuple of ints)."""
    if not isinstance(t, Tensor):
        raise TypeError("%s: %s must be a torch.Tensor, got %s" % (fn, name, _type_name(t)))
    if t.dtype is not dtype:
        raise TypeError("%s: %s must have dtype %s, got %s" % (fn, name, dtype, t.dtype))
    d = t.dim()
    if d != ndim and not (type(ndim) is tuple and d in ndim):
        want = " or ".join(str(n) for n in (ndim if type(ndim) is tuple else (ndim,)))
        raise ValueError("%s: %s must have %s dimensions, got shape %s" % (fn, name, want, tuple(t.shape)))
    if not t.is_contiguous():
        raise ValueError("%s: %s must be contiguous (row-major dense; call .contiguous())" % (fn, name))
    return t


def shape(fn, name, t, want):
    """Check t.shape == want (a tuple of ints)."""
    if tuple(t.shape) != tuple(want):
        raise ValueError("%s: %s must have shape %s, got %s" % (fn, name, tuple(want), tuple(t.shape)))


def same_device(fn, names, tensors):
    """Every tensor (None skipped) on one device, and that a cpu or cuda
    device (or meta, under torch.library's fake tensors); returns it."""
    dev = None
    first = None
    for name, t in zip(names, tensors):
        if t is None:
            continue
        if dev is None:
            dev, first = t.device, name
        elif t.device != dev:
            raise ValueError("%s: %s is on %s but %s is on %s (every tensor must be on one device)"
                             % (fn, name, t.device, first, dev))
    if dev is not None and dev.type not in DEVICES:
        raise ValueError("%s: %s is on device %s; only cpu and cuda tensors are supported" % (fn, first, dev))
    return dev


def expert_arrays(fn, outputs_name, outputs, weights_name, weights):
    """Check the expert results and routing weights; (capacity, top_k, hidden).

    The results may be [capacity, top_k, hidden] or, as gemm2 leaves them,
    [capacity * top_k, hidden] (token-major: row t*top_k + k is token t's
    slot k); the weights are [capacity, top_k] FP32. As in the reference,
    the two may hold different numbers of rows (only the live ones are
    read): capacity is the smaller, and the library reads rows below it."""
    tensor(fn, weights_name, weights, FP32, 2)
    tensor(fn, outputs_name, outputs, BF16, (2, 3))
    wcap, top_k = weights.shape
    if outputs.dim() == 3:
        if outputs.shape[1] != top_k:
            raise ValueError("%s: %s has shape %s but %s is %s: want [capacity, %d, hidden]"
                             % (fn, outputs_name, tuple(outputs.shape), weights_name, tuple(weights.shape), top_k))
        gcap, hidden = outputs.shape[0], outputs.shape[2]
    else:
        rows, hidden = outputs.shape
        if top_k == 0:  # the library names top_k
            gcap = wcap
        elif rows % top_k:
            raise ValueError("%s: %s has shape %s but %s is %s: want [capacity * top_k = %d, hidden] (rows a "
                             "multiple of top_k=%d)" % (fn, outputs_name, tuple(outputs.shape), weights_name,
                                                        tuple(weights.shape), wcap * top_k, top_k))
        else:
            gcap = rows // top_k
    return (gcap if gcap < wcap else wcap), top_k, hidden


def rows_cover(fn, outputs_name, outputs, weights_name, weights, top_k, rows, what):
    """Where the expert results and the weights hold different numbers of
    tokens, both must hold the `rows` tokens that are read. (When they hold
    the same, the library's own check names the capacity.)"""
    wcap = weights.shape[0]
    gcap = outputs.shape[0] if outputs.dim() == 3 else (outputs.shape[0] // top_k if top_k else wcap)
    if gcap != wcap and rows > min(gcap, wcap):
        raise ValueError("%s: %s holds %d tokens and %s %d; both must hold at least %s=%d"
                         % (fn, outputs_name, gcap, weights_name, wcap, what, rows))


def moe_output(fn, x):
    """(gemm2_permuted, expert_weights) of an unfinalized MoE output. Its
    live_tokens, if any, is not read: as in the reference, the token count
    is residual.shape[0]."""
    try:
        return x.gemm2_permuted, x.expert_weights
    except AttributeError:
        raise TypeError("%s: x must be an unfinalized MoE output with attributes gemm2_permuted and "
                        "expert_weights (e.g. beammoe.MoEOutput), got %s" % (fn, _type_name(x))) from None


def _is_bool(v):
    """bool, NumPy's bool_ (an integer to operator.index in NumPy < 2) or a
    bool tensor."""
    t = type(v)
    return (isinstance(v, bool) or (t.__name__ in ("bool_", "bool") and t.__module__ == "numpy")
            or (isinstance(v, Tensor) and v.dtype is torch.bool))


def integer(fn, name, v, bounds):
    """An int within `bounds` (lo, hi): a bool, a tensor (which
    operator.index would take when it holds one integer) or a non-integer
    is a TypeError, a value outside the C type's range a ValueError."""
    if type(v) is not int:
        if _is_bool(v):
            raise TypeError("%s: %s must be an int, got bool" % (fn, name))
        if isinstance(v, Tensor):
            raise TypeError("%s: %s must be an int, got a tensor (pass int(t.item()) for a one-element tensor)"
                            % (fn, name))
        try:
            v = operator.index(v)
        except TypeError:
            raise TypeError("%s: %s must be an int, got %s" % (fn, name, _type_name(v))) from None
    if not bounds[0] <= v <= bounds[1]:
        raise ValueError("%s: %s=%d is out of range [%d, %d]" % (fn, name, v, bounds[0], bounds[1]))
    return v


def number(fn, name, v):
    """A float that a C float holds: a Python or NumPy real number (not a
    bool) or a one-element tensor; inf and nan pass (the library names them);
    a finite value beyond the float32 range is a ValueError."""
    if type(v) is float and -FLT_MAX <= v <= FLT_MAX:
        return v
    if isinstance(v, Tensor):
        if v.numel() != 1 or v.dtype is torch.bool or v.is_complex():
            raise TypeError("%s: %s must be a float, got a tensor of shape %s and dtype %s"
                            % (fn, name, tuple(v.shape), v.dtype))
        v = v.item()
    elif _is_bool(v) or not isinstance(v, numbers.Real):
        raise TypeError("%s: %s must be a float, got %s" % (fn, name, _type_name(v)))
    v = float(v)
    if math.isfinite(v) and not -FLT_MAX <= v <= FLT_MAX:
        raise ValueError("%s: %s=%r is out of the float32 range" % (fn, name, v))
    return v


def norm(fn, weight_name, weight, eps_name, eps, hidden):
    """Check an optional norm: (weight tensor or None, eps float or None).

    eps None means no norm (then the weight must be None too); a weight of
    None with an eps means a norm without the affine step."""
    if eps is None:
        if weight is not None:
            raise ValueError("%s: %s is given but %s is None (a norm needs its eps; pass %s=None "
                             "for no norm)" % (fn, weight_name, eps_name, weight_name))
        return None, None
    eps = number(fn, eps_name, eps)
    if weight is not None:
        tensor(fn, weight_name, weight, BF16, 1)
        if weight.shape[0] != hidden:
            raise ValueError("%s: %s must have shape (%d,), got %s"
                             % (fn, weight_name, hidden, tuple(weight.shape)))
    return weight, eps


def scales(fn, s):
    """None or a pair (scale of the branch, scale of the residual): a tuple or
    list of two floats, or a tensor of two; returns a tuple of two floats."""
    if s is None:
        return None
    if isinstance(s, Tensor):
        if s.dim() != 1 or s.numel() != 2 or s.dtype is torch.bool or s.is_complex():
            raise TypeError("%s: scales must be a pair of floats or None, got a tensor of shape %s and "
                            "dtype %s" % (fn, tuple(s.shape), s.dtype))
        s = s.tolist()
    elif not isinstance(s, (tuple, list)):  # a string is a sequence, but no pair of numbers
        raise TypeError("%s: scales must be a pair of floats or None, got %s" % (fn, _type_name(s)))
    if len(s) != 2:
        raise ValueError("%s: scales must be a pair of floats or None, got %d values" % (fn, len(s)))
    return (number(fn, "scales[0]", s[0]), number(fn, "scales[1]", s[1]))


def flag(fn, name, v):
    """A bool (True or False), nothing that merely converts to one."""
    if v is True or v is False:
        return v
    raise TypeError("%s: %s must be True or False, got %s" % (fn, name, _type_name(v)))


def strategy(fn, s, allowed, names):
    """The strategy's enum value: None or one of `allowed` (lower-case names)."""
    if s is None:
        return 0
    if not isinstance(s, str):
        raise TypeError("%s: strategy must be a string or None, got %s" % (fn, _type_name(s)))
    key = s.lower()
    if key not in allowed:
        raise ValueError("%s: strategy=%r: unknown strategy (use None, %s)" % (fn, s, names))
    return allowed[key]


# The functions' names, as the messages give them.
FINALIZE = "beam_moe_finalize"
FUSED = "beam_moe_finalize_norm_residual_norm"
GATHER = "beam_moe_finalize_gather_norm_residual_norm"
NRN = "beam_norm_residual_norm"
ALLREDUCE = "beam_allreduce_norm_residual_norm"
MOE_ALLREDUCE = "beam_moe_finalize_allreduce_norm_residual_norm"
STRATEGY_NAMES = '"auto", "fused", "unfused", "oneshot" or "twoshot"'
# The tensors of each operation, as a message names them (same_device).
FINALIZE_NAMES = ("expert_outputs", "expert_weights", "output", "post_weight")
FUSED_NAMES = ("x.gemm2_permuted", "x.expert_weights", "residual", "post_weight", "next_weight")
NRN_NAMES = ("x", "residual", "pre_weight", "next_weight")


def check_finalize(fn, g, w, output, pw, pe, routed_scale):
    """(capacity, top_k, hidden, live, pw, pe, scale) or an exception."""
    capacity, top_k, hidden = expert_arrays(fn, "expert_outputs", g, "expert_weights", w)
    tensor(fn, "output", output, BF16, 2)
    live, oh = output.shape
    if oh != hidden:
        raise ValueError("%s: output has shape %s but the expert outputs have hidden=%d"
                         % (fn, tuple(output.shape), hidden))
    rows_cover(fn, "expert_outputs", g, "expert_weights", w, top_k, live, "live_tokens")
    pw, pe = norm(fn, "post_weight", pw, "post_eps", pe, hidden)
    scale = number(fn, "routed_scale", routed_scale)
    return capacity, top_k, hidden, live, pw, pe, scale


def _plain_norm(weight, eps, hidden):
    """True when norm accepts (weight, eps) as they are: no norm, or a
    Python float eps in the float32 range with no weight or a contiguous
    [hidden] BF16 weight."""
    if eps is None:
        return weight is None
    if type(eps) is not float or not -FLT_MAX <= eps <= FLT_MAX:
        return False
    return weight is None or (isinstance(weight, Tensor) and weight.dtype is BF16 and weight.dim() == 1
                              and weight.shape[0] == hidden and weight.is_contiguous())


def check_fused(fn, g, w, residual, pw, pe, nw, ne, pair, routed_scale, strategy, gather=False):
    """The rules of the local and the gathered fused operation (strategy: the
    enum value): (capacity, top_k, hidden, pw, pe, nw, ne, scales, scale, strategy).
    The local operation reads residual.shape[0] tokens of the expert arrays;
    the gather a rank's share (checked with the workspace)."""
    # The common case in one expression (a subset of what the checks below
    # accept); anything else takes the checks, which name the broken rule.
    if isinstance(g, Tensor) and isinstance(w, Tensor) and isinstance(residual, Tensor) and g.dtype is BF16 \
            and w.dtype is FP32 and residual.dtype is BF16 and g.dim() == 2 and w.dim() == 2 \
            and residual.dim() == 2 and g.is_contiguous() and w.is_contiguous() and residual.is_contiguous() \
            and type(routed_scale) is float and -FLT_MAX <= routed_scale <= FLT_MAX \
            and type(strategy) is int:
        capacity, top_k = w.shape
        hidden = g.shape[1]
        if g.shape[0] == capacity * top_k and residual.shape[1] == hidden and _plain_norm(pw, pe, hidden) \
                and _plain_norm(nw, ne, hidden):
            return (capacity, top_k, hidden, pw, pe, nw, ne, None if pair is None else scales(fn, pair),
                    routed_scale, strategy)
    capacity, top_k, hidden = expert_arrays(fn, "x.gemm2_permuted", g, "x.expert_weights", w)
    tensor(fn, "residual", residual, BF16, 2)
    if residual.shape[1] != hidden:
        raise ValueError("%s: residual has shape %s but x.gemm2_permuted has hidden=%d"
                         % (fn, tuple(residual.shape), hidden))
    if not gather:
        rows_cover(fn, "x.gemm2_permuted", g, "x.expert_weights", w, top_k, residual.shape[0],
                   "residual.shape[0]")
    pw, pe = norm(fn, "post_weight", pw, "post_eps", pe, hidden)
    nw, ne = norm(fn, "next_weight", nw, "next_eps", ne, hidden)
    s = scales(fn, pair)
    scale = number(fn, "routed_scale", routed_scale)
    if type(strategy) is not int:  # the functions pass the enum value of the strategy's name
        raise TypeError("%s: strategy must be the library's enum value (an int), got %s"
                        % (fn, type(strategy).__name__))
    return capacity, top_k, hidden, pw, pe, nw, ne, s, scale, strategy


def check_nrn(fn, x, residual, prw, pre, nw, ne, pair):
    """(tokens, hidden, prw, pre, nw, ne, scales)."""
    tensor(fn, "x", x, BF16, 2)
    tensor(fn, "residual", residual, BF16, 2)
    if residual.shape != x.shape:
        shape(fn, "residual", residual, tuple(x.shape))
    tokens, hidden = x.shape
    prw, pre = norm(fn, "pre_weight", prw, "pre_eps", pre, hidden)
    nw, ne = norm(fn, "next_weight", nw, "next_eps", ne, hidden)
    s = scales(fn, pair)
    return tokens, hidden, prw, pre, nw, ne, s

