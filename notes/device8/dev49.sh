#!/bin/bash
# session 8 device run 49: the tcp prefill dispatch that sometimes takes
# 0.6-0.9 s per call on one channel: does it come with more channels?
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|min_us|ratio_live|channels):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
B() { timeout 200 "$@" 2>&1 | S; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p tcp -t 4096 -I 4"
for rep in 1 2 3 4; do for ch in 1 2 4; do
  echo -n "tcp prefill dispatch fp8 zc ch=$ch: "; B env FABEP_CHANNELS=$ch FABEP_BENCH_ZERO_COPY=1 $D/fb_final -o dispatch -f fp8 $M
done; done
for ch in 1 4; do echo -n "tcp prefill combine bf16 ch=$ch: "; B env FABEP_CHANNELS=$ch $D/fb_final -o combine -f bf16 $M; done
