#!/usr/bin/env python3
"""gemm_pair.py - what a model sees at decode: the expert GEMM, then this step.

In an MoE layer the kernel before beammoe's is the down projection of the
experts (a GEMM writing the top_k expert results). This bench captures one
CUDA graph of N layers, each [GEMM, step], and reports the time per layer,
for three steps in the same process:

  beammoe   beam_moe_finalize_norm_residual_norm (post + next norm, the
            reference module's call; its decode kernels are launched with
            programmatic dependent launch, so their launch and prologue may
            overlap the GEMM's tail)
  compiled  torch.compile of the reference (finalize, post norm, residual
            add, next norm; bench/torch_compare.py's reference)
  none      the GEMM alone

"step cost" is a layer's time minus the GEMM-alone layer's: what the step
adds to the model's time. Every layer of the graph uses its own buffers
(cold: the sets together exceed 3x the L2), as consecutive layers do.

    python3 bench/gemm_pair.py [--tokens 1,8,64] [--hidden 7168] [--inter 2048]
                               [--layers 32] [--iters 30] [--json]

GEMM: [T*K, inter] x [inter, hidden] BF16 (K = 8; DeepSeek-V3's expert
intermediate size 2048 by default; a dense stand-in for the grouped GEMM,
same output bytes).
"""
import argparse
import json
import sys

import _bench as bench  # the package, PyTorch, the graph timing
import torch_compare as tc  # the reference, the step's inputs
from _bench import beammoe, torch

K = tc.K
STEP = tc.Config("fused", "post+next", post="w")  # the reference module's call


def layer_sets(t, h, inter, layers, dev):
    """Per layer: GEMM inputs and this step's other inputs (torch_compare's,
    less the expert rows that the GEMM writes)."""
    def gemm_input(*shape):
        return (torch.randn(*shape, device=dev) * 0.05).to(torch.bfloat16)
    return [(gemm_input(t * K, inter), gemm_input(inter, h)) + STEP.make_set(t, h, dev)[1:] for _ in range(layers)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="1,8,64")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--inter", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout instead of the table "
                    "(rows: tokens, then min / median / max us per layer of each step)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        bench.die("needs a CUDA device")
    dev = torch.device("cuda")
    h = args.hidden
    beam = STEP.beam(None)  # the package's default strategy
    head = "device: %s, torch %s, beammoe %s; GEMM [T*%d, %d] x [%d, %d] BF16, %d layers per graph" % (
        torch.cuda.get_device_name(dev), torch.__version__, beammoe.version(), K, args.inter, args.inter, h,
        args.layers)
    say = (lambda *a, **k: print(*a, file=sys.stderr, **k)) if args.json else print  # progress on stderr
    rows = []
    say(head)
    say("%6s  %12s  %12s  %12s  %14s  %14s" % ("T", "GEMM alone", "+ beammoe", "+ compiled", "beammoe step",
                                                  "compiled step"))
    with torch.inference_mode():
        for t in [int(v) for v in args.tokens.split(",") if v]:
            torch._dynamo.reset()
            compiled = torch.compile(STEP.reference(), dynamic=False)
            sets = layer_sets(t, h, args.inter, args.layers, dev)

            def gemm_only(a, b, w, r, pw, nw):
                return torch.mm(a, b)

            def with_beam(a, b, w, r, pw, nw):
                return beam(torch.mm(a, b), w, r, pw, nw)

            def with_compiled(a, b, w, r, pw, nw):
                return compiled(torch.mm(a, b), w, r, pw, nw)

            res, spread = {}, {}
            for name, fn in (("none", gemm_only), ("beammoe", with_beam), ("compiled", with_compiled)):
                med, low, high = bench.graph_stats_us(fn, sets, args.layers, args.iters)
                res[name], spread[name] = med, {"us_min": round(low, 3), "us": round(med, 3), "us_max": round(high, 3)}
            rows.append(dict(tokens=t, **spread))
            say("%6d  %9.2f us  %9.2f us  %9.2f us  %11.2f us  %11.2f us" % (
                t, res["none"], res["beammoe"], res["compiled"], res["beammoe"] - res["none"],
                res["compiled"] - res["none"]), flush=True)
            del sets
            torch.cuda.empty_cache()
    if args.json:
        json.dump({"format": "beammoe-gemm-pair/1", "run": head, "rows": rows}, sys.stdout, indent=1)
        print()


if __name__ == "__main__":
    main()
