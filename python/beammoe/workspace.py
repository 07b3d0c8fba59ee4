"""The gather's workspace: collective over a torch.distributed group (CUDA,
with its own NCCL communicator; or CPU over a gloo group, the gather then
run by _pgather.py) or over an in-process CPU group (threads).

The attributes are the reference's: world_size, rank, max_tokens,
hidden_size, moe_gather_oneshot_max_tokens, moe_gather_separate_norm_min_tokens
(None: AUTO never takes the unfused strategy), device_group and all_gather
(the unfused path's hook). The thresholds are settable; AUTO follows them.
AUTO takes
ONESHOT for tokens <= moe_gather_oneshot_max_tokens, UNFUSED for tokens >=
moe_gather_separate_norm_min_tokens, TWOSHOT otherwise. The library's own
names stay as aliases: nranks, hidden, oneshot_max_tokens, twoshot_max_tokens
(= moe_gather_separate_norm_min_tokens - 1, or 2**63 - 1 for None).
"""
import contextlib
import ctypes
import os
import threading
import weakref

import torch

from . import _calls
from . import _lib
from . import _nccl
from . import _pgather
from . import _run
from . import _checks as A
from ._errors import BeamArgumentError, BeamCommError, BeamUnsupportedError, raise_for_status

__all__ = ["CpuGroup", "Workspace"]

_NEVER = 2 ** 63 - 1  # twoshot_max_tokens of "never unfused"


class _Unset:
    def __repr__(self):
        return "<unset>"


_UNSET = _Unset()


def _thresholds(fn, oneshot, separate, twoshot_alias, oneshot_alias, timeout_ms):
    """The config fields, checked as ints before anything collective:
    (oneshot_max_tokens or None for the default, twoshot_max_tokens or None,
    timeout_ms or None). The reference's names and the library's aliases may
    not both be given."""
    if oneshot_alias is not None:
        if oneshot is not None:
            raise TypeError("%s: give moe_gather_oneshot_max_tokens or its alias oneshot_max_tokens, not both" % fn)
        oneshot = oneshot_alias
        name1 = "oneshot_max_tokens"
    else:
        name1 = "moe_gather_oneshot_max_tokens"
    one = A.integer(fn, name1, oneshot, A.INT64) if oneshot is not None else None
    if twoshot_alias is not None:
        if separate is not _UNSET:
            raise TypeError("%s: give moe_gather_separate_norm_min_tokens or its alias twoshot_max_tokens, "
                            "not both" % fn)
        two = A.integer(fn, "twoshot_max_tokens", twoshot_alias, A.INT64)
    elif separate is _UNSET or separate is None:
        two = None if separate is _UNSET else _NEVER
    else:
        m = A.integer(fn, "moe_gather_separate_norm_min_tokens", separate, A.INT64)
        if m < 0:
            raise ValueError("%s: moe_gather_separate_norm_min_tokens=%d must be >= 0 (None: never unfused)"
                             % (fn, m))
        two = max(m - 1, 0)  # 0 and 1 choose alike: ONESHOT takes tokens = 0 first
    tmo = A.integer(fn, "timeout_ms", timeout_ms, A.INT32) if timeout_ms is not None else None
    return one, two, tmo


def _sizes(fn, max_tokens, hidden_size, hidden, *thresholds):
    """(max_tokens, hidden_size, _thresholds(fn, *thresholds)) of a
    constructor's arguments, checked as ints (hidden: hidden_size's alias)."""
    max_tokens = A.integer(fn, "max_tokens", max_tokens, A.INT64)
    if hidden is not None:
        if hidden_size is not None:
            raise TypeError("%s: give hidden_size or its alias hidden, not both" % fn)
        hidden_size = A.integer(fn, "hidden", hidden, A.INT32)
    elif hidden_size is None:
        raise TypeError("%s: hidden_size is required" % fn)
    else:
        hidden_size = A.integer(fn, "hidden_size", hidden_size, A.INT32)
    return max_tokens, hidden_size, _thresholds(fn, *thresholds)


def _config(ops, one, two, tmo):
    """The full beam_workspace_config: the defaults of the backend whose
    table is `ops` (the workspace's) with the given fields."""
    cfg = ops.workspace_config_default()
    if one is not None:
        cfg.oneshot_max_tokens = one
    if two is not None:
        cfg.twoshot_max_tokens = two
    if tmo is not None:
        cfg.timeout_ms = tmo
    return cfg


class CpuGroup:
    """An in-process group of `nranks` ranks for the CPU backend: each rank is
    a thread of this process that calls Workspace.cpu(group, rank, ...).
    Close it (or leave its `with` block) after every workspace on it."""

    def __init__(self, nranks):
        fn = "beammoe.CpuGroup"
        nranks = A.integer(fn, "nranks", nranks, A.INT32)
        ops = _lib.backend_ops("cpu")  # the group is the CPU backend's, as its workspaces
        h = ctypes.c_void_p()
        _lib.check(ops.cpu_group_create(nranks, ctypes.byref(h)), "beam_cpu_group_create", ops)
        self._ops = ops
        self._handle = h.value
        self.nranks = nranks

    @property
    def world_size(self):
        return self.nranks

    @property
    def handle(self):
        if self._handle is None:
            raise ValueError("beammoe.CpuGroup: the group is closed")
        return self._handle

    def close(self):
        if self._handle is not None:
            h, self._handle = self._handle, None
            _lib.check(self._ops.cpu_group_destroy(h), "beam_cpu_group_destroy", self._ops)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "CpuGroup(nranks=%d%s)" % (self.nranks, ", closed" if self._handle is None else "")


def _group_src(dist, group):
    """The global rank of the group's rank 0 (broadcast takes global ranks)."""
    if group is None or group is dist.group.WORLD:
        return 0
    if hasattr(dist, "get_global_rank"):
        return dist.get_global_rank(group, 0)
    return dist.distributed_c10d._get_global_rank(group, 0)  # torch < 2.0


_open = weakref.WeakValueDictionary()  # handle -> open Workspace (torch.ops.beammoe.* take the handle)

# The library's strategy values (enum beam_strategy)
_AUTO, _UNFUSED, _ONESHOT, _TWOSHOT = 0, 2, 3, 4
_NAMES = {_UNFUSED: "unfused", _ONESHOT: "oneshot", _TWOSHOT: "twoshot"}


def _device(fn, device):
    """The workspace's device type: "cuda" or "cpu" (None: cuda when torch
    sees a GPU, else cpu)."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError:
            raise ValueError("%s: device=%r is not a device (use \"cpu\" or \"cuda\")" % (fn, device)) from None
    if not isinstance(device, torch.device):
        raise TypeError("%s: device must be None, a string or a torch.device, got %s" % (fn, type(device).__name__))
    if device.type not in ("cpu", "cuda"):
        raise ValueError("%s: device=%s: only cpu and cuda workspaces exist" % (fn, device))
    if device.type == "cuda" and device.index is not None and torch.cuda.is_available() \
            and device.index != torch.cuda.current_device():
        raise ValueError("%s: device=%s is not the current CUDA device (cuda:%d): call torch.cuda.set_device(%d) "
                         "first" % (fn, device, torch.cuda.current_device(), device.index))
    return device.type


def _check_shape_and_config(fn, max_tokens, hidden, one, two, tmo):
    """The library's rules for a workspace (lib/api.c), for the workspaces
    that Python runs itself (CPU over a process group)."""
    bad = _run.library_rules(1, hidden, fn)  # the hidden sizes the library takes, in its words
    if bad is not None:
        raise ValueError(bad[1])
    if max_tokens < 0:
        raise ValueError("%s: max_tokens=%d must be >= 0" % (fn, max_tokens))
    if max_tokens > (2 ** 63 - 1) // (hidden * 2):
        raise ValueError("%s: max_tokens=%d is too large for this address space" % (fn, max_tokens))
    if one < 0 or two < 0:
        raise ValueError("%s: moe_gather_oneshot_max_tokens=%d and twoshot_max_tokens=%d must be >= 0"
                         % (fn, one, two))
    if tmo < 1:
        raise ValueError("%s: timeout_ms=%d must be >= 1" % (fn, tmo))


def _threshold(name, get, put, none_ok=False):
    """A threshold of the Workspace as a plain attribute: get(ws) reads it; a
    value set is checked (an int >= 0, or None where none_ok), stored by
    put(ws, v), and AUTO follows it."""
    def set_(ws, v):
        if v is not None or not none_ok:
            v = A.integer("beammoe.Workspace", name, v, A.INT64)
            if v < 0:
                raise ValueError("beammoe.Workspace: %s=%d must be >= 0" % (name, v))
        put(ws, v)
        two = _NEVER if ws._sep is None else max(ws._sep - 1, 0)
        ws._c_auto = (ws._one, two) == ws._cfg[:2] and not ws._pg
    return property(get, set_)


class Workspace:
    """The gather's workspace for `max_tokens` tokens of `hidden_size` columns.

    Workspace(group, max_tokens, hidden_size, ..., device=None) is collective
    over a torch.distributed process group (None = the default group), one
    process per rank, every rank with the same arguments:

    - CUDA (device "cuda", the default when torch sees a GPU): the workspace
      makes its OWN NCCL communicator on every rank's current CUDA device
      (rank 0 makes the unique id, the group broadcasts it; any backend that
      can broadcast a Python object, e.g. nccl or gloo) and the library's
      workspace over it. The tensors given to the gather must be on that
      device. NCCL_NVLS_ENABLE defaults to 0 (the library never uses NVLink
      multicast; this keeps NCCL from reserving it).
    - CPU (device "cpu", the default without a GPU): over a group that runs
      collectives on CPU tensors (gloo). The gather takes CPU tensors: each
      rank finalizes its own rows with the library, the rows are
      all-gathered over the group (or the all_gather hook), and the
      residual add and norms run with the library on all rows (the
      quantized forms: norm_residual_norm_q, the library quantizing them);
      every strategy gives these same bits. Each rank's argument checks and a
      signature of its arguments travel first, so a rank that rejects its
      arguments, or ranks that disagree, make every rank raise. The
      all-reduces run likewise (_pgather.py), with the library's bits.

    Workspace.cpu(cpu_group, rank, max_tokens, hidden_size, ...) is the CPU
    version over a CpuGroup (threads of one process), called by each rank's
    thread.

    moe_gather_oneshot_max_tokens: AUTO takes ONESHOT up to this many tokens
    (None: the backend's default: every tokens on CUDA, 64 on the CPU). moe_gather_separate_norm_min_tokens:
    AUTO takes UNFUSED from this many tokens on (None, the default: never).
    Between the two AUTO takes TWOSHOT. Both are plain attributes: assign
    an int >= 0 (the second also None) and the next AUTO call follows it
    (every rank must assign the same). timeout_ms: how long a rank waits for
    its peers before a BeamCommError (None: the backend's default). A
    failed exchange of a gather run in Python (a timeout, a peer's death,
    ranks out of step, the hook's exception) leaves the workspace unusable:
    every later call and close() raise a BeamCommError naming it; a call
    that overlaps another on the same workspace is refused
    (docs/python.md#the-workspace).
    oneshot_max_tokens and twoshot_max_tokens are the library's names for
    the same thresholds (twoshot_max_tokens = separate_norm_min_tokens - 1).

    all_gather: None, or a callable (output, input) like
    torch.distributed.all_gather_into_tensor (output [world_size * n, ...],
    input [n, ...]) that the unfused path uses to gather the finalized rows
    (the all-reduce's partials): the UNFUSED strategy (asked for, or AUTO's
    choice), and every call of a CPU workspace over a process group.

    close() is collective too (destroys the workspace, then the
    communicator); it is not done by the garbage collector, since ranks
    would reach it at different times. The workspace is a context manager.
    """

    def __init__(self, group, max_tokens, hidden_size=None, *, moe_gather_oneshot_max_tokens=None,
                 moe_gather_separate_norm_min_tokens=_UNSET, timeout_ms=None, hidden=None,
                 oneshot_max_tokens=None, twoshot_max_tokens=None, device=None):
        import torch.distributed as dist

        fn = "beammoe.Workspace"
        max_tokens, hidden_size, (one, two, tmo) = _sizes(
            fn, max_tokens, hidden_size, hidden, moe_gather_oneshot_max_tokens, moe_gather_separate_norm_min_tokens,
            twoshot_max_tokens, oneshot_max_tokens, timeout_ms)
        kind = _device(fn, device)
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("%s: torch.distributed is not initialized (call init_process_group first)" % fn)
        if kind == "cpu":
            self._init_process_group_cpu(fn, dist, group, max_tokens, hidden_size, one, two, tmo)
            self._set_thresholds(moe_gather_separate_norm_min_tokens)
            return
        if not torch.cuda.is_available():
            raise RuntimeError("%s: device=\"cuda\" but torch sees no CUDA device (device=\"cpu\" makes a CPU "
                               "workspace over a gloo group)" % fn)
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        self._init_fields(max_tokens, hidden_size, torch.device("cuda", torch.cuda.current_device()),
                          group if group is not None else dist.group.WORLD)
        rank = dist.get_rank(group)
        nranks = dist.get_world_size(group)

        ops = _lib.backend_ops("cuda")  # loads libbeammoe_cuda, and with it the NCCL it uses
        obj = [_nccl.unique_id() if rank == 0 else None]
        dist.broadcast_object_list(obj, src=_group_src(dist, group), group=group)
        with torch.cuda.device(self.device):
            comm = _nccl.comm_init_rank(nranks, obj[0], rank)
            h = ctypes.c_void_p()
            cfg = _config(ops, one, two, tmo)
            st = ops.workspace_create_nccl(comm, max_tokens, hidden_size, ctypes.byref(cfg), ctypes.byref(h))
            if st != _lib.BEAM_OK:
                msg = _lib.last_error(ops)
                with contextlib.suppress(Exception):  # the workspace's error is the one to report
                    _nccl.comm_destroy(comm)
                raise_for_status(st, msg or "beam_workspace_create_nccl failed")
        self._comm = comm
        self._opened(ops, h.value, cfg)
        self._set_thresholds(moe_gather_separate_norm_min_tokens)

    def _init_process_group_cpu(self, fn, dist, group, max_tokens, hidden_size, one, two, tmo):
        """A CPU workspace over a torch.distributed group: no library
        workspace; the ranks check that they agree (collective)."""
        pg = group if group is not None else dist.group.WORLD
        backend = str(dist.get_backend(group))
        if backend == "nccl":
            raise ValueError("%s: device=\"cpu\" needs a process group that runs collectives on CPU tensors "
                             "(gloo), got an nccl group (e.g. dist.new_group(backend=\"gloo\"))" % fn)
        self._init_fields(max_tokens, hidden_size, torch.device("cpu"), pg)
        self._pg = True
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        cfg = _config(_lib.backend_ops("cpu"), one, two, tmo)  # the CPU backend's defaults
        err = None
        try:
            _check_shape_and_config(fn, max_tokens, hidden_size, cfg.oneshot_max_tokens, cfg.twoshot_max_tokens,
                                    cfg.timeout_ms)
        except ValueError as e:
            err = e
        head = [max_tokens, hidden_size, cfg.oneshot_max_tokens, cfg.twoshot_max_tokens, cfg.timeout_ms]
        self._cfg = (cfg.oneshot_max_tokens, cfg.twoshot_max_tokens, cfg.timeout_ms)
        # Two exchanges: the signatures (rank 0's draw numbers the workspace),
        # then the confirmation, which a rank that arrives after its peers gave
        # up (and finds their abandoned signatures) never gets.
        rows = _pgather.exchange(self, fn, err, head, (_pgather.CREATE, _pgather.draw(), 0),
                                 cfg.timeout_ms if err is None else 30000)
        _pgather.settle(fn, self.rank, rows, err, _pgather.create_field, len(_pgather.CREATE_FIELDS))
        _pgather.exchange(self, fn, None, (), (_pgather.CONFIRM, rows[0][3], 0))
        self._ident = rows[0][3]
        self._handle = id(self)
        _open[self._handle] = self

    @classmethod
    def cpu(cls, group, rank, max_tokens, hidden_size=None, *, moe_gather_oneshot_max_tokens=None,
            moe_gather_separate_norm_min_tokens=_UNSET, timeout_ms=None, hidden=None, oneshot_max_tokens=None,
            twoshot_max_tokens=None):
        """Rank `rank`'s workspace over a CpuGroup (collective: every rank's
        thread calls it). The gather then takes CPU tensors."""
        fn = "beammoe.Workspace.cpu"
        if not isinstance(group, CpuGroup):
            raise TypeError("%s: group must be a beammoe.CpuGroup, got %s" % (fn, type(group).__name__))
        rank = A.integer(fn, "rank", rank, A.INT32)
        max_tokens, hidden_size, (one, two, tmo) = _sizes(
            fn, max_tokens, hidden_size, hidden, moe_gather_oneshot_max_tokens, moe_gather_separate_norm_min_tokens,
            twoshot_max_tokens, oneshot_max_tokens, timeout_ms)
        self = cls.__new__(cls)
        self._init_fields(max_tokens, hidden_size, torch.device("cpu"), group)
        ops = group._ops  # the table that made the group makes its workspaces
        cfg = _config(ops, one, two, tmo)
        h = ctypes.c_void_p()
        _lib.check(ops.workspace_create_cpu(group.handle, rank, max_tokens, hidden_size, ctypes.byref(cfg),
                                            ctypes.byref(h)),
                   "beam_workspace_create_cpu", ops)
        self._opened(ops, h.value, cfg)
        self._set_thresholds(moe_gather_separate_norm_min_tokens)
        return self

    def _init_fields(self, max_tokens, hidden_size, device, group):
        self.max_tokens = max_tokens
        self.hidden_size = hidden_size
        self.device = device
        self.device_group = group
        self._handle = None
        self._ops = None  # the table of the backend that made the library workspace
        self._comm = None
        self._lock = threading.Lock()
        self.rank = self.world_size = None
        self._cfg = None
        self._pg = False  # a CPU workspace over a torch.distributed group (no library workspace)
        self._one = 0
        self._sep = None
        self._c_auto = True  # the thresholds are those handed to the library: AUTO is its own
        self._peerless = False  # a CUDA workspace without peer memory: AUTO is UNFUSED always
        self._all_gather = None
        # The gather in Python (_pgather): the workspace's number (0 for a
        # library workspace), its calls so far, the thread holding it, and
        # the failure that left it unusable.
        self._ident = 0
        self._call_no = 0
        self._owner = None
        self._dead = None

    def _opened(self, ops, handle, cfg):
        """A library workspace made through `ops`: every later call on it goes
        through the same table (its handle means nothing to another)."""
        self._ops = ops
        self._handle = handle
        self._cfg = (cfg.oneshot_max_tokens, cfg.twoshot_max_tokens, cfg.timeout_ms)
        r, n = ctypes.c_int32(), ctypes.c_int32()
        _lib.check(ops.workspace_info(handle, ctypes.byref(r), ctypes.byref(n)), "beam_workspace_info", ops)
        self.rank, self.world_size = r.value, n.value
        _open[handle] = self

    def _set_thresholds(self, sep):
        """The attributes from the values handed to the library (a
        moe_gather_separate_norm_min_tokens of 0 reads back as given)."""
        self._one = self._cfg[0]
        self._sep = None if self._cfg[1] >= _NEVER else self._cfg[1] + 1
        if sep is not _UNSET and sep is not None and sep == 0:
            self._sep = 0
        self._c_auto = not self._pg

    @staticmethod
    def by_handle(handle):
        """The open workspace with this handle, or None."""
        return _open.get(handle)

    def _handle_for(self, fn, dev):
        """The handle, for a call of fn on tensors on `dev` (ValueError when
        the workspace is on another device or closed, BeamCommError once
        unusable)."""
        if self._dead is not None:
            raise self._unusable(fn)
        if dev.type != "meta" and dev != self.device:
            raise ValueError("%s: the tensors are on %s but the workspace is on %s" % (fn, dev, self.device))
        return self.handle  # raises once closed

    # ---- the gather in Python: one call at a time, unusable after a failure --
    def _overlap(self, what):
        where = ("this thread (from inside its all_gather hook)" if self._owner == threading.get_ident()
                 else "another thread")
        return "%s on this workspace is in progress on %s (calls on one workspace must not overlap)" % (what, where)

    def _unusable(self, fn, now=", close it"):
        return BeamCommError("%s: an earlier call on this workspace failed (%s); the workspace is unusable%s"
                             % (fn, self._dead, now), 4)

    @contextlib.contextmanager
    def _held(self, fn):
        """The workspace for one call of the gather in Python. Refused, before
        anything else, while another call holds it (the lock is tried, never
        waited for) and once an earlier failure left it unusable."""
        if not self._lock.acquire(blocking=False):
            raise BeamArgumentError("%s: %s" % (fn, self._overlap("another call")))
        try:
            self._owner = threading.get_ident()
            if self._dead is not None:
                raise self._unusable(fn)
            yield
        finally:
            self._owner = None
            self._lock.release()

    def _collective(self, exchange):
        """exchange(): one exchange with the peers, in a held call. Any
        failure, an interrupt included, leaves the workspace unusable: the
        ranks may no longer be in the same round, and a collective that this
        rank gave up stays posted in the group, so it never exchanges again."""
        try:
            return exchange()
        except BaseException as e:
            self._dead = "rank %s, call %d: %s: %s" % (self.rank, self._call_no, type(e).__name__, e)
            if isinstance(e, BeamCommError):
                raise BeamCommError("%s; the workspace is unusable, close it" % e, 4) from e
            raise

    # ---- the thresholds: plain attributes (AUTO follows them); oneshot_max_tokens
    # and twoshot_max_tokens are the library's names for the same two -------
    moe_gather_oneshot_max_tokens = _threshold("moe_gather_oneshot_max_tokens", lambda ws: ws._one,
                                               lambda ws, v: setattr(ws, "_one", v))
    moe_gather_separate_norm_min_tokens = _threshold("moe_gather_separate_norm_min_tokens", lambda ws: ws._sep,
                                                     lambda ws, v: setattr(ws, "_sep", v), none_ok=True)
    oneshot_max_tokens = _threshold("oneshot_max_tokens", lambda ws: ws._one, lambda ws, v: setattr(ws, "_one", v))
    twoshot_max_tokens = _threshold("twoshot_max_tokens", lambda ws: _NEVER if ws._sep is None else max(ws._sep - 1, 0),
                                    lambda ws, v: setattr(ws, "_sep", None if v >= _NEVER else v + 1))

    @property
    def timeout_ms(self):
        return self._cfg[2]

    @property
    def all_gather(self):
        """None or the callable (output, input) that the unfused path gathers with."""
        return self._all_gather

    @all_gather.setter
    def all_gather(self, fn):
        if fn is not None and not callable(fn):
            raise TypeError("beammoe.Workspace: all_gather must be None or a callable (output, input) like "
                            "torch.distributed.all_gather_into_tensor, got %s" % type(fn).__name__)
        self._all_gather = fn

    @property
    def nranks(self):
        return self.world_size

    @property
    def hidden(self):
        return self.hidden_size

    def strategy_for(self, tokens):
        """The strategy AUTO takes for `tokens` tokens: "oneshot", "twoshot" or "unfused"."""
        fn = "beammoe.Workspace.strategy_for"
        tokens = A.integer(fn, "tokens", tokens, A.INT64)
        if tokens < 0:
            raise ValueError("%s: tokens=%d must be >= 0" % (fn, tokens))
        return _NAMES[self._auto_enum(tokens)]

    def _auto_enum(self, tokens):
        if self._peerless:
            return _UNFUSED
        if tokens <= self._one:
            return _ONESHOT
        if self._sep is not None and tokens >= self._sep:
            return _UNFUSED
        return _TWOSHOT

    def _python_gather(self, residual, strategy):
        """Whether a gather or an all-reduce call runs in Python (_pgather):
        every call of a CPU workspace over a process group; with the
        all_gather hook set, the calls that take UNFUSED. `strategy`: the
        caller's (None or a name) or the library's value."""
        if self._pg:
            return True
        if self._all_gather is None:
            return False
        if type(strategy) is int:
            code = strategy
        elif strategy is None:
            code = _AUTO
        elif isinstance(strategy, str):
            code = _lib.STRATEGIES.get(strategy.lower(), -1)
        else:
            return False
        if code == _UNFUSED:
            return True
        if code != _AUTO or not isinstance(residual, torch.Tensor) or residual.dim() != 2:
            return False
        return self._auto_enum(residual.shape[0]) == _UNFUSED

    def _run_gather(self, dev, g, w, capacity, tokens, top_k, hidden, scale, pw, pe, residual, s, nw, ne, h, n, st,
                    quant=None):
        """The library's gather with AUTO resolved from the attributes (the
        library's own rule while they are the values it was handed); quant:
        the BeamQuant of its quantized output, or None."""
        handle, ops = self.handle, self._ops

        def run(strategy):
            _run.gather(dev, ops, handle, g, w, capacity, tokens, top_k, hidden, scale, pw, pe, residual, s, nw, ne,
                        h, n, quant, strategy)
        self._run_auto(tokens, st, run)

    def _run_allreduce(self, dev, x, g, w, capacity, tokens, top_k, hidden, scale, nw1, ne1, residual, s, nw,
                       ne, h, n, st, quant=None):
        """The library's all-reduce (_run.allreduce), AUTO as the gather's;
        quant: the BeamQuant of its quantized output, or None. (The calls
        that _python_gather takes run in _pgather instead.)"""
        handle, ops = self.handle, self._ops
        self._run_auto(tokens, st, lambda strategy: _run.allreduce(
            dev, ops, handle, x, g, w, capacity, tokens, top_k, hidden, scale, nw1, ne1, residual, s, nw, ne, h, n,
            quant, strategy))

    def _run_dense_allreduce(self, dev, x, tokens, hidden, prw, pre, residual, s, nw, ne, h, n, st, quant=None):
        """The dense form's all-reduce (x the partial, pre the norm of the
        sum), as _run_allreduce."""
        self._run_allreduce(dev, x, None, None, 0, tokens, 0, hidden, 1.0, prw, pre, residual, s, nw, ne, h, n, st,
                            quant)

    def _moe_run(self, gather):
        """The library's MoE collective, the gather or the MoE all-reduce, as
        run(dev, g, w, capacity, tokens, ...) with _run.fused's arguments."""
        return self._run_gather if gather else lambda dev, *args: self._run_allreduce(dev, None, *args)

    def _run_auto(self, tokens, st, run):
        """run(strategy) with AUTO resolved from the attributes (the
        library's own rule while they are the values it was handed)."""
        if st != _AUTO or self._c_auto:
            run(st)
            return
        st = self._auto_enum(tokens)
        try:
            run(st)
        except BeamUnsupportedError as e:
            # A CUDA workspace without peer memory (every rank alike, before
            # anything was launched): AUTO is UNFUSED there, as in the library.
            if st == _UNFUSED or "needs peer memory" not in str(e):
                raise
            self._peerless = True
            run(_UNFUSED)

    @property
    def handle(self):
        """The beam_workspace pointer (an int; for a CPU workspace over a
        process group, an id of the workspace); ValueError once closed."""
        h = self._handle
        if h is None:
            raise ValueError("beammoe.Workspace: the workspace is closed")
        return h

    @property
    def closed(self):
        return self._handle is None

    def close(self):
        """Collective: destroy the workspace, then its NCCL communicator (a
        CPU workspace over a process group holds neither), and let go of the
        group (device_group is None after it). Refused while a
        call of the gather in Python holds it; once an earlier failure left
        the workspace unusable, it closes and raises that failure
        (BeamCommError)."""
        if not self._lock.acquire(blocking=False):
            raise BeamArgumentError("beammoe.Workspace.close: %s: nothing was closed; close it after that call "
                                    "returns" % self._overlap("a call"))
        h, self._handle = self._handle, None
        comm, self._comm = self._comm, None
        # Nor the group: one kept alive past destroy_process_group() is
        # destroyed while the interpreter exits, where gloo may abort
        # [2026-12-07-gloo-teardown].
        self.device_group = None
        self._lock.release()
        if h is not None:
            _open.pop(h, None)
            if not self._pg:
                self._destroy(h, comm)
        if self._dead is not None:
            raise self._unusable("beammoe.Workspace.close", " (closed now)")

    def _destroy(self, h, comm):
        ops = self._ops
        with torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext():
            st = ops.workspace_destroy(h)
            msg = _lib.last_error(ops) if st != _lib.BEAM_OK else ""
            if comm is not None:  # a CUDA workspace's communicator
                _nccl.comm_destroy(comm)
        if st != _lib.BEAM_OK:
            raise_for_status(st, msg or "beam_workspace_destroy failed")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self.close()
        except BeamCommError:
            if exc_type is None:  # else the exception that left the block goes on
                raise

    def __repr__(self):
        if self._cfg is None:
            return "Workspace(unopened)"
        return ("Workspace(rank=%s, world_size=%s, max_tokens=%d, hidden_size=%d, "
                "moe_gather_oneshot_max_tokens=%d, moe_gather_separate_norm_min_tokens=%r, device=%s%s%s)" % (
                    self.rank, self.world_size, self.max_tokens, self.hidden_size, self._one, self._sep,
                    self.device, ", process group" if self._pg else "", ", closed" if self.closed else ""))


def python_call(workspace, residual, strategy):
    """Whether an eager collective call runs in Python (_pgather) at once:
    on a Workspace whose _python_gather takes it, where no torch operator is
    needed (the operator's implementation asks _python_gather itself)."""
    return isinstance(workspace, Workspace) and workspace._python_gather(residual, strategy) \
        and not _calls.operator_needed()


def check_workspace(fn, workspace, dev):
    """The workspace's handle, for a call of fn on tensors on `dev`."""
    if not isinstance(workspace, Workspace):
        raise TypeError("%s: workspace must be a beammoe.Workspace, got %s" % (fn, type(workspace).__name__))
    return workspace._handle_for(fn, dev)

