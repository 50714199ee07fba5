#!/bin/bash
# session 7 device run 35: the final library (2cc330d), channels by default: every phase with
# FABEP_CHANNELS=1 and with the default (8 on 8 threads), the two runs of a
# phase back to back; decode 3 reps, prefill 2; then 8 ranks.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
B() { timeout 150 "$@" 2>&1 | grep -E "^op:|error" | tail -1 | cut -c1-1500; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
one() { # $1 name, $2 tokens, $3 iters, rest: env and args
  local name=$1 t=$2 it=$3; shift 3
  for ch in 1 auto; do
    echo "## $name ch=$ch"
    if [ $ch = 1 ]; then E="FABEP_CHANNELS=1"; else E="X=1"; fi
    B env $E "$@" -t $t -I $it $M
  done
}
phases() {
  one "dispatch bf16 zc sb" $1 $2 FABEP_BENCH_ZERO_COPY=1 FABEP_BENCH_SEND_BUFFER=1 $D/fabep_bench_final -o dispatch -f bf16
  one "dispatch bf16 zc" $1 $2 FABEP_BENCH_ZERO_COPY=1 $D/fabep_bench_final -o dispatch -f bf16
  one "dispatch bf16 copy" $1 $2 $D/fabep_bench_final -o dispatch -f bf16
  one "dispatch fp8 zc" $1 $2 FABEP_BENCH_ZERO_COPY=1 $D/fabep_bench_final -o dispatch -f fp8
  one "dispatch fp8pre zc sb" $1 $2 FABEP_BENCH_ZERO_COPY=1 FABEP_BENCH_SEND_BUFFER=1 $D/fabep_bench_final -o dispatch -f fp8pre
  one "combine bf16" $1 $2 $D/fabep_bench_final -o combine -f bf16
  one "combine fp8" $1 $2 $D/fabep_bench_final -o combine -f fp8
}
for rep in 1 2 3; do echo "#### decode rep=$rep"; phases 128 100; done
for rep in 1 2; do echo "#### prefill rep=$rep"; phases 4096 5; done
echo "#### 8 ranks decode"
M="-n 8 -H 7168 -k 8 -e 256 -m -p shm"
one "8r combine bf16" 128 30 $D/fabep_bench_final -o combine -f bf16
one "8r dispatch bf16 zc" 128 30 FABEP_BENCH_ZERO_COPY=1 $D/fabep_bench_final -o dispatch -f bf16
echo "#### check"
B $D/fabep_bench_final -o moe -t 128 -I 10 --check -n 2 -H 7168 -k 8 -e 256 -m -p shm
B $D/fabep_bench_final -o moe -t 4096 -I 3 --check -n 2 -H 7168 -k 8 -e 256 -m -p shm
B $D/fabep_bench_final -o moe -t 128 -I 5 --check -n 8 -H 7168 -k 8 -e 256 -m -p shm
