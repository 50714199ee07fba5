#!/bin/bash
# session 9 device run 64: a call returns only once this rank's writes have
# left on providers that move them only under its progress (tcp): fb_drain
# against fb_fin (f405984), tcp loopback, 2 ranks, alternating.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(path|rows|median_us|min_us|ratio|ratio_live|channels|check):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
B() { timeout 200 "$@" 2>&1 | S; }
cat /proc/loadavg
ab() { local name=$1; shift; for v in fin drain; do echo -n "$name $v: "; B env "$@" $D/fb_$v $ARGS; done; }
T="-n 2 -H 7168 -k 8 -e 256 -m -p tcp"
for rep in 1 2; do
  echo "#### rep $rep"
  ARGS="-o dispatch -f fp8 -t 4096 -I 5 $T"; ab "tcp prefill dispatch fp8 zc, 1 channel" FABEP_CHANNELS=1 FABEP_BENCH_ZERO_COPY=1
  ARGS="-o dispatch -f fp8 -t 4096 -I 5 $T"; ab "tcp prefill dispatch fp8 zc, default channels" FABEP_BENCH_ZERO_COPY=1
  ARGS="-o combine -f bf16 -t 4096 -I 5 $T"; ab "tcp prefill combine bf16, 1 channel" FABEP_CHANNELS=1
  ARGS="-o combine -f bf16 -t 4096 -I 5 $T"; ab "tcp prefill combine bf16, default channels" X=1
  ARGS="-o dispatch -f fp8 -t 128 -I 50 $T"; ab "tcp decode dispatch fp8 zc" FABEP_BENCH_ZERO_COPY=1
  ARGS="-o combine -f bf16 -t 128 -I 50 $T"; ab "tcp decode combine bf16" X=1
  ARGS="-o arnorm -n 2 -p tcp --rows 4096 --cols 7168 -I 5 -m"; ab "tcp arnorm 4096 rows" X=1
  ARGS="-o dispatch -f fp8 -t 128 -I 100 -n 2 -H 7168 -k 8 -e 256 -m -p shm"; ab "shm decode dispatch fp8 zc" FABEP_BENCH_ZERO_COPY=1
done
echo "#### check"
B $D/fb_drain -o moe -f fp8 -t 4096 -I 3 --check -n 2 -H 7168 -k 8 -e 256 -m -p tcp
B $D/fb_drain -o moe -f bf16 -t 128 -I 5 --check -n 4 -H 7168 -k 8 -e 256 -m -p tcp
cat /proc/loadavg
