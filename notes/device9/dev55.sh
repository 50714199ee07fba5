#!/bin/bash
# session 9 device run 55: dev54's mixed cases again (prefill, 8 ranks),
# fb_new against fb_j, alternating, three times.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|min_us|ratio_live|channels|check):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
B() { timeout 100 "$@" 2>&1 | S; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
cat /proc/loadavg
ab() { local name=$1 t=$2 it=$3; shift 3
  for v in new j; do echo -n "$name $v: "; B env "$@" $D/fb_$v $ARGS -t $t -I $it $M; done; }
for rep in 1 2 3; do
  echo "#### rep $rep"
  ARGS="-o dispatch -f fp8"; ab "prefill dispatch fp8 zc" 4096 8 FABEP_BENCH_ZERO_COPY=1
  ARGS="-o dispatch -f fp8pre"; ab "prefill dispatch fp8pre zc sb" 4096 8 FABEP_BENCH_ZERO_COPY=1 FABEP_BENCH_SEND_BUFFER=1
  ARGS="-o dispatch -f fp8"; ab "decode dispatch fp8 zc" 128 100 FABEP_BENCH_ZERO_COPY=1
done
M="-n 8 -H 7168 -k 8 -e 256 -m -p shm"
for rep in 1 2; do
  ARGS="-o dispatch -f fp8"; ab "8r dispatch fp8 zc" 128 30 FABEP_BENCH_ZERO_COPY=1
done
cat /proc/loadavg
