# tests/gather.mk - the NCCL tensor-parallel gather: its test and its
# benchmark (both need libbeammoe_cuda, NCCL and two or more GPUs). Included
# by the top Makefile.am inside `if BEAM_WITH_CUDA`, after tests/cuda.mk;
# paths relative to the top directory.
#
#   make check                    runs tests/test_gather_nccl: one process per
#                                 GPU; exits 77 (skipped) with fewer than 2
#   make bench-gather             bench/gather_bench: TP=2, H=7168, K=8, every
#                                 strategy side by side (docs/PERF.md)
# Both set NCCL_NVLS_ENABLE=0 themselves (NVLink multicast is never used).
# On a GPU host without the build (no libtool there): scripts/gpu-check.sh
# bundles both programs, scripts/gather-run.sh runs them.

check_PROGRAMS += tests/test_gather_nccl
TESTS += tests/test_gather_nccl
# The naive reference comes from the harness (harness/local.mk).
tests_test_gather_nccl_SOURCES = tests/test_gather_nccl.c
tests_test_gather_nccl_CPPFLAGS = $(BEAM_HARNESS_CPPFLAGS) $(CUDA_CPPFLAGS)
tests_test_gather_nccl_LDFLAGS = $(CUDA_LDFLAGS)
tests_test_gather_nccl_LDADD = harness/libharness.la libbeammoe_cuda.la $(NCCL_LIBS) $(CUDA_LIBS) -lm

noinst_PROGRAMS += bench/gather_bench
bench_gather_bench_SOURCES = bench/gather_bench.c
bench_gather_bench_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
bench_gather_bench_LDFLAGS = $(CUDA_LDFLAGS)
bench_gather_bench_LDADD = libbeammoe_cuda.la $(NCCL_LIBS) $(CUDA_LIBS)

# (no .PHONY: automake refuses it in two conditions; bench-gather is never a file)
bench-gather: bench/gather_bench$(EXEEXT)
	NCCL_NVLS_ENABLE=0 $(builddir)/bench/gather_bench
