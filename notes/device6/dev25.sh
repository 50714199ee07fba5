#!/bin/bash
# session 6 device run 25: every phase with the overlap bound (ceiling_overlap),
# then combine and FP8 dispatch in two writes per run against one, alternating.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/lib
O=${OUT:-/tmp/out}; mkdir -p $O
B() { timeout 120 "$@" 2>&1 | grep -E "^op:" | tail -1 | cut -c1-1200; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
nproc > $O/env.txt; lscpu | grep -E "Model name|L3|NUMA node" >> $O/env.txt
run() { # T I R CFGS
 for rep in $(seq 1 $3); do
  for c in $4; do IFS=: read nm op f z sb <<< "$c"
   echo "## rep=$rep t=$1 cfg=$nm"
   FABEP_BENCH_ZERO_COPY=$z FABEP_BENCH_SEND_BUFFER=$sb B $D/fabep_bench -o $op -t $1 -I $2 -f $f $M
  done
 done
}
run 128 100 3 "d-bf16-copy:dispatch:bf16:0:0 d-bf16-zc:dispatch:bf16:1:0 d-bf16-zc-sb:dispatch:bf16:1:1 d-fp8-copy:dispatch:fp8:0:0 d-fp8-zc:dispatch:fp8:1:0 d-fp8pre-zc-sb:dispatch:fp8pre:1:1 c-bf16:combine:bf16:0:0 c-fp8:combine:fp8:0:0" > $O/s_decode.txt 2>&1
run 4096 5 2 "d-bf16-copy:dispatch:bf16:0:0 d-bf16-zc-sb:dispatch:bf16:1:1 d-fp8-zc:dispatch:fp8:1:0 d-fp8pre-zc-sb:dispatch:fp8pre:1:1 c-bf16:combine:bf16:0:0 c-fp8:combine:fp8:0:0" > $O/s_prefill.txt 2>&1
for rep in 1 2 3; do
 for ch in 0 1048576 0 786432; do
  echo "## rep=$rep chunk=$ch combine bf16 t=128"
  FABEP_MOE_CHUNK=$ch B $D/fabep_bench -o combine -t 128 -I 100 -f bf16 $M
 done
 for ch in 0 524288; do
  echo "## rep=$rep chunk=$ch dispatch fp8 zc t=128"
  FABEP_MOE_CHUNK=$ch FABEP_BENCH_ZERO_COPY=1 B $D/fabep_bench -o dispatch -t 128 -I 100 -f fp8 $M
 done
done > $O/chunk2.txt 2>&1
echo done
