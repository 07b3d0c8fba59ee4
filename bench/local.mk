# bench/local.mk - the CPU benchmark lives in the tool: `tools/beammoe bench`
# (see tools/bench.c and docs/PERF.md). `make bench-cpu` builds and runs it.
.PHONY: bench-cpu
bench-cpu: tools/beammoe$(EXEEXT)
	$(builddir)/tools/beammoe bench
