#!/bin/bash
# session 7 device run 38: every pool run whose caller drove the fabric
# now has every thread progress its channel between claims (gen), so
# chunked runs' slices are copied while the work goes on; against the
# final library (final = 2cc330d), with and without FABEP_MOE_CHUNK.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
B() { timeout 150 "$@" 2>&1 | grep -E "^op:|error" | tail -1 | cut -c1-1500; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
for rep in 1 2 3; do
 for ch in 0 262144 524288; do
  for bin in final gen; do
   echo "## decode rep=$rep chunk=$ch fp8 zc $bin"; FABEP_MOE_CHUNK=$ch FABEP_BENCH_ZERO_COPY=1 B $D/fabep_bench_$bin -o dispatch -f fp8 -t 128 -I 100 $M
   echo "## decode rep=$rep chunk=$ch combine bf16 $bin"; FABEP_MOE_CHUNK=$ch B $D/fabep_bench_$bin -o combine -f bf16 -t 128 -I 100 $M
  done
 done
done
for ch in 0 2097152; do
 for bin in final gen; do
  echo "## prefill chunk=$ch fp8 zc $bin"; FABEP_MOE_CHUNK=$ch FABEP_BENCH_ZERO_COPY=1 B $D/fabep_bench_$bin -o dispatch -f fp8 -t 4096 -I 5 $M
  echo "## prefill chunk=$ch combine bf16 $bin"; FABEP_MOE_CHUNK=$ch B $D/fabep_bench_$bin -o combine -f bf16 -t 4096 -I 5 $M
 done
done
for bin in final gen; do
 echo "## 8r combine bf16 $bin"; B $D/fabep_bench_$bin -o combine -f bf16 -t 128 -I 30 -n 8 -H 7168 -k 8 -e 256 -m -p shm
done
echo "## check"; FABEP_MOE_CHUNK=262144 B $D/fabep_bench_gen -o moe -t 128 -I 10 --check $M
B $D/fabep_bench_gen -o moe -t 128 -I 5 --check -n 8 -H 7168 -k 8 -e 256 -m -p shm
