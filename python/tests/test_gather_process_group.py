"""The gather of a Workspace over a torch.distributed process group, the
all_gather hook and the settable thresholds: a one-rank gloo group in this
process; one process per rank (_pg_worker.py, whose text says what each
mode checks), each mode under a hard timeout: every rank that should live
exits 0 having printed "rank R: ok", the rank made to die dies so, none by
gloo's abort (SIGABRT); one process per GPU (torch.multiprocessing, spawn,
NCCL), skipped with fewer GPUs than ranks. The gather over a CpuGroup
(R ranks as threads, each with its own tokens: the local fused operation's
bits), its hook and thresholds, and calls in flight. Workspace(group, ...)
without a GPU: the NCCL and CUDA pieces stubbed, so that the Python plumbing
runs on any host: the unique id broadcast over a (one-rank gloo) group,
ncclCommInitRank's arguments, the config handed to beam_workspace_create_nccl,
and close()'s order (workspace, then communicator)."""
import contextlib
import os
import signal
import tempfile
import threading
import time

import pytest
import torch

import beammoe
from beammoe import _lib, _nccl, _run
from conftest import H, K, ThreadAllGather, check_gather, cuda_backend_skip_reason, fused, gather, local_rows
from conftest import needs_gloo, run_ranks, run_workers, settle
from reference import BF16, assert_bits_equal, layer, random_bf16, random_case

dist = pytest.importorskip("torch.distributed")

import _pg_worker  # noqa: E402


@needs_gloo
def test_cpu_workspace_over_a_gloo_group(gen, gloo1):
    with beammoe.Workspace(None, 32, H, device="cpu") as ws:
        assert (ws.rank, ws.world_size, ws.device) == (0, 1, torch.device("cpu"))
        assert ws.device_group is dist.group.WORLD
        assert ws.moe_gather_oneshot_max_tokens == 64 and ws.moe_gather_separate_norm_min_tokens is None
        assert ws.timeout_ms == 30000 and "process group" in repr(ws)
        assert beammoe.Workspace.by_handle(ws.handle) is ws
        g, w, residual, pw, nw = check_gather(ws, 0, 1, lambda t: layer(gen, t, K, H), (0, 1, 9))
        with pytest.raises(ValueError, match=r"strategy=FUSED: unknown strategy for this operation"):
            gather(ws, g, w, residual, pw, nw, strategy="fused")
        with pytest.raises(ValueError, match=r"tokens=33 must be <= max_tokens=32 of the workspace"):
            gather(ws, *layer(gen, 33, K, H))
        with pytest.raises(TypeError, match=r"x must be an unfinalized MoE output"):
            beammoe.beam_moe_finalize_gather_norm_residual_norm(g, residual, None, None, None, None, None, ws)
    assert ws.closed and ws.device_group is None  # the group is not kept alive past its destroy
    with pytest.raises(ValueError, match=r"the workspace is closed"):
        gather(ws, g, w, residual, pw, nw)


@needs_gloo
def test_cpu_workspace_hook_and_autograd(gen, gloo1):
    g, w, residual, pw, nw = layer(gen, 5, K, H)
    want_h, want_n = fused(g, w, residual, pw, nw)
    calls = []

    def hook(out, inp):
        calls.append((tuple(out.shape), tuple(inp.shape)))
        out.copy_(inp)  # one rank: the gather is a copy

    with beammoe.Workspace(None, 8, H, device="cpu") as ws:
        ws.all_gather = hook
        h, n = gather(ws, g, w, residual, pw, nw)
        assert calls == [((5, H), (5, H))]
        assert_bits_equal((h, n), (want_h, want_n))
        # A norm weight that requires grad: the forward runs, a backward is refused.
        ppw = torch.nn.Parameter(pw.clone())
        h, n = gather(ws, g, w, residual, ppw, nw)
        assert_bits_equal(h.detach(), want_h)
        with pytest.raises(RuntimeError, match=r"no derivative"):
            h.float().sum().backward()


@needs_gloo
@pytest.mark.parametrize("hidden,kw,exc,msg", [
    (300, dict(device="cpu"), ValueError, r"^beammoe.Workspace: hidden=300 must be a multiple of 256"),
    (256, dict(device="cpu", timeout_ms=0), ValueError, r"^beammoe.Workspace: timeout_ms=0 must be >= 1"),
    (256, dict(device="meta"), ValueError, r"device=meta: only cpu and cuda workspaces exist"),
    (256, dict(device=0), TypeError, r"device must be None, a string or a torch.device, got int")])
def test_cpu_workspace_arguments(gloo1, hidden, kw, exc, msg):
    with pytest.raises(exc, match=msg):
        beammoe.Workspace(None, 8, hidden, **kw)
    with beammoe.Workspace(None, 8, 256, device=torch.device("cpu"), moe_gather_oneshot_max_tokens=0,
                           moe_gather_separate_norm_min_tokens=0) as ws:
        assert ws.moe_gather_separate_norm_min_tokens == 0
        assert [ws.strategy_for(t) for t in (0, 1)] == ["oneshot", "unfused"]


# ---- one process per rank (_pg_worker.py, whose text says what each mode does and checks) ----

@needs_gloo
@pytest.mark.parametrize("nranks,mode,limit,dies", [
    (2, "bits", 240, None), (2, "quant", 240, None), (3, "quant", 240, None), (2, "threads", 90, None),
    (3, "threads", 90, None), (2, "late", 90, None), (3, "late", 90, None), (2, "late_rows", 90, None),
    (2, "create", 90, None), (3, "create", 90, None), (2, "allreduce", 240, None), (3, "allreduce", 240, None),
    (2, "kill_signature", 90, 3),
    (3, "kill_rows", 90, -signal.SIGKILL)])
def test_processes(nranks, mode, limit, dies):
    run_workers(nranks, mode, limit, dies)


@pytest.mark.parametrize("nranks", [1, 2])
def test_gather_on_gpus(nranks):
    """_pg_worker.worker on each GPU, under a hard timeout."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < nranks:
        pytest.skip("needs %d GPUs" % nranks)
    if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        pytest.skip("torch.distributed with NCCL is not available")
    why = cuda_backend_skip_reason()
    if why:
        pytest.skip(why)
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        ctx = mp.spawn(_pg_worker.worker, args=(nranks, os.path.join(d, "store")), nprocs=nranks, join=False)
        deadline = time.monotonic() + 480
        while not ctx.join(timeout=5):  # raises if a rank failed
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                pytest.fail("the ranks did not finish within 480 s")


# ---- library workspaces (CpuGroup): the hook and the thresholds ----------------

def test_library_workspace_hook_takes_unfused(gen):
    """With the hook set, UNFUSED calls (asked for, or AUTO's choice after
    the thresholds were assigned) gather through it; the others do not."""
    nranks, tokens = 2, 7
    g, w, residual, pw, nw = layer(gen, tokens, K, H)
    want_h, want_n = fused(g, w, residual, pw, nw)
    ag = ThreadAllGather(nranks)
    with beammoe.CpuGroup(nranks) as grp:
        def body(r):
            with beammoe.Workspace.cpu(grp, r, 16, H) as ws:
                assert ws.all_gather is None
                ws.all_gather = ag.hook_for(r)
                lg, lw = local_rows(g, w, tokens, nranks, r, pad=0)
                out = [gather(ws, lg, lw, residual, pw, nw, strategy="unfused")]
                n_unfused = ag.count(r)
                out.append(gather(ws, lg, lw, residual, pw, nw))  # AUTO: oneshot (64)
                assert ag.count(r) == n_unfused
                ws.moe_gather_oneshot_max_tokens = 0
                ws.moe_gather_separate_norm_min_tokens = 5
                assert ws.strategy_for(tokens) == "unfused"
                out.append(gather(ws, lg, lw, residual, pw, nw))  # AUTO: unfused, through the hook
                assert ag.count(r) == 2 * n_unfused
                ws.all_gather = None
                out.append(gather(ws, lg, lw, residual, pw, nw))  # the library's unfused
                return out

        results = run_ranks(nranks, body)
    # each hooked call: the signature row, then the rows
    assert sorted(c[1:] for c in ag.calls if c[0] == 0) == sorted([((2, H), (1, H)), ((8, H), (4, H))] * 2)
    for out in results:
        for h, n in out:
            assert_bits_equal((h, n), (want_h, want_n))


def test_library_workspace_hook_rejected_rank(gen):
    """A rank that rejects its arguments on the hook's path: every rank raises."""
    nranks, tokens = 2, 4
    g, w, residual, pw, nw = layer(gen, tokens, K, H)
    ag = ThreadAllGather(nranks)
    fn = "beam_moe_finalize_gather_norm_residual_norm"
    with beammoe.CpuGroup(nranks) as grp:
        def body(r):
            with beammoe.Workspace.cpu(grp, r, 16, H, timeout_ms=20000) as ws:
                ws.all_gather = ag.hook_for(r)
                lg, lw = local_rows(g, w, tokens, nranks, r, pad=0)
                if r == 1:
                    with pytest.raises(TypeError, match=r"^%s: x.expert_weights must have dtype torch.float32" % fn):
                        gather(ws, lg, lw.double(), residual, pw, nw, strategy="unfused")
                else:
                    with pytest.raises(beammoe.BeamArgumentError,
                                       match=r"^%s: rank 1 failed \(TypeError: .*x.expert_weights" % fn):
                        gather(ws, lg, lw, residual, pw, nw, strategy="unfused")
                return gather(ws, lg, lw, residual, pw, nw, strategy="unfused")

        results = run_ranks(nranks, body)
    want_h, _ = fused(g, w, residual, pw, nw)
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
    g, w, residual, pw, nw = layer(gen, 6, K, H)
    want_h, _ = fused(g, w, residual, pw, nw)
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 16, H) as ws:
        gather(ws, g, w, residual, pw, nw)
        ws.moe_gather_oneshot_max_tokens = 2
        gather(ws, g, w, residual, pw, nw)
        ws.moe_gather_separate_norm_min_tokens = 6
        gather(ws, g, w, residual, pw, nw)
        ws.oneshot_max_tokens = 64  # the library's name
        ws.twoshot_max_tokens = 2 ** 63 - 1
        assert ws.moe_gather_separate_norm_min_tokens is None
        h, _ = gather(ws, g, w, residual, pw, nw)
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
    """torch.compile(fullgraph=True): the gather and the all-reduce
    operators take the workspace's id and run in Python inside it."""
    g, w, residual, pw, nw = layer(gen, 6, K, H)
    want_h, want_n = fused(g, w, residual, pw, nw)
    x = random_bf16(gen, 6, H)
    with beammoe.Workspace(None, 16, H, device="cpu") as ws:
        def f(g, w, residual):
            return (gather(ws, g, w, residual, pw, nw),
                    beammoe.beam_moe_finalize_allreduce_norm_residual_norm(
                        beammoe.MoEOutput(g, w), residual, pw, 1e-6, nw, 1e-5, (0.5, 1.5), ws, 1.25),
                    beammoe.beam_allreduce_norm_residual_norm(x, residual, pw, 1e-6, nw, 1e-5, None, ws))

        torch._dynamo.reset()
        got = torch.compile(f, fullgraph=True)(g, w, residual)
    assert_bits_equal(got[0], (want_h, want_n))
    assert_bits_equal(got[1], (want_h, want_n))  # one rank: the local fused operation
    assert_bits_equal(got[2], beammoe.beam_norm_residual_norm(x, residual, pw, 1e-6, nw, 1e-5, None))


# ---- calls in flight and a failed hook: a one-rank gloo group, and a CpuGroup's workspace ----------

FN = "beam_moe_finalize_gather_norm_residual_norm"


def _case(tokens=3):
    gen = torch.Generator().manual_seed(11)
    g, w = random_case(gen, tokens, 2, 256)
    return g, w, random_bf16(gen, tokens, 256)


def _call(ws, g, w, residual, **kw):
    return beammoe.beam_moe_finalize_gather_norm_residual_norm(
        beammoe.MoEOutput(g, w), residual, None, 1e-6, None, 1e-6, None, ws, **kw)


@needs_gloo
def test_calls_in_flight_and_a_failed_hook(gloo1):
    """A call, or close(), made from inside a call in flight (its hook) or
    from another thread meanwhile is refused, nothing written; a hook that
    raises leaves the workspace unusable: every later call and close()
    raise BeamCommError naming it."""
    g, w, residual = _case()
    want, _ = beammoe.beam_moe_finalize_norm_residual_norm(
        beammoe.MoEOutput(g, w), residual, None, 1e-6, None, 1e-6, None)
    ws = beammoe.Workspace(None, 8, 256, device="cpu")
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
        ws = beammoe.Workspace.cpu(grp, 0, 8, 256)
        ws.all_gather = lambda out, inp: 1 / 0
        with pytest.raises(ZeroDivisionError):
            _call(ws, g, w, residual, strategy="unfused")
        for strategy in ("oneshot", "unfused", None):
            with pytest.raises(beammoe.BeamCommError, match=r"ZeroDivisionError.*; the workspace is unusable"):
                _call(ws, g, w, residual, strategy=strategy)
        with pytest.raises(beammoe.BeamCommError, match=r"\(closed now\)"):
            ws.close()


# ---- the gather over a CpuGroup (threads) ----------------------------------------

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
    assert_bits_equal((h, n), (want_h, want_n))


# ---- Workspace(group, ...) with NCCL and CUDA stubbed -------------------------------

class _CudaOps:
    """The CUDA backend's table as the workspace uses it: the CPU backend's
    real table, with create_nccl/destroy of a CPU workspace (a real handle,
    so workspace_info works) standing in for the NCCL ones."""

    def __init__(self, real, group, calls):
        self._real, self._group, self._calls = real, group, calls

    def __getattr__(self, name):
        return getattr(self._real, name)

    def workspace_create_nccl(self, comm, max_tokens, hidden, cfg, out):
        c = cfg._obj  # ctypes.byref(config)
        self._calls.append(("create", comm, max_tokens, hidden,
                            (c.oneshot_max_tokens, c.twoshot_max_tokens, c.timeout_ms)))
        return self._real.workspace_create_cpu(self._group.handle, 0, max_tokens, hidden, cfg, out)

    def workspace_destroy(self, h):
        self._calls.append(("destroy",))
        return self._real.workspace_destroy(h)


@pytest.fixture
def stubbed(monkeypatch, gloo1):
    calls = []
    grp = beammoe.CpuGroup(1)
    real = _lib.backend_ops
    cuda = _CudaOps(real("cpu"), grp, calls)

    def backend_ops(name):
        if name != "cuda":
            return real(name)
        calls.append(("backend", name))
        return cuda

    monkeypatch.setattr(_lib, "backend_ops", backend_ops)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    uid = bytes(range(128))
    monkeypatch.setattr(_nccl, "unique_id", lambda: uid)

    def init(nranks, u, rank):
        calls.append(("comm_init", nranks, u == uid, rank))
        return 0xC0FFEE

    monkeypatch.setattr(_nccl, "comm_init_rank", init)
    monkeypatch.setattr(_nccl, "comm_destroy", lambda c: calls.append(("comm_destroy", c)))
    yield calls
    monkeypatch.undo()
    grp.close()


@needs_gloo
def test_workspace_collective_plumbing(stubbed):
    calls = stubbed
    with beammoe.Workspace(None, 64, 512, moe_gather_oneshot_max_tokens=3, timeout_ms=1234) as ws:
        assert (ws.rank, ws.world_size, ws.max_tokens, ws.hidden_size) == (0, 1, 64, 512)
        assert (ws.nranks, ws.hidden) == (1, 512)  # the library's names
        assert ws.device == torch.device("cuda", 0)
        assert ws.device_group is dist.group.WORLD
        assert ws.moe_gather_oneshot_max_tokens == 3 and ws.timeout_ms == 1234
        assert ws.moe_gather_separate_norm_min_tokens is None  # never unfused (the default)
    assert ws.closed
    defaults = _lib.backend_ops("cpu").workspace_config_default()  # the stand-in's
    names = [c[0] for c in calls]
    assert names == ["backend", "comm_init", "create", "destroy", "comm_destroy"], calls
    assert calls[1] == ("comm_init", 1, True, 0)
    assert calls[2][1:4] == (0xC0FFEE, 64, 512)
    assert calls[2][4][0] == 3 and calls[2][4][2] == 1234
    assert calls[2][4][1] == defaults.twoshot_max_tokens
    assert calls[4] == ("comm_destroy", 0xC0FFEE)
    ws.close()  # idempotent


@needs_gloo
def test_workspace_on_a_subgroup(stubbed):
    sub = dist.new_group(ranks=[0], backend="gloo")
    defaults = _lib.backend_ops("cpu").workspace_config_default()
    with beammoe.Workspace(sub, 16, 256, moe_gather_separate_norm_min_tokens=9) as ws:
        assert ws.world_size == 1 and ws.device_group is sub
        assert ws.moe_gather_separate_norm_min_tokens == 9 and ws.twoshot_max_tokens == 8
    assert ws.device_group is None
    # no override of the others: the backend's defaults
    assert stubbed[2][4] == (defaults.oneshot_max_tokens, 8, defaults.timeout_ms)
    settle()  # before the subgroup is released


@needs_gloo
@pytest.mark.parametrize("args,kw,exc,msg", [
    ((16, 256), dict(timeout_ms=1.5), TypeError, r"beammoe.Workspace: timeout_ms must be an int, got float"),
    ((True, 256), {}, TypeError, r"beammoe.Workspace: max_tokens must be an int, got bool"),
    ((16, 2 ** 32 + 256), {}, ValueError, r"beammoe.Workspace: hidden_size=4294967552 is out of range"),
    ((16, 256), dict(timeout_ms=2 ** 32 + 1000), ValueError, r"timeout_ms=4294968296 is out of range"),
    ((16, 256), dict(moe_gather_oneshot_max_tokens="8"), TypeError,
     r"moe_gather_oneshot_max_tokens must be an int, got str"),
    ((16, 256), dict(moe_gather_separate_norm_min_tokens=8, twoshot_max_tokens=7), TypeError, r"not both")])
def test_workspace_argument_types(stubbed, args, kw, exc, msg):
    with pytest.raises(exc, match=msg):
        beammoe.Workspace(None, *args, **kw)
    assert stubbed == []  # rejected before anything collective
