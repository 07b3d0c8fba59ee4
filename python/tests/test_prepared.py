"""prepare_finalize_norm_residual_norm: checked once, then one library call
per step on the same (refilled) tensors, with the function's bits."""
import pytest
import torch

import beammoe
from reference import BF16, assert_bits_equal, layer, random_bf16, random_case

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
        assert_bits_equal(h, want_h, "step %d hidden" % step)
        assert_bits_equal(n, want_n, "step %d normalized" % step)
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
    assert_bits_equal(h, want_h)
    assert_bits_equal(n, want_n)
