"""beam_moe_finalize and beam_moe_finalize_norm_residual_norm on CPU tensors:
the finalize stage bit for bit against the torch eager reference; the
post-norm against the C library's own norm_residual_norm and the
torch-written tree of docs/numerics.md; the fused operation, every
strategy, new hidden and in place, against the composition of the
library's separate operations and against the torch-written reference.
prepare_finalize_norm_residual_norm: checked once, then one library call
per step on the same (refilled) tensors, with the function's bits."""
import pytest
import torch

import beammoe
from reference import BF16, assert_bits_equal, finalize_ref, fused_spec, layer, nrn_spec, random_bf16, random_case
from reference import rmsnorm_hf, rmsnorm_spec

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
    assert_bits_equal((h1, n1), (h2, n2))


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
    assert_bits_equal((h, n), (sh, sn))
    assert_bits_equal(res, res_in, "residual left unchanged")
    # the reference's positional order: (x, residual, pre_weight, pre_eps, next_weight, next_eps, scales)
    h1, n1 = beammoe.norm_residual_norm(x, res, prw, 1e-6, nw, 1e-5, (0.5, 2.0))
    assert_bits_equal((h1, n1), (sh, sn))
    # in place
    r2 = res.clone()
    h2, n2 = beammoe.beam_norm_residual_norm(x, r2, prw, 1e-6, None, None, (0.5, 2.0), inplace=True)
    assert h2 is r2 and n2 is None
    assert_bits_equal(r2, sh)


# ---- prepared calls ------------------------------------------------------------

T, K, H = 5, 8, 512


def _want(g, w, residual, pw, nw, scales=(0.5, 2.0)):
    return beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), residual, pw, 1e-6, nw, 1e-5,
                                                        scales, 2.5)


def test_prepared_inplace_over_steps(gen):
    g, w, residual, pw, nw = layer(gen, T, K, H, scale=1.0)
    call = beammoe.prepare_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), residual, pw, 1e-6, nw, 1e-5,
                                                       (0.5, 2.0), 2.5)
    assert isinstance(call, beammoe.PreparedCall)
    for step in range(3):
        g2, w2 = random_case(gen, T, K, H)
        g.copy_(g2)  # the engine refills its buffers in place
        w.copy_(w2)
        before = residual.clone()
        want_h, want_n = _want(g, w, before, pw, nw)
        v = residual._version
        h, n = call()
        assert h is residual and residual._version > v
        assert_bits_equal((h, n), (want_h, want_n), "step %d" % step)
        assert call()[1] is n  # the same output tensors every call


def test_prepared_new_hidden_and_no_next_norm(gen):
    g, w = random_case(gen, T, K, H)
    residual = random_bf16(gen, T, H)
    before = residual.clone()
    hidden = torch.empty(T, H, dtype=BF16)
    call = beammoe.prepare_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), residual, None, None, None, None,
                                                       None, inplace=False, hidden=hidden, strategy="unfused")
    h, n = call()
    assert h is hidden and n is None
    want, _ = beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), residual, None, None, None, None,
                                                           None)
    assert_bits_equal(h, want)
    assert_bits_equal(residual, before, "residual left unchanged")


def test_prepared_checks(gen):
    g, w = random_case(gen, T, K, H)
    residual = random_bf16(gen, T, H)
    fn = "prepare_finalize_norm_residual_norm"
    x = beammoe.MoEOutput(g, w)
    with pytest.raises(ValueError, match=r"beam_moe_finalize_norm_residual_norm: post_norm->eps"):
        beammoe.prepare_finalize_norm_residual_norm(x, residual, None, -1.0, None, None, None)
    with pytest.raises(ValueError, match=r"^%s: normalized is given but next_eps is None" % fn):
        beammoe.prepare_finalize_norm_residual_norm(x, residual, None, None, None, None, None,
                                                    normalized=torch.empty_like(residual))
    with pytest.raises(ValueError, match=r"^%s: hidden must have shape \(5, 512\)" % fn):
        beammoe.prepare_finalize_norm_residual_norm(x, residual, None, None, None, None, None, inplace=False,
                                                    hidden=torch.empty(4, H, dtype=BF16))
    with pytest.raises(RuntimeError, match=r"^%s: a prepared call is for inference" % fn):
        beammoe.prepare_finalize_norm_residual_norm(x, residual, torch.nn.Parameter(random_bf16(gen, H)), 1e-6,
                                                    None, None, None)
    with pytest.raises(TypeError, match=r"^%s: inplace must be True or False" % fn):
        beammoe.prepare_finalize_norm_residual_norm(x, residual, None, None, None, None, None, inplace=1)
    call = beammoe.prepare_finalize_norm_residual_norm(x, residual, None, None, None, 1e-6, None)
    residual.resize_(2 * T, H)  # a new storage: the prepared addresses are stale
    with pytest.raises(RuntimeError, match=r"another data pointer .* prepare the call again"):
        call()


def test_prepared_under_inference_mode(gen):
    g, w = random_case(gen, T, K, H)
    with torch.inference_mode():
        residual = random_bf16(gen, T, H)
        want_h, want_n = _want(g, w, residual, None, None, None)
        call = beammoe.prepare_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), residual, None, 1e-6, None, 1e-5,
                                                           None, 2.5)
        h, n = call()
    assert_bits_equal((h, n), (want_h, want_n))
