#!/bin/bash
# session 9 device run 62: the one-connection tcp stall: packets the
# kernel dropped (softnet_stat's second column, per CPU backlog full) and
# TCP timeouts, with 8 threads per rank (every CPU busy) and with 4.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|min_us|ratio_live|channels|check):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
drops() { awk '{s += strtonum("0x" $2); q += strtonum("0x" $3)} END {print s, q}' /proc/net/softnet_stat; }
tmo() { awk '/^TcpExt:/ && !h {split($0,k); h=1; next} /^TcpExt:/ {for(i=2;i<=NF;i++) if (k[i]=="TCPTimeouts" || k[i]=="TCPLossProbes") printf "%s %s ", k[i], $i} END {print ""}' /proc/net/netstat; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p tcp -t 4096 -I 5"
cat /proc/loadavg; sysctl net.core.netdev_max_backlog 2>/dev/null
for cfg in "8 1" "4 1" "8 1" "4 1" "8 4"; do
  set -- $cfg
  d0=$(drops); t0=$(tmo)
  echo -n "threads $1 channels $2: "; FABEP_THREADS=$1 FABEP_CHANNELS=$2 FABEP_BENCH_ZERO_COPY=1 timeout 200 $D/fb_fin -o dispatch -f fp8 $M 2>&1 | S
  echo "  softnet dropped,squeezed before: $d0 after: $(drops); tcp before: $t0 after: $(tmo)"
done
cat /proc/loadavg
