"""The few NCCL calls the workspace needs, through ctypes.

The library must be the same libnccl that libbeammoe_cuda uses, since the
communicator made here is handed to it. Loading "libnccl.so.2" by its soname
after the CUDA backend (and torch) are loaded returns the copy already in the
process, so all three agree. $BEAMMOE_NCCL_LIBRARY overrides the name.
"""
import ctypes
import os
import threading

from ._errors import BeamCommError
from ._lib import _declare

NCCL_UNIQUE_ID_BYTES = 128


class NcclUniqueId(ctypes.Structure):
    # Bytes, not c_char: c_char arrays read back cut at the first NUL.
    _fields_ = [("internal", ctypes.c_ubyte * NCCL_UNIQUE_ID_BYTES)]


_lock = threading.Lock()
_nccl = None


def library():
    global _nccl
    with _lock:
        if _nccl is None:
            name = os.environ.get("BEAMMOE_NCCL_LIBRARY") or "libnccl.so.2"
            try:
                lib = ctypes.CDLL(name)
            except OSError as e:
                raise BeamCommError("beammoe.Workspace: cannot load NCCL (%s): %s" % (name, e), 4) from None
            _declare(lib, {
                "ncclGetUniqueId": (ctypes.c_int, [ctypes.POINTER(NcclUniqueId)]),
                "ncclCommInitRank": (ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, NcclUniqueId,
                                                    ctypes.c_int]),
                "ncclCommDestroy": (ctypes.c_int, [ctypes.c_void_p]),
                "ncclGetErrorString": (ctypes.c_char_p, [ctypes.c_int])})
            _nccl = lib
        return _nccl


def _check(res, what):
    if res != 0:
        msg = library().ncclGetErrorString(res)
        raise BeamCommError("beammoe.Workspace: %s failed: NCCL error %d (%s)"
                            % (what, res, msg.decode() if msg else "?"), 4)


def unique_id():
    """A fresh ncclUniqueId as 128 bytes."""
    uid = NcclUniqueId()
    _check(library().ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
    return bytes(uid.internal)


def comm_init_rank(nranks, uid_bytes, rank):
    """ncclCommInitRank on the current CUDA device; the ncclComm_t as an int."""
    if len(uid_bytes) != NCCL_UNIQUE_ID_BYTES:
        raise ValueError("beammoe.Workspace: an NCCL unique id has %d bytes, got %d"
                         % (NCCL_UNIQUE_ID_BYTES, len(uid_bytes)))
    uid = NcclUniqueId()
    ctypes.memmove(uid.internal, bytes(uid_bytes), NCCL_UNIQUE_ID_BYTES)
    comm = ctypes.c_void_p()
    _check(library().ncclCommInitRank(ctypes.byref(comm), nranks, uid, rank), "ncclCommInitRank")
    return comm.value


def comm_destroy(comm):
    _check(library().ncclCommDestroy(comm), "ncclCommDestroy")
