#!/bin/bash
# session 5 device run 22: the last post of a phase leaves the peers' copy to the next step (prog) against f140af8 (new), alternating.
# Usage: dev21.sh decode|prefill
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/lib
O=${OUT:-/tmp/out}; mkdir -p $O
B() { timeout 120 "$@" 2>&1 | grep -E "^op:" | tail -1 | cut -c1-1000; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
if [ "$1" = decode ]; then
 T=128; I=100; R=3
 CFGS="d-bf16-copy:dispatch:bf16:0:0 d-bf16-zc:dispatch:bf16:1:0 d-bf16-zc-sb:dispatch:bf16:1:1 d-fp8-copy:dispatch:fp8:0:0 d-fp8-zc:dispatch:fp8:1:0 d-fp8pre-zc-sb:dispatch:fp8pre:1:1 c-bf16:combine:bf16:0:0 c-fp8:combine:fp8:0:0"
else
 T=4096; I=5; R=2
 CFGS="d-bf16-copy:dispatch:bf16:0:0 d-bf16-zc-sb:dispatch:bf16:1:1 d-fp8-zc:dispatch:fp8:1:0 d-fp8pre-zc-sb:dispatch:fp8pre:1:1 c-bf16:combine:bf16:0:0"
fi
nproc > $O/env_$1.txt; lscpu | grep -E "Model name|L3|NUMA node" >> $O/env_$1.txt
for rep in $(seq 1 $R); do
 for c in $CFGS; do IFS=: read nm op f z sb <<< "$c"
  for bin in new prog; do
   echo "## rep=$rep bin=$bin t=$T cfg=$nm"
   FABEP_BENCH_ZERO_COPY=$z FABEP_BENCH_SEND_BUFFER=$sb B $D/fabep_bench_$bin -o $op -t $T -I $I -f $f $M
  done
 done
done >> $O/s_$1.txt 2>&1
echo done
