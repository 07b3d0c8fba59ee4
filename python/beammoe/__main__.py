"""python3 -m beammoe COMMAND ... (and `beammoe`, the wheel's script): the C
tool `beammoe` carried in the package (beammoe/_libs/beammoe-tool), with its
commands, options, output and exit statuses (docs/tool.md):
`python3 -m beammoe audit --quick`, `python3 -m beammoe run --tokens 8 ...`.

`python3 -m beammoe audit FILE.safetensors [--backend cpu|cuda|all]` (a
file named without --input) is beammoe.audit_file: the tool's audit of the
file with only the named backends visible; its output and exit status are
passed through: 0 when every row matches, 1 on a mismatch or an error row (or
a backend asked for that cannot run here), 2 for a file that cannot be used.
"""
import argparse
import os
import sys


def _audit_file(argv):
    ap = argparse.ArgumentParser(prog="python3 -m beammoe audit", description="audit the problem in a "
                                 "safetensors file (docs/safetensors.md)")
    ap.add_argument("file", help="FILE.safetensors")
    ap.add_argument("--backend", choices=("cpu", "cuda", "all"), default="all",
                    help="backends to run (all: cpu, and cuda when it runs here)")
    args = ap.parse_args(argv)

    from .audit import audit_file
    try:
        report = audit_file(args.file, args.backend)
    except (ValueError, RuntimeError) as e:
        print("beammoe audit: %s" % e, file=sys.stderr)
        return 2 if isinstance(e, ValueError) else 1
    sys.stderr.write(report.stderr)  # the tool's notes and messages
    try:  # a write error on the standard output fails the run, as the C tool's does
        sys.stdout.write(report.text)
        sys.stdout.flush()
    except OSError as e:
        print("beammoe audit: write error on the standard output: %s" % e.strerror, file=sys.stderr)
        return 1
    return 0 if report.ok else 1


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if len(argv) >= 2 and argv[0] == "audit" and not argv[1].startswith("-"):
        return _audit_file(argv[1:])
    from .audit import find_tool
    try:
        tool, env = find_tool()
    except RuntimeError as e:
        print("beammoe: %s" % e, file=sys.stderr)
        return 1
    sys.stdout.flush()
    os.execve(tool, ["beammoe"] + argv, dict(os.environ, **env))
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
