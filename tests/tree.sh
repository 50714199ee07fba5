#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
# tree.sh - keeps the tree free of lab records: inside a git checkout of
# fabep it fails when git tracks notes/, logs or outputs (*.log, *.out),
# patches (*.patch, *.diff), devNN.sh run scripts, or a comment that cites
# notes/.  Figures belong in docs/performance.md with their command, and
# comments state the rule, not the run behind it.  Outside a git checkout
# (a release tarball, make distcheck) there is nothing to check: exit 77.
srcdir=${srcdir:-.}

command -v git >/dev/null 2>&1 || { echo "SKIP: no git"; exit 77; }
top=$(git -C "$srcdir" rev-parse --show-toplevel 2>/dev/null) || {
	echo "SKIP: $srcdir is not a git checkout"; exit 77; }
# a tarball unpacked inside some other checkout is not this tree
if [ "$(cd "$top" && pwd -P)" != "$(cd "$srcdir" && pwd -P)" ] ||
   [ ! -f "$top/include/fabep.h" ]; then
	echo "SKIP: $srcdir is not the top of a fabep checkout"
	exit 77
fi
cd "$top" || exit 1
fails=0

files=$(git ls-files | grep -E '^notes/|\.(log|out|patch|diff)$|(^|/)dev[0-9]+\.sh$')
if [ -n "$files" ]; then
	echo "FAIL: tracked lab records (move figures to docs/performance.md):"
	echo "$files" | sed 's/^/  /'
	fails=1
fi

# a comment (C, shell, Makefile, roff) that cites notes/
cites=$(git grep -nE '(/\*|^[[:space:]]*\*|//|#|\.\\").*notes/' -- \
	':!tests/tree.sh' 2>/dev/null)
if [ -n "$cites" ]; then
	echo "FAIL: comments that cite notes/ (state the rule instead):"
	echo "$cites" | sed 's/^/  /'
	fails=1
fi

[ $fails = 0 ] && echo "PASS: no lab records in the tree"
exit $fails
