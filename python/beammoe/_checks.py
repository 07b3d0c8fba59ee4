"""The rules of the operations' arguments, shared by the functions (ops.py),
the torch operators (_torch_ops.py), the gather run by Python (_pgather.py)
and the prepared call (_prepared.py).

Each check_* takes the arguments as the caller has them and returns what the
library call needs, or raises the ValueError/TypeError that names the broken
rule (the primitives are in _tensors.py). It imports only _tensors.py: every
module that calls an operation can import it, and the package's imports go
one way (ops.py's docstring).
"""
from . import _tensors as A
from ._tensors import BF16, Tensor

# The functions' names, as the messages give them.
FINALIZE = "beam_moe_finalize"
FUSED = "beam_moe_finalize_norm_residual_norm"
GATHER = "beam_moe_finalize_gather_norm_residual_norm"
NRN = "beam_norm_residual_norm"
STRATEGY_NAMES = '"auto", "fused", "unfused", "oneshot" or "twoshot"'
# The tensors of each operation, as a message names them (A.same_device).
FINALIZE_NAMES = ("expert_outputs", "expert_weights", "output", "post_weight")
FUSED_NAMES = ("x.gemm2_permuted", "x.expert_weights", "residual", "post_weight", "next_weight")
NRN_NAMES = ("x", "residual", "pre_weight", "next_weight")


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

