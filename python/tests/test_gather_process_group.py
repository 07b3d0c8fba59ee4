"""The gather of a CPU Workspace over a torch.distributed gloo group, the
all_gather hook and the settable thresholds.

One process with a one-rank gloo group runs here; two processes (one per
rank, _pg_worker.py, under a hard timeout) check the bits against the
one-process fused operation, the CpuGroup gather and the torch-written
reference, the hook, threshold assignment, rejected and disagreeing ranks
(every rank raises, nobody waits) and a peer that never arrives; two and
three processes the quantized form (beammoe.fp8: every FP8 form and NVFP4)
against the one-process local _fp8 operation. The hook and thresholds of
library workspaces run over a CpuGroup (threads)."""
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import torch

import beammoe
from beammoe import _run
from reference import BF16, assert_bits_equal, random_bf16, random_case

dist = pytest.importorskip("torch.distributed")

_here = os.path.dirname(os.path.abspath(__file__))
H, K = 512, 4


def _gloo_skip():
    if not dist.is_available():
        return "torch.distributed is not available in this torch build"
    if not dist.is_gloo_available():
        return "torch.distributed has no gloo backend in this torch build"
    return None


needs_gloo = pytest.mark.skipif(_gloo_skip() is not None, reason=str(_gloo_skip()))


@pytest.fixture
def gloo1():
    """A one-rank gloo group (the default group) in this process."""
    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group("gloo", init_method="file://" + os.path.join(d, "store"), rank=0, world_size=1)
        try:
            yield
        finally:
            time.sleep(0.2)  # see test_workspace_plumbing._settle
            dist.destroy_process_group()


def _data(gen, tokens):
    g, w = random_case(gen, max(tokens, 1), K, H, specials=True)
    return g, w, random_bf16(gen, tokens, H, scale=2.0), random_bf16(gen, H), random_bf16(gen, H)


def _gather(ws, g, w, residual, pw, nw, **kw):
    return beammoe.beam_moe_finalize_gather_norm_residual_norm(
        beammoe.MoEOutput(g, w), residual, pw, 1e-6, nw, 1e-5, (0.5, 1.5), ws, 1.25, **kw)


def _fused(g, w, residual, pw, nw):
    return beammoe.beam_moe_finalize_norm_residual_norm(
        beammoe.MoEOutput(g, w), residual, pw, 1e-6, nw, 1e-5, (0.5, 1.5), 1.25)


@needs_gloo
def test_cpu_workspace_over_a_gloo_group(gen, gloo1):
    with beammoe.Workspace(None, 32, H, device="cpu") as ws:
        assert (ws.rank, ws.world_size, ws.device) == (0, 1, torch.device("cpu"))
        assert ws.device_group is dist.group.WORLD
        assert ws.moe_gather_oneshot_max_tokens == 64 and ws.moe_gather_separate_norm_min_tokens is None
        assert ws.timeout_ms == 30000 and "process group" in repr(ws)
        assert beammoe.Workspace.by_handle(ws.handle) is ws
        for tokens in (0, 1, 9):
            g, w, residual, pw, nw = _data(gen, tokens)
            want_h, want_n = _fused(g, w, residual, pw, nw)
            for strategy in (None, "oneshot", "twoshot", "unfused"):
                h, n = _gather(ws, g, w, residual, pw, nw, strategy=strategy)
                assert_bits_equal(h, want_h, "hidden %s" % strategy)
                assert_bits_equal(n, want_n, "normalized %s" % strategy)
            res = residual.clone()
            h, n = _gather(ws, g, w, res, pw, nw, inplace=True)
            assert h is res
            assert_bits_equal(res, want_h)
        with pytest.raises(ValueError, match=r"strategy=FUSED: unknown strategy for this operation"):
            _gather(ws, g, w, residual, pw, nw, strategy="fused")
        with pytest.raises(ValueError, match=r"tokens=33 must be <= max_tokens=32 of the workspace"):
            _gather(ws, *_data(gen, 33))
        with pytest.raises(TypeError, match=r"x must be an unfinalized MoE output"):
            beammoe.beam_moe_finalize_gather_norm_residual_norm(g, residual, None, None, None, None, None, ws)
    assert ws.closed
    with pytest.raises(ValueError, match=r"the workspace is closed"):
        _gather(ws, g, w, residual, pw, nw)


@needs_gloo
def test_cpu_workspace_hook_and_autograd(gen, gloo1):
    g, w, residual, pw, nw = _data(gen, 5)
    want_h, want_n = _fused(g, w, residual, pw, nw)
    calls = []

    def hook(out, inp):
        calls.append((tuple(out.shape), tuple(inp.shape)))
        out.copy_(inp)  # one rank: the gather is a copy

    with beammoe.Workspace(None, 8, H, device="cpu") as ws:
        ws.all_gather = hook
        h, n = _gather(ws, g, w, residual, pw, nw)
        assert calls == [((5, H), (5, H))]
        assert_bits_equal(h, want_h)
        assert_bits_equal(n, want_n)
        # A norm weight that requires grad: the forward runs, a backward is refused.
        ppw = torch.nn.Parameter(pw.clone())
        h, n = _gather(ws, g, w, residual, ppw, nw)
        assert_bits_equal(h.detach(), want_h)
        with pytest.raises(RuntimeError, match=r"no derivative"):
            h.float().sum().backward()


@needs_gloo
def test_cpu_workspace_arguments(gloo1):
    with pytest.raises(ValueError, match=r"^beammoe.Workspace: hidden=300 must be a multiple of 256"):
        beammoe.Workspace(None, 8, 300, device="cpu")
    with pytest.raises(ValueError, match=r"^beammoe.Workspace: timeout_ms=0 must be >= 1"):
        beammoe.Workspace(None, 8, 256, device="cpu", timeout_ms=0)
    with pytest.raises(ValueError, match=r"device=meta: only cpu and cuda workspaces exist"):
        beammoe.Workspace(None, 8, 256, device="meta")
    with pytest.raises(TypeError, match=r"device must be None, a string or a torch.device, got int"):
        beammoe.Workspace(None, 8, 256, device=0)
    with beammoe.Workspace(None, 8, 256, device=torch.device("cpu"), moe_gather_oneshot_max_tokens=0,
                           moe_gather_separate_norm_min_tokens=0) as ws:
        assert ws.moe_gather_separate_norm_min_tokens == 0
        assert [ws.strategy_for(t) for t in (0, 1)] == ["oneshot", "unfused"]


@needs_gloo
@pytest.mark.parametrize("nranks", [2])
def test_two_processes(nranks):
    """One process per rank (gloo over a file store): see _pg_worker.py. A
    hard timeout: a hang fails the test instead of stalling the suite."""
    run_workers(nranks)


@needs_gloo
@pytest.mark.parametrize("nranks", [2, 3])
def test_quantized_form_processes(nranks):
    """The quantized form (beammoe.fp8: every FP8 form and NVFP4) gathered in
    Python over the group and through the hook, one process per rank:
    _pg_worker.py's check_quant."""
    run_workers(nranks, ["quant"])


def run_workers(nranks, mode=(), script="_pg_worker.py", limit=240, dies=None):
    """Run `python SCRIPT RANK NRANKS INIT_FILE *mode`, one process per rank
    (gloo over a file store), under a hard timeout: a hang fails the test
    instead of stalling the suite. Every rank must exit 0 having printed
    "rank R: ok", but the last where `dies` is its expected exit status;
    none may end by gloo's abort (SIGABRT). Returns every rank's output."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as d:
        store = os.path.join(d, "store")
        procs = [subprocess.Popen([sys.executable, os.path.join(_here, script), str(r), str(nranks), store]
                                  + list(mode), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
                 for r in range(nranks)]
        deadline = time.monotonic() + limit
        outs = []
        try:
            for p in procs:
                out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
                outs.append(out.decode("utf-8", "replace"))
        except subprocess.TimeoutExpired:
            pytest.fail("%s %s with %d processes did not finish within %d s (a hang)" % (script, " ".join(mode),
                                                                                      nranks, limit))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    for r, (p, out) in enumerate(zip(procs, outs)):
        if r == nranks - 1 and dies is not None:
            assert p.returncode == dies, "rank %d exited %s, not %s:\n%s" % (r, p.returncode, dies, out[-6000:])
            continue
        assert p.returncode != -signal.SIGABRT, "rank %d aborted (gloo):\n%s" % (r, out[-6000:])
        assert p.returncode == 0, "rank %d exited %s:\n%s" % (r, p.returncode, out[-6000:])
        assert "rank %d: ok" % r in out, out[-6000:]
    return outs


# ---- library workspaces (CpuGroup): the hook and the thresholds ----------------

from test_gather_cpu import run_ranks as _run_ranks  # noqa: E402  (ranks as threads)

class ThreadAllGather:
    """An all_gather_into_tensor over threads (a CpuGroup's ranks)."""

    def __init__(self, nranks):
        self.nranks = nranks
        self.barrier = threading.Barrier(nranks)
        self.slots = [None] * nranks
        self.calls = []

    def hook_for(self, rank):
        def hook(out, inp):
            self.calls.append((rank, tuple(out.shape), tuple(inp.shape)))
            self.slots[rank] = inp.clone()
            self.barrier.wait(30)
            n = inp.shape[0]
            for r in range(self.nranks):
                out[r * n:(r + 1) * n] = self.slots[r]
            self.barrier.wait(30)
        return hook


def _local(g, w, tokens, nranks, rank):
    per = -(-tokens // nranks)
    lo, hi = min(rank * per, tokens), min((rank + 1) * per, tokens)
    lg = torch.zeros(per, K, H, dtype=BF16)
    lw = torch.zeros(per, K)
    lg[: hi - lo] = g.view(-1, K, H)[lo:hi]
    lw[: hi - lo] = w[lo:hi]
    return lg.view(per * K, H), lw


def test_library_workspace_hook_takes_unfused(gen):
    """With the hook set, UNFUSED calls (asked for, or AUTO's choice after
    the thresholds were assigned) gather through it; the others do not."""
    nranks, tokens = 2, 7
    g, w, residual, pw, nw = _data(gen, tokens)
    want_h, want_n = _fused(g, w, residual, pw, nw)
    ag = ThreadAllGather(nranks)
    with beammoe.CpuGroup(nranks) as grp:
        def body(r):
            with beammoe.Workspace.cpu(grp, r, 16, H) as ws:
                assert ws.all_gather is None
                ws.all_gather = ag.hook_for(r)
                lg, lw = _local(g, w, tokens, nranks, r)
                out = [_gather(ws, lg, lw, residual, pw, nw, strategy="unfused")]
                n_unfused = len([c for c in ag.calls if c[0] == r])
                out.append(_gather(ws, lg, lw, residual, pw, nw))  # AUTO: oneshot (64)
                assert len([c for c in ag.calls if c[0] == r]) == n_unfused
                ws.moe_gather_oneshot_max_tokens = 0
                ws.moe_gather_separate_norm_min_tokens = 5
                assert ws.strategy_for(tokens) == "unfused"
                out.append(_gather(ws, lg, lw, residual, pw, nw))  # AUTO: unfused, through the hook
                assert len([c for c in ag.calls if c[0] == r]) == 2 * n_unfused
                ws.all_gather = None
                out.append(_gather(ws, lg, lw, residual, pw, nw))  # the library's unfused
                return out

        results = _run_ranks(nranks, body)
    # each hooked call: the signature row, then the rows
    assert sorted(c[1:] for c in ag.calls if c[0] == 0) == sorted([((2, H), (1, H)), ((8, H), (4, H))] * 2)
    for out in results:
        for h, n in out:
            assert_bits_equal(h, want_h)
            assert_bits_equal(n, want_n)


def test_library_workspace_hook_rejected_rank(gen):
    """A rank that rejects its arguments on the hook's path: every rank raises."""
    nranks, tokens = 2, 4
    g, w, residual, pw, nw = _data(gen, tokens)
    ag = ThreadAllGather(nranks)
    fn = "beam_moe_finalize_gather_norm_residual_norm"
    with beammoe.CpuGroup(nranks) as grp:
        def body(r):
            with beammoe.Workspace.cpu(grp, r, 16, H, timeout_ms=20000) as ws:
                ws.all_gather = ag.hook_for(r)
                lg, lw = _local(g, w, tokens, nranks, r)
                if r == 1:
                    with pytest.raises(TypeError, match=r"^%s: x.expert_weights must have dtype torch.float32" % fn):
                        _gather(ws, lg, lw.double(), residual, pw, nw, strategy="unfused")
                else:
                    with pytest.raises(beammoe.BeamArgumentError,
                                       match=r"^%s: rank 1 failed \(TypeError: .*x.expert_weights" % fn):
                        _gather(ws, lg, lw, residual, pw, nw, strategy="unfused")
                return _gather(ws, lg, lw, residual, pw, nw, strategy="unfused")

        results = _run_ranks(nranks, body)
    want_h, _ = _fused(g, w, residual, pw, nw)
    for h, _ in results:
        assert_bits_equal(h, want_h)


def test_library_workspace_auto_follows_assigned_thresholds(gen, monkeypatch):
    """AUTO is decided from the attributes once they were assigned: the
    library is handed the explicit strategy (and its own AUTO before)."""
    seen = []
    real = _run.gather

    def spy(dev, ops, handle, *args):
        seen.append(args[-1])
        return real(dev, ops, handle, *args)

    monkeypatch.setattr(_run, "gather", spy)
    g, w, residual, pw, nw = _data(gen, 6)
    want_h, _ = _fused(g, w, residual, pw, nw)
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 16, H) as ws:
        _gather(ws, g, w, residual, pw, nw)
        ws.moe_gather_oneshot_max_tokens = 2
        _gather(ws, g, w, residual, pw, nw)
        ws.moe_gather_separate_norm_min_tokens = 6
        _gather(ws, g, w, residual, pw, nw)
        ws.oneshot_max_tokens = 64  # the library's name
        ws.twoshot_max_tokens = 2 ** 63 - 1
        assert ws.moe_gather_separate_norm_min_tokens is None
        h, _ = _gather(ws, g, w, residual, pw, nw)
        with pytest.raises(TypeError, match=r"^beammoe.Workspace: moe_gather_oneshot_max_tokens must be an int, "
                                            r"got bool"):
            ws.moe_gather_oneshot_max_tokens = True
        with pytest.raises(ValueError, match=r"^beammoe.Workspace: moe_gather_separate_norm_min_tokens=-3 must be "
                                             r">= 0"):
            ws.moe_gather_separate_norm_min_tokens = -3
    assert seen == [0, 4, 2, 0]  # AUTO (the library's rule), TWOSHOT, UNFUSED, AUTO again
    assert_bits_equal(h, want_h)


@needs_gloo
@pytest.mark.skipif(not beammoe.HAVE_TORCH_OPS, reason="torch.compile of the operators needs torch >= 2.4")
def test_cpu_workspace_under_torch_compile(gen, gloo1):
    """torch.compile(fullgraph=True): the gather operator takes the
    workspace's id and runs the gather in Python inside it."""
    g, w, residual, pw, nw = _data(gen, 6)
    want_h, want_n = _fused(g, w, residual, pw, nw)
    with beammoe.Workspace(None, 16, H, device="cpu") as ws:
        def f(g, w, residual):
            return _gather(ws, g, w, residual, pw, nw)

        torch._dynamo.reset()
        h, n = torch.compile(f, fullgraph=True)(g, w, residual)
    assert_bits_equal(h, want_h)
    assert_bits_equal(n, want_n)
