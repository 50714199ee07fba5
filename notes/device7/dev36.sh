#!/bin/bash
# session 7 device run 36: any pool thread progresses any channel no other
# thread holds (free) against each thread its own channels (final =
# 2cc330d), alternating, default channels; the phases that had outliers.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
B() { timeout 150 "$@" 2>&1 | grep -E "^op:|error" | tail -1 | cut -c1-1500; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
for rep in 1 2 3 4 5 6; do
 for bin in final free; do
  echo "## rep=$rep fp8pre $bin"; FABEP_BENCH_ZERO_COPY=1 FABEP_BENCH_SEND_BUFFER=1 B $D/fabep_bench_$bin -o dispatch -f fp8pre -t 128 -I 100 $M
  echo "## rep=$rep combine bf16 $bin"; B $D/fabep_bench_$bin -o combine -f bf16 -t 128 -I 100 $M
  echo "## rep=$rep dispatch bf16 zc $bin"; FABEP_BENCH_ZERO_COPY=1 B $D/fabep_bench_$bin -o dispatch -f bf16 -t 128 -I 100 $M
 done
done
for bin in final free; do
 echo "## prefill combine bf16 $bin"; B $D/fabep_bench_$bin -o combine -f bf16 -t 4096 -I 5 $M
done
echo "## check"; B $D/fabep_bench_free -o moe -t 128 -I 10 --check $M
B $D/fabep_bench_free -o moe -t 128 -I 5 --check -n 8 -H 7168 -k 8 -e 256 -m -p shm
