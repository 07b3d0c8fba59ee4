"""Error mapping: Python-level TypeError/ValueError with our own messages for
what only Python sees; the library's message for every rule it checks
(BEAM_ERR_INVALID_ARGUMENT -> ValueError); other statuses -> BeamError."""
import threading

import pytest
import torch

import beammoe
from beammoe import _errors, _lib
from reference import BF16, random_bf16, random_case

FN = "beam_moe_finalize"
FUSED = "beam_moe_finalize_norm_residual_norm"


@pytest.fixture
def case(gen):
    g, w = random_case(gen, 4, 2, 256)
    return g, w, torch.full((4, 256), 2.0, dtype=BF16)


def _untouched(out):
    assert torch.equal(out, torch.full_like(out, 2.0)), "an output was written by a failing call"


# ---- Python-level checks (our messages) ------------------------------------

def test_not_a_tensor(case):
    g, w, out = case
    with pytest.raises(TypeError, match=r"beam_moe_finalize: expert_outputs must be a torch.Tensor, got list"):
        beammoe.beam_moe_finalize([1, 2], w, out)


def test_wrong_dtypes(case):
    g, w, out = case
    with pytest.raises(TypeError, match=r"expert_outputs must have dtype torch.bfloat16, got torch.float16"):
        beammoe.beam_moe_finalize(g.half(), w, out)
    with pytest.raises(TypeError, match=r"expert_weights must have dtype torch.float32, got torch.bfloat16"):
        beammoe.beam_moe_finalize(g, w.to(BF16), out)
    with pytest.raises(TypeError, match=r"output must have dtype torch.bfloat16"):
        beammoe.beam_moe_finalize(g, w, out.float())
    _untouched(out)


def test_not_contiguous(case):
    g, w, out = case
    wide = torch.empty(4, 512, dtype=BF16)[:, ::2]
    with pytest.raises(ValueError, match=r"output must be contiguous"):
        beammoe.beam_moe_finalize(g, w, wide)
    with pytest.raises(ValueError, match=r"expert_weights must be contiguous"):
        beammoe.beam_moe_finalize(g, torch.rand(2, 4).t(), out)


def test_shapes_between_tensors(case):
    g, w, out = case
    with pytest.raises(ValueError, match=r"expert_outputs has shape \(7, 256\).*capacity \* top_k = 8"):
        beammoe.beam_moe_finalize(g[:7], w, out)
    with pytest.raises(ValueError, match=r"output has shape \(4, 512\) but the expert outputs have hidden=256"):
        beammoe.beam_moe_finalize(g, w, torch.empty(4, 512, dtype=BF16))
    with pytest.raises(ValueError, match=r"expert_weights must have 2 dimensions"):
        beammoe.beam_moe_finalize(g, w.view(-1), out)
    with pytest.raises(ValueError, match=r"post_weight must have shape \(256,\), got \(512,\)"):
        beammoe.beam_moe_finalize(g, w, out, 1.0, torch.ones(512, dtype=BF16), 1e-6)
    _untouched(out)


def test_weight_without_eps(case):
    g, w, out = case
    with pytest.raises(ValueError, match=r"post_weight is given but post_eps is None"):
        beammoe.beam_moe_finalize(g, w, out, 1.0, torch.ones(256, dtype=BF16), None)


def test_fused_python_checks(gen):
    g, w = random_case(gen, 4, 2, 256)
    r = random_bf16(gen, 4, 256)
    with pytest.raises(TypeError, match=r"x must be an unfinalized MoE output"):
        beammoe.beam_moe_finalize_norm_residual_norm(g, r, None, None, None, None, None)
    with pytest.raises(ValueError, match=r"strategy='bogus': unknown strategy"):
        beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), r, None, None, None, None, None,
                                                     strategy="bogus")
    with pytest.raises(TypeError, match=r"strategy must be a string or None"):
        beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), r, None, None, None, None, None,
                                                     strategy=1)
    with pytest.raises(ValueError, match=r"scales must be a pair of floats or None, got 3 values"):
        beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), r, None, None, None, None,
                                                     (1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match=r"next_weight is given but next_eps is None"):
        beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), r, None, None,
                                                     torch.ones(256, dtype=BF16), None, None)
    with pytest.raises(ValueError, match=r"residual has shape \(4, 512\) but x.gemm2_permuted has hidden=256"):
        beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), torch.zeros(4, 512, dtype=BF16),
                                                     None, None, None, None, None)


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


def test_library_eps_scale_rules(case, gen):
    g, w, out = case
    with pytest.raises(ValueError, match=r"^beam_moe_finalize: .*eps=-1 must be finite and >= 0"):
        beammoe.beam_moe_finalize(g, w, out, 1.0, None, -1.0)
    with pytest.raises(ValueError, match=r"^beam_moe_finalize: routed_scale=nan must be finite"):
        beammoe.beam_moe_finalize(g, w, out, float("nan"))
    _untouched(out)
    r = torch.full((4, 256), 2.0, dtype=BF16)
    with pytest.raises(ValueError, match=r"^beam_moe_finalize_norm_residual_norm: scales\[1\]=inf must be finite"):
        beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), r, None, None, None, None,
                                                     (1.0, float("inf")))
    _untouched(r)


def test_library_strategy_rule(case):
    g, w, _ = case
    r = torch.full((4, 256), 2.0, dtype=BF16)
    with pytest.raises(ValueError, match=r"^beam_moe_finalize_norm_residual_norm: strategy=ONESHOT: unknown "
                                         r"strategy for this operation"):
        beammoe.beam_moe_finalize_norm_residual_norm(beammoe.MoEOutput(g, w), r, None, None, None, 1e-6, None,
                                                     strategy="oneshot")
    _untouched(r)


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
