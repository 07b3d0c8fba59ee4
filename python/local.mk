# python/local.mk - the Python package (python/beammoe, ctypes over
# libbeammoe) and its pytest suite. Included by the top Makefile.am; paths
# are relative to the top directory.
#
# `make check` runs python/run-pytest.sh: pytest over python/tests against
# this tree's .libs/libbeammoe.so; it skips (77) when the python it picks
# cannot import torch and pytest. After `make`, `pip install ./python`
# installs the package with this tree's libraries inside (see
# docs/python.md).

TESTS += python/run-pytest.sh
EXTRA_DIST += python/run-pytest.sh python/pyproject.toml python/setup.py python/build_backend.py python/README.md \
	python/beammoe/__init__.py python/beammoe/__main__.py python/beammoe/_calls.py \
	python/beammoe/_checks.py python/beammoe/_errors.py python/beammoe/_forms.py \
	python/beammoe/_lib.py python/beammoe/_nccl.py python/beammoe/_pgather.py \
	python/beammoe/_prepared.py python/beammoe/_run.py python/beammoe/_torch_ops.py \
	python/beammoe/audit.py python/beammoe/fp8.py python/beammoe/ops.py python/beammoe/quant.py \
	python/beammoe/workspace.py \
	python/tests/_pg_worker.py python/tests/conftest.py python/tests/reference.py \
	python/tests/test_audit_file.py python/tests/test_cuda.py python/tests/test_errors.py \
	python/tests/test_fp8.py python/tests/test_fused.py python/tests/test_gather_fp8.py \
	python/tests/test_gather_process_group.py python/tests/test_prototypes.py \
	python/tests/test_reference_semantics.py python/tests/test_torch_ops.py \
	bench/python_overhead.py bench/torch_compare.py bench/fp8_compare.py bench/gemm_pair.py \
	bench/fp8_vllm_diff.py
