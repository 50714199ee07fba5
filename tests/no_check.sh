#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
# make check's stand-in for the C test suites where configure built none
# (no Check found, or --disable-tests): they did not run, so they are
# reported as skipped (77), never as passed.
echo "the C test suites (test_bootstrap, test_kernels, test_signal, test_ep,"
echo "test_coll, test_faults, test_inject, the fuzz replays) were not built:"
echo "configure found no Check (Debian: apt-get install check) or was given"
echo "--disable-tests; run configure again to build them"
exit 77
