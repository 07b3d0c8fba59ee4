"""The reference's semantics, tested the way code written against the
reference uses the functions: hidden is a new tensor and residual is left
as it was (a second call, fused against unfused, a residual that is a view
of a larger buffer all see the same residual); tokens = 0 gives empty
tensors; inplace=True is the explicit opt-in, with autograd's rules for
in-place writes. Runs with every torch the package supports (1.13 too)."""
import pytest
import torch

import beammoe
from reference import BF16, assert_bits_equal, bits, fused_spec, nrn_spec, random_bf16, random_case
from reference import layer as layer_data

T, K, H = 6, 8, 512


@pytest.fixture
def layer(gen):
    g, w, residual, pw, nw = layer_data(gen, T, K, H, scale=3.0)
    return beammoe.MoEOutput(g, w), residual, pw, nw


def fused(x, residual, pw, nw, **kw):
    return beammoe.beam_moe_finalize_norm_residual_norm(x, residual, pw, 1e-6, nw, 1e-6, (0.5, 2.0), 2.5, **kw)


def test_residual_unchanged_and_hidden_new(layer):
    x, residual, pw, nw = layer
    before = residual.clone()
    version = residual._version
    hidden, normalized = fused(x, residual, pw, nw)
    assert hidden is not residual and hidden.data_ptr() != residual.data_ptr()
    assert hidden.shape == residual.shape and hidden.dtype == BF16
    assert torch.equal(bits(residual), bits(before)), "residual was written"
    assert residual._version == version
    sh, sn = fused_spec(x.gemm2_permuted, x.expert_weights, T, before, pw, 1e-6, nw, 1e-6, (0.5, 2.0), 2.5)
    assert_bits_equal(hidden, sh, "hidden")
    assert_bits_equal(normalized, sn, "normalized")


def test_second_call_same_bits(layer):
    x, residual, pw, nw = layer
    h1, n1 = fused(x, residual, pw, nw)
    h2, n2 = fused(x, residual, pw, nw)
    assert_bits_equal(h2, h1, "second call hidden")
    assert_bits_equal(n2, n1, "second call normalized")


def test_fused_and_unfused_equal_bits(layer):
    x, residual, pw, nw = layer
    hf, nf = fused(x, residual, pw, nw, strategy="fused")
    hu, nu = fused(x, residual, pw, nw, strategy="unfused")
    ha, na = fused(x, residual, pw, nw)
    for h, n, what in ((hu, nu, "unfused"), (ha, na, "auto")):
        assert_bits_equal(h, hf, what + " hidden")
        assert_bits_equal(n, nf, what + " normalized")
    # the reference's unfused path written out: finalize (with the post norm),
    # then beam_norm_residual_norm(x, residual, pre_weight, pre_eps, next_weight, next_eps, scales)
    f = beammoe.beam_moe_finalize(x.gemm2_permuted, x.expert_weights, torch.empty(T, H, dtype=BF16), 2.5, pw, 1e-6)
    h, n = beammoe.beam_norm_residual_norm(f, residual, None, None, nw, 1e-6, (0.5, 2.0))
    assert_bits_equal(h, hf, "finalize + norm_residual_norm hidden")
    assert_bits_equal(n, nf, "finalize + norm_residual_norm normalized")


def test_residual_view_of_a_larger_buffer(layer):
    x, residual, pw, nw = layer
    buf = torch.full((T + 4, H), 7.0, dtype=BF16)
    buf[2:2 + T] = residual
    before = buf.clone()
    view = buf[2:2 + T]
    h, n = fused(x, view, pw, nw)
    assert torch.equal(bits(buf), bits(before)), "the buffer under the residual view was written"
    want_h, want_n = fused(x, residual, pw, nw)
    assert_bits_equal(h, want_h)
    assert_bits_equal(n, want_n)
    # in place writes exactly the view's rows
    h2, _ = fused(x, view, pw, nw, inplace=True)
    assert h2 is view
    assert_bits_equal(buf[2:2 + T], want_h, "rows of the view")
    assert torch.equal(bits(buf[:2]), bits(before[:2])) and torch.equal(bits(buf[2 + T:]), bits(before[2 + T:]))


@pytest.mark.parametrize("next_norm", [True, False])
def test_tokens_zero_gives_empty_tensors(gen, next_norm):
    g, w = random_case(gen, 3, K, H)
    residual = torch.empty(0, H, dtype=BF16)
    nw = random_bf16(gen, H) if next_norm else None
    ne = 1e-6 if next_norm else None
    for strategy in (None, "fused", "unfused"):
        h, n = beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), residual, None, None, nw, ne,
                                                            None, strategy=strategy)
        assert h.shape == (0, H) and h.dtype == BF16 and h is not residual
        if next_norm:
            assert n.shape == (0, H) and n.dtype == BF16
        else:
            assert n is None
    h, n = beammoe.beam_norm_residual_norm(residual, residual, None, None, nw, ne, None)
    assert h.shape == (0, H) and (n is None) != next_norm
    out = beammoe.beam_moe_finalize(g, w, torch.empty(0, H, dtype=BF16))
    assert out.shape == (0, H)


def test_norm_residual_norm_new_hidden(gen):
    x, residual = random_bf16(gen, T, H, scale=2.0), random_bf16(gen, T, H)
    prw, nw = random_bf16(gen, H), random_bf16(gen, H)
    before = residual.clone()
    h, n = beammoe.beam_norm_residual_norm(x, residual, prw, 1e-6, nw, 1e-5, (1.5, 0.5))
    assert h is not residual
    assert torch.equal(bits(residual), bits(before))
    sh, sn = nrn_spec(x, before, prw, 1e-6, (1.5, 0.5), nw, 1e-5)
    assert_bits_equal(h, sh)
    assert_bits_equal(n, sn)


def test_gather_leaves_residual(gen):
    """The gather returns a new hidden too (one rank, in this thread)."""
    g, w = random_case(gen, T, K, H)
    residual = random_bf16(gen, T, H)
    before = residual.clone()
    want_h, want_n = beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), residual, None, 1e-6,
                                                                  None, 1e-6, None)
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 16, H) as ws:
        h, n = beammoe.beam_moe_finalize_gather_norm_residual_norm(beammoe.MoEOutput(g, w), residual, None, 1e-6,
                                                                   None, 1e-6, None, ws)
        assert h is not residual and torch.equal(bits(residual), bits(before))
        assert_bits_equal(h, want_h)
        assert_bits_equal(n, want_n)
        v = residual._version
        h2, n2 = beammoe.beam_moe_finalize_gather_norm_residual_norm(beammoe.MoEOutput(g, w), residual, None,
                                                                     1e-6, None, 1e-6, None, ws, inplace=True)
        assert h2 is residual and residual._version > v
        assert_bits_equal(residual, want_h)


# ---- inplace=True: the explicit opt-in ------------------------------------------

def test_inplace_updates_residual_and_its_version(layer):
    x, residual, pw, nw = layer
    want_h, want_n = fused(x, residual, pw, nw)
    v = residual._version
    h, n = fused(x, residual, pw, nw, inplace=True)
    assert h is residual
    assert residual._version > v, "an in-place write must bump the version counter"
    assert_bits_equal(residual, want_h)
    assert_bits_equal(n, want_n)


def test_inplace_under_inference_mode(layer):
    x, residual, pw, nw = layer
    want_h, _ = fused(x, residual, pw, nw)
    with torch.inference_mode():
        r = residual.clone()
        h, _ = fused(x, r, pw, nw, inplace=True)
    assert h is r
    assert_bits_equal(r, want_h)


def test_inplace_must_be_a_bool(layer):
    x, residual, pw, nw = layer
    with pytest.raises(TypeError, match=r"inplace must be True or False, got int"):
        fused(x, residual, pw, nw, inplace=1)


def test_inplace_refuses_a_leaf_that_requires_grad(layer):
    x, residual, pw, nw = layer
    leaf = residual.clone().requires_grad_()
    before = residual.clone()
    with pytest.raises(RuntimeError, match=r"leaf Variable that requires grad"):
        fused(x, leaf, pw, nw, inplace=True)
    assert torch.equal(bits(leaf.detach()), bits(before))
    with pytest.raises(RuntimeError, match=r"leaf Variable that requires grad"):
        beammoe.beam_norm_residual_norm(before, leaf, None, None, None, None, None, inplace=True)
    out = torch.zeros(T, H, dtype=BF16, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"beam_moe_finalize: output would be written in place"):
        beammoe.beam_moe_finalize(x.gemm2_permuted, x.expert_weights, out)
    # under no_grad the write is an ordinary in-place update
    with torch.no_grad():
        v = leaf._version
        h, _ = fused(x, leaf, pw, nw, inplace=True)
        assert h is leaf and leaf._version > v


def test_inplace_with_inputs_that_require_grad(layer):
    """A norm weight that requires grad (a model's nn.Parameter) outside
    no_grad: the in-place forward runs with the same bits; the written
    residual then carries a backward function that refuses."""
    x, residual, pw, nw = layer
    want_h, want_n = fused(x, residual, pw, nw)
    pwg = torch.nn.Parameter(pw.clone())
    r = residual.clone()
    v = r._version
    h, n = fused(x, r, pwg, nw, inplace=True)
    assert h is r and r._version > v
    assert_bits_equal(r.detach(), want_h)
    assert_bits_equal(n.detach(), want_n)
    assert r.requires_grad and r.grad_fn is not None
    with pytest.raises(RuntimeError, match=r"no derivative"):
        r.float().sum().backward()


def test_backward_is_refused(layer):
    """New results of inputs that require grad: the forward runs and gives the
    same bits; a backward pass through them is an error, never a silent
    wrong gradient."""
    x, residual, pw, nw = layer
    want_h, want_n = fused(x, residual, pw, nw)
    r = residual.clone().requires_grad_()
    h, n = fused(x, r, pw, nw)
    assert h.requires_grad and n.requires_grad
    assert_bits_equal(h.detach(), want_h)
    assert_bits_equal(n.detach(), want_n)
    with pytest.raises(RuntimeError, match=r"no derivative"):
        (h.float().sum() + n.float().sum()).backward()
    h2, _ = beammoe.beam_norm_residual_norm(residual, r, None, None, None, None, None)
    with pytest.raises(RuntimeError, match=r"no derivative"):
        h2.float().sum().backward()


def test_signed_zero_scales_not_confused(gen):
    """(1, +0) and (1, -0) give different bits (x + +0 vs x + -0 for x = -0):
    each call gets its own scales."""
    x = torch.full((2, H), -0.0, dtype=BF16)
    residual = torch.ones(2, H, dtype=BF16)
    hp, _ = beammoe.beam_norm_residual_norm(x, residual, None, None, None, None, (1.0, 0.0))
    hm, _ = beammoe.beam_norm_residual_norm(x, residual, None, None, None, None, (1.0, -0.0))
    hp2, _ = beammoe.beam_norm_residual_norm(x, residual, None, None, None, None, (1.0, 0.0))
    assert int(bits(hp)[0, 0]) == 0x0000 and int(bits(hm)[0, 0]) & 0xFFFF == 0x8000
    assert torch.equal(bits(hp), bits(hp2))
