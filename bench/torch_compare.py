#!/usr/bin/env python3
"""torch_compare.py - beammoe against torch.compile of the reference, every configuration.

One process, one timing method for both. Operations and configurations (a
user can call each; `--ops` picks operations, `--configs` configurations by
name):

  fused     the layer boundary of an MoE model, top_k = 8
            (beam_moe_finalize_norm_residual_norm, FUSED and UNFUSED):
              post+next          finalize with the post-FFN norm, residual
                                 add, next norm (the reference module's call)
              next               no post norm
              post0+next         the post norm without its weight
              post+next+scales   with scales (0.75, 1.25)
              post+next+inplace  hidden written over the residual
  finalize  beam_moe_finalize: plain, post
  nrn       beam_norm_residual_norm (the unfused path's second half, and
            every layer with no MoE in front of it):
              next, next0 (next norm without weight), pre+next,
              pre+next+scales, next+inplace

The reference is plain PyTorch written as the PyTorch eager semantics that
beammoe's numerics follow (every BF16 cast kept; HF's RMSNorm), compiled
with torch.compile (Inductor, dynamic=False: one compile per shape; the
recompile limit is raised for the sweep). In place configurations compare
beammoe's in-place call with the same compiled out-of-place reference. Both
sides allocate their results each call (beammoe's in-place calls: only
normalized).

CUDA (when torch sees a GPU): each method is captured in CUDA graphs and
replayed; the time per call is the median over replays. "cold" rotates among
buffer sets that together exceed 3x the GPU's L2 cache (no call finds its
inputs in L2), and each call keeps its own result buffers, so no call
writes lines that an earlier one left in L2 (the floor's bytes all go to
memory, and an in-place call, which writes into its own set's residual, is
measured as the others are); "hot" repeats one set, results reused.

CPU tensors: the median wall time of single calls, with
torch.set_num_threads(all cores).

The device's copy bandwidth is measured in the same run (a device-to-device
copy on CUDA, a large tensor copy on the CPU; bytes read plus written), and
beammoe's time is quoted as a fraction of its floor: the operation's bytes
over that bandwidth. Bytes: finalize T*K*H*2 + T*K*4 + T*H*2; the fused op
adds the residual read and normalized written (2*T*H*2); norm_residual_norm
4*T*H*2; H*2 per norm weight.

    python3 bench/torch_compare.py [--device auto|cuda|cpu] [--ops fused,finalize,nrn]
                                   [--configs NAME,...] [--shapes 1:7168,64:7168,...]
                                   [--modes cold,hot] [--iters N] [--threads N] [--no-unfused]
                                   [--json FILE]

--json FILE also writes every row to FILE, for scripts/perf-report.py: the
run (date, the library's commit from BEAM_COMMIT in the environment, the
device, the copy bandwidth) and one record per row: op, config, T, H, K,
mode, beammoe's time (us: median, us_min, us_max), torch.compile's
(compiled_us, compiled_min, compiled_max), the ratio compiled / beammoe,
bytes and floor_pct. The text output is the same with or without it.

Needs PyTorch >= 2.0 (torch.compile) and the beammoe package (installed, or
from the source tree: run from the top of a build tree after `make`).
"""
import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time

_here = os.path.dirname(os.path.abspath(__file__))
_pkg = os.path.join(os.path.dirname(_here), "python")
if os.path.isdir(os.path.join(_pkg, "beammoe")) and _pkg not in sys.path:
    sys.path.append(_pkg)  # the source tree's package when none is installed

try:
    import torch
except ImportError:
    sys.exit("torch_compare.py: PyTorch is not installed; nothing to compare")

import beammoe  # noqa: E402

BF16 = torch.bfloat16
K = 8
EPS = 1e-6
ROUTED_SCALE = 2.5
SCALES = (0.75, 1.25)
H_ALL = (7168, 4096, 2048)
T_ALL = (1, 8, 64, 512, 4096, 16384)


# ---- the reference in plain PyTorch ------------------------------------------------

def rmsnorm(x, weight, eps):
    """HF's RMSNorm of BF16 rows: weight * (x.float() * rsqrt(mean(x^2) + eps)).to(bf16);
    without a weight, the BF16 normalized rows."""
    v = x.float()
    var = v.pow(2).mean(-1, keepdim=True)
    y = (v * torch.rsqrt(var + eps)).to(BF16)
    return y if weight is None else weight * y


def ref_finalize(gemm2, weights, t, h):
    x = gemm2.view(t, -1, h)
    return (x.float() * weights[..., None]).sum(1).to(BF16) * ROUTED_SCALE


def ref_residual(x, residual, scales):
    if scales is None:
        return x + residual
    return (x.float() * scales[0]).to(BF16) + (residual.float() * scales[1]).to(BF16)


class Config:
    """One configuration of one operation: how to make its inputs, the
    reference, beammoe's call per strategy, and its bytes."""

    def __init__(self, op, name, post=None, pre=None, next_w=True, scales=None, inplace=False):
        self.op, self.name = op, name
        self.post = post        # finalize's post norm: None, "w" (weight), "0" (no weight)
        self.pre = pre          # nrn's pre norm: None or "w"
        self.next_w = next_w    # the next norm has a weight
        self.scales = scales
        self.inplace = inplace

    @property
    def label(self):
        return "%s %s" % (self.op, self.name)

    def make_set(self, t, h, dev):
        """One call's inputs, drawn on the device (torch's seeded generator)."""
        def bf(*shape, scale=1.0):
            return (torch.randn(*shape, device=dev) * scale).to(BF16)

        def nw():
            return (1 + 0.1 * torch.randn(h, device=dev)).to(BF16)
        if self.op == "nrn":
            return (bf(t, h, scale=2), bf(t, h), nw() if self.pre else None, nw() if self.next_w else None)
        g = bf(t * K, h, scale=2)
        w = torch.rand(t, K, device=dev).softmax(-1)
        pw = nw() if self.post == "w" else None
        if self.op == "finalize":
            return (g, w, pw, torch.empty(t, h, dtype=BF16, device=dev))
        return (g, w, bf(t, h), pw, nw() if self.next_w else None)

    def reference(self):
        op, post, pre, scales = self.op, self.post, self.pre, self.scales
        if op == "finalize":
            def ref(gemm2, weights, post_w, out):
                t, h = out.shape
                f = ref_finalize(gemm2, weights, t, h)
                return rmsnorm(f, post_w, EPS) if post else f
        elif op == "fused":
            def ref(gemm2, weights, residual, post_w, next_w):
                t, h = residual.shape
                f = ref_finalize(gemm2, weights, t, h)
                if post:
                    f = rmsnorm(f, post_w, EPS)
                hidden = ref_residual(f, residual, scales)
                return hidden, rmsnorm(hidden, next_w, EPS)
        else:
            def ref(x, residual, pre_w, next_w):
                if pre:
                    x = rmsnorm(x, pre_w, EPS)
                hidden = ref_residual(x, residual, scales)
                return hidden, rmsnorm(hidden, next_w, EPS)
        return ref

    def strategies(self, unfused):
        if self.op == "fused":
            return ["fused", "unfused"] if unfused else ["fused"]
        return ["plain"]

    def beam(self, strategy):
        post_eps = EPS if self.post else None
        if self.op == "finalize":
            def run(gemm2, weights, post_w, out):
                return beammoe.beam_moe_finalize(gemm2, weights, out, ROUTED_SCALE, post_w, post_eps)
        elif self.op == "fused":
            def run(gemm2, weights, residual, post_w, next_w):
                return beammoe.beam_moe_finalize_norm_residual_norm(
                    beammoe.MoEOutput(gemm2, weights), residual, post_w, post_eps, next_w, EPS, self.scales,
                    ROUTED_SCALE, strategy=strategy, inplace=self.inplace)
        else:
            pre_eps = EPS if self.pre else None

            def run(x, residual, pre_w, next_w):
                return beammoe.beam_norm_residual_norm(x, residual, pre_w, pre_eps, next_w, EPS, self.scales,
                                                       inplace=self.inplace)
        return run

    def nbytes(self, t, h):
        row = t * h * 2
        w = h * 2
        if self.op == "nrn":
            return 4 * row + (w if self.pre else 0) + (w if self.next_w else 0)
        fin = t * K * h * 2 + t * K * 4 + row + (w if self.post == "w" else 0)
        if self.op == "finalize":
            return fin
        return fin + 2 * row + (w if self.next_w else 0)

    def results_bytes(self, t, h):
        """What each call allocates (counted into a buffer set's size)."""
        return t * h * 2 * (1 if self.op == "finalize" or self.inplace else 2)


CONFIGS = [
    Config("fused", "post+next", post="w"),
    Config("fused", "next"),
    Config("fused", "post0+next", post="0"),
    Config("fused", "post+next+scales", post="w", scales=SCALES),
    Config("fused", "post+next+inplace", post="w", inplace=True),
    Config("finalize", "plain"),
    Config("finalize", "post", post="w"),
    Config("nrn", "next"),
    Config("nrn", "next0", next_w=False),
    Config("nrn", "pre+next", pre="w"),
    Config("nrn", "pre+next+scales", pre="w", scales=SCALES),
    Config("nrn", "next+inplace", inplace=True),
]


def agreement(a, b):
    """Fraction of equal BF16 bits between two results."""
    return float((a.view(torch.int16) == b.view(torch.int16)).float().mean())


def as_pair(r):
    return r if isinstance(r, (tuple, list)) else (r,)


def fresh(args):
    """The inputs of one call, copied, so that an in-place call leaves args intact."""
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def check_line(cfg, t, h, args, compiled):
    """How the results compare: beammoe's strategies bit for bit; the eager
    reference differs from beammoe only where torch's reduction order does;
    Inductor also drops intermediate BF16 roundings (its default
    emulate_precision_casts=False), so the compiled reference differs more."""
    outs = {s: [o.clone() for o in as_pair(cfg.beam(s)(*fresh(args)))] for s in cfg.strategies(True)}
    want = outs[cfg.strategies(True)[0]]
    same = all(all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(want, o))
               for o in outs.values())
    eager = as_pair(cfg.reference()(*fresh(args)))
    got = as_pair(compiled(*fresh(args)))
    parts = ["%s T=%d H=%d:" % (cfg.label, t, h)]
    if len(outs) > 1:
        parts.append("beammoe strategies %s;" % ("bit-identical" if same else "DIFFER"))
    parts.append("equal bits with beammoe: eager reference %s; compiled reference %s" % (
        ", ".join("%.3f%%" % (100 * agreement(e, w)) for e, w in zip(eager, want)),
        ", ".join("%.3f%%" % (100 * agreement(g, w)) for g, w in zip(got, want))))
    return " ".join(parts)


# ---- CUDA ---------------------------------------------------------------------

def l2_bytes():
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return getattr(props, "L2_cache_size", 0) or 60 * 2 ** 20


def graph_time_us(fn, sets, calls, iters, hold=False):
    """Median time per call of replays of one CUDA graph (graph_stats_us)."""
    return graph_stats_us(fn, sets, calls, iters, hold)[0]


def graph_stats_us(fn, sets, calls, iters, hold=False):
    """(median, min, max) time per call of replays of one CUDA graph that
    makes `calls` calls of fn, cycling through `sets`. hold: every call's
    results stay alive until the capture ends, so each call writes its own
    buffers (otherwise the graph's pool hands the next call the buffers the
    last one freed, and at sizes that fit in L2 the writes land on lines
    still there)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for a in sets[:2]:
            fn(*a)  # compile, load, allocate outside the capture
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    held = []
    with torch.cuda.graph(graph):
        for i in range(calls):
            r = fn(*sets[i % len(sets)])
            if hold:
                held.append(r)
    del held
    graph.replay()
    torch.cuda.synchronize()
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(iters):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    del graph
    return statistics.median(times), min(times), max(times)


def copy_bandwidth_cuda(iters):
    """A 2 GiB device-to-device copy (one cudaMemcpyAsync), timed with events
    on the stream: a copy recorded in a graph runs as a slower graph node."""
    n = 2 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(iters + 2):
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        if i >= 2:
            times.append(start.elapsed_time(end) * 1e3)
    del src, dst
    return 2 * n / (statistics.median(times) * 1e-6)


def run_cuda(configs, shapes, modes, iters, unfused):
    dev = torch.device("cuda")
    print("device: %s, torch %s, beammoe %s (%s)" % (torch.cuda.get_device_name(dev), torch.__version__,
                                                     beammoe.version(), beammoe.library_path()))
    l2 = l2_bytes()
    bw = copy_bandwidth_cuda(max(iters, 20))
    print("copy bandwidth (device to device, read + write): %.0f GB/s; L2 %.0f MB" % (bw / 1e9, l2 / 2 ** 20))
    torch.manual_seed(0)
    rows = []
    for cfg in configs:
        for t, h in shapes(cfg):
            set_bytes = cfg.nbytes(t, h) + cfg.results_bytes(t, h)
            torch._dynamo.reset()
            compiled = torch.compile(cfg.reference(), dynamic=False)
            for mode in modes:
                nsets = 1 if mode == "hot" or set_bytes > 3 * l2 else int(math.ceil(3 * l2 / set_bytes)) + 1
                sets = [cfg.make_set(t, h, dev) for _ in range(nsets)]
                calls = max(nsets, 20) if mode == "cold" else 20
                if mode == modes[0]:
                    print(check_line(cfg, t, h, sets[0], compiled))
                methods = [("compiled", compiled)] + [(s, cfg.beam(s)) for s in cfg.strategies(unfused)]
                stats = {name: graph_stats_us(fn, sets, calls, iters, hold=mode == "cold")
                         for name, fn in methods}
                results = {name: st[0] for name, st in stats.items()}
                floor_us = cfg.nbytes(t, h) / bw * 1e6
                rows.append((cfg, mode, t, h, results, floor_us, stats))
                print("%s T=%d H=%d %s (%d buffer sets): %s; floor %.2f us" % (
                    cfg.label, t, h, mode, nsets, ", ".join("%s %.2f us" % kv for kv in results.items()), floor_us),
                    flush=True)
                del sets
                torch.cuda.empty_cache()
    return rows, bw


# ---- CPU ------------------------------------------------------------------------

def wall_us(fn, args, iters):
    """Median wall time of single calls (wall_stats_us)."""
    return wall_stats_us(fn, args, iters)[0]


def wall_stats_us(fn, args, iters):
    """(median, min, max) wall time of single calls after three warm-up calls."""
    for _ in range(3):
        fn(*args)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn(*args)
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times), min(times), max(times)


def copy_bandwidth_cpu(iters):
    n = 1 << 28  # 256 MiB each way
    src = torch.ones(n, dtype=torch.uint8)
    dst = torch.empty_like(src)
    us = wall_us(lambda a, b: b.copy_(a), (src, dst), max(5, iters // 4))
    return 2 * n / (us * 1e-6)


def run_cpu(configs, shapes, iters, unfused, threads):
    torch.set_num_threads(threads)
    print("device: cpu (%d threads), torch %s, beammoe %s (%s)" % (
        torch.get_num_threads(), torch.__version__, beammoe.version(), beammoe.library_path()))
    bw = copy_bandwidth_cpu(iters)
    print("copy bandwidth (tensor copy, read + write): %.1f GB/s" % (bw / 1e9))
    torch.manual_seed(0)
    rows = []
    for cfg in configs:
        for t, h in shapes(cfg):
            args = cfg.make_set(t, h, torch.device("cpu"))
            torch._dynamo.reset()
            compiled = torch.compile(cfg.reference(), dynamic=False)
            print(check_line(cfg, t, h, args, compiled))
            methods = [("compiled", compiled)] + [(s, cfg.beam(s)) for s in cfg.strategies(unfused)]
            n = iters if t < 512 else max(10, iters // 10)
            stats = {name: wall_stats_us(fn, args, n) for name, fn in methods}
            results = {name: st[0] for name, st in stats.items()}
            floor_us = cfg.nbytes(t, h) / bw * 1e6
            rows.append((cfg, "wall", t, h, results, floor_us, stats))
            print("%s T=%d H=%d: %s; floor %.2f us" % (cfg.label, t, h, ", ".join(
                "%s %.2f us" % kv for kv in results.items()), floor_us), flush=True)
    return rows, bw


def table(dev, rows, bw):
    cols = ["configuration", "mode", "T", "H", "compiled us", "beammoe us", "unfused us", "compiled / beammoe",
            "beammoe of floor"]
    out = [cols]
    for cfg, mode, t, h, r, floor_us, _ in rows:
        mine = r["fused"] if "fused" in r else r["plain"]
        out.append([cfg.label, mode, str(t), str(h), "%.2f" % r["compiled"], "%.2f" % mine,
                    "%.2f" % r["unfused"] if "unfused" in r else "-", "%.2fx" % (r["compiled"] / mine),
                    "%.1f%%" % (100 * floor_us / mine)])
    widths = [max(len(row[i]) for row in out) for i in range(len(cols))]
    print()
    print("beammoe vs torch.compile of the reference (K=%d), %s, copy %.1f GB/s" % (K, dev, bw / 1e9))
    for row in out:
        print("  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(row, widths))))


# ---- --json: the rows for scripts/perf-report.py ------------------------------------

def machine(dev):
    """(hardware, software) in words, for the JSON."""
    soft = "PyTorch %s" % torch.__version__
    if dev == "cuda":
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        return ("%s, %d SMs, L2 %d MiB" % (p.name, p.multi_processor_count, l2_bytes() >> 20),
                "CUDA %s, %s" % (torch.version.cuda, soft))
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), model)
    except OSError:
        pass
    n = torch.get_num_threads()
    return "%s, %d thread%s" % (model, n, "" if n == 1 else "s"), soft


def run_json(tool, dev, bw, records):
    """One benchmark run as scripts/perf-report.py reads it."""
    hardware, software = machine(dev)
    return {"format": "beammoe-perf/1", "tool": tool,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "commit": os.environ.get("BEAM_COMMIT") or None, "library": beammoe.version(), "hardware": hardware,
            "software": software,
            "command": " ".join(["python3", "bench/" + os.path.basename(sys.argv[0])] + sys.argv[1:]),
            "copy_gbs": round(bw / 1e9, 1), "records": records}


def write_json(path, run):
    """The run into path (written beside it, then renamed onto it), one line
    a record, as scripts/perf-report.py writes its runs."""
    head = "".join(" %s: %s,\n" % (json.dumps(k), json.dumps(run[k], sort_keys=True)) for k in sorted(run) if k != "records")
    rows = ",\n".join("  " + json.dumps(r, sort_keys=True) for r in run["records"])
    with open(path + ".tmp", "w") as f:
        f.write("{\n%s \"records\": [\n%s\n ]\n}\n" % (head, rows))
    os.replace(path + ".tmp", path)


def json_records(rows):
    """torch_compare's rows as records: times in us, beammoe's from its
    FUSED (or only) strategy."""
    out = []
    for cfg, mode, t, h, r, floor_us, stats in rows:
        name = "fused" if "fused" in r else "plain"
        mine = stats[name]
        rec = {"op": cfg.op, "config": cfg.name, "T": t, "H": h, "K": K, "mode": mode, "strategy": name,
               "us": round(mine[0], 3), "us_min": round(mine[1], 3), "us_max": round(mine[2], 3),
               "compiled_us": round(stats["compiled"][0], 3), "compiled_min": round(stats["compiled"][1], 3),
               "compiled_max": round(stats["compiled"][2], 3), "ratio": round(r["compiled"] / mine[0], 4),
               "bytes": cfg.nbytes(t, h), "floor_pct": round(100 * floor_us / mine[0], 2)}
        if "unfused" in stats:
            rec["unfused_us"] = round(stats["unfused"][0], 3)
        out.append(rec)
    return out


def default_shapes(dev):
    """Per configuration: CUDA every T of T_ALL at H = 7168 and T = 4096 at
    H = 4096 and 2048 (norm_residual_norm: every T at every H); CPU T = 1,
    64, 1024 at H = 7168."""
    def shapes(cfg):
        if dev == "cpu":
            return [(1, 7168), (64, 7168), (1024, 7168)]
        if cfg.op == "nrn":
            return [(t, h) for h in H_ALL for t in T_ALL]
        return [(t, 7168) for t in T_ALL] + [(4096, 4096), (4096, 2048)]
    return shapes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--ops", default="fused,finalize,nrn", help="operations (default: all)")
    ap.add_argument("--configs", help="configuration names, comma-separated (default: all of --ops)")
    ap.add_argument("--shapes", help="T:H pairs, comma-separated (default: by device and operation)")
    ap.add_argument("--modes", default="cold,hot", help="CUDA: cold, hot or both (default cold,hot)")
    ap.add_argument("--iters", type=int, default=50, help="replays (CUDA) or calls (CPU) per timing")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads (default: all)")
    ap.add_argument("--no-unfused", action="store_true", help="skip beammoe's UNFUSED strategy")
    ap.add_argument("--json", metavar="FILE", help="also write every row to FILE (scripts/perf-report.py)")
    args = ap.parse_args()
    if not hasattr(torch, "compile"):
        sys.exit("torch_compare.py: torch %s has no torch.compile (needs torch >= 2.0)" % torch.__version__)
    dev = args.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_compare.py: --device cuda but torch sees no CUDA device")
    ops = [o for o in args.ops.split(",") if o]
    known_ops = sorted({c.op for c in CONFIGS})
    if any(o not in known_ops for o in ops):
        sys.exit("torch_compare.py: --ops takes %s" % ", ".join(known_ops))
    configs = [c for c in CONFIGS if c.op in ops]
    if args.configs:
        names = [n for n in args.configs.split(",") if n]
        unknown = [n for n in names if n not in {c.name for c in configs}]
        if unknown:
            sys.exit("torch_compare.py: no configuration %s in %s (have: %s)" % (
                ", ".join(unknown), ",".join(ops), ", ".join(c.name for c in configs)))
        configs = [c for c in configs if c.name in names]
    if args.shapes:
        try:
            fixed = [tuple(int(v) for v in s.split(":")) for s in args.shapes.split(",")]
        except ValueError:
            sys.exit("torch_compare.py: --shapes takes T:H pairs, comma-separated")

        def shapes(cfg):
            return fixed
    else:
        shapes = default_shapes(dev)
    # one compile per configuration and shape: past the limit torch.compile
    # silently falls back to eager
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 1024)
    unfused = not args.no_unfused
    with torch.inference_mode():
        if dev == "cuda":
            modes = [m for m in args.modes.split(",") if m]
            if any(m not in ("cold", "hot") for m in modes):
                sys.exit("torch_compare.py: --modes takes cold and hot")
            rows, bw = run_cuda(configs, shapes, modes, args.iters, unfused)
        else:
            rows, bw = run_cpu(configs, shapes, args.iters, unfused, args.threads)
    table(dev, rows, bw)
    if args.json:
        write_json(args.json, run_json("torch_compare", dev, bw, json_records(rows)))


if __name__ == "__main__":
    main()
