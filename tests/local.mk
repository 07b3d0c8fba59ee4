# tests/local.mk - the CPU test suite and the tests of the `beammoe` tool
# (included by the top Makefile.am; paths are relative to the top directory).
#
#   make check            every test below; none needs a GPU, none skips
#   make check-valgrind   each test binary once under valgrind memcheck
#                         (errors and definite leaks fail; BEAM_TEST_QUICK=1
#                         shrinks the sweeps, valgrind is ~50x slower);
#                         logs in tests/<name>.vg.log
#   ./configure --enable-sanitizers && make check    the ASan/UBSan variant
#
# Reproduce a random run: BEAM_TEST_SEED=<seed printed by the test> make check
# (or run the binary, e.g. BEAM_TEST_SEED=123 ./tests/test_numerics).
#
# Programs:
#   test_backends      every op of every backend of lib/backends.def that runs
#                      here, through its table, against the CPU ground truth
#                      (the CPU itself against the naive reference), and the
#                      gather of every backend's in-process group (every R, T,
#                      strategy, norm and quantized form) against the naive
#                      reference
#   test_fp8           the E4M3 conversion and scales of cpu/fp8.h against a
#                      nearest-value search, every BF16 value
#   test_fp4           the NVFP4 pieces of cpu/fp4.h and the harness's model
#                      of them: hand-checked vectors, E2M1 on every FP32
#                      value, the block scale on every BF16 maximum
#   test_tp_shape      the gather's decode cluster size (gpu/tp_shape.h) from
#                      the workspace's multiprocessor count; the launch caps'
#                      index and its inverse
#   test_quant         the quantized output of normalized (beam_*_q), every
#                      backend, against the test's own model
#   test_numerics      sweep vs the naive reference (dispatcher, backend cpu)
#   test_numerics_cpu  the same program linked to libbeammoe_cpu directly
#   test_edges         hand-checked rounding vectors (libbeammoe_cpu)
#   test_golden        golden FNV-1a digests of fixed cases (libbeammoe_cpu)
#   test_threads       identical bits for 1, 2, 3 OpenMP threads
#   test_group         the CPU group's own: faults, timeouts, thread races,
#                      the gather's argument refusals (plain and _q)
#   test_contract      every rule of docs/contract.md: status, message, no write
#   test_dispatch      backend selection of libbeammoe; its first call on a
#                      16 KiB thread stack
#   test_stack         every op, plain and quantized, and the gather on 16 KiB
#                      thread stacks (OMP_STACKSIZE=16K too; 64 KiB under ASan)
#   test_oom           no memory for the scratch: out of memory, nothing
#                      written (skipped under AddressSanitizer)
#   test_symbols.sh    the libraries export the same beam_* symbols
#   test_isa.sh        golden, numerics, threads, edges and stack tests again
#                      on the AVX-512 (no BF16), AVX2 and portable kernels
#   st_fuzz            the safetensors reader, fuzzed
#   audit-quick.sh, safetensors-test.sh, exit-status.sh, output-safety.sh,
#   input-special.sh, tool-stdout.sh, tool-signals.sh, tool-json.sh
#                      the `beammoe` tool (tools/beammoe), at the end below
#   perf-report.sh     docs/PERF.md's generated tables are current (python3)

if HAVE_CUNIT

# The CUnit driver, over the harness (harness/local.mk: the cases, the
# naive reference, the helpers).
check_LTLIBRARIES = tests/libbeamtest.la
tests_libbeamtest_la_SOURCES = tests/suite.c tests/suite.h
tests_libbeamtest_la_CPPFLAGS = $(BEAM_HARNESS_CPPFLAGS)
tests_libbeamtest_la_LIBADD = harness/libharness.la

BEAM_TEST_CPPFLAGS = $(BEAM_HARNESS_CPPFLAGS) -I$(top_srcdir)/tests
BEAM_TEST_LIBS = tests/libbeamtest.la $(CUNIT_LIBS) -lm

BEAM_CPU_TESTS = tests/test_fp8 tests/test_fp4 tests/test_tp_shape tests/test_quant tests/test_backends tests/test_numerics tests/test_numerics_cpu tests/test_edges \
	tests/test_golden tests/test_threads tests/test_group tests/test_allreduce tests/test_contract \
	tests/test_dispatch tests/test_stack
# test_oom replaces malloc, which valgrind replaces too: not in the valgrind
# list (it skips itself there anyway).
check_PROGRAMS += $(BEAM_CPU_TESTS) tests/test_oom
TESTS += $(BEAM_CPU_TESTS) tests/test_oom tests/test_symbols.sh tests/test_isa.sh
EXTRA_DIST += tests/test_symbols.sh tests/test_isa.sh tests/valgrind.supp
CLEANFILES += tests/test_isa.*.out

# test_symbols.sh looks for the libraries under $top_builddir/.libs.
AM_TESTS_ENVIRONMENT = top_builddir='$(top_builddir)'; top_srcdir='$(top_srcdir)'; \
	export top_builddir top_srcdir;

# Reaches every backend through libbeammoe, which dlopens their libraries:
# build them first.
tests_test_backends_CPPFLAGS = $(BEAM_TEST_CPPFLAGS)
tests_test_backends_CFLAGS = $(AM_CFLAGS) $(PTHREAD_CFLAGS)
tests_test_backends_LDFLAGS = $(PTHREAD_CFLAGS)
tests_test_backends_LDADD = $(BEAM_TEST_LIBS) libbeammoe.la
EXTRA_tests_test_backends_DEPENDENCIES = $(BEAM_BACKEND_LIBS)

tests_test_allreduce_CPPFLAGS = $(BEAM_TEST_CPPFLAGS)
tests_test_allreduce_CFLAGS = $(AM_CFLAGS) $(PTHREAD_CFLAGS)
tests_test_allreduce_LDFLAGS = $(PTHREAD_CFLAGS)
tests_test_allreduce_LDADD = $(BEAM_TEST_LIBS) libbeammoe.la
EXTRA_tests_test_allreduce_DEPENDENCIES = $(BEAM_BACKEND_LIBS)

# The FP8 conversion of cpu/fp8.h, exhaustive over BF16 (groundwork: it
# moves behind the API with the quantized output).
tests_test_fp8_CPPFLAGS = $(BEAM_TEST_CPPFLAGS)
tests_test_fp8_LDADD = $(BEAM_TEST_LIBS)

# NVFP4's E2M1 conversion and block scale of cpu/fp4.h, against hand-checked
# vectors and the harness's model (harness/quant_model.c), exhaustive over
# FP32 (the E2M1 conversion) and BF16 (the block maxima).
tests_test_fp4_CPPFLAGS = $(BEAM_TEST_CPPFLAGS)
tests_test_fp4_CFLAGS = $(AM_CFLAGS) $(PTHREAD_CFLAGS)
tests_test_fp4_LDFLAGS = $(PTHREAD_CFLAGS)
tests_test_fp4_LDADD = $(BEAM_TEST_LIBS)

tests_test_tp_shape_CPPFLAGS = $(BEAM_TEST_CPPFLAGS) -I$(top_srcdir)/gpu
tests_test_tp_shape_LDADD = $(BEAM_TEST_LIBS)

# The quantized output of normalized, every backend, against the harness's
# model of docs/numerics.md#fp8 (harness/quant_model.c, shared with the
# gather's tests; thread-safe through pthread_once).
tests_test_quant_CPPFLAGS = $(BEAM_TEST_CPPFLAGS)
tests_test_quant_CFLAGS = $(AM_CFLAGS) $(PTHREAD_CFLAGS) $(OPENMP_CFLAGS)
tests_test_quant_LDFLAGS = $(PTHREAD_CFLAGS) $(OPENMP_CFLAGS)
tests_test_quant_LDADD = $(BEAM_TEST_LIBS) libbeammoe.la
EXTRA_tests_test_quant_DEPENDENCIES = $(BEAM_BACKEND_LIBS)

tests_test_numerics_CPPFLAGS = $(BEAM_TEST_CPPFLAGS)
tests_test_numerics_LDADD = $(BEAM_TEST_LIBS) libbeammoe.la

tests_test_numerics_cpu_SOURCES = tests/test_numerics.c
tests_test_numerics_cpu_CPPFLAGS = $(BEAM_TEST_CPPFLAGS)
tests_test_numerics_cpu_LDADD = $(BEAM_TEST_LIBS) libbeammoe_cpu.la

tests_test_edges_CPPFLAGS = $(BEAM_TEST_CPPFLAGS)
tests_test_edges_LDADD = $(BEAM_TEST_LIBS) libbeammoe_cpu.la

tests_test_golden_CPPFLAGS = $(BEAM_TEST_CPPFLAGS)
tests_test_golden_LDADD = $(BEAM_TEST_LIBS) libbeammoe_cpu.la

# omp_set_num_threads() in the test steers the library's (same) libgomp.
tests_test_threads_CPPFLAGS = $(BEAM_TEST_CPPFLAGS)
tests_test_threads_CFLAGS = $(AM_CFLAGS) $(OPENMP_CFLAGS)
tests_test_threads_LDFLAGS = $(OPENMP_CFLAGS)
tests_test_threads_LDADD = $(BEAM_TEST_LIBS) libbeammoe.la

tests_test_group_CPPFLAGS = $(BEAM_TEST_CPPFLAGS)
tests_test_group_CFLAGS = $(AM_CFLAGS) $(PTHREAD_CFLAGS)
tests_test_group_LDFLAGS = $(PTHREAD_CFLAGS)
tests_test_group_LDADD = $(BEAM_TEST_LIBS) libbeammoe.la

tests_test_contract_CPPFLAGS = $(BEAM_TEST_CPPFLAGS)
tests_test_contract_CFLAGS = $(AM_CFLAGS) $(PTHREAD_CFLAGS)
tests_test_contract_LDFLAGS = $(PTHREAD_CFLAGS)
tests_test_contract_LDADD = $(BEAM_TEST_LIBS) libbeammoe.la

# Runs itself again with OMP_STACKSIZE=16K (64K under ASan); its own threads get the same.
tests_test_stack_CPPFLAGS = $(BEAM_TEST_CPPFLAGS)
tests_test_stack_CFLAGS = $(AM_CFLAGS) $(OPENMP_CFLAGS) $(PTHREAD_CFLAGS)
tests_test_stack_LDFLAGS = $(OPENMP_CFLAGS) $(PTHREAD_CFLAGS)
tests_test_stack_LDADD = $(BEAM_TEST_LIBS) libbeammoe_cpu.la

tests_test_oom_CPPFLAGS = $(BEAM_TEST_CPPFLAGS)
tests_test_oom_CFLAGS = $(AM_CFLAGS) $(PTHREAD_CFLAGS)
tests_test_oom_LDFLAGS = $(PTHREAD_CFLAGS)
tests_test_oom_LDADD = $(BEAM_TEST_LIBS) libbeammoe_cpu.la

# Its first call on a 16 KiB thread stack runs in a pthread of its own.
tests_test_dispatch_CPPFLAGS = $(BEAM_TEST_CPPFLAGS)
tests_test_dispatch_CFLAGS = $(AM_CFLAGS) $(PTHREAD_CFLAGS)
tests_test_dispatch_LDFLAGS = $(PTHREAD_CFLAGS)
tests_test_dispatch_LDADD = $(BEAM_TEST_LIBS) libbeammoe.la

CLEANFILES += tests/*.vg.log

# Each CPU test once under valgrind; libtool runs the real binary (not the
# wrapper script) with the uninstalled libraries on the path.
BEAM_VALGRIND = valgrind --error-exitcode=1 --leak-check=full \
	--errors-for-leak-kinds=definite --track-origins=yes --keep-debuginfo=yes \
	--suppressions=$(top_srcdir)/tests/valgrind.supp
check-valgrind: $(check_LTLIBRARIES) $(check_PROGRAMS) $(lib_LTLIBRARIES)
	@fail=0; for t in $(BEAM_CPU_TESTS); do \
	  echo "valgrind $$t"; \
	  BEAM_TEST_QUICK=1 $(LIBTOOL) --mode=execute $(BEAM_VALGRIND) ./$$t \
	    >$$t.vg.log 2>&1 || { echo "FAIL: $$t (see $$t.vg.log)"; fail=1; }; \
	done; test $$fail = 0

else

check-valgrind:
	@echo "CUnit was not found at configure time: no tests to run" >&2; exit 1

endif

# A bounded, seeded mutation fuzz of the safetensors reader (a few seconds;
# BEAM_TEST_SEED=<printed seed> replays it, BEAM_FUZZ_SECONDS and
# BEAM_FUZZ_ITERS bound it), and round trips through the writer. It matters
# most in the --enable-sanitizers tree. Exit 77 without json-c.
check_PROGRAMS += tests/st_fuzz
TESTS += tests/st_fuzz
tests_st_fuzz_CPPFLAGS = $(BEAM_HARNESS_CPPFLAGS)
tests_st_fuzz_LDADD = harness/libharness.la

# (no .PHONY line here: automake refuses .PHONY in two conditions, and
# tests/gather.mk declares its own inside BEAM_WITH_CUDA)

# ---- the `beammoe` tool (tools/local.mk) ------------------------------------
# Shell scripts run from the top build directory, where they find
# tools/beammoe (as they do in a VPATH build and in `make distcheck`):
#   audit-quick.sh       the quick audit (every backend and strategy against
#                        the CPU, the CPU against the naive reference)
#   safetensors-test.sh  good files (python3's struct/json, `run --output`)
#                        audit clean, malformed ones are exit 2 with a message
#   exit-status.sh       the exit-status rule of every command (beammoe --help)
#   output-safety.sh     `run --output` never destroys what the path names
#   input-special.sh     `audit --input` refuses a FIFO or a device at once
#   tool-stdout.sh       a report that cannot be written is exit 1, a message
#   tool-signals.sh      a signal during `run --output F` leaves F as it was
#                        and no temporary file; the exit status is the signal's
#   tool-json.sh         the --json documents of run, audit and bench; the
#                        timing spread; bench's rows and progress as it runs
#   perf-report.sh       docs/PERF.md's and README.md's tables and docs/perf/'s
#                        plots match docs/perf/*.json (scripts/perf-report.py)
# (safetensors-test.sh and tool-signals.sh exit 77 without json-c,
# perf-report.sh and tool-json.sh without python3)
BEAM_TOOL_TESTS = tests/audit-quick.sh tests/safetensors-test.sh tests/exit-status.sh \
	tests/output-safety.sh tests/input-special.sh tests/tool-stdout.sh tests/tool-signals.sh \
	tests/tool-json.sh tests/perf-report.sh
TESTS += $(BEAM_TOOL_TESTS)
EXTRA_DIST += $(BEAM_TOOL_TESTS) tests/tool-lib.sh scripts/perf-report.py
