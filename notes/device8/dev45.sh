#!/bin/bash
# session 8 device run 45: what the channels' rescue costs.  fb_new4 (final),
# fb_nr (no rescue in claim runs), fb_nr2 (no rescue in the waits),
# fb_old (session 7); rotating, 4 reps.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|min_us|ratio_live):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
B() { timeout 150 "$@" 2>&1 | S; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm -t 128 -I 100"
for rep in 1 2 3 4; do
  for v in old new4 nr nr2; do echo -n "combine bf16 $v: "; B $D/fb_$v -o combine -f bf16 $M; done
  for v in old new4 nr nr2; do echo -n "dispatch fp8 zc $v: "; B env FABEP_BENCH_ZERO_COPY=1 $D/fb_$v -o dispatch -f fp8 $M; done
done
