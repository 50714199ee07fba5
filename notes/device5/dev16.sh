#!/bin/bash
# session 5 device run 16: where combine's local time goes (HK lines:
# per pool run, the wall time, when the workers started and ended)
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/lib
O=${OUT:-/tmp/out}; mkdir -p $O
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
for th in 8 4; do
 echo "## threads=$th"
 FABEP_THREADS=$th FABEP_LOG=debug timeout 100 $D/fabep_bench_hk -o combine -t 128 -I 30 -f bf16 $M 2>&1 | grep -E "HK|call|^op:" | tail -60
done > $O/hk.txt 2>&1
echo done
