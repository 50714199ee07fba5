#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
# tools.sh - the command-line tools: fabep_info, fabep_pingpong on shm with
# -m output and as server and client, fabep_bench, fabep_demo, and bad command lines (exit 2).  Runs from the build
# directory; exit 77 = skip (no shm provider).
top_builddir=${top_builddir:-.}
info=$top_builddir/utils/fabep_info
pp=$top_builddir/utils/fabep_pingpong
bench=$top_builddir/utils/fabep_bench
demo=$top_builddir/utils/fabep_demo
tmp=${TMPDIR:-/tmp}/fabep-tools.$$
. "$(dirname "$0")/lib.sh"
fails=0
wsrv=  # the server of no timeout below, ended with the script
trap 'rm -f "$tmp".*; [ -z "$wsrv" ] || kill $wsrv 2>/dev/null' EXIT

for t in "$info" "$pp" "$bench" "$demo"; do
	if [ ! -x "$t" ]; then
		echo "FAIL: $t not built"
		exit 1
	fi
done
to=
command -v timeout >/dev/null 2>&1 && to="timeout 120"
# A rank's wait for a peer gets 90 s, not the library's 30, where a case
# sets none: a peer's work between two waits (the bench's cold-cache
# reference writes 64 MiB or more each round) takes that long under a
# sanitizer on a loaded 2-core machine.  Still within the 120 s above,
# so that a stuck rank is named by the library.
FABEP_TIMEOUT_MS=${FABEP_TIMEOUT_MS:-90000}
export FABEP_TIMEOUT_MS

fail() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}

# Exit status of a command ($1 = expected, rest = command), output kept.
expect() {
	want=$1
	shift
	$to "$@" >"$tmp.out" 2>"$tmp.err"
	got=$?
	if [ "$got" -ne "$want" ]; then
		fail "exit $got, want $want: $*"
		sed 's/^/    /' "$tmp.out" "$tmp.err" | head -20
		return 1
	fi
	return 0
}

# --- help and bad command lines ---
for t in "$info" "$pp" "$bench" "$demo"; do
	expect 0 "$t" --help && grep -q '^Usage: ' "$tmp.out" ||
		fail "$t --help prints no usage"
	expect 0 "$t" -V && grep -q "^${t##*/}: [0-9]" "$tmp.out" &&
		grep -q '^libfabric: [0-9]' "$tmp.out" ||
		fail "$t -V prints no versions"
	expect 2 "$t" -Z && grep -q 'unknown option' "$tmp.err" ||
		fail "$t -Z: no 'unknown option' message"
done
expect 2 "$pp" -I abc
expect 2 "$pp" -I 0
expect 2 "$pp" -S 0
expect 2 "$pp" -S 64,,4k
expect 2 "$pp" -S 12q
expect 2 "$pp" -o write,
expect 2 "$pp" -o ,write
expect 2 "$pp" -o write,,signal
expect 2 "$pp" -o bogus && grep -q "unknown operation 'bogus'" "$tmp.err" ||
	fail "-o bogus: no message naming it"
expect 2 "$pp" -n 3
expect 2 "$pp" -s somehost
expect 2 "$pp" -w
expect 2 "$pp" host1 host2
expect 2 "$info" extra
expect 2 "$bench" -o nope
expect 2 "$bench" -f int4
expect 2 "$bench" -o allreduce -f fp8pre && grep -q 'fp8pre is for' "$tmp.err" ||
	fail "-o allreduce -f fp8pre: no message"
expect 2 "$bench" --soak -1
expect 2 "$bench" -o dispatch -k 33 && grep -q -- '-k (--topk)' "$tmp.err" ||
	fail "fabep_bench -k 33: no message naming -k"
expect 2 "$demo" -n 65 && grep -q 'expected an integer from 1 to 64$' "$tmp.err" ||
	fail "fabep_demo -n 65: no message"
expect 2 "$demo" -k 33
expect 2 "$demo" -n 2 -e 2 && grep -q -- '-k 4 is more than the 2 experts' "$tmp.err" ||
	fail "fabep_demo: -k above the experts not refused"
expect 2 "$demo" -n 1 -k 32 -e 1
expect 2 "$demo" -t 0 && ! grep -q 'a list' "$tmp.err" ||
	fail "fabep_demo -t 0: offers a list it does not take"
expect 2 "$demo" extra
# a long option with a value it does not take, or shortened to a prefix
# of several: named as such, not as an unknown short option
expect 2 "$info" --machine=1 &&
	grep -q 'option --machine takes no argument' "$tmp.err" ||
	fail "fabep_info --machine=1: no message naming --machine"
for opt in --help=x --version=1 --check=1; do
	expect 2 "$bench" $opt &&
		grep -q "option ${opt%%=*} takes no argument" "$tmp.err" ||
		fail "fabep_bench $opt: no message naming ${opt%%=*}"
done
expect 2 "$bench" --r 5 && grep -q 'option --r is ambiguous' "$tmp.err" ||
	fail "fabep_bench --r 5: not called ambiguous"
expect 2 "$bench" --soak 700000 && grep -q '604800 (7 days)' "$tmp.err" ||
	fail "fabep_bench --soak 700000: the limit not named"
# soak's default experts (4 per rank) bound a -k given: refused, not
# run with fewer experts per token than asked
expect 2 "$bench" --soak 1 -p shm -k 10 &&
	grep -q -- "-k 10 is more than the -e 8 experts (soak's default" "$tmp.err" ||
	fail "fabep_bench --soak 1 -k 10: not refused"
# environment switches: a spelling other than the documented ones is
# refused, not taken for on (zero copy) or for binding (FABEP_BIND)
expect 2 env FABEP_BENCH_ZERO_COPY=no "$bench" -o dispatch -n 2 -p shm -I 1 &&
	grep -q 'FABEP_BENCH_ZERO_COPY=no: expected 1 (on) or 0 (off)' "$tmp.err" ||
	fail "FABEP_BENCH_ZERO_COPY=no: not refused"
expect 2 env FABEP_BIND=off "$pp" -p shm &&
	grep -q 'FABEP_BIND=off: the one value taken is none' "$tmp.err" ||
	fail "FABEP_BIND=off: not refused"
# the kernels' bad command lines: message and usage, no second line
for args in "-K nosuch -B 1M" "-B 1k"; do
	# shellcheck disable=SC2086
	expect 2 "$bench" $args && grep -q '^Usage: ' "$tmp.err" &&
		! grep -q 'Invalid argument' "$tmp.err" ||
		fail "fabep_bench $args: not told as a bad command line"
done
expect 2 "$bench" -o allreduce -p shm --rows 2147483647 --cols 2147483647 &&
	grep -q 'shape is too large' "$tmp.err" ||
	fail "fabep_bench: an allreduce shape past 2^40 bytes not refused"
# numbers as written: no sign or blank in front, no value twice
for args in "-t +8" "-t ' 8'" "-n 2,2 -o scale" "-o write -S 64,64"; do
	eval "set -- $args"
	expect 2 "$bench" "$@" || fail "fabep_bench $args: not refused"
done
expect 2 "$bench" --soak 0x10 || fail "fabep_bench --soak 0x10: not refused"
expect 2 "$demo" -t ' 8' || fail "fabep_demo -t ' 8': not refused"
# MoE shapes the library refuses, before any rank starts
for args in "-H 16777217 -t 1" "-f fp8 -H 100"; do
	# shellcheck disable=SC2086
	expect 2 "$bench" -o dispatch -n 2 -p shm $args &&
		grep -q 'fabep makes no MoE handle' "$tmp.err" ||
		fail "fabep_bench -o dispatch $args: not refused before the ranks"
done
# the bench's numeric variables and switches: malformed, or for a part
# that does not read them, refused
expect 2 env FABEP_BENCH_EXPERT_US=abc "$bench" -o combine -n 2 -p shm &&
	grep -q 'FABEP_BENCH_EXPERT_US=abc: expected a whole number' "$tmp.err" ||
	fail "FABEP_BENCH_EXPERT_US=abc: not refused"
expect 2 env FABEP_BENCH_SLOW_RANK=2 "$bench" -o combine -n 2 -p shm ||
	fail "FABEP_BENCH_SLOW_RANK=2 with 2 ranks: not refused"
expect 2 env FABEP_BENCH_EXPERT_US=5 "$bench" -o allreduce -p shm &&
	grep -q 'FABEP_BENCH_EXPERT_US is for -o dispatch, combine' "$tmp.err" ||
	fail "FABEP_BENCH_EXPERT_US with -o allreduce: not refused"
expect 2 env FABEP_BENCH_PULL=1 "$bench" -o dispatch -p shm ||
	fail "FABEP_BENCH_PULL=1 with -o dispatch: not refused"
expect 2 env FABEP_BENCH_SEND_BUFFER=1 "$bench" -o dispatch -f fp8 -p shm ||
	fail "FABEP_BENCH_SEND_BUFFER=1 with -f fp8: not refused"
expect 2 env FABEP_MPI_BENCH=/nonexistent "$bench" -o scale -n 2 -t 1 &&
	grep -q 'FABEP_MPI_BENCH=/nonexistent: not an executable' "$tmp.err" ||
	fail "FABEP_MPI_BENCH=/nonexistent: not refused"
# a baseline that runs and fails fails the run (exit 1), its row saying so
expect 1 env FABEP_BENCH_SCALE_PARTS=dispatch FABEP_MPIRUN=/bin/false \
	FABEP_MPI_BENCH=/bin/true "$bench" -o scale -n 2 -t 1 -I 3 -w 1 -p shm -m &&
	grep -q 'mpi_us: -1' "$tmp.out" &&
	grep -q 'the MPI baseline failed in 1 row' "$tmp.err" ||
	fail "fabep_bench -o scale with a failing baseline: not a failure"

# --- fabep_info ---
if expect 0 "$info"; then
	grep -q '^provider: ' "$tmp.out" || fail "fabep_info lists no provider"
	grep -q 'signal chosen: ' "$tmp.out" || fail "fabep_info: no signal chosen"
fi
if expect 0 "$info" -m; then
	head -n 1 "$tmp.out" | grep -q '^version: [0-9.]* isa: [a-z0-9]*$' ||
		fail "fabep_info -m: bad first line: $(head -n 1 "$tmp.out")"
fi

if ! "$info" -p shm >/dev/null 2>&1; then
	echo "SKIP: no shm provider for fabep here"
	[ "$fails" -eq 0 ] && exit 77
	exit 1
fi
grep -q '^provider: shm ' "$tmp.out" || fail "fabep_info -m: no shm line"
for key in mr_mode msg_order fence delivery_complete atomic_count \
	inject_size max_msg_size rma_iov_limit cq_data_size signals signal \
	numa_node why; do
	grep '^provider: shm ' "$tmp.out" | grep -q " $key: " ||
		fail "fabep_info -m: shm line lacks '$key:'"
done

# --- fabep_pingpong on shm, -m lines ---
for op in write signal; do
	if expect 0 "$pp" -p shm -o $op -S 64,4k -I 50 -m; then
		n=$(grep -c '^op: ' "$tmp.out")
		[ "$n" -eq 2 ] || fail "pingpong -o $op: $n rows, want 2"
		for bytes in 64 4096; do
			line=$(grep " bytes: $bytes " "$tmp.out")
			[ -n "$line" ] || fail "pingpong -o $op: no row for $bytes bytes"
			echo "$line" | grep -q "^op: $op " ||
				fail "pingpong -o $op: bad op in: $line"
			echo "$line" | grep -q " provider: shm " ||
				fail "pingpong: bad provider in: $line"
			echo "$line" | grep -q " signal: [a-z]* " ||
				fail "pingpong: no signal in: $line"
			echo "$line" | grep -q " iters: 50 " ||
				fail "pingpong: bad iters in: $line"
			echo "$line" | grep -Eq " usec_per_xfer: [0-9]+\.[0-9]+ " ||
				fail "pingpong: bad usec_per_xfer in: $line"
			echo "$line" | grep -Eq " MBps: [0-9]+\.[0-9]+( |$)" ||
				fail "pingpong: bad MBps in: $line"
		done
	fi
done

# -s and HOST, as operators run it across hosts (here on loopback): the
# provider fabep picks (shm: both on one host), then tcp; a client whose
# server is not there fails within the timeout, naming the address.
# The ports lie below the kernel's ephemeral range where it leaves room
# (as tests/harness.c picks them): there no outgoing connection of a test
# running beside this one holds a server's port before the server binds
# it, and no client that connects before its server listens meets itself.
lo=$(awk '{ print $1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null)
case $lo in '' | *[!0-9]*) lo=32768 ;; esac
if [ "$lo" -gt 20100 ]; then
	port=$((10000 + $$ % (lo - 10100)))
else
	port=$((30000 + $$ % 20000))
fi
# a server given no timeout waits for its client until interrupted, as
# fi_pingpong's does (a rendezvous without a limit): a client that comes
# after the library's default timeout of 30 s is served (checked at the
# end)
# (its bound, against a server left behind by a script killed outright,
# is the whole script's length under a sanitizer beside the other tests,
# not one command's)
wport=$((port + 40))
wstart=$(date +%s)
${to:+timeout 1800} env -u FABEP_TIMEOUT_MS -u FABEP_RENDEZVOUS_TIMEOUT_MS "$pp" -s -P $wport -p tcp -S 64 -I 5 \
	>"$tmp.wsrv" 2>"$tmp.wsrv.err" &
wsrv=$!
for prov in "" tcp; do
	port=$((port + 1))
	popt=${prov:+-p $prov}
	serve $to env FABEP_TIMEOUT_MS=20000 "$pp" -s -P $port $popt -S 64,4k -I 50 -m
	expect 0 env FABEP_TIMEOUT_MS=20000 "$pp" -P $port $popt -S 64,4k -I 50 -m \
		127.0.0.1
	wait $srv || fail "pingpong -s ${prov:-(fabep's choice)}: server exited $?"
	for f in "$tmp.out" "$tmp.srv"; do
		n=$(grep -c "^op: signal .* provider: ${prov:-shm}[; ]" "$f")
		[ "$n" -eq 2 ] || {
			fail "pingpong -s / HOST ${prov:-(fabep's choice)}: $n rows of 2 in ${f##*.}"
			sed 's/^/    /' "$f" "$tmp.srv.err" | head -10
		}
	done
done
# a server and a client with other options: both told at once, long
# before the timeout
port=$((port + 1))
serve $to env FABEP_TIMEOUT_MS=60000 "$pp" -s -P $port -p tcp -S 64 -I 5
t0=$(date +%s)
expect 1 env FABEP_TIMEOUT_MS=60000 "$pp" -P $port -p tcp -S 64 -I 6 127.0.0.1 &&
	grep -q 'the peer was started with other options' "$tmp.err" ||
	fail "pingpong: a client with other options not told so"
wait $srv && fail "pingpong: a server with other options exited 0"
grep -q 'the peer was started with other options' "$tmp.srv.err" ||
	fail "pingpong: a server with other options not told so"
[ $(($(date +%s) - t0)) -lt 30 ] || fail "pingpong: other options found late"
# a client killed while the server polls for its writes (-o write: no
# fabep_wait, only fabep_progress): the server names the loss at once.
# The kill comes once the server has printed its header, which it does
# after both sides' options were compared: the client is connected.
port=$((port + 1))
serve $to env FABEP_TIMEOUT_MS=60000 "$pp" -s -P $port -p tcp -o write -S 64 \
	-I 100000000 -w 1
# (no timeout wrapper: $! is the client itself, which is killed)
FABEP_TIMEOUT_MS=60000 "$pp" -P $port -p tcp -o write -S 64 \
	-I 100000000 -w 1 127.0.0.1 >/dev/null 2>&1 &
cli=$!
wait_for "$tmp.srv" '^# fabep_pingpong: op write' 60 $srv ||
	fail "pingpong -o write: the server never started its writes"
kill -9 $cli 2>/dev/null
t0=$(date +%s)
wait $srv && fail "pingpong -o write: a server whose client was killed exited 0"
[ $(($(date +%s) - t0)) -lt 20 ] || fail "pingpong -o write: a killed client found late"
grep -q 'fabep_progress: a peer rank was lost' "$tmp.srv.err" ||
	fail "pingpong -o write: a killed client not named as lost"
# with neither -s nor HOST both ranks run here, and the first line says so
expect 0 "$pp" -p shm -S 64 -I 5 && grep -q '^# fabep_pingpong: .*, two local ranks' "$tmp.out" ||
	fail "pingpong: a local run does not say that it is one"
# a launcher whose parent ignores SIGCHLD (inherited across exec; the
# kernel would reap its ranks at once) still waits for its ranks and
# reports how each ended
nochld='$SIG{CHLD} = "IGNORE"; exec @ARGV or die "exec: $!"'
expect 0 perl -e "$nochld" "$pp" -p shm -S 64 -I 5 ||
	fail "pingpong: a local run with SIGCHLD ignored"
expect 1 perl -e "$nochld" "$bench" -p nosuchprov -o moe -n 2 -t 1 -I 1 -w 0 &&
	[ "$(grep -c 'exited with status 1' "$tmp.err")" -eq 2 ] ||
	fail "bench: failed ranks with SIGCHLD ignored not reported"
port=$((port + 1))
serve $to perl -e "$nochld" "$pp" -s -P $port -p tcp -S 64 -I 5
expect 0 perl -e "$nochld" "$pp" -P $port -p tcp -S 64 -I 5 127.0.0.1 ||
	fail "pingpong: a client with SIGCHLD ignored"
wait $srv || fail "pingpong -s: a server with SIGCHLD ignored exited $?"
# a client whose rank stops mid-run: the server's wait times out and it
# ends without waiting for the stopped rank's goodbye as well
port=$((port + 1))
serve $to env FABEP_TIMEOUT_MS=3000 "$pp" -s -P $port -p tcp -S 64 -I 100000000 \
	-w 1
FABEP_TIMEOUT_MS=3000 "$pp" -P $port -p tcp -S 64 -I 100000000 -w 1 \
	127.0.0.1 >/dev/null 2>&1 &
cli=$!
wait_for "$tmp.srv" '^# fabep_pingpong: op signal' 60 $srv ||
	fail "pingpong: the server of a client to stop never started"
kids=$(cat /proc/$cli/task/*/children 2>/dev/null)
# shellcheck disable=SC2086
[ -n "$kids" ] && kill -STOP $kids
wait $srv && fail "pingpong: a server whose client stopped exited 0"
grep -q 'fabep_wait: timed out' "$tmp.srv.err" && ! grep -q 'destroy' "$tmp.srv.err" ||
	{ fail "pingpong: a server whose client stopped did not end at its timeout"
	  sed 's/^/    /' "$tmp.srv.err" | head -5; }
# shellcheck disable=SC2086
kill -KILL $cli $kids 2>/dev/null
wait $cli 2>/dev/null
# a server stopped while it waits for its client says so and ends by the
# signal (a background job's SIGINT is ignored: SIGTERM)
port=$((port + 1))
serve "$pp" -s -P $port -p tcp -S 64 -I 5
wait_for "$tmp.srv.err" 'waiting for a client' 60 $srv
kill -TERM $srv
wait $srv 2>/dev/null
rc=$?
[ $rc -eq 143 ] && grep -q 'Terminated: stopping the ranks' "$tmp.srv.err" ||
	{ fail "pingpong -s: SIGTERM while it waits gave exit $rc"
	  sed 's/^/    /' "$tmp.srv.err" | head -5; }
port=$((port + 1))
expect 1 env FABEP_TIMEOUT_MS=1000 "$pp" -P $((port + 1)) -S 64 -I 5 127.0.0.1 &&
	grep -q "rendezvous root 127.0.0.1:$((port + 1)) never answered" "$tmp.err" ||
	fail "pingpong HOST without a server: no message naming the address"

# a launcher's rank that cannot start (no FABEP_ROOT): the message names
# the rank as the launcher numbered it
expect 1 env -u FABEP_ROOT -u FABEP_RANK -u FABEP_WORLD_SIZE \
	OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 "$pp" -p shm -S 64 -I 1 &&
	grep -q '^fabep_pingpong: rank 1: fabep_comm_create: ' "$tmp.err" ||
	fail "pingpong under a launcher: the failing rank not named"

# the table form
if expect 0 "$pp" -p shm -S 64 -I 20 -b; then
	grep -q '^bytes *iters *total *time *MB/sec *usec/xfer *Mxfers/sec$' \
		"$tmp.out" || fail "pingpong: no fabtests table header"
fi

# fabep_demo: its long options, every layer checked
expect 0 "$demo" --ranks 3 --tokens 9 --hidden 100 --topk 3 --experts 7 \
	--iterations 4 --provider shm &&
	grep -q '^result: correct$' "$tmp.out" &&
	grep -q '^# fabep_demo: 3 ranks on [0-9]* cores\?, shm (signal [a-z]*), 4 layers$' \
		"$tmp.out" &&
	grep -q '^# up to 9 tokens per rank, hidden 100, top-3 of 9 experts' \
		"$tmp.out" || fail "fabep_demo with long options: not correct"

# fabep_demo with a rank killed mid-run: the demo names it, says failed,
# exits 1, and removes the shm region the dead rank left
demo_rank_pid() { # PARENT: a child of PARENT that has its shm region
	for s in /proc/[0-9]*/status; do
		p=${s#/proc/}
		p=${p%/status}
		grep -q "^PPid:[[:space:]]*$1\$" "$s" 2>/dev/null &&
			ls /dev/shm 2>/dev/null | grep -q "^$p:" &&
			{ echo "$p"; return; }
	done
}
rank_with_region() { # PARENT: demo_rank_pid, waiting up to 30 s
	n=0
	while [ $n -lt 300 ] && kill -0 "$1" 2>/dev/null; do
		p=$(demo_rank_pid "$1")
		[ -n "$p" ] && { echo "$p"; return; }
		sleep 0.1
		n=$((n + 1))
	done
}
FABEP_TIMEOUT_MS=60000 "$demo" -n 3 -t 8 -H 64 -I 100000000 \
	>"$tmp.out" 2>"$tmp.err" &
dp=$!
vp=$(rank_with_region "$dp")
if [ -z "$vp" ]; then
	fail "fabep_demo: no rank with an shm region within 30 s"
	kill -KILL "$dp" 2>/dev/null
	wait "$dp"
else
	kill -KILL "$vp"
	n=0
	while kill -0 "$dp" 2>/dev/null && [ $n -lt 900 ]; do
		sleep 0.1
		n=$((n + 1))
	done
	if kill -0 "$dp" 2>/dev/null; then
		fail "fabep_demo: still running 90 s after a rank was killed"
		kill -KILL "$dp"
	fi
	wait "$dp"
	rc=$?
	[ $rc -eq 1 ] && grep -q '^result: failed' "$tmp.out" &&
		grep -q 'fabep_demo: rank [0-9] killed by signal 9' "$tmp.err" ||
		{ fail "fabep_demo with a rank killed: exit $rc, want 1 and failed"
		  sed 's/^/    /' "$tmp.out" "$tmp.err" | tail -8; }
	ls /dev/shm | grep -q "^$vp:" &&
		fail "fabep_demo: the killed rank's shm region is left: $(ls /dev/shm | grep "^$vp:")"
fi

# the launcher stopped by SIGTERM (sent to it alone) stops its ranks,
# removes their shm regions and ends by the signal
"$pp" -p shm -S 64 -I 1000000000 >"$tmp.out" 2>"$tmp.err" &
dp=$!
vp=$(rank_with_region "$dp")
if [ -z "$vp" ]; then
	fail "fabep_pingpong: no rank with an shm region within 30 s"
	kill -KILL "$dp" 2>/dev/null
	wait "$dp" 2>/dev/null
else
	kill -TERM "$dp"
	wait "$dp" 2>/dev/null
	rc=$?
	n=0
	while kill -0 "$vp" 2>/dev/null && [ $n -lt 50 ]; do
		sleep 0.1
		n=$((n + 1))
	done
	[ $rc -eq 143 ] || fail "fabep_pingpong stopped by SIGTERM: exit $rc, want 143"
	kill -0 "$vp" 2>/dev/null &&
		{ fail "fabep_pingpong stopped by SIGTERM: rank $vp still runs"
		  kill -KILL "$vp"; }
	ls /dev/shm | grep -q "^$vp:" &&
		fail "fabep_pingpong stopped by SIGTERM: the rank's shm region is left"
fi

# fabep_bench -o write, checked
expect 0 "$bench" -p shm -o write -S 4k,64k -I 5 --check -m &&
	[ "$(grep -c '^op: write ' "$tmp.out")" -eq 2 ] ||
	fail "fabep_bench -o write: want 2 rows"

# fabep_bench -o allreduce|arnorm, checked against the scalar reference:
# one -m line per size, "key: value" pairs separated by spaces
for op in allreduce arnorm; do
	if expect 0 "$bench" -p shm -o $op -n 3 --rows 5 --cols 300 -I 2 \
		-f fp32 --check -m; then
		line=$(grep "^op: $op " "$tmp.out")
		echo "$line" | grep -Eq '^op: [a-z]+ provider: shm signal: [a-z]+ ranks: 3 threads: [0-9]+ dtype: fp32 rows: 5 cols: 300 bytes: 6000 iters: 2 path: [a-z-]+ median_us: [0-9.]+ ref_median_us: [0-9.]+ ratio: [0-9.]+ check: ok$' ||
			fail "fabep_bench -o $op -m: bad line: $line"
	fi
done

# fabep_bench -o moe with caller-quantized FP8 from the send buffer, checked
expect 0 env FABEP_BENCH_SEND_BUFFER=1 "$bench" -p shm -o moe -n 2 -t 16 \
	-H 256 -f fp8pre -I 3 --check -m &&
	grep -q '^op: moe .*format: fp8pre .*input: send_buffer .*check: ok' \
		"$tmp.out" || fail "fabep_bench -o moe -f fp8pre: not checked ok"

# the references and the floor: bf16 copy-mode dispatch must copy every
# received row once (floor = 2 * rows * hidden * 2 bytes), a zero-copy
# dispatch of bf16 has no floor; combine reads every expert output and
# writes every output row once ((rows + tokens) * hidden * 2); the
# overlap bound is the live reference over the larger of it and the put
# timed while the floor's bytes are copied (none without a floor)
floor_ok() { # op fmt zero-copy: the -m line's floor against the formula
	expect 0 env FABEP_BENCH_ZERO_COPY="$3" "$bench" -p shm -o "$1" -n 2 \
		-t 24 -H 192 -k 4 -e 8 -f "$2" -I 3 -m || return 1
	awk -v op="$1" -v zc="$3" '
	/^op: / {
		for (i = 1; i < NF; i += 2)
			v[$i] = $(i + 1)
		if (op == "combine")
			want = (v["rows:"] + v["tokens:"]) * 192 * 2
		else if (zc)
			want = 0
		else
			want = 2 * v["rows:"] * 192 * 2
		# the overlap bound: live / max(live, overlap), and no
		# overlap to measure without a floor
		# (the times are printed to 0.1 us: allow for their rounding)
		lv = v["ref_live_us:"]; ov = v["overlap_us:"]
		lo = lv - 0.05; hi = lv + 0.05
		clo = lo / (ov + 0.05 > lo ? ov + 0.05 : lo) - 0.001
		chi = hi / (ov - 0.05 > hi ? ov - 0.05 : hi) + 0.001
		c = v["ceiling_overlap:"]
		# ratio_live is live / median, printed to 0.001: a slow
		# build (the sanitizers) may print 0.000
		m = v["median_us:"]; r = v["ratio_live:"]
		rlo = lo / (m + 0.05) - 0.0006
		rhi = hi / (m - 0.05 > 0 ? m - 0.05 : 0.01) + 0.0006
		if (v["floor_bytes:"] != want || v["rows:"] <= 0 ||
		    !(lv > 0) || r == "" || r < 0 || r < rlo || r > rhi ||
		    !(v["ceiling_live:"] > 0 && v["ceiling_live:"] <= 1) ||
		    (want == 0 && v["ceiling_live:"] != "1.000") ||
		    !(ov > 0) || c < clo || c > chi ||
		    (want == 0 && (ov != lv || v["ceiling_overlap:"] != "1.000"))) {
			print "floor_bytes " v["floor_bytes:"] " want " want \
			      ", ref_live_us " lv ", ceiling_live " \
			      v["ceiling_live:"] ", overlap_us " ov \
			      ", ceiling_overlap " v["ceiling_overlap:"]
			exit 1
		}
		n++
	}
	END { exit n == 1 ? 0 : 1 }' "$tmp.out"
}
floor_ok dispatch bf16 0 || fail "fabep_bench -o dispatch (copy): floor or live reference wrong"
floor_ok dispatch bf16 1 || fail "fabep_bench -o dispatch (zero-copy): floor or live reference wrong"
floor_ok combine bf16 0 || fail "fabep_bench -o combine: floor or live reference wrong"

# each rank's median call: least <= median rank's <= largest <= the
# median of the iterations' slowest ranks (each rank's time is at most
# its iteration's slowest), slowest_rank a rank; a rank whose clock runs
# 30 ms longer after each call (FABEP_BENCH_SLOW_US on
# FABEP_BENCH_SLOW_RANK) must be the one named, its median the largest
# by that much, the others' untouched; a rank out of range is refused
spread_ok() { # op slow_rank slow_us (0: none) [more options]
	sop=$1 srank=$2 sus=$3
	shift 3
	expect 0 env FABEP_BENCH_SLOW_RANK="$srank" FABEP_BENCH_SLOW_US="$sus" \
		"$bench" -p shm -o "$sop" -n 4 -t 8 -H 256 -e 16 -I 5 -w 1 -m "$@" ||
		return 1
	awk -v want="$srank" -v us="$sus" '/^op: / {
		for (i = 1; i < NF; i += 2)
			v[$i] = $(i + 1)
		lo = v["rank_min_us:"]; md = v["rank_median_us:"]
		hi = v["rank_max_us:"]; r = v["slowest_rank:"]
		if (!(lo > 0) || md < lo || hi < md || hi > v["median_us:"] + 0.05 ||
		    r !~ /^[0-3]$/ ||
		    (us > 0 && (r != want || hi < us || md > us))) {
			print "rank_min_us " lo ", rank_median_us " md \
			      ", rank_max_us " hi ", median_us " v["median_us:"] \
			      ", slowest_rank " r " (want " want ")"
			exit 1
		}
		n++
	}
	END { exit n == 1 ? 0 : 1 }' "$tmp.out"
}
spread_ok dispatch 0 0 || fail "fabep_bench -o dispatch: per-rank figures wrong"
spread_ok combine 2 30000 || fail "fabep_bench -o combine: the slow rank not named"
spread_ok moe 3 30000 || fail "fabep_bench -o moe: the slow rank not named"
# --no-ref: the part alone, the same per-rank figures, checked, and no
# reference's field; only for the parts that have references
spread_ok moe 1 30000 --no-ref --check && grep -q ' check: ok .* refs: none$' "$tmp.out" &&
	! grep -q 'ref_us\|floor_us' "$tmp.out" ||
	fail "fabep_bench -o moe --no-ref: wrong line"
spread_ok combine 0 0 --no-ref || fail "fabep_bench -o combine --no-ref: per-rank figures wrong"
expect 0 "$bench" -p shm -o dispatch -n 2 -t 4 -H 256 -e 8 -I 3 -w 1 --no-ref &&
	grep -q '^# .* --no-ref: .* no references measured' "$tmp.out" &&
	grep -q '^dispatch  *bf16  *4 ' "$tmp.out" ||
	fail "fabep_bench -o dispatch --no-ref: no table"
expect 2 "$bench" -o allreduce --no-ref && grep -q -- '--no-ref is for' "$tmp.err" ||
	fail "fabep_bench -o allreduce --no-ref: no message"
expect 2 env FABEP_BENCH_SLOW_RANK=4 FABEP_BENCH_SLOW_US=10 "$bench" -p shm \
	-o dispatch -n 4 -t 8 -H 256 -e 16 -I 2 -m &&
	grep -q 'FABEP_BENCH_SLOW_RANK=4: expected a whole number from 0 to 3' "$tmp.err" ||
	fail "fabep_bench: FABEP_BENCH_SLOW_RANK past the ranks not refused"

# a floor far above the write (copy mode, top-16, rows of 4096: 8 rows per
# token per rank, the floor about 15 times the write on a quiet machine):
# the overlap bound must hold the floor's copy (at least half its time:
# the pool's other threads do it, or the caller before its put) and, when
# the floor did come out above twice the write (a loaded machine, such as
# distcheck's, can slow the write more than the copy), stay below 1.
# Three runs at most: on a shared machine a rank preempted during the
# floor's copy but not during the overlapped one can break the first.
overlap_ok() {
	expect 0 "$bench" -p shm -o dispatch -n 2 -t 64 -H 4096 -k 16 -e 32 \
		-f bf16 -I 10 -m &&
	awk '/^op: / {
		for (i = 1; i < NF; i += 2)
			v[$i] = $(i + 1)
		lv = v["ref_live_us:"]; ov = v["overlap_us:"]; fl = v["floor_us:"]
		if (!(fl > 0) || !(ov >= 0.5 * fl) ||
		    (fl > 2 * lv && !(v["ceiling_overlap:"] < 1)) ||
		    (v["ceiling_overlap:"] - lv / (ov > lv ? ov : lv)) ^ 2 > 0.005 ^ 2) {
			print "ref_live_us " lv ", floor_us " fl \
			      ", overlap_us " ov ", ceiling_overlap " \
			      v["ceiling_overlap:"]
			exit 1
		}
		if (!(fl > 2 * lv))
			print "note: floor " fl " us not above twice the write " \
			      lv " us here; the bound below 1 not checked"
		n++
	}
	END { exit n == 1 ? 0 : 1 }' "$tmp.out"
}
overlap_ok || overlap_ok || overlap_ok ||
	fail "fabep_bench: the overlap bound does not hold the floor's copy"

# -o scale: one row per part, the baseline's column filled when it was
# built (then its combine was checked), n/a otherwise; lists elsewhere
# are a command-line error
mpib=$top_builddir/utils/fabep_mpi_bench
if expect 0 "$bench" -p shm -o scale -n 2 -t 2 --rows 2 -H 256 -k 2 -e 8 \
	--cols 256 -I 3 -w 1 -m; then
	[ "$(grep -Ec '^op: scale part: .* result: ok( |$)' "$tmp.out")" = 4 ] ||
		fail "fabep_bench -o scale: not 4 rows with result: ok"
	if [ -x "$mpib" ]; then
		grep -q 'mpi_us: -1' "$tmp.out" &&
			fail "fabep_bench -o scale: the MPI baseline did not run"
	fi
fi
expect 0 env FABEP_MPI_BENCH=none FABEP_BENCH_SCALE_PARTS=dispatch "$bench" -p shm -o scale -n 2 -t 1 \
	-H 64 -k 2 -e 4 -I 2 -w 0 &&
	grep -Eq '^dispatch +2 +1t +[0-9.]+ .* n/a +n/a$' "$tmp.out" ||
	fail "fabep_bench -o scale without the baseline: no n/a row"
expect 2 "$bench" -o dispatch -n 2,4
# the experts bind only dispatch and combine: an allreduce row at a rank
# count they do not divide runs, and so does its baseline
if expect 0 env FABEP_BENCH_SCALE_PARTS=allreduce "$bench" -p shm -o scale \
	-n 3 --rows 1 --cols 256 -I 2 -w 1 -m; then
	grep -q '^op: scale part: allreduce .* result: ok' "$tmp.out" ||
		fail "fabep_bench -o scale -n 3 (allreduce): no row"
	if [ -x "$mpib" ]; then
		grep -q 'mpi_us: -1' "$tmp.out" &&
			fail "fabep_bench -o scale -n 3: the MPI allreduce did not run"
	fi
fi
# what scale passes on to its children's shell is quoted: a provider with
# a quote in it reaches the child as that name (no such provider)
mark=$tmp.injected
expect 1 env FABEP_MPI_BENCH=none FABEP_BENCH_SCALE_PARTS=dispatch \
	"$bench" -o scale -p "shm';touch\${IFS}$mark;'" -n 2 -t 1 -H 64 -k 2 \
	-e 4 -I 1 -w 0 -m
[ -e "$mark" ] && fail "fabep_bench -o scale: -p ran as a shell command"
grep -q "provider \"shm';touch\${IFS}$mark;'\"" "$tmp.err" ||
	fail "fabep_bench -o scale: -p with a quote did not reach the child as given"
# the baseline runs the iterations and warm-up of fabep's part, whose
# defaults differ from its own (allreduce of 2 x 64 fp32: 200 and 20);
# this mpirun prints no row, so the baseline fails and so does the run
printf '#!/bin/sh\necho "$*" >>"%s"\nexit 1\n' "$tmp.mpiargs" >"$tmp.mpirun"
chmod +x "$tmp.mpirun"
expect 1 env FABEP_MPI_BENCH=/bin/true FABEP_MPIRUN="$tmp.mpirun" \
	FABEP_BENCH_SCALE_PARTS=allreduce "$bench" -p shm -o scale -n 2 \
	--rows 2 --cols 64 -m &&
	grep -q -- '-o allreduce --rows 2 -I 200 -w 20 --cols 64 -m$' "$tmp.mpiargs" ||
	fail "fabep_bench -o scale: the baseline not given fabep's counts: $(cat "$tmp.mpiargs" 2>/dev/null)"
# the baseline's command line is checked before MPI starts
if [ -x "$mpib" ]; then
	for args in "-t 4294967297" "--cols 4294967312" "-I 0" "-w -1" \
		    "--rows 1,2,3,4,5,6,7,8,9" "--rows 1," "--rows ,1" "--rows 0"; do
		# shellcheck disable=SC2086
		expect 2 "$mpib" $args
	done
fi
# the parts' list: names with spaces around them, nothing else
expect 0 env FABEP_MPI_BENCH=none FABEP_BENCH_SCALE_PARTS=" combine, dispatch" \
	"$bench" -p shm -o scale -n 2 -t 1 -H 64 -k 2 -e 4 -I 2 -w 0 &&
	[ "$(grep -Ec '^(dispatch|combine) +2 +1t ' "$tmp.out")" = 2 ] ||
	fail "fabep_bench -o scale: FABEP_BENCH_SCALE_PARTS with spaces: not 2 rows"
for parts in nosuch "dispatch,,combine" "dispatch," "dispatch,alreduce"; do
	expect 2 env FABEP_BENCH_SCALE_PARTS="$parts" "$bench" -o scale -n 2 -t 1 &&
		grep -q "FABEP_BENCH_SCALE_PARTS=$parts: not" "$tmp.err" ||
		fail "fabep_bench -o scale: FABEP_BENCH_SCALE_PARTS=$parts accepted"
done
expect 2 "$bench" -o scale -n 2,x
# --rounds: every row measured that often; the speedup, the median of
# the rounds' own, lies in their range (one part and one row: each round
# starts the bench and mpirun once more, slow on a loaded machine)
if expect 0 env FABEP_BENCH_SCALE_PARTS=dispatch "$bench" -p shm -o scale \
	-n 2 -t 2 -H 256 -k 2 -e 8 -I 3 -w 1 --rounds 3 -m; then
	[ "$(grep -c '^op: scale part: dispatch .* result: ok rounds: 3 ' "$tmp.out")" = 1 ] ||
		fail "fabep_bench -o scale --rounds 3: not 1 row of 3 rounds"
	awk '{ for (i = 1; i < NF; i++) v[$i] = $(i + 1)
	       if (v["speedup:"] + 0 > 0 && (v["speedup_min:"] + 0 > v["speedup:"] + 0 ||
		   v["speedup:"] + 0 > v["speedup_max:"] + 0)) bad = 1 }
	     END { exit bad }' "$tmp.out" ||
		fail "fabep_bench -o scale --rounds 3: a speedup outside its range"
	if [ -x "$mpib" ]; then
		grep -q 'speedup_min: -1' "$tmp.out" &&
			fail "fabep_bench -o scale --rounds 3: no range with the baseline"
	fi
fi
expect 2 "$bench" -o dispatch --rounds 2 && grep -q -- '--rounds is for' "$tmp.err" ||
	fail "fabep_bench -o dispatch --rounds 2: no message"
expect 2 "$bench" -o scale --rounds 0
expect 2 "$bench" -o scale --rounds 101

# kernels at a hidden size whose arenas are not whole pages and whose
# rows need more scales than 16 values a scale
expect 0 "$bench" -o kernels -H 100 -B 64k -I 1 -w 0 -T 1 -K fp8_quant_bf16_b128
expect 0 "$bench" -o kernels -H 4 -B 64k -I 1 -w 0 -T 1 -K fp8_dequant_f32_row
expect 0 "$bench" -o kernels -H 3 -B 20000 -I 1 -w 0 -T 1 -K rmsnorm_bf16_fp8
# an option the part does not use, a format it does not take, a shape
# that cannot run: refused before any rank starts
for args in "-o kernels --soak 1" "-o allreduce --soak 1" "-o dispatch -S 4k" \
	    "-o moe -B 1M" "-o kernels -n 2" "-o soak -I 5" "-o write -t 4" \
	    "-o allreduce -f fp8" "--soak 1 -f fp8" "-o dispatch -e 3" \
	    "-o dispatch -k 9 -e 8" "-o scale -n 2,4 -e 6" "-o kernels -K nosuch" \
	    "-o dispatch -n 3" "-o moe -e 4" "-o scale -n 2,3" "-o kernels -p shm" \
	    "-o kernels -d nosuch"; do
	# shellcheck disable=SC2086
	expect 2 "$bench" $args
done

# the server of no timeout, started above: past the default timeout
left=$((wstart + 33 - $(date +%s)))
[ "$left" -gt 0 ] && sleep "$left"
expect 0 env FABEP_TIMEOUT_MS=20000 "$pp" -P $wport -p tcp -S 64 -I 5 \
	127.0.0.1 || {
	fail "pingpong: no client served $(($(date +%s) - wstart)) s after a server of no timeout"
	# whether it still ran, what it said, and who held the port
	kill -0 $wsrv 2>/dev/null || echo "    the server has ended"
	sed 's/^/    /' "$tmp.wsrv.err" | head -5
	ss -tanp 2>/dev/null | grep ":$wport " | sed 's/^/    /' | head -10
}
wait $wsrv || fail "pingpong -s of no timeout: server exited $?"
wsrv=
grep -q 'waiting for a client on .*(until interrupted)' "$tmp.wsrv.err" ||
	fail "pingpong -s of no timeout: does not say it waits until interrupted"
grep -q '^64  *5 ' "$tmp.wsrv" || {
	fail "pingpong -s of no timeout: no result row"
	sed 's/^/    /' "$tmp.wsrv" "$tmp.wsrv.err" | head -10
}

if [ "$fails" -ne 0 ]; then
	echo "$fails failures"
	exit 1
fi
echo "PASS: tools"
exit 0
