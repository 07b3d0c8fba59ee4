"""The quantized output's tensors and its beam_quant struct, shared by the
functions (fp8.py) and the torch operators (_torch_ops.py): the same shapes,
strides and dtype in a call, its fake implementation and a CUDA graph. The
FP8 kinds (docs/numerics.md#fp8) and NVFP4 (docs/numerics.md#nvfp4)."""
import torch

from . import _run

KINDS = {"group": 1, "token": 2, "tensor": 3}  # FP8Quant's kinds
NVFP4 = 4  # BEAM_QUANT_NVFP4: NVFP4Quant's kind, not an FP8Quant kind
NVFP4_BLOCK = 16  # values per E4M3 block scale (the library's group_size)
UE8M0 = 1
COL_MAJOR = 2
# torch.float8_e4m3fn where torch has it (>= 2.1); uint8 bits otherwise
FP8 = getattr(torch, "float8_e4m3fn", None)
# torch.float4_e2m1fn_x2 (two E2M1 values a byte) where torch has it (newer
# than float8); uint8 bits otherwise
FP4X2 = getattr(torch, "float4_e2m1fn_x2", None)


def _bits(dtype):
    return dtype if dtype is not None else torch.uint8


def nvfp4_outputs(tokens, hidden, device):
    """(q, q_scales) of NVFP4, as vLLM's scaled_fp4_quant returns them: q
    [tokens, hidden / 2] packed E2M1; q_scales [tokens rounded up to 128,
    hidden / 16] E4M3, whose bytes are the 128 x 4 tiled layout
    (BEAM_NVFP4_SCALE_BYTES of them; the rows past the last token's tile
    row are padding the library does not write)."""
    q = torch.empty(tokens, hidden // 2, dtype=_bits(FP4X2), device=device)
    rows = (tokens + 127) // 128 * 128
    return q, torch.empty(rows, hidden // NVFP4_BLOCK, dtype=_bits(FP8), device=device)


def empty_outputs(kind, group_size, flags, scale, tokens, hidden, device):
    """(q, q_scales) for tokens x hidden: q [tokens, hidden] FP8; q_scales
    [tokens, hidden / group] (column-major: strides (1, ld), ld = tokens
    rounded up to 4, DeepGEMM's layout), [tokens, 1] per token, or [1]
    holding the static scale; NVFP4: nvfp4_outputs."""
    if kind == NVFP4:
        return nvfp4_outputs(tokens, hidden, device)
    q = torch.empty(tokens, hidden, dtype=_bits(FP8), device=device)
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
    if kind == NVFP4:  # the block scales in block_scales; the FP8 scales pointer stays NULL
        return _run.BeamQuant(kind, group_size, flags, scale, _run.addr(q), None, 0, _run.addr(scales))
    tensor = kind == KINDS["tensor"]
    ld = scales.stride(1) if kind == KINDS["group"] and flags & COL_MAJOR else 0
    return _run.BeamQuant(kind, group_size, flags, scale if tensor else 0.0, _run.addr(q),
                          None if tensor else _run.addr(scales), ld)
