"""The FP8 output's tensors and its beam_quant struct, shared by the
functions (fp8.py) and the torch operators (_torch_ops.py): the same shapes,
strides and dtype in a call, its fake implementation and a CUDA graph."""
import torch

from . import _run

KINDS = {"group": 1, "token": 2, "tensor": 3}
UE8M0 = 1
COL_MAJOR = 2
# torch.float8_e4m3fn where torch has it (>= 2.1); uint8 bits otherwise
FP8 = getattr(torch, "float8_e4m3fn", None)


def empty_outputs(kind, group_size, flags, scale, tokens, hidden, device):
    """(q, q_scales) for tokens x hidden: q [tokens, hidden] FP8; q_scales
    [tokens, hidden / group] (column-major: strides (1, ld), ld = tokens
    rounded up to 4, DeepGEMM's layout), [tokens, 1] per token, or [1]
    holding the static scale."""
    q = torch.empty(tokens, hidden, dtype=FP8 if FP8 is not None else torch.uint8, device=device)
    if kind == KINDS["group"]:
        groups = hidden // group_size
        if flags & COL_MAJOR:
            ld = (tokens + 3) // 4 * 4
            scales = torch.empty_strided((tokens, groups), (1, ld), dtype=torch.float32, device=device)
        else:
            scales = torch.empty(tokens, groups, dtype=torch.float32, device=device)
    elif kind == KINDS["token"]:
        scales = torch.empty(tokens, 1, dtype=torch.float32, device=device)
    else:
        scales = torch.full((1,), scale, dtype=torch.float32, device=device)
    return q, scales


def struct(kind, group_size, flags, scale, q, scales):
    """The beam_quant of a call writing q and scales (keep it alive for the call)."""
    tensor = kind == KINDS["tensor"]
    ld = scales.stride(1) if kind == KINDS["group"] and flags & COL_MAJOR else 0
    return _run.BeamQuant(kind, group_size, flags, scale if tensor else 0.0, _run.addr(q),
                          None if tensor else _run.addr(scales), ld)
