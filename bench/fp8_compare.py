#!/usr/bin/env python3
"""fp8_compare.py - the FP8 form of the layer boundary against quantizing afterwards.

An FP8 deployment's next layer reads the next norm's output only through an
FP8 GEMM, after a quantization. One process, one timing method (that of
bench/torch_compare.py, from bench/_bench.py), four ways to get that input,
side by side per operation, shape and quantization form:

  bf16        the BF16 operation (normalized in BF16; no FP8 input yet)
  bf16+quant  the same, then a separate quantization of normalized: plain
              torch operations of vLLM's formulas, torch.compile'd (one
              compiled function per form, dynamic=False): what a user does
              today
  fp8         the operation's FP8 form (beammoe.*_fp8, keep_normalized=False):
              q and its scales in the same pass, no BF16 normalized
  fp8+bf16    the FP8 form with keep_normalized=True (both outputs; fused only)

Operations (`--ops`): fused (beam_moe_finalize_norm_residual_norm: finalize
of the top_k = 8 expert rows, post norm, residual add, next norm; the
reference module's call) and nrn (beam_norm_residual_norm, next norm only);
or any configuration of bench/torch_compare.py that has a next norm, by its
label with a colon (fused:post+next+scales, nrn:pre+next, nrn:next+inplace,
...; `--ops all`: every one): the pre-norm, scales, norms without weights and
in-place calls, each in its FP8 form with the same arguments.
Forms (`--forms`; beammoe.FP8Quant): group128 (vLLM's per_token_group_quant),
group128+ue8m0+cm (power-of-two scales, column-major: DeepGEMM's), token
(per token), tensor (a static scale, 0.0125); also group64, token+ue8m0;
and nvfp4 (beammoe.NVFP4Quant, global scale 672: E2M1 values, E4M3 scales
per 16 values in the tiled layout, docs/numerics.md#nvfp4).

The quantization reference (bf16+quant): group absmax a, s = max(a, 1e-10)
/ 448 (ue8m0: the power of two >= max(s, 1e-10)); per token s = max(a / 448,
1 / (448 * 512)); static s given; q = clamp(x / s, -448, 448) as
float8_e4m3fn; nvfp4 the definition of docs/numerics.md#nvfp4 in torch
operations (the scale's E4M3 by torch's conversion after the clamp to 448,
E2M1 by counting the rounding boundaries passed, the scales permuted into
the tiled layout). 448 and the static scale are tensors passed to the compiled
function, never Python numbers: Inductor on CUDA turns a division by a
constant into a multiplication by its reciprocal, 1 ulp off for 448. On CUDA
Inductor's eager_numerics.division_rounding is set where torch has it (else
Triton divides with the approximate div.full). With both, the reference is
bit-exact, and each row first checks once ("check") that fp8's and
fp8+bf16's q and scales equal bf16+quant's bits (scales by value, whatever
their strides), and their hidden and normalized equal bf16's.

Timing as torch_compare's: CUDA graph replays, "cold" (buffer sets together
over 3x the L2, each call with its own result buffers) or "hot" (one set);
on the CPU the median wall time of single calls. fp8 is quoted as a
fraction of its floor (bytes over the copy bandwidth measured in the same
run). Bytes: fused T*K*H*2 expert rows + T*K*4 weights + T*H*2 residual
read + T*H*2 hidden written + T*H q written (nvfp4: T*H/2) + the scales
written (4 per scale; nvfp4 1 per 16 values) + H*2 per norm weight (as
torch_compare counts them); nrn T*H*2 x read instead of the expert rows and
weights.

    python3 bench/fp8_compare.py [--device auto|cuda|cpu] [--ops fused,nrn|all|fused:post+next+scales,...]
                                 [--forms group128,group128+ue8m0+cm,token,tensor]
                                 [--shapes 1:7168,64:7168,...] [--modes cold,hot]
                                 [--iters N] [--threads N] [--json FILE]

--json FILE also writes every row to FILE for scripts/perf-report.py (as
torch_compare.py does): op, config (the --ops name), form, T, H, K, mode,
check, us (fp8's median), bf16_us, bf16_quant_us, fp8_bf16_us, the two
ratios, bytes and floor_pct. The text output is the same with or without it.

Needs PyTorch >= 2.1 (float8_e4m3fn, torch.compile) and the beammoe package
(installed, or from the source tree: run from the top of a build tree after
`make`; bench/_bench.py finds it).
"""
import _bench as bench  # the package, PyTorch, arguments, timing, JSON
import torch_compare as tc  # the BF16 calls, their inputs and bytes
from _bench import beammoe, torch

FP8 = getattr(torch, "float8_e4m3fn", None)
K = tc.K
FP8_MAX = 448.0
TENSOR_SCALE = 0.0125  # the static scale: |normalized| up to 5.6 before the clamp

FORMS = {
    "group128": dict(kind="group", group_size=128),
    "group128+ue8m0+cm": dict(kind="group", group_size=128, ue8m0=True, column_major=True),
    "token": dict(kind="token"),
    "tensor": dict(kind="tensor", scale=TENSOR_SCALE),
    "group64": dict(kind="group", group_size=64),
    "token+ue8m0": dict(kind="token", ue8m0=True),
    "nvfp4": dict(nvfp4=True),
}
NVFP4_SCALE = 672.0  # the global scale: vLLM's 448 * 6 / amax for amax 4
DEFAULT_FORMS = "group128,group128+ue8m0+cm,token,tensor"
# the BF16 calls and inputs of torch_compare's configurations: "fused" and
# "nrn" the reference module's call and the next norm alone, then every one
# with a next norm by its label ("fused:post+next+scales")
OPS = {c.label.replace(" ", ":"): c for c in tc.CONFIGS if c.op in ("fused", "nrn")}
OPS["fused"], OPS["nrn"] = OPS["fused:post+next"], OPS["nrn:next"]
METHODS = ("bf16", "bf16+quant", "fp8", "fp8+bf16")


# ---- the quantization a user writes today ------------------------------------------

def pow2ceil(s):
    """UE8M0: the smallest power of two >= s (s > 0, normal), from the bits
    (vLLM's register kernel; exact, unlike exp2(ceil(log2(s))) whose log2 is
    not correctly rounded on CUDA)."""
    b = s.view(torch.int32)
    up = ((b & 0x7FFFFF) != 0).to(torch.int32)
    return (((b >> 23) + up) << 23).view(torch.float32)


def quantize_groups(v, n, ue8m0, column_major, fp8_max):
    """vLLM's per_token_group_quant of FP32 rows v; column_major: the scales
    in DeepGEMM's layout (strides (1, T rounded up to 4)), as vLLM makes them."""
    t, h = v.shape
    g = v.view(t, h // n, n)
    s = g.abs().amax(-1).clamp(min=1e-10) / fp8_max
    if ue8m0:
        s = pow2ceil(s.clamp(min=1e-10))
    q = (g / s[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(t, h)
    if column_major:
        ld = (t + 3) // 4 * 4
        s = torch.empty_strided((t, h // n), (1, ld), dtype=torch.float32, device=v.device).copy_(s)
    return q, s


def quantize_tokens(v, ue8m0, fp8_max):
    """vLLM's dynamic per-token scaled_fp8_quant (the divide form)."""
    s = (v.abs().amax(-1, keepdim=True) / fp8_max).clamp(min=1.0 / (FP8_MAX * 512.0))
    if ue8m0:
        s = pow2ceil(s)
    return (v / s).clamp(-FP8_MAX, FP8_MAX).to(FP8), s


def make_form(name):
    """The beammoe quantization form of a --forms name."""
    kw = FORMS[name]
    return beammoe.NVFP4Quant(NVFP4_SCALE) if kw.get("nvfp4") else beammoe.FP8Quant(**kw)


def quantize_nvfp4(v, g):
    """docs/numerics.md#nvfp4 in torch operations, g the global scale as an
    FP32 [1] tensor: (q [T, H / 2] uint8, the scale codes [T rounded up to
    128, H / 16] uint8 in the tiled layout, padding rows zero)."""
    t, h = v.shape
    b = v.view(t, h // 16, 16)
    sv = g * (b.abs().amax(-1) * (1.0 / 6.0))  # 1 / 6 rounds to the definition's RN(1/6) in FP32
    sf = sv.clamp(max=FP8_MAX).to(FP8)
    value = sf.float()
    os = torch.where(value == 0, torch.zeros_like(value), g * (1.0 / value))
    p = b * os[..., None]
    a = p.abs().view(torch.int32)
    mag = ((a > 0x3E800000).int() + (a >= 0x3F400000).int() + (a > 0x3FA00000).int() + (a >= 0x3FE00000).int()
           + (a > 0x40200000).int() + (a >= 0x40600000).int() + (a > 0x40A00000).int())
    sign = torch.where(torch.isnan(p), torch.zeros_like(mag), (p.view(torch.int32) >> 28) & 8)
    c = (mag | sign).view(t, h)
    q = (c[:, 0::2] | (c[:, 1::2] << 4)).to(torch.uint8)
    rows = (t + 127) // 128 * 128
    codes = torch.zeros(rows, h // 16, dtype=torch.uint8, device=v.device)
    codes[:t] = sf.view(torch.uint8)
    tiled = codes.view(rows // 128, 4, 32, h // 64, 4).permute(0, 3, 2, 1, 4).reshape(rows, h // 16)
    return q, tiled


def untile(scales, t):
    """The first t rows of tiled NVFP4 scale codes [rows, H / 16] in row
    order (quantize_nvfp4's permutation undone)."""
    rows, k = scales.shape
    s = scales.reshape(rows // 128, k // 4, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(rows, k)
    return s[:t]


def quantizer(quant):
    """f(normalized, fp8_max, static_scale) -> (q, scales) for one FP8Quant,
    plain torch ops to compile; 448 and the static scale come in as tensors
    so that every division stays a division under Inductor."""
    def quantize(x, fp8_max, static_scale):
        v = x.float()
        if quant.kind == "nvfp4":
            return quantize_nvfp4(v, NVFP4_SCALE)
        if quant.kind == "group":
            return quantize_groups(v, quant.group_size, quant.ue8m0, quant.column_major, fp8_max)
        if quant.kind == "token":
            return quantize_tokens(v, quant.ue8m0, fp8_max)
        return (v / static_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), static_scale
    return quantize


def quant_consts(dev):
    """The reference's tensor constants: 448 and the static scale, FP32 [1]."""
    return (torch.full((1,), FP8_MAX, dtype=torch.float32, device=dev),
            torch.full((1,), TENSOR_SCALE, dtype=torch.float32, device=dev))


def exact_division():
    """Inductor's Triton kernels divide FP32 with the approximate div.full
    unless eager_numerics.division_rounding; the library (and eager torch)
    divide correctly rounded. Sets it where torch has it; says which."""
    numerics = getattr(torch._inductor.config, "eager_numerics", None)
    if numerics is None or not hasattr(numerics, "division_rounding"):
        return "Inductor division: torch's default (no eager_numerics.division_rounding here)"
    numerics.division_rounding = True
    return "Inductor division: correctly rounded (eager_numerics.division_rounding)"


# ---- the four methods -----------------------------------------------------------

def beam_call(op, **fp8):
    """torch_compare's BF16 call of the operation (strategy FUSED for the
    fused op): the baseline, and what bf16+quant quantizes; with fp8
    (quant, keep_normalized), its FP8 form with the same arguments."""
    return OPS[op].beam("fused" if OPS[op].op == "fused" else "plain", **fp8)


def methods(op, quant, compiled, consts):
    """name -> fn(*inputs) for one operation and form; every fn returns
    (hidden, normalized | None, q, scales) except bf16."""
    bf16 = beam_call(op)

    def bf16_quant(*args):
        hidden, normalized = bf16(*args)
        return (hidden, normalized) + tuple(compiled(normalized, *consts))
    out = {"bf16": bf16, "bf16+quant": bf16_quant, "fp8": beam_call(op, quant=quant, keep_normalized=False)}
    if OPS[op].op == "fused":
        out["fp8+bf16"] = beam_call(op, quant=quant, keep_normalized=True)
    return out


def same_bits(a, b):
    """Equal shapes and bits (by value: a column-major tensor against a
    row-major one; NaN equals NaN; one-byte codes whatever their dtype:
    torch.float4_e2m1fn_x2 and float8_e4m3fn against the reference's uint8)."""
    if a.shape != b.shape or (a.dtype != b.dtype and a.element_size() != 1):
        return False
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[a.element_size()]
    return torch.equal(a.view(as_int), b.view(as_int))


def check(fns, args, quant):
    """"agree" when fp8 (and fp8+bf16) write the bits of bf16+quant: hidden,
    q and scales (and normalized). Run once per operation, shape and form,
    before that form's first timing."""
    want = [o.clone() for o in fns["bf16+quant"](*tc.fresh(args))]
    t = want[0].shape[0]
    if quant.kind == "nvfp4":  # the scales' padding rows are not written: compare the tokens' rows
        want[3] = untile(want[3], t)
    for name in ("fp8", "fp8+bf16"):
        if name not in fns:
            continue
        got = list(fns[name](*tc.fresh(args)))
        if quant.kind == "nvfp4":
            got[3] = untile(got[3].view(torch.uint8), t)
        if got[1] is not None and not same_bits(got[1], want[1]):
            return "DIFFER"
        if not all(same_bits(g, w) for i, (g, w) in enumerate(zip(got, want)) if i != 1):
            return "DIFFER"
    return "agree"


# ---- bytes ----------------------------------------------------------------------

def scales_bytes(quant, t, h):
    """The scales written: FP32 per token and group, per token, or the one
    static scale (column-major padding is allocated, not written)."""
    if quant.kind == "nvfp4":
        return t * (h // 16)  # one byte a block of 16 (the tiles' padding rows are not written)
    if quant.kind == "group":
        return t * (h // quant.group_size) * 4
    return t * 4 if quant.kind == "token" else 4


def q_bytes(quant, t, h):
    """The quantized values written: a byte a value, NVFP4 half that."""
    return t * h // 2 if quant.kind == "nvfp4" else t * h


def fp8_bytes(op, quant, t, h):
    """fp8's bytes: torch_compare's count of the BF16 operation with
    normalized written (T*H*2) replaced by q (T*H) and its scales."""
    return OPS[op].nbytes(t, h) - t * h * 2 + q_bytes(quant, t, h) + scales_bytes(quant, t, h)


def set_bytes(op, quant, t, h):
    """One buffer set's size for the cold rotation: inputs and outputs, plus
    what the largest method (fp8+bf16) allocates, as torch_compare counts it."""
    cfg = OPS[op]
    return cfg.nbytes(t, h) + cfg.results_bytes(t, h) + q_bytes(quant, t, h) + scales_bytes(quant, t, h)


# ---- CUDA and CPU runs ----------------------------------------------------------

def time_shape(op, forms, compiled, consts, t, h, timer, checks):
    """Rows of one operation and shape: bf16 timed once (it does not depend
    on the form), the others per form; checks[form] (once per shape, before
    the first timing of that form) says whether the FP8 bits agree."""
    rows = []
    base = timer(beam_call(op))[0]
    for name, quant in forms.items():
        fns = methods(op, quant, compiled[name], consts)
        if name not in checks:
            checks[name] = check(fns, timer.args, quant)
        res = {"bf16": base}
        res.update((m, timer(fn)[0]) for m, fn in fns.items() if m != "bf16")
        rows.append((op, name, timer.mode, t, h, checks[name], res))
        print("%s %s T=%d H=%d %s [%s]: %s" % (op, name, t, h, timer.mode, checks[name], ", ".join(
            "%s %.2f us" % kv for kv in res.items())), flush=True)
    return rows


def compile_forms(forms):
    """One compiled quantization per form (recompiled per shape); fullgraph,
    so that a graph break fails rather than timing eager torch."""
    torch._dynamo.reset()
    return {name: torch.compile(quantizer(q), dynamic=False, fullgraph=True) for name, q in forms.items()}


def run(dev, ops, forms, shapes, modes, iters, l2):
    """Every operation's rows, shape by shape (and mode by mode on CUDA)."""
    consts, compiled = quant_consts(dev), compile_forms(forms)
    rows = []
    for op in ops:
        for t, h in shapes:
            checks = {}
            size = min(set_bytes(op, q, t, h) for q in forms.values())  # the fewest bytes: the most cold sets
            for timer in bench.timers(dev, modes, t, iters, l2, size, lambda: OPS[op].make_set(t, h, dev)):
                rows += time_shape(op, forms, compiled, consts, t, h, timer, checks)
    return rows


# ---- output and arguments ---------------------------------------------------------

def table(dev, rows, forms, bw):
    """A Markdown table, columns padded as torch_compare's: per row the four
    times, b/c (the speedup over quantizing afterwards), a/c (>= 1: the FP8
    form no slower than BF16) and fp8 as a fraction of its memory floor."""
    cols = ["T", "H", "op", "form", "mode", "check"] + ["%s us" % m for m in METHODS] + [
        "bf16+quant / fp8", "bf16 / fp8", "fp8 of floor"]
    text = (2, 3, 4, 5)  # left-aligned; the rest are numbers
    out = [cols]
    for op, name, mode, t, h, agree, r in rows:
        floor_us = fp8_bytes(op, forms[name], t, h) / bw * 1e6
        out.append([str(t), str(h), op, name, mode, agree] + ["%.2f" % r[m] if m in r else "-" for m in METHODS] + [
            "%.2fx" % (r["bf16+quant"] / r["fp8"]), "%.2fx" % (r["bf16"] / r["fp8"]),
            "%.1f%%" % (100 * floor_us / r["fp8"])])
    widths = [max([3] + [len(row[i]) for row in out]) for i in range(len(cols))]  # a rule needs 3
    print()
    print("beammoe's FP8 form vs the BF16 op + torch.compile'd quantization (K=%d), %s, copy %.1f GB/s" % (
        K, dev, bw / 1e9))
    print()
    rule = [("-" * w if i in text else "-" * (w - 1) + ":") for i, w in enumerate(widths)]
    for row in out[:1] + [rule] + out[1:]:
        print("| " + " | ".join(v.ljust(w) if i in text else v.rjust(w)
                                for i, (v, w) in enumerate(zip(row, widths))) + " |")


def json_records(rows, forms, bw):
    """The rows as records for scripts/perf-report.py (medians, us)."""
    out = []
    for op, name, mode, t, h, agree, r in rows:
        nbytes = fp8_bytes(op, forms[name], t, h)
        rec = {"op": OPS[op].op, "config": op, "form": name, "T": t, "H": h, "K": K, "mode": mode,
               "check": agree, "us": round(r["fp8"], 3), "bf16_us": round(r["bf16"], 3),
               "bf16_quant_us": round(r["bf16+quant"], 3), "ratio_quant": round(r["bf16+quant"] / r["fp8"], 4),
               "ratio_bf16": round(r["bf16"] / r["fp8"], 4), "bytes": nbytes,
               "floor_pct": round(100 * nbytes / bw * 1e6 / r["fp8"], 2)}
        if "fp8+bf16" in r:
            rec["fp8_bf16_us"] = round(r["fp8+bf16"], 3)
        out.append(rec)
    return out


def default_shapes(dev):
    """CUDA: T = 1, 64, 4096, 16384 at H = 7168 and T = 4096 at H = 4096 and
    2048; CPU: two small shapes, so that it runs quickly."""
    if dev == "cpu":
        return [(1, 7168), (64, 2048)]
    return [(t, 7168) for t in (1, 64, 4096, 16384)] + [(4096, 4096), (4096, 2048)]


def parse_shapes(given, forms):
    """T:H pairs; H must divide into every group form's groups."""
    shapes = bench.parse_shapes(given)
    for name, q in forms.items():
        bad = [h for _, h in shapes if q.kind == "group" and h % q.group_size]
        if bad:
            bench.die("H=%d is not a multiple of form %s's group size" % (bad[0], name))
    return shapes


def main():
    ap = bench.parser(__doc__)
    ap.add_argument("--ops", default="fused,nrn", help="operations: fused, nrn, a configuration of "
                    "torch_compare with a next norm (fused:post+next+scales, ...), or all (default fused,nrn)")
    ap.add_argument("--forms", default=DEFAULT_FORMS, help="quantization forms, of: %s (default %s)" % (
        ", ".join(FORMS), DEFAULT_FORMS))
    bench.sweep_args(ap, "device", "cold")
    args = ap.parse_args()
    if FP8 is None or not hasattr(torch, "compile"):
        bench.die("torch %s has no float8_e4m3fn or torch.compile" % torch.__version__)
    dev = bench.device(args.device)
    ops = [k for k in OPS if ":" in k] if args.ops == "all" else bench.pick("ops", args.ops, list(OPS))
    forms = {n: make_form(n) for n in bench.pick("forms", args.forms, list(FORMS))}
    shapes = parse_shapes(args.shapes, forms) if args.shapes else default_shapes(dev)
    modes = bench.pick("modes", args.modes, ["cold", "hot"]) if dev == "cuda" else None
    bench.raise_compile_limits()
    with torch.inference_mode():
        bw, l2 = bench.start(dev, args.iters, args.threads, exact_division() if dev == "cuda" else None)
        rows = run(dev, ops, forms, shapes, modes, args.iters, l2)
    table(dev, rows, forms, bw)
    if args.json:
        bench.write_json(args.json, "fp8_compare", dev, bw, json_records(rows, forms, bw))


if __name__ == "__main__":
    main()
