# harness/cuda.mk - what the GPU tests and benches share beyond the harness
# (harness/local.mk), compiled with the CUDA headers: the GPU probe
# (gpu_probe.c). Included by the top Makefile.am inside `if BEAM_WITH_CUDA`;
# paths are relative to the top directory. A convenience library, never
# installed; a program that links it also links the CUDA runtime and the
# beam library of its choice (the dispatcher or libbeammoe_cuda).

noinst_LTLIBRARIES += harness/libharness_cuda.la
harness_libharness_cuda_la_SOURCES = harness/gpu_probe.c harness/gpu_probe.h
harness_libharness_cuda_la_CPPFLAGS = $(BEAM_HARNESS_CPPFLAGS) $(CUDA_CPPFLAGS)
