# tools/local.mk - the `beammoe` command-line tool (audit, run, bench).
# Included by the top Makefile.am; paths are relative to the top directory.

# The command line over the harness (harness/local.mk: cases, the naive
# reference, the runner, device memory, safetensors files).
bin_PROGRAMS += tools/beammoe
tools_beammoe_SOURCES = \
	tools/beammoe.c tools/audit.c tools/gather.c tools/run.c tools/bench.c tools/cli.c tools/streams.c \
	tools/common.h tools/gather.h tools/omp_shim.h
tools_beammoe_CPPFLAGS = $(BEAM_HARNESS_CPPFLAGS)
# OpenMP: `bench` times memcpy with the same threads as the library, and
# `audit` sets the thread count of the library's (shared) OpenMP runtime.
tools_beammoe_CFLAGS = $(AM_CFLAGS) $(OPENMP_CFLAGS) $(PTHREAD_CFLAGS)
tools_beammoe_LDFLAGS = $(OPENMP_CFLAGS) $(PTHREAD_CFLAGS)
# The dispatcher: the tool reaches every backend this host can load.
tools_beammoe_LDADD = harness/libharness.la libbeammoe.la
# safetensors (audit --input, run --output): json-c parses the header; empty
# JSON_C_* (configure without json-c, m4/beam_json.m4) builds a tool whose
# two options say how to get it.

# `make check` runs the quick audit (every backend and strategy against the
# CPU ground truth, the CPU backend against the naive reference).
TESTS += tools/audit-quick.sh
EXTRA_DIST += tools/audit-quick.sh

# safetensors input/output: good files (written by python3's struct/json and
# by `run --output`) audit clean; malformed ones are exit 2 with a message.
# Exit 77 (skip) when the tool was built without json-c.
TESTS += tools/safetensors-test.sh
EXTRA_DIST += tools/safetensors-test.sh

# The exit-status rule of every command (beammoe --help): bad options,
# values that are not exactly numbers, sizes and values the library rejects,
# a backend that is not available: exit 2 with a message, never a crash.
TESTS += tools/exit-status.sh
EXTRA_DIST += tools/exit-status.sh

# `run --output` never destroys what the path names (a directory, a device,
# a FIFO, a read-only file, a file whose write fails half way), `audit
# --input` refuses a FIFO or a device at once. Both under `timeout`.
TESTS += tools/output-safety.sh tools/input-special.sh
EXTRA_DIST += tools/output-safety.sh tools/input-special.sh
