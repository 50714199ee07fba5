#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
# netns.sh - several "hosts" on one machine: 3 network namespaces (each
# with its own hostname, through unshare --uts) joined by veth pairs to a
# bridge that lives in a fourth namespace, with private addresses
# 10.231.0.1-3/24 that exist only inside these namespaces.  4 ranks over
# the tcp provider (two in the first namespace, one in each other), then
# over udp (udp;ofi_rxd: RMA, atomics and reliability emulated over
# datagrams, as efa's protocol is over SRD), where it is here:
#   1. fabep_bench -o moe --check (dispatch + combine, checked),
#   2. fabep_bench --soak (dispatch + combine + allreduce, fresh random
#      routing every round, every result checked, memory watched);
#   3. fabep_pingpong as operators run it across hosts: "-s" on the
#      first host, the client on the third, naming the first's address;
#   4. (tcp) the same soak with rank 3 (alone on its "host") killed, then
#      rank 0: every other rank must fail naming it, well before the
#      timeout.
# Everything it makes (namespaces, links, processes) is removed on every
# exit path.  Needs root, ip(8) and unshare(1); exit 77 with the reason
# where namespaces cannot be made.  Runs from the build directory.
top_builddir=${top_builddir:-.}
bench=$(cd "$top_builddir" && pwd)/utils/fabep_bench
pp=$(cd "$top_builddir" && pwd)/utils/fabep_pingpong
tag=fep$$
hub=${tag}hub
nns=3
ranks=4
net=10.231.0
soak_s=${NETNS_SOAK_SECONDS:-4}
tmp=${TMPDIR:-/tmp}/fabep-netns.$$
. "$(dirname "$0")/lib.sh"
pids=
made=

skip() {
	echo "SKIP: $*"
	exit 77
}

cleanup() {
	trap - EXIT INT TERM HUP
	for p in $pids; do
		kill -KILL "$p" 2>/dev/null
	done
	for p in $pids; do
		wait "$p" 2>/dev/null
	done
	# anything still running inside our namespaces
	for n in $made; do
		for p in $(ip netns pids "$n" 2>/dev/null); do
			kill -KILL "$p" 2>/dev/null
		done
	done
	for n in $made; do
		ip netns del "$n" 2>/dev/null
	done
	rm -f "$tmp".*
}

[ -x "$bench" ] && [ -x "$pp" ] || { echo "FAIL: the tools are not built"; exit 1; }
[ "$(id -u)" = 0 ] || skip "needs root to make network namespaces (uid $(id -u))"
command -v ip >/dev/null 2>&1 || skip "no ip(8) command"
command -v unshare >/dev/null 2>&1 || skip "no unshare(1) command"
to=
command -v timeout >/dev/null 2>&1 && to="timeout -s KILL"
[ -n "$to" ] || skip "no timeout(1) command"

trap cleanup EXIT
trap 'exit 1' INT TERM HUP

ip netns add "$hub" 2>"$tmp.err" ||
	skip "cannot make a network namespace: $(cat "$tmp.err")"
made="$hub"
ip -n "$hub" link add br0 type bridge 2>"$tmp.err" ||
	skip "cannot make a bridge in a namespace: $(cat "$tmp.err")"
ip -n "$hub" link set br0 up || exit 1
ip -n "$hub" link set lo up || exit 1
i=1
while [ $i -le $nns ]; do
	n=${tag}h$i
	ip netns add "$n" || { echo "FAIL: ip netns add $n"; exit 1; }
	made="$made $n"
	ip -n "$hub" link add "v$i" type veth peer name eth0 netns "$n" 2>"$tmp.err" ||
		skip "cannot make a veth pair: $(cat "$tmp.err")"
	ip -n "$hub" link set "v$i" master br0 up || exit 1
	ip -n "$n" link set lo up || exit 1
	ip -n "$n" addr add "$net.$i/24" dev eth0 || exit 1
	ip -n "$n" link set eth0 up || exit 1
	i=$((i + 1))
done
# the namespaces reach each other (the only traffic: inside them)
if command -v ping >/dev/null 2>&1; then
	ok=0
	for try in 1 2 3 4 5 6 7 8 9 10; do
		if ip netns exec "${tag}h1" ping -c 1 -W 1 "$net.$nns" >/dev/null 2>&1; then
			ok=1
			break
		fi
	done
	[ $ok = 1 ] || { echo "FAIL: $net.1 cannot reach $net.$nns"; exit 1; }
else
	sleep 1
fi

# rank -> namespace: 0 and 1 share the first "host"
ns_of() {
	case $1 in
	0 | 1) echo 1 ;;
	*) echo $(($1 - 1)) ;;
	esac
}

fails=0
log=
port=$((20000 + $$ % 20000))

# start_ranks NAME TIMEOUT_S ARGS...: every rank in its namespace, in the
# background (their pids in $pids, output in $tmp.NAME.RANK.out/.err)
# in_host I TIMEOUT_S CMD...: CMD in namespace I under its own host name
in_host() {
	hi=$1
	hlim=$2
	shift 2
	$to "$hlim" ip netns exec "${tag}h$hi" unshare --uts sh -c \
		'hostname "$0"; exec "$@"' "fabep-host$hi" "$@"
}

start_ranks() {
	name=$1
	lim=$2
	shift 2
	port=$((port + 1))
	pids=
	r=0
	while [ $r -lt $ranks ]; do
		in_host "$(ns_of $r)" "$lim" \
			env FABEP_RANK=$r FABEP_WORLD_SIZE=$ranks \
			FABEP_ROOT="$net.1:$port" FABEP_PROVIDER=$prov \
			FABEP_TIMEOUT_MS=20000 FABEP_HEAP_SIZE=256M FABEP_THREADS=1 \
			${log:+FABEP_LOG=$log} "$bench" "$@" >"$tmp.$name.$r.out" 2>"$tmp.$name.$r.err" &
		pids="$pids $!"
		r=$((r + 1))
	done
}

# run_ranks NAME TIMEOUT_S ARGS...: start_ranks, then wait for every rank
run_ranks() {
	start_ranks "$@"
	r=0
	bad=0
	for p in $pids; do
		wait "$p"
		rc=$?
		if [ $rc -ne 0 ]; then
			echo "FAIL: $name: rank $r exited $rc"
			sed 's/^/    /' "$tmp.$name.$r.out" "$tmp.$name.$r.err" | tail -15
			bad=1
		fi
		r=$((r + 1))
	done
	pids=
	[ $bad = 0 ] || fails=$((fails + 1))
	cat "$tmp.$name.0.out"
	return $bad
}

# 1, 2 on provider $1 (its name as fabep_bench reports it: $2)
data_cases() { # PROVIDER NAME
	prov=$1
	# 1. dispatch + combine, checked (rank 0 prints "check: ok")
	if run_ranks "moe_$prov" 120 -o moe --check -m -t 32 -H 512 -k 4 -e 8 -I 5 -w 1; then
		grep -q 'check: ok' "$tmp.moe_$prov.0.out" ||
			{ echo "FAIL: moe: no 'check: ok'"; fails=$((fails + 1)); }
		grep -q "provider: $2" "$tmp.moe_$prov.0.out" ||
			{ echo "FAIL: moe: not on $2"; fails=$((fails + 1)); }
	fi

	# 2. dispatch + combine + allreduce soak, every result checked
	if run_ranks "soak_$prov" $((soak_s + 120)) --soak "$soak_s" -m; then
		line=$(grep '^op: soak ' "$tmp.soak_$prov.0.out" | tail -1)
		echo "$line" | grep -q ' errors: 0 ' ||
			{ echo "FAIL: soak: errors"; fails=$((fails + 1)); }
		echo "$line" | grep -q ' result: ok' ||
			{ echo "FAIL: soak: result"; fails=$((fails + 1)); }
		echo "$line" | grep -q ' ranks: 4 ' ||
			{ echo "FAIL: soak: not 4 ranks"; fails=$((fails + 1)); }
		echo "$line" | grep -q " provider: $2 " ||
			{ echo "FAIL: soak: not on $2"; fails=$((fails + 1)); }
	fi
}
# 3. fabep_pingpong -s on the first "host", its client on the third: a
# row per op and size, on the provider asked for, from both sides
pingpong_case() { # PROVIDER NAME
	port=$((port + 1))
	args="-p $1 -o write,signal -S 64,64k -I 100 -m -P $port"
	in_host 1 60 env -u FABEP_ROOT -u FABEP_RANK -u FABEP_WORLD_SIZE \
		FABEP_TIMEOUT_MS=20000 "$pp" -s $args \
		>"$tmp.pp_$1.0.out" 2>"$tmp.pp_$1.0.err" &
	pids=$!
	in_host $nns 60 env -u FABEP_ROOT -u FABEP_RANK -u FABEP_WORLD_SIZE \
		FABEP_TIMEOUT_MS=20000 "$pp" $args "$net.1" \
		>"$tmp.pp_$1.1.out" 2>"$tmp.pp_$1.1.err"
	rc1=$?
	wait $pids
	rc0=$?
	pids=
	for r in 0 1; do
		eval rc=\$rc$r
		f=$tmp.pp_$1.$r.out
		rows=$(grep -c "^op: \(write\|signal\) .* provider: $2 " "$f")
		if [ "$rc" -ne 0 ] || [ "$rows" -ne 4 ]; then
			echo "FAIL: pingpong on $1: side $r exited $rc with $rows rows of 4"
			sed 's/^/    /' "$f" "$tmp.pp_$1.$r.err" | tail -8
			fails=$((fails + 1))
		fi
	done
	grep '^op: ' "$tmp.pp_$1.1.out"
}

data_cases tcp 'tcp;ofi_rxm'
pingpong_case tcp 'tcp;ofi_rxm'
done_on=tcp
info=$(cd "$top_builddir" && pwd)/utils/fabep_info
if "$info" -p udp >/dev/null 2>&1; then
	data_cases udp 'udp;ofi_rxd'
	pingpong_case udp 'udp;ofi_rxd'
	done_on="tcp and udp"
else
	echo "SKIP (within netns): libfabric offers no udp;ofi_rxd RMA here"
fi
prov=tcp

# 4, 5. a rank's process dies mid-soak (SIGKILL): every other rank fails
# with the loss named, seen through the bootstrap's connections (ranks on
# other "hosts") or the process check (the same one), well before
# FABEP_TIMEOUT_MS (20 s).  First rank 3, alone in the third namespace;
# then rank 0, the rendezvous root.
kill_case() { # VICTIM
	victim=$1
	name=kill$victim
	log=info
	start_ranks "$name" 120 --soak 100 -m
	log=
	# the victim: the process of rank $victim in its namespace, once the
	# soak runs (its rounds take a few ms): its communicator is made
	# (the library's info line, after the exchange with every rank)
	wait_for "$tmp.$name.$victim.err" "rank $victim of $ranks: " 60
	sleep 1
	vp=
	for p in $(ip netns pids "${tag}h$(ns_of $victim)"); do
		tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null |
			grep -qx "FABEP_RANK=$victim" && vp=$p
	done
	if [ -z "$vp" ]; then
		echo "FAIL: $name: rank $victim is not running"
		sed 's/^/    /' "$tmp.$name.$victim.err" | tail -5
		fails=$((fails + 1))
		return
	fi
	t0=$(date +%s%N)
	kill -KILL "$vp"
	r=0
	for p in $pids; do
		wait "$p"
		rc=$?
		if [ $r -ne $victim ]; then
			if [ $rc -eq 0 ] || [ $rc -ge 124 ]; then
				echo "FAIL: $name: rank $r exited $rc after rank $victim died"
				fails=$((fails + 1))
			elif ! grep -Eq "rank $victim (is lost|\(process [0-9]+ on this host\) has exited)" \
					"$tmp.$name.$r.err"; then
				echo "FAIL: $name: rank $r does not name rank $victim lost"
				sed 's/^/    /' "$tmp.$name.$r.err" | tail -5
				fails=$((fails + 1))
			fi
		fi
		r=$((r + 1))
	done
	pids=
	took=$((($(date +%s%N) - t0) / 1000000))
	echo "$name: the other ranks had failed $took ms after rank $victim died"
	[ $took -le 10000 ] || {
		echo "FAIL: $name: $took ms (the timeout is 20 s)"
		fails=$((fails + 1))
	}
}
kill_case 3
kill_case 0

if [ $fails -ne 0 ]; then
	echo "netns: $fails failures"
	exit 1
fi
echo "netns: $ranks ranks in $nns namespaces over $done_on: moe checked, soak clean, pingpong across hosts, lost ranks named (tcp)"
exit 0
