"""audit_file: the C tool's `beammoe audit --input FILE.safetensors`, run as a
child process. The tool reads the file (harness/st_header.c, st_case.c; the
format: docs/safetensors.md): the package has no file reader of its own."""
import os
import shutil
import subprocess

__all__ = ["AuditReport", "audit_file", "find_tool"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_PREFIX = "beammoe audit: "
_NOTE = _PREFIX + "note: "


def find_tool():
    """(path, environment to add) of the `beammoe` tool: $BEAMMOE_TOOL; else the
    package's beammoe/_libs/beammoe-tool (setup.py bundles it with the
    libraries); else tools/beammoe of a build tree; else `beammoe` on PATH."""
    if os.environ.get("BEAMMOE_TOOL"):
        return os.environ["BEAMMOE_TOOL"], {}
    libs = os.path.join(_HERE, "_libs")
    if os.access(os.path.join(libs, "beammoe-tool"), os.X_OK):
        ld = os.environ.get("LD_LIBRARY_PATH")
        return os.path.join(libs, "beammoe-tool"), {
            "LD_LIBRARY_PATH": libs + (os.pathsep + ld if ld else ""), "BEAM_BACKEND_DIR": libs}
    d = _HERE
    while os.path.dirname(d) != d:  # the build tree of _lib.py: the first .libs/libbeammoe.so above
        if os.path.exists(os.path.join(d, ".libs", "libbeammoe.so")):
            if os.access(os.path.join(d, "tools", "beammoe"), os.X_OK):
                return os.path.join(d, "tools", "beammoe"), {}
            break
        d = os.path.dirname(d)
    if shutil.which("beammoe"):
        return shutil.which("beammoe"), {}
    raise RuntimeError("the `beammoe` tool is not found: build the tree (make), install the "
                       "package from a built tree (pip install ./python), or set BEAMMOE_TOOL to its path")


class AuditReport:
    """The tool's answer on one file: .status (its exit status, 0 or 1), .text
    (its standard output, the table: str(report)), .stderr, .notes (its "note:"
    lines) and .ok (every row matches and every backend asked for ran)."""

    def __init__(self, path, status, text, stderr, ok):
        self.path, self.status, self.text, self.stderr, self.ok = path, status, text, stderr, ok
        self.notes = [l[len(_NOTE):] for l in stderr.splitlines() if l.startswith(_NOTE)]

    def __str__(self):
        return self.text

    def __repr__(self):
        return "AuditReport(%r, status=%d, ok=%r)" % (self.path, self.status, self.ok)


def audit_file(path, backends=None):
    """Run `beammoe audit --input path`; an AuditReport. backends: None or "all"
    (the CPU, and CUDA where it runs), "cpu", "cuda" or a list of them: the CPU
    is always the ground truth; without "cuda" the GPUs are hidden from the
    tool (CUDA_VISIBLE_DEVICES empty). ValueError: a file the tool cannot use
    (its exit status 2 and message); RuntimeError: no tool, or it failed."""
    names = ["cpu", "cuda"] if backends in (None, "all") else [backends] if isinstance(backends, str) \
        else list(backends)
    for b in names:
        if b not in ("cpu", "cuda"):
            raise ValueError("audit_file: backends: unknown backend %r (use \"cpu\", \"cuda\" or None)" % (b,))
    tool, env = find_tool()
    env = dict(os.environ, **env, **({} if "cuda" in names else {"CUDA_VISIBLE_DEVICES": ""}))
    try:
        r = subprocess.run([tool, "audit", "--input", os.fspath(path)], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True, errors="replace")
    except OSError as e:
        raise RuntimeError("cannot run %s%s: %s" % ("BEAMMOE_TOOL=" if tool == os.environ.get("BEAMMOE_TOOL")
                                                    else "", tool, e.strerror)) from None
    said = "; ".join(l[len(_PREFIX):] if l.startswith(_PREFIX) else l
                     for l in r.stderr.splitlines() if not l.startswith(_NOTE))
    if r.returncode == 2:
        raise ValueError(said or "%s exited with status 2" % tool)
    if r.returncode not in (0, 1):
        how = "was killed by signal %d" % -r.returncode if r.returncode < 0 else "exited with status %d" % r.returncode
        raise RuntimeError("%s %s%s" % (tool, how, ": " + said if said else ""))
    # a backend asked for by name must be in the tool's line "backends: cpu, cuda (why not others)"
    line = next((l for l in r.stdout.splitlines() if l.startswith("backends: ")), "backends: ")
    missing = [b for b in names if backends not in (None, "all")
               and b not in line[len("backends: "):].split(" (")[0].split(", ")]
    stderr = r.stderr + "".join(_NOTE + "backend %s was asked for, but the tool cannot audit it here (its "
                                "backends line says why)\n" % b for b in missing)
    return AuditReport(path, r.returncode, r.stdout, stderr, r.returncode == 0 and not missing)
