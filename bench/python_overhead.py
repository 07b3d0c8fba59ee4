#!/usr/bin/env python3
"""python_overhead.py - the Python-side cost of one beammoe call.

Times a loop of calls of the fused operation (finalize with post norm, residual
add, next norm; K = 8) through the Python package on tiny problems, next to a
PyTorch op of the same tensors in the same run (torch.add of the residual to
itself, and torch.empty_like), so the figures compare on any host.

CPU tensors (default): tokens = 0 and tokens = 1. The library's own work at
tokens = 0 is its argument checks, so that row is the wrapper's cost. The
"part:" rows time steps of the plain call alone (CPU). With
--device cuda (on a GPU host): an eager loop of CUDA calls, timed with one
synchronization at the end; at tokens = 1 the kernel takes a few microseconds,
so the loop's rate is the host's.

    python3 bench/python_overhead.py [--device cpu|cuda] [--tokens 0,1] [--hidden 7168]
                                     [--iters 20000] [--repeats 7] [--json]

Run from a build tree with PYTHONPATH=python (and, if the package is not
installed, nothing else: it finds ../.libs), or with the installed package.
"""
import argparse
import json
import statistics
import sys
import time

import _bench as bench  # the package (the source tree's when none is installed), PyTorch
from _bench import beammoe, torch


def per_call_us(fn, iters, repeats, sync):
    """(min, median, max) over `repeats` of the mean time of one call in a
    loop of `iters` (the minimum is the better figure on a busy host)."""
    for _ in range(max(10, iters // 20)):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / iters * 1e6)
    return min(times), statistics.median(times), max(times)


def c_call(g, w, T, K, H, residual, pw, nw):
    """The library's own time: the fused operation of the CPU backend's
    table through ctypes (the function the package calls), every argument
    prepared once as a plain int (CPU tensors; outputs preallocated)."""
    import ctypes

    from beammoe import _lib

    ops = _lib.backend_ops("cpu")
    hid, nrm = torch.empty_like(residual), torch.empty_like(residual)
    spare_buf = (ctypes.c_uint64 * 2)()  # a non-NULL address for empty tensors

    def p(t):
        return t.data_ptr() or ctypes.addressof(spare_buf)

    post = _lib.BeamNorm(pw.data_ptr(), 1e-6)
    nxt = _lib.BeamNorm(nw.data_ptr(), 1e-6)
    f = ops.moe_finalize_norm_residual_norm
    args = (p(g), p(w), max(T, 1), T, K, H, 2.5, ctypes.addressof(post), p(residual), None, ctypes.addressof(nxt),
            p(hid), p(nrm), 0, None)

    keep = (hid, nrm, post, nxt, spare_buf)  # alive as long as the closure

    def call():
        if f(*args) != 0 or keep is None:
            raise RuntimeError(_lib.last_error(ops))
    return call


def parts(x, residual, pw, nw, T, K, H):
    """The plain call's steps, each timed alone (CPU; docs/python.md, host
    overhead): its argument checks, its route, its two results, and the
    package's ctypes call with its outputs ready."""
    from beammoe import _calls, _run, ops
    fn, g, w = "beam_moe_finalize_norm_residual_norm", x.gemm2_permuted, x.expert_weights
    h, n, cpu = torch.empty_like(residual), torch.empty_like(residual), torch.device("cpu")
    return [
        ("  part: argument checks", lambda: ops.check_fused(fn, g, w, residual, pw, 1e-6, nw, 1e-6, None, 2.5, 0)),
        ("  part: route", lambda: _calls.route(fn, ops._FUSED_NAMES, (g, w, residual, pw, nw))),
        ("  part: two results (empty_like)", lambda: (torch.empty_like(residual), torch.empty_like(residual))),
        ("  part: the package's ctypes call", lambda: _run.fused(cpu, g, w, T, T, K, H, 2.5, pw, 1e-6, residual, None,
                                                                  nw, 1e-6, h, n, 0)),
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--tokens", default="0,1", help="comma-separated token counts (default 0,1)")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", action="store_true",
                    help="one JSON document on stdout instead of the table (rows: tokens, call, min, median, max us)")
    args = ap.parse_args()

    dev = torch.device(bench.device(args.device))
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    K, H = args.top_k, args.hidden
    head = ("python_overhead: torch %s, beammoe %s (%s), device %s, K=%d H=%d, %d iterations x %d"
            % (torch.__version__, beammoe.version(), beammoe.library_path(), dev, K, H, args.iters, args.repeats))
    say = (lambda *a, **k: print(*a, file=sys.stderr, **k)) if args.json else print  # progress on stderr
    say(head)
    say("%-6s %-44s %10s %10s %10s" % ("tokens", "call", "min us", "median us", "max us"))
    rows = []
    with torch.inference_mode():
        for T in [int(t) for t in args.tokens.split(",")]:
            g = torch.randn(max(T, 1) * K, H, device=dev).bfloat16()
            w = torch.rand(max(T, 1), K, device=dev)
            residual = torch.randn(T, H, device=dev).bfloat16()
            pw = torch.ones(H, device=dev).bfloat16()
            nw = torch.ones(H, device=dev).bfloat16()
            x = beammoe.MoEOutput(g, w, T)
            fused = beammoe.beam_moe_finalize_norm_residual_norm

            cases = [
                ("beam_moe_finalize_norm_residual_norm",
                 lambda: fused(x, residual, pw, 1e-6, nw, 1e-6, None, 2.5)),
                ("  same, scales=(0.5, 2.0)",
                 lambda: fused(x, residual, pw, 1e-6, nw, 1e-6, (0.5, 2.0), 2.5)),
            ]
            try:  # the in-place form, where the package has it
                fused(x, residual.clone(), pw, 1e-6, nw, 1e-6, None, 2.5, inplace=True)
                cases.append(("  same, inplace=True",
                              lambda: fused(x, residual, pw, 1e-6, nw, 1e-6, None, 2.5, inplace=True)))
            except TypeError:
                pass
            if hasattr(beammoe, "prepare_finalize_norm_residual_norm"):  # checked once, then one ctypes call
                res_p = residual.clone()
                cases.append(("  prepared call (inplace, outputs reused)",
                              beammoe.prepare_finalize_norm_residual_norm(x, res_p, pw, 1e-6, nw, 1e-6, None, 2.5)))
            out = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
            if dev.type == "cpu":
                cases.append(("  the C call alone (ctypes, arguments ready)",
                              c_call(g, w, T, K, H, residual, pw, nw)))
                cases += parts(x, residual, pw, nw, T, K, H)
            cases += [
                ("beam_moe_finalize", lambda: beammoe.beam_moe_finalize(g, w, out, 2.5, pw, 1e-6)),
                ("torch.add(residual, residual)", lambda: torch.add(residual, residual)),
                ("torch.empty_like(residual)", lambda: torch.empty_like(residual)),
            ]
            for name, fn in cases:
                low, med, high = per_call_us(fn, args.iters, args.repeats, sync)
                rows.append((T, name.strip(), low, med, high))
                say("%-6d %-44s %10.2f %10.2f %10.2f" % (T, name, low, med, high), flush=True)
    if args.json:
        json.dump({"format": "beammoe-python-overhead/1", "run": head, "device": str(dev), "top_k": K, "hidden": H,
                   "rows": [{"tokens": t, "call": n, "us_min": round(lo, 3), "us": round(m, 3),
                             "us_max": round(hi, 3)} for t, n, lo, m, hi in rows]}, sys.stdout, indent=1)
        print()
        return
    by = {(t, n): us for t, n, _, us, _ in rows}
    print()
    for T in sorted({r[0] for r in rows}):
        f = by[(T, "beam_moe_finalize_norm_residual_norm")]
        a = by[(T, "torch.add(residual, residual)")]
        c = by.get((T, "the C call alone (ctypes, arguments ready)"))
        print("tokens=%d, medians: fused op %.2f us per call%s, torch.add %.2f us: %.2fx"
              % (T, f, "" if c is None else " (Python side %.2f us, library %.2f us)" % (f - c, c), a, f / a))
        p = by.get((T, "prepared call (inplace, outputs reused)"))
        if p is not None:
            print("tokens=%d, medians: prepared call %.2f us per call%s, torch.add %.2f us: %.2fx"
                  % (T, p, "" if c is None else " (Python side %.2f us)" % (p - c), a, p / a))


if __name__ == "__main__":
    main()
