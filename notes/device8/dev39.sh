#!/bin/bash
# session 8 device run 39: the FP8 kernel and placement changes (fb_new,
# 3bbd... HEAD of session 8) against session 7's final library (fb_old,
# d04d94e), alternating; then combine after an idle pause; then per-call
# phase times of FP8 dispatch.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(op|format|ranks|tokens|median_us|min_us|ratio_live|ratio|channels|check):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
B() { timeout 150 "$@" 2>&1 | S; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
echo "#### kernel fp8_quant_bf16_b128, 128 rows"
for rep in 1 2; do for v in old new; do for T in 1 8; do echo -n "$v T=$T "; $D/fb_$v -o kernels -K fp8_quant_bf16_b128 -B 1792K -T $T -I 300 2>&1 | tail -1; done; done; done
ab() { # name tokens iters env... -- args
  local name=$1 t=$2 it=$3; shift 3
  for v in old new; do echo -n "$name $v: "; B env "$@" $D/fb_$v $ARGS -t $t -I $it $M; done
}
for rep in 1 2; do
  echo "#### decode rep=$rep"
  ARGS="-o dispatch -f fp8"; ab "dispatch fp8 zc" 128 100 FABEP_BENCH_ZERO_COPY=1
  ARGS="-o dispatch -f bf16"; ab "dispatch bf16 zc" 128 100 FABEP_BENCH_ZERO_COPY=1
  ARGS="-o dispatch -f fp8pre"; ab "dispatch fp8pre zc sb" 128 100 FABEP_BENCH_ZERO_COPY=1 FABEP_BENCH_SEND_BUFFER=1
  ARGS="-o dispatch -f fp8"; ab "dispatch fp8 copy" 128 100 X=1
done
for rep in 1 2; do
  echo "#### prefill rep=$rep"
  ARGS="-o dispatch -f fp8"; ab "dispatch fp8 zc" 4096 5 FABEP_BENCH_ZERO_COPY=1
  ARGS="-o dispatch -f fp8"; ab "dispatch fp8 zc chunk2M" 4096 5 FABEP_BENCH_ZERO_COPY=1 FABEP_MOE_CHUNK=2M
done
echo "#### combine after an idle pause (new)"
for rep in 1 2; do for f in bf16 fp8; do for g in 0 10000; do
  echo -n "combine $f expert_us=$g: "; B env FABEP_BENCH_EXPERT_US=$g $D/fb_new -o combine -f $f -t 128 -I 100 $M
done; done; done
echo "#### 8 ranks decode"
M="-n 8 -H 7168 -k 8 -e 256 -m -p shm"
ARGS="-o dispatch -f bf16"; ab "8r dispatch bf16 zc" 128 30 FABEP_BENCH_ZERO_COPY=1
ARGS="-o dispatch -f fp8"; ab "8r dispatch fp8 zc" 128 30 FABEP_BENCH_ZERO_COPY=1
echo "#### per-call, new, decode fp8 zc"
FABEP_LOG=debug FABEP_BENCH_ZERO_COPY=1 timeout 100 $D/fb_new -o dispatch -f fp8 -n 2 -H 7168 -k 8 -e 256 -p shm -t 128 -I 60 2>&1 | grep "dispatch: call" | sed -n '80,89p' | cut -c1-160
echo "#### check"
B $D/fb_new -o moe -f fp8 -t 128 -I 10 --check -n 2 -H 7168 -k 8 -e 256 -m -p shm
B $D/fb_new -o moe -f fp8 -t 128 -I 5 --check -n 8 -H 7168 -k 8 -e 256 -m -p shm
