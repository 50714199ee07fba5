#!/bin/bash
# session 4 device run 6: pipelined packing (grains in order, chunks posted
# as their tokens finish) against one write per run, alternating.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/lib
O=${OUT:-/tmp/out}; mkdir -p $O
B() { timeout 100 "$@" 2>&1 | grep -E "^op:" | tail -1 | cut -c1-1000; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
CFGS="d-fp8-zc:dispatch:fp8:1:0 d-bf16-zc:dispatch:bf16:1:0 d-bf16-copy:dispatch:bf16:0:0 d-fp8pre-zc-sb:dispatch:fp8pre:1:1"
run() { # tokens iters reps chunks file
for rep in $(seq 1 $3); do
 for c in $CFGS; do IFS=: read nm op f z sb <<< "$c"
  for ch in $4; do
   echo "## rep=$rep chunk=$ch t=$1 cfg=$nm"
   FABEP_MOE_CHUNK=$ch FABEP_BENCH_ZERO_COPY=$z FABEP_BENCH_SEND_BUFFER=$sb B $D/fabep_bench_pipe -o $op -t $1 -I $2 -f $f $M
  done
 done
done >> $O/$5 2>&1
}
run 128 100 3 "0 128k 256k 512k" p_decode.txt
run 4096 5 2 "0 1M 2M 4M" p_prefill.txt
echo done
