#!/bin/bash
# session 8 device run 43: combine after the experts' compute (an idle
# pause of 10 ms before each combine): do the workers' sleep and wake-up
# make it slower?  fb_exp: workers spin FEP_EXP_SPIN_US before sleeping.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|min_us|ratio_live|channels):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
B() { timeout 150 "$@" 2>&1 | S; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm -t 128 -I 100"
for rep in 1 2 3; do
  for g in 0 10000; do for sp in 0 20000; do
    echo -n "combine bf16 expert_us=$g spin_us=$sp: "; B env FABEP_BENCH_EXPERT_US=$g FEP_EXP_SPIN_US=$sp $D/fb_exp -o combine -f bf16 $M
  done; done
  echo -n "combine fp8 expert_us=0 spin_us=0: "; B env FEP_EXP_SPIN_US=0 $D/fb_exp -o combine -f fp8 $M
  echo -n "combine fp8 expert_us=0 spin_us=30000: "; B env FEP_EXP_SPIN_US=30000 $D/fb_exp -o combine -f fp8 $M
done
