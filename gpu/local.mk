# gpu/local.mk - libbeammoe_cuda: lib/ (checks, entry points) plus the CUDA
# kernels of gpu/. Included by the top Makefile.am inside `if BEAM_WITH_CUDA`;
# paths are relative to the top directory.
#
# libtool cannot compile .cu files: the top Makefile.am's one `.cu.lo` rule
# runs nvcc through build-aux/nvcc-lt.sh, which writes the libtool object
# (.lo) by hand, and the objects join the library through LIBADD. Each
# object's dependencies are written by nvcc as it compiles and included from
# $(BEAM_CU_DEPFILES). Works in VPATH builds (make distcheck): sources come
# from $(srcdir), objects go to the build dir. The .cu sources and headers
# are distributed by the top Makefile.am in every configuration.

# the row kernels in one file per family (launch_shapes.h), so that make -j
# compiles them side by side
BEAM_GPU_OBJS = gpu/launch.lo gpu/launch_row.lo gpu/launch_pipe.lo gpu/launch_nrn.lo gpu/backend_cuda.lo
BEAM_GPU_DEPS = gpu/$(DEPDIR)/launch.Plo gpu/$(DEPDIR)/launch_row.Plo gpu/$(DEPDIR)/launch_pipe.Plo \
	gpu/$(DEPDIR)/launch_nrn.Plo gpu/$(DEPDIR)/backend_cuda.Plo
BEAM_CU_DEPFILES += $(BEAM_GPU_DEPS)

lib_LTLIBRARIES += libbeammoe_cuda.la
BEAM_BACKEND_LIBS += libbeammoe_cuda.la
libbeammoe_cuda_la_SOURCES = $(BEAM_LIB_CORE)
# Own per-target flags: lib/*.c get object names of their own
# (lib/libbeammoe_cuda_la-api.lo), distinct from the CPU library's.
libbeammoe_cuda_la_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
libbeammoe_cuda_la_CFLAGS = $(AM_CFLAGS) $(PTHREAD_CFLAGS)
libbeammoe_cuda_la_LIBADD = $(BEAM_GPU_OBJS) $(CUDA_LIBS) -lstdc++
libbeammoe_cuda_la_DEPENDENCIES = $(BEAM_GPU_OBJS)
libbeammoe_cuda_la_LDFLAGS = $(BEAM_EXPORTS) $(CUDA_LDFLAGS) $(PTHREAD_CFLAGS)

CLEANFILES += $(BEAM_GPU_OBJS) gpu/launch.o gpu/launch_row.o gpu/launch_pipe.o gpu/launch_nrn.o \
	gpu/backend_cuda.o gpu/.libs/launch.o gpu/.libs/launch_row.o gpu/.libs/launch_pipe.o \
	gpu/.libs/launch_nrn.o gpu/.libs/backend_cuda.o
DISTCLEANFILES += $(BEAM_GPU_DEPS)

# ---- bench/cuda_bench: copy bandwidth, then each op over CUDA graph replays
# (public API + cudart, the harness's check macros and GPU probe; run it on
# a GPU host, see scripts/gpu-check.sh).
noinst_PROGRAMS += bench/cuda_bench
bench_cuda_bench_SOURCES = bench/cuda_bench.c bench/graph_calls.h
bench_cuda_bench_CPPFLAGS = $(BEAM_HARNESS_CPPFLAGS) $(CUDA_CPPFLAGS)
bench_cuda_bench_LDFLAGS = $(CUDA_LDFLAGS)
bench_cuda_bench_LDADD = harness/libharness_cuda.la harness/libharness.la libbeammoe.la $(CUDA_LIBS)
EXTRA_bench_cuda_bench_DEPENDENCIES = libbeammoe_cuda.la

# ---- bench/shape_sweep: every compiled launch shape checked and timed (a
# contributor's tool, docs/PERF.md): drives gpu/launch*.cu without lib/, so
# it links its own compile of it, bench/sweep_launch.cu (the library's
# shapes and the candidates only the sweep times), and the harness (its
# naive reference, its check macros, its model of the quantized output).
# Built on request (`make bench/shape_sweep`) and by scripts/gpu-check.sh.
EXTRA_PROGRAMS += bench/shape_sweep
bench_shape_sweep_SOURCES =
bench_shape_sweep_LDFLAGS = $(CUDA_LDFLAGS)
bench_shape_sweep_LDADD = bench/shape_sweep.lo bench/sweep_launch.lo harness/libharness.la \
	$(CUDA_LIBS) -lstdc++
BEAM_CU_DEPFILES += bench/$(DEPDIR)/shape_sweep.Plo bench/$(DEPDIR)/sweep_launch.Plo
CLEANFILES += bench/shape_sweep$(EXEEXT) bench/shape_sweep.lo bench/shape_sweep.o \
	bench/.libs/shape_sweep.o bench/sweep_launch.lo bench/sweep_launch.o bench/.libs/sweep_launch.o
DISTCLEANFILES += bench/$(DEPDIR)/shape_sweep.Plo bench/$(DEPDIR)/sweep_launch.Plo

# ---- ptxas's allocation of each row kernel (bench/sweep_launch.cu: the
# library's and the sweep's) against the recorded
# gpu/ptxas-regs.txt (scripts/ptxas-regs.sh says why): `make ptxas-regs`
# compares, `make ptxas-regs PTXAS_UPDATE=update` records. Run by
# scripts/gpu-check.sh.
ptxas-regs:
	$(AM_V_NVCC)$(BEAM_NVCC) -Xptxas -v -c $(srcdir)/bench/sweep_launch.cu -o gpu/ptxas-regs.o 2> gpu/ptxas-regs.log
	$(SHELL) $(srcdir)/scripts/ptxas-regs.sh gpu/ptxas-regs.log $(srcdir)/gpu/ptxas-regs.txt \
	  "`$(NVCC) --version | tail -1` $(NVCC_FLAGS)" $(PTXAS_UPDATE)
.PHONY: ptxas-regs
CLEANFILES += gpu/ptxas-regs.o gpu/ptxas-regs.log
