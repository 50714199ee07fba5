#!/bin/bash
# session 5 device run 20: combine in chunks (header last) on the claim
# pool, alternating with one write per run; HK lines of 256k chunks.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/lib
O=${OUT:-/tmp/out}; mkdir -p $O
B() { timeout 120 "$@" 2>&1 | grep -E "^op:" | cut -c1-1000; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
for rep in 1 2 3 4; do
 for ch in 0 65536 131072 262144 524288; do
  echo "## rep=$rep chunk=$ch t=128"
  FABEP_MOE_CHUNK=$ch B $D/fabep_bench_claim -o combine -t 128 -I 100 -f bf16 $M
 done
done >> $O/c_decode.txt 2>&1
for rep in 1 2; do
 for ch in 0 262144 1048576 4194304; do
  echo "## rep=$rep chunk=$ch t=4096"
  FABEP_MOE_CHUNK=$ch B $D/fabep_bench_claim -o combine -t 4096 -I 5 -f bf16 $M
 done
done >> $O/c_prefill.txt 2>&1
echo "## chunk=131072"
FABEP_MOE_CHUNK=131072 FABEP_LOG=debug timeout 100 $D/fabep_bench_claim -o combine -t 128 -I 30 -f bf16 $M 2>&1 | grep -E "HK|combine: call" | tail -30 > $O/hk.txt
echo done
