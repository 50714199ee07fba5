#!/bin/bash
# session 8 device run 42: each local rank's pool on its own share of the
# node, one CPU per worker (fb_new3) against the whole node for every
# worker (fb_new2); alternating; then per-call wait tails of both.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|min_us|ratio_live|channels):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
B() { timeout 150 "$@" 2>&1 | S; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
cat /proc/loadavg
ab() { # name tokens iters env...
  local name=$1 t=$2 it=$3; shift 3
  for v in new2 new3; do echo -n "$name $v: "; B env "$@" $D/fb_$v $ARGS -t $t -I $it $M; done
}
for rep in 1 2 3; do
  echo "#### decode rep=$rep"
  ARGS="-o dispatch -f fp8"; ab "dispatch fp8 zc" 128 100 FABEP_BENCH_ZERO_COPY=1
  ARGS="-o combine -f bf16"; ab "combine bf16" 128 100 X=1
  ARGS="-o combine -f fp8"; ab "combine fp8" 128 100 X=1
  ARGS="-o dispatch -f bf16"; ab "dispatch bf16 zc" 128 100 FABEP_BENCH_ZERO_COPY=1
  ARGS="-o dispatch -f fp8pre"; ab "dispatch fp8pre zc sb" 128 100 FABEP_BENCH_ZERO_COPY=1 FABEP_BENCH_SEND_BUFFER=1
  ARGS="-o dispatch -f bf16"; ab "dispatch bf16 copy" 128 100 X=1
done
echo "#### prefill"
ARGS="-o dispatch -f fp8"; ab "dispatch fp8 zc" 4096 5 FABEP_BENCH_ZERO_COPY=1
ARGS="-o combine -f bf16"; ab "combine bf16" 4096 5 X=1
echo "#### 8 ranks decode"
M="-n 8 -H 7168 -k 8 -e 256 -m -p shm"
ARGS="-o combine -f bf16"; ab "8r combine bf16" 128 30 X=1
ARGS="-o dispatch -f fp8"; ab "8r dispatch fp8 zc" 128 30 FABEP_BENCH_ZERO_COPY=1
echo "#### wait tails (per call, 2 ranks, decode fp8 zc, 3000 calls)"
for v in new2 new3 new2 new3; do
  echo -n "$v "; FABEP_LOG=debug FABEP_BENCH_ZERO_COPY=1 timeout 100 $D/fb_$v -o dispatch -f fp8 -n 2 -H 7168 -k 8 -e 256 -p shm -t 128 -I 3000 2>&1 | grep "dispatch: call" | awk '{for(i=1;i<=NF;i++) if($i=="wait") w=$(i+1); for(i=1;i<=NF;i++) if($i=="pack") p=$(i+1); print w, p}' | sort -n | awk '{a[NR]=$1; s+=$2} END {print "calls", NR, "wait p50", a[int(NR/2)], "p90", a[int(NR*0.9)], "p99", a[int(NR*0.99)], "max", a[NR], "pack mean", s/NR}'
done
echo "#### check"
B $D/fb_new3 -o moe -f fp8 -t 128 -I 10 --check -n 2 -H 7168 -k 8 -e 256 -m -p shm
B $D/fb_new3 -o moe -f bf16 -t 128 -I 5 --check -n 8 -H 7168 -k 8 -e 256 -m -p shm
cat /proc/loadavg
