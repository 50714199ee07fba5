#!/bin/bash
# session 6 device run 26: combine in chunks reduced last block first (new,
# 6th commit of session 6) against first block first (old, e648f4b),
# alternating, with one write per run beside them; and a moe --check of the
# new one, chunked, on 2, 8 and 16 ranks.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/lib
O=${OUT:-/tmp/out}; mkdir -p $O
B() { timeout 120 "$@" 2>&1 | grep -E "^op:" | tail -1 | cut -c1-1200; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
for rep in 1 2 3; do
 for ch in 0 1048576 524288 262144; do
  for bin in old new; do
   echo "## rep=$rep bin=$bin chunk=$ch combine bf16 t=128"
   FABEP_MOE_CHUNK=$ch B $D/fabep_bench_$bin -o combine -t 128 -I 100 -f bf16 $M
  done
 done
done > $O/c_decode.txt 2>&1
for rep in 1 2; do
 for ch in 0 8388608 2097152; do
  for bin in old new; do
   echo "## rep=$rep bin=$bin chunk=$ch combine bf16 t=4096"
   FABEP_MOE_CHUNK=$ch B $D/fabep_bench_$bin -o combine -t 4096 -I 5 -f bf16 $M
  done
 done
done > $O/c_prefill.txt 2>&1
export FABEP_HEAP_SIZE=2G
for n in 2 8 16; do
 for ch in 0 131072; do
  echo "## n=$n chunk=$ch moe check"
  FABEP_MOE_CHUNK=$ch B $D/fabep_bench_new -o moe -n $n -t 96 -H 7168 -k 8 -e 256 -I 5 --check -m -p shm
 done
done > $O/check.txt 2>&1
echo done
