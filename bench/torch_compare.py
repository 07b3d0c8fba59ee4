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

Timing (bench/_bench.py): CUDA graph replays (when torch sees a GPU),
median per call, with cold buffer sets (none in L2; an in-place call writes
into its own set's residual, measured as the others are) or hot; on the CPU
the median wall time of single calls. beammoe's time is quoted as a
fraction of its floor: the operation's bytes over the copy bandwidth
measured in the same run. Bytes: finalize T*K*H*2 + T*K*4 + T*H*2; the
fused op adds the residual read and normalized written (2*T*H*2);
norm_residual_norm 4*T*H*2; H*2 per norm weight.

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
import _bench as bench  # the package, PyTorch, arguments, timing, JSON
from _bench import beammoe, torch

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

        def residual_norm(x, residual, next_w):
            hidden = ref_residual(x, residual, scales)
            return hidden, rmsnorm(hidden, next_w, EPS)
        if op == "finalize":
            def ref(gemm2, weights, post_w, out):
                f = ref_finalize(gemm2, weights, *out.shape)
                return rmsnorm(f, post_w, EPS) if post else f
        elif op == "fused":
            def ref(gemm2, weights, residual, post_w, next_w):
                f = ref_finalize(gemm2, weights, *residual.shape)
                return residual_norm(rmsnorm(f, post_w, EPS) if post else f, residual, next_w)
        else:
            def ref(x, residual, pre_w, next_w):
                return residual_norm(rmsnorm(x, pre_w, EPS) if pre else x, residual, next_w)
        return ref

    def strategies(self, unfused):
        if self.op == "fused":
            return ["fused", "unfused"] if unfused else ["fused"]
        return ["plain"]

    def beam(self, strategy, **fp8):
        """beammoe's call; with fp8 (quant, keep_normalized) its FP8 form (fused and nrn)."""
        post_eps = EPS if self.post else None
        if self.op == "finalize":
            def run(gemm2, weights, post_w, out):
                return beammoe.beam_moe_finalize(gemm2, weights, out, ROUTED_SCALE, post_w, post_eps)
        elif self.op == "fused":
            fused = beammoe.beam_moe_finalize_norm_residual_norm_fp8 if fp8 else \
                beammoe.beam_moe_finalize_norm_residual_norm

            def run(gemm2, weights, residual, post_w, next_w):
                return fused(beammoe.MoEOutput(gemm2, weights), residual, post_w, post_eps, next_w, EPS, self.scales,
                             ROUTED_SCALE, strategy=strategy, inplace=self.inplace, **fp8)
        else:
            pre_eps = EPS if self.pre else None
            nrn = beammoe.beam_norm_residual_norm_fp8 if fp8 else beammoe.beam_norm_residual_norm

            def run(x, residual, pre_w, next_w):
                return nrn(x, residual, pre_w, pre_eps, next_w, EPS, self.scales, inplace=self.inplace, **fp8)
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


def run(dev, configs, shapes, modes, iters, unfused, bw, l2):
    """Rows (cfg, mode, T, H, medians by method, floor us, (median, min, max) by method)."""
    rows = []
    for cfg in configs:
        for t, h in shapes(cfg):
            torch._dynamo.reset()
            compiled = torch.compile(cfg.reference(), dynamic=False)
            size = cfg.nbytes(t, h) + cfg.results_bytes(t, h)
            for i, timer in enumerate(bench.timers(dev, modes, t, iters, l2, size, lambda: cfg.make_set(t, h, dev))):
                if not i:
                    print(check_line(cfg, t, h, timer.args, compiled))
                methods = [("compiled", compiled)] + [(s, cfg.beam(s)) for s in cfg.strategies(unfused)]
                stats = {name: timer(fn) for name, fn in methods}
                results = {name: st[0] for name, st in stats.items()}
                floor_us = cfg.nbytes(t, h) / bw * 1e6
                rows.append((cfg, timer.mode, t, h, results, floor_us, stats))
                print("%s T=%d H=%d%s: %s; floor %.2f us" % (cfg.label, t, h, timer.label, ", ".join(
                    "%s %.2f us" % kv for kv in results.items()), floor_us), flush=True)
    return rows


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
    ap = bench.parser(__doc__)
    ap.add_argument("--ops", default="fused,finalize,nrn", help="operations (default: all)")
    ap.add_argument("--configs", help="configuration names, comma-separated (default: all of --ops)")
    bench.sweep_args(ap, "device and operation", "cold,hot")
    ap.add_argument("--no-unfused", action="store_true", help="skip beammoe's UNFUSED strategy")
    args = ap.parse_args()
    if not hasattr(torch, "compile"):
        bench.die("torch %s has no torch.compile (needs torch >= 2.0)" % torch.__version__)
    dev = bench.device(args.device)
    ops = bench.pick("ops", args.ops, sorted({c.op for c in CONFIGS}))
    configs = [c for c in CONFIGS if c.op in ops]
    if args.configs:  # names of the configurations of --ops
        names = bench.pick("configs", args.configs, list(dict.fromkeys(c.name for c in configs)))
        configs = [c for c in configs if c.name in names]
    fixed = bench.parse_shapes(args.shapes) if args.shapes else None
    shapes = (lambda cfg: fixed) if args.shapes else default_shapes(dev)
    modes = bench.pick("modes", args.modes, ["cold", "hot"]) if dev == "cuda" else None
    bench.raise_compile_limits()
    with torch.inference_mode():
        bw, l2 = bench.start(dev, args.iters, args.threads)
        rows = run(dev, configs, shapes, modes, args.iters, not args.no_unfused, bw, l2)
    table(dev, rows, bw)
    if args.json:
        bench.write_json(args.json, "torch_compare", dev, bw, json_records(rows))


if __name__ == "__main__":
    main()
