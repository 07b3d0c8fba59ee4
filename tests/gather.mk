# tests/gather.mk - the tensor-parallel gather: its tests and its benchmark.
# Included by the top Makefile.am inside `if BEAM_WITH_CUDA`, after
# tests/cuda.mk; paths relative to the top directory.
#
#   make check                    runs tests/test_gather_group (every world
#                                 size as threads on one GPU; exits 77 with
#                                 no GPU) and tests/test_gather_nccl (one
#                                 process per GPU over NCCL; exits 77 with
#                                 fewer than 2)
#   make bench-gather             bench/gather_bench: TP=2, H=7168, K=8, every
#                                 strategy side by side (docs/PERF.md)
# Both tests share their parts (tests/gather_parts.c) and the model of the
# quantized output (harness/quant_model.c, part "quant"); test_gather_nccl and
# gather_bench start their rank processes with the harness's launcher
# (harness/ranks.c, in harness/libharness_cuda.la), which sets
# NCCL_NVLS_ENABLE=0 (NVLink multicast is never used).
# On a GPU host without the build (no libtool there): scripts/gpu-check.sh
# bundles the programs, scripts/gpu-run.sh and scripts/gather-run.sh run them.

BEAM_GATHER_TEST_CPPFLAGS = $(BEAM_HARNESS_CPPFLAGS) $(CUDA_CPPFLAGS) -I$(top_srcdir)/tests
BEAM_GATHER_TEST_LIBS = harness/libharness.la libbeammoe_cuda.la $(CUDA_LIBS) -lm

check_PROGRAMS += tests/test_gather_nccl tests/test_gather_group
TESTS += tests/test_gather_group tests/test_gather_nccl
# The naive reference and the check macros come from the harness
# (harness/local.mk).
tests_test_gather_nccl_SOURCES = tests/test_gather_nccl.c tests/gather_parts.c tests/gather_parts.h
tests_test_gather_nccl_CPPFLAGS = $(BEAM_GATHER_TEST_CPPFLAGS)
tests_test_gather_nccl_LDFLAGS = $(CUDA_LDFLAGS)
tests_test_gather_nccl_LDADD = harness/libharness_cuda.la $(BEAM_GATHER_TEST_LIBS) $(NCCL_LIBS)

tests_test_gather_group_SOURCES = tests/test_gather_group.c tests/gather_parts.c tests/gather_parts.h
tests_test_gather_group_CPPFLAGS = $(BEAM_GATHER_TEST_CPPFLAGS)
tests_test_gather_group_CFLAGS = $(AM_CFLAGS) $(PTHREAD_CFLAGS)
tests_test_gather_group_LDFLAGS = $(CUDA_LDFLAGS) $(PTHREAD_CFLAGS)
tests_test_gather_group_LDADD = $(BEAM_GATHER_TEST_LIBS)

noinst_PROGRAMS += bench/gather_bench
bench_gather_bench_SOURCES = bench/gather_bench.c
bench_gather_bench_CPPFLAGS = $(BEAM_HARNESS_CPPFLAGS) $(CUDA_CPPFLAGS)
bench_gather_bench_LDFLAGS = $(CUDA_LDFLAGS)
bench_gather_bench_LDADD = harness/libharness_cuda.la harness/libharness.la libbeammoe_cuda.la \
	$(NCCL_LIBS) $(CUDA_LIBS)

# (no .PHONY: automake refuses it in two conditions; bench-gather is never a file)
bench-gather: bench/gather_bench$(EXEEXT)
	NCCL_NVLS_ENABLE=0 $(builddir)/bench/gather_bench
