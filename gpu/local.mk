# gpu/local.mk - libbeammoe_cuda: lib/ (checks, entry points) plus the CUDA
# kernels of gpu/. Included by the top Makefile.am inside `if BEAM_WITH_CUDA`;
# paths are relative to the top directory.
#
# libtool cannot compile .cu files: the rules below run nvcc through
# build-aux/nvcc-lt.sh, which writes the libtool object (.lo) by hand, and
# the objects join the library through LIBADD. Works in VPATH builds
# (make distcheck): sources come from $(srcdir), objects go to the build dir.

BEAM_GPU_INCS = gpu/launch.h gpu/numerics.cuh gpu/row_ops.cuh gpu/row_kernel.cuh \
	gpu/pipe_kernel.cuh
BEAM_GPU_OBJS = gpu/launch.lo gpu/backend_cuda.lo
BEAM_NVCC = $(NVCC) $(NVCC_FLAGS) -I$(top_srcdir)/include -I$(top_srcdir)/lib \
	-I$(top_srcdir)/gpu -I$(top_builddir) $(CUDA_CPPFLAGS)

lib_LTLIBRARIES += libbeammoe_cuda.la
libbeammoe_cuda_la_SOURCES = $(BEAM_LIB_CORE)
# Listed for `make dist` only (the rules below build them): EXTRA_DIST in this
# fragment would be conditional (BEAM_WITH_CUDA) and a tarball made by a
# CPU-only configure would lack them; EXTRA_*_SOURCES are distributed in
# every configuration.
EXTRA_libbeammoe_cuda_la_SOURCES = gpu/launch.cu gpu/backend_cuda.cu $(BEAM_GPU_INCS) \
	build-aux/nvcc-lt.sh scripts/gpu-check.sh scripts/gpu-run.sh
# Own per-target flags: lib/*.c get object names of their own
# (lib/libbeammoe_cuda_la-api.lo), distinct from the CPU library's.
libbeammoe_cuda_la_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
libbeammoe_cuda_la_CFLAGS = $(AM_CFLAGS) $(PTHREAD_CFLAGS)
libbeammoe_cuda_la_LIBADD = $(BEAM_GPU_OBJS) $(CUDA_LIBS) -lstdc++
libbeammoe_cuda_la_DEPENDENCIES = $(BEAM_GPU_OBJS)
libbeammoe_cuda_la_LDFLAGS = $(BEAM_EXPORTS) $(CUDA_LDFLAGS) $(PTHREAD_CFLAGS)

# One explicit rule per object (no suffix rule: SUFFIXES cannot be set
# inside the BEAM_WITH_CUDA conditional). The `test -f` idiom is Automake's
# own for VPATH builds: the source is in the build dir or in $(srcdir).
BEAM_GPU_DEPS = $(BEAM_GPU_INCS) lib/backend.h lib/error.h include/beammoe.h \
	build-aux/nvcc-lt.sh
gpu/launch.lo: gpu/launch.cu $(BEAM_GPU_DEPS)
	$(AM_V_GEN)$(SHELL) $(top_srcdir)/build-aux/nvcc-lt.sh $@ $(BEAM_NVCC) \
	  -c `test -f gpu/launch.cu || echo '$(srcdir)/'`gpu/launch.cu
gpu/backend_cuda.lo: gpu/backend_cuda.cu $(BEAM_GPU_DEPS)
	$(AM_V_GEN)$(SHELL) $(top_srcdir)/build-aux/nvcc-lt.sh $@ $(BEAM_NVCC) \
	  -c `test -f gpu/backend_cuda.cu || echo '$(srcdir)/'`gpu/backend_cuda.cu

CLEANFILES += $(BEAM_GPU_OBJS) gpu/launch.o gpu/backend_cuda.o \
	gpu/.libs/launch.o gpu/.libs/backend_cuda.o

# ---- bench/cuda_bench: copy bandwidth, then each op over CUDA graph replays
# (public API + cudart; run it on a GPU host, see scripts/gpu-check.sh).
noinst_PROGRAMS += bench/cuda_bench
bench_cuda_bench_SOURCES = bench/cuda_bench.c
bench_cuda_bench_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
bench_cuda_bench_LDFLAGS = $(CUDA_LDFLAGS)
bench_cuda_bench_LDADD = libbeammoe.la $(CUDA_LIBS)
EXTRA_bench_cuda_bench_DEPENDENCIES = libbeammoe_cuda.la

# ---- bench/shape_sweep: every compiled launch shape checked and timed (a
# contributor's tool, docs/PERF.md): drives gpu/launch.cu without lib/, so
# it links gpu/launch.o and the naive reference itself. Built on request
# (`make bench/shape_sweep`) and by scripts/gpu-check.sh.
bench/shape_sweep$(EXEEXT): bench/shape_sweep.cu gpu/launch.lo harness/naive_ref.c $(BEAM_GPU_DEPS)
	$(AM_V_GEN)$(BEAM_NVCC) -I$(top_srcdir)/harness -Xcompiler -ffp-contract=off -o $@ \
	  `test -f bench/shape_sweep.cu || echo '$(srcdir)/'`bench/shape_sweep.cu \
	  `test -f harness/naive_ref.c || echo '$(srcdir)/'`harness/naive_ref.c gpu/launch.o
CLEANFILES += bench/shape_sweep$(EXEEXT)
