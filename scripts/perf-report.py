#!/usr/bin/env python3
"""perf-report.py - docs/PERF.md's tables, README.md's headline table and the
plots in docs/perf/, all from the benchmarks' JSON files in docs/perf/.

    scripts/perf-report.py                 rewrite the generated parts
    scripts/perf-report.py --check         exit 1 if a generated part differs
                                           from what the JSON gives (nothing written)
    scripts/perf-report.py --import-cpu-bench BENCH.txt --json OUT.json [--commit C] [--date D]
                                           `tools/beammoe bench` output as JSON

Inputs: every docs/perf/*.json, one benchmark run each, as written by
`bench/cuda_bench --json`, `bench/torch_compare.py --json`,
`bench/fp8_compare.py --json` or `--import-cpu-bench`:

    {"format": "beammoe-perf/1", "tool": "cuda_bench", "date": ..., "commit": ...,
     "hardware": ..., "software": ..., "command": ..., "copy_gbs": ...,
     "records": [{"op": ..., "config": ..., "T": ..., "H": ..., "K": ..., "mode": ...,
                  "us": ..., "bytes": ..., "floor_pct": ..., ...}, ...]}

A tool's rows may come from several files (one per call); the same row
(tool, op, config, form, T, H, mode) in two files is an error, so a
contributor replaces a tool's files rather than adding to them.

Outputs: the text between `<!-- perf-report:begin NAME -->` and
`<!-- perf-report:end NAME -->` in docs/PERF.md and README.md, and the SVG
files of PLOTS in docs/perf/. The same JSON gives the same bytes. Plain
Python 3, no third-party module.

Exit status: 0 done (or, with --check, everything current); 1 --check found
a stale part; 2 bad usage, unreadable or inconsistent JSON, missing markers.
"""
import argparse
import datetime
import difflib
import glob
import json
import math
import os
import re
import subprocess
import sys

FORMAT = "beammoe-perf/1"
TOOLS = ("cuda_bench", "torch_compare", "fp8_compare", "cpu_bench")
MONTHS = "Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split()
DECODE_T = 64  # T <= this is decode: times only, no fraction of the floor
HEAD_H = 7168  # the hidden size of the headline numbers and the plots


class Fail(Exception):
    """A message for stderr, exit status 2."""


# ---- reading ----------------------------------------------------------------------

def json_text(run):
    """run as JSON text, one line a record (sorted keys: the same run, the same bytes)."""
    head = "".join(" %s: %s,\n" % (json.dumps(k), json.dumps(run[k], sort_keys=True)) for k in sorted(run) if k != "records")
    rows = ",\n".join("  " + json.dumps(r, sort_keys=True) for r in run["records"])
    return "{\n%s \"records\": [\n%s\n ]\n}\n" % (head, rows)

def load_runs(perf_dir):
    """tool -> list of runs (file order), each run's records tagged with its file."""
    runs = {t: [] for t in TOOLS}
    seen = {}
    for path in sorted(glob.glob(os.path.join(perf_dir, "*.json"))):
        name = os.path.basename(path)
        try:
            with open(path) as f:
                run = json.load(f)
        except (OSError, ValueError) as e:
            raise Fail("%s: %s" % (path, e))
        if not isinstance(run, dict) or run.get("format") != FORMAT:
            raise Fail("%s: not a %s file (its \"format\")" % (path, FORMAT))
        if run.get("tool") not in TOOLS:
            raise Fail("%s: \"tool\" must be one of %s" % (path, ", ".join(TOOLS)))
        for key in ("date", "hardware", "command", "records"):
            if key not in run:
                raise Fail("%s: no \"%s\"" % (path, key))
        run["file"] = name
        for r in run["records"]:
            for key in ("op", "config", "T", "H", "mode", "us"):
                if key not in r:
                    raise Fail("%s: a record without \"%s\": %s" % (path, key, json.dumps(r, sort_keys=True)))
            key = (run["tool"], r["op"], r["config"], r.get("form"), r["T"], r["H"], r["mode"])
            if key in seen:
                raise Fail("%s and %s both hold %s T=%s H=%s %s: keep one run of each row" % (
                    seen[key], name, " ".join(str(k) for k in key[:4] if k), r["T"], r["H"], r["mode"]))
            seen[key] = name
        runs[run["tool"]].append(run)
    return runs


def records(runs, tool, **match):
    """Every record of a tool whose fields equal match's, in file order."""
    return [r for run in runs[tool] for r in run["records"] if all(r.get(k) == v for k, v in match.items())]


def ordered(values):
    """Distinct values in order of first appearance."""
    return list(dict.fromkeys(values))


# ---- text ------------------------------------------------------------------------

def date_text(d):
    """'2026-12-03' or '2026-12-03T08:25:00Z' -> '3 Dec 2026' (with the time when given)."""
    m = re.match(r"^(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2}))?", d or "")
    if not m:
        return d or "date unknown"
    text = "%d %s %s" % (int(m.group(3)), MONTHS[int(m.group(2)) - 1], m.group(1))
    return text + (" %s:%s UTC" % (m.group(4), m.group(5)) if m.group(4) else "")


def provenance(run, link_prefix):
    """One line: which command, when, which library, which hardware, from which file."""
    parts = ["`%s`" % run["command"], date_text(run["date"]),
             "commit %s" % run["commit"] if run.get("commit") else "commit not recorded",
             run["hardware"]]
    if run.get("software"):
        parts.append(run["software"])
    if run.get("copy_gbs"):
        parts.append("copy %s GB/s" % num(run["copy_gbs"], 2 if run["copy_gbs"] < 100 else 1))
    line = "; ".join(parts) + " ([%s](%s%s))" % (run["file"], link_prefix, run["file"])
    return line + (". %s%s." % (run["note"][:1].upper(), run["note"][1:]) if run.get("note") else ".")


def num(x, places):
    """A number with at most `places` decimals, trailing zeros dropped."""
    text = "%.*f" % (places, x)
    return text.rstrip("0").rstrip(".") if "." in text else text


def md_table(header, rows, align):
    """A Markdown table; align: one of 'l', 'r' per column."""
    rule = ["---" if a == "l" else "--:" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def shape_label(t, h):
    return "T = %d" % t if h == HEAD_H else "T = %d, H = %d" % (t, h)


def pct(x):
    return "%.1f%%" % x


def grid(first, recs, label, cell, order=None, last=None):
    """A Markdown table of recs: a row per label(r) (in order of appearance,
    sorted by order(label) if given), a column per (T, H) (every T at HEAD_H,
    then the other hidden sizes), cell(r) or "-"; last: (header, fn(label)),
    a left-aligned column after them."""
    shapes = sorted({(r["T"], r["H"]) for r in recs}, key=lambda s: (s[1] != HEAD_H, -s[1], s[0]))
    cells = {(label(r), r["T"], r["H"]): r for r in recs}
    labels = sorted(ordered(label(r) for r in recs), key=order) if order else ordered(label(r) for r in recs)
    rows = [[lb] + [cell(cells[(lb, t, h)]) if (lb, t, h) in cells else "-" for t, h in shapes]
            + ([last[1](lb)] if last else []) for lb in labels]
    return md_table([first] + [shape_label(t, h) for t, h in shapes] + ([last[0]] if last else []), rows,
                    ["l"] + ["r"] * len(shapes) + (["l"] if last else []))


def section(runs, tool, recs, prose, table, bullet="", sep="\n"):
    """A tool's generated text: each run's provenance, the prose, the table."""
    if not recs:
        return "(no `%s` JSON in docs/perf/)" % tool
    return "\n".join([sep.join(bullet + provenance(run, "perf/") for run in runs[tool]), "", prose, "", table])


# ---- the generated sections --------------------------------------------------------

def sec_cuda_bench(runs):
    recs = records(runs, "cuda_bench", mode="cold")
    hot = {(r["config"], r["T"], r["H"]): r for r in records(runs, "cuda_bench", mode="hot")}

    def cell(r):
        if r["T"] > DECODE_T and r.get("floor_pct") is not None:
            return "%.2f (%s)" % (r["us"], pct(r["floor_pct"]))
        h = hot.get((r["config"], r["T"], r["H"]))
        return "%.2f" % r["us"] + (" / %.2f" % h["us"] if h else "")
    prefill = [r["T"] for r in recs if r["T"] > DECODE_T]
    text = section(runs, "cuda_bench", recs, "Microseconds per call, K = 8, H = %d unless named. Up to T = %d: "
                   "cold / hot (hot: one buffer set every call, found in L2, as when the expert GEMM has just "
                   "written the inputs)." % (HEAD_H, DECODE_T) + (
                       " From T = %d: cold, and in parentheses the share of the copy floor that the call reaches "
                       "(its bytes at the copy bandwidth over its time)." % min(prefill) if prefill else ""),
                   grid("configuration", recs, lambda r: r["config"], cell), sep="\n\n")
    for run in [run for run in runs["cuda_bench"] if "host_check_us" in run] if recs else []:
        text += ("\n\nHost side of one call (fused op, %s): every check with its pointer attribute queries "
                 "and no launch %s us; the call with its launch recorded into a graph capture %s us "
                 "(these swing with the host's load)." % (
                     date_text(run["date"]), num(run["host_check_us"], 2), num(run["host_capture_us"], 2)))
    return text


TC_OPS = ["fused", "finalize", "nrn"]  # torch_compare's order of operations


def tc_order(label):
    op = label.split()[0]
    return TC_OPS.index(op) if op in TC_OPS else len(TC_OPS)


def sec_torch_compare(runs):
    recs = records(runs, "torch_compare", mode="cold")
    return section(runs, "torch_compare", recs,
                   "torch.compile's time over beammoe's (above 1: beammoe is faster), cold buffers, K = 8, "
                   "H = %d unless named; both times and beammoe's share of the copy floor are in the JSON "
                   "and the plot." % HEAD_H,
                   grid("configuration", recs, lambda r: "%s %s" % (r["op"], r["config"]),
                        lambda r: "%.2fx" % r["ratio"], order=tc_order), bullet="- ")


def sec_fp8_compare(runs):
    recs = records(runs, "fp8_compare")
    differ = ["%s %s T = %d, H = %d" % (r["config"], r["form"], r["T"], r["H"]) for r in recs
              if r.get("check") != "agree"]
    return section(runs, "fp8_compare", recs,
                   "Microseconds per call of the quantized form (normalized written only quantized), cold "
                   "buffers, K = 8, H = %d unless named; in parentheses the BF16 call's time over it (1.00x or "
                   "more: no slower than writing BF16) and the time of the BF16 call followed by a "
                   "torch.compile'd quantization over it. %s" % (
                       HEAD_H, "Every row's quantized bits equal the quantize-afterwards bits." if not differ
                       else "The bits **differ** from quantizing afterwards in: %s." % "; ".join(differ)),
                   grid("op, form", recs, lambda r: "%s, %s%s" % (r["config"], r["form"], "" if r["mode"] == "cold"
                                                                 else ", " + r["mode"]),
                        lambda r: "%.2f (%.2fx, %.2fx)" % (r["us"], r["ratio_bf16"], r["ratio_quant"])))


def sec_cpu_bench(runs):
    recs = records(runs, "cpu_bench")
    paths = {}
    for r in sorted(recs, key=lambda r: r["T"]):
        paths.setdefault(r["config"], []).append(r.get("path", ""))
    return section(runs, "cpu_bench", recs,
                   "Median microseconds per call, K = 8, H = 7168, cold inputs; in parentheses the share of "
                   "the memcpy bandwidth measured around that row's own calls (above 100% is possible: these "
                   "operations are mostly reads, and plain loads can outrun `memcpy`).",
                   grid("configuration", recs, lambda r: r["config"],  # every H is CPU_H = HEAD_H
                        lambda r: "%.1f (%s)" % (r["us"], pct(r["floor_pct"])),
                        last=("row kernels", lambda c: " / ".join(ordered(paths[c])))))


# (label, cuda_bench configuration, torch_compare (op, configuration))
HEADLINE = [
    ("fused op, post + next norm (the reference module's call)", "fused+post", ("fused", "post+next")),
    ("finalize", "finalize", ("finalize", "plain")),
    ("norm_residual_norm, next norm", "nrn", ("nrn", "next")),
    ("norm_residual_norm, pre + next norm", "nrn+pre", ("nrn", "pre+next")),
    ("fused op, post + next, FP8 output (group 128)", "fused+post fp8 group", None),
]
HEAD_DECODE = (1, 64)
HEAD_PREFILL = (4096, 16384)


def sec_headline(runs):
    cb = {(r["config"], r["T"]): r for r in records(runs, "cuda_bench", mode="cold", H=HEAD_H)}
    rows = []
    for label, cfg, tc in HEADLINE:
        tcr = records(runs, "torch_compare", op=tc[0], config=tc[1], mode="cold", H=HEAD_H) if tc else []
        rows.append([label] + ["%.2f us" % cb[(cfg, t)]["us"] if (cfg, t) in cb else "-" for t in HEAD_DECODE] + [
            pct(cb[(cfg, t)]["floor_pct"]) if cb.get((cfg, t), {}).get("floor_pct") is not None else "-"
            for t in HEAD_PREFILL] + ["%.2fx to %.2fx (T = %d to %d)" % (
                min(r["ratio"] for r in tcr), max(r["ratio"] for r in tcr), min(r["T"] for r in tcr),
                max(r["T"] for r in tcr)) if tcr else "-"])
    prose = []
    text = [md_table(["one H200, K = 8, H = %d" % HEAD_H] + ["T = %d" % t for t in HEAD_DECODE] +
                     ["T = %d, of the copy floor" % t for t in HEAD_PREFILL] + ["torch.compile / beammoe"],
                     rows, ["l"] + ["r"] * (len(HEAD_DECODE) + len(HEAD_PREFILL) + 1))]
    srcs = ordered("%s (%s, commit %s)" % (run["tool"], date_text(run["date"]), run.get("commit") or "unknown")
                   for tool in ("cuda_bench", "torch_compare") for run in runs[tool])
    prose.append("Cold buffers, CUDA graph replays, medians; the copy floor is a device-to-device "
                 "`cudaMemcpy` of the same bytes. From %s." % (", ".join(srcs) or "no benchmark run yet"))
    cpu = [r for r in records(runs, "cpu_bench") if r["T"] >= 1024]
    if cpu:
        run = runs["cpu_bench"][0]
        prose.append("On the CPU backend (%s, %s) every configuration runs at %s to %s of `memcpy` from "
                    "T = 1024." % (run["hardware"].split(":")[0], date_text(run["date"]),
                                   pct(min(r["floor_pct"] for r in cpu)), pct(max(r["floor_pct"] for r in cpu))))
    text += [""] + wrap_words(" ".join(prose), 76)
    return "\n".join(text)


SECTIONS = {
    "docs/PERF.md": {"cuda-bench": sec_cuda_bench, "torch-compare": sec_torch_compare,
                     "fp8-compare": sec_fp8_compare, "cpu-bench": sec_cpu_bench},
    "README.md": {"headline": sec_headline},
}
MARK = re.compile(r"<!-- perf-report:(begin|end) ([a-z0-9-]+) -->")


def fill(text, gens, runs, where):
    """text with every marked section replaced by its generated form."""
    out, pos, found = [], 0, []
    marks = list(MARK.finditer(text))
    for b, e in zip(marks[::2], marks[1::2] + [None]):
        if b.group(1) != "begin" or e is None or e.group(1) != "end" or e.group(2) != b.group(2):
            raise Fail("%s: perf-report marker '%s' without its pair" % (where, b.group(0)))
        name = b.group(2)
        if name not in gens:
            raise Fail("%s: no section named %s (known: %s)" % (where, name, ", ".join(sorted(gens))))
        if name in found:
            raise Fail("%s: section %s twice" % (where, name))
        found.append(name)
        out += [text[pos:b.end()], "\n", gens[name](runs), "\n"]
        pos = e.start()
    missing = sorted(set(gens) - set(found))
    if missing:
        raise Fail("%s: no markers for %s" % (where, ", ".join(missing)))
    return "".join(out + [text[pos:]])


# ---- SVG plots ---------------------------------------------------------------------

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf"]
PW, PH = 400, 250          # plot area of one panel
ML, MR, MT, MB = 62, 24, 34, 48  # its margins
LEG = 16                   # a legend line


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def wrap_words(text, width):
    """Lines of at most width characters (a longer word stands alone)."""
    lines, line = [], ""
    for w in text.split():
        if line and len(line) + 1 + len(w) > width:
            lines.append(line)
            line = w
        else:
            line = line + " " + w if line else w
    return lines + [line] if line else lines


def nice_step(span, n=5):
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def svg(title, subtitle, panels, ylabel, key=None):
    """panels: [(panel title, [series])], series: dict(label, color, dash, points [(x, y)], legend).
    x is tokens (log scale), y linear from 0. Deterministic text."""
    xs = sorted({x for _, ss in panels for s in ss for x, _ in s["points"]})
    ymax = max([y for _, ss in panels for s in ss for _, y in s["points"]] + [1e-9])
    step = nice_step(ymax)
    ytop = step * math.ceil(ymax / step)
    lx0, lx1 = math.log(xs[0]), math.log(xs[-1])
    pad = max((lx1 - lx0) * 0.06, 0.3)
    lx0, lx1 = lx0 - pad, lx1 + pad
    nleg = max(sum(1 for s in ss if s.get("legend", True)) for _, ss in panels)
    pw_all = ML + PW + MR
    width = pw_all * len(panels)
    per_line = int((width - ML - 10) / 6.8)  # characters of 12 px text that fit
    head = wrap_words(subtitle, per_line) + (wrap_words(key, per_line) if key else [])
    top = 42 + 16 * len(head)
    height = top + MT + PH + MB + nleg * LEG + 16
    f = lambda v: "%.1f" % v  # noqa: E731
    dash = lambda s: ' stroke-dasharray="6 4"' if s.get("dash") else ""  # noqa: E731
    grid_line = '<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#e0e0e0"/>'
    o = ['<?xml version="1.0" encoding="UTF-8"?>',
         '<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
         'font-family="DejaVu Sans, Arial, sans-serif" font-size="12">' % (width, height, width, height),
         '<title>%s</title>' % esc(title),
         '<rect x="0" y="0" width="%d" height="%d" fill="#ffffff"/>' % (width, height),
         '<text x="%d" y="22" font-size="16" font-weight="bold">%s</text>' % (ML, esc(title))]
    for i, line in enumerate(head):
        o.append('<text x="%d" y="%d" fill="#444444">%s</text>' % (ML, 42 + 16 * i, esc(line)))
    for pi, (ptitle, series) in enumerate(panels):
        x0, y0 = pi * pw_all + ML, top + MT
        X = lambda v: x0 + (math.log(v) - lx0) / (lx1 - lx0) * PW  # noqa: E731
        Y = lambda v: y0 + PH - v / ytop * PH  # noqa: E731
        o += ['<g>', '<text x="%s" y="%s" font-weight="bold">%s</text>' % (f(x0), f(y0 - 10), esc(ptitle)),
              '<rect x="%s" y="%s" width="%d" height="%d" fill="none" stroke="#999999"/>' % (f(x0), f(y0), PW, PH)]
        k = 0
        while k * step <= ytop + 1e-9:
            v = k * step
            o += [grid_line % (f(x0), f(Y(v)), f(x0 + PW), f(Y(v))),
                  '<text x="%s" y="%s" text-anchor="end">%s</text>' % (f(x0 - 6), f(Y(v) + 4), num(v, 2))]
            k += 1
        for x in xs:
            o += [grid_line % (f(X(x)), f(y0), f(X(x)), f(y0 + PH)),
                  '<text x="%s" y="%s" text-anchor="middle">%d</text>' % (f(X(x)), f(y0 + PH + 16), x)]
        o += ['<text x="%s" y="%s" text-anchor="middle">tokens T (log scale)</text>' % (
            f(x0 + PW / 2), f(y0 + PH + 34)), '<text transform="translate(%s %s) rotate(-90)" '
            'text-anchor="middle">%s</text>' % (f(x0 - 46), f(y0 + PH / 2), esc(ylabel))]
        for s in series:
            pts = sorted(s["points"])
            o.append('<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"><title>%s</title>'
                     '</polyline>' % (s["color"], dash(s), " ".join("%s,%s" % (f(X(x)), f(Y(y))) for x, y in pts),
                                      esc(s["label"])))
            for x, y in pts:
                o.append('<circle cx="%s" cy="%s" r="3" fill="%s"><title>%s, T = %d: %s</title></circle>' % (
                    f(X(x)), f(Y(y)), s["color"], esc(s["label"]), x, num(y, 2)))
        ly = y0 + PH + MB + 4
        for s in (s for s in series if s.get("legend", True)):
            o += ['<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="2"%s/>' % (
                f(x0), f(ly - 4), f(x0 + 24), f(ly - 4), s["color"], dash(s)),
                '<text x="%s" y="%s">%s</text>' % (f(x0 + 30), f(ly), esc(s["label"]))]
            ly += LEG
        o.append('</g>')
    o.append('</svg>')
    return "\n".join(o) + "\n"


def by_op(recs):
    """[(panel title, its records, their configurations)] for the op groups of CUDA_GROUPS that have records."""
    groups = [(title, [r for r in recs if r["op"] in ops]) for title, ops in CUDA_GROUPS]
    return [(title, rs, ordered(r["config"] for r in rs)) for title, rs in groups if rs]


def lines(recs, cfgs, y=lambda r: r["floor_pct"], suffix="", **kw):
    """A series per configuration (its records' (T, y)), coloured by its place in cfgs."""
    return [dict(label=c + suffix, color=PALETTE[i % len(PALETTE)], points=[
        (r["T"], y(r)) for r in recs if r["config"] == c], **kw) for i, c in enumerate(cfgs)]


def run_line(rs):
    return "; ".join(ordered("%s, commit %s, %s" % (date_text(r["date"]).split(" UTC")[0],
                                                     r.get("commit") or "unknown", r["hardware"]) for r in rs))


CUDA_GROUPS = [("finalize", ("finalize",)), ("norm_residual_norm", ("nrn",)), ("fused op", ("fused", "unfused"))]


def plot_cuda_floor(runs):
    recs = records(runs, "cuda_bench", mode="cold", H=HEAD_H)
    return recs and svg("beammoe on one GPU: share of the copy floor", "bench/cuda_bench, H = %d, K = 8, cold "
                        "buffers; " % HEAD_H + run_line(runs["cuda_bench"]),
                        [(title, lines(recs, cfgs)) for title, _, cfgs in by_op(recs)], "% of the copy floor")


def solid_dashed(solid, dashed):
    """Each configuration's solid series, then its dashed one (of the same colour): those with points."""
    return [s for pair in zip(solid, dashed) for s in pair if s["points"]]


def plot_torch_floor(runs):
    recs = records(runs, "torch_compare", mode="cold", H=HEAD_H)
    panels = [(title, solid_dashed(lines(rs, cfgs), lines(
        rs, cfgs, lambda r: r["floor_pct"] * r["us"] / r["compiled_us"], ", torch.compile", dash=True, legend=False)))
        for title, rs, cfgs in by_op(recs)]
    return recs and svg("beammoe beside torch.compile: share of the copy floor",
                        "bench/torch_compare.py, H = %d, K = 8, cold buffers, one process; " % HEAD_H
                        + run_line(runs["torch_compare"]), panels, "% of the copy floor",
                        key="solid: beammoe; dashed, same colour: torch.compile of the reference")


def plot_decode(runs):
    recs = [r for r in records(runs, "cuda_bench", H=HEAD_H) if r["T"] <= DECODE_T]
    cold, hot = ([r for r in recs if r["mode"] == mode] for mode in ("cold", "hot"))
    panels = [(title, solid_dashed(lines(cold, cfgs, lambda r: r["us"]), lines(
        hot, cfgs, lambda r: r["us"], ", hot", dash=True, legend=False))) for title, _, cfgs in by_op(recs)]
    return recs and svg("Decode latency per call", "bench/cuda_bench, H = %d, K = 8, CUDA graph replays; "
                        % HEAD_H + run_line(runs["cuda_bench"]), panels, "microseconds per call",
                        key="solid: cold buffers; dashed, same colour: hot (inputs in L2)")


def plot_cpu(runs):
    recs = records(runs, "cpu_bench")
    return recs and svg("CPU backend: share of memcpy", "tools/beammoe bench, H = 7168, K = 8, cold inputs; "
                        + run_line(runs["cpu_bench"]), [("every configuration", lines(
                            recs, ordered(r["config"] for r in recs)))], "% of memcpy")


PLOTS = {"docs/perf/floor-vs-torch-compile.svg": plot_torch_floor, "docs/perf/floor.svg": plot_cuda_floor,
         "docs/perf/decode-latency.svg": plot_decode, "docs/perf/cpu-floor.svg": plot_cpu}


# ---- importing `beammoe bench` -------------------------------------------------------

CPU_K, CPU_H = 8, 7168


def cpu_bytes(name, t):
    """Bytes read plus written of a `beammoe bench` configuration (tools/cli.c's counts)."""
    h, k = CPU_H, CPU_K
    words = name.split()
    fp8 = "fp8" in words
    normalized = t * h + t * (h // 128) * 4 if fp8 else t * h * 2
    if words[0] == "nrn":
        return 3 * t * h * 2 + normalized + (h * 2 if "pre" in words else 0) + h * 2
    fin = t * k * h * 2 + t * k * 4 + t * h * 2 + (h * 2 if "post" in words else 0)
    return fin if words[0] == "finalize" else fin + t * h * 2 + normalized + h * 2


def git_commit(root):
    """HEAD's short hash, "-dirty" with uncommitted changes to tracked files; None outside git."""
    try:
        head = subprocess.check_output(["git", "-C", root, "rev-parse", "--short=7", "HEAD"],
                                       stderr=subprocess.DEVNULL, universal_newlines=True).strip()
        dirty = subprocess.check_output(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                                        stderr=subprocess.DEVNULL, universal_newlines=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("-dirty" if dirty else "")


def import_cpu_bench(text, commit, date, command):
    head = re.search(r"^beammoe bench: library (\S+), backend \S+, (\d+) OpenMP threads, (\d+) cores online$",
                     text, re.M)
    cpu = re.search(r"^cpu: (.*); row kernels: (\S+)$", text, re.M)
    copy = re.search(r"^memcpy: ([\d.]+) GB/s now.*read-only stream: ([\d.]+) GB/s", text, re.M)
    if not (head and cpu and copy):
        raise Fail("not the output of `beammoe bench` (its first lines are missing)")
    recs = []
    for m in re.finditer(r"^\s*(\d+)  (\S.*?)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%  (.*)$", text, re.M):
        t, name = int(m.group(1)), m.group(2)
        op = name.split()[0]
        recs.append({"op": op, "config": name, "T": t, "H": CPU_H, "K": CPU_K, "mode": "cold" if
                     "inputs: cold" in text else "hot", "us": float(m.group(3)), "gbs": float(m.group(4)),
                     "memcpy_gbs": float(m.group(5)), "floor_pct": float(m.group(6)),
                     "bytes": cpu_bytes(name, t), "path": m.group(7)})
    if not recs:
        raise Fail("no rows in the `beammoe bench` output")
    return {"format": FORMAT, "tool": "cpu_bench", "date": date, "commit": commit, "library": head.group(1),
            "hardware": "%s cores: %s; %s OpenMP threads" % (head.group(3), cpu.group(1), head.group(2)),
            "software": "row kernels %s" % cpu.group(2), "command": command,
            "copy_gbs": float(copy.group(1)), "read_gbs": float(copy.group(2)), "records": recs}


# ---- main --------------------------------------------------------------------------

def generate(root):
    """path relative to root -> the bytes it should hold."""
    runs = load_runs(os.path.join(root, "docs", "perf"))
    out = {}
    for rel, gens in SECTIONS.items():
        path = os.path.join(root, rel)
        try:
            with open(path) as f:
                text = f.read()
        except OSError as e:
            raise Fail("%s: %s" % (path, e))
        out[rel] = fill(text, gens, runs, rel)
    for rel, plot in PLOTS.items():
        doc = plot(runs)
        if doc:
            out[rel] = doc
    return out


def main():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=here, help="the source tree (default: this script's)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a generated part is stale")
    ap.add_argument("--import-cpu-bench", metavar="TEXT", help="convert `tools/beammoe bench` output")
    ap.add_argument("--json", metavar="FILE", help="with --import-cpu-bench: where to write the JSON")
    ap.add_argument("--commit", help="with --import-cpu-bench: the library's commit "
                    "(default: BEAM_COMMIT, else the tree's)")
    ap.add_argument("--date", help="with --import-cpu-bench: when it ran (default: now, UTC)")
    ap.add_argument("--command", default="tools/beammoe bench", help="with --import-cpu-bench: the command run")
    args = ap.parse_args()
    try:
        if args.import_cpu_bench:
            if not args.json or args.check:
                raise Fail("--import-cpu-bench needs --json FILE (and no --check)")
            with open(args.import_cpu_bench) as f:
                text = f.read()
            date = args.date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            commit = args.commit or os.environ.get("BEAM_COMMIT") or git_commit(args.root)
            run = import_cpu_bench(text, commit, date, args.command)
            with open(args.json, "w") as f:
                f.write(json_text(run))
            return 0
        want = generate(args.root)
    except (Fail, OSError) as e:
        print("perf-report.py: %s" % e, file=sys.stderr)
        return 2
    stale = 0
    for rel in sorted(want):
        path = os.path.join(args.root, rel)
        try:
            with open(path) as f:
                have = f.read()
        except OSError:
            have = None
        if have == want[rel]:
            continue
        if args.check:
            stale += 1
            print("perf-report.py: %s is not what docs/perf/*.json gives%s" % (
                rel, " (missing)" if have is None else ":"))
            if have is not None:
                diff = list(difflib.unified_diff(have.splitlines(), want[rel].splitlines(), "committed",
                                                 "from the JSON", lineterm="", n=1))
                print("\n".join(diff[:40] + (["..."] if len(diff) > 40 else [])))
        else:
            with open(path, "w") as f:
                f.write(want[rel])
            print("perf-report.py: wrote %s" % rel)
    if stale:
        print("perf-report.py: %d stale; run scripts/perf-report.py to regenerate" % stale)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
