#!/bin/sh
# ptxas-regs.sh - what ptxas gave each row kernel (gpu/launch_*.cu) (registers,
# stack frame, spill stores and loads), against a recorded list.
#
# Why: the kernels' speed can move with their register allocation alone.
# An H200's decode finalize went from 1.82 to 2.04 us when two predicates
# of a kernel's PTX came out in the other order after a source change that
# did not change its operations (docs/PERF.md); ptxas had allocated 72
# registers instead of 80. This list shows such a change at build time,
# before a GPU run.
#
# usage: ptxas-regs.sh LOG RECORD TOOLKIT [update]
#   LOG      the output of nvcc -Xptxas -v for bench/sweep_launch.cu (every row kernel)
#   RECORD   the recorded list (gpu/ptxas-regs.txt)
#   TOOLKIT  nvcc's version line (the list holds for that toolkit only)
#   update   write the list from LOG instead of comparing
# Run by `make ptxas-regs` (PTXAS_UPDATE=update to record) and by
# scripts/gpu-check.sh. Exit 0: the same; 1: kernels changed (listed);
# 77: the list was recorded with another toolkit (nothing compared).
log=$1 record=$2 toolkit=$3 mode=$4
test -r "$log" || { echo "ptxas-regs.sh: no log $log" >&2; exit 2; }
now=$(mktemp) || exit 2
trap 'rm -f "$now"' EXIT
awk '
/Compiling entry function/ { name = $0; sub(/.*entry function ./, "", name); sub(/. for .*/, "", name) }
/bytes stack frame/ { n = split($0, f, /[ ,]+/); for (i = 1; i + 3 <= n; i++) {
    if (f[i + 1] == "bytes" && f[i + 2] == "stack") st = f[i]
    if (f[i + 1] == "bytes" && f[i + 3] == "stores") ss = f[i]
    if (f[i + 1] == "bytes" && f[i + 3] == "loads") sl = f[i] } }
/Used [0-9]+ registers/ { r = $0; sub(/.*Used /, "", r); sub(/ registers.*/, "", r)
    printf "%s regs=%s stack=%s spill=%s/%s\n", name, r, st, ss, sl }
' "$log" | sort > "$now"
if test ! -s "$now"; then
    echo "ptxas-regs.sh: no kernel found in $log (was it nvcc -Xptxas -v?)" >&2
    exit 2
fi
if test "$mode" = update; then
    { echo "# toolkit: $toolkit"; cat "$now"; } > "$record"
    echo "ptxas-regs.sh: recorded $(wc -l < "$now") kernels in $record"
    exit 0
fi
if test "$(head -1 "$record")" != "# toolkit: $toolkit"; then
    echo "ptxas-regs.sh: $record was recorded with $(head -1 "$record" | cut -c12-), this is $toolkit: not compared"
    exit 77
fi
if tail -n +2 "$record" | cmp -s - "$now"; then
    echo "ptxas-regs.sh: the $(wc -l < "$now") row kernels as recorded"
    exit 0
fi
echo "ptxas-regs.sh: row kernels whose allocation changed (< recorded, > now);"
echo "time them (bench/cuda_bench, bench/shape_sweep perf) before recording (make ptxas-regs PTXAS_UPDATE=update):"
tail -n +2 "$record" | diff - "$now" | grep '^[<>]' | c++filt
exit 1
