"""The gather wrapper on GPUs: one process per GPU (torch.multiprocessing,
spawn), an NCCL process group over a file:// store, beammoe.Workspace making
its own communicator; every rank's results equal the CPU backend's local
fused operation bit for bit. Skipped with fewer GPUs than ranks."""
import os
import tempfile
import time

import pytest
import torch

from conftest import cuda_backend_skip_reason

WORLD_SIZES = [1, 2]


@pytest.mark.parametrize("nranks", WORLD_SIZES)
def test_gather_on_gpus(nranks):
    if not torch.cuda.is_available() or torch.cuda.device_count() < nranks:
        pytest.skip("needs %d GPUs" % nranks)
    if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        pytest.skip("torch.distributed with NCCL is not available")
    why = cuda_backend_skip_reason()
    if why:
        pytest.skip(why)
    import torch.multiprocessing as mp

    import _gather_worker

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    with tempfile.TemporaryDirectory() as d:
        init_file = os.path.join(d, "store")
        ctx = mp.spawn(_gather_worker.worker, args=(nranks, init_file), nprocs=nranks, join=False)
        deadline = time.monotonic() + 480
        while not ctx.join(timeout=5):  # raises if a rank failed
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                pytest.fail("the ranks did not finish within 480 s")
