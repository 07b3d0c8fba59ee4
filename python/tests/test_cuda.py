"""The operations on CUDA tensors, bit-identical to the CPU backend's results
(skipped without a GPU or without libbeammoe's CUDA backend)."""
import pytest
import torch

import beammoe
from conftest import needs_cuda, run_ranks
from reference import BF16, assert_bits_equal, layer, random_bf16, random_case

pytestmark = needs_cuda


def _cuda(*ts):
    return [t.cuda() if t is not None else None for t in ts]


@pytest.mark.parametrize("capacity,live,top_k,hidden", [(1, 1, 1, 256), (40, 33, 8, 2048), (300, 257, 4, 7168),
                                                        (6, 0, 2, 512)])
@pytest.mark.parametrize("post", [None, "affine", "plain"])
def test_finalize_cuda_vs_cpu(gen, capacity, live, top_k, hidden, post):
    g, w = random_case(gen, capacity, top_k, hidden, tokens=live, specials=True)
    pw = random_bf16(gen, hidden) if post == "affine" else None
    pe = 1e-6 if post else None
    want = beammoe.beam_moe_finalize(g, w, torch.empty(live, hidden, dtype=BF16), 1.5, pw, pe)
    gc, wc, pwc = _cuda(g, w, pw)
    out = torch.empty(live, hidden, dtype=BF16, device="cuda")
    got = beammoe.beam_moe_finalize(gc, wc, out, 1.5, pwc, pe)
    assert got is out
    assert_bits_equal(out, want, "cuda finalize")


@pytest.mark.parametrize("tokens", [1, 7, 128, 1000])
@pytest.mark.parametrize("strategy", [None, "fused", "unfused"])
@pytest.mark.parametrize("scales", [None, (0.5, 2.0)])
@pytest.mark.parametrize("inplace", [False, True])
def test_fused_cuda_vs_cpu(gen, tokens, strategy, scales, inplace):
    g, w, residual, pw, nw = layer(gen, tokens, 8, 4096, capacity=tokens + 3, scale=3.0)
    want_h, want_n = beammoe.beam_moe_finalize_norm_residual_norm(
        beammoe.MoEOutput(g, w, tokens), residual.clone(), pw, 1e-6, nw, 1e-5, scales, 1.25)
    gc, wc, rc, pwc, nwc = _cuda(g, w, residual, pw, nw)
    h, n = beammoe.beam_moe_finalize_norm_residual_norm(
        beammoe.MoEOutput(gc, wc, tokens), rc, pwc, 1e-6, nwc, 1e-5, scales, 1.25, strategy=strategy,
        inplace=inplace)
    assert (h is rc) == inplace and n.device == rc.device and h.device == rc.device
    if not inplace:
        assert_bits_equal(rc, residual, "residual left unchanged")
    assert_bits_equal((h, n), (want_h, want_n), "cuda")


def test_norm_residual_norm_cuda_vs_cpu(gen):
    x, r = random_bf16(gen, 50, 1024, scale=2.0), random_bf16(gen, 50, 1024)
    prw, nw = random_bf16(gen, 1024), random_bf16(gen, 1024)
    want = beammoe.beam_norm_residual_norm(x, r, prw, 1e-6, nw, 1e-6, (1.5, 0.5))
    got = beammoe.beam_norm_residual_norm(*_cuda(x, r, prw), 1e-6, nw.cuda(), 1e-6, (1.5, 0.5))
    assert_bits_equal(got, want)


def test_side_stream(gen):
    """The call runs on torch's current stream (here a side stream)."""
    g, w = random_case(gen, 64, 4, 2048)
    want = beammoe.beam_moe_finalize(g, w, torch.empty(64, 2048, dtype=BF16))
    gc, wc = _cuda(g, w)
    out = torch.empty(64, 2048, dtype=BF16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        beammoe.beam_moe_finalize(gc, wc, out)
    s.synchronize()
    assert_bits_equal(out, want)


def test_mixed_devices_rejected(gen):
    g, w = random_case(gen, 4, 2, 256)
    out = torch.empty(4, 256, dtype=BF16, device="cuda")
    with pytest.raises(ValueError, match=r"expert_weights is on cpu but expert_outputs is on cuda:0"):
        beammoe.beam_moe_finalize(g.cuda(), w, out)


def test_cpu_after_cuda(gen):
    """Switching devices between calls runs each on its device's backend."""
    g, w = random_case(gen, 8, 2, 256)
    a = beammoe.beam_moe_finalize(g.cuda(), w.cuda(), torch.empty(8, 256, dtype=BF16, device="cuda"))
    b = beammoe.beam_moe_finalize(g, w, torch.empty(8, 256, dtype=BF16))
    c = beammoe.beam_moe_finalize(g.cuda(), w.cuda(), torch.empty(8, 256, dtype=BF16, device="cuda"))
    assert_bits_equal((a, c), (b, b))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_another_device(gen):
    """Tensors on cuda:1 while cuda:0 is current: the call makes cuda:1
    current for itself and leaves the caller's device as it was."""
    g, w = random_case(gen, 16, 4, 1024)
    want = beammoe.beam_moe_finalize(g, w, torch.empty(16, 1024, dtype=BF16))
    torch.cuda.set_device(0)
    out = torch.empty(16, 1024, dtype=BF16, device="cuda:1")
    beammoe.beam_moe_finalize(g.to("cuda:1"), w.to("cuda:1"), out)
    assert torch.cuda.current_device() == 0
    assert_bits_equal(out, want)


def test_threads_on_both_backends(gen):
    """Threads calling with CPU and CUDA tensors at once: each call runs on
    its own device's backend library, with no process-wide switch."""
    g, w = random_case(gen, 256, 8, 4096)
    want = beammoe.beam_moe_finalize(g, w, torch.empty(256, 4096, dtype=BF16))
    ins = {"cuda": _cuda(g, w), "cpu": (g, w)}

    def body(i):
        dev = "cuda" if i % 2 == 0 else "cpu"
        for _ in range(20):
            out = beammoe.beam_moe_finalize(*ins[dev], torch.empty(256, 4096, dtype=BF16, device=dev))
            assert_bits_equal(out, want, dev)

    run_ranks(4, body)


def test_cuda_tensors_with_cpu_workspace(gen):
    g, w = random_case(gen, 4, 2, 256)
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 8, 256) as ws:
        with pytest.raises(ValueError, match=r"the tensors are on cuda:0 but the workspace is on cpu"):
            beammoe.beam_moe_finalize_gather_norm_residual_norm(
                beammoe.MoEOutput(g.cuda(), w.cuda()), torch.zeros(4, 256, dtype=BF16, device="cuda"),
                None, None, None, None, None, ws)


@pytest.mark.parametrize("inplace", [False, True])
def test_prepared_call_cuda_vs_cpu(gen, inplace):
    g, w, residual, pw, nw = layer(gen, 9, 8, 2048, scale=3.0)
    want_h, want_n = beammoe.beam_moe_finalize_norm_residual_norm(
        beammoe.MoEOutput(g, w), residual, pw, 1e-6, nw, 1e-5, (0.5, 2.0), 1.25)
    gc, wc, rc, pwc, nwc = _cuda(g, w, residual, pw, nw)
    call = beammoe.prepare_finalize_norm_residual_norm(beammoe.MoEOutput(gc, wc), rc, pwc, 1e-6, nwc, 1e-5,
                                                       (0.5, 2.0), 1.25, inplace=inplace)
    h, n = call()
    assert (h is rc) == inplace and h.device == rc.device
    assert_bits_equal((h, n), (want_h, want_n), "prepared cuda")
    if not inplace:
        h2, _ = call()
        assert h2 is h
        assert_bits_equal(h2, want_h)
