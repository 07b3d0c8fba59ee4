"""One rank of the CPU gather over a torch.distributed gloo group
(test_gather_process_group.py runs it as `python _pg_worker.py RANK NRANKS
INIT_FILE`, one process per rank, with a hard timeout).

Every rank runs the same sequence; each step checks its own results and
raises on a mismatch (the process then exits 1 with the traceback):
the gather against the one-process fused operation, the CpuGroup gather
(threads) and the torch-written reference, bit for bit, for every strategy;
the all_gather hook; threshold assignment; a rank that rejects its
arguments, ranks that disagree (tokens, scales, eps, workspace sizes): every
rank raises and the group stays usable; and last, a peer that never arrives:
a BeamCommError within timeout_ms.

`python _pg_worker.py RANK NRANKS INIT_FILE quant` runs the quantized form
instead (check_quant): every FP8 form and NVFP4, every strategy, normalized
kept or not, in place or not, over the group and through the hook, against
the one-process local _fp8 operation on all the tokens, bit for bit; and
ranks that differ in the form (every rank raises, nothing written).
"""
import os
import sys
import threading
import time

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _here)
try:
    import beammoe  # noqa: F401
except ImportError:  # the source tree's package (as conftest.py does)
    sys.path.insert(1, os.path.dirname(_here))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import beammoe  # noqa: E402
from reference import BF16, assert_bits_equal, fused_spec, random_bf16, random_case  # noqa: E402
from test_gather_cpu import local_rows as _local_rows  # noqa: E402  (a rank's slice of the expert rows)

K, H = 4, 512


def expect(exc, pattern, call):
    import re

    try:
        call()
    except exc as e:
        if not re.search(pattern, str(e)):
            raise AssertionError("%s raised %r, which does not match %r" % (call, e, pattern))
        return e
    except Exception as e:
        raise AssertionError("%s raised %r, not %s" % (call, e, exc.__name__))
    raise AssertionError("%s did not raise %s" % (call, exc.__name__))


def case(tokens, seed=7):
    gen = torch.Generator()
    gen.manual_seed(seed + tokens)  # the same data on every rank
    g, w = random_case(gen, max(tokens, 1), K, H, specials=True)
    residual = random_bf16(gen, tokens, H, scale=2.0)
    pw, nw = random_bf16(gen, H), random_bf16(gen, H)
    return g, w, residual, pw, nw


def local_rows(g, w, tokens, nranks, rank, pad=1):
    return _local_rows(g, w, tokens, nranks, rank, K, H, pad)


ARGS = dict(scales=(0.5, 1.5), routed=1.25)


def gather(ws, lg, lw, residual, pw, nw, **kw):
    return beammoe.beam_moe_finalize_gather_norm_residual_norm(
        beammoe.MoEOutput(lg, lw), residual, pw, 1e-6, nw, 1e-5, ARGS["scales"], ws, ARGS["routed"], **kw)


def cpu_group_result(tokens, nranks, g, w, residual, pw, nw):
    """The same gather over a CpuGroup of nranks threads (rank 0's result)."""
    out = [None] * nranks
    with beammoe.CpuGroup(nranks) as grp:
        def body(r):
            with beammoe.Workspace.cpu(grp, r, 64, H) as ws:
                lg, lw = local_rows(g, w, tokens, nranks, r)
                out[r] = gather(ws, lg, lw, residual.clone(), pw, nw)
        ts = [threading.Thread(target=body, args=(r,)) for r in range(nranks)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
    return out[0]


def check_bits(ws, rank, nranks):
    for tokens in (0, 1, 7, 24):
        g, w, residual, pw, nw = case(tokens)
        want_h, want_n = beammoe.beam_moe_finalize_norm_residual_norm(
            beammoe.MoEOutput(g, w), residual, pw, 1e-6, nw, 1e-5, ARGS["scales"], ARGS["routed"])
        spec_h, spec_n = fused_spec(g, w, tokens, residual, pw, 1e-6, nw, 1e-5, ARGS["scales"], ARGS["routed"])
        grp_h, grp_n = cpu_group_result(tokens, nranks, g, w, residual, pw, nw)
        lg, lw = local_rows(g, w, tokens, nranks, rank)
        for strategy in (None, "oneshot", "twoshot", "unfused"):
            for inplace in (False, True):
                res = residual.clone()
                h, n = gather(ws, lg, lw, res, pw, nw, strategy=strategy, inplace=inplace)
                what = "rank %d tokens %d strategy %s inplace=%s" % (rank, tokens, strategy, inplace)
                if inplace:
                    assert h is res, what
                else:
                    assert h is not res, what
                    assert_bits_equal(res, residual, what + ": residual left unchanged")
                for got, want, name in ((h, want_h, "fused"), (h, grp_h, "CpuGroup"), (h, spec_h, "reference"),
                                        (n, want_n, "fused"), (n, grp_n, "CpuGroup"), (n, spec_n, "reference")):
                    assert_bits_equal(got, want, "%s vs the %s result" % (what, name))


def check_hook(ws, rank, nranks):
    calls = []

    def hook(out, inp):
        calls.append((tuple(out.shape), tuple(inp.shape), out.dtype))
        if torch.__version__ >= "2":
            dist.all_gather_into_tensor(out, inp)
        else:  # gloo of torch 1.13: no all_gather_into_tensor, no BF16
            out, inp = out.view(torch.uint8), inp.view(torch.uint8)
            dist.all_gather(list(out.view(nranks, -1, out.shape[1]).unbind(0)), inp)

    tokens = 7
    g, w, residual, pw, nw = case(tokens)
    want_h, want_n = beammoe.beam_moe_finalize_norm_residual_norm(
        beammoe.MoEOutput(g, w), residual, pw, 1e-6, nw, 1e-5, ARGS["scales"], ARGS["routed"])
    lg, lw = local_rows(g, w, tokens, nranks, rank)
    ws.all_gather = hook
    try:
        assert ws.all_gather is hook
        h, n = gather(ws, lg, lw, residual, pw, nw)
    finally:
        ws.all_gather = None
    per = -(-tokens // nranks)
    assert calls == [((nranks * per, H), (per, H), BF16)], calls
    assert_bits_equal(h, want_h, "hook hidden")
    assert_bits_equal(n, want_n, "hook normalized")
    expect(TypeError, r"all_gather must be None or a callable", lambda: setattr(ws, "all_gather", 3))


def check_thresholds(ws):
    assert (ws.moe_gather_oneshot_max_tokens, ws.moe_gather_separate_norm_min_tokens) == (4, 17)
    assert [ws.strategy_for(t) for t in (4, 5, 16, 17)] == ["oneshot", "twoshot", "twoshot", "unfused"]
    ws.moe_gather_oneshot_max_tokens = 0
    ws.moe_gather_separate_norm_min_tokens = 3
    assert [ws.strategy_for(t) for t in (0, 1, 2, 3)] == ["oneshot", "twoshot", "twoshot", "unfused"]
    assert ws.twoshot_max_tokens == 2
    ws.moe_gather_separate_norm_min_tokens = None
    assert ws.strategy_for(10 ** 9) == "twoshot" and ws.twoshot_max_tokens == 2 ** 63 - 1
    for name, bad, exc in (("moe_gather_oneshot_max_tokens", -1, ValueError),
                           ("moe_gather_oneshot_max_tokens", True, TypeError),
                           ("moe_gather_separate_norm_min_tokens", 2.0, TypeError),
                           ("moe_gather_separate_norm_min_tokens", "3", TypeError)):
        expect(exc, r"beammoe.Workspace: %s" % name, lambda: setattr(ws, name, bad))
    ws.moe_gather_oneshot_max_tokens = 4
    ws.moe_gather_separate_norm_min_tokens = 17


def check_rejections(ws, rank, nranks):
    tokens = 7
    g, w, residual, pw, nw = case(tokens)
    lg, lw = local_rows(g, w, tokens, nranks, rank)
    fn = "beam_moe_finalize_gather_norm_residual_norm"

    # Rank 1 passes FP32 data: a TypeError there, every other rank names it.
    bad = residual.float() if rank == 1 else residual
    if rank == 1:
        expect(TypeError, r"^%s: residual must have dtype torch.bfloat16" % fn, lambda: gather(ws, lg, lw, bad, pw, nw))
    else:
        expect(beammoe.BeamArgumentError, r"^%s: rank 1 failed \(TypeError: %s: residual must have dtype" % (fn, fn),
               lambda: gather(ws, lg, lw, bad, pw, nw))

    # Rank 0 breaks a rule the library checks (eps < 0).
    def neg_eps():
        return beammoe.beam_moe_finalize_gather_norm_residual_norm(
            beammoe.MoEOutput(lg, lw), residual, pw, -1.0 if rank == 0 else 1e-6, nw, 1e-5, ARGS["scales"], ws,
            ARGS["routed"])
    expect(ValueError, r"^%s: (rank 0 failed \(BeamArgumentError: %s: )?post_norm->eps" % (fn, fn), neg_eps)

    # Tokens differ: the signatures travel first, so nobody waits for rows.
    t = 5 + rank
    g2, w2, r2, _, _ = case(t)
    lg2, lw2 = local_rows(g2, w2, t, nranks, rank)
    expect(beammoe.BeamArgumentError, r"^%s: the ranks disagree on tokens: rank 0 has 5, rank 1 has 6" % fn,
           lambda: gather(ws, lg2, lw2, r2, pw, nw))

    # Scales and strategies differ.
    expect(beammoe.BeamArgumentError, r"the ranks disagree on scales\[1\]: rank 0 has 1.5, rank 1 has 2.0",
           lambda: beammoe.beam_moe_finalize_gather_norm_residual_norm(
               beammoe.MoEOutput(lg, lw), residual, pw, 1e-6, nw, 1e-5, (0.5, 1.5 + 0.5 * rank), ws))
    expect(beammoe.BeamArgumentError, r"the ranks disagree on strategy: rank 0 has oneshot, rank 1 has unfused",
           lambda: gather(ws, lg, lw, residual, pw, nw, strategy="oneshot" if rank == 0 else "unfused"))

    # Every rank over max_tokens: the library's wording, on every rank.
    g3, w3, r3, _, _ = case(65)
    lg3, lw3 = local_rows(g3, w3, 65, nranks, rank)
    expect(ValueError, r"tokens=65 must be <= max_tokens=64 of the workspace", lambda: gather(ws, lg3, lw3, r3, pw, nw))

    # Nothing was written, and the group still works.
    res = residual.clone()
    expect(beammoe.BeamArgumentError, r"disagree on tokens|failed",
           lambda: gather(ws, lg2 if rank else lg, lw2 if rank else lw, r2 if rank else res, pw, nw, inplace=True))
    assert_bits_equal(res, residual, "residual after a failed in-place call")
    want_h, _ = beammoe.beam_moe_finalize_norm_residual_norm(
        beammoe.MoEOutput(g, w), residual, pw, 1e-6, nw, 1e-5, ARGS["scales"], ARGS["routed"])
    h, _ = gather(ws, lg, lw, residual, pw, nw)
    assert_bits_equal(h, want_h, "a call after the failed ones")


def check_creation(rank):
    expect(beammoe.BeamArgumentError, r"^beammoe.Workspace: the ranks disagree on max_tokens: rank 0 has 64, rank 1 "
           r"has 65", lambda: beammoe.Workspace(None, 64 + rank, H, device="cpu"))
    expect(ValueError, r"beammoe.Workspace: (rank 1 failed \(ValueError: beammoe.Workspace: )?hidden=300 must be a "
           r"multiple of 256", lambda: beammoe.Workspace(None, 64, 300 if rank == 1 else H, device="cpu"))


def check_timeout(rank):
    """Last: rank 1 never calls; rank 0 raises within its timeout_ms."""
    ws = beammoe.Workspace(None, 64, H, device="cpu", timeout_ms=1500)
    if rank == 0:
        g, w, residual, pw, nw = case(3)
        t0 = time.monotonic()
        expect(beammoe.BeamCommError, r"timeout_ms=1500", lambda: gather(ws, g, w, residual, pw, nw))
        assert time.monotonic() - t0 < 30, time.monotonic() - t0
    else:
        time.sleep(4)


def poison_outputs():
    """q and q_scales filled before every call (0xFF bytes, NaN scales; a
    static scale is the caller's): the local call's and the gather's alike,
    so that a byte not written shows, and NVFP4's padding rows (never
    written) compare equal."""
    from beammoe import _run
    from beammoe import quant as quant_module

    empty = _run.empty_outputs

    def empty_outputs(*args):
        q, qs = empty(*args)
        q.view(torch.uint8).fill_(0xFF)
        if qs.element_size() == 1:
            qs.view(torch.uint8).fill_(0xFF)
        elif args[0] != _run.KINDS["tensor"]:
            qs.fill_(float("nan"))
        return q, qs

    quant_module.empty_outputs = _run.empty_outputs = empty_outputs


def _bits(t):
    return t.view({1: torch.uint8, 4: torch.int32}[t.element_size()])


def quant_forms():
    return [beammoe.FP8Quant("group", 128), beammoe.FP8Quant("group", 64, ue8m0=True),
            beammoe.FP8Quant("group", 128, column_major=True),
            beammoe.FP8Quant("group", 64, ue8m0=True, column_major=True), beammoe.FP8Quant("token"),
            beammoe.FP8Quant("token", ue8m0=True), beammoe.FP8Quant("tensor", scale=0.0125),
            beammoe.NVFP4Quant(672.0)]


def gather_q(ws, lg, lw, residual, pw, nw, quant, **kw):
    return beammoe.beam_moe_finalize_gather_norm_residual_norm_fp8(
        beammoe.MoEOutput(lg, lw), residual, pw, 1e-6, nw, 1e-5, ARGS["scales"], ws, ARGS["routed"], quant=quant,
        **kw)


def same_q(got, want, keep, what):
    h, n, q, qs = got
    assert_bits_equal(h, want[0], what + " hidden")
    if keep:
        assert_bits_equal(n, want[1], what + " normalized")
    else:
        assert n is None, what + " normalized"
    for a, b, name in ((q, want[2], "q"), (qs, want[3], "q_scales")):
        assert (a.dtype, a.shape, a.stride()) == (b.dtype, b.shape, b.stride()), what + " " + name
        assert torch.equal(_bits(a), _bits(b)), what + " " + name


def all_gather_hook(nranks):
    def hook(out, inp):
        if torch.__version__ >= "2":
            dist.all_gather_into_tensor(out, inp)
        else:  # gloo of torch 1.13: no all_gather_into_tensor, no BF16
            out, inp = out.view(torch.uint8), inp.view(torch.uint8)
            dist.all_gather(list(out.view(nranks, -1, out.shape[1]).unbind(0)), inp)
    return hook


def check_quant(ws, rank, nranks):
    poison_outputs()
    for tokens in (0, 7, 130):
        g, w, residual, pw, nw = case(tokens)
        lg, lw = local_rows(g, w, tokens, nranks, rank)
        for quant in quant_forms():
            want = beammoe.beam_moe_finalize_norm_residual_norm_fp8(
                beammoe.MoEOutput(g, w), residual, pw, 1e-6, nw, 1e-5, ARGS["scales"], ARGS["routed"], quant=quant,
                keep_normalized=True)
            for hook in (None, all_gather_hook(nranks)):
                ws.all_gather = hook
                for strategy in ((None, "oneshot", "twoshot", "unfused") if hook is None else (None,)):
                    for keep in (False, True):
                        for inplace in (False, True):
                            res = residual.clone()
                            got = gather_q(ws, lg, lw, res, pw, nw, quant, strategy=strategy, inplace=inplace,
                                           keep_normalized=keep)
                            what = "rank %d tokens %d %r strategy %s hook %s keep=%s inplace=%s" % (
                                rank, tokens, quant, strategy, hook is not None, keep, inplace)
                            assert (got[0] is res) == inplace, what
                            if not inplace:
                                assert_bits_equal(res, residual, what + ": residual left unchanged")
                            same_q(got, want, keep, what)
            ws.all_gather = None
    if nranks != 2:
        return
    # Each rank's own layout; ranks that differ in the form all raise, nothing written.
    tokens = 7
    g, w, residual, pw, nw = case(tokens)
    lg, lw = local_rows(g, w, tokens, nranks, rank)
    mine = beammoe.FP8Quant("group", 64, column_major=rank == 0)
    want = beammoe.beam_moe_finalize_norm_residual_norm_fp8(
        beammoe.MoEOutput(g, w), residual, pw, 1e-6, nw, 1e-5, ARGS["scales"], ARGS["routed"], quant=mine,
        keep_normalized=True)
    same_q(gather_q(ws, lg, lw, residual, pw, nw, mine, keep_normalized=rank == 1), want, rank == 1, "own layout")
    fn = "beam_moe_finalize_gather_norm_residual_norm_q"
    for quant in (beammoe.FP8Quant("token", ue8m0=rank == 1), beammoe.NVFP4Quant(1.0 + rank),
                  beammoe.NVFP4Quant(1.0) if rank == 0 else beammoe.FP8Quant("tensor", scale=1.0)):
        res = residual.clone()
        expect(beammoe.BeamArgumentError, r"^%s: the ranks disagree on quant( scale)?: rank 0 has" % fn,
               lambda: gather_q(ws, lg, lw, res, pw, nw, quant, inplace=True))
        assert_bits_equal(res, residual, "residual after a failed in-place call")
    res = residual.clone()
    if rank == 1:
        expect(ValueError, r"^%s: next_eps must be given" % fn,
               lambda: beammoe.beam_moe_finalize_gather_norm_residual_norm_fp8(
                   beammoe.MoEOutput(lg, lw), res, pw, 1e-6, None, None, None, ws, quant=mine, inplace=True))
    else:
        expect(beammoe.BeamArgumentError, r"^%s: rank 1 failed \(ValueError: %s: next_eps must be given" % (fn, fn),
               lambda: gather_q(ws, lg, lw, res, pw, nw, mine, inplace=True))
    assert_bits_equal(res, residual, "residual after a failed in-place call")


def main_quant(rank, nranks, init_file):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=nranks)
    ws = beammoe.Workspace(None, 256, H, device="cpu", moe_gather_oneshot_max_tokens=4,
                           moe_gather_separate_norm_min_tokens=17, timeout_ms=60000)
    check_quant(ws, rank, nranks)
    ws.close()
    print("rank %d: ok" % rank, flush=True)
    sys.stdout.flush()
    os._exit(0)


def main(rank, nranks, init_file):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=nranks)
    ws = beammoe.Workspace(None, 64, H, device="cpu", moe_gather_oneshot_max_tokens=4,
                           moe_gather_separate_norm_min_tokens=17, timeout_ms=60000)
    assert (ws.rank, ws.world_size, ws.device, ws.device_group) == (rank, nranks, torch.device("cpu"),
                                                                     dist.group.WORLD), ws
    check_bits(ws, rank, nranks)
    check_hook(ws, rank, nranks)
    check_thresholds(ws)
    if nranks == 2:
        check_rejections(ws, rank, nranks)
        check_creation(rank)
    ws.close()
    assert ws.closed
    if nranks == 2:
        check_timeout(rank)
    print("rank %d: ok" % rank, flush=True)
    sys.stdout.flush()
    os._exit(0)  # the group may hold the timed-out collective: no teardown


if __name__ == "__main__":
    (main_quant if sys.argv[4:] == ["quant"] else main)(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
