"""beam_moe_finalize on CPU tensors: bit for bit against the torch eager
reference for the finalize stage; the post-norm against the C library's own
norm_residual_norm and the torch-written tree of docs/numerics.md."""
import pytest
import torch

import beammoe
from reference import BF16, assert_bits_equal, finalize_ref, random_bf16, random_case, rmsnorm_hf, rmsnorm_spec

SHAPES = [  # capacity, live, top_k, hidden
    (1, 1, 1, 256),
    (7, 7, 8, 256),
    (9, 5, 3, 512),
    (16, 13, 2, 768),
    (4, 4, 32, 256),
    (33, 33, 6, 1024),
    (3, 0, 4, 256),
]


@pytest.mark.parametrize("capacity,live,top_k,hidden", SHAPES)
@pytest.mark.parametrize("routed_scale", [1.0, 0.7, 2.5])
def test_finalize_matches_eager(gen, capacity, live, top_k, hidden, routed_scale):
    g, w = random_case(gen, capacity, top_k, hidden, tokens=live, specials=True)
    out = torch.full((live, hidden), 1.5, dtype=BF16)
    ret = beammoe.beam_moe_finalize(g, w, out, routed_scale)
    assert ret is out
    assert_bits_equal(out, finalize_ref(g, w, live, routed_scale), "finalize")


def test_finalize_3d_layout(gen):
    capacity, top_k, hidden = 6, 4, 512
    g, w = random_case(gen, capacity, top_k, hidden)
    out2 = torch.empty(capacity, hidden, dtype=BF16)
    out3 = torch.empty(capacity, hidden, dtype=BF16)
    beammoe.beam_moe_finalize(g, w, out2)
    beammoe.beam_moe_finalize(g.view(capacity, top_k, hidden), w, out3)
    assert_bits_equal(out3, out2, "3-D vs 2-D layout")
    assert_bits_equal(out2, finalize_ref(g, w, capacity), "finalize")


def test_finalize_nan_canonical():
    g = torch.zeros(2, 256, dtype=BF16)
    g[0, 0] = float("inf")
    w = torch.tensor([[0.0, 1.0]])  # inf * 0 = NaN
    out = torch.empty(1, 256, dtype=BF16)
    beammoe.beam_moe_finalize(g, w, out)
    assert int(out.view(torch.int16)[0, 0]) == 0x7FFF


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("routed_scale", [1.0, 1.25])
def test_finalize_post_norm(gen, affine, routed_scale):
    capacity, live, top_k, hidden = 11, 9, 4, 1280
    g, w = random_case(gen, capacity, top_k, hidden, tokens=live)
    pw = random_bf16(gen, hidden) if affine else None
    eps = 1e-6
    out = torch.empty(live, hidden, dtype=BF16)
    beammoe.beam_moe_finalize(g, w, out, routed_scale, pw, eps)

    # The C library's other entry point: finalize without the norm, then the
    # pre-norm of norm_residual_norm with a residual of -0.0 (x + -0 == x).
    plain = torch.empty(live, hidden, dtype=BF16)
    beammoe.beam_moe_finalize(g, w, plain, routed_scale)
    assert_bits_equal(plain, finalize_ref(g, w, live, routed_scale), "finalize stage")
    minus_zero = torch.full((live, hidden), -0.0, dtype=BF16)
    via_nrn, _ = beammoe.norm_residual_norm(plain, minus_zero, pw, eps)
    assert_bits_equal(out, via_nrn, "post-norm vs norm_residual_norm's pre-norm")

    # the tree of docs/numerics.md#halving-tree in torch ops, bit for bit; HF's RMSNorm within one BF16 step.
    assert_bits_equal(out, rmsnorm_spec(plain.float(), pw, eps), "post-norm vs torch-written tree")
    hf = rmsnorm_hf(plain, pw, eps)
    step = (out.view(torch.int16).int() - hf.view(torch.int16).int()).abs()
    assert int(step.max()) <= 1


def test_finalize_leaves_rows_past_output(gen):
    """Only output's rows are written; a view of a larger buffer keeps the rest."""
    capacity, top_k, hidden = 8, 2, 256
    g, w = random_case(gen, capacity, top_k, hidden)
    buf = torch.full((capacity, hidden), 3.0, dtype=BF16)
    beammoe.beam_moe_finalize(g, w, buf[:5])
    assert_bits_equal(buf[:5], finalize_ref(g, w, 5), "rows written")
    assert torch.equal(buf[5:], torch.full((3, hidden), 3.0, dtype=BF16))
