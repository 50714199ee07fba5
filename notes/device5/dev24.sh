#!/bin/bash
# session 5 device run 24: --check of the final library at scale (moe =
# dispatch + combine, every result compared with the reference).
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/lib
O=${OUT:-/tmp/out}; mkdir -p $O
B() { timeout 120 "$@" 2>&1 | grep -E "^op:|rror" | tail -2 | cut -c1-3000; }
for n in 2 8 16; do
 for cfg in bf16:0:0 bf16:1:1 fp8:0:0 fp8:1:0 fp8pre:1:1; do
  IFS=: read f z sb <<< "$cfg"
  echo "## n=$n cfg=$cfg"
  FABEP_BENCH_ZERO_COPY=$z FABEP_BENCH_SEND_BUFFER=$sb B $D/fabep_bench_prog -o moe -n $n -t 96 -H 7168 -k 8 -e 256 -I 5 -f $f --check -m -p shm
 done
done > $O/check.txt 2>&1
echo "## chunked combine, 8 ranks"
FABEP_MOE_CHUNK=65536 B $D/fabep_bench_prog -o moe -n 8 -t 96 -H 7168 -k 8 -e 256 -I 5 -f bf16 --check -m -p shm >> $O/check.txt 2>&1
echo done
