"""One rank of the gather over a torch.distributed process group.

`python _pg_worker.py RANK NRANKS INIT_FILE MODE` (conftest.run_workers: one
process per rank, gloo over a file store, a hard timeout) runs one mode; each
step raises on a mismatch (the process then exits 1), and a rank prints
"rank R: ok" last. The last rank is the one that misbehaves. Modes:

bits       the gather against the one-process fused operation, the CpuGroup
           gather and the torch-written reference, bit for bit, every
           strategy; the all_gather hook; threshold assignment; a rank that
           rejects its arguments, ranks that disagree (tokens, scales, eps,
           workspace sizes): every rank raises and the group stays usable;
           last, a peer that never arrives: a BeamCommError within timeout_ms.
quant      every FP8 form, NVFP4 and MXFP8, every strategy, normalized kept or
           not, in place or not, over the group and through the hook, against
           the local _fp8 operation on all the tokens; ranks that differ in
           the form (every rank raises, nothing written).
allreduce  both all-reduces, plain and quantized, every strategy, in place or
           not, over the group and through the hook, against the library's
           all-reduce over a CpuGroup of as many threads; a rank's gather
           meeting a peer's all-reduce, tokens that differ, a rank that
           rejects its arguments: every rank raises, nothing written.
threads    two threads of every rank call on the rank's one workspace at once:
           a call is refused (the overlap error, nothing written) or gives the
           fused bits; calls from inside a call in flight are refused.
late       the last rank comes late to a call: every rank raises within
           timeout_ms; every later call and close() raise at once, naming it.
late_rows  the last rank stalls between a call's signatures and its rows: the
           others raise within timeout_ms; the late one returns the exact bits
           or raises, and its next call raises; then everything raises.
create     the last rank comes late to the workspace's creation: the others
           give up and try again at once (every creation fails), then give up
           (the late rank's creation fails within timeout_ms of its arrival).
kill_signature, kill_rows
           the last rank dies inside a call (os._exit before its signature;
           SIGKILL after the signatures, before the rows): the others raise
           within timeout_ms, later calls and close() raise, none hangs or aborts.

`worker` is one rank of the CUDA gather and all-reduce
(test_gather_process_group.py spawns it): GPU `rank`, an NCCL process group,
a beammoe.Workspace over it, the gather for several token counts and every
strategy against the CPU backend's local fused operation on all tokens; both
all-reduces against the CpuGroup's, in a CUDA graph and under torch.compile
too; a second workspace over a gloo subgroup checks that the unique id may
travel over any process group.
"""
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import ARGS, H, K, QUANTS, STRATEGIES, assert_same_q, check_gather, dist_all_gather, fused  # noqa: E402
from conftest import gather, gather_calls, gather_q, local_q, local_rows, poison_outputs, run_ranks  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import beammoe  # noqa: E402
from beammoe import _pgather  # noqa: E402
from reference import BF16, assert_bits_equal, layer, random_bf16, random_case  # noqa: E402

TMO = 600  # timeout_ms of the workspaces that fail
SLACK = 3.0  # seconds past a wait's bound that a loaded host may take
OVERLAP = r"another call on this workspace is in progress on %s \(calls on one workspace must not overlap\)"
FN = "beam_moe_finalize_gather_norm_residual_norm"


def expect(exc, pattern, call):
    """call() raises exc, its message matching pattern (re.search): the exception."""
    with pytest.raises(exc, match=pattern) as ei:
        call()
    return ei.value


def case(tokens, seed=7, top_k=K, hidden=H):
    """The same data on every rank."""
    return layer(torch.Generator().manual_seed(seed + tokens), tokens, top_k, hidden)


def check_hook(ws, rank, nranks):
    calls = []
    inner = dist_all_gather(nranks)

    def hook(out, inp):
        calls.append((tuple(out.shape), tuple(inp.shape), out.dtype))
        inner(out, inp)

    tokens = 7
    lg, lw, residual, pw, nw, (want_h, want_n) = inputs(tokens, rank, nranks)
    ws.all_gather = hook
    try:
        assert ws.all_gather is hook
        h, n = gather(ws, lg, lw, residual, pw, nw)
    finally:
        ws.all_gather = None
    per = -(-tokens // nranks)
    assert calls == [((nranks * per, H), (per, H), BF16)], calls
    assert_bits_equal((h, n), (want_h, want_n), "hook")
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

    # Rank 1 passes FP32 data: a TypeError there, every other rank names it.
    bad = residual.float() if rank == 1 else residual
    if rank == 1:
        expect(TypeError, r"^%s: residual must have dtype torch.bfloat16" % FN, lambda: gather(ws, lg, lw, bad, pw, nw))
    else:
        expect(beammoe.BeamArgumentError, r"^%s: rank 1 failed \(TypeError: %s: residual must have dtype" % (FN, FN),
               lambda: gather(ws, lg, lw, bad, pw, nw))

    # Rank 0 breaks a rule the library checks (eps < 0).
    def neg_eps():
        return beammoe.beam_moe_finalize_gather_norm_residual_norm(
            beammoe.MoEOutput(lg, lw), residual, pw, -1.0 if rank == 0 else 1e-6, nw, 1e-5, ARGS["scales"], ws,
            ARGS["routed"])
    expect(ValueError, r"^%s: (rank 0 failed \(BeamArgumentError: %s: )?post_norm->eps" % (FN, FN), neg_eps)

    # Tokens differ: the signatures travel first, so nobody waits for rows.
    t = 5 + rank
    g2, w2, r2, _, _ = case(t)
    lg2, lw2 = local_rows(g2, w2, t, nranks, rank)
    expect(beammoe.BeamArgumentError, r"^%s: the ranks disagree on tokens: rank 0 has 5, rank 1 has 6" % FN,
           lambda: gather(ws, lg2, lw2, r2, pw, nw))

    # Scales and strategies differ.
    expect(beammoe.BeamArgumentError, r"the ranks disagree on scales: rank 0 has \(0.5, 1.5\), rank 1 has \(0.5, 2\)",
           lambda: beammoe.beam_moe_finalize_gather_norm_residual_norm(
               beammoe.MoEOutput(lg, lw), residual, pw, 1e-6, nw, 1e-5, (0.5, 1.5 + 0.5 * rank), ws))
    expect(beammoe.BeamArgumentError, r"the ranks disagree on strategy: rank 0 has ONESHOT, rank 1 has UNFUSED",
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
    h, _ = gather(ws, lg, lw, residual, pw, nw)
    assert_bits_equal(h, fused(g, w, residual, pw, nw)[0], "a call after the failed ones")


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
        bounded("the call rank 1 never makes", 30, lambda: gather(ws, g, w, residual, pw, nw),
                pattern=r"timeout_ms=1500")
    else:
        time.sleep(4)


def bits(rank, nranks):
    ws = beammoe.Workspace(None, 64, H, device="cpu", moe_gather_oneshot_max_tokens=4,
                           moe_gather_separate_norm_min_tokens=17, timeout_ms=60000)
    assert (ws.rank, ws.world_size, ws.device, ws.device_group) == (rank, nranks, torch.device("cpu"),
                                                                     dist.group.WORLD), ws
    check_gather(ws, rank, nranks, case, (0, 1, 7, 24), more=True)
    check_hook(ws, rank, nranks)
    check_thresholds(ws)
    if nranks == 2:
        check_rejections(ws, rank, nranks)
        check_creation(rank)
    ws.close()
    assert ws.closed
    if nranks == 2:
        check_timeout(rank)  # the group may hold the timed-out collective: no teardown


# ---- the quantized form -------------------------------------------------------------------

def quant(rank, nranks):
    ws = beammoe.Workspace(None, 256, H, device="cpu", moe_gather_oneshot_max_tokens=4,
                           moe_gather_separate_norm_min_tokens=17, timeout_ms=60000)
    poison_outputs()
    for tokens in (0, 7, 130):
        g, w, residual, pw, nw = case(tokens)
        lg, lw = local_rows(g, w, tokens, nranks, rank)
        for form in QUANTS:
            want = local_q(g, w, residual, pw, nw, form)
            for hook, strategies in ((None, STRATEGIES), (dist_all_gather(nranks), (None,))):
                ws.all_gather = hook
                for what, keep, got in gather_calls(ws, lg, lw, residual, pw, nw, form, strategies):
                    assert_same_q(got, want, keep, "rank %d tokens %d hook %s %s" % (rank, tokens, hook, what))
            ws.all_gather = None
    if nranks == 2:
        # Each rank's own layout; ranks that differ in the form all raise, nothing written.
        tokens = 7
        g, w, residual, pw, nw = case(tokens)
        lg, lw = local_rows(g, w, tokens, nranks, rank)
        mine = beammoe.FP8Quant("group", 64, column_major=rank == 0)
        assert_same_q(gather_q(ws, lg, lw, residual, pw, nw, mine, keep_normalized=rank == 1),
                      local_q(g, w, residual, pw, nw, mine), rank == 1, "own layout")
        fn = FN + "_q"
        for form in (beammoe.FP8Quant("token", ue8m0=rank == 1), beammoe.NVFP4Quant(1.0 + rank),
                     beammoe.NVFP4Quant(1.0) if rank == 0 else beammoe.FP8Quant("tensor", scale=1.0),
                     beammoe.MXFP8Quant() if rank == 0 else beammoe.NVFP4Quant(1.0)):
            res = residual.clone()
            expect(beammoe.BeamArgumentError, r"^%s: the ranks disagree on quant: rank 0 has" % fn,
                   lambda: gather_q(ws, lg, lw, res, pw, nw, form, inplace=True))
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
    ws.close()


# ---- the all-reduce -------------------------------------------------------------------------

def allreduce_case(tokens, nranks, seed=None):
    """Every rank's partial and slots (the same data on every rank), the
    routing weights, the residual and the two norms' weights."""
    gen = torch.Generator().manual_seed(70 + tokens if seed is None else seed)
    parts = [random_bf16(gen, tokens, H, scale=2.0) for _ in range(nranks)]
    slots = [random_case(gen, tokens, K, H)[0] for _ in range(nranks)]
    return (parts, slots, random_case(gen, tokens, K, H)[1], random_bf16(gen, tokens, H), random_bf16(gen, H),
            random_bf16(gen, H))


def allreduce(ws, rank, case, moe, strategy=None, inplace=False, quant=None, keep=False, scales=(0.5, 2.0)):
    parts, slots, w, residual, nw1, nw = case
    res = residual.clone()
    kw = dict(strategy=strategy, inplace=inplace, **(dict(quant=quant, keep_normalized=keep) if quant else {}))
    if moe:
        f = beammoe.beam_moe_finalize_allreduce_norm_residual_norm_q if quant else \
            beammoe.beam_moe_finalize_allreduce_norm_residual_norm
        return f(beammoe.MoEOutput(slots[rank], w), res, nw1, 1e-6, nw, 1e-5, scales, ws, 1.5, **kw)
    f = beammoe.beam_allreduce_norm_residual_norm_q if quant else beammoe.beam_allreduce_norm_residual_norm
    return f(parts[rank], res, nw1, 1e-6, nw, 1e-5, scales, ws, **kw)


def allreduce_calls(ws, rank, case, strategies):
    """Both forms in place or not for each strategy (4 calls each), then the
    quantized forms (AUTO)."""
    out = [allreduce(ws, rank, case, moe, strategy, inplace)
           for strategy in strategies for moe in (False, True) for inplace in (False, True)]
    return out + [allreduce(ws, rank, case, moe, quant=quant, keep=keep, inplace=inplace)
                  for moe in (False, True) for quant in QUANTS[::3] for keep, inplace in ((True, False), (False, True))]


def cpu_group_allreduce(case, rank, nranks, max_tokens):
    """allreduce_calls' results (AUTO) of `rank` in the library's all-reduce
    over a CpuGroup of nranks threads: the ground truth."""
    with beammoe.CpuGroup(nranks) as grp:
        def body(r):
            with beammoe.Workspace.cpu(grp, r, max_tokens, H) as lws:
                return allreduce_calls(lws, r, case, (None,))
        return run_ranks(nranks, body)[rank]


def same_allreduce(got, want, nstrategies, what):
    """allreduce_calls' results for nstrategies strategies against the
    ground truth's (AUTO): every strategy gives the same bits."""
    assert len(got) == len(want) + 4 * (nstrategies - 1)
    for i, (a, b) in enumerate(zip(got, want[:4] * nstrategies + want[4:])):
        w = "%s call %d" % (what, i)
        assert_same_q(a, b, a[1] is not None, w) if len(a) == 4 else assert_bits_equal(a, b, w)


def allreduce_mode(rank, nranks):
    ws = beammoe.Workspace(None, 64, H, device="cpu", moe_gather_oneshot_max_tokens=4, timeout_ms=60000)
    poison_outputs()
    for tokens in (0, 1, 7):
        case = allreduce_case(tokens, nranks)
        want = cpu_group_allreduce(case, rank, nranks, 64)
        for hook, strategies in ((None, STRATEGIES), (dist_all_gather(nranks), (None,))):
            ws.all_gather = hook
            got = allreduce_calls(ws, rank, case, strategies)
            same_allreduce(got, want, len(strategies), "rank %d tokens %d hook %s" % (rank, tokens, hook))
        ws.all_gather = None
    if nranks == 2:
        case = allreduce_case(4, nranks)
        parts, slots, w, residual, nw1, nw = case
        fn = "beam_allreduce_norm_residual_norm"
        res = residual.clone()
        expect(beammoe.BeamArgumentError, r"^beam_\w+: the ranks disagree on collective: rank 0 has gather, rank 1 "
               r"has dense all-reduce", lambda: gather(ws, *local_rows(slots[0], w, 4, nranks, rank), res, nw1, nw,
                                                       inplace=True) if rank == 0 else
               beammoe.beam_allreduce_norm_residual_norm(parts[rank], res, nw1, 1e-6, nw, 1e-5, None, ws,
                                                         inplace=True))
        expect(beammoe.BeamArgumentError, r"^%s: the ranks disagree on tokens: rank 0 has 5, rank 1 has 6" % fn,
               lambda: allreduce(ws, rank, allreduce_case(5 + rank, nranks), False, inplace=True))
        bad = [p.float() if rank == 1 else p for p in parts]
        expect((TypeError, beammoe.BeamArgumentError), r"^%s: (rank 1 failed \(TypeError: %s: )?x must have dtype"
               % (fn, fn), lambda: beammoe.beam_allreduce_norm_residual_norm(bad[rank], res, nw1, 1e-6, nw, 1e-5,
                                                                             None, ws, inplace=True))
        assert_bits_equal(res, residual, "residual after the failed calls")
        h = allreduce(ws, rank, case, True, "unfused", inplace=True)
        with beammoe.CpuGroup(nranks) as grp:
            def body(r):
                with beammoe.Workspace.cpu(grp, r, 64, H) as lws:
                    return allreduce(lws, r, case, True)
            assert_bits_equal(h, run_ranks(nranks, body)[rank], "a call after the failed ones")
    ws.close()


# ---- faults: overlapping calls, late ranks, a rank that dies ------------------------------------

def sync(name, rank, nranks):
    """Meet every rank (marker files beside the store): no collective."""
    d = os.path.dirname(STORE)
    open(os.path.join(d, "%s.%d" % (name, rank)), "w").close()
    deadline = time.monotonic() + 30
    while not all(os.path.exists(os.path.join(d, "%s.%d" % (name, r))) for r in range(nranks)):
        if time.monotonic() > deadline:
            raise AssertionError("rank %d: the other ranks never reached %s" % (rank, name))
        time.sleep(0.02)


def bounded(what, limit, call, exc=beammoe.BeamCommError, pattern=r""):
    """call() raises exc (matching pattern) within limit seconds."""
    t0 = time.monotonic()
    e = expect(exc, pattern, call)
    took = time.monotonic() - t0
    assert took < limit, "%s took %.2f s (bound %.2f s)" % (what, took, limit)
    return e


def inputs(tokens, rank, nranks):
    g, w, residual, pw, nw = case(tokens)
    lg, lw = local_rows(g, w, tokens, nranks, rank)
    return lg, lw, residual, pw, nw, fused(g, w, residual, pw, nw)


def all_unusable(ws, rank, nranks, failure):
    """Every later call (any size, the FP8 form, in place) and close()
    raise at once, naming the failure; nothing is written."""
    named = r"an earlier call on this workspace failed \(rank %d, call \d+: .*%s.*\); the workspace is unusable" % (
        rank, failure)
    for tokens in (0, 1, 40):
        lg, lw, residual, pw, nw, _ = inputs(tokens, rank, nranks)
        res = residual.clone()
        bounded("a call on an unusable workspace", 0.5, lambda: gather(ws, lg, lw, res, pw, nw, inplace=True),
                pattern=r"^%s: %s" % (FN, named))
        assert_bits_equal(res, residual, "residual after a refused call")
        bounded("an FP8 call on an unusable workspace", 0.5,
                lambda: beammoe.beam_moe_finalize_gather_norm_residual_norm_fp8(
                    beammoe.MoEOutput(lg, lw), res, pw, 1e-6, nw, 1e-5, None, ws, quant=beammoe.FP8Quant("token")),
                pattern=r"^%s_q: %s" % (FN, named))
    for _ in range(2):
        bounded("close()", 0.5, ws.close, pattern=r"^beammoe.Workspace.close: " + named + r" \(closed now\)")
        assert ws.closed
    # leaving a with block by another exception keeps that exception
    try:
        with ws:
            raise KeyError("mine")
    except KeyError:
        pass


def threads(rank, nranks):
    ws = beammoe.Workspace(None, 64, H, device="cpu", timeout_ms=30000)
    lg, lw, residual, pw, nw, want = inputs(5, rank, nranks)

    # Calls made while one is in flight (its rows' all_gather is the hook):
    # refused before anything, nothing written.
    seen = []

    def refused(where):
        res = residual.clone()
        expect(beammoe.BeamArgumentError, r"^%s: %s$" % (FN, OVERLAP % where),
               lambda: gather(ws, lg, lw, res, pw, nw, inplace=True))
        assert_bits_equal(res, residual, "residual after a refused call")
        seen.append(where)

    inner = dist_all_gather(nranks)

    def hook(out, inp):
        t = threading.Thread(target=refused, args=("another thread",))
        t.start()
        t.join(30)
        refused(r"this thread \(from inside its all_gather hook\)")
        expect(beammoe.BeamArgumentError, r"^beammoe.Workspace.close: a call on this workspace is in progress on this "
               r"thread .*: nothing was closed", ws.close)
        assert not ws.closed
        inner(out, inp)

    ws.all_gather = hook
    assert_bits_equal(gather(ws, lg, lw, residual, pw, nw), want, "the call in flight")
    ws.all_gather = None
    assert seen == ["another thread", r"this thread \(from inside its all_gather hook\)"], seen

    # Two threads call at once, again and again: each rank joins exactly
    # `calls` calls (a refused one is made again), every thread passes the
    # same arguments, so whichever calls meet give the fused bits.
    calls, lock = 16, threading.Lock()
    count = {"claimed": 0, "refused": 0, "ok": 0}
    errors = []

    def body():
        try:
            while True:
                with lock:
                    if count["claimed"] == calls:
                        return
                    count["claimed"] += 1
                res = residual.clone()
                try:
                    got = gather(ws, lg, lw, res, pw, nw, inplace=True)
                except beammoe.BeamArgumentError as e:
                    assert "in progress on another thread" in str(e), e
                    assert_bits_equal(res, residual, "residual after a refused call")
                    with lock:
                        count["claimed"] -= 1
                        count["refused"] += 1
                    time.sleep(0.0005)
                    continue
                assert got[0] is res
                assert_bits_equal(got, want, "a concurrent call")
                with lock:
                    count["ok"] += 1
        except BaseException as e:  # noqa: B902  (reported by the main thread)
            errors.append(e)

    ts = [threading.Thread(target=body) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    if errors:
        raise errors[0]
    assert count["ok"] == calls, count
    print("rank %d: %d calls, %d refused" % (rank, count["ok"], count["refused"]), flush=True)
    assert_bits_equal(gather(ws, lg, lw, residual, pw, nw), want, "a call after the concurrent ones")
    ws.close()


def first_call(rank, nranks):
    """A workspace of timeout_ms=TMO, and its first call, which every rank
    makes in time; every rank meets after it. (ws, the inputs of a call)."""
    ws = beammoe.Workspace(None, 64, H, device="cpu", timeout_ms=TMO)
    lg, lw, residual, pw, nw, want = inputs(7, rank, nranks)
    assert_bits_equal(gather(ws, lg, lw, residual, pw, nw), want, "call 1")
    sync("call1", rank, nranks)
    return ws, (lg, lw, residual, pw, nw, want)


def late(rank, nranks):
    ws, (lg, lw, residual, pw, nw, want) = first_call(rank, nranks)
    if rank == nranks - 1:
        time.sleep(3 * TMO / 1000)  # its peers' abandoned signatures arrive; their rows never do
    bounded("the late rank's call" if rank == nranks - 1 else "the call a rank is late to", TMO / 1000 + SLACK,
            lambda: gather(ws, lg, lw, residual, pw, nw),
            pattern=r"rank %d: .*timeout_ms=%d.*; the workspace is unusable, close it" % (rank, TMO))
    all_unusable(ws, rank, nranks, "timeout_ms=%d" % TMO)
    sync("done", rank, nranks)


def late_rows(rank, nranks):
    ws, (lg, lw, residual, pw, nw, want) = first_call(rank, nranks)
    if rank == nranks - 1:
        rows = _pgather._all_gather_rows

        def stalled(*args):
            time.sleep(3 * TMO / 1000)
            rows(*args)
        _pgather._all_gather_rows = stalled
        try:
            got = gather(ws, lg, lw, residual, pw, nw)
        except beammoe.BeamCommError:
            pass  # a peer's rows came too late: a timeout here too
        else:
            assert_bits_equal(got, want, "the late rank's call")  # never other bits
        _pgather._all_gather_rows = rows
        bounded("the late rank's next call", TMO / 1000 + SLACK, lambda: gather(ws, lg, lw, residual, pw, nw),
                pattern=r"rank %d: .*timeout_ms=%d" % (rank, TMO))
    else:
        bounded("the call whose rows a rank is late to", TMO / 1000 + SLACK,
                lambda: gather(ws, lg, lw, residual, pw, nw), pattern=r"timeout_ms=%d" % TMO)
    all_unusable(ws, rank, nranks, "timeout_ms=%d" % TMO)
    sync("done", rank, nranks)


def create(rank, nranks):
    last = nranks - 1
    make = lambda: beammoe.Workspace(None, 64, H, device="cpu", timeout_ms=TMO)  # noqa: E731
    # The others give up, and try again at once; the late rank finds their
    # abandoned signatures, then their new ones where it waits for the
    # confirmation: every creation fails.
    if rank == last:
        time.sleep(2 * TMO / 1000)
        bounded("the late rank's creation", TMO / 1000 + SLACK, make, pattern=r"^beammoe.Workspace: ")
    else:
        bounded("a creation a rank is late to", TMO / 1000 + SLACK, make, pattern=r"timeout_ms=%d" % TMO)
        bounded("the creation tried again", TMO / 1000 + SLACK, make,
                pattern=r"out of step|timeout_ms=%d" % TMO)
    sync("retry", rank, nranks)
    # The others give up and do nothing more: the late rank's creation fails.
    if rank == last:
        time.sleep(3 * TMO / 1000)
    bounded("the late rank's creation" if rank == last else "a creation a rank is late to", TMO / 1000 + SLACK,
            make, pattern=r"timeout_ms=%d" % TMO)
    sync("done", rank, nranks)


def kill(rank, nranks, where):
    ws, (lg, lw, residual, pw, nw, want) = first_call(rank, nranks)
    if rank == nranks - 1:
        if where == "signature":
            _pgather.exchange = lambda *args, **kw: os._exit(3)
        else:
            _pgather._all_gather_rows = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
        gather(ws, lg, lw, residual, pw, nw)
        raise AssertionError("rank %d is alive" % rank)
    res = residual.clone()
    bounded("the call a rank died in", TMO / 1000 + SLACK, lambda: gather(ws, lg, lw, res, pw, nw, inplace=True),
            pattern=r"rank %d: .*; the workspace is unusable, close it" % rank)
    assert_bits_equal(res, residual, "residual after the failed call")
    all_unusable(ws, rank, nranks, "BeamCommError")
    time.sleep(0.5)  # gloo's threads see the peer gone: the process must not abort


# ---- NCCL (torch.multiprocessing.spawn) ------------------------------------------------------

def on(dev, x):
    """x's tensors (in nested tuples and lists) on dev, with their strides
    (Tensor.to makes a tensor with gaps contiguous: column-major scales at
    one token)."""
    if isinstance(x, (tuple, list)):
        return type(x)(on(dev, t) for t in x)
    if not isinstance(x, torch.Tensor):
        return x
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=dev).copy_(x)


def allreduce_on_gpus(rank, nranks, dev):
    """Both all-reduces over the NCCL group's workspace (every strategy, in
    place or not, the quantized forms) against the CpuGroup all-reduce; then
    the dense one captured in a CUDA graph and replayed on new partials, and
    under torch.compile."""
    poison_outputs()
    with beammoe.Workspace(None, 512, H, timeout_ms=60000) as ws:
        for tokens in (0, 1, 7, 64, 300):
            case = allreduce_case(tokens, nranks)
            got = on("cpu", allreduce_calls(ws, rank, on(dev, case), STRATEGIES))
            same_allreduce(got, cpu_group_allreduce(case, rank, nranks, 512), len(STRATEGIES),
                           "GPU rank %d tokens %d" % (rank, tokens))
        case = on(dev, allreduce_case(64, nranks))
        x, res = case[0][rank], case[3]
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # the first calls outside the capture
            for _ in range(2):
                allreduce(ws, rank, case, False)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = allreduce(ws, rank, case, False)
        for step in range(3):
            new = allreduce_case(64, nranks, seed=1000 + step)  # fresh data into the captured inputs
            for i in (3, 4, 5):
                case[i].copy_(new[i])
            x.copy_(new[0][rank])
            graph.replay()
            torch.cuda.synchronize()
            assert_bits_equal(captured, cpu_group_allreduce(new, rank, nranks, 512)[0], "replay %d" % step)
        nw1, nw = case[4], case[5]

        def layer(x, res):
            return beammoe.beam_allreduce_norm_residual_norm(x, res, nw1, 1e-6, nw, 1e-5, (0.5, 2.0), ws)

        torch._dynamo.reset()
        want = layer(x, res)
        assert_bits_equal(torch.compile(layer, fullgraph=True)(x, res), want, "compiled")


def worker(rank, nranks, init_file):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method="file://" + init_file, rank=rank, world_size=nranks)
    try:
        hidden, top_k = 2048, 8

        def check(ws, cases, strategies):
            check_gather(ws, rank, nranks, lambda t: case(t, 1000, top_k, hidden), cases, strategies, dev, top_k)

        with beammoe.Workspace(None, 1024, hidden, moe_gather_oneshot_max_tokens=16,
                               moe_gather_separate_norm_min_tokens=257, timeout_ms=60000) as ws:
            assert (ws.rank, ws.world_size, ws.device) == (rank, nranks, dev), ws
            assert (ws.max_tokens, ws.hidden_size, ws.moe_gather_oneshot_max_tokens,
                    ws.moe_gather_separate_norm_min_tokens) == (1024, hidden, 16, 257), ws
            assert ws.device_group is dist.group.WORLD
            check(ws, [0, 1, 3, 64, 700], STRATEGIES)
            # The all_gather hook (the reference's) takes the UNFUSED calls;
            # assigned thresholds steer AUTO (the library then gets the
            # explicit strategy).
            calls = []

            def hook(out, inp):
                calls.append((tuple(out.shape), tuple(inp.shape)))
                dist.all_gather_into_tensor(out, inp)

            ws.all_gather = hook
            check(ws, [5, 64], ("unfused",))
            assert len(calls) == 8, calls  # 2 cases x inplace or not x (signature, rows)
            ws.moe_gather_oneshot_max_tokens = 0
            ws.moe_gather_separate_norm_min_tokens = 6
            assert (ws.strategy_for(5), ws.strategy_for(6)) == ("twoshot", "unfused")
            check(ws, [5, 64], (None,))  # 5: the library's TWOSHOT; 64: the hook
            assert len(calls) == 12, calls
            ws.all_gather = None
            ws.moe_gather_oneshot_max_tokens = 16
            ws.moe_gather_separate_norm_min_tokens = 257
            # Tensors of another device than the workspace's are rejected.
            if rank == 0:
                g, w, residual, _, _ = case(4, 3, top_k, hidden)
                expect(ValueError, "the workspace is on cuda",
                       lambda: beammoe.beam_moe_finalize_gather_norm_residual_norm(
                           beammoe.MoEOutput(g, w), residual, None, None, None, None, None, ws))
            dist.barrier()
        assert ws.closed
        allreduce_on_gpus(rank, nranks, dev)
        dist.barrier()

        gloo = dist.new_group(backend="gloo")
        with beammoe.Workspace(gloo, 64, hidden) as ws2:
            assert ws2.device_group is gloo and ws2.moe_gather_separate_norm_min_tokens is None
            check(ws2, [5, 64], (None,))
        dist.barrier()
    finally:
        dist.destroy_process_group()


MODES = {"bits": bits, "quant": quant, "allreduce": allreduce_mode, "threads": threads, "late": late,
         "late_rows": late_rows, "create": create, "kill_signature": lambda r, n: kill(r, n, "signature"),
         "kill_rows": lambda r, n: kill(r, n, "rows")}

if __name__ == "__main__":
    rank, nranks, STORE, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method="file://" + STORE, rank=rank, world_size=nranks)
    MODES[mode](rank, nranks)
    print("rank %d: ok" % rank, flush=True)
    os._exit(0)  # the group may hold the collectives given up or timed out: no teardown
