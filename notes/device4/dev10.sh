#!/bin/bash
# session 4 device run 4: FABEP_THREADS sweep at decode, alternating.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/lib
O=${OUT:-/tmp/out}; mkdir -p $O
B() { timeout 100 "$@" 2>&1 | grep -E "^op:" | tail -1 | cut -c1-1000; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
CFGS="d-bf16-zc-sb:dispatch:bf16:1:1 d-fp8pre-zc-sb:dispatch:fp8pre:1:1 d-bf16-zc:dispatch:bf16:1:0 d-fp8-zc:dispatch:fp8:1:0 c-bf16:combine:bf16:0:0 d-bf16-copy:dispatch:bf16:0:0"
for rep in 1 2 3; do
 for c in $CFGS; do IFS=: read nm op f z sb <<< "$c"
  for th in 1 2 4 8; do
   echo "## rep=$rep th=$th cfg=$nm"
   FABEP_THREADS=$th FABEP_BENCH_ZERO_COPY=$z FABEP_BENCH_SEND_BUFFER=$sb B $D/fabep_bench_new -o $op -t 128 -I 100 -f $f $M
  done
 done
done >> $O/th_decode.txt 2>&1
echo done
