#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
# soak.sh - a short soak: fabep_bench --soak runs dispatch + combine +
# allreduce with fresh random routing every round on 2 forked ranks,
# checking every result; its -m line must report errors 0 and a resident
# memory growth within the bound.  Runs from the build directory; exit 77
# = skip (no shm provider).  SOAK_SECONDS overrides the 10 s.
top_builddir=${top_builddir:-.}
bench=$top_builddir/utils/fabep_bench
secs=${SOAK_SECONDS:-10}
tmp=${TMPDIR:-/tmp}/fabep-soak.$$
trap 'rm -f "$tmp".*' EXIT

if [ ! -x "$bench" ]; then
	echo "FAIL: $bench not built"
	exit 1
fi
if ! "$top_builddir/utils/fabep_info" -p shm >/dev/null 2>&1; then
	echo "SKIP: no shm provider"
	exit 77
fi
to=
command -v timeout >/dev/null 2>&1 && to="timeout $((secs + 60))"

FABEP_PROVIDER=${FABEP_PROVIDER:-shm} $to "$bench" --soak "$secs" -n 2 -m \
	>"$tmp.out" 2>"$tmp.err"
rc=$?
cat "$tmp.out"
line=$(grep '^op: soak ' "$tmp.out" | tail -1)
fails=0
fail() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}
[ "$rc" -eq 0 ] || fail "fabep_bench --soak $secs exited $rc"
if [ -z "$line" ]; then
	fail "no 'op: soak' line in the output"
else
	val() { echo "$line" | sed -n "s/.* $1: \([^ ]*\).*/\1/p"; }
	rounds=$(val rounds)
	errors=$(val errors)
	growth=$(val rss_growth_kb)
	bound=$(val growth_bound_kb)
	result=$(val result)
	[ "$errors" = 0 ] || fail "errors: $errors"
	[ -n "$rounds" ] && [ "$rounds" -gt 0 ] || fail "rounds: $rounds"
	[ -n "$growth" ] && [ -n "$bound" ] && [ "$growth" -le "$bound" ] ||
		fail "memory grew by $growth kB (bound $bound kB)"
	[ "$result" = ok ] || fail "result: $result"
	echo "soak: $rounds rounds in $secs s, $errors errors, largest memory growth $growth kB (bound $bound kB)"
fi
if [ "$fails" -ne 0 ]; then
	sed 's/^/    /' "$tmp.err" | tail -30
	exit 1
fi
exit 0
