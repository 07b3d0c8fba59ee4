"""One rank of the CUDA gather test (run by torch.multiprocessing.spawn).

Each rank uses GPU `rank`, joins an NCCL process group over a file:// store,
builds a beammoe.Workspace over it (its own NCCL communicator) and runs the
gather for several token counts and every strategy; every result must equal,
bit for bit, the local fused operation of the CPU backend on all tokens.
A second workspace over a gloo subgroup checks that the unique id may travel
over any process group.
"""
import os

import torch
import torch.distributed as dist


def _case(tokens, top_k, hidden, seed):
    from reference import random_bf16, random_case

    gen = torch.Generator()
    gen.manual_seed(seed)  # the same data on every rank
    g, w = random_case(gen, max(tokens, 1), top_k, hidden, specials=True)
    residual = random_bf16(gen, tokens, hidden, scale=2.0)
    pw, nw = random_bf16(gen, hidden), random_bf16(gen, hidden)
    return g, w, residual, pw, nw


def _local(g, w, tokens, nranks, rank, top_k, hidden):
    from reference import BF16

    per = -(-tokens // nranks) if tokens else 0
    lo, hi = min(rank * per, tokens), min((rank + 1) * per, tokens)
    cap = per + 1
    lg = torch.full((cap, top_k, hidden), float("nan"), dtype=BF16)
    lw = torch.full((cap, top_k), float("nan"))
    lg[: hi - lo] = g.view(-1, top_k, hidden)[lo:hi]
    lw[: hi - lo] = w[lo:hi]
    return lg.view(cap * top_k, hidden), lw


def _check(ws, rank, nranks, cases, strategies, dev):
    import beammoe
    from reference import assert_bits_equal

    top_k, hidden = 8, ws.hidden
    scales, routed = (0.5, 1.5), 1.25
    for tokens in cases:
        g, w, residual, pw, nw = _case(tokens, top_k, hidden, 1000 + tokens)
        want_h, want_n = beammoe.beam_moe_finalize_norm_residual_norm(
            beammoe.MoEOutput(g, w, tokens), residual.clone(), pw, 1e-6, nw, 1e-5, scales, routed)
        lg, lw = _local(g, w, tokens, nranks, rank, top_k, hidden)
        lg, lw, pwc, nwc = lg.to(dev), lw.to(dev), pw.to(dev), nw.to(dev)
        for strategy in strategies:
            for inplace in (False, True):
                res = residual.to(dev)
                h, n = beammoe.beam_moe_finalize_gather_norm_residual_norm(
                    beammoe.MoEOutput(lg, lw), res, pwc, 1e-6, nwc, 1e-5, scales, ws, routed, strategy=strategy,
                    inplace=inplace)
                what = "rank %d/%d tokens %d strategy %s inplace=%s" % (rank, nranks, tokens, strategy, inplace)
                if inplace:
                    assert h is res
                else:
                    assert h is not res
                    assert_bits_equal(res, residual, what + " residual left unchanged")
                assert_bits_equal(h, want_h, what + " hidden")
                assert_bits_equal(n, want_n, what + " normalized")


def worker(rank, nranks, init_file):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method="file://" + init_file, rank=rank, world_size=nranks)
    try:
        import beammoe

        hidden = 2048
        cases = [0, 1, 3, 64, 700]
        with beammoe.Workspace(None, 1024, hidden, moe_gather_oneshot_max_tokens=16,
                               moe_gather_separate_norm_min_tokens=257, timeout_ms=60000) as ws:
            assert (ws.rank, ws.world_size, ws.device) == (rank, nranks, dev), ws
            assert (ws.max_tokens, ws.hidden_size, ws.moe_gather_oneshot_max_tokens,
                    ws.moe_gather_separate_norm_min_tokens) == (1024, hidden, 16, 257), ws
            assert ws.device_group is dist.group.WORLD
            _check(ws, rank, nranks, cases, (None, "oneshot", "twoshot", "unfused"), dev)
            # The all_gather hook (the reference's) takes the UNFUSED calls;
            # assigned thresholds steer AUTO (the library then gets the
            # explicit strategy).
            calls = []

            def hook(out, inp):
                calls.append((tuple(out.shape), tuple(inp.shape)))
                dist.all_gather_into_tensor(out, inp)

            ws.all_gather = hook
            _check(ws, rank, nranks, [5, 64], ("unfused",), dev)
            assert len(calls) == 8, calls  # 2 cases x inplace or not x (signature, rows)
            ws.moe_gather_oneshot_max_tokens = 0
            ws.moe_gather_separate_norm_min_tokens = 6
            assert (ws.strategy_for(5), ws.strategy_for(6)) == ("twoshot", "unfused")
            _check(ws, rank, nranks, [5, 64], (None,), dev)  # 5: the library's TWOSHOT; 64: the hook
            assert len(calls) == 12, calls
            ws.all_gather = None
            ws.moe_gather_oneshot_max_tokens = 16
            ws.moe_gather_separate_norm_min_tokens = 257
            # Tensors of another device than the workspace's are rejected.
            if rank == 0:
                g, w, residual, _, _ = _case(4, 8, hidden, 7)
                try:
                    beammoe.beam_moe_finalize_gather_norm_residual_norm(
                        beammoe.MoEOutput(g, w), residual, None, None, None, None, None, ws)
                except ValueError as e:
                    assert "the workspace is on cuda" in str(e), e
                else:
                    raise AssertionError("cpu tensors with a cuda workspace were accepted")
            dist.barrier()
        assert ws.closed

        gloo = dist.new_group(backend="gloo")
        with beammoe.Workspace(gloo, 64, hidden) as ws2:
            assert ws2.device_group is gloo and ws2.moe_gather_separate_norm_min_tokens is None
            _check(ws2, rank, nranks, [5, 64], (None,), dev)
        dist.barrier()
    finally:
        dist.destroy_process_group()
