"""python/beammoe/_lib.py's ctypes declarations against include/beammoe.h.

ctypes takes whatever _lib.py says: a prototype with a parameter too few, an
int32_t declared where the header has int64_t or a field of a struct out of
order loads and runs, and passes wrong bits to the library. This test reads
the header (its BEAM_API declarations, typedefs and enums, in the header's
own style) and checks every prototype table of _lib.py against it:

- every exported function has a prototype in _lib._PROTOTYPES, with the
  header's number of parameters and, for each parameter and the result, a
  ctypes type of the same kind (int64_t: c_int64, an enum: c_int, a struct
  by value: its ctypes.Structure, a pointer: c_void_p or a POINTER of the
  pointee's kind, const char *: c_char_p);
- _PROTOTYPES and FAST_PROTOTYPES declare no function the header lacks,
  and FAST_PROTOTYPES's entries match the header too;
- the ctypes Structures have the header's fields, in its order; the status
  and strategy constants have the header's values.

Pure Python, no torch: _lib.py (and _errors.py, which it imports) is loaded
without the package's __init__ (which imports torch). The header is the one
of the source tree around this file (python/tests/../../include); the test
skips when the tests run without the source tree.
"""
import ctypes
import importlib
import importlib.util
import os
import re
import sys
import types

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
_HEADER = os.path.normpath(os.path.join(_HERE, "..", "..", "include", "beammoe.h"))

# The C types of the header that are values (not pointers), and their ctypes.
_SCALARS = {
    "int64_t": ctypes.c_int64,
    "int32_t": ctypes.c_int32,
    "uint16_t": ctypes.c_uint16,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
    "int": ctypes.c_int,
    "char": ctypes.c_char,
}

pytestmark = pytest.mark.skipif(not os.path.exists(_HEADER),
                                reason="%s not found: the tests run without beammoe's source tree (the header "
                                       "is not installed with the package)" % _HEADER)


# ---- the header ---------------------------------------------------------------------------------

class Header:
    """What beammoe.h declares: functions {name: (ret, [params])}, enums
    {name: {constant: value}}, structs {name: [(field, type)]}, opaque
    struct names; a type is (base name, number of '*')."""

    def __init__(self, text):
        text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
        text = re.sub(r"//[^\n]*", " ", text)
        text = re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", " ", text, flags=re.M)  # directives, continued lines too
        self.enums, self.structs, self.opaque, self.functions = {}, {}, set(), {}
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
            self.structs[name] = [self.declaration(d) for d in body.split(";") if d.strip()]
        for tag, name in re.findall(r"typedef\s+struct\s+(\w+)\s+(\w+)\s*;", text):
            assert tag == name, "typedef struct %s %s: the header's style is one name" % (tag, name)
            self.opaque.add(name)
        for ret, name, params in re.findall(r"\bBEAM_API\s+([^;{}()]*?)\s*\b(\w+)\s*\(([^()]*)\)\s*;", text):
            rtype = self.declaration(ret, named=False)
            plist = [p.strip() for p in params.split(",")]
            args = [] if plist == ["void"] else [self.declaration(p)[1] for p in plist]
            assert name not in self.functions, "%s is declared twice" % name
            self.functions[name] = (rtype, args)
        # a BEAM_API the pattern above did not read (a function-pointer
        # parameter, a macro): better a failure here than a function unchecked
        assert len(self.functions) == len(re.findall(r"\bBEAM_API\b", text)), \
            "beammoe.h has a BEAM_API declaration this test cannot read"

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
        if kind == "opaque":
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
for _n in ("c_int64", "c_int32", "c_uint16", "c_float", "c_double", "c_char", "c_void_p", "c_char_p"):
    _CTYPES_NAMES.setdefault(getattr(ctypes, _n), _n)  # c_int32 is c_int, c_int64 c_long: the header's names


def _tname(t):
    if t is None:
        return "None"
    if t in _CTYPES_NAMES:
        return _CTYPES_NAMES[t]
    if hasattr(t, "_type_") and isinstance(t._type_, type):  # a POINTER(...)
        return "POINTER(%s)" % _tname(t._type_)
    return getattr(t, "__name__", repr(t))


def prototype_faults(header, lib, table, table_name, complete):
    """The faults of one prototype table of _lib.py against the header (a list
    of messages); complete: every header function must be in it."""
    faults = []
    for name in sorted(set(table) - set(header.functions)):
        faults.append("%s declares %s, which include/beammoe.h does not export" % (table_name, name))
    if complete:
        for name in sorted(set(header.functions) - set(table)):
            faults.append("%s has no prototype for %s (include/beammoe.h)" % (table_name, name))
    for name in sorted(set(table) & set(header.functions)):
        res, args = table[name]
        cret, cargs = header.functions[name]
        if res not in accepted(header, lib, cret, result=True):
            faults.append("%s[%r]: the result is %s, but the header returns %s (one of: %s)"
                          % (table_name, name, _tname(res), _show(header, cret),
                             ", ".join(_tname(t) for t in accepted(header, lib, cret, result=True))))
        if len(args) != len(cargs):
            faults.append("%s[%r]: %d parameters, but the header has %d"
                          % (table_name, name, len(args), len(cargs)))
            continue
        for i, (a, c) in enumerate(zip(args, cargs)):
            if a not in accepted(header, lib, c):
                faults.append("%s[%r]: parameter %d is %s, but the header has %s (one of: %s)"
                              % (table_name, name, i, _tname(a), _show(header, c),
                                 ", ".join(_tname(t) for t in accepted(header, lib, c))))
    return faults


def structure_faults(header, lib):
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
            if t not in accepted(header, lib, ftype):
                faults.append("%s.%s is %s, but struct %s has %s"
                              % (cls.__name__, fname, _tname(t), cname, _show(header, ftype)))
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
    with open(_HEADER, encoding="utf-8") as f:
        return Header(f.read())


@pytest.fixture(scope="module")
def lib():
    return _load_lib()


# ---- the checks -----------------------------------------------------------------------------------

def test_header_is_read(header):
    """The parser found what the header holds (an empty reading would check nothing)."""
    assert len(header.functions) >= 15, sorted(header.functions)
    assert header.functions["beam_moe_finalize"][1][2] == ("int64_t", 0)
    assert header.functions["beam_cpu_group_create"][1][1] == ("beam_cpu_group", 2)
    assert header.functions["beam_status_string"][0] == ("char", 1)
    assert "beam_status" in header.enums and "beam_strategy" in header.enums
    assert "beam_norm" in header.structs and "beam_workspace" in header.opaque


def test_every_function_has_its_prototype(header, lib):
    faults = prototype_faults(header, lib, lib._PROTOTYPES, "_PROTOTYPES", complete=True)
    assert not faults, "\n".join(faults)


def test_fast_prototypes(header, lib):
    faults = prototype_faults(header, lib, lib.FAST_PROTOTYPES, "FAST_PROTOTYPES", complete=False)
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
    res, args = good["beam_moe_finalize"]
    cases = {
        "parameters": dict(good, beam_moe_finalize=(res, args[:-1])),
        "is c_int32": dict(good, beam_moe_finalize=(res, [args[0], args[1], i32] + args[3:])),
        "the result is c_void_p": dict(good, beam_workspace_config_default=(p, [])),
        "no prototype for beam_version": {k: v for k, v in good.items() if k != "beam_version"},
        "does not export": dict(good, beam_moe_finalize_v2=(ctypes.c_int, [i64])),
        "parameter 1 is c_int64": dict(good, beam_cpu_group_create=(ctypes.c_int, [i32, i64])),
    }
    for words, table in cases.items():
        faults = prototype_faults(header, lib, table, "_PROTOTYPES", complete=True)
        assert len(faults) == 1 and words in faults[0], (words, faults)


def test_the_header_style_is_read():
    """The parser on a small header of the same style (comments, macros,
    multi-line declarations, pointers written either way)."""
    h = Header("""
        #define BEAM_API __attribute__((visibility("default")))
        #define LONG_MACRO(x) \\
            (x)
        /* a comment with BEAM_API beam_fake(void); inside */
        typedef enum beam_e { A = 0, B, C = 7 } beam_e;
        typedef struct beam_s { const uint16_t *w; /* x */ float eps; } beam_s;
        typedef struct beam_o beam_o;
        BEAM_API const char *beam_a(beam_e e);
        BEAM_API beam_e beam_b(
            const uint16_t* x, int64_t n,   // rows
            beam_o **out, const beam_s *s);
        BEAM_API beam_s beam_c(void);
    """)
    assert h.enums == {"beam_e": {"A": 0, "B": 1, "C": 7}}
    assert h.structs == {"beam_s": [("w", ("uint16_t", 1)), ("eps", ("float", 0))]}
    assert h.opaque == {"beam_o"}
    assert h.functions == {
        "beam_a": (("char", 1), [("beam_e", 0)]),
        "beam_b": (("beam_e", 0), [("uint16_t", 1), ("int64_t", 0), ("beam_o", 2), ("beam_s", 1)]),
        "beam_c": (("beam_s", 0), []),
    }
