# tools/local.mk - the `beammoe` command-line tool (audit, run, bench).
# Included by the top Makefile.am; paths are relative to the top directory.
# Its tests (tests/*.sh that run tools/beammoe) are in tests/local.mk.

# The command line over the harness (harness/local.mk: cases, the naive
# reference, the runner, device memory, safetensors files).
bin_PROGRAMS += tools/beammoe
tools_beammoe_SOURCES = \
	tools/beammoe.c tools/audit.c tools/audit_cmd.c tools/audit_fp8.c tools/audit_input.c tools/audit_rows.c tools/gather.c \
	tools/run.c tools/bench.c tools/bench_host.c tools/cli.c tools/json_out.c tools/streams.c \
	tools/audit.h tools/audit_fp8.h tools/audit_rows.h tools/bench_host.h tools/common.h tools/gather.h tools/json_out.h \
	tools/omp_shim.h
tools_beammoe_CPPFLAGS = $(BEAM_HARNESS_CPPFLAGS)
# OpenMP: `bench` times memcpy with the same threads as the library, and
# `audit` sets the thread count of the library's (shared) OpenMP runtime.
tools_beammoe_CFLAGS = $(AM_CFLAGS) $(OPENMP_CFLAGS) $(PTHREAD_CFLAGS)
tools_beammoe_LDFLAGS = $(OPENMP_CFLAGS) $(PTHREAD_CFLAGS) $(BEAM_ORIGIN)
# The dispatcher: the tool reaches every backend this host can load.
tools_beammoe_LDADD = harness/libharness.la libbeammoe.la
# safetensors (audit --input, run --output): json-c writes the header (the
# harness reads it with a parser of its own); empty JSON_C_* (configure
# without json-c, m4/beam_json.m4) builds a tool whose two options say how
# to get it.
