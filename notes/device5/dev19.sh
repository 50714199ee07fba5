#!/bin/bash
# session 5 device run 19: pool runs that wait for claims, not workers
# (claim) against dynamic ranges that wait for every worker (new) and
# static ranges (old), alternating.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/lib
O=${OUT:-/tmp/out}; mkdir -p $O
B() { timeout 120 "$@" 2>&1 | grep -E "^op:" | cut -c1-1000; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
for rep in 1 2 3; do
 for bin in old new claim; do
  for cfg in combine:bf16:0:0 dispatch:bf16:0:0 dispatch:bf16:1:1 dispatch:fp8:1:0 dispatch:fp8pre:1:1; do
   IFS=: read op f z sb <<< "$cfg"
   echo "## rep=$rep bin=$bin t=128 cfg=$cfg"
   FABEP_BENCH_ZERO_COPY=$z FABEP_BENCH_SEND_BUFFER=$sb B $D/fabep_bench_$bin -o $op -t 128 -I 100 -f $f $M
  done
 done
done >> $O/decode.txt 2>&1
for rep in 1 2; do
 for bin in old claim; do
  for cfg in combine:bf16:0:0 dispatch:bf16:0:0 dispatch:bf16:1:1 dispatch:fp8:1:0; do
   IFS=: read op f z sb <<< "$cfg"
   echo "## rep=$rep bin=$bin t=4096 cfg=$cfg"
   FABEP_BENCH_ZERO_COPY=$z FABEP_BENCH_SEND_BUFFER=$sb B $D/fabep_bench_$bin -o $op -t 4096 -I 5 -f $f $M
  done
 done
done >> $O/prefill.txt 2>&1
for bin in old claim; do
 echo "## bin=$bin"
 FABEP_LOG=debug timeout 100 $D/fabep_bench_$bin -o combine -t 128 -I 30 -f bf16 $M 2>&1 | grep -E "HK|combine: call|^op:" | tail -24
done > $O/hk.txt 2>&1
for bin in old claim; do
 echo "## bin=$bin kernels"
 B $D/fabep_bench_$bin -o kernels -m
done > $O/k.txt 2>&1
echo done
