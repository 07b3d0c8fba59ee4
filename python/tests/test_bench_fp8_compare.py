"""bench/fp8_compare.py runs, and its bit check agrees, for every configuration.

The benchmark checks each operation's quantized form (beammoe.*_fp8) against
the BF16 operation followed by a torch.compile'd quantization written from
vLLM's formulas, once per configuration and form, before it times anything.
Run on the CPU at one small shape, every configuration with a next norm
(`--ops all`: pre-norm, scales, norms without weights, in place) and the
group-128 and NVFP4 forms, that check is an end-to-end comparison of the
quantized outputs with an independent formula, and the run shows that the
benchmark itself still works against the package.
"""
import os
import re
import subprocess
import sys

import pytest
import torch

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SCRIPT = os.path.join(_ROOT, "bench", "fp8_compare.py")

pytestmark = pytest.mark.skipif(
    getattr(torch, "float8_e4m3fn", None) is None or not hasattr(torch, "compile"),
    reason="torch %s has no float8_e4m3fn or torch.compile" % torch.__version__)


def test_every_configuration_agrees_on_cpu():
    cmd = [sys.executable, _SCRIPT, "--device", "cpu", "--ops", "all", "--forms", "group128,nvfp4",
           "--shapes", "4:2048", "--iters", "2", "--threads", "1"]
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-4000:]
    rows = re.findall(r"^(\S+) (\S+) T=4 H=2048 wall \[(\w+)\]", run.stdout, re.M)
    # torch_compare's configurations with a next norm: five of the fused op, five of nrn
    ops = {op for op, _, _ in rows}
    assert len(ops) == 10, run.stdout[-4000:]
    assert {form for _, form, _ in rows} == {"group128", "nvfp4"}
    assert len(rows) == 20
    assert all(check == "agree" for _, _, check in rows), [r for r in rows if r[2] != "agree"]
