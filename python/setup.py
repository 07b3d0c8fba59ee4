"""setup.py - the package, with the C libraries that `make` built inside it.

`pip install ./python` (from the top of a build tree, after `make`) copies
the libraries of the build tree's .libs/ into the package as beammoe/_libs/,
under their sonames: libbeammoe.so.0 (the dispatcher), libbeammoe_cpu.so.0
and every other backend library the build made, libbeammoe_cuda.so.0 when
the CUDA backend was built (".so.0": the
ABI of configure.ac, whose copy in beammoe/_lib.py configure checks, and
which this file reads from there), and the `beammoe` tool as
beammoe/_libs/beammoe-tool, which beammoe.audit_file runs, and always (with
BEAMMOE_BUNDLE=0 too) the source tree's lib/quant_forms.def, the C
library's list of quantized forms from which the package derives their
layouts (beammoe/_forms.py), as beammoe/_libs/quant_forms.def. The dispatcher
finds its backends beside itself, so the installed package works from any
directory with no environment variable. The wheel is tagged
py3-none-PLATFORM: it carries native libraries for this platform but holds
no Python extension module, so any Python 3 takes it.

Environment, at install time:
  BEAMMOE_BUILD_DIR=DIR  the build tree (default: the directory above this
                         file, i.e. an in-tree build); for VPATH builds
  BEAMMOE_BUNDLE=0       install without the libraries: the package then
                         finds an installed libbeammoe through pkg-config or
                         the system loader (see beammoe/_lib.py)
"""
import glob
import os
import re
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def _so_suffix():
    """SO_SUFFIX of beammoe/_lib.py, read as text (importing the package
    would import torch)."""
    with open(os.path.join(HERE, "beammoe", "_lib.py"), encoding="utf-8") as f:
        m = re.search(r'^SO_SUFFIX = "(\.so\.[0-9]+)"$', f.read(), re.M)
    if m is None:
        raise SystemExit("beammoe: no SO_SUFFIX = \".so.N\" line in beammoe/_lib.py")
    return m.group(1)


SO_SUFFIX = _so_suffix()
# the dispatcher and the CPU backend always; every other backend library
# (libbeammoe_<name>, lib/backends.def) that the build made
REQUIRED = ("libbeammoe" + SO_SUFFIX, "libbeammoe_cpu" + SO_SUFFIX)
# the list of quantized forms, in the source tree above this directory
FORMS = os.path.join(os.path.dirname(HERE), "lib", "quant_forms.def")


def _tool(build):
    """[the build tree's `beammoe` binary]: tools/.libs/beammoe behind libtool's
    wrapper script tools/beammoe, or tools/beammoe itself; [] when not built."""
    for p in (os.path.join(build, "tools", ".libs", "beammoe"), os.path.join(build, "tools", "beammoe")):
        if os.path.isfile(p):
            with open(p, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    return [p]
    return []


def _libraries():
    """[(path in the build tree, name in the package)]; [] with BEAMMOE_BUNDLE=0."""
    if os.environ.get("BEAMMOE_BUNDLE", "1") == "0":
        return []
    build = os.path.abspath(os.environ.get("BEAMMOE_BUILD_DIR") or os.path.dirname(HERE))
    libs = os.path.join(build, ".libs")
    names = set(REQUIRED) | {os.path.basename(p) for p in glob.glob(os.path.join(libs, "libbeammoe_*" + SO_SUFFIX))}
    found = [(os.path.realpath(os.path.join(libs, n)), n) for n in sorted(names)
             if os.path.exists(os.path.join(libs, n))]
    found += [(tool, "beammoe-tool") for tool in _tool(build)]
    missing = [n for n in REQUIRED if n not in [name for _, name in found]]
    if missing:
        raise SystemExit(
            "beammoe: %s not found in %s: build the libraries first (./configure && make in %s), or set "
            "BEAMMOE_BUILD_DIR to the build tree, or BEAMMOE_BUNDLE=0 to install without them (then an "
            "installed libbeammoe is used)" % (", ".join(missing), libs, build))
    for path, name in found:
        with open(path, "rb") as f:
            if b"libasan.so" in f.read():
                raise SystemExit("beammoe: %s is built with AddressSanitizer (configure --enable-sanitizers); "
                                 "python cannot load it: install from a build without sanitizers" % path)
    return found


class BuildPyWithLibraries(build_py):
    """build_py, then the list of forms and the libraries into beammoe/_libs/
    of the build directory (never into the source tree)."""

    def run(self):
        super().run()
        dest = os.path.join(self.build_lib, "beammoe", "_libs")
        if os.path.isdir(dest):
            shutil.rmtree(dest)  # no library left over from an earlier build
        if not os.path.isfile(FORMS):
            raise SystemExit("beammoe: %s not found: install the package from the source tree (its python/ "
                             "directory), whose lib/quant_forms.def lists the quantized forms" % FORMS)
        libs = _libraries()
        os.makedirs(dest)
        shutil.copyfile(FORMS, os.path.join(dest, "quant_forms.def"))
        self.announce("beammoe: carrying %s as beammoe/_libs/quant_forms.def" % FORMS, level=2)
        for src, name in libs:
            shutil.copyfile(src, os.path.join(dest, name))
            os.chmod(os.path.join(dest, name), 0o755)
            self.announce("beammoe: carrying %s as beammoe/_libs/%s" % (src, name), level=2)


class BinaryDistribution(Distribution):
    """Native libraries inside: a platform wheel, installed in platlib."""

    def has_ext_modules(self):
        return os.environ.get("BEAMMOE_BUNDLE", "1") != "0"


try:  # setuptools >= 70.1 carries bdist_wheel; older ones take it from `wheel`
    from setuptools.command.bdist_wheel import bdist_wheel as _bdist_wheel
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel as _bdist_wheel
    except ImportError:
        _bdist_wheel = None

CMDCLASS = {"build_py": BuildPyWithLibraries}

if _bdist_wheel is not None:
    class BdistWheel(_bdist_wheel):
        """py3-none-PLATFORM: the wheel holds no Python extension module (any
        Python 3 loads it through ctypes), only native libraries for this
        platform; without them (BEAMMOE_BUNDLE=0) it is py3-none-any."""

        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = not self.distribution.has_ext_modules()

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    CMDCLASS["bdist_wheel"] = BdistWheel


setup(cmdclass=CMDCLASS, distclass=BinaryDistribution)
