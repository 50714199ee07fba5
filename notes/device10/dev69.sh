#!/bin/bash
# session 10 device run 69: the table with the session's final
# library (fb_final = af9fdc7, --disable-shared), 3 decode repetitions,
# prefill once, 8 ranks at decode, checks.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|min_us|ref_live_us|ratio_live|channels|check):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
B() { timeout 100 "$@" 2>&1 | S; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
cat /proc/loadavg
one() { local name=$1 t=$2 it=$3; shift 3; echo -n "$name: "; B env "$@" $D/fb_final $ARGS -t $t -I $it $M; }
phases() {
  ARGS="-o dispatch -f fp8"; one "dispatch fp8 zc" $1 $2 FABEP_BENCH_ZERO_COPY=1
  ARGS="-o dispatch -f bf16"; one "dispatch bf16 zc" $1 $2 FABEP_BENCH_ZERO_COPY=1
  ARGS="-o dispatch -f bf16"; one "dispatch bf16 zc sb" $1 $2 FABEP_BENCH_ZERO_COPY=1 FABEP_BENCH_SEND_BUFFER=1
  ARGS="-o dispatch -f bf16"; one "dispatch bf16 copy" $1 $2 X=1
  ARGS="-o dispatch -f fp8"; one "dispatch fp8 copy" $1 $2 X=1
  ARGS="-o dispatch -f fp8pre"; one "dispatch fp8pre zc sb" $1 $2 FABEP_BENCH_ZERO_COPY=1 FABEP_BENCH_SEND_BUFFER=1
  ARGS="-o combine -f bf16"; one "combine bf16" $1 $2 X=1
  ARGS="-o combine -f fp8"; one "combine fp8" $1 $2 X=1
}
for rep in 1 2 3; do echo "#### decode rep $rep"; phases 128 100; done
echo "#### prefill"; phases 4096 5
echo "#### 8 ranks decode"
M="-n 8 -H 7168 -k 8 -e 256 -m -p shm"
ARGS="-o combine -f bf16"; one "8r combine bf16" 128 30 X=1
ARGS="-o dispatch -f fp8"; one "8r dispatch fp8 zc" 128 30 FABEP_BENCH_ZERO_COPY=1
echo "#### check"
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
B $D/fb_final -o moe -f fp8 -t 128 -I 10 --check $M
B $D/fb_final -o moe -f bf16 -t 4096 -I 3 --check $M
M="-n 8 -H 7168 -k 8 -e 256 -m -p shm"
B $D/fb_final -o moe -f fp8 -t 128 -I 5 --check $M
cat /proc/loadavg
