#!/bin/bash
# session 6 device run 28: no post drives the fabric (nodrive) against
# posts between blocks that drive it (new: 349559c), alternating: combine
# and FP8 dispatch with and without chunks, 2 ranks; combine on 8 ranks
# (several blocks per call even unchunked); then phase times per call.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/lib
O=${OUT:-/tmp/out}; mkdir -p $O
B() { timeout 120 "$@" 2>&1 | grep -E "^op:" | tail -1 | cut -c1-1200; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
for rep in 1 2 3; do
 for ch in 0 524288 1048576; do
  for bin in new nodrive; do
   echo "## rep=$rep bin=$bin chunk=$ch combine bf16 t=128"
   FABEP_MOE_CHUNK=$ch B $D/fabep_bench_$bin -o combine -t 128 -I 100 -f bf16 $M
   echo "## rep=$rep bin=$bin chunk=$ch dispatch fp8 zc t=128"
   FABEP_MOE_CHUNK=$ch FABEP_BENCH_ZERO_COPY=1 B $D/fabep_bench_$bin -o dispatch -t 128 -I 100 -f fp8 $M
  done
 done
 for bin in new nodrive; do
  echo "## rep=$rep bin=$bin chunk=0 dispatch bf16 zc sb t=128"
  FABEP_BENCH_ZERO_COPY=1 FABEP_BENCH_SEND_BUFFER=1 B $D/fabep_bench_$bin -o dispatch -t 128 -I 100 -f bf16 $M
  echo "## rep=$rep bin=$bin chunk=0 combine bf16 n=8 t=128"
  FABEP_HEAP_SIZE=2G B $D/fabep_bench_$bin -o combine -n 8 -t 128 -H 7168 -k 8 -e 256 -I 50 -f bf16 -m -p shm
 done
done > $O/s.txt 2>&1
for rep in 1 2; do
 for ch in 0 4194304; do
  for bin in new nodrive; do
   echo "## rep=$rep bin=$bin chunk=$ch combine bf16 t=4096"
   FABEP_MOE_CHUNK=$ch B $D/fabep_bench_$bin -o combine -t 4096 -I 5 -f bf16 $M
  done
 done
done > $O/p.txt 2>&1
for ch in 524288 1048576; do
 echo "## nodrive chunk=$ch"
 FABEP_LOG=debug FABEP_MOE_CHUNK=$ch timeout 120 $D/fabep_bench_nodrive -o combine -t 128 -I 30 -f bf16 $M 2>&1 | grep -E "^op:|fabep_moe_combine: call" | cut -c1-600
done > $O/times.txt 2>&1
echo done
