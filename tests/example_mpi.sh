#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
# example_mpi.sh - examples/moe_mpi under mpirun at 1, 2 and 4 ranks (more
# ranks than cores allowed): each run must print "result: correct" and
# exit 0.
# Skipped (77) where configure found no MPI (the example is not built).
top_builddir=${top_builddir:-.}
ex=$top_builddir/examples/moe_mpi
tmp=${TMPDIR:-/tmp}/fabep-example.$$
trap 'rm -f "$tmp".*' EXIT

if [ ! -x "$ex" ] || [ -z "$MPIRUN" ] || [ ! -x "$MPIRUN" ]; then
	echo "SKIP: no MPI (configure found no mpicc and mpirun)"
	exit 77
fi
# Open MPI refuses root without being told; its own allocations left at
# exit are not fabep's leaks.
root=
[ "$(id -u)" -eq 0 ] && root=--allow-run-as-root
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
to=
command -v timeout >/dev/null 2>&1 && to="timeout 120"
fails=0

run() {  # ranks, then extra environment for the ranks
	n=$1
	shift
	$to env "$@" "$MPIRUN" $root --oversubscribe --bind-to none -n "$n" \
		"$ex" >"$tmp.out" 2>"$tmp.err"
}

for n in 1 2 4; do
	if run "$n" FABEP_PROVIDER=shm && grep -q '^result: correct$' "$tmp.out"; then
		echo "PASS: $n ranks: $(head -1 "$tmp.out")"
	else
		echo "FAIL: moe_mpi at $n ranks"
		sed 's/^/    /' "$tmp.out" "$tmp.err" | head -30
		fails=$((fails + 1))
	fi
done
exit $fails
