"""python3 -m beammoe audit FILE.safetensors [--backend cpu|cuda|all]

The Python equivalent of `beammoe audit --input FILE`: prints the table
and exits 0 when every row matches, 1 on a mismatch or a library error in
the table (or in the ground truth's call), 2 for a file that cannot be used (the message names the fault).
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

    from .audit import _escape, audit_file
    try:
        report = audit_file(args.file, None if args.backend == "all" else args.backend)
    except ValueError as e:
        print("beammoe audit: %s" % e, file=sys.stderr)
        return 2
    except RuntimeError as e:  # BeamError: the ground truth's call failed (not the file's fault)
        # the path is the caller's text: escaped like every text from the file
        print("beammoe audit: %s: %s" % (_escape(args.file), e), file=sys.stderr)
        return 1
    for n in report.notes:
        print("beammoe audit: note: %s" % n, file=sys.stderr)
    # a write error on the standard output fails the run, as the C tool's does
    try:
        print(report)
        sys.stdout.flush()
    except OSError as e:
        print("beammoe audit: write error on the standard output: %s" % e.strerror, file=sys.stderr)
        return 1
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
