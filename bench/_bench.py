"""_bench.py - what the Python benchmarks beside it share: the beammoe package
(the source tree's when none is installed) and PyTorch, the common
arguments, the timing (CUDA graph replays over cold or hot buffer sets, as
docs/PERF.md "How it is measured" says; on the CPU the wall time of single
calls), the copy bandwidth, and the run's JSON for scripts/perf-report.py.
"""
import argparse
import datetime
import math
import os
import platform
import runpy
import statistics
import sys
import time

_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_pkg = os.path.join(_root, "python")
if os.path.isdir(os.path.join(_pkg, "beammoe")) and _pkg not in sys.path:
    sys.path.append(_pkg)  # the source tree's package when none is installed
PROG = os.path.basename(sys.argv[0])

try:
    import torch
except ImportError:
    sys.exit("%s: PyTorch is not installed; nothing to compare" % PROG)

import beammoe  # noqa: E402


def die(msg):
    sys.exit("%s: %s" % (PROG, msg))


def device(name):
    """--device: auto is cuda where torch sees a GPU, else cpu."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        die("--device cuda but torch sees no CUDA device")
    return name


def parser(doc):
    """The argument parser with --device (auto, cuda, cpu)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    return ap


def sweep_args(ap, shapes_by, modes):
    """--shapes, --modes, --iters, --threads and --json."""
    ap.add_argument("--shapes", help="T:H pairs, comma-separated (default: by %s)" % shapes_by)
    ap.add_argument("--modes", default=modes, help="CUDA: cold, hot or both (default %s)" % modes)
    ap.add_argument("--iters", type=int, default=50, help="replays (CUDA) or calls (CPU) per timing")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads (default: all)")
    ap.add_argument("--json", metavar="FILE", help="also write every row to FILE (scripts/perf-report.py)")


def pick(kind, given, known):
    """Comma-separated names, each one of known."""
    names = [n for n in given.split(",") if n]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        die("--%s takes %s (got %s)" % (kind, ", ".join(known), given))
    return names


def parse_shapes(given):
    """--shapes: T:H pairs of positive numbers."""
    try:
        shapes = [tuple(int(v) for v in s.split(":")) for s in given.split(",") if s]
    except ValueError:
        die("--shapes takes T:H pairs, comma-separated")
    if any(len(s) != 2 or min(s) < 1 for s in shapes):
        die("--shapes takes T:H pairs of positive numbers")
    return shapes


def raise_compile_limits(n=1024):
    """dynamic=False compiles once per shape; past the per-function or the
    accumulated limit torch.compile silently falls back to eager."""
    cfg = torch._dynamo.config
    for name in ("cache_size_limit", "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), n))


# ---- timing ---------------------------------------------------------------------

def l2_bytes():
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return getattr(props, "L2_cache_size", 0) or 60 * 2 ** 20


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


def copy_bandwidth(dev, iters):
    """Bytes read plus written per second: on CUDA a 2 GiB device-to-device
    copy (one cudaMemcpyAsync), timed with events on the stream (a copy
    recorded in a graph runs as a slower graph node); on the CPU a 256 MiB
    tensor copy's wall time."""
    if dev != "cuda":
        n = 1 << 28
        src = torch.ones(n, dtype=torch.uint8)
        dst = torch.empty_like(src)
        return 2 * n / (wall_stats_us(lambda a, b: b.copy_(a), (src, dst), max(5, iters // 4))[0] * 1e-6)
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


def start(dev, iters, threads, note=None):
    """Prints the device (and note, on CUDA), measures and prints the copy
    bandwidth, seeds torch: (bandwidth in bytes/s, L2 bytes or None)."""
    l2 = None
    if dev == "cuda":
        print("device: %s, torch %s, beammoe %s (%s)" % (torch.cuda.get_device_name(dev), torch.__version__,
                                                         beammoe.version(), beammoe.library_path()))
        if note:
            print(note)
        l2 = l2_bytes()
        bw = copy_bandwidth(dev, max(iters, 20))
        print("copy bandwidth (device to device, read + write): %.0f GB/s; L2 %.0f MB" % (bw / 1e9, l2 / 2 ** 20))
    else:
        torch.set_num_threads(threads)
        print("device: cpu (%d threads), torch %s, beammoe %s (%s)" % (
            torch.get_num_threads(), torch.__version__, beammoe.version(), beammoe.library_path()))
        bw = copy_bandwidth(dev, iters)
        print("copy bandwidth (tensor copy, read + write): %.1f GB/s" % (bw / 1e9))
    torch.manual_seed(0)
    return bw, l2


class Timer:
    """fn -> (median, min, max) us per call for one shape and mode: CUDA
    graph replays over the buffer sets, or (mode "wall", one set) the wall
    time of single calls. args: the first set's inputs; label: the mode for
    the progress lines."""

    def __init__(self, sets, calls, iters, mode):
        self.sets, self.calls, self.iters, self.mode, self.args = sets, calls, iters, mode, sets[0]
        self.label = "" if mode == "wall" else " %s (%d buffer sets)" % (mode, len(sets))

    def __call__(self, fn):
        if self.mode == "wall":
            return wall_stats_us(fn, self.args, self.iters)
        return graph_stats_us(fn, self.sets, self.calls, self.iters, hold=self.mode == "cold")


def timers(dev, modes, t, iters, l2, size, make_set):
    """The Timers of one shape, size the bytes of one buffer set: on CUDA
    one per mode (cold: enough sets to exceed 3x the L2, unless one does;
    the sets are freed once the next Timer is asked for); on the CPU one
    of mode "wall" (fewer calls from T = 512)."""
    if dev != "cuda":
        yield Timer([make_set()], 0, iters if t < 512 else max(10, iters // 10), "wall")
        return
    for mode in modes:
        nsets = 1 if mode == "hot" or size > 3 * l2 else int(math.ceil(3 * l2 / size)) + 1
        timer = Timer([make_set() for _ in range(nsets)], max(nsets, 20) if mode == "cold" else 20, iters, mode)
        yield timer
        timer.sets = timer.args = None
        torch.cuda.empty_cache()


# ---- --json: the run for scripts/perf-report.py ----------------------------------------

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


def write_json(path, tool, dev, bw, records):
    """One benchmark run into path (written beside it, then renamed onto
    it), as scripts/perf-report.py reads and writes runs: one line a record."""
    hardware, software = machine(dev)
    run = {"format": "beammoe-perf/1", "tool": tool,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "commit": os.environ.get("BEAM_COMMIT") or None, "library": beammoe.version(), "hardware": hardware,
           "software": software, "command": " ".join(["python3", "bench/" + PROG] + sys.argv[1:]),
           "copy_gbs": round(bw / 1e9, 1), "records": records}
    json_text = runpy.run_path(os.path.join(_root, "scripts", "perf-report.py"))["json_text"]
    with open(path + ".tmp", "w") as f:
        f.write(json_text(run))
    os.replace(path + ".tmp", path)
