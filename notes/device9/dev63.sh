#!/bin/bash
# session 9 device run 63: the one-connection tcp stall: where in the call
# (per-call phase times) and which settings change it.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|min_us|ratio_live|channels|check):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p tcp -t 4096 -I 5"
cat /proc/loadavg
echo "## per call, 1 channel, fp8 zc"
FABEP_LOG=debug FABEP_CHANNELS=1 FABEP_BENCH_ZERO_COPY=1 timeout 200 $D/fb_fin -o dispatch -f fp8 $M > /tmp/a.txt 2>&1
S < /tmp/a.txt; grep "dispatch: call" /tmp/a.txt | tail -8
for v in "FABEP_THREADS=1" "FI_TCP_NODELAY=1" "FI_TCP_STAGING_SBUF_SIZE=0" "FI_TCP_PREFETCH_RBUF_SIZE=0" "FABEP_SIGNAL=delivery" "X=1"; do
  echo -n "1 channel, $v: "; env $v FABEP_CHANNELS=1 FABEP_BENCH_ZERO_COPY=1 timeout 200 $D/fb_fin -o dispatch -f fp8 $M 2>&1 | S
done
echo -n "1 channel bf16 zc sb: "; FABEP_CHANNELS=1 FABEP_BENCH_ZERO_COPY=1 FABEP_BENCH_SEND_BUFFER=1 timeout 200 $D/fb_fin -o dispatch -f bf16 $M 2>&1 | S
echo "## pingpong, tcp, one channel, bidirectional, 1M-64M"
FABEP_CHANNELS=1 timeout 120 $D/fabep_pingpong -p tcp -o write,signal -b -S 1M,8M,64M -m 2>&1 | tail -8
cat /proc/loadavg
