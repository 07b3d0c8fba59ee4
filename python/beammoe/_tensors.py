"""Python-level checks of torch tensors before they reach the library.

The library checks every rule it can see (sizes, top_k, hidden, eps, scales,
overlap, device memory); what it cannot see from raw pointers is checked here:
that an argument is a tensor, its dtype, its rank and shape against the other
tensors, contiguity and a common device. Messages follow the library's form:
"function: argument ... rule".
"""
import operator

import torch

BF16 = torch.bfloat16
FP32 = torch.float32


def tensor(fn, name, t, dtype, ndim=None):
    """Check that `t` is a contiguous tensor of `dtype` (and rank `ndim`)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("%s: %s must be a torch.Tensor, got %s" % (fn, name, type(t).__name__))
    if t.dtype != dtype:
        raise TypeError("%s: %s must have dtype %s, got %s" % (fn, name, dtype, t.dtype))
    if ndim is not None and t.dim() not in (ndim if isinstance(ndim, tuple) else (ndim,)):
        want = " or ".join(str(n) for n in (ndim if isinstance(ndim, tuple) else (ndim,)))
        raise ValueError("%s: %s must have %s dimensions, got shape %s" % (fn, name, want, tuple(t.shape)))
    if not t.is_contiguous():
        raise ValueError("%s: %s must be contiguous (row-major dense; call .contiguous())" % (fn, name))
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError("%s: %s is on device %s; only cpu and cuda tensors are supported"
                         % (fn, name, t.device))
    return t


def shape(fn, name, t, want):
    """Check t.shape == want (a tuple of ints)."""
    if tuple(t.shape) != tuple(want):
        raise ValueError("%s: %s must have shape %s, got %s" % (fn, name, tuple(want), tuple(t.shape)))


def same_device(fn, named):
    """All (name, tensor) pairs with a tensor must be on one device; returns it."""
    dev = None
    first = None
    for name, t in named:
        if t is None:
            continue
        if dev is None:
            dev, first = t.device, name
        elif t.device != dev:
            raise ValueError("%s: %s is on %s but %s is on %s (every tensor must be on one device)"
                             % (fn, name, t.device, first, dev))
    return dev


def expert_arrays(fn, outputs_name, outputs, weights_name, weights):
    """Check the expert results and routing weights; (capacity, top_k, hidden).

    The results may be [capacity, top_k, hidden] or, as gemm2 leaves them,
    [capacity * top_k, hidden] (token-major: row t*top_k + k is token t's
    slot k); the weights are [capacity, top_k] FP32."""
    tensor(fn, weights_name, weights, FP32, 2)
    tensor(fn, outputs_name, outputs, BF16, (2, 3))
    capacity, top_k = weights.shape
    if outputs.dim() == 3:
        if tuple(outputs.shape[:2]) != (capacity, top_k):
            raise ValueError("%s: %s has shape %s but %s is %s: want [%d, %d, hidden]"
                             % (fn, outputs_name, tuple(outputs.shape), weights_name,
                                tuple(weights.shape), capacity, top_k))
        hidden = outputs.shape[2]
    else:
        if outputs.shape[0] != capacity * top_k:
            raise ValueError("%s: %s has shape %s but %s is %s: want [capacity * top_k = %d, hidden]"
                             % (fn, outputs_name, tuple(outputs.shape), weights_name,
                                tuple(weights.shape), capacity * top_k))
        hidden = outputs.shape[1]
    return capacity, top_k, hidden


def moe_output(fn, x):
    """(gemm2_permuted, expert_weights, live_tokens) of an unfinalized MoE output."""
    try:
        g, w = x.gemm2_permuted, x.expert_weights
    except AttributeError:
        raise TypeError("%s: x must be an unfinalized MoE output with attributes gemm2_permuted and "
                        "expert_weights (e.g. beammoe.MoEOutput), got %s" % (fn, type(x).__name__)) from None
    live = getattr(x, "live_tokens", None)
    if live is not None:
        try:
            live = operator.index(live)
        except TypeError:
            raise TypeError("%s: x.live_tokens must be an int or None, got %s"
                            % (fn, type(live).__name__)) from None
    return g, w, live


def norm(fn, weight_name, weight, eps_name, eps, hidden):
    """Check an optional norm: (weight tensor or None, eps float or None).

    eps None means no norm (then the weight must be None too); a weight of
    None with an eps means a norm without the affine step."""
    if eps is None:
        if weight is not None:
            raise ValueError("%s: %s is given but %s is None (a norm needs its eps; pass %s=None "
                             "for no norm)" % (fn, weight_name, eps_name, weight_name))
        return None, None
    if isinstance(eps, torch.Tensor):
        eps = eps.item()
    try:
        eps = float(eps)
    except (TypeError, ValueError):
        raise TypeError("%s: %s must be a float or None, got %s" % (fn, eps_name, type(eps).__name__)) from None
    if weight is not None:
        tensor(fn, weight_name, weight, BF16, 1)
        shape(fn, weight_name, weight, (hidden,))
    return weight, eps


def scales(fn, s):
    """None or a pair of floats (scale of the branch, scale of the residual)."""
    if s is None:
        return None
    if isinstance(s, torch.Tensor):
        s = s.tolist()
    try:
        s = tuple(s)
    except TypeError:
        raise TypeError("%s: scales must be a pair of floats or None, got %s" % (fn, type(s).__name__)) from None
    if len(s) != 2:
        raise ValueError("%s: scales must be a pair of floats or None, got %d values" % (fn, len(s)))
    try:
        return (float(s[0]), float(s[1]))
    except (TypeError, ValueError):
        raise TypeError("%s: scales must be a pair of floats or None, got %r" % (fn, s)) from None


def number(fn, name, v):
    if isinstance(v, torch.Tensor):
        v = v.item()
    try:
        return float(v)
    except (TypeError, ValueError):
        raise TypeError("%s: %s must be a float, got %s" % (fn, name, type(v).__name__)) from None
