"""The gather wrapper over a CPU group: R ranks as threads of this process,
each with its own tokens, all bit-identical to the local fused operation."""
import threading

import pytest
import torch

import beammoe
from reference import BF16, assert_bits_equal, random_bf16, random_case


def run_ranks(nranks, body):
    """Run body(rank) on nranks threads; re-raise the first failure."""
    results, errors = [None] * nranks, []

    def main(r):
        try:
            results[r] = body(r)
        except BaseException as e:  # reported in the main thread
            errors.append((r, e))

    ts = [threading.Thread(target=main, args=(r,)) for r in range(nranks)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not any(t.is_alive() for t in ts), "a rank did not finish"
    if errors:
        r, e = errors[0]
        raise AssertionError("rank %d: %r" % (r, e)) from e
    return results


def local_rows(g, w, tokens, nranks, rank, top_k, hidden, pad=1):
    """Rank `rank`'s rows of the global expert arrays, capacity L + pad, rows
    past its owned ones NaN-filled (they must never be read)."""
    per = -(-tokens // nranks) if tokens else 0
    lo, hi = min(rank * per, tokens), min((rank + 1) * per, tokens)
    cap = per + pad
    lg = torch.full((cap, top_k, hidden), float("nan"), dtype=BF16)
    lw = torch.full((cap, top_k), float("nan"))
    lg[: hi - lo] = g.view(-1, top_k, hidden)[lo:hi]
    lw[: hi - lo] = w[lo:hi]
    return lg.view(cap * top_k, hidden), lw


@pytest.mark.parametrize("nranks", [2, 3])
@pytest.mark.parametrize("tokens", [0, 1, 7, 24])
def test_gather_matches_local_fused(gen, nranks, tokens):
    top_k, hidden = 4, 512
    g, w = random_case(gen, max(tokens, 1), top_k, hidden, specials=True)
    residual = random_bf16(gen, tokens, hidden, scale=2.0)
    pw, nw = random_bf16(gen, hidden), random_bf16(gen, hidden)
    scales, routed = (0.5, 1.5), 1.25

    want_h, want_n = beammoe.beam_moe_finalize_norm_residual_norm(
        beammoe.MoEOutput(g, w, tokens), residual.clone(), pw, 1e-6, nw, 1e-5, scales, routed)

    with beammoe.CpuGroup(nranks) as grp:
        def body(r):
            ws = beammoe.Workspace.cpu(grp, r, 32, hidden, moe_gather_oneshot_max_tokens=4,
                                       moe_gather_separate_norm_min_tokens=17)
            try:
                assert (ws.rank, ws.world_size, ws.nranks) == (r, nranks, nranks)
                assert (ws.oneshot_max_tokens, ws.twoshot_max_tokens) == (4, 16)
                lg, lw = local_rows(g, w, tokens, nranks, r, top_k, hidden)
                out = []
                for strategy in (None, "oneshot", "twoshot", "unfused"):
                    for inplace in (False, True):
                        res = residual.clone()
                        h, n = beammoe.beam_moe_finalize_gather_norm_residual_norm(
                            beammoe.MoEOutput(lg, lw), res, pw, 1e-6, nw, 1e-5, scales, ws, routed,
                            strategy=strategy, inplace=inplace)
                        if inplace:
                            assert h is res
                        else:
                            assert h is not res
                            assert_bits_equal(res, residual, "residual left unchanged")
                        out.append(("%s inplace=%s" % (strategy, inplace), h, n))
                return out
            finally:
                ws.close()

        results = run_ranks(nranks, body)
    for r, out in enumerate(results):
        for strategy, h, n in out:
            assert_bits_equal(h, want_h, "rank %d %s hidden" % (r, strategy))
            assert_bits_equal(n, want_n, "rank %d %s normalized" % (r, strategy))


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
