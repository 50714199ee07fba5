#!/bin/bash
# session 7 device run 32: channels (c0feccb), FABEP_CHANNELS 1 / 4 / 8,
# alternating in one call: every phase at decode, then at prefill.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
B() { timeout 150 "$@" 2>&1 | grep -E "^op:|error" | tail -1 | cut -c1-1400; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
phases() { # $1 tokens, $2 iters
  echo "## dispatch bf16 zc sb"; FABEP_BENCH_ZERO_COPY=1 FABEP_BENCH_SEND_BUFFER=1 B $D/fabep_bench_chan -o dispatch -t $1 -I $2 -f bf16 $M
  echo "## dispatch bf16 zc"; FABEP_BENCH_ZERO_COPY=1 B $D/fabep_bench_chan -o dispatch -t $1 -I $2 -f bf16 $M
  echo "## dispatch bf16 copy"; B $D/fabep_bench_chan -o dispatch -t $1 -I $2 -f bf16 $M
  echo "## dispatch fp8 zc"; FABEP_BENCH_ZERO_COPY=1 B $D/fabep_bench_chan -o dispatch -t $1 -I $2 -f fp8 $M
  echo "## dispatch fp8pre zc sb"; FABEP_BENCH_ZERO_COPY=1 FABEP_BENCH_SEND_BUFFER=1 B $D/fabep_bench_chan -o dispatch -t $1 -I $2 -f fp8pre $M
  echo "## combine bf16"; B $D/fabep_bench_chan -o combine -t $1 -I $2 -f bf16 $M
  echo "## combine fp8"; B $D/fabep_bench_chan -o combine -t $1 -I $2 -f fp8 $M
}
for rep in 1 2; do
 for ch in 1 8 4; do
  [ $rep = 2 ] && [ $ch = 4 ] && continue
  echo "#### decode rep=$rep channels=$ch"; FABEP_CHANNELS=$ch phases 128 100
 done
done
for ch in 1 8; do
 echo "#### prefill channels=$ch"; FABEP_CHANNELS=$ch phases 4096 5
done
echo "#### check channels=8"
FABEP_CHANNELS=8 B $D/fabep_bench_chan -o moe -t 128 -I 20 --check $M
FABEP_CHANNELS=8 B $D/fabep_bench_chan -o moe -n 8 -t 128 -H 7168 -k 8 -e 256 -I 10 --check -m -p shm
