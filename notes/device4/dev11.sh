#!/bin/bash
# session 4 device run 5: transparent huge pages for the heap and the
# pool's allocations (FEP_HACK_THP=1) against 4 KiB pages, alternating.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/lib
O=${OUT:-/tmp/out}; mkdir -p $O
cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag
B() { timeout 100 "$@" 2>&1 | grep -E "^op:" | tail -1 | cut -c1-1000; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
CFGS="d-bf16-zc-sb:dispatch:bf16:1:1 d-fp8pre-zc-sb:dispatch:fp8pre:1:1 d-bf16-zc:dispatch:bf16:1:0 d-bf16-copy:dispatch:bf16:0:0 d-fp8-zc:dispatch:fp8:1:0 c-bf16:combine:bf16:0:0"
run() { # tokens iters reps file
for rep in $(seq 1 $3); do
 for c in $CFGS; do IFS=: read nm op f z sb <<< "$c"
  for thp in 0 1; do
   echo "## rep=$rep thp=$thp t=$1 cfg=$nm"
   if [ $thp = 1 ]; then export FEP_HACK_THP=1; else unset FEP_HACK_THP; fi
   FABEP_BENCH_ZERO_COPY=$z FABEP_BENCH_SEND_BUFFER=$sb B $D/fabep_bench_thp -o $op -t $1 -I $2 -f $f $M
   grep AnonHuge /proc/meminfo
  done
 done
done >> $O/$4 2>&1
}
run 128 100 2 thp_decode.txt
run 4096 5 2 thp_prefill.txt
echo done
