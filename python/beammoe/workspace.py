"""The gather's workspace: collective over a torch.distributed group (CUDA,
with its own NCCL communicator) or over an in-process CPU group (threads).
"""
import ctypes
import operator
import os
import threading

import torch

from . import _lib
from . import _nccl

__all__ = ["CpuGroup", "Workspace"]


def _int(fn, name, v):
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError("%s: %s must be an int, got %s" % (fn, name, type(v).__name__)) from None


def _overrides(fn, oneshot_max_tokens, twoshot_max_tokens, timeout_ms):
    """The config fields given (checked as ints before anything collective)."""
    given = {"oneshot_max_tokens": oneshot_max_tokens, "twoshot_max_tokens": twoshot_max_tokens,
             "timeout_ms": timeout_ms}
    return {k: _int(fn, k, v) for k, v in given.items() if v is not None}


def _config(overrides):
    """A beam_workspace_config pointer, or None (the backend's defaults) when
    nothing is overridden. Call with the workspace's backend held: the unset
    fields come from its defaults."""
    if not overrides:
        return None
    cfg = _lib.library().beam_workspace_config_default()
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return ctypes.pointer(cfg)


class CpuGroup:
    """An in-process group of `nranks` ranks for the CPU backend: each rank is
    a thread of this process that calls Workspace.cpu(group, rank, ...).
    Close it (or leave its `with` block) after every workspace on it."""

    def __init__(self, nranks):
        fn = "beammoe.CpuGroup"
        nranks = _int(fn, "nranks", nranks)
        lib = _lib.library()
        h = ctypes.c_void_p()
        _lib.check(lib.beam_cpu_group_create(nranks, ctypes.byref(h)), "beam_cpu_group_create")
        self._handle = h.value
        self.nranks = nranks

    @property
    def handle(self):
        if self._handle is None:
            raise ValueError("beammoe.CpuGroup: the group is closed")
        return self._handle

    def close(self):
        if self._handle is not None:
            h, self._handle = self._handle, None
            _lib.check(_lib.library().beam_cpu_group_destroy(h), "beam_cpu_group_destroy")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _group_src(dist, group):
    """The global rank of the group's rank 0 (broadcast takes global ranks)."""
    if group is None or group is dist.group.WORLD:
        return 0
    if hasattr(dist, "get_global_rank"):
        return dist.get_global_rank(group, 0)
    return dist.distributed_c10d._get_global_rank(group, 0)  # torch < 2.0


class Workspace:
    """The gather's workspace for `max_tokens` tokens of `hidden` columns.

    Workspace(group, max_tokens, hidden, ...) is collective over a
    torch.distributed process group (None = the default group; any backend
    that can broadcast a Python object, e.g. nccl or gloo): it makes its OWN
    NCCL communicator on every rank's current CUDA device (rank 0 makes the
    unique id, the group broadcasts it) and the library's workspace over it.
    Every rank passes the same arguments. The tensors given to the gather
    must be on that device. NCCL_NVLS_ENABLE defaults to 0 (the library
    never uses NVLink multicast; this keeps NCCL from reserving it).

    Workspace.cpu(cpu_group, rank, max_tokens, hidden, ...) is the CPU
    version over a CpuGroup, called by each rank's thread.

    oneshot_max_tokens, twoshot_max_tokens: AUTO's thresholds; timeout_ms:
    how long a rank waits for its peers before a BeamCommError. None keeps
    the backend's default.

    close() is collective too (destroys the workspace, then the
    communicator); it is not done by the garbage collector, since ranks
    would reach it at different times. The workspace is a context manager.
    """

    def __init__(self, group, max_tokens, hidden, *, oneshot_max_tokens=None, twoshot_max_tokens=None,
                 timeout_ms=None):
        import torch.distributed as dist

        fn = "beammoe.Workspace"
        max_tokens = _int(fn, "max_tokens", max_tokens)
        hidden = _int(fn, "hidden", hidden)
        overrides = _overrides(fn, oneshot_max_tokens, twoshot_max_tokens, timeout_ms)
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("%s: torch.distributed is not initialized (call init_process_group first)" % fn)
        if not torch.cuda.is_available():
            raise RuntimeError("%s: needs CUDA (for the CPU backend use Workspace.cpu with a CpuGroup)" % fn)
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        self._init_fields(max_tokens, hidden, torch.device("cuda", torch.cuda.current_device()))
        rank = dist.get_rank(group)
        nranks = dist.get_world_size(group)

        lib = _lib.library()
        _lib.set_backend("cuda")  # loads libbeammoe_cuda, and with it the NCCL it uses
        obj = [_nccl.unique_id() if rank == 0 else None]
        dist.broadcast_object_list(obj, src=_group_src(dist, group), group=group)
        with torch.cuda.device(self.device):
            comm = _nccl.comm_init_rank(nranks, obj[0], rank)
            h = ctypes.c_void_p()
            # The defaults and the creation both come from the CUDA backend.
            with _lib.backend("cuda"):
                cfg = _config(overrides)
                st = lib.beam_workspace_create_nccl(comm, max_tokens, hidden, cfg, ctypes.byref(h))
            if st != _lib.BEAM_OK:
                msg = _lib.last_error()
                try:
                    _nccl.comm_destroy(comm)
                except Exception:  # the workspace's error is the one to report
                    pass
                from ._errors import raise_for_status
                raise_for_status(st, msg or "beam_workspace_create_nccl failed")
        self._comm = comm
        self._handle = h.value
        self._query_info()

    @classmethod
    def cpu(cls, group, rank, max_tokens, hidden, *, oneshot_max_tokens=None, twoshot_max_tokens=None,
            timeout_ms=None):
        """Rank `rank`'s workspace over a CpuGroup (collective: every rank's
        thread calls it). The gather then takes CPU tensors."""
        fn = "beammoe.Workspace.cpu"
        if not isinstance(group, CpuGroup):
            raise TypeError("%s: group must be a beammoe.CpuGroup, got %s" % (fn, type(group).__name__))
        self = cls.__new__(cls)
        self._init_fields(_int(fn, "max_tokens", max_tokens), _int(fn, "hidden", hidden), torch.device("cpu"))
        lib = _lib.library()
        overrides = _overrides(fn, oneshot_max_tokens, twoshot_max_tokens, timeout_ms)
        cfg = None
        if overrides:
            with _lib.backend("cpu"):  # the defaults of the backend that runs the workspace
                cfg = _config(overrides)
        h = ctypes.c_void_p()
        _lib.check(lib.beam_workspace_create_cpu(group.handle, _int(fn, "rank", rank), self.max_tokens,
                                                 self.hidden, cfg, ctypes.byref(h)),
                   "beam_workspace_create_cpu")
        self._handle = h.value
        self._group = group  # the group must outlive the workspace
        self._query_info()
        return self

    def _init_fields(self, max_tokens, hidden, device):
        self.max_tokens = max_tokens
        self.hidden = hidden
        self.device = device
        self._handle = None
        self._comm = None
        self._group = None
        self._lock = threading.Lock()
        self.rank = self.nranks = None

    def _query_info(self):
        r, n = ctypes.c_int32(), ctypes.c_int32()
        _lib.check(_lib.library().beam_workspace_info(self._handle, ctypes.byref(r), ctypes.byref(n)),
                   "beam_workspace_info")
        self.rank, self.nranks = r.value, n.value

    @property
    def handle(self):
        """The beam_workspace pointer (an int); ValueError once closed."""
        if self._handle is None:
            raise ValueError("beammoe.Workspace: the workspace is closed")
        return self._handle

    @property
    def closed(self):
        return self._handle is None

    def close(self):
        """Collective: destroy the workspace, then its NCCL communicator."""
        with self._lock:
            h, self._handle = self._handle, None
            comm, self._comm = self._comm, None
        if h is None:
            return
        if self.device.type == "cuda":
            with torch.cuda.device(self.device):
                st = _lib.library().beam_workspace_destroy(h)
                msg = _lib.last_error() if st != _lib.BEAM_OK else ""
                if comm is not None:
                    _nccl.comm_destroy(comm)
        else:
            st = _lib.library().beam_workspace_destroy(h)
            msg = _lib.last_error() if st != _lib.BEAM_OK else ""
        if st != _lib.BEAM_OK:
            from ._errors import raise_for_status
            raise_for_status(st, msg or "beam_workspace_destroy failed")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "Workspace(rank=%s, nranks=%s, max_tokens=%d, hidden=%d, device=%s%s)" % (
            self.rank, self.nranks, self.max_tokens, self.hidden, self.device,
            ", closed" if self.closed else "")
