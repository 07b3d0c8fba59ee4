"""The CPU gather over a gloo group when calls overlap, a rank is late or
a rank dies: never other bits, never a hang, never an abort of the process.

Each test starts one process per rank (_pg_faults.py, whose text says what
each mode does and checks) under a hard timeout, and checks that every
rank that should live exits 0 having printed "rank R: ok", and that the
rank that dies dies as it was made to (not by gloo's abort, SIGABRT).
Last, in this process: calls made while one is in flight, and a failed
all_gather hook, on a one-rank gloo group and on a CpuGroup's workspace."""
import signal
import threading

import pytest
import torch

import beammoe
from reference import assert_bits_equal, random_bf16, random_case
from test_gather_process_group import gloo1, needs_gloo, run_workers  # noqa: F401  (gloo1: a fixture)

def run_ranks(mode, nranks, dies=None):
    return run_workers(nranks, [mode], "_pg_faults.py", 90, dies)


@needs_gloo
@pytest.mark.parametrize("nranks", [2, 3])
def test_overlapping_calls_are_refused(nranks):
    """Two threads of each rank call the gather on its one workspace at
    once: every call either is refused before anything (the C library's
    words: "another call on this workspace is in progress on another
    thread") or returns the one-process fused operation's bits; a call or
    close() made while a call is in flight (from another thread, or from
    inside the call's all_gather hook) is refused."""
    run_ranks("threads", nranks)


@needs_gloo
@pytest.mark.parametrize("nranks", [2, 3])
def test_late_rank_makes_the_workspace_unusable(nranks):
    """A rank late to a call: every rank raises BeamCommError within
    timeout_ms (plus slack), the late one too; every later call (any size,
    the FP8 form) and close() raise at once on every rank, naming the
    timeout; no rank aborts."""
    run_ranks("late", nranks)


@needs_gloo
@pytest.mark.parametrize("nranks", [2])
def test_rank_late_to_the_rows(nranks):
    """A rank that stalls between a call's signatures and its rows: its
    peers raise; it returns the call's exact bits (or raises), and its next
    call raises within timeout_ms; then every call and close() raise."""
    run_ranks("late_rows", nranks)


@needs_gloo
@pytest.mark.parametrize("nranks", [2, 3])
def test_creation_a_peer_gave_up_fails_everywhere(nranks):
    """A rank late to Workspace(): when its peers gave up and try again at
    once, every creation fails (out of step, or a timeout); when they gave
    up and do nothing more, the late rank's creation fails too."""
    run_ranks("create", nranks)


@needs_gloo
@pytest.mark.parametrize("nranks,where,dies", [(2, "signature", 3), (3, "rows", -signal.SIGKILL)])
def test_killed_rank(nranks, where, dies):
    """A rank dies inside a call (os._exit before its signature, SIGKILL
    before its rows): the others raise within timeout_ms, later calls and
    close() raise, and they exit normally (no hang, no SIGABRT)."""
    run_ranks("kill_" + where, nranks, dies)


# ---- in this process: a one-rank gloo group, and a CpuGroup's library workspace ----------------

FN = "beam_moe_finalize_gather_norm_residual_norm"
H, K = 256, 2


def _case(tokens=3):
    gen = torch.Generator().manual_seed(11)
    g, w = random_case(gen, tokens, K, H)
    return g, w, random_bf16(gen, tokens, H)


def _call(ws, g, w, residual, **kw):
    return beammoe.beam_moe_finalize_gather_norm_residual_norm(
        beammoe.MoEOutput(g, w), residual, None, 1e-6, None, 1e-6, None, ws, **kw)


@needs_gloo
def test_calls_in_flight_and_a_failed_hook(gloo1):  # noqa: F811
    """A call, or close(), made from inside a call in flight (its hook) or
    from another thread meanwhile is refused, nothing written; a hook that
    raises leaves the workspace unusable: every later call and close()
    raise BeamCommError naming it."""
    g, w, residual = _case()
    want, _ = beammoe.beam_moe_finalize_norm_residual_norm(
        beammoe.MoEOutput(g, w), residual, None, 1e-6, None, 1e-6, None)
    ws = beammoe.Workspace(None, 8, H, device="cpu")
    errors = []

    def refused():
        res = residual.clone()
        try:
            _call(ws, g, w, res, inplace=True)
        except beammoe.BeamArgumentError as e:
            errors.append(str(e))
        assert torch.equal(res, residual)

    def hook(out, inp):
        t = threading.Thread(target=refused)
        t.start()
        t.join(10)
        refused()
        with pytest.raises(ValueError, match=r"^beammoe.Workspace.close: a call on this workspace is in progress on "
                                             r"this thread .*nothing was closed; close it after that call returns"):
            ws.close()
        out.copy_(inp)

    ws.all_gather = hook
    h, _ = _call(ws, g, w, residual)
    assert_bits_equal(h, want)
    assert errors == ["%s: another call on this workspace is in progress on %s (calls on one workspace must not "
                      "overlap)" % (FN, where) for where in ("another thread",
                                                             "this thread (from inside its all_gather hook)")]

    def broken(out, inp):
        raise OSError("the hook's own failure")

    ws.all_gather = broken
    with pytest.raises(OSError, match=r"the hook's own failure"):
        _call(ws, g, w, residual)
    ws.all_gather = None
    # the refused calls did not count: the hook's failure is call 2
    named = r"an earlier call on this workspace failed \(rank 0, call 2: OSError: the hook's own failure\)"
    res = residual.clone()
    with pytest.raises(beammoe.BeamCommError, match=r"^%s: %s; the workspace is unusable, close it$" % (FN, named)):
        _call(ws, g, w, res, inplace=True)
    assert torch.equal(res, residual)
    for _ in range(2):
        with pytest.raises(beammoe.BeamCommError, match=r"^beammoe.Workspace.close: %s; the workspace is unusable "
                                                        r"\(closed now\)$" % named):
            ws.close()
        assert ws.closed


def test_library_workspace_unusable_after_a_failed_hook():
    """A library workspace (CpuGroup) whose hook raised in an UNFUSED call:
    its later calls, the library's strategies too, and close() raise; close()
    destroys the library's workspace all the same (the group then closes)."""
    g, w, residual = _case()
    with beammoe.CpuGroup(1) as grp:
        ws = beammoe.Workspace.cpu(grp, 0, 8, H)
        ws.all_gather = lambda out, inp: 1 / 0
        with pytest.raises(ZeroDivisionError):
            _call(ws, g, w, residual, strategy="unfused")
        for strategy in ("oneshot", "unfused", None):
            with pytest.raises(beammoe.BeamCommError, match=r"ZeroDivisionError.*; the workspace is unusable"):
                _call(ws, g, w, residual, strategy=strategy)
        with pytest.raises(beammoe.BeamCommError, match=r"\(closed now\)"):
            ws.close()
