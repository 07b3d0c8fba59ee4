"""build_backend.py - `pip install .` from the top of the repository (PEP 517).

The top pyproject.toml names this module. A wheel is made in three steps:

1. The Autotools build: in the source tree itself when it is already
   configured there (`./configure && make` of the README), otherwise in
   build/wheel/ (a VPATH tree; BEAMMOE_BUILD_DIR names another), configured
   once with configure's own detection: the CUDA backend where a CUDA
   toolkit with NCCL is found, the CPU backend only otherwise
   (BEAMMOE_CUDA=0 forces that). `make` prints each file it compiles (pip
   shows it with -v).
2. python/setup.py's wheel, carrying that build's libraries and tool
   (setuptools, run in python/).
3. The wheel made to stand alone (`repair`): every library and the tool
   find their neighbours through RUNPATH $ORIGIN alone (not the toolkit's
   folder); the
   libraries outside the manylinux policy that it needs and no CUDA
   installation provides (libgomp, json-c) are carried beside them; the
   platform tag is manylinux_X_Y_ARCH, X.Y the newest glibc symbol version
   any of them uses. The CUDA runtime and NCCL are not carried: the package
   loads them from the CUDA wheels that PyTorch installs (beammoe/_lib.py),
   or the system's. `python3 python/build_backend.py check WHEEL` checks a
   wheel this way (what auditwheel's `show` would say, in these terms).
"""
import base64
import csv
import glob
import hashlib
import io
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = os.path.join(ROOT, "python")

# The libraries every manylinux platform provides (PEP 600: the policy's
# list), and those the CUDA wheels or a CUDA installation provide.
MANYLINUX = {"libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0", "libgcc_s.so.1",
             "libstdc++.so.6", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1", "libutil.so.1", "libz.so.1"}
CUDA = re.compile(r"^lib(cuda|cudart|nccl)\.so\.\d+$")


def _say(msg):
    print("beammoe build: " + msg, file=sys.stderr, flush=True)


def _run(cmd, cwd):
    _say("%s (in %s)" % (" ".join(cmd), cwd))
    subprocess.run(cmd, cwd=cwd, check=True)


def autotools():
    """Configure (once) and make; the build tree's path."""
    if os.path.exists(os.path.join(ROOT, "config.status")):
        build = ROOT  # configured in the source tree: a VPATH tree is refused beside it
    else:
        build = os.path.abspath(os.environ.get("BEAMMOE_BUILD_DIR") or os.path.join(ROOT, "build", "wheel"))
    if not os.path.exists(os.path.join(ROOT, "configure")):
        _run(["autoreconf", "-fi"], ROOT)
    if not os.path.exists(os.path.join(build, "config.status")):
        os.makedirs(build, exist_ok=True)
        args = [os.path.join(ROOT, "configure")]
        if os.environ.get("BEAMMOE_CUDA") == "0":
            args.append("--without-cuda")
        _run(args, build)
    _run(["make", "-j%d" % (os.cpu_count() or 2)], build)
    return build


# ---- the wheel's ELF files ----------------------------------------------------

def _elf_dynamic(data):
    """(NEEDED names, (file offset, length) of the RUNPATH or RPATH string or
    None) of a 64-bit little-endian ELF file's bytes."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dyn = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 1:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:
            dyn = (p_offset, p_filesz)
    if dyn is None:
        return [], None

    def at(vaddr):
        for v, o, n in loads:
            if v <= vaddr < v + n:
                return vaddr - v + o
        raise ValueError("address %#x outside the file" % vaddr)

    entries = []
    for off in range(dyn[0], dyn[0] + dyn[1], 16):
        tag, val = struct.unpack_from("<qQ", data, off)
        if tag == 0:
            break
        entries.append((tag, val))
    strtab = at(next(v for t, v in entries if t == 5))

    def string(i):  # (file offset, length) of the string at i
        return strtab + i, data.index(b"\0", strtab + i) - strtab - i

    needed = [data[o:o + n].decode() for o, n in (string(v) for t, v in entries if t == 1)]
    path = [string(v) for t, v in entries if t in (15, 29)]  # DT_RPATH, DT_RUNPATH
    return needed, path[0] if path else None


def _set_origin(path):
    """RUNPATH $ORIGIN alone (Makefile.am links every library and the tool
    with $ORIGIN first; the CUDA backend's also names the toolkit's folder),
    written over the old string."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    _, where = _elf_dynamic(bytes(data))
    if where is None:
        raise SystemExit("beammoe: %s has no RUNPATH: it was linked before Makefile.am gave it $ORIGIN "
                         "(make clean && make in the build tree)" % path)
    off, n = where
    new = b"$ORIGIN"
    if n < len(new):
        raise ValueError("%s: its RUNPATH is shorter than $ORIGIN" % path)
    data[off:off + n] = new + b"\0" * (n - len(new))
    with open(path, "wb") as f:
        f.write(data)


def _glibc(data):
    """The newest GLIBC_X.Y symbol version the file names, as (X, Y)."""
    found = [tuple(map(int, m)) for m in re.findall(rb"GLIBC_(\d+)\.(\d+)\0", data)]
    return max(found) if found else (2, 17)


def _system_path(soname):
    """Where this host's loader finds soname for this machine (ldconfig's
    cache: "\tlibgomp.so.1 (libc6,x86-64) => /lib/.../libgomp.so.1"), or None."""
    mark = {"x86_64": "x86-64", "aarch64": "AArch64"}.get(_arch(), _arch())
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return None
    for line in out.splitlines():
        name, _, where = line.partition("=>")
        if name.split() and name.split()[0] == soname and mark in name:
            return where.strip()
    return None


def _elf_files(folder):
    """(name, path, bytes) of each ELF file in the folder, by name."""
    for name in sorted(os.listdir(folder)):
        p = os.path.join(folder, name)
        with open(p, "rb") as f:
            data = f.read()
        if data[:4] == b"\x7fELF":
            yield name, p, data


def libs_status(libs):
    """(NEEDED outside the policy and not carried, newest glibc (X, Y)) of the
    ELF files in the folder libs."""
    missing, newest = set(), (2, 17)
    present = set(os.listdir(libs))
    for _, _, data in _elf_files(libs):
        needed, _ = _elf_dynamic(data)
        newest = max(newest, _glibc(data))
        missing |= {n for n in needed if n not in MANYLINUX and n not in present and not CUDA.match(n)}
    return sorted(missing), newest


def _arch():
    m = os.uname().machine
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def _record_row(root, rel):
    with open(os.path.join(root, rel), "rb") as f:
        data = f.read()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [rel, "sha256=" + digest, str(len(data))]


def repair(wheel):
    """Make the wheel stand alone (above); its new path."""
    tmp = tempfile.mkdtemp(prefix="beammoe-wheel-")
    try:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tmp)
            modes = {i.filename: i.external_attr >> 16 for i in z.infolist()}  # extractall drops them
        libs = os.path.join(tmp, "beammoe", "_libs")
        tag = "any"
        if os.path.isdir(libs):
            for _, p, _ in _elf_files(libs):
                _set_origin(p)
            missing, _ = libs_status(libs)
            for soname in missing:
                src = _system_path(soname)
                if src is None:
                    raise SystemExit("beammoe: %s, which the libraries need, is not found on this host "
                                     "(ldconfig -p)" % soname)
                _say("carrying %s as beammoe/_libs/%s" % (src, soname))
                shutil.copyfile(src, os.path.join(libs, soname))
                os.chmod(os.path.join(libs, soname), 0o755)
            missing, newest = libs_status(libs)
            if missing:
                raise SystemExit("beammoe: the wheel would need %s from the host" % ", ".join(missing))
            tag = "manylinux_%d_%d_%s" % (newest[0], newest[1], _arch())
        info = glob.glob(os.path.join(tmp, "*.dist-info"))[0]
        with open(os.path.join(info, "WHEEL")) as f:
            lines = [l for l in f.read().splitlines() if not l.startswith("Tag:")]
        lines.append("Tag: py3-none-%s" % tag)
        with open(os.path.join(info, "WHEEL"), "w") as f:
            f.write("\n".join(lines) + "\n")
        record = os.path.relpath(os.path.join(info, "RECORD"), tmp)
        rows = []
        for d, _, files in os.walk(tmp):
            for n in sorted(files):
                rel = os.path.relpath(os.path.join(d, n), tmp)
                if rel != record:
                    rows.append(_record_row(tmp, rel))
        rows.append([record, "", ""])
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows)
        with open(os.path.join(tmp, record), "w") as f:
            f.write(buf.getvalue())
        head = os.path.basename(wheel).split("-")[:3]  # name, version, python tag
        out = os.path.join(os.path.dirname(wheel), "-".join(head + ["none", tag]) + ".whl")
        os.remove(wheel)
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            for rel, _, _ in rows:
                info = zipfile.ZipInfo.from_file(os.path.join(tmp, rel), rel)
                info.external_attr = (modes.get(rel) or 0o100755) << 16  # a carried library: a file, 0755
                info.compress_type = zipfile.ZIP_DEFLATED
                with open(os.path.join(tmp, rel), "rb") as f:
                    z.writestr(info, f.read())
        _say("wrote %s" % out)
        return out
    finally:
        shutil.rmtree(tmp)


def check(wheel):
    """0 when the wheel's tag is what its files allow and it needs nothing
    from the host beyond the manylinux policy and CUDA; a message otherwise."""
    tmp = tempfile.mkdtemp(prefix="beammoe-check-")
    try:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tmp)
        missing, newest = libs_status(os.path.join(tmp, "beammoe", "_libs"))
        want = "manylinux_%d_%d_%s" % (newest[0], newest[1], _arch())
        tag = os.path.basename(wheel)[:-len(".whl")].split("-")[-1]
        for name, _, data in _elf_files(os.path.join(tmp, "beammoe", "_libs")):
            needed, where = _elf_dynamic(data)
            runpath = data[where[0]:where[0] + where[1]].rstrip(b"\0").decode() if where else "-"
            print("%-24s RUNPATH %-8s NEEDED %s" % (name, runpath, " ".join(needed)))
        print("glibc %d.%d: %s; tagged %s" % (newest + (want, tag)))
        if missing:
            print("needs from the host: %s" % ", ".join(missing))
        return 0 if not missing and tag == want else 1
    finally:
        shutil.rmtree(tmp)


# ---- PEP 517 hooks --------------------------------------------------------------

def _setuptools(hook, *args):
    from setuptools import build_meta
    here = os.getcwd()
    os.chdir(PY)
    try:
        return getattr(build_meta, hook)(*args)
    finally:
        os.chdir(here)


def get_requires_for_build_wheel(config_settings=None):
    return _setuptools("get_requires_for_build_wheel", config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _setuptools("prepare_metadata_for_build_wheel", os.path.abspath(metadata_directory), config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    os.environ["BEAMMOE_BUILD_DIR"] = autotools()
    wheel_directory = os.path.abspath(wheel_directory)
    name = _setuptools("build_wheel", wheel_directory, config_settings, None)
    return os.path.basename(repair(os.path.join(wheel_directory, name)))


def build_sdist(sdist_directory, config_settings=None):
    raise SystemExit("beammoe: no source distribution from here; `make dist` makes the source tarball")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "check":
        sys.exit(check(sys.argv[2]))
    print("usage: python3 python/build_backend.py check WHEEL", file=sys.stderr)
    sys.exit(2)
