"""Loading libbeammoe and its backend libraries, and declaring their C API.

The package has no compiled extension: every call goes through ctypes. Where
libbeammoe (the run-time dispatcher) is found, in order:

1. ``$BEAMMOE_LIBRARY`` (a path to libbeammoe.so or libbeammoe.so.0, the
   soname: SO_SUFFIX below);
2. the libraries installed with the package (``beammoe/_libs/``, copied from
   the build tree by ``pip install ./python``);
3. a build tree: walking up from this package's directory, the first
   ``.libs/libbeammoe.so`` (what ``make`` leaves in the top build directory);
4. ``pkg-config --variable=libdir beammoe`` (an installed library);
5. ``ctypes.util.find_library("beammoe")`` (the loader's own search).

The dispatcher finds its backends (libbeammoe_cpu.so.0, libbeammoe_cuda.so.0)
in ``$BEAM_BACKEND_DIR``, beside itself, in its configured libdir, or through
the loader. The operations on tensors call the backend of the tensors' device
directly (``backend_library``): the dispatcher loads and checks it once, and
the same loaded copy is then reached by its soname, so CPU and CUDA calls never
wait for each other. Workspaces and CPU groups go through the dispatcher, which
ties each workspace to the backend that made it.
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

# The soname suffix of the libraries: ".so.<current - age>" of the ABI set in
# configure.ac, which refuses to configure a tree where this copy differs.
# python/setup.py reads it from here.
SO_SUFFIX = ".so.0"
_BUNDLED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_libs")


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
# python/tests/test_prototypes.py checks both tables against beammoe.h.
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

# The backends' entry points that the tensor operations call, with every
# pointer (norms and scales too) a plain address: the callers pass ints.
FAST_PROTOTYPES = {
    "beam_last_error": (ctypes.c_char_p, []),
    "beam_backend_name": (ctypes.c_char_p, []),
    "beam_moe_finalize": (_ST, [_P, _P, _I64, _I64, _I32, _I32, _F, _P, _P, _P]),
    "beam_norm_residual_norm": (_ST, [_P, _P, _I64, _I32, _P, _P, _P, _P, _P, _P]),
    "beam_moe_finalize_norm_residual_norm": (
        _ST, [_P, _P, _I64, _I64, _I32, _I32, _F, _P, _P, _P, _P, _P, _P, ctypes.c_int, _P]),
    "beam_moe_finalize_gather_norm_residual_norm": (
        _ST, [_P, _P, _P, _I64, _I64, _I32, _I32, _F, _P, _P, _P, _P, _P, _P, ctypes.c_int, _P]),
}

_lock = threading.Lock()
_lib = None
_lib_path = None
_backend = None  # the backend this package last selected in the dispatcher ("cpu"/"cuda")


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
    bundled = os.path.join(_BUNDLED, "libbeammoe" + SO_SUFFIX)
    if os.path.exists(bundled):
        paths.append(bundled)
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
    if not paths:
        libdir = _pkgconfig_libdir()
        if libdir:
            for name in ("libbeammoe" + SO_SUFFIX, "libbeammoe.so"):
                p = os.path.join(libdir, name)
                if os.path.exists(p):
                    paths.append(p)
                    break
    found = ctypes.util.find_library("beammoe")
    if found:
        paths.append(found)
    return paths, False


def _declare(lib, prototypes):
    for name, (res, args) in prototypes.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


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
            _declare(lib, _PROTOTYPES)
            _lib, _lib_path = lib, p
            return lib
        if explicit:
            raise OSError("beammoe: BEAMMOE_LIBRARY=%s cannot be loaded: %s"
                          % (paths[0], "; ".join(errors)))
        raise OSError("beammoe: libbeammoe not found (pip install ./python after make carries it; "
                      "or set BEAMMOE_LIBRARY to the path of libbeammoe.so, or install the library so "
                      "that pkg-config or the loader finds it)" + (": " + "; ".join(errors) if errors else ""))


def library_path():
    """The path libbeammoe was loaded from."""
    library()
    return _lib_path


def last_error(lib=None):
    msg = (lib or library()).beam_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def check(status, what, lib=None):
    """Raise the exception for a failed call (status != BEAM_OK)."""
    if status != BEAM_OK:
        msg = last_error(lib) or "%s failed" % what
        raise_for_status(status, msg)


_gate = threading.Condition(threading.Lock())
_inflight = 0  # dispatcher calls running on _backend right now


def set_backend(name):
    """Make `name` ("cpu" or "cuda") the dispatcher's backend now (waits for
    dispatcher calls running on the other backend to return)."""
    with backend(name):
        pass


class backend:
    """A context for calls through the dispatcher on backend `name`.

    The dispatcher's choice is process-wide, so a thread must not switch it
    while another thread's call runs on the other backend. Calls on the same
    backend run concurrently; a switch waits until the running calls have
    returned. The tensor operations do not use this: they call the backend
    library of their device directly (backend_library)."""

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


_backend_libs = {}


def backend_library(name):
    """The backend library `name` ("cpu" or "cuda") itself, with the fast
    prototypes: the copy the dispatcher loaded and accepted for this host
    (beam_set_backend), reached by its soname. BeamError when that backend
    does not load or cannot run here."""
    lib = _backend_libs.get(name)
    if lib is not None:
        return lib
    set_backend(name)  # the dispatcher loads it and checks it can run here
    with _lock:
        lib = _backend_libs.get(name)
        if lib is None:
            soname = "libbeammoe_%s%s" % (name, SO_SUFFIX)
            try:
                lib = ctypes.CDLL(soname)
            except OSError as e:
                raise OSError("beammoe: the dispatcher loaded the %s backend but %s cannot be opened "
                              "by its name: %s" % (name, soname, e)) from None
            _declare(lib, FAST_PROTOTYPES)
            got = lib.beam_backend_name()
            if got != name.encode():
                raise OSError("beammoe: %s reports backend %r, not %r" % (soname, got, name))
            _backend_libs[name] = lib
    return lib


def backend_name():
    """The backend the dispatcher runs its own calls on now ("cpu" or "cuda")."""
    return library().beam_backend_name().decode()


def version():
    return library().beam_version().decode()
