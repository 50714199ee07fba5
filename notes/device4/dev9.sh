#!/bin/bash
# session 4 device run 3: FABEP_MOE_CHUNK sweep, alternating, combine and
# the dispatch phases with local work before the wire.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/lib
O=${OUT:-/tmp/out}; mkdir -p $O
B() { timeout 100 "$@" 2>&1 | grep -E "^op:" | tail -1 | cut -c1-1000; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
run() { # tokens iters reps chunks cfgs file
 for rep in $(seq 1 $3); do
  for c in $5; do IFS=: read nm op f z sb <<< "$c"
   for ch in $4; do
    echo "## rep=$rep chunk=$ch t=$1 cfg=$nm"
    FABEP_MOE_CHUNK=$ch FABEP_BENCH_ZERO_COPY=$z FABEP_BENCH_SEND_BUFFER=$sb B $D/fabep_bench_new -o $op -t $1 -I $2 -f $f $M
   done
  done
 done >> $O/$6 2>&1
}
run 128 100 3 "0 128k 256k 512k" "c-bf16:combine:bf16:0:0 d-bf16-copy:dispatch:bf16:0:0 d-fp8-zc:dispatch:fp8:1:0" c_decode.txt
run 4096 5 2 "0 1M 4M 8M" "c-bf16:combine:bf16:0:0 c-fp8:combine:fp8:0:0 d-fp8-zc:dispatch:fp8:1:0 d-bf16-copy:dispatch:bf16:0:0" c_prefill.txt
echo done
