#!/bin/bash
# session 8 device run 41: are the slow runs threads sharing a CPU?
# Outlier counts with 8, 7 and 6 threads per rank (2 ranks, 16 vCPUs),
# then a sampled run: every 10 ms, which CPU each thread of the two rank
# processes last ran on, and how many CPUs held two of them.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|min_us|ratio_live|channels):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
B() { timeout 150 "$@" 2>&1 | S; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm -t 128 -I 100"
for rep in 1 2 3; do for T in 8 7 6; do
  echo -n "T=$T dispatch fp8 zc: "; B env FABEP_THREADS=$T FABEP_BENCH_ZERO_COPY=1 $D/fb_new2 -o dispatch -f fp8 $M
  echo -n "T=$T combine bf16: "; B env FABEP_THREADS=$T $D/fb_new2 -o combine -f bf16 $M
done; done
echo "#### sampled, T=8"
sample() {
  FABEP_LOG=debug FABEP_BENCH_ZERO_COPY=1 FABEP_THREADS=$1 timeout 100 $D/fb_new2 -o dispatch -f fp8 -n 2 -H 7168 -k 8 -e 256 -p shm -t 128 -I 20000 > /tmp/s.log 2>&1 &
  bp=$!
  sleep 2
  pids=$(pgrep -f "fb_new2 -o dispatch" | tr '\n' ' ')
  echo "pids $pids"
  for i in $(seq 300); do
    for p in $pids; do cat /proc/$p/task/*/stat 2>/dev/null; done | awk '$3=="R"{c[$39]++; n++} END {d=0; for (k in c) if (c[k]>1) d++; printf "running %d cpus_shared %d\n", n, d}'
    sleep 0.01
  done | sort | uniq -c | sort -rn | head -12
  kill $bp $pids 2>/dev/null; wait
  grep "dispatch: call" /tmp/s.log | awk '{for(i=1;i<=NF;i++) if($i=="wait") print $(i+1)}' | sort -n | awk '{a[NR]=$1} END {print "waits: n", NR, "p50", a[int(NR/2)], "p90", a[int(NR*0.9)], "p99", a[int(NR*0.99)], "max", a[NR]}'
}
sample 8
echo "#### sampled, T=7"
sample 7
