#!/bin/sh
# perf-report.sh - the generated parts of docs/PERF.md and README.md (the
# tables between perf-report markers) and the plots in docs/perf/ are what
# the benchmark runs in docs/perf/*.json give: scripts/perf-report.py
# --check, which writes nothing. Exit 77 (skip) without python3.
srcdir=${top_srcdir:-.}
if ! command -v python3 >/dev/null 2>&1; then
    echo "SKIP: no python3"
    exit 77
fi
exec python3 "$srcdir/scripts/perf-report.py" --check --root "$srcdir"
