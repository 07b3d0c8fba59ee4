#!/bin/sh
# run-pytest.sh - the Python package's pytest suite as one `make check` test.
#
# Runs `python -m pytest -q python/tests` against this build tree's
# libbeammoe (.libs/libbeammoe.so, the dispatcher) and the package from the
# source tree. Which python: $PYTHON if set, else /usr/bin/python3 when it can
# import torch (Debian's python3-torch), else python3 from PATH. Exits 77
# (skipped) when that python cannot import torch or pytest. The CUDA tests
# skip themselves without a GPU; extra pytest arguments pass through.

srcdir=${srcdir:-$(dirname "$0")/..}
builddir=${abs_top_builddir:-$(pwd)}

if [ -n "$PYTHON" ]; then
    py=$PYTHON
elif /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then
    py=/usr/bin/python3
else
    py=python3
fi

if ! "$py" -c 'import torch, pytest' >/dev/null 2>&1; then
    echo "run-pytest.sh: $py cannot import torch and pytest; skipping" \
         "(Debian: apt-get install python3-torch python3-pytest)"
    exit 77
fi

lib=$builddir/.libs/libbeammoe.so
if [ ! -e "$lib" ]; then
    echo "run-pytest.sh: $lib not found (build the libraries first)" >&2
    exit 99
fi

# A sanitizer build (configure --enable-sanitizers) cannot be loaded into an
# uninstrumented python: ASan must come first in the process.
for so in "$lib" "$builddir/.libs/libbeammoe_cpu.so"; do
    if [ -e "$so" ] && ldd "$so" 2>/dev/null | grep -q 'libasan'; then
        echo "run-pytest.sh: $so is built with AddressSanitizer; python cannot load it; skipping"
        exit 77
    fi
done

# Nothing written into the source tree (distcheck makes it read-only).
PYTHONPATH=$srcdir/python${PYTHONPATH:+:$PYTHONPATH}
BEAMMOE_LIBRARY=$lib
PYTHONDONTWRITEBYTECODE=1
NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export PYTHONPATH BEAMMOE_LIBRARY PYTHONDONTWRITEBYTECODE NCCL_NVLS_ENABLE

echo "run-pytest.sh: $py, BEAMMOE_LIBRARY=$lib"
exec "$py" -m pytest -q -rs -p no:cacheprovider "$srcdir/python/tests" "$@"
