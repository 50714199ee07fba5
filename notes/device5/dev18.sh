#!/bin/bash
# session 5 device run 18: idle workers stay awake FABEP_SPIN_US (spin
# binary: dynamic ranges + wake on entry + timed spin) against the old
# pool (static ranges, 4000 pauses then sleep), alternating.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/lib
O=${OUT:-/tmp/out}; mkdir -p $O
B() { timeout 120 "$@" 2>&1 | grep -E "^op:" | cut -c1-1000; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
for rep in 1 2 3; do
 for v in old:0 spin:0 spin:1000 spin:10000; do
  bin=${v%:*}; sp=${v#*:}
  for cfg in combine:bf16:0:0 dispatch:bf16:0:0 dispatch:bf16:1:1 dispatch:fp8:1:0; do
   IFS=: read op f z sb <<< "$cfg"
   echo "## rep=$rep bin=$bin spin=$sp t=128 cfg=$cfg"
   FABEP_SPIN_US=$sp FABEP_BENCH_ZERO_COPY=$z FABEP_BENCH_SEND_BUFFER=$sb B $D/fabep_bench_$bin -o $op -t 128 -I 100 -f $f $M
  done
 done
done >> $O/decode.txt 2>&1
for rep in 1 2; do
 for v in old:0 spin:1000; do
  bin=${v%:*}; sp=${v#*:}
  for cfg in combine:bf16:0:0 dispatch:bf16:0:0 dispatch:fp8:1:0; do
   IFS=: read op f z sb <<< "$cfg"
   echo "## rep=$rep bin=$bin spin=$sp t=4096 cfg=$cfg"
   FABEP_SPIN_US=$sp FABEP_BENCH_ZERO_COPY=$z FABEP_BENCH_SEND_BUFFER=$sb B $D/fabep_bench_$bin -o $op -t 4096 -I 5 -f $f $M
  done
 done
done >> $O/prefill.txt 2>&1
for sp in 0 1000; do
 echo "## spin=$sp"
 FABEP_SPIN_US=$sp FABEP_LOG=debug timeout 100 $D/fabep_bench_spin -o combine -t 128 -I 30 -f bf16 $M 2>&1 | grep -E "HK|combine: call|^op:" | tail -24
done > $O/hk.txt 2>&1
echo done
