# gpu/gather.mk - the tensor-parallel gather and all-reduce over NCCL
# (gpu/gather*.cu, gpu/allreduce_fused.cu),
# part of libbeammoe_cuda. Included by the top Makefile.am inside
# `if BEAM_WITH_CUDA`, right after gpu/local.mk; the objects are made by the
# top Makefile.am's `.cu.lo` rule. Paths are relative to the top directory.

BEAM_GATHER_OBJS = gpu/gather.lo gpu/gather_ws.lo gpu/gather_fused.lo gpu/gather_unfused.lo \
	gpu/gather_group.lo gpu/gather_watch.lo gpu/allreduce_fused.lo
BEAM_CU_DEPFILES += gpu/$(DEPDIR)/gather.Plo gpu/$(DEPDIR)/gather_ws.Plo \
	gpu/$(DEPDIR)/gather_fused.Plo gpu/$(DEPDIR)/gather_unfused.Plo gpu/$(DEPDIR)/gather_group.Plo gpu/$(DEPDIR)/gather_watch.Plo \
	gpu/$(DEPDIR)/allreduce_fused.Plo

libbeammoe_cuda_la_LIBADD += $(BEAM_GATHER_OBJS) $(NCCL_LIBS)
libbeammoe_cuda_la_DEPENDENCIES += $(BEAM_GATHER_OBJS)

CLEANFILES += $(BEAM_GATHER_OBJS) gpu/gather.o gpu/gather_ws.o gpu/gather_fused.o \
	gpu/gather_unfused.o gpu/gather_group.o gpu/.libs/gather.o gpu/.libs/gather_ws.o \
	gpu/.libs/gather_fused.o gpu/.libs/gather_unfused.o gpu/.libs/gather_group.o \
	gpu/gather_watch.o gpu/.libs/gather_watch.o gpu/allreduce_fused.o gpu/.libs/allreduce_fused.o
DISTCLEANFILES += gpu/$(DEPDIR)/gather.Plo gpu/$(DEPDIR)/gather_ws.Plo \
	gpu/$(DEPDIR)/gather_fused.Plo gpu/$(DEPDIR)/gather_unfused.Plo gpu/$(DEPDIR)/gather_group.Plo \
	gpu/$(DEPDIR)/gather_watch.Plo gpu/$(DEPDIR)/allreduce_fused.Plo
