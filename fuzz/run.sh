#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
# Build the fuzz targets and run each for a bounded time; fail on a crash.
#
#   fuzz/run.sh [SECONDS] [TARGET...]   (default 60 s each, every fuzz_*.c)
#
# Each target starts from its seed corpus fuzz/corpus/<target>/ (seeds and
# the reproducers of crashes found before) and keeps what it finds in
# $FUZZ_OUT/corpus/<target>/ (default _fuzz/ in the current directory).  A
# crash leaves its input as $FUZZ_OUT/crash-<target>-*: to keep it as a
# regression test, fix the bug and copy the input into fuzz/corpus/<target>/
# as crash-<what>; tests/test_fuzz_regress replays every file there in
# `make check`.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-60}
shift || true
out=${FUZZ_OUT:-_fuzz}

"$top/fuzz/build.sh" "$out"
out=$(cd "$out" && pwd)

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
	for f in "$top"/fuzz/fuzz_*.c; do
		targets+=("$(basename "$f" .c)")
	done
fi

# libinfinipath (loaded by libfabric's psm provider) turns SIGABRT and
# SIGSEGV into exit() with its own backtrace unless told not to; the
# fuzzer must see the signal.
export IPATH_NO_BACKTRACE=1
# A leak in one input is a finding like any other.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}

fail=0
summary=""
for t in "${targets[@]}"; do
	mkdir -p "$out/corpus/$t"
	log="$out/$t.log"
	echo "=== fuzz $t for $secs s"
	rc=0
	"$out/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
		-max_len=8192 -print_final_stats=1 \
		-artifact_prefix="$out/crash-$t-" \
		"$out/corpus/$t" "$top/fuzz/corpus/$t" > "$log" 2>&1 || rc=$?
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
	rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
	cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)
	line=$(printf '%-18s %10s execs %7s/s  cov %5s  ' "$t" "${execs:-?}" \
		"${rate:-?}" "${cov:-?}")
	if [ "$rc" -ne 0 ]; then
		fail=1
		line="$line FAILED (exit $rc)"
		grep -E -A30 'ERROR:|runtime error|invariant failed' "$log" | head -n 60
		ls "$out"/crash-"$t"-* "$out"/leak-"$t"-* "$out"/timeout-"$t"-* 2>/dev/null || true
	else
		line="$line ok"
	fi
	summary="$summary$line"$'\n'
done
echo "=== fuzz summary"
printf '%s' "$summary"
exit $fail
