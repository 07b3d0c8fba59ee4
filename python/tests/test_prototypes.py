"""python/beammoe/_lib.py's ctypes declarations against include/beammoe.h
(ctypes takes whatever _lib.py says: a parameter too few, an int32_t for an
int64_t or struct fields out of order load, run and pass wrong bits). The
header is read (BEAM_API declarations, function types, typedefs, enums,
#define'd numbers, in its own style) and _lib.py checked against it: BeamOps
mirrors struct beam_ops field by field, each function member a CFUNCTYPE of
the header's parameters and result, of the same kinds (int64_t: c_int64, an
enum: c_int, a struct by value: its Structure, a pointer: c_void_p or a
POINTER of the pointee's kind, const char *: c_char_p); every other exported
function has a prototype in _lib._PROTOTYPES, which declares nothing else
(beam_last_error excepted: each library keeps its own message); the other
Structures have the header's fields in order; the constants its values.
_lib.py is loaded without the package's __init__; the header is the source
tree's (python/tests/../../include): those tests skip without it.

Then where the libraries come from: the operations call the same copy of
each backend library that the dispatcher loaded (one file per library in
the process), and an installed package uses the libraries it carries.
"""
import ast
import ctypes
import importlib
import importlib.util
import os
import re
import sys
import types

import pytest
import torch

import beammoe
from beammoe import _lib

_HERE = os.path.dirname(os.path.abspath(__file__))
_HEADER = os.path.normpath(os.path.join(_HERE, "..", "..", "include", "beammoe.h"))

# The C types of the header that are values (not pointers), and their ctypes.
_SCALARS = {
    "int64_t": ctypes.c_int64,
    "uint64_t": ctypes.c_uint64,
    "size_t": ctypes.c_size_t,
    "int32_t": ctypes.c_int32,
    "uint32_t": ctypes.c_uint32,
    "uint16_t": ctypes.c_uint16,
    "uint8_t": ctypes.c_uint8,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
    "int": ctypes.c_int,
    "char": ctypes.c_char,
}

# ---- the header ---------------------------------------------------------------------------------

class Header:
    """What beammoe.h declares: functions {name: (ret, [params])}, function
    types {name: (ret, [params])} (a typedef'd one by its name, a struct's
    function-pointer member as "struct.member"), enums {name: {constant:
    value}}, structs {name: [(field, type)]}, opaque struct names, defines
    {NAME: int}; a type is (base name, number of '*')."""

    def __init__(self, text):
        text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
        text = re.sub(r"//[^\n]*", " ", text)
        self.defines = {n: int(v) for n, v in re.findall(r"^[ \t]*#[ \t]*define[ \t]+(\w+)[ \t]+(\d+)[ \t]*$",
                                                          text, flags=re.M)}
        text = re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", " ", text, flags=re.M)  # directives, continued lines too
        self.enums, self.structs, self.opaque, self.functions, self.fntypes = {}, {}, set(), {}, {}
        for tag, body, name in re.findall(r"typedef\s+enum\s+(\w+)\s*\{([^}]*)\}\s*(\w+)\s*;", text):
            assert tag == name, "typedef enum %s {...} %s: the header's style is one name" % (tag, name)
            values, nxt = {}, 0
            for item in filter(None, (s.strip() for s in body.split(","))):
                m = re.fullmatch(r"(\w+)(?:\s*=\s*(-?\d+))?", item)
                assert m, "enum %s: cannot read %r" % (name, item)
                nxt = int(m.group(2)) if m.group(2) is not None else nxt
                values[m.group(1)] = nxt
                nxt += 1
            self.enums[name] = values
        for tag, body, name in re.findall(r"typedef\s+struct\s+(\w+)\s*\{([^}]*)\}\s*(\w+)\s*;", text):
            assert tag == name, "typedef struct %s {...} %s: the header's style is one name" % (tag, name)
            self.structs[name] = [self.field(name, d) for d in body.split(";") if d.strip()]
        for tag, name in re.findall(r"typedef\s+struct\s+(\w+)\s+(\w+)\s*;", text):
            assert tag == name, "typedef struct %s %s: the header's style is one name" % (tag, name)
            self.opaque.add(name)
        typedef_fns = re.findall(r"\btypedef\s+([^;{}()]*?)\s*\b(\w+)\s*\(([^()]*)\)\s*;", text)
        for ret, name, params in typedef_fns:
            self.fntypes[name] = (self.declaration(ret, named=False), self.parameters(params))
        # a typedef the patterns above did not read (a pointer to a function,
        # an array): better a failure here than a type unchecked
        assert len(re.findall(r"\btypedef\b", text)) == \
            len(self.enums) + len(self.structs) + len(self.opaque) + len(typedef_fns), \
            "beammoe.h has a typedef this test cannot read"
        for ret, name, params in re.findall(r"\bBEAM_API\s+([^;{}()]*?)\s*\b(\w+)\s*\(([^()]*)\)\s*;", text):
            self.declare(name, (self.declaration(ret, named=False), self.parameters(params)))
        for fntype, name in re.findall(r"\bBEAM_API\s+(\w+)\s+(\w+)\s*;", text):
            assert fntype in self.fntypes, "BEAM_API %s %s: %s is no function type" % (fntype, name, fntype)
            self.declare(name, self.fntypes[fntype])
        # a BEAM_API the patterns above did not read (a function-pointer
        # parameter, a macro): better a failure here than a function unchecked
        assert len(self.functions) == len(re.findall(r"\bBEAM_API\b", text)), \
            "beammoe.h has a BEAM_API declaration this test cannot read"

    def declare(self, name, signature):
        assert name not in self.functions, "%s is declared twice" % name
        self.functions[name] = signature

    def parameters(self, text):
        """The types of a parameter list ("void": none)."""
        plist = [p.strip() for p in text.split(",")]
        return [] if plist == ["void"] else [self.declaration(p)[1] for p in plist]

    def field(self, struct, text):
        """(name, type) of a struct's member; a pointer to a function written
        out, "ret (*name)(params)", is a function type "struct.name"."""
        m = re.fullmatch(r"\s*([^()]*?)\(\s*\*\s*(\w+)\s*\)\s*\(([^()]*)\)\s*", text)
        if not m:
            return self.declaration(text)
        key = "%s.%s" % (struct, m.group(2))
        self.fntypes[key] = (self.declaration(m.group(1), named=False), self.parameters(m.group(3)))
        return m.group(2), (key, 1)

    def declaration(self, text, named=True):
        """(name, (base, stars)) of "const uint16_t *weight"; (base, stars)
        of a type alone (named=False)."""
        words = re.findall(r"[A-Za-z_]\w*|\*", text)
        stars = words.count("*")
        ids = [w for w in words if w not in ("*", "const")]
        want = 2 if named else 1
        assert len(ids) == want, "cannot read the declaration %r" % text
        ctype = (ids[0], stars)
        return (ids[1], ctype) if named else ctype

    def kind(self, base):
        if base in _SCALARS or base == "void":
            return base
        if base in self.enums:
            return "enum"
        if base in self.structs:
            return "struct"
        if base in self.opaque:
            return "opaque"
        if base in self.fntypes:
            return "function"
        raise AssertionError("beammoe.h: unknown type %s (the test's map of C types lacks it)" % base)


def _structure_name(c_name):
    """The ctypes Structure of a C struct: beam_workspace_config -> BeamWorkspaceConfig."""
    return "".join(p.capitalize() for p in c_name.split("_"))


def accepted(header, lib, ctype, result=False):
    """The ctypes types that declare a value of C type ctype = (base, stars)."""
    base, stars = ctype
    kind = header.kind(base)
    if stars == 0:
        if kind == "void":
            return [None] if result else []
        if kind == "enum":
            return [ctypes.c_int]
        if kind == "struct":
            cls = getattr(lib, _structure_name(base), None)
            assert cls is not None, "_lib.py has no ctypes.Structure %s for struct %s" % (_structure_name(base), base)
            return [cls]
        if kind in ("opaque", "function"):
            return []  # never passed by value
        return [_SCALARS[base]]
    out = [ctypes.c_void_p] + [ctypes.POINTER(t) for t in accepted(header, lib, (base, stars - 1)) if t is not None]
    if (base, stars) == ("char", 1):
        out.append(ctypes.c_char_p)
    return out


def _show(header, ctype):
    base, stars = ctype
    return base + " " + "*" * stars if stars else base


_CTYPES_NAMES = {}
for _n in ("c_int64", "c_uint64", "c_int32", "c_uint32", "c_uint16", "c_float", "c_double", "c_char", "c_void_p", "c_char_p"):
    _CTYPES_NAMES.setdefault(getattr(ctypes, _n), _n)  # c_int32 is c_int, c_int64 c_long: the header's names

# ctypes.CFUNCTYPE's prototypes: their class, and their flags (cdecl, the GIL
# released during the call; PYFUNCTYPE's hold it, WINFUNCTYPE's are stdcall)
_CFUNCTYPE = ctypes.CFUNCTYPE(None)
_FUNCTION_CLASS = type(_CFUNCTYPE)


def _tname(t):
    if t is None:
        return "None"
    if t in _CTYPES_NAMES:
        return _CTYPES_NAMES[t]
    if hasattr(t, "_type_") and isinstance(t._type_, type):  # a POINTER(...)
        return "POINTER(%s)" % _tname(t._type_)
    return getattr(t, "__name__", repr(t))


def signature_faults(header, lib, where, res, args, signature):
    """The faults of one declared function (result, parameters) against the
    header's signature (ret, [params]); `where` names it in the messages."""
    cret, cargs = signature
    faults = []
    if res not in accepted(header, lib, cret, result=True):
        faults.append("%s: the result is %s, but the header returns %s (one of: %s)"
                      % (where, _tname(res), _show(header, cret),
                         ", ".join(_tname(t) for t in accepted(header, lib, cret, result=True))))
    if len(args) != len(cargs):
        faults.append("%s: %d parameters, but the header has %d" % (where, len(args), len(cargs)))
        return faults
    for i, (a, c) in enumerate(zip(args, cargs)):
        if a not in accepted(header, lib, c):
            faults.append("%s: parameter %d is %s, but the header has %s (one of: %s)"
                          % (where, i, _tname(a), _show(header, c),
                             ", ".join(_tname(t) for t in accepted(header, lib, c))))
    return faults


def table_members(header):
    """{member: function type} of struct beam_ops's functions."""
    return {f: t[0] for f, t in header.structs["beam_ops"] if header.kind(t[0]) == "function" and t[1] == 1}


# Exported by the dispatcher and a member of the table too, declared in both:
# each library keeps its own message, and a failed call is explained by the
# library that ran it.
_ALSO_DISPATCHER = {"beam_last_error"}


def prototype_faults(header, lib, table, table_name="_PROTOTYPES"):
    """The faults of _lib's prototype table of the dispatcher's own
    functions: each against the header; every exported function declared
    once, there or as a member of the table (beam_X: member X)."""
    faults = []
    members = table_members(header)
    for name in sorted(set(table) - set(header.functions)):
        faults.append("%s declares %s, which include/beammoe.h does not export" % (table_name, name))
    for name in sorted(header.functions):
        member = name[len("beam_"):] if name.startswith("beam_") else None
        if member in members:
            if header.fntypes[members[member]] != header.functions[name]:
                faults.append("include/beammoe.h: struct beam_ops.%s is not of %s's type" % (member, name))
            if name in table and name not in _ALSO_DISPATCHER:
                faults.append("%s declares %s, which _lib.py reads from the table (BeamOps.%s): one prototype "
                              "each" % (table_name, name, member))
        elif name not in table:
            faults.append("%s has no prototype for %s (include/beammoe.h)" % (table_name, name))
    for name in sorted(set(table) & set(header.functions)):
        res, args = table[name]
        faults += signature_faults(header, lib, "%s[%r]" % (table_name, name), res, args, header.functions[name])
    return faults


def structure_faults(header, lib):
    """The faults of _lib's ctypes Structures (BeamOps too) against the
    header's structs: the fields in order, each of its field's kind; a
    function member a CFUNCTYPE of its function type."""
    faults = []
    for cname, fields in sorted(header.structs.items()):
        cls = getattr(lib, _structure_name(cname), None)
        if cls is None:
            faults.append("_lib.py has no ctypes.Structure %s for struct %s" % (_structure_name(cname), cname))
            continue
        got = [f[0] for f in cls._fields_]
        if got != [f for f, _ in fields]:
            faults.append("%s has the fields %s, struct %s has %s"
                          % (cls.__name__, got, cname, [f for f, _ in fields]))
            continue
        for (fname, ftype), (_, t) in zip(fields, cls._fields_):
            where = "%s.%s" % (cls.__name__, fname)
            if header.kind(ftype[0]) == "function" and ftype[1] == 1:
                if not isinstance(t, _FUNCTION_CLASS):
                    faults.append("%s is %s, not a ctypes.CFUNCTYPE (struct %s's member is a function)"
                                  % (where, _tname(t), cname))
                    continue
                if t._flags_ != _CFUNCTYPE._flags_:
                    faults.append("%s has the ctypes flags 0x%x, not ctypes.CFUNCTYPE's 0x%x (PYFUNCTYPE holds the "
                                  "GIL during the call)" % (where, t._flags_, _CFUNCTYPE._flags_))
                    continue
                faults += signature_faults(header, lib, where, t._restype_, list(t._argtypes_),
                                           header.fntypes[ftype[0]])
            elif t not in accepted(header, lib, ftype):
                faults.append("%s is %s, but struct %s has %s" % (where, _tname(t), cname, _show(header, ftype)))
    return faults


# ---- _lib.py, loaded without the package (no torch) -----------------------------------------------

def _package_dir():
    """The folder of the beammoe package under test (found, not imported)."""
    spec = importlib.util.find_spec("beammoe")
    if spec is None or not spec.origin:
        return os.path.join(os.path.dirname(_HERE), "beammoe")
    return os.path.dirname(spec.origin)


def _load_lib():
    """beammoe/_lib.py as a module of a stand-in package, so that its relative
    import (._errors) works and beammoe/__init__.py (torch) does not run."""
    stand_in = "_beammoe_prototype_check"
    pkg = types.ModuleType(stand_in)
    pkg.__path__ = [_package_dir()]
    sys.modules[stand_in] = pkg
    try:
        return importlib.import_module(stand_in + "._lib")
    finally:
        for m in [m for m in sys.modules if m == stand_in or m.startswith(stand_in + ".")]:
            del sys.modules[m]


@pytest.fixture(scope="module")
def header():
    if not os.path.exists(_HEADER):
        pytest.skip("%s not found: the tests run without beammoe's source tree (the header is not installed with "
                    "the package)" % _HEADER)
    with open(_HEADER, encoding="utf-8") as f:
        return Header(f.read())


@pytest.fixture(scope="module")
def lib():
    return _load_lib()


# ---- the checks -----------------------------------------------------------------------------------

def test_header_is_read(header):
    """The parser found what the header holds (an empty reading would check nothing)."""
    assert len(header.functions) >= 17, sorted(header.functions)
    assert header.functions["beam_moe_finalize"][1][2] == ("int64_t", 0)  # through beam_moe_finalize_fn
    assert header.functions["beam_moe_finalize"] == header.fntypes["beam_moe_finalize_fn"]
    assert header.functions["beam_cpu_group_create"][1][1] == ("beam_cpu_group", 2)
    assert header.functions["beam_status_string"][0] == ("char", 1)
    assert header.functions["beam_backend_ops"][0] == ("beam_ops", 1)
    assert "beam_status" in header.enums and "beam_strategy" in header.enums
    assert "beam_norm" in header.structs and "beam_workspace" in header.opaque
    ops = dict(header.structs["beam_ops"])
    assert list(ops)[:4] == ["version", "size", "name", "device_memory"]
    assert ops["moe_finalize"] == ("beam_moe_finalize_fn", 1)
    assert header.fntypes[ops["last_error"][0]] == (("char", 1), [])
    assert len(table_members(header)) >= 12
    assert header.defines["BEAM_OPS_VERSION"] >= 1


def test_the_table(header, lib):
    """BeamOps against struct beam_ops: every field in order, every
    function member's CFUNCTYPE (its result and parameters)."""
    assert hasattr(lib, "BeamOps"), "_lib.py has no ctypes.Structure BeamOps for struct beam_ops"
    faults = [f for f in structure_faults(header, lib) if f.startswith("BeamOps")]
    assert not faults, "\n".join(faults)
    assert lib.BEAM_OPS_VERSION == header.defines["BEAM_OPS_VERSION"]
    assert lib._OPERATIONS == tuple(table_members(header))


def test_every_function_is_declared_once(header, lib):
    faults = prototype_faults(header, lib, lib._PROTOTYPES)
    assert not faults, "\n".join(faults)


def test_structures(header, lib):
    faults = structure_faults(header, lib)
    assert not faults, "\n".join(faults)


def test_status_and_strategy_values(header, lib):
    for name, value in header.enums["beam_status"].items():
        assert getattr(lib, name, None) == value, "_lib.%s should be %d (beam_status)" % (name, value)
    strategies = {n[len("BEAM_STRATEGY_"):].lower(): v for n, v in header.enums["beam_strategy"].items()}
    assert {k: v for k, v in lib.STRATEGIES.items() if k is not None} == strategies
    assert lib.STRATEGIES[None] == header.enums["beam_strategy"]["BEAM_STRATEGY_AUTO"]


def test_a_broken_prototype_is_caught(header, lib):
    """The check itself: each kind of mistake in a copy of the table is reported."""
    good = dict(lib._PROTOTYPES)
    i64, i32, p = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
    res, args = good["beam_backend_ops"]
    cases = {
        "parameters": dict(good, beam_backend_ops=(res, args[:-1])),
        "parameter 1 is c_int32": dict(good, beam_backend_ops=(res, [args[0], i32])),
        "the result is c_int32": dict(good, beam_version=(i32, [])),
        "no prototype for beam_version": {k: v for k, v in good.items() if k != "beam_version"},
        "does not export": dict(good, beam_moe_finalize_v2=(ctypes.c_int, [i64])),
        "reads from the table": dict(good, beam_workspace_destroy=(ctypes.c_int, [p])),
    }
    for words, table in cases.items():
        faults = prototype_faults(header, lib, table)
        assert len(faults) == 1 and words in faults[0], (words, faults)


def test_a_broken_table_is_caught(header, lib):
    """The check itself on copies of BeamOps, each with one mistake."""
    fields = list(lib.BeamOps._fields_)
    at = {name: i for i, (name, _) in enumerate(fields)}
    fin = dict(fields)["moe_finalize"]
    i32 = ctypes.c_int32

    def changed(name, t):
        out = list(fields)
        out[at[name]] = (name, t)
        return out

    def swapped(a, b):
        out = list(fields)
        out[at[a]], out[at[b]] = out[at[b]], out[at[a]]
        return out

    cases = [
        ("moe_finalize: 9 parameters", changed("moe_finalize", ctypes.CFUNCTYPE(fin._restype_, *fin._argtypes_[:-1]))),
        ("moe_finalize: parameter 2 is c_int32", changed(
            "moe_finalize", ctypes.CFUNCTYPE(fin._restype_, *(fin._argtypes_[:2] + (i32,) + fin._argtypes_[3:])))),
        ("workspace_config_default: the result is c_int32", changed("workspace_config_default",
                                                                    ctypes.CFUNCTYPE(i32))),
        ("last_error is c_void_p, not a ctypes.CFUNCTYPE", changed("last_error", ctypes.c_void_p)),
        ("workspace_destroy has the ctypes flags",
         changed("workspace_destroy", ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p))),
        ("BeamOps.size is c_int64", changed("size", ctypes.c_int64)),
        ("has the fields", swapped("workspace_destroy", "workspace_info")),
        ("has the fields", [f for f in fields if f[0] != "moe_finalize_gather_norm_residual_norm"]),
    ]
    for words, broken in cases:
        stand_in = types.SimpleNamespace(**vars(lib))
        stand_in.BeamOps = type("BeamOps", (ctypes.Structure,), {"_fields_": broken})
        faults = structure_faults(header, stand_in)
        assert len(faults) == 1 and words in faults[0], (words, faults)


def test_the_header_style_is_read():
    """The parser on a small header of the same style (comments, macros,
    multi-line declarations, pointers written either way, function types,
    a table of function pointers)."""
    h = Header("""
        #define BEAM_API __attribute__((visibility("default")))
        #define LONG_MACRO(x) \\
            (x)
        #define BEAM_T_VERSION 3
        /* a comment with BEAM_API beam_fake(void); inside */
        typedef enum beam_e { A = 0, B, C = 7 } beam_e;
        typedef struct beam_s { const uint16_t *w; /* x */ float eps; } beam_s;
        typedef struct beam_o beam_o;
        BEAM_API const char *beam_a(beam_e e);
        BEAM_API beam_e beam_b(
            const uint16_t* x, int64_t n,   // rows
            beam_o **out, const beam_s *s);
        BEAM_API beam_s beam_c(void);
        typedef beam_e beam_d_fn(
            beam_o *o, uint32_t n);
        BEAM_API beam_d_fn beam_d;
        typedef struct beam_t {
            uint32_t version;
            const char *(*msg)(void);
            beam_d_fn *d;
        } beam_t;
    """)
    assert h.enums == {"beam_e": {"A": 0, "B": 1, "C": 7}}
    assert h.structs == {
        "beam_s": [("w", ("uint16_t", 1)), ("eps", ("float", 0))],
        "beam_t": [("version", ("uint32_t", 0)), ("msg", ("beam_t.msg", 1)), ("d", ("beam_d_fn", 1))],
    }
    assert h.opaque == {"beam_o"}
    assert h.defines == {"BEAM_T_VERSION": 3}
    assert h.fntypes == {
        "beam_d_fn": (("beam_e", 0), [("beam_o", 1), ("uint32_t", 0)]),
        "beam_t.msg": (("char", 1), []),
    }
    assert h.functions == {
        "beam_a": (("char", 1), [("beam_e", 0)]),
        "beam_b": (("beam_e", 0), [("uint16_t", 1), ("int64_t", 0), ("beam_o", 2), ("beam_s", 1)]),
        "beam_c": (("beam_s", 0), []),
        "beam_d": (("beam_e", 0), [("beam_o", 1), ("uint32_t", 0)]),
    }
    with pytest.raises(AssertionError, match="a typedef this test cannot read"):
        Header("typedef int (*beam_cb)(void);")


# ---- where the libraries come from ----------------------------------------------------------------

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
