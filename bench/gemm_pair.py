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
                               [--layers 32] [--iters 30]

GEMM: [T*K, inter] x [inter, hidden] BF16 (K = 8; DeepSeek-V3's expert
intermediate size 2048 by default; a dense stand-in for the grouped GEMM,
same output bytes).
"""
import argparse
import os
import sys

# torch_compare.py, beside this file, finds the package (the source tree's
# when none is installed) and PyTorch, and holds the reference and the
# timing helper
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_compare as tc  # noqa: E402

import beammoe  # noqa: E402
import torch  # noqa: E402

BF16 = torch.bfloat16
K = tc.K
EPS = tc.EPS


def layer_sets(t, h, inter, layers, dev):
    """Per layer: GEMM inputs and this step's other inputs."""
    sets = []
    for _ in range(layers):
        a = (torch.randn(t * K, inter, device=dev) * 0.05).to(BF16)
        b = (torch.randn(inter, h, device=dev) * 0.05).to(BF16)
        w = torch.rand(t, K, device=dev).softmax(-1)
        r = torch.randn(t, h, device=dev).to(BF16)
        pw = (1 + 0.1 * torch.randn(h, device=dev)).to(BF16)
        nw = (1 + 0.1 * torch.randn(h, device=dev)).to(BF16)
        sets.append((a, b, w, r, pw, nw))
    return sets


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="1,8,64")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--inter", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gemm_pair.py: needs a CUDA device")
    dev = torch.device("cuda")
    h = args.hidden
    ref = tc.Config("fused", "post+next", post="w").reference()
    print("device: %s, torch %s, beammoe %s; GEMM [T*%d, %d] x [%d, %d] BF16, %d layers per graph" % (
        torch.cuda.get_device_name(dev), torch.__version__, beammoe.version(), K, args.inter, args.inter, h,
        args.layers))
    print("%6s  %12s  %12s  %12s  %14s  %14s" % ("T", "GEMM alone", "+ beammoe", "+ compiled", "beammoe step",
                                                  "compiled step"))
    with torch.inference_mode():
        for t in [int(v) for v in args.tokens.split(",") if v]:
            torch._dynamo.reset()
            compiled = torch.compile(ref, dynamic=False)
            sets = layer_sets(t, h, args.inter, args.layers, dev)

            def gemm_only(a, b, w, r, pw, nw):
                return torch.mm(a, b)

            def with_beam(a, b, w, r, pw, nw):
                g = torch.mm(a, b)
                return beammoe.beam_moe_finalize_norm_residual_norm(
                    beammoe.MoEOutput(g, w), r, pw, EPS, nw, EPS, None, tc.ROUTED_SCALE)

            def with_compiled(a, b, w, r, pw, nw):
                return compiled(torch.mm(a, b), w, r, pw, nw)

            res = {}
            for name, fn in (("none", gemm_only), ("beammoe", with_beam), ("compiled", with_compiled)):
                res[name] = tc.graph_time_us(fn, sets, args.layers, args.iters)
            print("%6d  %9.2f us  %9.2f us  %9.2f us  %11.2f us  %11.2f us" % (
                t, res["none"], res["beammoe"], res["compiled"], res["beammoe"] - res["none"],
                res["compiled"] - res["none"]), flush=True)
            del sets
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
