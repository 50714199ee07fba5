#!/bin/bash
# session 8 device run 46: channels on the tcp provider (loopback), final
# library (5e55891): FABEP_CHANNELS 1, 2, 4 back to back, 2 ranks, 8 threads.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|min_us|ratio_live|channels|check):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
B() { timeout 200 "$@" 2>&1 | S; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p tcp"
for rep in 1 2; do
  for ch in 1 2 4; do echo -n "tcp decode dispatch bf16 zc ch=$ch: "; B env FABEP_CHANNELS=$ch FABEP_BENCH_ZERO_COPY=1 $D/fb_final -o dispatch -f bf16 -t 128 -I 50 $M; done
  for ch in 1 2 4; do echo -n "tcp decode combine bf16 ch=$ch: "; B env FABEP_CHANNELS=$ch $D/fb_final -o combine -f bf16 -t 128 -I 50 $M; done
done
for ch in 1 4; do echo -n "tcp prefill dispatch fp8 zc ch=$ch: "; B env FABEP_CHANNELS=$ch FABEP_BENCH_ZERO_COPY=1 $D/fb_final -o dispatch -f fp8 -t 4096 -I 3 $M; done
echo -n "tcp check ch=4: "; B env FABEP_CHANNELS=4 $D/fb_final -o moe -f bf16 -t 128 -I 5 --check $M
