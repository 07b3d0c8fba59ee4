"""Shared fixtures and helpers: the package and torch must import (run-pytest.sh
skips the whole suite, exit 77, when they do not). The rank processes
(_pg_worker.py) import this file too: the helpers here run outside pytest."""
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

# reference.py and the workers beside this file; the package from this tree
# only when none is importable (run-pytest.sh sets PYTHONPATH=python; an
# installed package, e.g. `pip install ./python`, is tested as installed).
_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _here)
try:
    import beammoe  # noqa: F401
except ImportError:
    sys.path.insert(1, os.path.dirname(_here))

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

torch = pytest.importorskip("torch")

import beammoe  # noqa: E402,F811
from beammoe import _run  # noqa: E402
from beammoe import quant as quant_module  # noqa: E402
from reference import BF16, assert_bits_equal, fused_spec  # noqa: E402

FP8 = getattr(torch, "float8_e4m3fn", None)
needs_fp8 = pytest.mark.skipif(FP8 is None, reason="torch %s has no float8_e4m3fn" % torch.__version__)
# every FP8Quant form (test_fp8.py checks them against torch's quantization), then the block forms: NVFP4
# (vLLM's g for amax 4) and MXFP8 (test_fp8.py checks them against models of the docs)
FORMS = [
    beammoe.FP8Quant("group", 128),
    beammoe.FP8Quant("group", 64, ue8m0=True),
    beammoe.FP8Quant("group", 128, column_major=True),
    beammoe.FP8Quant("group", 64, ue8m0=True, column_major=True),
    beammoe.FP8Quant("token"),
    beammoe.FP8Quant("token", ue8m0=True),
    beammoe.FP8Quant("tensor", scale=0.0125),
]
BLOCK_QUANTS = [beammoe.NVFP4Quant(672.0), beammoe.MXFP8Quant()]
QUANTS = FORMS + BLOCK_QUANTS
QUANT_TYPES = r"quant must be a beammoe.FP8Quant, beammoe.NVFP4Quant or beammoe.MXFP8Quant, got "  # quant=other
STRATEGIES = (None, "oneshot", "twoshot", "unfused")  # the gather's
K, H = 4, 512  # top_k and hidden of the gather tests' layer (gather, fused, gather_q, local_q)
ARGS = dict(scales=(0.5, 1.5), routed=1.25)
ALL_CALLS = ((False, False), (False, True), (True, False), (True, True))  # (keep_normalized, inplace)


@pytest.fixture
def gen():
    """A seeded generator: every test draws reproducible data."""
    g = torch.Generator()
    g.manual_seed(int(os.environ.get("BEAM_TEST_SEED", "20261130")))
    return g


def cuda_backend_skip_reason():
    """None when torch sees a GPU and libbeammoe's CUDA backend runs here,
    else why not (shown in pytest's skip reasons: run with -rs)."""
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    from beammoe import _lib
    try:
        _lib.backend_ops("cuda")
    except beammoe.BeamError as e:
        return "libbeammoe's CUDA backend does not run here: %s" % e
    return None


CUDA_SKIP = cuda_backend_skip_reason()
needs_cuda = pytest.mark.skipif(CUDA_SKIP is not None, reason=str(CUDA_SKIP))
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]


def compiled_and_eager(x, r, g, w, nw, quant, keep_nrn):
    """[(compiled, eager)] results of norm_residual_norm_fp8 (keep_normalized=
    keep_nrn) and moe_finalize_norm_residual_norm_fp8 with a next norm, under
    torch.compile(fullgraph=True) (through torch.ops.beammoe.*_fp8) and eager."""
    def both(x, r, g, w):
        a = beammoe.beam_norm_residual_norm_fp8(x, r, nw, 1e-6, nw, 1e-6, None, quant=quant,
                                                keep_normalized=keep_nrn)
        b = beammoe.beam_moe_finalize_norm_residual_norm_fp8(beammoe.MoEOutput(g, w), r, nw, 1e-6, nw, 1e-6,
                                                             (0.5, 2.0), 2.5, quant=quant, keep_normalized=True)
        return a, b

    torch._dynamo.reset()
    got = torch.compile(both, fullgraph=True)(x, r, g, w)
    return list(zip(got, both(x, r, g, w)))


def gather(ws, lg, lw, residual, pw, nw, **kw):
    return beammoe.beam_moe_finalize_gather_norm_residual_norm(
        beammoe.MoEOutput(lg, lw), residual, pw, 1e-6, nw, 1e-5, ARGS["scales"], ws, ARGS["routed"], **kw)


def fused(g, w, residual, pw, nw):
    return beammoe.beam_moe_finalize_norm_residual_norm(
        beammoe.MoEOutput(g, w), residual, pw, 1e-6, nw, 1e-5, ARGS["scales"], ARGS["routed"])


def gather_q(ws, lg, lw, residual, pw, nw, quant, **kw):
    return beammoe.beam_moe_finalize_gather_norm_residual_norm_fp8(
        beammoe.MoEOutput(lg, lw), residual, pw, 1e-6, nw, 1e-5, ARGS["scales"], ws, ARGS["routed"], quant=quant,
        **kw)


def local_q(g, w, residual, pw, nw, quant, keep_normalized=True):
    """The local operation's (hidden, normalized, q, q_scales) on all the tokens."""
    return beammoe.beam_moe_finalize_norm_residual_norm_fp8(
        beammoe.MoEOutput(g, w), residual, pw, 1e-6, nw, 1e-5, ARGS["scales"], ARGS["routed"], quant=quant,
        keep_normalized=keep_normalized)


def gather_calls(ws, lg, lw, residual, pw, nw, quant, strategies, calls=ALL_CALLS):
    """gather_q with each strategy and each (keep_normalized, inplace) of
    `calls`: [(what, keep, result)]; residual is left as it was unless in
    place."""
    out = []
    for strategy in strategies:
        for keep, inplace in calls:
            res = residual.clone()
            got = gather_q(ws, lg, lw, res, pw, nw, quant, strategy=strategy, inplace=inplace, keep_normalized=keep)
            what = "%r %s keep=%s inplace=%s" % (quant, strategy, keep, inplace)
            assert (got[0] is res) == inplace, what
            if not inplace:
                assert_bits_equal(res, residual, what + ": residual left unchanged")
            out.append((what, keep, got))
    return out


def cpu_group_result(tokens, nranks, g, w, residual, pw, nw, top_k, hidden):
    """The gather over a CpuGroup of nranks threads (rank 0's result)."""
    with beammoe.CpuGroup(nranks) as grp:
        def body(r):
            with beammoe.Workspace.cpu(grp, r, 64, hidden) as ws:
                lg, lw = local_rows(g, w, tokens, nranks, r, top_k, hidden)
                return gather(ws, lg, lw, residual.clone(), pw, nw)
        return run_ranks(nranks, body)[0]


def check_gather(ws, rank, nranks, data, cases, strategies=STRATEGIES, dev="cpu", top_k=K, more=False):
    """Rank `rank`'s gather of its rows of data(tokens) = (g, w, residual, pw,
    nw) for each of `cases`, every strategy, in place or not, against the
    fused operation on all the tokens (more: the torch-written reference and
    the CpuGroup gather too). Returns the last case's data."""
    for tokens in cases:
        g, w, residual, pw, nw = data(tokens)
        wants = [("fused", fused(g, w, residual, pw, nw))]
        if more:
            wants += [("CpuGroup", cpu_group_result(tokens, nranks, g, w, residual, pw, nw, top_k, ws.hidden)),
                      ("reference", fused_spec(g, w, tokens, residual, pw, 1e-6, nw, 1e-5, ARGS["scales"],
                                               ARGS["routed"]))]
        lg, lw, pwd, nwd = (t.to(dev) for t in local_rows(g, w, tokens, nranks, rank, top_k, ws.hidden) + (pw, nw))
        for strategy in strategies:
            for inplace in (False, True):
                res = residual.to(dev, copy=True)
                h, n = gather(ws, lg, lw, res, pwd, nwd, strategy=strategy, inplace=inplace)
                what = "rank %d/%d tokens %d strategy %s inplace=%s" % (rank, nranks, tokens, strategy, inplace)
                if inplace:
                    assert h is res, what
                else:
                    assert h is not res, what
                    assert_bits_equal(res, residual, what + ": residual left unchanged")
                for name, want in wants:
                    assert_bits_equal((h, n), want, "%s vs the %s result" % (what, name))
    return g, w, residual, pw, nw


# ---- the quantized outputs ---------------------------------------------------------------

def poison_outputs(setattr=setattr):
    """q and q_scales filled before every call (0xFF bytes: NaN codes; FP8
    scales NaN; a static scale is the caller's, not written), the local
    call's and the gather's alike (the functions' maker, and _run's, which
    the gather in Python takes), so that a byte not written shows, and
    the block forms' padding rows of q_scales (not written) keep 0xFF and
    compare equal. Column-major padding is never compared (the view leaves
    it out)."""
    empty = _run.empty_outputs

    def empty_outputs(*args):
        q, qs = empty(*args)
        q.view(torch.uint8).fill_(0xFF)
        if qs.element_size() == 1:
            qs.view(torch.uint8).fill_(0xFF)
        elif args[0] != _run.KINDS["tensor"]:
            qs.fill_(float("nan"))
        return q, qs

    setattr(quant_module, "empty_outputs", empty_outputs)
    setattr(_run, "empty_outputs", empty_outputs)


@pytest.fixture
def poisoned(monkeypatch):
    poison_outputs(monkeypatch.setattr)


def qbits(t):
    """t's bits as integers of its element's size (any strides)."""
    return t.view({1: torch.uint8, 4: torch.int32}[t.element_size()])


def assert_same_q(got, want, keep, what):
    """(hidden, normalized | None, q, q_scales) against want's, bit for bit,
    with dtypes, shapes and strides; normalized only where kept."""
    h, n, q, qs = got
    assert_bits_equal(h, want[0], what + " hidden")
    if keep:
        assert_bits_equal(n, want[1], what + " normalized")
    else:
        assert n is None, what + " normalized"
    assert q.dtype == FP8 or q.element_size() == 1, what + " q"
    for a, b, name in ((q, want[2], "q"), (qs, want[3], "q_scales")):
        assert (a.dtype, a.shape, a.stride()) == (b.dtype, b.shape, b.stride()), what + " " + name
        assert torch.equal(qbits(a), qbits(b)), what + " " + name


# ---- ranks as threads ----------------------------------------------------------------------

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


def local_rows(g, w, tokens, nranks, rank, top_k=K, hidden=H, pad=1):
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

    def count(self, rank):
        return len([c for c in self.calls if c[0] == rank])


# ---- process groups ------------------------------------------------------------------------

def _gloo_skip():
    import torch.distributed as dist
    if not dist.is_available():
        return "torch.distributed is not available in this torch build"
    if not dist.is_gloo_available():
        return "torch.distributed has no gloo backend in this torch build"
    return None


needs_gloo = pytest.mark.skipif(_gloo_skip() is not None, reason=str(_gloo_skip()))


def settle():
    """Let gloo's worker thread drop the tensors of its last broadcast before
    a process group is destroyed: torch 2.4's ProcessGroupGloo destructor
    joins that thread while holding the GIL, and the thread may still need
    the GIL to free them (a hang seen once with torch 2.4.1)."""
    time.sleep(0.2)


@pytest.fixture
def gloo1():
    """A one-rank gloo group (the default group) in this process."""
    import torch.distributed as dist
    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group("gloo", init_method="file://" + os.path.join(d, "store"), rank=0, world_size=1)
        try:
            yield
        finally:
            settle()
            dist.destroy_process_group()


def dist_all_gather(nranks):
    """An all_gather hook over the default process group (gloo)."""
    import torch.distributed as dist

    def hook(out, inp):
        if torch.__version__ >= "2":
            dist.all_gather_into_tensor(out, inp)
        else:  # gloo of torch 1.13: no all_gather_into_tensor, no BF16
            out, inp = out.view(torch.uint8), inp.view(torch.uint8)
            dist.all_gather(list(out.view(nranks, -1, out.shape[1]).unbind(0)), inp)
    return hook


def run_workers(nranks, mode, limit, dies=None):
    """Run `python _pg_worker.py RANK NRANKS INIT_FILE MODE`, one process per
    rank (gloo over a file store), under a hard timeout: a hang fails the
    test instead of stalling the suite. Every rank must exit 0 having printed
    "rank R: ok", but the last where `dies` is its expected exit status;
    none may end by gloo's abort (SIGABRT). Returns every rank's output."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as d:
        store = os.path.join(d, "store")
        procs = [subprocess.Popen([sys.executable, os.path.join(_here, "_pg_worker.py"), str(r), str(nranks), store,
                                   mode], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
                 for r in range(nranks)]
        deadline = time.monotonic() + limit
        outs = []
        try:
            for p in procs:
                out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
                outs.append(out.decode("utf-8", "replace"))
        except subprocess.TimeoutExpired:
            pytest.fail("_pg_worker.py %s with %d processes did not finish within %d s (a hang)"
                        % (mode, nranks, limit))
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
