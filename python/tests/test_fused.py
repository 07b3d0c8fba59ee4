"""beam_moe_finalize_norm_residual_norm on CPU tensors: every strategy, new
hidden and in place, against the composition of the library's separate
operations and against the torch-written reference."""
import pytest
import torch

import beammoe
from reference import BF16, assert_bits_equal, fused_spec, nrn_spec, random_bf16, random_case

CASES = [  # capacity, live, top_k, hidden
    (1, 1, 1, 256),
    (12, 12, 8, 512),
    (10, 7, 4, 2048),
    (5, 0, 2, 256),
]
NORMS = [  # post (affine, eps), next (affine, eps)
    ((True, 1e-6), (True, 1e-5)),
    ((False, 1e-6), (False, 1e-6)),
    ((None, None), (True, 1e-6)),
    ((True, 1e-5), (None, None)),
    ((None, None), (None, None)),
]


def _norm(gen, hidden, spec):
    affine, eps = spec
    if eps is None:
        return None, None
    return (random_bf16(gen, hidden) if affine else None), eps


@pytest.mark.parametrize("capacity,live,top_k,hidden", CASES)
@pytest.mark.parametrize("norms", NORMS)
@pytest.mark.parametrize("scales", [None, (0.5, 1.0), (1.25, 0.75)])
@pytest.mark.parametrize("strategy", [None, "fused", "unfused"])
@pytest.mark.parametrize("inplace", [False, True])
def test_fused(gen, capacity, live, top_k, hidden, norms, scales, strategy, inplace):
    g, w = random_case(gen, capacity, top_k, hidden, tokens=live, specials=True)
    pw, pe = _norm(gen, hidden, norms[0])
    nw, ne = _norm(gen, hidden, norms[1])
    residual = random_bf16(gen, live, hidden, scale=3.0)
    residual_in = residual.clone()
    routed_scale = 1.5
    x = beammoe.MoEOutput(g, w, live_tokens=live)

    hidden_out, normalized = beammoe.beam_moe_finalize_norm_residual_norm(
        x, residual, pw, pe, nw, ne, scales, routed_scale, strategy=strategy, inplace=inplace)
    if inplace:
        assert hidden_out is residual
    else:
        assert hidden_out is not residual and hidden_out.shape == residual.shape
        assert_bits_equal(residual, residual_in, "residual left unchanged")
    assert (normalized is None) == (ne is None)

    # The composition of the library's separate operations.
    f = torch.empty(live, hidden, dtype=BF16)
    beammoe.beam_moe_finalize(g, w, f, routed_scale, pw, pe)
    want_h, want_n = beammoe.beam_norm_residual_norm(f, residual_in, None, None, nw, ne, scales)
    assert_bits_equal(hidden_out, want_h, "hidden vs composition")
    if ne is not None:
        assert_bits_equal(normalized, want_n, "normalized vs composition")

    # The torch-written reference.
    sh, sn = fused_spec(g, w, live, residual_in, pw, pe, nw, ne, scales, routed_scale)
    assert_bits_equal(hidden_out, sh, "hidden vs the torch-written reference")
    if ne is not None:
        assert_bits_equal(normalized, sn, "normalized vs the torch-written reference")


def test_live_tokens_defaults_to_residual_rows(gen):
    capacity, top_k, hidden = 9, 3, 256
    g, w = random_case(gen, capacity, top_k, hidden, tokens=6)
    r1 = random_bf16(gen, 6, hidden)
    r2 = r1.clone()
    h1, n1 = beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), r1, None, None, None, 1e-6,
                                                         None)
    h2, n2 = beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w, 6), r2, None, None, None,
                                                         1e-6, None, inplace=True)
    assert h2 is r2
    assert_bits_equal(h1, h2)
    assert_bits_equal(n1, n2)


def test_any_object_with_the_attributes(gen):
    class Out:  # e.g. an engine's own result type
        pass

    capacity, top_k, hidden = 4, 2, 512
    g, w = random_case(gen, capacity, top_k, hidden)
    o = Out()
    o.gemm2_permuted, o.expert_weights = g, w
    r = random_bf16(gen, capacity, hidden)
    want = nrn_spec(
        beammoe.beam_moe_finalize(g, w, torch.empty(capacity, hidden, dtype=BF16)), r, None, None,
        (2.0, 1.0), None, None)[0]
    h, n = beammoe.beam_moe_finalize_norm_residual_norm(o, r, None, None, None, None, [2.0, 1.0])
    assert n is None
    assert_bits_equal(h, want)


def test_norm_residual_norm_pre_norm(gen):
    t, hidden = 5, 768
    x = random_bf16(gen, t, hidden, scale=2.0)
    res = random_bf16(gen, t, hidden)
    prw, nw = random_bf16(gen, hidden), random_bf16(gen, hidden)
    res_in = res.clone()
    h, n = beammoe.beam_norm_residual_norm(x, res, prw, 1e-6, nw, 1e-5, (0.5, 2.0))
    sh, sn = nrn_spec(x, res_in, prw, 1e-6, (0.5, 2.0), nw, 1e-5)
    assert_bits_equal(h, sh, "hidden")
    assert_bits_equal(n, sn, "normalized")
    assert_bits_equal(res, res_in, "residual left unchanged")
    # the reference's positional order: (x, residual, pre_weight, pre_eps, next_weight, next_eps, scales)
    h1, n1 = beammoe.norm_residual_norm(x, res, prw, 1e-6, nw, 1e-5, (0.5, 2.0))
    assert_bits_equal(h1, sh)
    assert_bits_equal(n1, sn)
    # in place
    r2 = res.clone()
    h2, n2 = beammoe.beam_norm_residual_norm(x, r2, prw, 1e-6, None, None, (0.5, 2.0), inplace=True)
    assert h2 is r2 and n2 is None
    assert_bits_equal(r2, sh)
