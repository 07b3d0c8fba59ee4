# harness/local.mk - what the tests, the `beammoe` tool and its benches
# share: one case description, one naive reference (naive_ref.c), one set of
# helpers, one runner; device memory for CUDA runs (devmem.c: the CUDA
# runtime that the backend links, dlopen'ed by the soname configure found);
# safetensors files; the check macros of the GPU tests and
# benches (checks.h, whose failure action checks.c holds: it needs no CUDA);
# the model of the quantized output (quant_model.c: the tests, the audit and
# bench/shape_sweep check the library against it).
# A convenience library, never installed.
# Included by the top Makefile.am; paths are relative to the top directory.
#
# The reference is compiled with FMA contraction and fast-math off whatever
# the top flags say.

noinst_LTLIBRARIES += harness/libharness.la
harness_libharness_la_SOURCES = \
	harness/naive_ref.c harness/naive_ref.h harness/util.c harness/util.h \
	harness/case.c harness/case.h harness/devmem.c harness/devmem.h \
	harness/safetensors.c harness/safetensors.h harness/st_header.c harness/st_header.h \
	harness/st_case.c harness/st_case.h harness/text.c harness/text.h \
	harness/checks.c harness/checks.h harness/quant_model.c harness/quant_model.h
# pthread_sigmask: the safetensors writer keeps its signal handler off the
# thread that creates the temporary file (safetensors.c).
harness_libharness_la_CFLAGS = $(AM_CFLAGS) -std=c99 -ffp-contract=off -fno-fast-math \
	$(JSON_C_CFLAGS) $(PTHREAD_CFLAGS)
harness_libharness_la_LIBADD = $(JSON_C_LIBS) -lm
harness_libharness_la_LDFLAGS = $(PTHREAD_CFLAGS)

BEAM_HARNESS_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/harness
