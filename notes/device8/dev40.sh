#!/bin/bash
# session 8 device run 40: channels whose thread does not run are
# progressed by the others (fb_new2) against session 7's library (fb_old,
# d04d94e) and the FP8/placement changes alone (fb_new); alternating.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|min_us|ratio_live|channels|check):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
B() { timeout 150 "$@" 2>&1 | S; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
cat /proc/loadavg
ab() { # name tokens iters env...
  local name=$1 t=$2 it=$3; shift 3
  for v in old new new2; do echo -n "$name $v: "; B env "$@" $D/fb_$v $ARGS -t $t -I $it $M; done
}
for rep in 1 2; do
  echo "#### decode rep=$rep"
  ARGS="-o combine -f bf16"; ab "combine bf16" 128 100 X=1
  ARGS="-o combine -f fp8"; ab "combine fp8" 128 100 X=1
  ARGS="-o dispatch -f fp8"; ab "dispatch fp8 zc" 128 100 FABEP_BENCH_ZERO_COPY=1
  ARGS="-o dispatch -f bf16"; ab "dispatch bf16 zc" 128 100 FABEP_BENCH_ZERO_COPY=1
done
echo "#### one channel"
ARGS="-o combine -f bf16"; ab "combine bf16 ch1" 128 100 FABEP_CHANNELS=1
ARGS="-o dispatch -f fp8"; ab "dispatch fp8 zc ch1" 128 100 FABEP_CHANNELS=1 FABEP_BENCH_ZERO_COPY=1
echo "#### prefill"
ARGS="-o dispatch -f fp8"; ab "dispatch fp8 zc" 4096 5 FABEP_BENCH_ZERO_COPY=1
ARGS="-o combine -f bf16"; ab "combine bf16" 4096 5 X=1
echo "#### combine after an idle pause (new2)"
for f in bf16 fp8; do for g in 0 10000; do
  echo -n "combine $f expert_us=$g: "; B env FABEP_BENCH_EXPERT_US=$g $D/fb_new2 -o combine -f $f -t 128 -I 100 $M
done; done
echo "#### 8 ranks decode"
M="-n 8 -H 7168 -k 8 -e 256 -m -p shm"
ARGS="-o combine -f bf16"; ab "8r combine bf16" 128 30 X=1
ARGS="-o dispatch -f fp8"; ab "8r dispatch fp8 zc" 128 30 FABEP_BENCH_ZERO_COPY=1
echo "#### check"
B $D/fb_new2 -o moe -f fp8 -t 128 -I 10 --check -n 2 -H 7168 -k 8 -e 256 -m -p shm
B $D/fb_new2 -o moe -f bf16 -t 128 -I 5 --check -n 8 -H 7168 -k 8 -e 256 -m -p shm
cat /proc/loadavg
