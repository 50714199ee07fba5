#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
# make check's entry for the Python package: pytest on python/tests
# against the library of the build tree.  Exits 77 (skipped) when the
# interpreter lacks numpy, torch or pytest.
srcdir=${FABEP_PY_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
builddir=${FABEP_PY_BUILDDIR:-$srcdir}
py=${PYTHON:-/usr/bin/python3}
if ! "$py" -c 'import numpy, torch, pytest' 2>/dev/null; then
	echo "python/tests: $py lacks numpy, torch or pytest; skipped"
	exit 77
fi
# A library built with a sanitizer loads only into a program that starts
# with its runtime, which the interpreter does not: the C tests cover it.
if [ -n "${FABEP_PY_SANITIZERS:-}" ]; then
	echo "python/tests: libfabep is built with $FABEP_PY_SANITIZERS; skipped"
	exit 77
fi
FABEP_LIBRARY=$builddir/src/.libs/libfabep.so
export FABEP_LIBRARY
# torch's intra-op threads would compete with the ranks for the cores
OMP_NUM_THREADS=1
export OMP_NUM_THREADS
# no bytecode written into the source tree (read-only in distcheck)
PYTHONDONTWRITEBYTECODE=1
export PYTHONDONTWRITEBYTECODE
exec "$py" -m pytest -q -p no:cacheprovider "$srcdir/python/tests" "$@"
