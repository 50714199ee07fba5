#!/bin/bash
# session 4 device run 8: top-k reduction in four independent sums
# (new) against one (old): the kernel alone, then combine, alternating.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/lib
O=${OUT:-/tmp/out}; mkdir -p $O
B() { timeout 100 "$@" 2>&1 | grep -E "^op:" | cut -c1-1000; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
for rep in 1 2; do
 for bin in old new; do
  echo "## rep=$rep bin=$bin kernels"
  B $D/fabep_bench_$bin -o kernels -m | grep topk
 done
done >> $O/k.txt 2>&1
for rep in 1 2 3; do
 for bin in old new; do
  for f in bf16 fp8; do
   echo "## rep=$rep bin=$bin t=128 cfg=c-$f"
   B $D/fabep_bench_$bin -o combine -t 128 -I 100 -f $f $M
  done
 done
done >> $O/c_decode.txt 2>&1
for rep in 1 2; do
 for bin in old new; do
  echo "## rep=$rep bin=$bin t=4096 cfg=c-bf16"
  B $D/fabep_bench_$bin -o combine -t 4096 -I 5 -f bf16 $M
 done
done >> $O/c_prefill.txt 2>&1
echo done
