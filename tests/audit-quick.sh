#!/bin/sh
# Quick audit for `make check`: exit status 0 all match, 1 a mismatch.
exec "${builddir:-.}/tools/beammoe" audit --quick
