"""One rank of the CPU gather over a gloo group when things go wrong
(test_gather_faults.py runs it as `python _pg_faults.py RANK NRANKS
INIT_FILE MODE`, one process per rank, under a hard timeout). The last rank is
the one that misbehaves; each step checks its own results and raises on a
mismatch (the process then exits 1 with the traceback), and a rank prints
"rank R: ok" last. Modes:

threads    two threads of every rank call the gather on the rank's one
           workspace at once: a call either is refused (the overlap error,
           nothing written) or returns the one-process fused operation's
           bits; calls made from inside a call in flight (another thread's,
           this thread's, close()) are refused.
late       the last rank comes late to a call: every other rank raises
           within timeout_ms, the late one too (its peers never send the
           call's rows); every later call and close() raise, on every rank,
           at once, naming the failure.
late_rows  the last rank stalls between a call's signatures and its rows:
           the others raise within timeout_ms; the late one returns the
           call's exact bits (its peers' rows were sent) or raises, and its
           next call raises; then every call and close() raise everywhere.
create     the last rank comes late to the workspace's creation. First the
           others give up and try again at once: every rank's creation
           fails. Then they give up and do nothing more: the late rank's
           creation fails too (within timeout_ms of its arrival).
kill_signature, kill_rows
           the last rank dies inside a call (os._exit before its signature
           is sent; SIGKILL after the signatures, before the rows): the
           others raise within timeout_ms, later calls and close() raise,
           and no rank hangs or aborts.
"""
import os
import signal
import sys
import threading
import time

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _here)
try:
    import beammoe  # noqa: F401
except ImportError:  # the source tree's package (as conftest.py does)
    sys.path.insert(1, os.path.dirname(_here))

import torch.distributed as dist  # noqa: E402

import beammoe  # noqa: E402
from beammoe import _pgather  # noqa: E402
from reference import assert_bits_equal  # noqa: E402
from _pg_worker import ARGS, H, all_gather_hook, case, expect, gather, local_rows  # noqa: E402

TMO = 600  # timeout_ms of the workspaces that fail
SLACK = 3.0  # seconds past a wait's bound that a loaded host may take
OVERLAP = r"another call on this workspace is in progress on %s \(calls on one workspace must not overlap\)"


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
    want = beammoe.beam_moe_finalize_norm_residual_norm(
        beammoe.MoEOutput(g, w), residual, pw, 1e-6, nw, 1e-5, ARGS["scales"], ARGS["routed"])
    lg, lw = local_rows(g, w, tokens, nranks, rank)
    return lg, lw, residual, pw, nw, want


def same(got, want, what):
    assert_bits_equal(got[0], want[0], what + " hidden")
    assert_bits_equal(got[1], want[1], what + " normalized")


def all_unusable(ws, rank, nranks, failure):
    """Every later call (any size, the FP8 form, in place) and close()
    raise at once, naming the failure; nothing is written."""
    named = r"an earlier call on this workspace failed \(rank %d, call \d+: .*%s.*\); the workspace is unusable" % (
        rank, failure)
    for tokens in (0, 1, 40):
        lg, lw, residual, pw, nw, _ = inputs(tokens, rank, nranks)
        res = residual.clone()
        bounded("a call on an unusable workspace", 0.5, lambda: gather(ws, lg, lw, res, pw, nw, inplace=True),
                pattern=r"^beam_moe_finalize_gather_norm_residual_norm: " + named)
        assert_bits_equal(res, residual, "residual after a refused call")
        bounded("an FP8 call on an unusable workspace", 0.5,
                lambda: beammoe.beam_moe_finalize_gather_norm_residual_norm_fp8(
                    beammoe.MoEOutput(lg, lw), res, pw, 1e-6, nw, 1e-5, None, ws, quant=beammoe.FP8Quant("token")),
                pattern=r"^beam_moe_finalize_gather_norm_residual_norm_q: " + named)
    for _ in range(2):
        bounded("close()", 0.5, ws.close, pattern=r"^beammoe.Workspace.close: " + named + r" \(closed now\)")
        assert ws.closed
    # leaving a with block by another exception keeps that exception
    try:
        with ws:
            raise KeyError("mine")
    except KeyError:
        pass


# ---- threads ------------------------------------------------------------------------

def threads(rank, nranks):
    ws = beammoe.Workspace(None, 64, H, device="cpu", timeout_ms=30000)
    lg, lw, residual, pw, nw, want = inputs(5, rank, nranks)
    fn = "beam_moe_finalize_gather_norm_residual_norm"

    # Calls made while one is in flight (its rows' all_gather is the hook):
    # refused before anything, nothing written.
    seen = []

    def refused(where):
        res = residual.clone()
        expect(beammoe.BeamArgumentError, r"^%s: %s$" % (fn, OVERLAP % where),
               lambda: gather(ws, lg, lw, res, pw, nw, inplace=True))
        assert_bits_equal(res, residual, "residual after a refused call")
        seen.append(where)

    inner = all_gather_hook(nranks)

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
    same(gather(ws, lg, lw, residual, pw, nw), want, "the call in flight")
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
                same(got, want, "a concurrent call")
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
    same(gather(ws, lg, lw, residual, pw, nw), want, "a call after the concurrent ones")
    ws.close()


# ---- late ranks -----------------------------------------------------------------------

def first_call(rank, nranks):
    """A workspace of timeout_ms=TMO, and its first call, which every rank
    makes in time; every rank meets after it. (ws, the inputs of a call)."""
    ws = beammoe.Workspace(None, 64, H, device="cpu", timeout_ms=TMO)
    lg, lw, residual, pw, nw, want = inputs(7, rank, nranks)
    same(gather(ws, lg, lw, residual, pw, nw), want, "call 1")
    sync("call1", rank, nranks)
    return ws, (lg, lw, residual, pw, nw, want)


def late(rank, nranks):
    last = nranks - 1
    ws, (lg, lw, residual, pw, nw, want) = first_call(rank, nranks)
    if rank == last:
        time.sleep(3 * TMO / 1000)
        # its peers' abandoned signatures arrive; their rows never do
        bounded("the late rank's call", TMO / 1000 + SLACK, lambda: gather(ws, lg, lw, residual, pw, nw),
                pattern=r"rank %d: .*timeout_ms=%d.*; the workspace is unusable, close it" % (rank, TMO))
    else:
        bounded("the call a rank is late to", TMO / 1000 + SLACK, lambda: gather(ws, lg, lw, residual, pw, nw),
                pattern=r"rank %d: .*timeout_ms=%d.*; the workspace is unusable, close it" % (rank, TMO))
    all_unusable(ws, rank, nranks, "timeout_ms=%d" % TMO)
    sync("done", rank, nranks)


def late_rows(rank, nranks):
    last = nranks - 1
    ws, (lg, lw, residual, pw, nw, want) = first_call(rank, nranks)
    if rank == last:
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
            same(got, want, "the late rank's call")  # never other bits
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
        bounded("the late rank's creation", TMO / 1000 + SLACK, make, pattern=r"timeout_ms=%d" % TMO)
    else:
        bounded("a creation a rank is late to", TMO / 1000 + SLACK, make, pattern=r"timeout_ms=%d" % TMO)
    sync("done", rank, nranks)


# ---- a rank dies ---------------------------------------------------------------------------

def kill(rank, nranks, where):
    last = nranks - 1
    ws, (lg, lw, residual, pw, nw, want) = first_call(rank, nranks)
    if rank == last:
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


MODES = {"threads": threads, "late": late, "late_rows": late_rows, "create": create,
         "kill_signature": lambda r, n: kill(r, n, "signature"), "kill_rows": lambda r, n: kill(r, n, "rows")}

if __name__ == "__main__":
    rank, nranks, STORE, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method="file://" + STORE, rank=rank, world_size=nranks)
    MODES[mode](rank, nranks)
    print("rank %d: ok" % rank, flush=True)
    os._exit(0)  # the group holds the collectives given up: no teardown
