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

The libraries installed with the package find each other and what the
wheel carries beside them (libgomp) through RUNPATH $ORIGIN. What
libbeammoe_cuda needs from outside, the CUDA runtime and NCCL, is loaded
first by path from the CUDA wheels PyTorch installs (``nvidia/*/lib/``,
``torch/lib/`` on ``sys.path``) where the loader would not find it (a
library already loaded under a soname satisfies that soname).

The dispatcher finds its backends (libbeammoe_cpu.so.0, libbeammoe_cuda.so.0)
in ``$BEAM_BACKEND_DIR``, beside itself, in its configured libdir, or through
the loader. Every operation is read from a backend's table, struct beam_ops
(``BeamOps``), which ``beam_backend_ops(name, BEAM_OPS_VERSION)`` of the
dispatcher returns: the table of the backend library it loaded and checked
for this host, so a call through it runs that library's code with no
forwarding, and CPU and CUDA calls never wait for each other. The tensor
operations take the table of their tensors' device (``backend_ops``); a
workspace or a CPU group is made, used and destroyed through the table of its
backend, whose ``last_error`` says why a call through it failed. The
dispatcher's own names (the version, the status strings, its backend choice,
the tables) are plain prototypes (``_PROTOTYPES``).
"""
import ctypes
import ctypes.util
import glob
import os
import re
import subprocess
import sys
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


class BeamQuant(ctypes.Structure):
    """struct beam_quant: the quantized output of normalized (the *_q calls)."""
    _fields_ = [
        ("kind", ctypes.c_int32),
        ("group_size", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
        ("scale", ctypes.c_float),
        ("values", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("scale_ld", ctypes.c_int64),
        ("block_scales", ctypes.c_void_p),  # NVFP4's E4M3, MXFP8's E8M0 block scales; otherwise NULL
    ]


_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_I32 = ctypes.c_int32
_F = ctypes.c_float
_ST = ctypes.c_int  # beam_status and beam_strategy
_FN = ctypes.CFUNCTYPE  # C calls that release the GIL while they run

# The layout of struct beam_ops that BeamOps mirrors.
BEAM_OPS_VERSION = 3


class BeamOps(ctypes.Structure):
    """struct beam_ops: one backend library's table, member by member.

    Every pointer to data, to a beam_norm and to the scales array is a plain
    void pointer: the callers pass ints (tensor.data_ptr(), the address of a
    cached BeamNorm), which costs less per call than a ctypes object. The
    table only grows, so a library's may be larger than this (size)."""
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("name", ctypes.c_char_p),
        ("device_memory", ctypes.c_int32),
        ("last_error", _FN(ctypes.c_char_p)),
        ("moe_finalize", _FN(_ST, _P, _P, _I64, _I64, _I32, _I32, _F, _P, _P, _P)),
        ("norm_residual_norm", _FN(_ST, _P, _P, _I64, _I32, _P, _P, _P, _P, _P, _P)),
        ("moe_finalize_norm_residual_norm",
         _FN(_ST, _P, _P, _I64, _I64, _I32, _I32, _F, _P, _P, _P, _P, _P, _P, _ST, _P)),
        ("workspace_config_default", _FN(BeamWorkspaceConfig)),
        ("cpu_group_create", _FN(_ST, _I32, ctypes.POINTER(_P))),
        ("cpu_group_destroy", _FN(_ST, _P)),
        ("workspace_create_cpu",
         _FN(_ST, _P, _I32, _I64, _I32, ctypes.POINTER(BeamWorkspaceConfig), ctypes.POINTER(_P))),
        ("workspace_create_nccl", _FN(_ST, _P, _I64, _I32, ctypes.POINTER(BeamWorkspaceConfig), ctypes.POINTER(_P))),
        ("workspace_destroy", _FN(_ST, _P)),
        ("workspace_info", _FN(_ST, _P, ctypes.POINTER(_I32), ctypes.POINTER(_I32))),
        ("moe_finalize_gather_norm_residual_norm",
         _FN(_ST, _P, _P, _P, _I64, _I64, _I32, _I32, _F, _P, _P, _P, _P, _P, _P, _ST, _P)),
        # version 2
        ("norm_residual_norm_q", _FN(_ST, _P, _P, _I64, _I32, _P, _P, _P, _P, _P, _P, _P)),
        ("moe_finalize_norm_residual_norm_q",
         _FN(_ST, _P, _P, _I64, _I64, _I32, _I32, _F, _P, _P, _P, _P, _P, _P, _P, _ST, _P)),
        ("moe_finalize_gather_norm_residual_norm_q",
         _FN(_ST, _P, _P, _P, _I64, _I64, _I32, _I32, _F, _P, _P, _P, _P, _P, _P, _P, _ST, _P)),
        # version 3
        ("allreduce_norm_residual_norm", _FN(_ST, _P, _P, _I64, _I32, _P, _P, _P, _P, _P, _P, _P, _ST, _P)),
        ("moe_finalize_allreduce_norm_residual_norm",
         _FN(_ST, _P, _P, _P, _I64, _I64, _I32, _I32, _F, _P, _P, _P, _P, _P, _P, _P, _ST, _P)),
    ]


_FUNCTION = type(_FN(None))  # the class of CFUNCTYPE prototypes
_OPERATIONS = tuple(n for n, t in BeamOps._fields_ if isinstance(t, _FUNCTION))

# The dispatcher's own functions: name: (restype, argtypes). Every operation
# is a member of BeamOps instead (one prototype for each); beam_last_error is
# in both, since each library keeps its own message.
# python/tests/test_prototypes.py checks both against beammoe.h.
_PROTOTYPES = {
    "beam_status_string": (ctypes.c_char_p, [_ST]),
    "beam_last_error": (ctypes.c_char_p, []),
    "beam_version": (ctypes.c_char_p, []),
    "beam_backend_name": (ctypes.c_char_p, []),
    "beam_set_backend": (_ST, [ctypes.c_char_p]),
    "beam_backend_ops": (ctypes.POINTER(BeamOps), [ctypes.c_char_p, ctypes.c_uint32]),
    "beam_gather_agreement": (_ST, [_I64, _I32, _I32, _F, _P, _P, _P, _P, _ST, _P]),
    "beam_gather_agreement_text": (ctypes.c_char_p, [_I32, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t]),
}

_lock = threading.Lock()
_lib = None
_lib_path = None


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


def _wheel_dirs(soname):
    """Where the CUDA wheels (nvidia-*) or torch keep soname, on sys.path."""
    for d in sys.path:
        for pattern in ("nvidia/*/lib", "nvidia/*/*/lib", "torch/lib"):
            for lib in glob.glob(os.path.join(d, pattern, soname)):
                yield lib


def _preload_cuda():
    """Load by path the CUDA runtime and NCCL that the bundled libbeammoe_cuda
    names (in its dynamic strings, near the file's start) where the loader
    would not find them (above)."""
    cuda = os.path.join(_BUNDLED, "libbeammoe_cuda" + SO_SUFFIX)
    if not os.path.exists(cuda):
        return
    with open(cuda, "rb") as f:
        wanted = sorted(set(m.decode() for m in re.findall(rb"lib(?:cudart|nccl)\.so\.\d+", f.read(1 << 20))))
    for soname in wanted:
        try:
            ctypes.CDLL(soname)
            continue
        except OSError:
            pass
        for path in _wheel_dirs(soname):
            try:
                ctypes.CDLL(path)
                break
            except OSError:
                continue
        # not found: libbeammoe_cuda does not load, and the CPU backend runs


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
        if paths and os.path.dirname(os.path.abspath(paths[0])) == _BUNDLED:
            _preload_cuda()
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


def last_error(ops=None):
    """The calling thread's message for its last failed call through `ops`
    (a Backend), or through the dispatcher's own functions (None)."""
    msg = ops.last_error() if ops is not None else library().beam_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def check(status, what, ops=None):
    """Raise the exception for a failed call (status != BEAM_OK) through
    `ops` (a Backend; None: the dispatcher), with that library's message."""
    if status != BEAM_OK:
        msg = last_error(ops) or "%s failed" % what
        raise_for_status(status, msg)


def set_backend(name):
    """Make `name` ("cpu" or "cuda") the dispatcher's backend
    (beam_set_backend): what backend_name() reports. The package's calls do
    not depend on it: each goes through the table of its own backend."""
    check(library().beam_set_backend(name.encode()), "beam_set_backend")


class Backend:
    """One backend's table (struct beam_ops) for the calls: its name and
    each operation as an attribute (moe_finalize, ..., last_error), a ctypes
    function called with the arguments of the C member. The members are read
    once here: reading a field of a ctypes Structure makes a new function
    object every time."""

    def __init__(self, table):
        self.table = table  # a BeamOps in the library's memory (never unloaded)
        self.name = table.name.decode()
        self.device_memory = bool(table.device_memory)
        for member in _OPERATIONS:
            setattr(self, member, getattr(table, member))

    def __repr__(self):
        return "Backend(%r)" % self.name


_backends = {}


def backend_ops(name):
    """The table of backend `name` ("cpu" or "cuda") as a Backend: the very
    library the dispatcher loaded and accepted for this host, read once.
    BeamError when that backend does not load or cannot run here."""
    ops = _backends.get(name)
    if ops is not None:
        return ops
    lib = library()
    with _lock:
        ops = _backends.get(name)
        if ops is None:
            p = lib.beam_backend_ops(name.encode(), BEAM_OPS_VERSION)
            if not p:
                raise_for_status(BEAM_ERR_UNSUPPORTED, last_error() or "beam_backend_ops(\"%s\") failed" % name)
            table = p.contents
            # A library serves every version up to its own (the members of
            # a version are a prefix of the next's); a smaller table would be
            # read past its end.
            if table.version < BEAM_OPS_VERSION or table.size < ctypes.sizeof(BeamOps):
                raise OSError("beammoe: the %s backend's table has version %d (%d bytes); this package reads "
                              "version %d (%d bytes)" % (name, table.version, table.size, BEAM_OPS_VERSION,
                                                        ctypes.sizeof(BeamOps)))
            if table.name != name.encode():
                raise OSError("beammoe: beam_backend_ops(\"%s\") returned the table of %r" % (name, table.name))
            ops = _backends[name] = Backend(table)
    return ops


def backend_name():
    """The backend the dispatcher runs its own calls on now ("cpu" or "cuda")."""
    return library().beam_backend_name().decode()


def version():
    return library().beam_version().decode()
