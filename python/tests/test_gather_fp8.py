"""The gather's FP8 output (beam_moe_finalize_gather_norm_residual_norm_fp8)
over a CPU group: R ranks as threads of this process, each holding its own
tokens. On every rank (hidden, normalized, q, q_scales) equal, bit for bit,
the local beam_moe_finalize_norm_residual_norm_fp8 on all the tokens, for
every FP8Quant form of test_fp8.py and every strategy of the gather; the
normalized it keeps equals the BF16 gather's; the scales' layout is each
rank's own, ue8m0 is not. The gathers run in Python (_pgather.py: the
UNFUSED calls with the workspace's all_gather hook, over ranks as threads;
a CPU workspace over a one-rank gloo group; more ranks as processes in
test_gather_process_group.py) give the same bits, for every FP8 form and
NVFP4. Then the calls it refuses: argument errors before anything is
written, the in-place call under torch.compile; and its torch operator
(torch.compile, torch.library.opcheck, meta tensors, direct calls), with
one rank."""
import pytest
import torch

import beammoe
from beammoe import _run
from beammoe import quant as quant_module
from beammoe._run import KINDS
from reference import assert_bits_equal, random_bf16, random_case
from test_fp8 import FORMS, FP8, needs_fp8  # the forms test_fp8.py checks against torch's quantization
from test_gather_cpu import local_rows, run_ranks  # ranks as threads, a rank's expert rows
from test_gather_process_group import ThreadAllGather  # an all_gather hook over threads
from test_gather_process_group import gloo1, needs_gloo  # noqa: F401  (a one-rank gloo group)

pytestmark = needs_fp8

TOP_K, H = 4, 512
STRATEGIES = (None, "oneshot", "twoshot", "unfused")
# (keep_normalized, inplace) of each strategy's calls
CALLS = ((False, False), (True, False), (False, True))
ALL_CALLS = ((False, False), (False, True), (True, False), (True, True))  # (keep_normalized, inplace)
# every FP8 form and NVFP4 (its g: vLLM's 448 * 6 / amax for amax 4)
QUANTS = FORMS + [beammoe.NVFP4Quant(672.0)]
POST_EPS, NEXT_EPS, SCALES, ROUTED = 1e-6, 1e-5, (0.5, 1.5), 1.25


def data(gen, tokens):
    """Random non-zero inputs of all the tokens: expert rows, weights, residual, norm weights."""
    g, w = random_case(gen, max(tokens, 1), TOP_K, H, tokens=tokens)
    residual = random_bf16(gen, tokens, H, scale=2.0)
    return g, w, residual, random_bf16(gen, H), 1 + 0.1 * random_bf16(gen, H)


def gather_fp8(ws, g, w, residual, pw, nw, quant, **kw):
    return beammoe.beam_moe_finalize_gather_norm_residual_norm_fp8(
        beammoe.MoEOutput(g, w), residual, pw, POST_EPS, nw, NEXT_EPS, SCALES, ws, ROUTED, quant=quant, **kw)


@pytest.fixture
def poisoned(monkeypatch):
    """q and q_scales made NaN before the call (0x7F is an E4M3 NaN; NVFP4:
    0xFF bytes), so that a value the gather does not write shows, the same
    in the local call and the gather (NVFP4's padding rows of q_scales, not
    written, compare equal then). Column-major padding is never written and
    never compared (the tensor's view leaves it out). Both the functions'
    maker and the one the gather in Python takes from _run."""
    empty = _run.empty_outputs

    def empty_outputs(*args):
        q, qs = empty(*args)
        if args[0] == _run.NVFP4:
            q.view(torch.uint8).fill_(0xFF)
            qs.view(torch.uint8).fill_(0xFF)
            return q, qs
        q.view(torch.uint8).fill_(0x7F)
        if args[0] != KINDS["tensor"]:  # a static scale is the caller's, not written
            qs.fill_(float("nan"))
        return q, qs

    monkeypatch.setattr(quant_module, "empty_outputs", empty_outputs)
    monkeypatch.setattr(_run, "empty_outputs", empty_outputs)


def bits(t):
    """t's bits as integers of its element's size (any strides)."""
    return t.view({1: torch.uint8, 4: torch.int32}[t.element_size()])


def assert_same(got, want, what):
    """(hidden, normalized | None, q, q_scales) bit for bit, with dtypes, shapes and strides."""
    h, n, q, qs = got
    assert_bits_equal(h, want[0], what + " hidden")
    if want[1] is None:
        assert n is None, what + " normalized"
    else:
        assert_bits_equal(n, want[1], what + " normalized")
    assert q.dtype == want[2].dtype and q.shape == want[2].shape, what + " q"
    assert q.dtype == FP8 or q.element_size() == 1, what + " q"
    assert torch.equal(bits(q), bits(want[2])), what + " q"
    assert qs.dtype == want[3].dtype and qs.shape == want[3].shape and qs.stride() == want[3].stride(), \
        what + " q_scales layout"
    assert torch.equal(bits(qs), bits(want[3])), what + " q_scales"


def local_fp8(g, w, residual, pw, nw, quant, keep_normalized=True):
    """The local operation's (hidden, normalized, q, q_scales) on all the tokens."""
    return beammoe.beam_moe_finalize_norm_residual_norm_fp8(
        beammoe.MoEOutput(g, w), residual, pw, POST_EPS, nw, NEXT_EPS, SCALES, ROUTED, quant=quant,
        keep_normalized=keep_normalized)


def gather_calls(ws, lg, lw, residual, pw, nw, quant, strategies, calls=ALL_CALLS):
    """The calls of each (keep_normalized, inplace) of `calls` with each
    strategy: [(what, keep, result)]; residual is left as it was unless in
    place."""
    out = []
    for strategy in strategies:
        for keep, inplace in calls:
            res = residual.clone()
            got = gather_fp8(ws, lg, lw, res, pw, nw, quant, strategy=strategy, inplace=inplace,
                             keep_normalized=keep)
            assert (got[0] is res) == inplace
            if not inplace:
                assert_bits_equal(res, residual, "residual left unchanged")
            out.append(("%s keep=%s inplace=%s" % (strategy, keep, inplace), keep, got))
    return out


def assert_all_same(results, want, quant):
    for r, out in enumerate(results):
        for what, keep, got in out:
            assert_same(got, (want[0], want[1] if keep else None) + want[2:], "rank %d %s %r" % (r, what, quant))


def refused(ws, err, match, g, w, residual, pw, nw, quant=beammoe.FP8Quant("token"), **kw):
    """The in-place call raises err (matching `match`) and leaves residual as it was."""
    res = residual.clone()
    with pytest.raises(err, match=match):
        gather_fp8(ws, g, w, res, pw, nw, quant, inplace=True, **kw)
    assert_bits_equal(res, residual, "residual after a refused call")


FN = r"^beam_moe_finalize_gather_norm_residual_norm_q: "


def rank_calls(grp, r, nranks, tokens, g, w, residual, pw, nw, quant):
    """Rank r's calls: every strategy, with and without normalized kept, in
    place or not; and the BF16 gather's normalized of each strategy."""
    ws = beammoe.Workspace.cpu(grp, r, 32, H, moe_gather_oneshot_max_tokens=4,
                               moe_gather_separate_norm_min_tokens=17)
    try:
        lg, lw = local_rows(g, w, tokens, nranks, r, TOP_K, H)
        out = []
        for strategy in STRATEGIES:
            out += gather_calls(ws, lg, lw, residual, pw, nw, quant, (strategy,), CALLS)
            _, n = beammoe.beam_moe_finalize_gather_norm_residual_norm(
                beammoe.MoEOutput(lg, lw), residual, pw, POST_EPS, nw, NEXT_EPS, SCALES, ws, ROUTED,
                strategy=strategy)
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
    want = beammoe.beam_moe_finalize_norm_residual_norm_fp8(
        beammoe.MoEOutput(g, w), residual, pw, POST_EPS, nw, NEXT_EPS, SCALES, ROUTED, quant=quant,
        keep_normalized=True)
    with beammoe.CpuGroup(nranks) as grp:
        results = run_ranks(nranks, lambda r: rank_calls(grp, r, nranks, tokens, g, w, residual, pw, nw, quant))
    for r, out in enumerate(results):
        for what, keep, got in out:
            what = "rank %d %s %r" % (r, what, quant)
            if keep is None:  # the BF16 gather's normalized
                assert_bits_equal(got, want[1], what)
            else:
                assert_same(got, (want[0], want[1] if keep else None) + want[2:], what)


def test_single_rank_in_calling_thread(gen, poisoned):
    """R = 1 without threads; the column-major scales' ld of all tokens."""
    quant = beammoe.FP8Quant("group", 128, column_major=True)
    g, w, residual, pw, nw = data(gen, 5)
    want = beammoe.beam_moe_finalize_norm_residual_norm_fp8(
        beammoe.MoEOutput(g, w), residual, pw, POST_EPS, nw, NEXT_EPS, SCALES, ROUTED, quant=quant)
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 8, H) as ws:
        got = gather_fp8(ws, g, w, residual, pw, nw, quant)
    assert got[3].shape == (5, H // 128) and got[3].stride() == (1, 8)
    assert_same(got, want, "R=1")


def test_each_rank_its_own_layout(gen):
    """Where the scales lie and whether normalized is kept are each rank's
    own (rank 0 column-major and keeping normalized, rank 1 row-major);
    ranks that differ in ue8m0 all fail, with nothing written."""
    nranks, tokens = 2, 5
    forms = (beammoe.FP8Quant("group", 64, column_major=True), beammoe.FP8Quant("group", 64))
    g, w, residual, pw, nw = data(gen, tokens)
    wants = [beammoe.beam_moe_finalize_norm_residual_norm_fp8(
        beammoe.MoEOutput(g, w), residual, pw, POST_EPS, nw, NEXT_EPS, SCALES, ROUTED, quant=q,
        keep_normalized=r == 0) for r, q in enumerate(forms)]
    with beammoe.CpuGroup(nranks) as grp:
        def body(r):
            with beammoe.Workspace.cpu(grp, r, 8, H, timeout_ms=5000) as ws:
                lg, lw = local_rows(g, w, tokens, nranks, r, TOP_K, H)
                got = gather_fp8(ws, lg, lw, residual, pw, nw, forms[r], keep_normalized=r == 0)
                refused(ws, ValueError, r"passed different quant", lg, lw, residual, pw, nw,
                        beammoe.FP8Quant("group", 64, ue8m0=r == 1))
                return got

        for r, got in enumerate(run_ranks(nranks, body)):
            assert_same(got, wants[r], "rank %d" % r)


# ---- refused calls: an error, and nothing written -------------------------------

def test_argument_errors(gen):
    g, w, residual, pw, nw = data(gen, 5)
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 4, H) as ws:
        refused(ws, TypeError, FN + r"quant must be a beammoe.FP8Quant or beammoe.NVFP4Quant, got dict", g, w,
                residual, pw, nw, quant={"kind": "token"})
        refused(ws, TypeError, FN + r"keep_normalized", g, w, residual, pw, nw, keep_normalized=1)
        refused(ws, ValueError, r"tokens=5 must be <= max_tokens=4 of the workspace", g, w, residual, pw, nw)
        g4, w4, r4 = g[: 4 * TOP_K], w[:4], residual[:4]
        refused(ws, ValueError, r"strategy=FUSED: unknown strategy for this operation", g4, w4, r4, pw, nw,
                strategy="fused")
        refused(ws, ValueError, FN + r"residual has shape \(4, 256\)", g4, w4, r4[:, :256].contiguous(), pw, nw)
        res = r4.clone()
        with pytest.raises(ValueError, match=FN + r"next_eps must be given"):
            beammoe.beam_moe_finalize_gather_norm_residual_norm_fp8(
                beammoe.MoEOutput(g4, w4), res, pw, POST_EPS, None, None, None, ws, quant=beammoe.FP8Quant(),
                inplace=True)
        assert_bits_equal(res, r4)
        with pytest.raises(TypeError, match=FN + r"workspace must be a beammoe.Workspace, got NoneType"):
            gather_fp8(None, g4, w4, r4, pw, nw, beammoe.FP8Quant())
    refused(ws, ValueError, r"the workspace is closed", g4, w4, r4, pw, nw)


@pytest.mark.parametrize("nranks", [1, 2, 3])
@pytest.mark.parametrize("tokens", [0, 7, 130])
def test_hook_gathers_in_python(gen, poisoned, nranks, tokens):
    """With the all_gather hook, the UNFUSED calls (asked for, and AUTO's
    choice once the thresholds say so) gather in Python, through the hook:
    every FP8 form and NVFP4, normalized kept or not, in place or not, give
    on every rank the local operation's bits on all the tokens."""
    g, w, residual, pw, nw = data(gen, tokens)
    wants = [local_fp8(g, w, residual, pw, nw, quant) for quant in QUANTS]
    ag = ThreadAllGather(nranks)

    def body(grp, r):
        lg, lw = local_rows(g, w, tokens, nranks, r, TOP_K, H)
        out = []
        with beammoe.Workspace.cpu(grp, r, 256, H, moe_gather_oneshot_max_tokens=0,
                                   moe_gather_separate_norm_min_tokens=1) as ws:
            ws.all_gather = ag.hook_for(r)
            for quant in QUANTS:
                before = len([c for c in ag.calls if c[0] == r])
                out.append(gather_calls(ws, lg, lw, residual, pw, nw, quant, ("unfused", None)))
                # each call: the signature through the hook, then the rows (without tokens, the
                # call's confirmation; AUTO takes ONESHOT, the library's, for no tokens)
                calls = len([c for c in ag.calls if c[0] == r]) - before
                assert calls == (16 if tokens else 8), calls
        return out

    with beammoe.CpuGroup(nranks) as grp:
        results = run_ranks(nranks, lambda r: body(grp, r))
    for i, quant in enumerate(QUANTS):
        assert_all_same([out[i] for out in results], wants[i], quant)


def test_hook_ranks_differ(gen, poisoned):
    """Through the hook as in the library's gather: where the scales lie and
    whether normalized is kept are each rank's own; ranks that differ in
    ue8m0, the static scale or the global scale, or a rank that rejects
    its form, make every rank raise, with nothing written."""
    nranks, tokens = 2, 5
    forms = (beammoe.FP8Quant("group", 64, column_major=True), beammoe.FP8Quant("group", 64))
    g, w, residual, pw, nw = data(gen, tokens)
    wants = [local_fp8(g, w, residual, pw, nw, q, keep_normalized=r == 0) for r, q in enumerate(forms)]
    ag = ThreadAllGather(nranks)
    disagree = r"^%sthe ranks disagree on quant( scale)?: rank 0 has .*, rank 1 has " % FN

    def body(grp, r):
        with beammoe.Workspace.cpu(grp, r, 8, H, timeout_ms=20000) as ws:
            ws.all_gather = ag.hook_for(r)
            lg, lw = local_rows(g, w, tokens, nranks, r, TOP_K, H)
            got = gather_fp8(ws, lg, lw, residual, pw, nw, forms[r], keep_normalized=r == 0, strategy="unfused")
            for quant in (beammoe.FP8Quant("group", 64, ue8m0=r == 1), beammoe.FP8Quant("tensor", scale=1.0 + r),
                          beammoe.NVFP4Quant(1.0 + r), beammoe.FP8Quant("token") if r else beammoe.NVFP4Quant(1.0)):
                refused(ws, ValueError, disagree, lg, lw, residual, pw, nw, quant, strategy="unfused")
            if r == 1:
                refused(ws, TypeError, FN + r"quant must be a beammoe.FP8Quant or beammoe.NVFP4Quant, got dict", lg,
                        lw, residual, pw, nw, {}, strategy="unfused")
            else:
                refused(ws, ValueError, r"^%srank 1 failed \(TypeError: %squant must be" % (FN, FN[1:]), lg, lw,
                        residual, pw, nw, strategy="unfused")
            return got

    with beammoe.CpuGroup(nranks) as grp:
        for r, got in enumerate(run_ranks(nranks, lambda r: body(grp, r))):
            assert_same(got, wants[r], "rank %d" % r)


@needs_gloo
def test_process_group_workspace(gen, poisoned, gloo1):  # noqa: F811
    """A CPU workspace over a (one-rank) gloo group gathers every call in
    Python: every strategy, form, keep_normalized and inplace, with and
    without the hook, the local operation's bits."""
    for tokens in (0, 3, 130):
        g, w, residual, pw, nw = data(gen, tokens)
        with beammoe.Workspace(None, 256, H, device="cpu") as ws:
            for quant in QUANTS:
                want = local_fp8(g, w, residual, pw, nw, quant)
                assert_all_same([gather_calls(ws, g, w, residual, pw, nw, quant, STRATEGIES)], want, quant)
                calls = []
                ws.all_gather = lambda out, inp: (calls.append(1), out.copy_(inp))
                assert_all_same([gather_calls(ws, g, w, residual, pw, nw, quant, (None,))], want, quant)
                ws.all_gather = None
                assert len(calls) == (4 if tokens else 0)  # the rows (the signature goes over the group)


@needs_gloo
@pytest.mark.skipif(not beammoe.HAVE_TORCH_OPS, reason="torch.compile of the operators needs torch >= 2.4")
def test_process_group_workspace_compiled(gen, poisoned, gloo1):  # noqa: F811
    """torch.compile(fullgraph=True): the operator runs the gather in Python
    and the library quantizes, for an FP8 form and NVFP4."""
    g, w, residual, pw, nw = data(gen, 6)
    with beammoe.Workspace(None, 16, H, device="cpu") as ws:
        def f(g, w, residual):
            return (gather_fp8(ws, g, w, residual, pw, nw, QUANTS[2], keep_normalized=True),
                    gather_fp8(ws, g, w, residual, pw, nw, QUANTS[-1]))

        torch._dynamo.reset()
        got = torch.compile(f, fullgraph=True)(g, w, residual)
    assert_same(got[0], local_fp8(g, w, residual, pw, nw, QUANTS[2]), "compiled FP8")
    assert_same(got[1], local_fp8(g, w, residual, pw, nw, QUANTS[-1], False), "compiled NVFP4")


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
            return gather_fp8(ws, g, w, residual, pw, nw, quant, keep_normalized=form % 2 == 0)

        want = f(g, w, residual)
        torch._dynamo.reset()
        got = torch.compile(f, fullgraph=True)(g, w, residual)
    assert_same(got, want, "compiled")


@needs_ops
def test_inplace_not_compiled(gen):
    """inplace=True has no torch operator: under torch.compile it says so."""
    g, w, residual, pw, nw = data(gen, 2)
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 8, H) as ws:
        def f(g, w, residual):
            return gather_fp8(ws, g, w, residual, pw, nw, beammoe.FP8Quant("token"), inplace=True)

        torch._dynamo.reset()
        with pytest.raises(Exception, match=r"runs in eager calls"):
            torch.compile(f, fullgraph=True)(g, w, residual.clone())


@needs_ops
def test_operator_direct(gen):
    """Called directly, the operator checks the workspace handle and the
    arguments, and gathers in Python where the workspace does."""
    g, w, residual, pw, nw = data(gen, 3)
    op = torch.ops.beammoe.moe_finalize_gather_norm_residual_norm_fp8
    args = ((g, w, residual, pw, POST_EPS, nw, NEXT_EPS, list(SCALES), ROUTED, 0) + beammoe.FP8Quant().fields()
            + (False,))
    with pytest.raises(ValueError, match=r"workspace=0x3039 is not an open beammoe.Workspace"):
        op(12345, *args)
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 8, H) as ws:
        h, n, q, qs = op(ws.handle, *args)
        assert n.numel() == 0
        want = gather_fp8(ws, g, w, residual, pw, nw, beammoe.FP8Quant(), strategy=None)
        assert_same((h, None, q, qs), want, "operator")
        # UNFUSED with the hook: the gather in Python, the same bits
        calls = []
        ws.all_gather = lambda out, inp: (calls.append(1), out.copy_(inp))
        h, n, q, qs = op(ws.handle, *args[:9], 2, *args[10:])
        assert n.numel() == 0 and len(calls) == 2
        assert_same((h, None, q, qs), want, "operator, gathered in Python")


@needs_ops
@pytest.mark.parametrize("form", [2, 4, 6])
def test_opcheck(gen, form):
    """torch.library.opcheck: schema, fake implementation (shapes, strides
    and dtypes of the real one), autograd registration, AOT dispatch."""
    g, w, residual, pw, nw = data(gen, 6)
    op = torch.ops.beammoe.moe_finalize_gather_norm_residual_norm_fp8.default
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 8, H) as ws:
        for keep in (False, True):
            torch.library.opcheck(op, (ws.handle, g, w, residual, pw, POST_EPS, nw, NEXT_EPS, list(SCALES), ROUTED,
                                       0) + FORMS[form].fields() + (keep,))


@needs_ops
def test_meta_tensors(gen):
    """Meta tensors take the operator's fake implementation: the eager
    call's shapes and strides (column-major scales of all tokens)."""
    g, w, residual, pw, nw = data(gen, 5)
    quant = beammoe.FP8Quant("group", 64, column_major=True)
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 8, H) as ws:
        want = gather_fp8(ws, g, w, residual, pw, nw, quant, keep_normalized=True)
        got = gather_fp8(ws, *(t.to("meta") for t in (g, w, residual, pw, nw)), quant, keep_normalized=True)
    for a, b in zip(got, want):
        assert a.device.type == "meta" and (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)
