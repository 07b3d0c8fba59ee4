"""Where the libraries come from: the operations call the same copy of each
backend library that the dispatcher loaded (one file per library in the
process), and an installed package uses the libraries it carries."""
import ast
import ctypes
import os

import pytest
import torch

import beammoe
from beammoe import _lib


def _mapped():
    """{library file name: set of paths} of the beammoe libraries mapped now."""
    out = {}
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            name = os.path.basename(path)
            if name.startswith("libbeammoe"):
                out.setdefault(name.split(".so")[0], set()).add(os.path.realpath(path))
    return out


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps (Linux)")
def test_one_copy_of_each_library():
    g = torch.zeros(2 * 8, 256, dtype=torch.bfloat16)
    beammoe.beam_moe_finalize(g, torch.zeros(2, 8), torch.empty(2, 256, dtype=torch.bfloat16))
    maps = _mapped()
    assert "libbeammoe_cpu" in maps and "libbeammoe" in maps, maps
    for name, paths in maps.items():
        assert len(paths) == 1, "%s is mapped from %s" % (name, sorted(paths))
    here = os.path.dirname(os.path.realpath(beammoe.library_path()))
    assert os.path.dirname(next(iter(maps["libbeammoe_cpu"]))) == here, "the backend is not beside the dispatcher"


def test_backend_table_is_the_backends():
    """The CPU table comes from libbeammoe_cpu itself, in the layout that
    _lib.BeamOps mirrors (the same build: the very size of struct beam_ops)."""
    ops = _lib.backend_ops("cpu")
    assert ops is _lib.backend_ops("cpu")  # read once
    assert ops.name == "cpu" and not ops.device_memory
    assert ops.table.version == _lib.BEAM_OPS_VERSION
    assert ops.table.size == ctypes.sizeof(_lib.BeamOps)
    # the calls run the backend's code, with no forwarding by the dispatcher
    path = _dl_file(ctypes.cast(ops.moe_finalize, ctypes.c_void_p).value)
    assert os.path.basename(path).startswith("libbeammoe_cpu."), path


def _dl_file(address):
    """The file of the shared object that holds `address` (dladdr)."""
    class DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]
    dladdr = getattr(ctypes.CDLL(None), "dladdr", None)
    if dladdr is None:
        pytest.skip("dladdr is not in the process's global namespace")
    info = DlInfo()
    assert dladdr(ctypes.c_void_p(address), ctypes.byref(info)), hex(address)
    return os.fsdecode(info.dli_fname)


@pytest.mark.skipif(not os.path.exists(os.path.join(_lib._BUNDLED, "libbeammoe" + _lib.SO_SUFFIX)),
                    reason="the package carries no libraries (not installed with pip install ./python)")
@pytest.mark.skipif(bool(os.environ.get("BEAMMOE_LIBRARY")), reason="BEAMMOE_LIBRARY chooses the library")
def test_installed_package_uses_its_libraries():
    path = os.path.realpath(beammoe.library_path())
    assert os.path.dirname(path) == os.path.realpath(_lib._BUNDLED), path
    assert os.path.exists(os.path.join(_lib._BUNDLED, "libbeammoe_cpu" + _lib.SO_SUFFIX))


def test_oldest_torch():
    assert beammoe.MIN_TORCH == (1, 13)
    assert beammoe._torch_release(torch.__version__) >= beammoe.MIN_TORCH
    for v, want in (("1.13.0a0", (1, 13)), ("2.15.0+cu132", (2, 15)), ("2.4.1", (2, 4)), ("junk", (0, 0))):
        assert beammoe._torch_release(v) == want
    assert beammoe.HAVE_TORCH_OPS == (hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_fake"))


def test_imports_go_one_way():
    """No module of the package imports, at its top or inside a function, a
    module that imports it back (directly or around a longer circle): a
    circle works only while every module in it defers an import or imports
    in a lucky order."""
    pkg = os.path.dirname(os.path.abspath(beammoe.__file__))
    graph = {}
    for f in sorted(os.listdir(pkg)):
        if f.endswith(".py"):
            with open(os.path.join(pkg, f), encoding="utf-8") as src:
                tree = ast.parse(src.read(), f)
            deps = graph.setdefault(f[:-3], set())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.level == 1:
                    deps.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
    assert {"ops", "_torch_ops", "_calls", "_checks"} <= set(graph), sorted(graph)

    def circle(m, path):
        for d in sorted(graph.get(m, ())):
            if d in path:
                return path[path.index(d):] + [d]
            found = circle(d, path + [d])
            if found:
                return found
        return None
    for m in sorted(graph):
        found = circle(m, [m])
        assert found is None, "an import circle: " + " -> ".join(found)
