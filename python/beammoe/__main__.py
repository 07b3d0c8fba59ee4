"""python3 -m beammoe audit FILE.safetensors [--backend cpu|cuda|all]

Runs the C tool's `beammoe audit --input FILE` (beammoe.audit_file) and
passes its output and exit status through: 0 when every row matches, 1 on a
mismatch or an error row (or a backend asked for that cannot run here), 2 for
a file that cannot be used (the message names the fault).
"""
import argparse
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m beammoe",
                                 description="beammoe tools over the Python package")
    sub = ap.add_subparsers(dest="command", required=True)
    a = sub.add_parser("audit", help="audit the problem in a safetensors file (docs/safetensors.md)")
    a.add_argument("file", help="FILE.safetensors")
    a.add_argument("--backend", choices=("cpu", "cuda", "all"), default="all",
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


if __name__ == "__main__":
    sys.exit(main())
