"""The gather's quantized output (beam_moe_finalize_gather_norm_residual_norm_fp8)
over a CPU group (R ranks as threads, each holding its own tokens): on every
rank, bit for bit, the local _fp8 operation on all the tokens, every form and
strategy; the scales' layout is each rank's own, ue8m0 is not. The gathers
run in Python (the hook over threads, a one-rank gloo group) too; the calls it
refuses (nothing written); its torch operator, with one rank."""
import pytest
import torch

import beammoe
from conftest import (BLOCK_QUANTS, FORMS, H, K, QUANT_TYPES, QUANTS, STRATEGIES, ThreadAllGather, assert_same_q,
                      gather, gather_calls, gather_q)
from conftest import local_q, local_rows, needs_fp8, needs_gloo, run_ranks
from reference import assert_bits_equal, random_bf16, random_case

pytestmark = needs_fp8

CALLS = ((False, False), (True, False), (False, True))  # (keep_normalized, inplace) of each strategy's calls


def data(gen, tokens):
    """Random non-zero inputs of all the tokens: expert rows, weights, residual, norm weights."""
    g, w = random_case(gen, max(tokens, 1), K, H, tokens=tokens)
    residual = random_bf16(gen, tokens, H, scale=2.0)
    return g, w, residual, random_bf16(gen, H), 1 + 0.1 * random_bf16(gen, H)


def assert_all_same(results, want):
    for r, out in enumerate(results):
        for what, keep, got in out:
            assert_same_q(got, want, keep, "rank %d %s" % (r, what))


def refused(ws, err, match, g, w, residual, pw, nw, quant=beammoe.FP8Quant("token"), **kw):
    """The in-place call raises err (matching `match`) and leaves residual as it was."""
    res = residual.clone()
    with pytest.raises(err, match=match):
        gather_q(ws, g, w, res, pw, nw, quant, inplace=True, **kw)
    assert_bits_equal(res, residual, "residual after a refused call")


FN = r"^beam_moe_finalize_gather_norm_residual_norm_q: "


def rank_calls(grp, r, nranks, tokens, g, w, residual, pw, nw, quant):
    """Rank r's calls: every strategy, with and without normalized kept, in
    place or not; and the BF16 gather's normalized of each strategy."""
    ws = beammoe.Workspace.cpu(grp, r, 32, H, moe_gather_oneshot_max_tokens=4,
                               moe_gather_separate_norm_min_tokens=17)
    try:
        lg, lw = local_rows(g, w, tokens, nranks, r)
        out = []
        for strategy in STRATEGIES:
            out += gather_calls(ws, lg, lw, residual, pw, nw, quant, (strategy,), CALLS)
            _, n = gather(ws, lg, lw, residual, pw, nw, strategy=strategy)
            out.append(("%s BF16 gather" % strategy, None, n))
        return out
    finally:
        ws.close()


@pytest.mark.parametrize("nranks", [1, 2, 3])
@pytest.mark.parametrize("tokens", [0, 7])
@pytest.mark.parametrize("form", range(len(FORMS)))
def test_gather_fp8_matches_local(gen, poisoned, nranks, tokens, form):
    quant = FORMS[form]
    g, w, residual, pw, nw = data(gen, tokens)
    want = local_q(g, w, residual, pw, nw, quant)
    with beammoe.CpuGroup(nranks) as grp:
        results = run_ranks(nranks, lambda r: rank_calls(grp, r, nranks, tokens, g, w, residual, pw, nw, quant))
    for r, out in enumerate(results):
        for what, keep, got in out:
            what = "rank %d %s %r" % (r, what, quant)
            if keep is None:  # the BF16 gather's normalized
                assert_bits_equal(got, want[1], what)
            else:
                assert_same_q(got, want, keep, what)


def test_single_rank_in_calling_thread(gen, poisoned):
    """R = 1 without threads; the column-major scales' ld of all tokens."""
    quant = beammoe.FP8Quant("group", 128, column_major=True)
    g, w, residual, pw, nw = data(gen, 5)
    want = local_q(g, w, residual, pw, nw, quant, keep_normalized=False)
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 8, H) as ws:
        got = gather_q(ws, g, w, residual, pw, nw, quant)
    assert got[3].shape == (5, H // 128) and got[3].stride() == (1, 8)
    assert_same_q(got, want, False, "R=1")


# ---- refused calls: an error, and nothing written -------------------------------

def test_argument_errors(gen):
    g, w, residual, pw, nw = data(gen, 5)
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 4, H) as ws:
        refused(ws, TypeError, FN + QUANT_TYPES + "dict", g, w, residual, pw, nw, quant={"kind": "token"})
        refused(ws, TypeError, FN + r"keep_normalized", g, w, residual, pw, nw, keep_normalized=1)
        refused(ws, ValueError, r"tokens=5 must be <= max_tokens=4 of the workspace", g, w, residual, pw, nw)
        g4, w4, r4 = g[: 4 * K], w[:4], residual[:4]
        refused(ws, ValueError, r"strategy=FUSED: unknown strategy for this operation", g4, w4, r4, pw, nw,
                strategy="fused")
        refused(ws, ValueError, FN + r"residual has shape \(4, 256\)", g4, w4, r4[:, :256].contiguous(), pw, nw)
        res = r4.clone()
        with pytest.raises(ValueError, match=FN + r"next_eps must be given"):
            beammoe.beam_moe_finalize_gather_norm_residual_norm_fp8(
                beammoe.MoEOutput(g4, w4), res, pw, 1e-6, None, None, None, ws, quant=beammoe.FP8Quant(), inplace=True)
        assert_bits_equal(res, r4)
        with pytest.raises(TypeError, match=FN + r"workspace must be a beammoe.Workspace, got NoneType"):
            gather_q(None, g4, w4, r4, pw, nw, beammoe.FP8Quant())
    refused(ws, ValueError, r"the workspace is closed", g4, w4, r4, pw, nw)


@pytest.mark.parametrize("nranks", [1, 2, 3])
@pytest.mark.parametrize("tokens", [0, 7, 130])
def test_hook_gathers_in_python(gen, poisoned, nranks, tokens):
    """With the all_gather hook, the UNFUSED calls (asked for, and AUTO's
    choice once the thresholds say so) gather in Python, through the hook:
    every FP8 form, NVFP4 and MXFP8, normalized kept or not, in place or not, give
    on every rank the local operation's bits on all the tokens."""
    g, w, residual, pw, nw = data(gen, tokens)
    wants = [local_q(g, w, residual, pw, nw, quant) for quant in QUANTS]
    ag = ThreadAllGather(nranks)

    def body(grp, r):
        lg, lw = local_rows(g, w, tokens, nranks, r)
        out = []
        with beammoe.Workspace.cpu(grp, r, 256, H, moe_gather_oneshot_max_tokens=0,
                                   moe_gather_separate_norm_min_tokens=1) as ws:
            ws.all_gather = ag.hook_for(r)
            for quant in QUANTS:
                before = ag.count(r)
                out.append(gather_calls(ws, lg, lw, residual, pw, nw, quant, ("unfused", None)))
                # each call: the signature through the hook, then the rows (without tokens, the
                # call's confirmation; AUTO takes ONESHOT, the library's, for no tokens)
                calls = ag.count(r) - before
                assert calls == (16 if tokens else 8), calls
        return out

    with beammoe.CpuGroup(nranks) as grp:
        results = run_ranks(nranks, lambda r: body(grp, r))
    for i, quant in enumerate(QUANTS):
        assert_all_same([out[i] for out in results], wants[i])


@pytest.mark.parametrize("hook", [False, True])
def test_each_rank_its_own_layout(gen, poisoned, hook):
    """Where the scales lie and whether normalized is kept are each rank's
    own (rank 0 column-major and keeping normalized, rank 1 row-major), in
    the library's gather and through the hook; ranks that differ in ue8m0
    (through the hook also the static scale, the global scale or the kind,
    or a rank that rejects its form) make every rank raise, with nothing
    written."""
    nranks, tokens = 2, 5
    forms = (beammoe.FP8Quant("group", 64, column_major=True), beammoe.FP8Quant("group", 64))
    g, w, residual, pw, nw = data(gen, tokens)
    wants = [local_q(g, w, residual, pw, nw, q, keep_normalized=r == 0) for r, q in enumerate(forms)]
    ag = ThreadAllGather(nranks)
    disagree = r"^%sthe ranks disagree on quant: rank 0 has .*, rank 1 has " % FN
    kw = dict(strategy="unfused") if hook else {}

    def body(grp, r):
        with beammoe.Workspace.cpu(grp, r, 8, H, timeout_ms=20000 if hook else 5000) as ws:
            ws.all_gather = ag.hook_for(r) if hook else None
            lg, lw = local_rows(g, w, tokens, nranks, r)
            got = gather_q(ws, lg, lw, residual, pw, nw, forms[r], keep_normalized=r == 0, **kw)
            if not hook:
                refused(ws, ValueError, r"passed different quant", lg, lw, residual, pw, nw,
                        beammoe.FP8Quant("group", 64, ue8m0=r == 1))
                return got
            for quant in (beammoe.FP8Quant("group", 64, ue8m0=r == 1), beammoe.FP8Quant("tensor", scale=1.0 + r),
                          beammoe.NVFP4Quant(1.0 + r), beammoe.FP8Quant("token") if r else beammoe.NVFP4Quant(1.0),
                          beammoe.MXFP8Quant() if r else beammoe.FP8Quant("group", 128)):
                refused(ws, ValueError, disagree, lg, lw, residual, pw, nw, quant, **kw)
            if r == 1:
                refused(ws, TypeError, FN + QUANT_TYPES + "dict", lg, lw, residual, pw, nw, {}, **kw)
            else:
                refused(ws, ValueError, r"^%srank 1 failed \(TypeError: %squant must be" % (FN, FN[1:]), lg, lw,
                        residual, pw, nw, **kw)
            return got

    with beammoe.CpuGroup(nranks) as grp:
        for r, got in enumerate(run_ranks(nranks, lambda r: body(grp, r))):
            assert_same_q(got, wants[r], r == 0, "rank %d" % r)


@needs_gloo
def test_process_group_workspace(gen, poisoned, gloo1):
    """A CPU workspace over a (one-rank) gloo group gathers every call in
    Python: every strategy, form, keep_normalized and inplace, with and
    without the hook, the local operation's bits."""
    for tokens in (0, 3, 130):
        g, w, residual, pw, nw = data(gen, tokens)
        with beammoe.Workspace(None, 256, H, device="cpu") as ws:
            for quant in QUANTS:
                want = local_q(g, w, residual, pw, nw, quant)
                assert_all_same([gather_calls(ws, g, w, residual, pw, nw, quant, STRATEGIES)], want)
                calls = []
                ws.all_gather = lambda out, inp: (calls.append(1), out.copy_(inp))
                assert_all_same([gather_calls(ws, g, w, residual, pw, nw, quant, (None,))], want)
                ws.all_gather = None
                assert len(calls) == (4 if tokens else 0)  # the rows (the signature goes over the group)


@needs_gloo
@pytest.mark.skipif(not beammoe.HAVE_TORCH_OPS, reason="torch.compile of the operators needs torch >= 2.4")
def test_process_group_workspace_compiled(gen, poisoned, gloo1):
    """torch.compile(fullgraph=True): the operator runs the gather in Python
    and the library quantizes, for an FP8 form, NVFP4 and MXFP8."""
    g, w, residual, pw, nw = data(gen, 6)
    with beammoe.Workspace(None, 16, H, device="cpu") as ws:
        def f(g, w, residual):
            return ((gather_q(ws, g, w, residual, pw, nw, QUANTS[2], keep_normalized=True),)
                    + tuple(gather_q(ws, g, w, residual, pw, nw, quant) for quant in BLOCK_QUANTS))

        torch._dynamo.reset()
        got = torch.compile(f, fullgraph=True)(g, w, residual)
    assert_same_q(got[0], local_q(g, w, residual, pw, nw, QUANTS[2]), True, "compiled FP8")
    for quant, res in zip(BLOCK_QUANTS, got[1:]):
        assert_same_q(res, local_q(g, w, residual, pw, nw, quant), False, "compiled %r" % quant)


# ---- the torch operator -----------------------------------------------------------

needs_ops = pytest.mark.skipif(not beammoe.HAVE_TORCH_OPS,
                               reason="torch %s: no torch.library.custom_op" % torch.__version__)


@needs_ops
@pytest.mark.parametrize("form", [0, 3, 5, 6])
def test_compiled(gen, form):
    """torch.compile(fullgraph=True) through
    torch.ops.beammoe.moe_finalize_gather_norm_residual_norm_q: the eager
    call's bits, shapes and strides."""
    quant = FORMS[form]
    g, w, residual, pw, nw = data(gen, 6)
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 8, H) as ws:
        def f(g, w, residual):
            return gather_q(ws, g, w, residual, pw, nw, quant, keep_normalized=form % 2 == 0)

        want = f(g, w, residual)
        torch._dynamo.reset()
        got = torch.compile(f, fullgraph=True)(g, w, residual)
    assert_same_q(got, want, form % 2 == 0, "compiled")


@needs_ops
def test_inplace_not_compiled(gen):
    """inplace=True has no torch operator: under torch.compile it says so."""
    g, w, residual, pw, nw = data(gen, 2)
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 8, H) as ws:
        def f(g, w, residual):
            return gather_q(ws, g, w, residual, pw, nw, beammoe.FP8Quant("token"), inplace=True)

        torch._dynamo.reset()
        with pytest.raises(Exception, match=r"runs in eager calls"):
            torch.compile(f, fullgraph=True)(g, w, residual.clone())


@needs_ops
def test_operator_direct(gen):
    """Called directly, the operator checks the workspace handle and the
    arguments, and gathers in Python where the workspace does."""
    g, w, residual, pw, nw = data(gen, 3)
    op = torch.ops.beammoe.moe_finalize_gather_norm_residual_norm_fp8
    args = (g, w, residual, pw, 1e-6, nw, 1e-5, [0.5, 1.5], 1.25, 0) + beammoe.FP8Quant().fields() + (False,)
    with pytest.raises(ValueError, match=r"workspace=0x3039 is not an open beammoe.Workspace"):
        op(12345, *args)
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 8, H) as ws:
        h, n, q, qs = op(ws.handle, *args)
        assert n.numel() == 0
        want = gather_q(ws, g, w, residual, pw, nw, beammoe.FP8Quant(), strategy=None)
        assert_same_q((h, None, q, qs), want, False, "operator")
        # UNFUSED with the hook: the gather in Python, the same bits
        calls = []
        ws.all_gather = lambda out, inp: (calls.append(1), out.copy_(inp))
        h, n, q, qs = op(ws.handle, *args[:9], 2, *args[10:])
        assert n.numel() == 0 and len(calls) == 2
        assert_same_q((h, None, q, qs), want, False, "operator, gathered in Python")


@needs_ops
@pytest.mark.parametrize("form", [2, 4, 6])
def test_opcheck(gen, form):
    """torch.library.opcheck: schema, fake implementation (shapes, strides
    and dtypes of the real one), autograd registration, AOT dispatch."""
    g, w, residual, pw, nw = data(gen, 6)
    op = torch.ops.beammoe.moe_finalize_gather_norm_residual_norm_fp8.default
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 8, H) as ws:
        for keep in (False, True):
            torch.library.opcheck(op, (ws.handle, g, w, residual, pw, 1e-6, nw, 1e-5, [0.5, 1.5], 1.25, 0)
                                  + FORMS[form].fields() + (keep,))


@needs_ops
def test_meta_tensors(gen):
    """Meta tensors take the operator's fake implementation: the eager
    call's shapes and strides (column-major scales of all tokens)."""
    g, w, residual, pw, nw = data(gen, 5)
    quant = beammoe.FP8Quant("group", 64, column_major=True)
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 8, H) as ws:
        want = gather_q(ws, g, w, residual, pw, nw, quant, keep_normalized=True)
        got = gather_q(ws, *(t.to("meta") for t in (g, w, residual, pw, nw)), quant, keep_normalized=True)
    for a, b in zip(got, want):
        assert a.device.type == "meta" and (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)
