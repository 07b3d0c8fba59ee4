#!/bin/sh
# tool-json.sh - the tool's --json documents, its timing spread and its
# progress (docs/tool.md):
#   - `run --json`, `audit --json`, `bench --json` print one JSON document on
#     stdout that a strict reader parses, with the fields docs/tool.md lists
#     and the same figures as the text (checksum, summary);
#   - strings reach JSON escaped and whole: a file name with an escape
#     sequence, a newline, quotes and a right-to-left mark reads back as
#     the same name;
#   - min <= median <= max for every timing;
#   - `bench` prints each row when it is timed and a progress line per row
#     on stderr: its first row reaches a pipe while it still runs (it once
#     printed nothing for 92 s, then every row), and its text rows still
#     read with scripts/perf-report.py --import-cpu-bench.
# The bench part needs about 4 GB of memory (its 1 GiB copy buffers and
# 8192-row inputs): it is left out, with a note, on a host with less free.
# Exit 77 (skip) without python3. The parts that read a safetensors file
# are left out in a build without json-c (the JSON output itself needs no
# json-c).
src="${top_srcdir:-.}"
if ! command -v python3 >/dev/null 2>&1; then
    echo "SKIP: no python3 to read the JSON"
    exit 77
fi
. "$(dirname "$0")/tool-lib.sh"

python3 - "$tool" "$tmp" "$src/scripts/perf-report.py" <<'EOF'
import json, os, subprocess, sys, time
tool, tmp, importer = sys.argv[1:4]
fails = checks = 0

def check(ok, what, extra=""):
    global fails, checks
    checks += 1
    print(("ok:   " if ok else "FAIL: ") + what + ("" if ok or not extra else "\n    " + extra))
    fails += not ok

def tool_run(*args):
    r = subprocess.run([tool] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=600)
    return r.returncode, r.stdout, r.stderr

def doc(*args):
    """the JSON document of `beammoe ARGS --json` (strict: no NaN), or None"""
    rc, out, err = tool_run(*(list(args) + ["--json"]))
    try:
        d = json.loads(out, parse_constant=lambda c: 1 / 0)
    except Exception as e:
        check(False, "beammoe %s --json: not one JSON document (exit %d): %s" % (" ".join(args), rc, e),
              out[:300] + err[:300])
        return None, rc
    return d, rc

def spread_ok(lo, mid, hi):
    return 0 <= lo <= mid <= hi

# ---- run ----
RUN = ["run", "--iters", "5", "--tokens", "7", "--top-k", "4", "--hidden", "512", "--next-norm",
       "--scales", "0.5,2", "--routed-scale", "0.1"]
d, rc = doc(*RUN)
rc_t, text, _ = tool_run(*RUN)
if d is not None:
    want = [l.split()[1] for l in text.splitlines() if l.startswith("checksum:")]
    check(rc == 0 and d["format"] == "beammoe-run/1" and [d["checksum"]] == want,
          "run --json: exit 0, the text's checksum %s" % d["checksum"], str(d))
    t = d["time_us"]
    check(d["calls"] == 5 and spread_ok(t["min"], t["median"], t["max"]),
          "run --json: 5 calls, min %.2f <= median %.2f <= max %.2f us" % (t["min"], t["median"], t["max"]))
    check((d["op"], d["strategy"], d["tokens"], d["top_k"], d["hidden"], d["next_norm"], d["scales"],
           d["routed_scale"], d["seed"], d["input"]) == ("fused", "auto", 7, 4, 512, True, [0.5, 2], 0.1, 1, None),
          "run --json: the case as given (routed_scale 0.1 as given, not 0.10000000149)", str(d))
check(rc_t == 0 and any(l.startswith("median:") and "min" in l and "max" in l for l in text.splitlines()),
      "run: the median line has the min and the max")

# ---- run --input (json-c builds) ----
case = os.path.join(tmp, "case.safetensors")
rc, out, err = tool_run(*(RUN + ["--output", case]))
if "without json-c" in err:
    print("note: built without json-c: run --input was not tried")
else:
    d, rc = doc("run", "--iters", "3", "--input", case)
    want = [l.split()[1] for l in out.splitlines() if l.startswith("checksum:")]
    check(d is not None and rc == 0 and [d["checksum"]] == want and d["input"] == case and d["seed"] is None,
          "run --input --json: the checksum of the run that wrote the file", str(d))

# ---- audit ----
d, rc = doc("audit", "--quick")
rc_t, text, _ = tool_run("audit", "--quick")
if d is not None:
    s = d["summary"]
    line = text.splitlines()[-1]
    check(rc == 0 and s["result"] == "PASS" and line.startswith("summary: %d cases, %d rows, %d elements compared"
                                                                 % (s["cases"], s["rows"], s["compared"])),
          "audit --quick --json: exit 0, PASS, the text's summary", line + " / " + str(s))
    g = {(x["backend"], x["strategy"]): x for x in d["groups"]}
    check(d["rows"] == [] and g[("cpu", "reference")]["cases"] == s["cases"]
          and sum(x.get("cases", 0) for x in d["groups"]) == s["rows"],
          "audit --json: no rows when all match; the groups add up to the %d rows" % s["rows"])
    why = [b.get("why", "") for b in d["backends"] if not b["audited"]]
    check(d["backends"][0] == {"name": "cpu", "audited": True}
          and all(w.startswith(("not available (", "loads, but")) and "insufficient" not in w for w in why),
          "audit --json: the backends, in plain words: %s" % (why or "all audited"))
    check(isinstance(s["rounding_ties"], int) and s["rounding_ties"] > 0,
          "audit --json: %s rounding ties" % s["rounding_ties"])
d, rc = doc("audit", "--quick", "--verbose")
check(d is not None and rc == 0 and len(d["rows"]) == d["summary"]["rows"]
      and all({"case", "backend", "strategy"} <= set(r) for r in d["rows"]),
      "audit --quick --verbose --json: every row")

# a file name that a terminal would act on, in JSON: escaped, read back whole
if os.path.exists(case):
    name = os.path.join(tmp, 'x-\x1b]0;t\x07-\n-"q"-\\-\u202e-\u00e9-long-name.safetensors')
    os.link(case, name)
    d, rc = doc("audit", "--quick", "--input", name)
    raw = subprocess.run([tool, "audit", "--quick", "--input", name, "--json"], stdout=subprocess.PIPE).stdout
    check(d is not None and rc == 0 and d["input"] == name and len(d["rows"]) == d["summary"]["rows"]
          and b"\x1b" not in raw and b"\x07" not in raw,
          "audit --input --json: the file name reads back whole, nothing raw on stdout", repr(d and d["input"]))

# ---- bench ----
avail = 0
for l in open("/proc/meminfo") if os.path.exists("/proc/meminfo") else []:
    if l.startswith("MemAvailable:"):
        avail = int(l.split()[1]) * 1024
if avail < 6 << 30:
    print("note: %.1f GB of memory available, the bench needs about 4: its part was not tried" % (avail / 1e9))
else:
    # text into a pipe: the first row arrives while the bench still runs
    p = subprocess.Popen([tool, "bench", "--min-time", "0", "--tokens", "1", "--config", "1,4"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    lines, running = [], None
    for l in p.stdout:
        lines.append(l)
        if running is None and l.lstrip().startswith("1  fused next"):
            running = p.poll() is None
    err = p.stderr.read()
    p.wait()
    check(p.returncode == 0 and running, "bench | reader: the first row arrives while the bench runs",
          "".join(lines) + err)
    check("row 2 of 2 (T=1 finalize)" in err, "bench: a progress line per row on stderr", err)
    check(any(l.startswith("spread of each row's timed calls") for l in lines), "bench: the spread table")
    text = os.path.join(tmp, "bench.txt")
    open(text, "w").write("".join(lines))
    if os.path.exists(importer):
        r = subprocess.run([sys.executable, importer, "--import-cpu-bench", text, "--json",
                            os.path.join(tmp, "bench.json")], stderr=subprocess.PIPE, universal_newlines=True)
        recs = json.load(open(os.path.join(tmp, "bench.json")))["records"] if r.returncode == 0 else []
        # the path column names the row kernels that ran ("... next-norm",
        # "portable loops" with -DBEAM_SCALAR_ROWS): read whole, not parsed
        check([(x["config"], x["T"]) for x in recs] == [("fused next", 1), ("finalize", 1)]
              and all(x["path"] for x in recs),
              "bench: its text rows still read with perf-report.py --import-cpu-bench", r.stderr)
    d, rc = doc("bench", "--min-time", "0", "--tokens", "1", "--config", "9")
    if d is not None:
        r = d["rows"]
        check(rc == 0 and d["format"] == "beammoe-bench/1" and len(r) == 1 and r[0]["config"] == "nrn next fp8"
              and spread_ok(r[0]["us_min"], r[0]["us"], r[0]["us_max"]) and r[0]["calls"] >= 5
              and d["memcpy_gbs"] > 0 and d["min_time_s"] == 0,
              "bench --json: one row, min <= median <= max, the host's figures", str(d))

print("%d checks, %d failed" % (checks, fails))
sys.exit(1 if fails else 0)
EOF
