#!/usr/bin/env python3
"""torch_compare.py - beammoe against torch.compile of the reference pipeline.

One process, one timing method for both. The pipeline is the layer boundary
of an MoE model: finalize with the post-FFN norm, residual add, the next
layer's norm (top_k = 8). The reference is plain PyTorch, written as the
PyTorch eager semantics that beammoe's numerics follow (every BF16 cast
kept; HF's RMSNorm), compiled with torch.compile (Inductor); beammoe runs
the same step through its Python package (beam_moe_finalize_norm_residual_norm,
FUSED and UNFUSED strategies). Both allocate their results each call.

CUDA (when torch sees a GPU): each method is captured in CUDA graphs and
replayed; the time per call is the median over replays. "cold" rotates among
buffer sets that together exceed 3x the GPU's L2 cache (no call finds its
inputs in L2); "hot" repeats one set. Default shapes: T = 1, 8, 64, 512,
4096, 16384 at H = 7168, and T = 4096 at H = 4096 and 2048.

CPU tensors: the median wall time of single calls, with
torch.set_num_threads(all cores); default T = 1, 64, 1024 at H = 7168.

The device's copy bandwidth is measured in the same run (a device-to-device
copy on CUDA, a large tensor copy on the CPU; bytes read plus written), and
the fused op's time is quoted as a fraction of its floor: its bytes over
that bandwidth. Bytes of the fused op: T*K*H*2 (expert results) + T*K*4
(weights) + T*H*2 (finalized rows, counted as for a finalize's output)
+ T*H*2 (residual) + T*H*2 (normalized) + H*2 per norm weight.

    python3 bench/torch_compare.py [--device auto|cuda|cpu] [--shapes 1:7168,64:7168,...]
                                   [--modes cold,hot] [--iters N] [--threads N] [--no-unfused]

Needs PyTorch >= 2.0 (torch.compile) and the beammoe package (installed, or
from the source tree: run from the top of a build tree after `make`).
"""
import argparse
import math
import os
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
CUDA_SHAPES = [(1, 7168), (8, 7168), (64, 7168), (512, 7168), (4096, 7168), (16384, 7168), (4096, 4096),
               (4096, 2048)]
CPU_SHAPES = [(1, 7168), (64, 7168), (1024, 7168)]


# ---- the reference pipeline in plain PyTorch ----------------------------------

def rmsnorm(x, weight, eps):
    """HF's RMSNorm of BF16 rows: weight * (x.float() * rsqrt(mean(x^2) + eps)).to(bf16)."""
    v = x.float()
    var = v.pow(2).mean(-1, keepdim=True)
    return weight * (v * torch.rsqrt(var + eps)).to(BF16)


def reference(gemm2, weights, residual, post_w, next_w):
    """Finalize (weighted sum over k, BF16, routed scale), post norm, residual
    add, next norm: (hidden, normalized)."""
    t, h = residual.shape
    x = gemm2.view(t, -1, h)
    f = (x.float() * weights[..., None]).sum(1).to(BF16) * ROUTED_SCALE
    f = rmsnorm(f, post_w, EPS)
    hidden = f + residual
    return hidden, rmsnorm(hidden, next_w, EPS)


def beam(strategy):
    def run(gemm2, weights, residual, post_w, next_w):
        return beammoe.beam_moe_finalize_norm_residual_norm(
            beammoe.MoEOutput(gemm2, weights), residual, post_w, EPS, next_w, EPS, None, ROUTED_SCALE,
            strategy=strategy)
    return run


def fused_bytes(t, h):
    return t * K * h * 2 + t * K * 4 + t * h * 2 + t * h * 2 + t * h * 2 + 2 * h * 2


def make_set(t, h, dev):
    """One call's inputs, drawn on the device (torch's seeded generator)."""
    g = (torch.randn(t * K, h, device=dev) * 2).to(BF16)
    w = torch.rand(t, K, device=dev).softmax(-1)
    r = torch.randn(t, h, device=dev).to(BF16)
    pw = (1 + 0.1 * torch.randn(h, device=dev)).to(BF16)
    nw = (1 + 0.1 * torch.randn(h, device=dev)).to(BF16)
    return g, w, r, pw, nw


def agreement(a, b):
    """Fraction of equal BF16 bits between two results."""
    return float((a.view(torch.int16) == b.view(torch.int16)).float().mean())


def check_line(t, h, args, compiled):
    """How the results compare: beammoe's strategies bit for bit; the eager
    reference differs from beammoe only where torch's reduction order does;
    Inductor also drops intermediate BF16 roundings (its default
    emulate_precision_casts=False), so the compiled reference differs more."""
    want = beam("fused")(*args)
    un = beam("unfused")(*args)
    same = all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(want, un))
    eager = reference(*args)
    got = compiled(*args)
    return ("T=%d H=%d: beammoe fused and unfused %s; equal bits with beammoe (hidden, normalized): eager "
            "reference %.3f%%, %.3f%%; compiled reference %.3f%%, %.3f%%" % (
                t, h, "bit-identical" if same else "DIFFER", 100 * agreement(eager[0], want[0]),
                100 * agreement(eager[1], want[1]), 100 * agreement(got[0], want[0]),
                100 * agreement(got[1], want[1])))


# ---- CUDA ---------------------------------------------------------------------

def l2_bytes():
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return getattr(props, "L2_cache_size", 0) or 60 * 2 ** 20


def graph_time_us(fn, sets, calls, iters):
    """Median time per call of replays of one CUDA graph that makes `calls`
    calls of fn, cycling through `sets`."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for a in sets[:2]:
            fn(*a)  # compile, load, allocate outside the capture
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(*sets[i % len(sets)])
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
    return statistics.median(times)


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


def run_cuda(shapes, modes, iters, unfused):
    dev = torch.device("cuda")
    print("device: %s, torch %s, beammoe %s (%s)" % (torch.cuda.get_device_name(dev), torch.__version__,
                                                     beammoe.version(), beammoe.library_path()))
    l2 = l2_bytes()
    bw = copy_bandwidth_cuda(max(iters, 20))
    print("copy bandwidth (device to device, read + write): %.0f GB/s; L2 %.0f MB" % (bw / 1e9, l2 / 2 ** 20))
    torch.manual_seed(0)
    rows = []
    for t, h in shapes:
        nbytes = fused_bytes(t, h)
        set_bytes = nbytes + t * h * 4  # + each call's two new results
        torch._dynamo.reset()
        compiled = torch.compile(reference, dynamic=False)
        for mode in modes:
            nsets = 1 if mode == "hot" or set_bytes > 3 * l2 else int(math.ceil(3 * l2 / set_bytes)) + 1
            sets = [make_set(t, h, dev) for _ in range(nsets)]
            calls = max(nsets, 20) if mode == "cold" else 20
            results = {}
            if mode == modes[0]:
                print(check_line(t, h, sets[0], compiled))
            methods = [("compiled", compiled), ("fused", beam("fused"))]
            if unfused:
                methods.append(("unfused", beam("unfused")))
            for name, fn in methods:
                results[name] = graph_time_us(fn, sets, calls, iters)
            floor_us = nbytes / bw * 1e6
            rows.append((mode, t, h, results, floor_us))
            print("T=%d H=%d %s (%d buffer sets): %s; floor %.2f us" % (
                t, h, mode, nsets, ", ".join("%s %.2f us" % kv for kv in results.items()), floor_us), flush=True)
            del sets
            torch.cuda.empty_cache()
    return rows, bw


# ---- CPU ------------------------------------------------------------------------

def wall_us(fn, args, iters):
    for _ in range(3):
        fn(*args)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn(*args)
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def copy_bandwidth_cpu(iters):
    n = 1 << 28  # 256 MiB each way
    src = torch.ones(n, dtype=torch.uint8)
    dst = torch.empty_like(src)
    us = wall_us(lambda a, b: b.copy_(a), (src, dst), max(5, iters // 4))
    return 2 * n / (us * 1e-6)


def run_cpu(shapes, iters, unfused, threads):
    torch.set_num_threads(threads)
    print("device: cpu (%d threads), torch %s, beammoe %s (%s)" % (
        torch.get_num_threads(), torch.__version__, beammoe.version(), beammoe.library_path()))
    bw = copy_bandwidth_cpu(iters)
    print("copy bandwidth (tensor copy, read + write): %.1f GB/s" % (bw / 1e9))
    torch.manual_seed(0)
    rows = []
    for t, h in shapes:
        args = make_set(t, h, torch.device("cpu"))
        torch._dynamo.reset()
        compiled = torch.compile(reference, dynamic=False)
        print(check_line(t, h, args, compiled))
        methods = [("compiled", compiled), ("fused", beam("fused"))]
        if unfused:
            methods.append(("unfused", beam("unfused")))
        n = iters if t < 512 else max(10, iters // 10)
        results = {name: wall_us(fn, args, n) for name, fn in methods}
        floor_us = fused_bytes(t, h) / bw * 1e6
        rows.append(("wall", t, h, results, floor_us))
        print("T=%d H=%d: %s; floor %.2f us" % (t, h, ", ".join("%s %.2f us" % kv for kv in results.items()),
                                                 floor_us), flush=True)
    return rows, bw


def table(dev, rows, bw, unfused):
    cols = ["mode", "T", "H", "compiled us", "beammoe fused us"] + (["beammoe unfused us"] if unfused else []) + \
        ["compiled / fused", "fused of floor"]
    out = [cols]
    for mode, t, h, r, floor_us in rows:
        line = [mode, str(t), str(h), "%.2f" % r["compiled"], "%.2f" % r["fused"]]
        if unfused:
            line.append("%.2f" % r["unfused"])
        line += ["%.2fx" % (r["compiled"] / r["fused"]), "%.0f%%" % (100 * floor_us / r["fused"])]
        out.append(line)
    widths = [max(len(row[i]) for row in out) for i in range(len(cols))]
    print()
    print("beammoe vs torch.compile of the reference pipeline (finalize + post norm, residual add, next norm; "
          "K=%d), %s, copy %.1f GB/s" % (K, dev, bw / 1e9))
    for row in out:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--shapes", help="T:H pairs, comma-separated (default: by device)")
    ap.add_argument("--modes", default="cold,hot", help="CUDA: cold, hot or both (default cold,hot)")
    ap.add_argument("--iters", type=int, default=50, help="replays (CUDA) or calls (CPU) per timing")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads (default: all)")
    ap.add_argument("--no-unfused", action="store_true", help="skip beammoe's UNFUSED strategy")
    args = ap.parse_args()
    if not hasattr(torch, "compile"):
        sys.exit("torch_compare.py: torch %s has no torch.compile (needs torch >= 2.0)" % torch.__version__)
    dev = args.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_compare.py: --device cuda but torch sees no CUDA device")
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split(":")) for s in args.shapes.split(",")]
    else:
        shapes = CUDA_SHAPES if dev == "cuda" else CPU_SHAPES
    unfused = not args.no_unfused
    with torch.inference_mode():
        if dev == "cuda":
            modes = [m for m in args.modes.split(",") if m]
            if any(m not in ("cold", "hot") for m in modes):
                sys.exit("torch_compare.py: --modes takes cold and hot")
            rows, bw = run_cuda(shapes, modes, args.iters, unfused)
        else:
            rows, bw = run_cpu(shapes, args.iters, unfused, args.threads)
    table(dev, rows, bw, unfused)


if __name__ == "__main__":
    main()
