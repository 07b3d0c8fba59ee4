"""The gather wrapper over a CPU group: R ranks as threads of this process,
each with its own tokens, all bit-identical to the local fused operation."""
import pytest
import torch

import beammoe
from conftest import H, K, check_gather, local_rows, run_ranks
from reference import BF16, assert_bits_equal, layer, random_bf16, random_case


@pytest.mark.parametrize("nranks", [2, 3])
@pytest.mark.parametrize("tokens", [0, 1, 7, 24])
def test_gather_matches_local_fused(gen, nranks, tokens):
    data = layer(gen, tokens, K, H)
    with beammoe.CpuGroup(nranks) as grp:
        def body(r):
            with beammoe.Workspace.cpu(grp, r, 32, H, moe_gather_oneshot_max_tokens=4,
                                       moe_gather_separate_norm_min_tokens=17) as ws:
                assert (ws.rank, ws.world_size, ws.nranks) == (r, nranks, nranks)
                assert (ws.oneshot_max_tokens, ws.twoshot_max_tokens) == (4, 16)
                check_gather(ws, r, nranks, lambda t: data, (tokens,))

        run_ranks(nranks, body)


def test_gather_without_norms(gen):
    nranks, tokens, top_k, hidden = 2, 5, 2, 256
    g, w = random_case(gen, tokens, top_k, hidden)
    residual = random_bf16(gen, tokens, hidden)
    want_h, _ = beammoe.beam_moe_finalize_norm_residual_norm(
        beammoe.MoEOutput(g, w), residual.clone(), None, None, None, None, None)
    with beammoe.CpuGroup(nranks) as grp:
        def body(r):
            with beammoe.Workspace.cpu(grp, r, 8, hidden) as ws:
                lg, lw = local_rows(g, w, tokens, nranks, r, top_k, hidden, pad=0)
                return beammoe.beam_moe_finalize_gather_norm_residual_norm(
                    beammoe.MoEOutput(lg, lw), residual.clone(), None, None, None, None, None, ws)

        for h, n in run_ranks(nranks, body):
            assert n is None
            assert_bits_equal(h, want_h)


def test_gather_errors(gen):
    nranks, hidden = 2, 256
    with beammoe.CpuGroup(nranks) as grp:
        def body(r):
            g, w = random_case(gen, 3, 2, hidden)

            def call(tokens, ws, **kw):
                return beammoe.beam_moe_finalize_gather_norm_residual_norm(
                    beammoe.MoEOutput(g, w), torch.zeros(tokens, hidden, dtype=BF16), None, None, None, None,
                    None, ws, **kw)
            with beammoe.Workspace.cpu(grp, r, 4, hidden, timeout_ms=5000) as ws:
                # Every rank breaks the same rule: tokens above max_tokens.
                with pytest.raises(ValueError, match=r"tokens=5 must be <= max_tokens=4 of the workspace"):
                    call(5, ws)
                with pytest.raises(ValueError, match=r"strategy=FUSED: unknown strategy for this operation"):
                    call(4, ws, strategy="fused")
                with pytest.raises(TypeError, match=r"workspace must be a beammoe.Workspace"):
                    call(4, None)
            with pytest.raises(ValueError, match=r"the workspace is closed"):
                call(4, ws)

        run_ranks(nranks, body)


def test_single_rank_group(gen):
    """R = 1 in the calling thread: the gather is the local fused op."""
    tokens, top_k, hidden = 6, 3, 256
    g, w = random_case(gen, tokens, top_k, hidden)
    residual = random_bf16(gen, tokens, hidden)
    want_h, want_n = beammoe.beam_moe_finalize_norm_residual_norm(
        beammoe.MoEOutput(g, w), residual.clone(), None, 1e-6, None, 1e-6, (1.0, 0.5))
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 8, hidden) as ws:
        assert (ws.rank, ws.nranks, ws.device) == (0, 1, torch.device("cpu"))
        h, n = beammoe.beam_moe_finalize_gather_norm_residual_norm(
            beammoe.MoEOutput(g, w), residual.clone(), None, 1e-6, None, 1e-6, (1.0, 0.5), ws)
    assert ws.closed
    assert_bits_equal(h, want_h)
    assert_bits_equal(n, want_n)
