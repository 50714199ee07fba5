#!/bin/bash
# session 6 device run 27: combine's phase times per call (FABEP_LOG=debug:
# reduce, own run, put, wait, sum) with one write per run and with chunks.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/lib
O=${OUT:-/tmp/out}; mkdir -p $O
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
for rep in 1 2; do
 for ch in 0 524288 1048576; do
  echo "## rep=$rep chunk=$ch"
  FABEP_LOG=debug FABEP_MOE_CHUNK=$ch timeout 120 $D/fabep_bench_new -o combine -t 128 -I 30 -f bf16 $M 2>&1 | grep -E "^op:|fabep_moe_combine: call" | cut -c1-600
 done
done > $O/times.txt 2>&1
echo done
