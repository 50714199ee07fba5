#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
# shm_room.sh - a /dev/shm too small for libfabric's shm, as a
# container's is by default.  In a private mount namespace whose
# /dev/shm is a tmpfs of 16 MiB per online CPU less 1 MiB (libfabric
# 1.17's shm then offers no endpoint):
#   1. fabep_info -p shm fails, and its warning gives /dev/shm's room;
#   2. fabep_bench -p shm fails on every rank, naming that room;
#   3. fabep_demo (fabep's choice of provider) runs on tcp, every result
#      correct, with a warning that says why shm was not taken;
# then with exactly 16 MiB per CPU, shm is offered and nothing is said:
# the threshold is libfabric's own, so this case fails where a libfabric
# moves it.  Then two ranks of this host started by hand, each with a
# /dev/shm of its own (two containers without --ipc=host), where shm
# cannot join them:
#   4. fabep's choice takes a network provider, every result correct,
#      and rank 0 says why, naming rank 1;
#   5. shm asked for fails on both ranks at once, each naming the other,
#      where it used to wait out the timeout;
# and the same with one /dev/shm but a PID namespace each (containers
# with --ipc=host alone), where libfabric's shm crashed the process.
# The namespaces and their mounts end with each command.  Needs root and
# unshare(1); exit 77 with the reason otherwise.  Runs from the build
# directory.
top_builddir=${top_builddir:-.}
bin=$(cd "$top_builddir" && pwd)/utils
tmp=${TMPDIR:-/tmp}/fabep-shmroom.$$

skip() {
	echo "SKIP: $*"
	exit 77
}

fail() {
	echo "FAIL: $*"
	for f in "$tmp".out "$tmp".err; do
		[ -s "$f" ] && { echo "--- $f"; cat "$f"; }
	done
	rm -f "$tmp".*
	exit 1
}

# small MIB CMD...: CMD, its output in $tmp.out and $tmp.err, with a
# /dev/shm of MIB MiB of its own; its status in $st (99: no tmpfs)
small() {
	_mib=$1
	shift
	unshare -m sh -c 'mount -t tmpfs -o size="$0"m tmpfs /dev/shm || exit 99
exec "$@"' "$_mib" $to "$@" >"$tmp.out" 2>"$tmp.err"
	st=$?
}

for t in fabep_info fabep_bench fabep_demo; do
	[ -x "$bin/$t" ] || { echo "FAIL: $bin/$t is not built"; exit 1; }
done
[ "$(id -u)" = 0 ] || skip "needs root to mount a tmpfs (uid $(id -u))"
command -v unshare >/dev/null 2>&1 || skip "no unshare(1) command"
to=
command -v timeout >/dev/null 2>&1 && to="timeout -s KILL 120"
[ -n "$to" ] || skip "no timeout(1) command"
cpus=$(getconf _NPROCESSORS_ONLN 2>/dev/null)
[ -n "$cpus" ] && [ "$cpus" -ge 1 ] || skip "getconf _NPROCESSORS_ONLN failed"
need=$((cpus * 16))
trap 'rm -f "$tmp".*' EXIT

small 1 true
[ $st = 0 ] || skip "cannot mount a tmpfs in a mount namespace: $(cat "$tmp.err")"
"$bin/fabep_info" -p shm -m >"$tmp.out" 2>"$tmp.err" ||
	skip "libfabric offers no shm endpoint here even with room"

room="/dev/shm has $((need - 1)) MiB free"
small $((need - 1)) "$bin/fabep_info" -p shm
[ $st = 1 ] || fail "fabep_info -p shm with $((need - 1)) MiB: status $st, not 1"
grep -q "shm is not offered: $room.*$cpus CPUs: $need MiB" "$tmp.err" ||
	fail "fabep_info -p shm did not say why shm is not offered"
echo "fabep_info -p shm: fails, naming /dev/shm's room"

small $((need - 1)) "$bin/fabep_bench" -p shm -o moe -n 2 -t 1 -I 2 -w 1 --no-ref
[ $st != 0 ] || fail "fabep_bench -p shm ran without room for shm"
for r in 0 1; do
	grep -q "^fabep\[$r:.*provider \"shm\" offers no RMA endpoint here: $room" \
		"$tmp.err" || fail "rank $r of fabep_bench -p shm did not say why"
done
echo "fabep_bench -p shm: fails on every rank, naming /dev/shm's room"

small $((need - 1)) "$bin/fabep_demo" -n 2 -I 3
[ $st = 0 ] || fail "fabep_demo without room for shm: status $st"
grep -q "^# fabep_demo: 2 ranks .*tcp" "$tmp.out" ||
	fail "fabep_demo did not take tcp"
grep -q "^result: correct" "$tmp.out" || fail "fabep_demo's results"
grep -q "warning: shm is not offered: $room.*tcp.* is taken instead" "$tmp.err" ||
	fail "fabep_demo did not say why it took tcp"
[ "$(grep -c "shm is not offered" "$tmp.err")" = 1 ] ||
	fail "the warning came more than once"
echo "fabep_demo: runs on tcp, correct, saying why once"

small $need "$bin/fabep_info" -p shm -m
[ $st = 0 ] || fail "fabep_info -p shm with $need MiB: status $st"
grep -q "^provider: shm " "$tmp.out" || fail "shm not offered with $need MiB"
! grep -q "not offered" "$tmp.err" || fail "a warning with room for shm"
echo "fabep_info -p shm: offered with $need MiB ($cpus CPUs), no warning"

# apart HOW ARGS...: two ranks of fabep_bench -o moe, each with a
# /dev/shm of its own (HOW shm) or in a PID namespace of its own (pid),
# FABEP_ROOT on a port of this run; rank r's output in $tmp.r<r>, their
# statuses in $st0 and $st1
apart() {
	_how=$1
	shift
	_port=$((20000 + $$ % 20000))
	for _r in 0 1; do
		export FABEP_RANK=$_r FABEP_WORLD_SIZE=2 FABEP_TIMEOUT_MS=20000 \
			FABEP_ROOT=127.0.0.1:$_port
		if [ "$_how" = shm ]; then
			unshare -m sh -c 'mount -t tmpfs -o size=1g tmpfs /dev/shm || exit 99
exec "$@"' sh $to "$bin/fabep_bench" "$@" -o moe -t 8 -I 3 -w 1 \
				--no-ref --check -m >"$tmp.r$_r" 2>&1 &
		else
			unshare -p -f --mount-proc $to "$bin/fabep_bench" "$@" -o moe \
				-t 8 -I 3 -w 1 --no-ref --check -m >"$tmp.r$_r" 2>&1 &
		fi
		eval _pid$_r=$!
	done
	unset FABEP_RANK FABEP_WORLD_SIZE FABEP_TIMEOUT_MS FABEP_ROOT
	wait $_pid0
	st0=$?
	wait $_pid1
	st1=$?
}

# apart_both HOW WHY WHAT: the two cases of apart HOW, whose ranks are
# apart as fabep says WHY, described as WHAT
apart_both() {
	apart "$1"
	[ $st0 = 0 ] && [ $st1 = 0 ] ||
		fail "two ranks $3: status $st0, $st1 ($(cat "$tmp.r0" "$tmp.r1"))"
	grep -q "check: ok" "$tmp.r0" || fail "their results: $(cat "$tmp.r0")"
	grep -q "provider: shm" "$tmp.r0" && fail "they took shm: $(cat "$tmp.r0")"
	grep -q "warning: rank 1 shares this host but $2" "$tmp.r0" ||
		fail "rank 0 did not say why shm was not taken: $(cat "$tmp.r0")"
	echo "two ranks $3: a network provider, correct, rank 0 says why"

	apart "$1" -p shm
	[ $st0 = 1 ] && [ $st1 = 1 ] ||
		fail "-p shm, $3: status $st0, $st1, not 1 ($(cat "$tmp.r0" "$tmp.r1"))"
	grep -q "provider \"shm\": rank 1 shares this host but $2" "$tmp.r0" &&
		grep -q "provider \"shm\": rank 0 shares this host but $2" "$tmp.r1" ||
		fail "-p shm did not say why on each rank: $(cat "$tmp.r0" "$tmp.r1")"
	echo "-p shm, $3: fails on both ranks, each naming the other"
}

apart_both shm "sees another /dev/shm" "each with its own /dev/shm"
unshare -p -f --mount-proc true 2>"$tmp.err" ||
	skip "cannot make a PID namespace: $(cat "$tmp.err")"
apart_both pid "is in another PID namespace" "each in its own PID namespace"
echo "shm_room: a /dev/shm too small, or ranks beyond shm's reach, are named, and tcp taken"
