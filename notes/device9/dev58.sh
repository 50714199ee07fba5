#!/bin/bash
# session 9 device run 58: copy mode and combine, fb_new against fb_j,
# the order of the two alternating between repetitions.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|min_us|ratio_live|channels|check):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
B() { timeout 100 "$@" 2>&1 | S; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm -t 128 -I 100"
cat /proc/loadavg
for rep in 1 2 3 4; do
  if [ $((rep % 2)) = 1 ]; then O="new j"; else O="j new"; fi
  for v in $O; do echo -n "rep $rep dispatch bf16 copy $v: "; B $D/fb_$v -o dispatch -f bf16 $M; done
  for v in $O; do echo -n "rep $rep combine bf16 $v: "; B $D/fb_$v -o combine -f bf16 $M; done
done
cat /proc/loadavg
