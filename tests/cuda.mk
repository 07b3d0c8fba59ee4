# tests/cuda.mk - the CUDA test suite (included by the top Makefile.am inside
# `if BEAM_WITH_CUDA`; paths relative to the top directory).
#
#   test_cuda   what only the CUDA backend has: its contract on device memory
#               and calls captured in CUDA graphs, against the CPU bit for bit
#               (see the file's header; its results over every operation and
#               configuration: tests/test_backends, in tests/local.mk). Exits
#               77 (skip) on a machine without a GPU, so `make check` passes on
#               CI hosts that only compile it.
#
# The whole GPU run (this test, compute-sanitizer memcheck and racecheck, the
# benchmark) on a GPU host: scripts/gpu-check.sh.

if HAVE_CUNIT

check_PROGRAMS += tests/test_cuda
TESTS += tests/test_cuda

tests_test_cuda_CPPFLAGS = $(BEAM_TEST_CPPFLAGS) $(CUDA_CPPFLAGS)
tests_test_cuda_LDFLAGS = $(CUDA_LDFLAGS)
tests_test_cuda_LDADD = $(BEAM_TEST_LIBS) libbeammoe.la $(CUDA_LIBS)
# the dispatcher dlopens the backend libraries: build them before the test
EXTRA_tests_test_cuda_DEPENDENCIES = libbeammoe_cuda.la libbeammoe_cpu.la

endif
