"""Argument errors and the error mapping. Strict argument types: ctypes
would wrap an integer to its C type, read a string as a sequence, take a
bool for 1; every such argument is a TypeError (wrong kind) or a ValueError
(out of range), never a converted value. Python's own messages for what only
Python sees; the library's for every rule it checks
(BEAM_ERR_INVALID_ARGUMENT -> ValueError); other statuses -> BeamError.
Nothing is written by a refused call."""
import threading

import pytest
import torch

import beammoe
from beammoe import _errors, _lib
from reference import BF16, random_case

FUSED = beammoe.beam_moe_finalize_norm_residual_norm


@pytest.fixture
def case(gen):
    g, w = random_case(gen, 4, 2, 256)
    return g, w, torch.full((4, 256), 2.0, dtype=BF16)


@pytest.fixture
def xr(case):
    """(MoEOutput, residual) of the case."""
    return beammoe.MoEOutput(*case[:2]), case[2]


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
    (300, ValueError, r"^beam_cpu_group_create: nranks=300 must be in \[1, 256\]"),  # the library's rules
    (0, ValueError, r"^beam_cpu_group_create: .*nranks"),
])
def test_cpu_group_size(n, exc, msg):
    with pytest.raises(exc, match=msg if msg[0] == "^" else r"^beammoe.CpuGroup: " + msg):
        beammoe.CpuGroup(n)


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
    (dict(moe_gather_oneshot_max_tokens=-1), ValueError, r"^beam_workspace_create_cpu: .*oneshot_max_tokens=-1"),
])
def test_workspace_cpu_integers(kw, exc, msg):
    args = dict(rank=0, max_tokens=8, hidden_size=256)
    args.update(kw)
    with beammoe.CpuGroup(1) as grp:
        with pytest.raises(exc, match=msg if msg[0] == "^" else r"^beammoe.Workspace.cpu: " + msg):
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


def test_live_tokens_is_not_read(xr):
    """As in the reference, the token count is residual.shape[0]: a
    producer's live_tokens, whatever it holds, is not read."""
    x, r = xr
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
def test_routed_scale(xr, value, exc, msg):
    x, r = xr
    with pytest.raises(exc, match=r"^beam_moe_finalize_norm_residual_norm: " + msg):
        FUSED(x, r, None, None, None, None, None, value)
    out = torch.full((4, 256), 2.0, dtype=BF16)
    with pytest.raises(exc, match=r"^beam_moe_finalize: " + msg):
        beammoe.beam_moe_finalize(x.gemm2_permuted, x.expert_weights, out, value)
    _untouched(r)
    _untouched(out)


def test_numbers_that_are_floats(xr):
    """int, a NumPy float and a one-element tensor are real numbers."""
    x, r = xr
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
def test_eps(xr, eps, exc, msg):
    x, r = xr
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
def test_scales(xr, scales, exc, msg):
    x, r = xr
    with pytest.raises(exc, match=r"^beam_moe_finalize_norm_residual_norm: " + msg):
        FUSED(x, r, None, None, None, None, scales)
    with pytest.raises(exc, match=r"^beam_norm_residual_norm: " + msg):
        beammoe.beam_norm_residual_norm(r, r, None, None, None, None, scales)
    _untouched(r)


def test_scales_accepted_forms(xr):
    x, r = xr
    want, _ = FUSED(x, r, None, None, None, None, (0.5, 2.0))
    for s in ([0.5, 2.0], (0.5, 2), torch.tensor([0.5, 2.0])):
        h, _ = FUSED(x, r, None, None, None, None, s)
        assert torch.equal(h, want)


# ---- the rest ---------------------------------------------------------------

@pytest.mark.parametrize("kw,msg", [(dict(strategy=1), r"strategy must be a string or None, got int"),
                                    (dict(strategy=True), r"strategy must be a string or None, got bool"),
                                    (dict(inplace=None), r"inplace must be True or False, got NoneType"),
                                    (dict(inplace=1), r"inplace must be True or False, got int")])
def test_strategy_and_flags(xr, kw, msg):
    x, r = xr
    with pytest.raises(TypeError, match=msg):
        FUSED(x, r, None, None, None, None, None, **kw)
    _untouched(r)


def test_tensor_like_objects_rejected(xr):
    x, r = xr
    np = pytest.importorskip("numpy")
    with pytest.raises(TypeError, match=r"residual must be a torch.Tensor, got ndarray"):
        FUSED(x, np.zeros((4, 256)), None, None, None, None, None)
    with pytest.raises(TypeError, match=r"next_weight must be a torch.Tensor, got list"):
        FUSED(x, r, None, None, [1.0] * 256, 1e-6, None)


# ---- the error mapping ------------------------------------------------------

def _fused(g, w, r, *args, **kw):
    return beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), r, *(args or (None,) * 5), **kw)


F, ONES = beammoe.beam_moe_finalize, torch.ones(256, dtype=BF16)

# calls on the case's (g, w, out); out is left as it was. Python's own checks (our messages), then rules the
# library checks (its own message). The strategy's type and three scales: above
REFUSED = [
    (lambda g, w, o: F([1, 2], w, o), TypeError, r"beam_moe_finalize: expert_outputs must be a torch.Tensor, got list"),
    (lambda g, w, o: F(g.half(), w, o), TypeError, r"expert_outputs must have dtype torch.bfloat16, got torch.float16"),
    (lambda g, w, o: F(g, w.to(BF16), o), TypeError,
     r"expert_weights must have dtype torch.float32, got torch.bfloat16"),
    (lambda g, w, o: F(g, w, o.float()), TypeError, r"output must have dtype torch.bfloat16"),
    (lambda g, w, o: F(g, w, torch.empty(4, 512, dtype=BF16)[:, ::2]), ValueError, r"output must be contiguous"),
    (lambda g, w, o: F(g, torch.rand(2, 4).t(), o), ValueError, r"expert_weights must be contiguous"),
    (lambda g, w, o: F(g[:7], w, o), ValueError, r"expert_outputs has shape \(7, 256\).*capacity \* top_k = 8"),
    (lambda g, w, o: F(g, w, torch.empty(4, 512, dtype=BF16)), ValueError,
     r"output has shape \(4, 512\) but the expert outputs have hidden=256"),
    (lambda g, w, o: F(g, w.view(-1), o), ValueError, r"expert_weights must have 2 dimensions"),
    (lambda g, w, o: F(g, w, o, 1.0, torch.ones(512, dtype=BF16), 1e-6), ValueError,
     r"post_weight must have shape \(256,\), got \(512,\)"),
    (lambda g, w, o: F(g, w, o, 1.0, ONES, None), ValueError, r"post_weight is given but post_eps is None"),
    (lambda g, w, o: _fused(g, w, o, strategy="bogus"), ValueError, r"strategy='bogus': unknown strategy"),
    (lambda g, w, o: beammoe.beam_moe_finalize_norm_residual_norm(g, o, None, None, None, None, None), TypeError,
     r"x must be an unfinalized MoE output"),
    (lambda g, w, o: _fused(g, w, o, None, None, ONES, None, None), ValueError,
     r"next_weight is given but next_eps is None"),
    (lambda g, w, o: _fused(g, w, torch.zeros(4, 512, dtype=BF16)), ValueError,
     r"residual has shape \(4, 512\) but x.gemm2_permuted has hidden=256"),
    (lambda g, w, o: F(g, w, o, 1.0, None, -1.0), ValueError, r"^beam_moe_finalize: .*eps=-1 must be finite and >= 0"),
    (lambda g, w, o: F(g, w, o, float("nan")), ValueError, r"^beam_moe_finalize: routed_scale=nan must be finite"),
    (lambda g, w, o: _fused(g, w, o, None, None, None, None, (1.0, float("inf"))), ValueError,
     r"^beam_moe_finalize_norm_residual_norm: scales\[1\]=inf must be finite"),
    (lambda g, w, o: _fused(g, w, o, None, None, None, 1e-6, None, strategy="oneshot"), ValueError,
     r"^beam_moe_finalize_norm_residual_norm: strategy=ONESHOT: unknown strategy for this operation"),
    (lambda g, w, o: F(torch.zeros(33, 256, dtype=BF16), torch.rand(1, 33), o[:1]), ValueError,
     r"^beam_moe_finalize: top_k=33 must be in \[1, 32\]"),
]


@pytest.mark.parametrize("call,exc,msg", REFUSED)
def test_refused(case, call, exc, msg):
    g, w, out = case
    with pytest.raises(exc, match=msg):
        call(g, w, out)
    _untouched(out)


# ---- rules the library checks: its own message ------------------------------

def test_library_hidden_rule(gen):
    g = torch.zeros(4 * 2, 300, dtype=BF16)
    w = torch.rand(4, 2)
    out = torch.full((4, 300), 2.0, dtype=BF16)
    with pytest.raises(ValueError, match=r"^beam_moe_finalize: hidden=300 must be a multiple of 256") as ei:
        beammoe.beam_moe_finalize(g, w, out)
    assert isinstance(ei.value, beammoe.BeamArgumentError)
    assert torch.equal(out, torch.full_like(out, 2.0))


def test_library_capacity_rule(case):
    g, w, _ = case
    out = torch.full((5, 256), 2.0, dtype=BF16)
    with pytest.raises(ValueError, match=r"^beam_moe_finalize: capacity=4 must be >= live_tokens=5"):
        beammoe.beam_moe_finalize(g, w, out)
    _untouched(out)


def test_library_overlap_rule(case):
    g, w, _ = case
    buf = torch.zeros(8 * 256 + 4 * 256, dtype=BF16)
    g2 = buf[: 8 * 256].view(8, 256)
    g2.copy_(g)
    out = buf[4 * 256: 8 * 256].view(4, 256)  # inside the expert outputs
    with pytest.raises(ValueError, match=r"^beam_moe_finalize: output overlaps input expert_outputs"):
        beammoe.beam_moe_finalize(g2, w, out)


# ---- other statuses ---------------------------------------------------------

def test_status_classes():
    for status, cls in [(2, beammoe.BeamUnsupportedError), (3, beammoe.BeamDeviceError),
                        (4, beammoe.BeamCommError), (5, beammoe.BeamOutOfMemoryError), (9, beammoe.BeamError)]:
        with pytest.raises(cls) as ei:
            _errors.raise_for_status(status, "m")
        assert isinstance(ei.value, RuntimeError) and ei.value.status == status


def test_timeout_is_comm_error():
    """Only rank 0 of two arrives: the library times out -> BeamCommError."""
    with beammoe.CpuGroup(2) as grp:
        with pytest.raises(beammoe.BeamCommError, match=r"beam_workspace_create_cpu: .*timeout_ms=200") as ei:
            beammoe.Workspace.cpu(grp, 0, 16, 256, timeout_ms=200)
        assert ei.value.status == _lib.BEAM_ERR_COMM


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CUDA backend runs on this host")
def test_cuda_backend_unavailable_is_beam_error():
    try:
        _lib.set_backend("cuda")
    except beammoe.BeamError as e:
        assert e.status in (_lib.BEAM_ERR_UNSUPPORTED, _lib.BEAM_ERR_DEVICE)
        assert "cuda" in str(e)
    else:
        pytest.skip("the CUDA backend loaded and runs (a GPU torch cannot see?)")
    finally:
        _lib.set_backend("cpu")
    with pytest.raises(beammoe.BeamUnsupportedError, match=r"^beam_backend_ops: the cuda backend"):
        _lib.backend_ops("cuda")  # the table the CUDA tensors' calls would take


def test_message_of_the_library_that_ran_the_call(case):
    """A call goes through its backend's table, and a failure is explained by
    that library's message: the dispatcher, which never saw the call, keeps
    its own (here of a refused beam_set_backend)."""
    g, w, out = case
    cpu = _lib.backend_ops("cpu")  # read first: beam_backend_ops clears the dispatcher's message
    lib = _lib.library()
    assert lib.beam_set_backend(b"no-such-backend") == _lib.BEAM_ERR_INVALID_ARGUMENT
    dispatcher = _lib.last_error()
    assert "no-such-backend" in dispatcher
    with pytest.raises(ValueError, match=r"^beam_moe_finalize: routed_scale=inf must be finite"):
        beammoe.beam_moe_finalize(g, w, out, float("inf"))
    assert _lib.last_error() == dispatcher
    assert _lib.last_error(cpu).startswith("beam_moe_finalize: routed_scale=inf")


def test_messages_are_per_thread(case):
    """The message read after a failed call is the calling thread's own."""
    g, w, out = case
    seen = []

    def bad():
        try:
            beammoe.beam_moe_finalize(g, w, out, float("inf"))
        except ValueError as e:
            seen.append(str(e))

    ts = [threading.Thread(target=bad) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(seen) == 4 and all("routed_scale=inf must be finite" in s for s in seen)
