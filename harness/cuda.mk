# harness/cuda.mk - what the GPU tests and benches share beyond the harness
# (harness/local.mk), compiled with the CUDA and NCCL headers: the GPU probe
# (gpu_probe.c) and the launcher of ranks as processes over NCCL (ranks.c).
# Included by the top Makefile.am inside `if BEAM_WITH_CUDA`;
# paths are relative to the top directory. A convenience library, never
# installed; a program that links it also links the CUDA runtime and the
# beam library of its choice (the dispatcher or libbeammoe_cuda), and NCCL
# when it starts ranks.

noinst_LTLIBRARIES += harness/libharness_cuda.la
harness_libharness_cuda_la_SOURCES = harness/gpu_probe.c harness/gpu_probe.h \
	harness/ranks.c harness/ranks.h
harness_libharness_cuda_la_CPPFLAGS = $(BEAM_HARNESS_CPPFLAGS) $(CUDA_CPPFLAGS)
