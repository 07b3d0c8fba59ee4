"""Error mapping: Python-level TypeError/ValueError with our own messages for
what only Python sees; the library's message for every rule it checks
(BEAM_ERR_INVALID_ARGUMENT -> ValueError); other statuses -> BeamError."""
import threading

import pytest
import torch

import beammoe
from beammoe import _errors, _lib
from reference import BF16, random_case


@pytest.fixture
def case(gen):
    g, w = random_case(gen, 4, 2, 256)
    return g, w, torch.full((4, 256), 2.0, dtype=BF16)


def _untouched(out):
    assert torch.equal(out, torch.full_like(out, 2.0)), "an output was written by a failing call"


def _fused(g, w, r, *args, **kw):
    return beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), r, *(args or (None,) * 5), **kw)


F, ONES = beammoe.beam_moe_finalize, torch.ones(256, dtype=BF16)

# calls on the case's (g, w, out); out is left as it was. Python's own checks (our messages), then rules the
# library checks (its own message). The strategy's type and three scales: test_arguments.py
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


def test_library_top_k_rule():
    g = torch.zeros(33, 256, dtype=BF16)
    with pytest.raises(ValueError, match=r"^beam_moe_finalize: top_k=33 must be in \[1, 32\]"):
        beammoe.beam_moe_finalize(g, torch.rand(1, 33), torch.empty(1, 256, dtype=BF16))


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


def test_library_cpu_group_rule():
    with pytest.raises(ValueError, match=r"^beam_cpu_group_create: .*nranks"):
        beammoe.CpuGroup(0)


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
