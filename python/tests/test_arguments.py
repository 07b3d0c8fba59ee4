"""Strict argument types: ctypes would wrap an integer to its C type, read a
string as a sequence, take a bool for 1. Every such argument is a TypeError
(wrong kind) or a ValueError (out of range), never a converted value, and
nothing is written."""
import pytest
import torch

import beammoe
from reference import BF16, random_case

FUSED = beammoe.beam_moe_finalize_norm_residual_norm


@pytest.fixture
def case(gen):
    g, w = random_case(gen, 4, 2, 256)
    r = torch.full((4, 256), 2.0, dtype=BF16)
    return beammoe.MoEOutput(g, w), r


def _untouched(t):
    assert torch.equal(t, torch.full_like(t, 2.0)), "a failing call wrote a tensor"


# ---- integers ---------------------------------------------------------------

@pytest.mark.parametrize("n,exc,msg", [
    (2 ** 32 + 1, ValueError, r"nranks=4294967297 is out of range \[-2147483648, 2147483647\]"),
    (-(2 ** 31) - 1, ValueError, r"nranks=-2147483649 is out of range"),
    (True, TypeError, r"nranks must be an int, got bool"),
    ("2", TypeError, r"nranks must be an int, got str"),
    (2.0, TypeError, r"nranks must be an int, got float"),
    # a tensor is not an int, even one that operator.index takes
    (torch.tensor([2]), TypeError, r"nranks must be an int, got a tensor"),
    (torch.tensor(2), TypeError, r"nranks must be an int, got a tensor"),
    (torch.tensor(True), TypeError, r"nranks must be an int, got bool"),
])
def test_cpu_group_size(n, exc, msg):
    with pytest.raises(exc, match=r"^beammoe.CpuGroup: " + msg):
        beammoe.CpuGroup(n)


def test_cpu_group_library_range():
    with pytest.raises(ValueError, match=r"^beam_cpu_group_create: nranks=300 must be in \[1, 256\]"):
        beammoe.CpuGroup(300)


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(rank=2 ** 32), ValueError, r"rank=4294967296 is out of range"),
    (dict(rank=True), TypeError, r"rank must be an int, got bool"),
    (dict(rank=torch.tensor(0)), TypeError, r"rank must be an int, got a tensor"),
    (dict(max_tokens=torch.tensor([8])), TypeError, r"max_tokens must be an int, got a tensor"),
    (dict(max_tokens=2 ** 63), ValueError, r"max_tokens=9223372036854775808 is out of range"),
    (dict(max_tokens="8"), TypeError, r"max_tokens must be an int, got str"),
    (dict(hidden_size=2 ** 32 + 256), ValueError, r"hidden_size=4294967552 is out of range"),
    (dict(timeout_ms=2 ** 31), ValueError, r"timeout_ms=2147483648 is out of range"),
    (dict(timeout_ms=False), TypeError, r"timeout_ms must be an int, got bool"),
    (dict(moe_gather_oneshot_max_tokens=1.5), TypeError, r"moe_gather_oneshot_max_tokens must be an int"),
    (dict(moe_gather_separate_norm_min_tokens=-1), ValueError, r"moe_gather_separate_norm_min_tokens=-1 must be >= 0"),
    (dict(moe_gather_separate_norm_min_tokens="9"), TypeError, r"moe_gather_separate_norm_min_tokens must be an int"),
])
def test_workspace_cpu_integers(kw, exc, msg):
    args = dict(rank=0, max_tokens=8, hidden_size=256)
    args.update(kw)
    with beammoe.CpuGroup(1) as grp:
        with pytest.raises(exc, match=r"^beammoe.Workspace.cpu: " + msg):
            beammoe.Workspace.cpu(grp, args.pop("rank"), args.pop("max_tokens"), args.pop("hidden_size"), **args)


def test_workspace_tokens_and_tensors():
    """strategy_for takes a token count (>= 0, as every token count); a
    tensor is no int for the workspace's integers either."""
    with beammoe.CpuGroup(1) as grp:
        with beammoe.Workspace.cpu(grp, 0, 8, 256) as ws:
            for t in (-1, -(2 ** 63)):
                with pytest.raises(ValueError, match=r"^beammoe.Workspace.strategy_for: tokens=%d must be >= 0" % t):
                    ws.strategy_for(t)
            with pytest.raises(TypeError, match=r"^beammoe.Workspace.strategy_for: tokens must be an int, got a "
                                                r"tensor"):
                ws.strategy_for(torch.tensor(3))
            with pytest.raises(TypeError, match=r"^beammoe.Workspace: moe_gather_oneshot_max_tokens must be an int, "
                                                r"got a tensor"):
                ws.moe_gather_oneshot_max_tokens = torch.tensor(4)
            assert [ws.strategy_for(t) for t in (0, 64, 65)] == ["oneshot", "oneshot", "twoshot"]


def test_workspace_library_rules():
    with beammoe.CpuGroup(1) as grp:
        with pytest.raises(ValueError, match=r"^beam_workspace_create_cpu: .*oneshot_max_tokens=-1"):
            beammoe.Workspace.cpu(grp, 0, 8, 256, moe_gather_oneshot_max_tokens=-1)


def test_live_tokens_is_not_read(case):
    """As in the reference, the token count is residual.shape[0]: a
    producer's live_tokens, whatever it holds, is not read."""
    x, r = case
    want, _ = FUSED(beammoe.MoEOutput(x.gemm2_permuted, x.expert_weights), r, None, None, None, None, None)
    for live in (True, 2 ** 64, "4", 3, 9):
        got, _ = FUSED(beammoe.MoEOutput(x.gemm2_permuted, x.expert_weights, live), r, None, None, None, None, None)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), live
    _untouched(r)


# ---- floats -----------------------------------------------------------------

@pytest.mark.parametrize("value,exc,msg", [
    ("2", TypeError, r"routed_scale must be a float, got str"),
    (True, TypeError, r"routed_scale must be a float, got bool"),
    (None, TypeError, r"routed_scale must be a float, got NoneType"),
    (1e39, ValueError, r"routed_scale=1e\+39 is out of the float32 range"),
    (torch.tensor([1.0, 2.0]), TypeError, r"routed_scale must be a float, got a tensor of shape \(2,\)"),
    (torch.tensor(True), TypeError, r"routed_scale must be a float, got a tensor of shape \(\) and dtype torch.bool"),
])
def test_routed_scale(case, value, exc, msg):
    x, r = case
    with pytest.raises(exc, match=r"^beam_moe_finalize_norm_residual_norm: " + msg):
        FUSED(x, r, None, None, None, None, None, value)
    out = torch.full((4, 256), 2.0, dtype=BF16)
    with pytest.raises(exc, match=r"^beam_moe_finalize: " + msg):
        beammoe.beam_moe_finalize(x.gemm2_permuted, x.expert_weights, out, value)
    _untouched(r)
    _untouched(out)


def test_numbers_that_are_floats(case):
    """int, a NumPy float and a one-element tensor are real numbers."""
    x, r = case
    want, _ = FUSED(x, r, None, None, None, None, None, 2.0)
    for v in (2, torch.tensor(2.0), torch.tensor([2.0])):
        h, _ = FUSED(x, r, None, None, None, None, None, v)
        assert torch.equal(h, want)
    np = pytest.importorskip("numpy")
    h, _ = FUSED(x, r, None, None, None, None, None, np.float32(2.0))
    assert torch.equal(h, want)


@pytest.mark.parametrize("eps,exc,msg", [
    ("1e-6", TypeError, r"next_eps must be a float, got str"),
    (True, TypeError, r"next_eps must be a float, got bool"),
    (1e40, ValueError, r"next_eps=1e\+40 is out of the float32 range"),
])
def test_eps(case, eps, exc, msg):
    x, r = case
    with pytest.raises(exc, match=msg):
        FUSED(x, r, None, None, None, eps, None)
    with pytest.raises(exc, match=msg.replace("next_eps", "pre_eps")):
        beammoe.beam_norm_residual_norm(r, r, None, eps)
    _untouched(r)


# ---- pairs ------------------------------------------------------------------

@pytest.mark.parametrize("scales,exc,msg", [
    ("12", TypeError, r"scales must be a pair of floats or None, got str"),
    (b"12", TypeError, r"scales must be a pair of floats or None, got bytes"),
    (1.0, TypeError, r"scales must be a pair of floats or None, got float"),
    ({1.0: 2.0, 3.0: 4.0}, TypeError, r"scales must be a pair of floats or None, got dict"),
    ((1.0, "2"), TypeError, r"scales\[1\] must be a float, got str"),
    ((True, 1.0), TypeError, r"scales\[0\] must be a float, got bool"),
    ((1.0, 2.0, 3.0), ValueError, r"scales must be a pair of floats or None, got 3 values"),
    ((1.0,), ValueError, r"scales must be a pair of floats or None, got 1 values"),
    (torch.tensor([1.0, 2.0, 3.0]), TypeError, r"scales must be a pair of floats or None, got a tensor of shape \(3,\)"),
    ((1.0, 1e39), ValueError, r"scales\[1\]=1e\+39 is out of the float32 range"),
])
def test_scales(case, scales, exc, msg):
    x, r = case
    with pytest.raises(exc, match=r"^beam_moe_finalize_norm_residual_norm: " + msg):
        FUSED(x, r, None, None, None, None, scales)
    with pytest.raises(exc, match=r"^beam_norm_residual_norm: " + msg):
        beammoe.beam_norm_residual_norm(r, r, None, None, None, None, scales)
    _untouched(r)


def test_scales_accepted_forms(case):
    x, r = case
    want, _ = FUSED(x, r, None, None, None, None, (0.5, 2.0))
    for s in ([0.5, 2.0], (0.5, 2), torch.tensor([0.5, 2.0])):
        h, _ = FUSED(x, r, None, None, None, None, s)
        assert torch.equal(h, want)


# ---- the rest ---------------------------------------------------------------

def test_strategy_and_flags(case):
    x, r = case
    with pytest.raises(TypeError, match=r"strategy must be a string or None, got int"):
        FUSED(x, r, None, None, None, None, None, strategy=1)
    with pytest.raises(TypeError, match=r"strategy must be a string or None, got bool"):
        FUSED(x, r, None, None, None, None, None, strategy=True)
    with pytest.raises(TypeError, match=r"inplace must be True or False, got NoneType"):
        FUSED(x, r, None, None, None, None, None, inplace=None)
    _untouched(r)


def test_tensor_like_objects_rejected(case):
    x, r = case
    np = pytest.importorskip("numpy")
    with pytest.raises(TypeError, match=r"residual must be a torch.Tensor, got ndarray"):
        FUSED(x, np.zeros((4, 256)), None, None, None, None, None)
    with pytest.raises(TypeError, match=r"next_weight must be a torch.Tensor, got list"):
        FUSED(x, r, None, None, [1.0] * 256, 1e-6, None)
