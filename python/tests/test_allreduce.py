"""The all-reduce layout (docs/numerics.md#all-reduce) through the package:
CpuGroup ranks as threads, both forms, every strategy, in place or not,
against the sum over ranks written here in torch (FP32 in rank order from
rank 0's value, one BF16 rounding) followed by the torch-written reference
of the stages (reference.py), and a group of one against the local
functions. The quantized forms (_q) likewise, every form, against the
local beam_norm_residual_norm_q of that sum. A workspace with an all_gather
hook runs its UNFUSED calls in Python (_pgather): the library's bits, and
its guarantees (ranks that disagree or fail all raise)."""
import pytest
import torch

import beammoe
from conftest import ALL_CALLS, QUANT_TYPES, QUANTS, ThreadAllGather, assert_same_q, run_ranks
from reference import BF16, assert_bits_equal, bf16, finalize_ref, nrn_spec, random_bf16, random_case

H, K = 512, 4
STRATEGIES = (None, "oneshot", "twoshot", "unfused")


def ranks_sum(partials):
    a = partials[0].float()
    for p in partials[1:]:
        a = a + p.float()
    return bf16(a)


def inputs(gen, R, tokens):
    """Every rank's partials and slots (the weights are rank 0's: the router
    is replicated), the residual and the norm weights."""
    parts = [random_bf16(gen, tokens, H, scale=2.0) for _ in range(R)]
    slots = [random_case(gen, tokens + 1, K, H)[0] for _ in range(R)]
    w = random_case(gen, tokens + 1, K, H)[1]
    return parts, slots, w, random_bf16(gen, tokens, H), random_bf16(gen, H), random_bf16(gen, H)


def wanted(parts, slots, w, residual, nw1, nw, tokens, moe, scales):
    if moe:
        parts = [finalize_ref(g, w, tokens, 1.5) for g in slots]
    return nrn_spec(ranks_sum(parts), residual, nw1, 1e-6, scales, nw, 1e-5)


def call(ws, r, parts, slots, w, residual, nw1, nw, moe, scales, strategy, inplace):
    res = residual.clone()
    if moe:
        x = beammoe.MoEOutput(slots[r], w)
        h, n = beammoe.beam_moe_finalize_allreduce_norm_residual_norm(
            x, res, nw1, 1e-6, nw, 1e-5, scales, ws, 1.5, strategy=strategy, inplace=inplace)
    else:
        h, n = beammoe.beam_allreduce_norm_residual_norm(parts[r], res, nw1, 1e-6, nw, 1e-5, scales, ws,
                                                         strategy=strategy, inplace=inplace)
    assert (h is res) == inplace
    if not inplace:
        assert_bits_equal(res, residual, "residual left unchanged")
    return h, n


@pytest.mark.parametrize("R", [1, 2, 3])
@pytest.mark.parametrize("moe", [False, True])
def test_every_rank_every_strategy(R, moe):
    gen = torch.Generator().manual_seed(40 + R + 10 * moe)
    cases = [(t, inputs(gen, R, t)) for t in (1, R + 1, 7)]

    def body(r):
        with beammoe.Workspace.cpu(grp, r, 8, H, moe_gather_oneshot_max_tokens=2) as ws:
            for tokens, (parts, slots, w, residual, nw1, nw) in cases:
                for scales in (None, (0.5, 2.0)):
                    want = wanted(parts, slots, w, residual, nw1, nw, tokens, moe, scales)
                    for strategy in STRATEGIES:
                        for inplace in (False, True):
                            got = call(ws, r, parts, slots, w, residual, nw1, nw, moe, scales, strategy, inplace)
                            assert_bits_equal(got, want, "R=%d rank %d T=%d %s inplace=%s" % (
                                R, r, tokens, strategy, inplace))
        return True

    with beammoe.CpuGroup(R) as grp:
        assert run_ranks(R, body) == [True] * R


def test_one_rank_is_the_local_operation():
    gen = torch.Generator().manual_seed(41)
    parts, slots, w, residual, nw1, nw = inputs(gen, 1, 5)
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 8, H) as ws:
        got = beammoe.beam_allreduce_norm_residual_norm(parts[0], residual, nw1, 1e-6, nw, 1e-5, None, ws)
        assert_bits_equal(got, beammoe.beam_norm_residual_norm(parts[0], residual, nw1, 1e-6, nw, 1e-5, None))
        x = beammoe.MoEOutput(slots[0], w)
        got = beammoe.beam_moe_finalize_allreduce_norm_residual_norm(x, residual, nw1, 1e-6, nw, 1e-5, None, ws, 1.5)
        assert_bits_equal(got, beammoe.beam_moe_finalize_norm_residual_norm(x, residual, nw1, 1e-6, nw, 1e-5, None,
                                                                            1.5))


def test_refusals():
    gen = torch.Generator().manual_seed(42)
    parts, slots, w, residual, nw1, nw = inputs(gen, 1, 5)
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 4, H) as ws:
        with pytest.raises(ValueError, match="max_tokens=4"):
            beammoe.beam_allreduce_norm_residual_norm(parts[0], residual, None, None, None, None, None, ws)
        with pytest.raises(ValueError, match="unknown strategy"):
            beammoe.beam_allreduce_norm_residual_norm(parts[0][:3], residual[:3], None, None, None, None, None, ws,
                                                      strategy="fused")
        with pytest.raises(ValueError):
            beammoe.beam_moe_finalize_allreduce_norm_residual_norm(
                beammoe.MoEOutput(slots[0][:2 * K], w[:2]), residual[:3], None, None, None, None, None, ws)


def call_q(ws, r, parts, slots, w, residual, nw1, nw, moe, quant, next_eps=1e-5, **kw):
    """Rank r's quantized call (scales (0.5, 2.0)): (hidden, normalized | None, q, q_scales)."""
    if moe:
        return beammoe.beam_moe_finalize_allreduce_norm_residual_norm_q(
            beammoe.MoEOutput(slots[r], w), residual, nw1, 1e-6, nw, next_eps, (0.5, 2.0), ws, 1.5, quant=quant,
            **kw)
    return beammoe.beam_allreduce_norm_residual_norm_q(parts[r], residual, nw1, 1e-6, nw, next_eps, (0.5, 2.0), ws,
                                                       quant=quant, **kw)


def wanted_q(parts, slots, w, residual, nw1, nw, tokens, moe, quant):
    """The local beam_norm_residual_norm_q of the sum over the ranks (each
    rank's finalize, unnormalized, in the MoE form), its pre-norm the
    reduced sum's."""
    if moe:
        parts = [finalize_ref(g, w, tokens, 1.5) for g in slots]
    return beammoe.beam_norm_residual_norm_q(ranks_sum(parts), residual, nw1, 1e-6, nw, 1e-5, (0.5, 2.0),
                                             quant=quant, keep_normalized=True)


@pytest.mark.parametrize("R", [1, 2, 3])
@pytest.mark.parametrize("moe", [False, True])
def test_quantized_every_rank(poisoned, R, moe):
    """Every form, strategy, normalized kept or not, in place or not: on
    every rank the local quantized operation's bits on the reduced sum."""
    gen = torch.Generator().manual_seed(50 + R + 10 * moe)
    tokens = 7
    parts, slots, w, residual, nw1, nw = inputs(gen, R, tokens)
    wants = [wanted_q(parts, slots, w, residual, nw1, nw, tokens, moe, quant) for quant in QUANTS]

    def body(r):
        with beammoe.Workspace.cpu(grp, r, 8, H) as ws:
            for quant, want in zip(QUANTS, wants):
                for strategy in STRATEGIES:
                    for keep, inplace in ALL_CALLS:
                        res = residual.clone()
                        got = call_q(ws, r, parts, slots, w, res, nw1, nw, moe, quant, strategy=strategy,
                                     inplace=inplace, keep_normalized=keep)
                        what = "R=%d rank %d %r %s keep=%s inplace=%s" % (R, r, quant, strategy, keep, inplace)
                        assert (got[0] is res) == inplace, what
                        if not inplace:
                            assert_bits_equal(res, residual, what + ": residual left unchanged")
                        assert_same_q(got, want, keep, what)
        return True

    with beammoe.CpuGroup(R) as grp:
        assert run_ranks(R, body) == [True] * R


def test_quantized_one_rank_is_the_local_operation(poisoned):
    gen = torch.Generator().manual_seed(51)
    parts, slots, w, residual, nw1, nw = inputs(gen, 1, 5)
    x = beammoe.MoEOutput(slots[0], w)
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 8, H) as ws:
        for quant in QUANTS:
            assert_same_q(call_q(ws, 0, parts, slots, w, residual, nw1, nw, False, quant, keep_normalized=True),
                          beammoe.beam_norm_residual_norm_q(parts[0], residual, nw1, 1e-6, nw, 1e-5, (0.5, 2.0),
                                                            quant=quant, keep_normalized=True), True, repr(quant))
            assert_same_q(call_q(ws, 0, parts, slots, w, residual, nw1, nw, True, quant),
                          beammoe.beam_moe_finalize_norm_residual_norm_q(x, residual, nw1, 1e-6, nw, 1e-5, (0.5, 2.0),
                                                                         1.5, quant=quant), False, repr(quant))


@pytest.mark.parametrize("moe", [False, True])
def test_quantized_refusals(moe):
    gen = torch.Generator().manual_seed(52)
    parts, slots, w, residual, nw1, nw = inputs(gen, 1, 5)
    fn = "beam_%sallreduce_norm_residual_norm_q: " % ("moe_finalize_" if moe else "")
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 8, H) as ws:
        res = residual.clone()
        with pytest.raises(ValueError, match=fn + "next_eps must be given"):
            call_q(ws, 0, parts, slots, w, res, nw1, None, moe, beammoe.FP8Quant(), next_eps=None, inplace=True)
        assert_bits_equal(res, residual, "residual after a refused call")
        with pytest.raises(TypeError, match=fn + QUANT_TYPES + "dict"):
            call_q(ws, 0, parts, slots, w, res, nw1, nw, moe, {"kind": "token"})


@pytest.mark.skipif(not beammoe.HAVE_TORCH_OPS, reason="torch.library.custom_op needs torch >= 2.4")
def test_torch_operators_and_compile():
    gen = torch.Generator().manual_seed(43)
    parts, slots, w, residual, nw1, nw = inputs(gen, 1, 3)
    want = wanted(parts, slots, w, residual, nw1, nw, 3, False, None)
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 8, H) as ws:
        got = torch.ops.beammoe.allreduce_norm_residual_norm(ws.handle, parts[0], residual, nw1, 1e-6, nw, 1e-5,
                                                             None, 0)
        assert_bits_equal(got, want)
        res = residual.clone()
        n = torch.ops.beammoe.moe_finalize_allreduce_norm_residual_norm_(ws.handle, slots[0], w, res, nw1, 1e-6, nw,
                                                                         1e-5, None, 1.5, 0)
        assert_bits_equal((res, n), wanted(parts, slots, w, residual, nw1, nw, 3, True, None))

        @torch.compile(fullgraph=True)
        def layer(p, r):
            return beammoe.beam_allreduce_norm_residual_norm(p, r, nw1, 1e-6, nw, 1e-5, None, ws)
        assert_bits_equal(layer(parts[0], residual), want)


@pytest.mark.skipif(not beammoe.HAVE_TORCH_OPS, reason="torch.library.custom_op needs torch >= 2.4")
def test_quantized_operators_and_compile():
    """torch.ops.beammoe.*allreduce_norm_residual_norm_fp8 called directly,
    through opcheck and under torch.compile(fullgraph=True): the eager
    calls' bits, shapes and strides."""
    gen = torch.Generator().manual_seed(53)
    parts, slots, w, residual, nw1, nw = inputs(gen, 1, 3)
    quant = beammoe.FP8Quant("group", 64, ue8m0=True, column_major=True)
    ops = torch.ops.beammoe
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 8, H) as ws:
        dense = (ws.handle, parts[0], residual, nw1, 1e-6, nw, 1e-5, [0.5, 2.0], 0) + quant.fields()
        moe = (ws.handle, slots[0], w, residual, nw1, 1e-6, nw, 1e-5, [0.5, 2.0], 1.5, 0) + quant.fields()
        for keep in (False, True):
            for op, args, is_moe in ((ops.allreduce_norm_residual_norm_fp8, dense, False),
                                     (ops.moe_finalize_allreduce_norm_residual_norm_fp8, moe, True)):
                want = call_q(ws, 0, parts, slots, w, residual, nw1, nw, is_moe, quant, keep_normalized=keep)
                h, n, q, qs = op(*args, keep)
                assert keep or n.numel() == 0
                assert_same_q((h, n if keep else None, q, qs), want, keep, "%s keep=%s" % (op, keep))
                torch.library.opcheck(op.default, args + (keep,))

        def layer(p, g, r):
            return (call_q(ws, 0, [p], None, None, r, nw1, nw, False, quant),
                    call_q(ws, 0, None, [g], w, r, nw1, nw, True, quant, keep_normalized=True))

        want = layer(parts[0], slots[0], residual)
        torch._dynamo.reset()
        got = torch.compile(layer, fullgraph=True)(parts[0], slots[0], residual)
    assert_same_q(got[0], want[0], False, "compiled dense")
    assert_same_q(got[1], want[1], True, "compiled MoE")


# ---- a workspace with an all_gather hook: its UNFUSED calls run in Python (_pgather) ----

def specials(parts):
    """NaN and infinities in the partials (NaN sums, inf - inf): the sum's rounding."""
    parts[0][0, :3] = float("nan")
    parts[0][1, 3] = float("-inf")
    parts[-1][1, 3] = float("inf")  # one rank: an infinity
    return parts


@pytest.mark.parametrize("R", [1, 2, 3])
@pytest.mark.parametrize("moe", [False, True])
def test_hook_takes_unfused(poisoned, R, moe):
    """With the hook set, the UNFUSED calls (asked for, or AUTO's choice)
    run in Python through it, the others in the library: on every rank the
    library's own all-reduce bits (the hook unset), plain and quantized."""
    gen = torch.Generator().manual_seed(60 + R + 10 * moe)
    tokens = 5
    parts, slots, w, residual, nw1, nw = inputs(gen, R, tokens)
    parts = specials(parts)
    ag = ThreadAllGather(R)
    forms = (beammoe.FP8Quant("group", 64, ue8m0=True, column_major=True), beammoe.NVFP4Quant(2.0))

    def calls(ws, r):
        out = [call(ws, r, parts, slots, w, residual, nw1, nw, moe, scales, strategy, inplace)
               for scales in (None, (0.5, 2.0)) for strategy in STRATEGIES for inplace in (False, True)]
        return out + [call_q(ws, r, parts, slots, w, residual.clone(), nw1, nw, moe, quant, strategy="unfused",
                             inplace=inplace, keep_normalized=keep)
                      for quant in forms for keep, inplace in ALL_CALLS]

    def body(r):
        with beammoe.Workspace.cpu(grp, r, 8, H) as ws:
            want = calls(ws, r)
            ws.all_gather = ag.hook_for(r)
            got = calls(ws, r)
            assert ag.count(r) == 2 * (4 + 2 * 4)  # the unfused calls: the signature, then the partials
            ws.moe_gather_oneshot_max_tokens = 0
            ws.moe_gather_separate_norm_min_tokens = tokens  # AUTO: unfused, through the hook
            got.append(call(ws, r, parts, slots, w, residual, nw1, nw, moe, None, None, False))
            assert ag.count(r) == 2 * (4 + 2 * 4 + 1)
            return want + [want[0]], got

    with beammoe.CpuGroup(R) as grp:
        for want, got in run_ranks(R, body):
            for i, (a, b) in enumerate(zip(got, want)):
                if len(a) == 2:
                    assert_bits_equal(a, b, "R=%d call %d" % (R, i))
                else:
                    assert_same_q(a, b, a[1] is not None, "R=%d call %d" % (R, i))
    assert {c[1:] for c in ag.calls} == {((R, H), (1, H)), ((R * tokens, H), (tokens, H))}


def test_hook_ranks_that_disagree_or_fail():
    """A rank's gather never meets a peer's all-reduce, nor a dense one an
    MoE one; a rank that rejects its arguments: every rank raises, nothing
    is written, and the workspace goes on."""
    R, tokens = 2, 4
    gen = torch.Generator().manual_seed(62)
    parts, slots, w, residual, nw1, nw = inputs(gen, R, tokens)
    ag = ThreadAllGather(R)
    fn = "beam_moe_finalize_allreduce_norm_residual_norm"

    def gather(ws, r, res):
        return beammoe.beam_moe_finalize_gather_norm_residual_norm(
            beammoe.MoEOutput(slots[r][:2 * K], w[:2]), res, nw1, 1e-6, nw, 1e-5, None, ws, strategy="unfused",
            inplace=True)

    def body(r):
        with beammoe.Workspace.cpu(grp, r, 8, H, timeout_ms=20000) as ws:
            ws.all_gather = ag.hook_for(r)
            res = residual.clone()
            with pytest.raises(beammoe.BeamArgumentError, match=r"the ranks disagree on collective: rank 0 has "
                                                                r"gather, rank 1 has all-reduce"):
                if r == 0:
                    gather(ws, r, res)
                else:
                    call(ws, r, parts, slots, w, res, nw1, nw, True, None, "unfused", True)
            with pytest.raises(beammoe.BeamArgumentError, match=r"the ranks disagree on collective: rank 0 has "
                                                                r"all-reduce, rank 1 has dense all-reduce"):
                call(ws, r, parts, slots, w, res, nw1, nw, r == 0, None, "unfused", True)
            with pytest.raises(beammoe.BeamArgumentError, match=r"disagree on pre_norm: rank 0 has eps 1e-06 with "
                                                                r"weight, rank 1 has eps 1e-06 without weight"):
                call(ws, r, parts, slots, w, res, nw1 if r == 0 else None, nw, False, None, "unfused", True)
            x = beammoe.MoEOutput(slots[r], w.double() if r == 1 else w)
            with pytest.raises((TypeError, beammoe.BeamArgumentError),
                               match=r"^%s: (rank 1 failed \(TypeError: %s: )?x.expert_weights must have dtype"
                               % (fn, fn)):
                beammoe.beam_moe_finalize_allreduce_norm_residual_norm(x, res, nw1, 1e-6, nw, 1e-5, None, ws,
                                                                       strategy="unfused", inplace=True)
            assert_bits_equal(res, residual, "residual after the failed calls")
            assert ag.count(r) == 4  # the signatures only
            return call(ws, r, parts, slots, w, res, nw1, nw, True, None, "unfused", True)

    with beammoe.CpuGroup(R) as grp:
        for got in run_ranks(R, body):
            assert_bits_equal(got, wanted(parts, slots, w, residual, nw1, nw, tokens, True, None))


@pytest.mark.skipif(not beammoe.HAVE_TORCH_OPS, reason="torch.library.custom_op needs torch >= 2.4")
def test_hook_torch_operators():
    """The operators of a hooked workspace's UNFUSED calls run in Python: the
    library's bits (the hook unset)."""
    gen = torch.Generator().manual_seed(63)
    parts, slots, w, residual, nw1, nw = inputs(gen, 1, 3)
    quant = beammoe.FP8Quant("token").fields()
    ops = torch.ops.beammoe
    hooked = []
    with beammoe.CpuGroup(1) as grp, beammoe.Workspace.cpu(grp, 0, 8, H) as ws:
        def run():
            h = ws.handle
            res = residual.clone()
            return [ops.allreduce_norm_residual_norm(h, parts[0], residual, nw1, 1e-6, nw, 1e-5, [0.5, 2.0], 2),
                    ops.moe_finalize_allreduce_norm_residual_norm(h, slots[0], w, residual, nw1, 1e-6, nw, 1e-5,
                                                                  None, 1.5, 2),
                    (res, ops.allreduce_norm_residual_norm_(h, parts[0], res, nw1, 1e-6, nw, 1e-5, None, 2)),
                    ops.allreduce_norm_residual_norm_fp8(h, parts[0], residual, nw1, 1e-6, nw, 1e-5, None, 2,
                                                         *quant, True),
                    ops.moe_finalize_allreduce_norm_residual_norm_fp8(h, slots[0], w, residual, nw1, 1e-6, nw, 1e-5,
                                                                      None, 1.5, 2, *quant, False)]
        want = run()
        ws.all_gather = lambda out, inp: (hooked.append(1), out.copy_(inp))
        got = run()
    assert len(hooked) == 10
    for a, b in zip(got, want):
        assert_bits_equal(a[:2], b[:2])
        assert all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(a[2:], b[2:]))
