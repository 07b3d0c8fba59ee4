#!/usr/bin/env python3
"""doc-examples.py - run the examples of README.md and docs/*.md as written.

Every fenced block whose info string starts with `python` or `c` is an
example; other blocks (shell transcripts, signatures, text) are not run.
A file's Python blocks run in order in one namespace, in a fresh
directory, as a reader would paste them one after the other (a block may
use what an earlier one made). Words after the language say how:

    ```python                 run here
    ```python cuda            needs a CUDA device: skipped without one
    ```python gpus=2 ...      needs two CUDA devices: skipped without them
    ```python torchrun=2      a whole program: run as 2 processes under
                              torch.distributed.run (gloo); each must exit 0
    ```c                      compiled (-c, -Wall -Werror) against include/ ($CPPFLAGS
                              first: a VPATH build's include/ has beammoe_version.h)

    python3 scripts/doc-examples.py [FILE.md ...]   (default: README.md docs/*.md)

Run by CI with the installed package (.ci/run); exit 1 if any example fails.
"""
import glob
import os
import re
import subprocess
import sys
import tempfile
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```\s*$", re.M | re.S)


def blocks(path):
    """[(line, language, options, code)] of the file's examples."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    out = []
    for m in FENCE.finditer(text):
        lang, opts = m.group(1), m.group(2).split()
        if lang in ("python", "c"):
            out.append((text.count("\n", 0, m.start()) + 1, lang, opts, m.group(3)))
    return out


def cuda_devices():
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def run_file(path, workdir):
    """(passed, skipped, failed) of one file's examples."""
    counts = [0, 0, 0]
    ns = {"__name__": "__doc_example__"}
    for line, lang, opts, code in blocks(path):
        where = "%s:%d" % (os.path.relpath(path, ROOT), line)
        try:
            if lang == "c":
                src = os.path.join(workdir, "example.c")
                with open(src, "w") as f:
                    f.write(code)
                subprocess.run([os.environ.get("CC", "cc"), "-std=c99", "-Wall", "-Werror", "-c"] +
                               os.environ.get("CPPFLAGS", "").split() + ["-I", os.path.join(ROOT, "include"), src,
                                                                         "-o", os.path.join(workdir, "example.o")],
                               check=True, capture_output=True, text=True)
            elif cuda_devices() < max([1 if o == "cuda" else int(o[5:]) for o in opts
                                       if o == "cuda" or o.startswith("gpus=")] or [0]):
                print("skip %s: needs %s" % (where, " ".join(opts)))
                counts[1] += 1
                continue
            elif any(o.startswith("torchrun=") for o in opts):
                n = [o for o in opts if o.startswith("torchrun=")][0].split("=")[1]
                prog = os.path.join(workdir, "example.py")
                with open(prog, "w") as f:
                    f.write(code)
                subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", n,
                                "--master-port", "29517", prog], check=True, capture_output=True, text=True,
                               cwd=workdir, timeout=300)
            else:
                exec(compile(code, where, "exec"), ns)
            print("ok   %s (%s%s)" % (where, lang, " " + " ".join(opts) if opts else ""))
            counts[0] += 1
        except subprocess.CalledProcessError as e:
            print("FAIL %s: %s\n%s%s" % (where, " ".join(e.cmd), e.stdout[-3000:], e.stderr[-3000:]))
            counts[2] += 1
        except Exception:  # an example's own failure
            print("FAIL %s:\n%s" % (where, traceback.format_exc(limit=-3)))
            counts[2] += 1
    return counts


def main(argv):
    files = argv or [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    total = [0, 0, 0]
    for path in files:
        with tempfile.TemporaryDirectory() as d:
            here = os.getcwd()
            os.chdir(d)
            try:
                counts = run_file(os.path.abspath(os.path.join(here, path)), d)
            finally:
                os.chdir(here)
        total = [a + b for a, b in zip(total, counts)]
    print("doc examples: %d passed, %d skipped (for want of GPUs), %d failed" % tuple(total))
    return 1 if total[2] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
