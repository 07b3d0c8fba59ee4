"""Loading libbeammoe (the run-time dispatcher) and declaring its C API.

The package has no compiled extension: every call goes through ctypes to the
one dispatcher library, which itself picks libbeammoe_cpu or libbeammoe_cuda.
Where the library is found, in order:

1. ``$BEAMMOE_LIBRARY`` (a path to libbeammoe.so or libbeammoe.so.0);
2. a build tree: walking up from this package's directory, the first
   ``.libs/libbeammoe.so`` (what ``make`` leaves in the top build directory);
3. ``pkg-config --variable=libdir beammoe`` (an installed library);
4. ``ctypes.util.find_library("beammoe")`` (the loader's own search).
"""
import ctypes
import ctypes.util
import os
import subprocess
import threading

from ._errors import raise_for_status

# enum beam_status / beam_strategy of beammoe.h
BEAM_OK = 0
BEAM_ERR_INVALID_ARGUMENT = 1
BEAM_ERR_UNSUPPORTED = 2
BEAM_ERR_DEVICE = 3
BEAM_ERR_COMM = 4
BEAM_ERR_OUT_OF_MEMORY = 5

STRATEGIES = {
    None: 0,
    "auto": 0,
    "fused": 1,
    "unfused": 2,
    "oneshot": 3,
    "twoshot": 4,
}


class BeamNorm(ctypes.Structure):
    """struct beam_norm: weight (BF16 pointer or NULL) and eps."""
    _fields_ = [("weight", ctypes.c_void_p), ("eps", ctypes.c_float)]


class BeamWorkspaceConfig(ctypes.Structure):
    """struct beam_workspace_config."""
    _fields_ = [
        ("oneshot_max_tokens", ctypes.c_int64),
        ("twoshot_max_tokens", ctypes.c_int64),
        ("timeout_ms", ctypes.c_int32),
    ]


_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_I32 = ctypes.c_int32
_F = ctypes.c_float
_NORM_P = ctypes.POINTER(BeamNorm)
_ST = ctypes.c_int

# name: (restype, argtypes). Pointers to data are plain void pointers (the
# addresses come from tensor.data_ptr()); the scales array is a float[2].
_PROTOTYPES = {
    "beam_status_string": (ctypes.c_char_p, [_ST]),
    "beam_last_error": (ctypes.c_char_p, []),
    "beam_version": (ctypes.c_char_p, []),
    "beam_backend_name": (ctypes.c_char_p, []),
    "beam_set_backend": (_ST, [ctypes.c_char_p]),
    "beam_moe_finalize": (_ST, [_P, _P, _I64, _I64, _I32, _I32, _F, _NORM_P, _P, _P]),
    "beam_norm_residual_norm": (_ST, [_P, _P, _I64, _I32, _NORM_P, _P, _NORM_P, _P, _P, _P]),
    "beam_moe_finalize_norm_residual_norm": (
        _ST, [_P, _P, _I64, _I64, _I32, _I32, _F, _NORM_P, _P, _P, _NORM_P, _P, _P, ctypes.c_int, _P]),
    "beam_workspace_config_default": (BeamWorkspaceConfig, []),
    "beam_cpu_group_create": (_ST, [_I32, ctypes.POINTER(_P)]),
    "beam_cpu_group_destroy": (_ST, [_P]),
    "beam_workspace_create_cpu": (
        _ST, [_P, _I32, _I64, _I32, ctypes.POINTER(BeamWorkspaceConfig), ctypes.POINTER(_P)]),
    "beam_workspace_create_nccl": (
        _ST, [_P, _I64, _I32, ctypes.POINTER(BeamWorkspaceConfig), ctypes.POINTER(_P)]),
    "beam_workspace_destroy": (_ST, [_P]),
    "beam_workspace_info": (_ST, [_P, ctypes.POINTER(_I32), ctypes.POINTER(_I32)]),
    "beam_moe_finalize_gather_norm_residual_norm": (
        _ST, [_P, _P, _P, _I64, _I64, _I32, _I32, _F, _NORM_P, _P, _P, _NORM_P, _P, _P,
              ctypes.c_int, _P]),
}

_lock = threading.Lock()
_lib = None
_lib_path = None
_backend = None  # the backend this package last selected ("cpu"/"cuda")


def _pkgconfig_libdir():
    try:
        out = subprocess.run(["pkg-config", "--variable=libdir", "beammoe"],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    d = out.stdout.strip()
    return d if out.returncode == 0 and d else None


def _candidates():
    """Paths to try, in the documented order (duplicates are harmless)."""
    env = os.environ.get("BEAMMOE_LIBRARY")
    if env:
        # An explicit choice: no fallback that would hide a wrong path.
        return [env], True
    paths = []
    d = os.path.dirname(os.path.abspath(__file__))
    while True:
        p = os.path.join(d, ".libs", "libbeammoe.so")
        if os.path.exists(p):
            paths.append(p)
            break
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    libdir = _pkgconfig_libdir()
    if libdir:
        for name in ("libbeammoe.so.0", "libbeammoe.so"):
            p = os.path.join(libdir, name)
            if os.path.exists(p):
                paths.append(p)
                break
    found = ctypes.util.find_library("beammoe")
    if found:
        paths.append(found)
    return paths, False


def library():
    """The loaded libbeammoe (a ctypes.CDLL), loading it on first use."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        paths, explicit = _candidates()
        errors = []
        for p in paths:
            try:
                lib = ctypes.CDLL(p)
            except OSError as e:
                errors.append("%s: %s" % (p, e))
                continue
            for name, (res, args) in _PROTOTYPES.items():
                fn = getattr(lib, name)
                fn.restype = res
                fn.argtypes = args
            _lib, _lib_path = lib, p
            return lib
        if explicit:
            raise OSError("beammoe: BEAMMOE_LIBRARY=%s cannot be loaded: %s"
                          % (paths[0], "; ".join(errors)))
        raise OSError("beammoe: libbeammoe not found (set BEAMMOE_LIBRARY to the path of "
                      "libbeammoe.so, or install the library so that pkg-config or the loader "
                      "finds it)" + (": " + "; ".join(errors) if errors else ""))


def library_path():
    """The path libbeammoe was loaded from."""
    library()
    return _lib_path


def last_error():
    msg = library().beam_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def check(status, what):
    """Raise the exception for a failed call (status != BEAM_OK)."""
    if status != BEAM_OK:
        msg = last_error() or "%s failed" % what
        raise_for_status(status, msg)


_gate = threading.Condition(threading.Lock())
_inflight = 0  # calls running on _backend right now


def set_backend(name):
    """Make `name` ("cpu" or "cuda") the dispatcher's backend now (waits for
    calls running on the other backend to return)."""
    with backend(name):
        pass


class backend:
    """A context for one call on backend `name` ("cpu" or "cuda").

    The dispatcher's choice is process-wide, so a thread must not switch it
    while another thread's call runs on the other backend (a CPU backend
    handed device pointers would fault). Calls on the same backend run
    concurrently; a switch waits until the running calls have returned.
    The choice is cached: when the device type does not change, entering
    costs a lock and a comparison. Do not nest contexts of different
    backends in one thread (the inner one would wait for the outer)."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        global _backend, _inflight
        with _gate:
            while _backend != self.name and _inflight > 0:
                _gate.wait()
            if _backend != self.name:
                check(library().beam_set_backend(self.name.encode()), "beam_set_backend")
                _backend = self.name
            _inflight += 1
        return self

    def __exit__(self, *exc):
        global _inflight
        with _gate:
            _inflight -= 1
            if _inflight == 0:
                _gate.notify_all()


def backend_name():
    """The backend libbeammoe runs calls on now ("cpu" or "cuda")."""
    return library().beam_backend_name().decode()


def version():
    return library().beam_version().decode()
