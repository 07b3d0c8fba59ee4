# gpu/gather.mk - the tensor-parallel gather over NCCL (gpu/gather*.cu),
# part of libbeammoe_cuda. Included by the top Makefile.am inside
# `if BEAM_WITH_CUDA`, right after gpu/local.mk, whose nvcc-lt.sh rule
# pattern and $(BEAM_NVCC) it reuses; paths are relative to the top directory.

BEAM_GATHER_INCS = gpu/gather.h gpu/gather_impl.h
BEAM_GATHER_OBJS = gpu/gather.lo gpu/gather_ws.lo gpu/gather_fused.lo gpu/gather_unfused.lo
BEAM_GATHER_DEPS = $(BEAM_GATHER_INCS) $(BEAM_GPU_DEPS)

libbeammoe_cuda_la_LIBADD += $(BEAM_GATHER_OBJS) $(NCCL_LIBS)
libbeammoe_cuda_la_DEPENDENCIES += $(BEAM_GATHER_OBJS)

gpu/gather.lo: gpu/gather.cu $(BEAM_GATHER_DEPS)
	$(AM_V_GEN)$(SHELL) $(top_srcdir)/build-aux/nvcc-lt.sh $@ $(BEAM_NVCC) \
	  -c `test -f gpu/gather.cu || echo '$(srcdir)/'`gpu/gather.cu
gpu/gather_ws.lo: gpu/gather_ws.cu $(BEAM_GATHER_DEPS)
	$(AM_V_GEN)$(SHELL) $(top_srcdir)/build-aux/nvcc-lt.sh $@ $(BEAM_NVCC) \
	  -c `test -f gpu/gather_ws.cu || echo '$(srcdir)/'`gpu/gather_ws.cu
gpu/gather_fused.lo: gpu/gather_fused.cu $(BEAM_GATHER_DEPS)
	$(AM_V_GEN)$(SHELL) $(top_srcdir)/build-aux/nvcc-lt.sh $@ $(BEAM_NVCC) \
	  -c `test -f gpu/gather_fused.cu || echo '$(srcdir)/'`gpu/gather_fused.cu
gpu/gather_unfused.lo: gpu/gather_unfused.cu $(BEAM_GATHER_DEPS)
	$(AM_V_GEN)$(SHELL) $(top_srcdir)/build-aux/nvcc-lt.sh $@ $(BEAM_NVCC) \
	  -c `test -f gpu/gather_unfused.cu || echo '$(srcdir)/'`gpu/gather_unfused.cu

# Distributed in every configuration: listed in the top Makefile.am.

# The backend's table names the gather's entry points.
gpu/backend_cuda.lo: gpu/gather.h
CLEANFILES += $(BEAM_GATHER_OBJS) gpu/gather.o gpu/gather_ws.o gpu/gather_fused.o \
	gpu/gather_unfused.o gpu/.libs/gather.o gpu/.libs/gather_ws.o gpu/.libs/gather_fused.o \
	gpu/.libs/gather_unfused.o
