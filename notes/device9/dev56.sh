#!/bin/bash
# session 9 device run 56: joined runs (bae1774 + a trace, fb_jw): per run,
# its whole time and the time from the caller's close to the last entered
# worker's return (JW lines), decode.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
M="-n 2 -H 7168 -k 8 -e 256 -p shm -t 128"
cat /proc/loadavg
q() { awk -v f=$1 '{for(i=1;i<=NF;i++) if($i==f) print $(i+1)}' | sort -n | awk '{v[NR]=$1} END {printf "n %d p50 %s p90 %s p99 %s max %s; over 100us: %d\n", NR, v[int(NR*0.5)+1], v[int(NR*0.9)+1], v[int(NR*0.99)+1], v[NR], 0}'; }
for ph in "dispatch -f fp8 ZC" "combine -f bf16" "dispatch -f bf16"; do
  set -- $ph
  for rep in 1 2; do
    echo "## $ph rep $rep"
    env FEP_POOL_TRACE=1 ${4:+FABEP_BENCH_ZERO_COPY=1} timeout 100 $D/fb_jw -o $1 $2 $3 -I 200 $M -m > /tmp/jw.txt 2>&1
    grep "^op:" /tmp/jw.txt | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|ratio_live):$/ {printf "%s %s ", $1, $2} END {print ""}'
    echo -n "total: "; grep "^JW" /tmp/jw.txt | q total
    echo -n "close->last: "; grep "^JW" /tmp/jw.txt | q close
    echo -n "entered: "; grep "^JW" /tmp/jw.txt | q entered
    grep "^JW" /tmp/jw.txt | awk '$5 > 100 {n++} END {print "runs with close->last > 100 us:", n+0, "of", NR}'
  done
done
cat /proc/loadavg
