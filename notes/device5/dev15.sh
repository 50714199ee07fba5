#!/bin/bash
# session 5 device run 15: combine in chunks with the header last
# (FABEP_MOE_CHUNK) against one write per run, and the top-k kernel with
# software prefetch (FEP_HACK_TOPK=1) against without, alternating.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/lib
O=${OUT:-/tmp/out}; mkdir -p $O
B() { timeout 120 "$@" 2>&1 | grep -E "^op:" | cut -c1-1000; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
nproc > $O/k.txt; lscpu | grep -i "model name" >> $O/k.txt
for rep in 1 2; do
 for v in 0 1; do
  echo "## rep=$rep v=$v kernels"
  FEP_HACK_TOPK=$v B $D/fabep_bench -o kernels -K topk8_sum_bf16 -m
 done
done >> $O/k.txt 2>&1
for rep in 1 2 3; do
 for cfg in 0:0 131072:0 262144:0 524288:0 0:1 262144:1; do
  ch=${cfg%:*}; v=${cfg#*:}
  echo "## rep=$rep chunk=$ch v=$v t=128"
  FABEP_MOE_CHUNK=$ch FEP_HACK_TOPK=$v B $D/fabep_bench -o combine -t 128 -I 100 -f bf16 $M
 done
done >> $O/c_decode.txt 2>&1
for rep in 1 2; do
 for cfg in 0:0 262144:0 1048576:0 0:1; do
  ch=${cfg%:*}; v=${cfg#*:}
  echo "## rep=$rep chunk=$ch v=$v t=4096"
  FABEP_MOE_CHUNK=$ch FEP_HACK_TOPK=$v B $D/fabep_bench -o combine -t 4096 -I 5 -f bf16 $M
 done
done >> $O/c_prefill.txt 2>&1
# correctness of the chunked combine at scale: 8 ranks, check on
for ch in 0 65536; do
 echo "## chunk=$ch check 8 ranks"
 FABEP_MOE_CHUNK=$ch B $D/fabep_bench -o moe -n 8 -t 64 -H 7168 -k 8 -e 256 -I 5 --check -m -p shm
done >> $O/check.txt 2>&1
echo done
