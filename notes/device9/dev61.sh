#!/bin/bash
# session 9 device run 61: the one-connection tcp stall of session 8
# (prefill FP8 zero-copy dispatch, 1 channel): TCP counters of the kernel
# (/proc/net/netstat, /proc/net/snmp) around each run.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|min_us|ratio_live|channels|check):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
snap() { awk 'NR%2==1 {split($0,h," ")} NR%2==0 {split($0,v," "); for(i=2;i<=NF;i++) print h[1] h[i], v[i]}' /proc/net/netstat /proc/net/snmp | sort; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p tcp -t 4096 -I 5"
cat /proc/loadavg
for ch in 1 1 4 1; do
  snap > /tmp/n0
  echo -n "channels $ch: "; FABEP_CHANNELS=$ch FABEP_BENCH_ZERO_COPY=1 timeout 200 $D/fb_fin -o dispatch -f fp8 $M 2>&1 | S
  snap > /tmp/n1
  join /tmp/n0 /tmp/n1 | awk '$3 != $2 && $1 ~ /(Timeout|Retrans|ZeroWindow|WinProbe|Probe|Loss|Drop|Prune|Collapse|OFO|Backlog|RcvQDrop|Recovery|SACK|DSACK|Delayed|Pressure|OutRsts|Abort|Memory)/ {printf "  %s +%d\n", $1, $3-$2}'
done
cat /proc/loadavg
