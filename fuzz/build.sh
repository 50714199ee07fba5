#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
# Build the libFuzzer targets (fuzz/fuzz_*.c) with clang, straight from the
# sources: no configure, and nothing of the automake build is touched.
#
#   fuzz/build.sh [OUTDIR]      (default: _fuzz in the current directory)
#
# The library's sources are compiled with coverage instrumentation,
# AddressSanitizer and UndefinedBehaviorSanitizer into
# OUTDIR/libfabep_fuzz.a; each target includes the one .c file it tests
# (to reach its static parsers) and takes the rest from that archive.
# Needs clang with libFuzzer (Debian: clang libclang-rt-14-dev),
# pkg-config, libfabric-dev and libnuma-dev.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-_fuzz}
mkdir -p "$out/obj"
out=$(cd "$out" && pwd)
# Objects are reused by date: only for the same source tree.
if [ "$(cat "$out/obj/.top" 2>/dev/null)" != "$top" ]; then
	rm -f "$out"/obj/*.o
	echo "$top" > "$out/obj/.top"
fi
CC=${CC:-clang}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}

cflags=(-std=gnu11 -g -O1 -fno-omit-frame-pointer
	-fsanitize=address,undefined -fno-sanitize-recover=undefined
	-Wall -Wno-unused-parameter -Wno-unused-function
	-I"$out" -I"$top/include" -I"$top/src" -I"$top"
	$(pkg-config --cflags libfabric) ${CFLAGS:-})
libs=($(pkg-config --libs libfabric) -lnuma -lm -lpthread)

# config.h: the little of configure's output that the sources use.
version=$(sed -n 's/^AC_INIT(\[fabep\], \[\([^]]*\)\].*/\1/p' "$top/configure.ac")
printf '#define PACKAGE_VERSION "%s"\n#ifndef _GNU_SOURCE\n# define _GNU_SOURCE 1\n#endif\n' \
	"${version:-0}" > "$out/config.h.new"
if cmp -s "$out/config.h.new" "$out/config.h"; then
	rm -f "$out/config.h.new"
else
	mv "$out/config.h.new" "$out/config.h"
fi

pids=()
# Run "$@" in the background, at most $jobs at a time.
spawn() {
	while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
		wait -n || true
	done
	"$@" &
	pids+=($!)
}
# Wait for everything spawned; fail if anything failed.
reap() {
	local p fail=0
	for p in "${pids[@]}"; do
		wait "$p" || fail=1
	done
	pids=()
	[ "$fail" = 0 ] || { echo "fuzz/build.sh: build failed" >&2; exit 1; }
}

# The library: each object rebuilt when its source or any header is newer.
newest_hdr=$(ls -t "$top"/include/*.h "$top"/src/*/*.h "$out/config.h" | head -n 1)
objs=()
for s in "$top"/src/*/*.c; do
	rel=${s#"$top"/}
	o="$out/obj/$(echo "${rel%.c}" | tr / _).o"
	objs+=("$o")
	if [ ! -f "$o" ] || [ "$s" -nt "$o" ] || [ "$newest_hdr" -nt "$o" ]; then
		echo "  CC       $rel"
		spawn "$CC" "${cflags[@]}" -fsanitize=fuzzer-no-link -c "$s" -o "$o"
	fi
done
reap
rm -f "$out/libfabep_fuzz.a"
ar rcs "$out/libfabep_fuzz.a" "${objs[@]}"

# The targets.
for f in "$top"/fuzz/fuzz_*.c; do
	name=$(basename "$f" .c)
	echo "  CCLD     fuzz/$name"
	spawn "$CC" "${cflags[@]}" -fsanitize=fuzzer "$f" "$out/libfabep_fuzz.a" \
		"${libs[@]}" -o "$out/$name"
done
reap
echo "fuzz/build.sh: targets in $out"
