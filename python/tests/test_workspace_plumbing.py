"""Workspace(group, ...) without a GPU: the NCCL and CUDA pieces are stubbed
so the Python plumbing runs on any host: the unique id broadcast over a
torch.distributed group (gloo, one rank), ncclCommInitRank's arguments, the
config handed to beam_workspace_create_nccl, and close()'s order (workspace,
then communicator). The real NCCL path runs in test_gather_process_group.py."""
import contextlib

import pytest
import torch

import beammoe
from beammoe import _lib, _nccl
from conftest import needs_gloo, settle

dist = pytest.importorskip("torch.distributed")
pytestmark = needs_gloo


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


def test_workspace_on_a_subgroup(stubbed):
    sub = dist.new_group(ranks=[0], backend="gloo")
    defaults = _lib.backend_ops("cpu").workspace_config_default()
    with beammoe.Workspace(sub, 16, 256, moe_gather_separate_norm_min_tokens=9) as ws:
        assert ws.world_size == 1 and ws.device_group is sub
        assert ws.moe_gather_separate_norm_min_tokens == 9 and ws.twoshot_max_tokens == 8
    # no override of the others: the backend's defaults
    assert stubbed[2][4] == (defaults.oneshot_max_tokens, 8, defaults.timeout_ms)
    settle()  # before the subgroup (also ws.device_group) is released


def test_workspace_argument_types(stubbed):
    with pytest.raises(TypeError, match=r"beammoe.Workspace: timeout_ms must be an int, got float"):
        beammoe.Workspace(None, 16, 256, timeout_ms=1.5)
    with pytest.raises(TypeError, match=r"beammoe.Workspace: max_tokens must be an int, got bool"):
        beammoe.Workspace(None, True, 256)
    with pytest.raises(ValueError, match=r"beammoe.Workspace: hidden_size=4294967552 is out of range"):
        beammoe.Workspace(None, 16, 2 ** 32 + 256)
    with pytest.raises(ValueError, match=r"timeout_ms=4294968296 is out of range"):
        beammoe.Workspace(None, 16, 256, timeout_ms=2 ** 32 + 1000)
    with pytest.raises(TypeError, match=r"moe_gather_oneshot_max_tokens must be an int, got str"):
        beammoe.Workspace(None, 16, 256, moe_gather_oneshot_max_tokens="8")
    with pytest.raises(TypeError, match=r"not both"):
        beammoe.Workspace(None, 16, 256, moe_gather_separate_norm_min_tokens=8, twoshot_max_tokens=7)
    assert stubbed == []  # rejected before anything collective
