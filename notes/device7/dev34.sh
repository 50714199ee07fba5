#!/bin/bash
# session 7 device run 34: combine's own tokens reduced while every thread
# progresses its channels (own) against the wait doing all the copying
# (chan2 = 15282e5), alternating; default channels (8).
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
B() { timeout 150 "$@" 2>&1 | grep -E "^op:|error" | tail -1 | cut -c1-1500; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
for rep in 1 2 3 4; do
 for f in bf16 fp8; do
  for bin in chan2 own; do
   echo "## decode rep=$rep combine $f $bin"; B $D/fabep_bench_$bin -o combine -f $f -t 128 -I 100 $M
  done
 done
done
for rep in 1 2; do
 for f in bf16 fp8; do
  for bin in chan2 own; do
   echo "## prefill rep=$rep combine $f $bin"; B $D/fabep_bench_$bin -o combine -f $f -t 4096 -I 5 $M
  done
 done
done
for bin in chan2 own; do
 echo "## 8r combine bf16 $bin"; B $D/fabep_bench_$bin -o combine -f bf16 -t 128 -I 30 -n 8 -H 7168 -k 8 -e 256 -m -p shm
done
echo "## check"; B $D/fabep_bench_own -o moe -t 128 -I 10 --check $M
B $D/fabep_bench_own -o moe -t 128 -I 5 --check -n 8 -H 7168 -k 8 -e 256 -m -p shm
