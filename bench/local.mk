# bench/local.mk - the CPU benchmark lives in the tool: `tools/beammoe bench`
# (see tools/bench.c and docs/PERF.md). `make bench-cpu` builds and runs it.
# (No .PHONY here: automake -Werror rejects .PHONY declared both inside and
# outside an Automake conditional, and no file named bench-cpu ever exists.)
bench-cpu: tools/beammoe$(EXEEXT)
	$(builddir)/tools/beammoe bench
# What bench/*.py share (python/local.mk distributes the scripts themselves).
EXTRA_DIST += bench/_bench.py
