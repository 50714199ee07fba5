#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
# kernels_avx2.sh - test_kernels at the avx2 level only, so that `make check`
# reports it as SKIP (exit 77) on a CPU without avx2 rather than passing
# without running it; FABEP_ISA makes the library's own choice that level
# too, so that the threaded wrappers run it.  Runs from the build
# directory.
FABEP_TEST_ISA=avx2 FABEP_ISA=avx2 exec "${top_builddir:-.}/tests/test_kernels"
