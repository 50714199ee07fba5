#!/bin/bash
# session 8 device run 48: waits that sleep only where threads outnumber
# CPUs (fb_final2) against sleeping after 2 ms always (fb_final, 5e55891).
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|min_us|ratio_live|channels|check):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
B() { timeout 200 "$@" 2>&1 | S; }
M="-n 2 -H 7168 -k 8 -e 256 -m"
for rep in 1 2 3; do for v in final final2; do
  echo -n "tcp prefill dispatch fp8 zc ch=1 $v: "; B env FABEP_CHANNELS=1 FABEP_BENCH_ZERO_COPY=1 $D/fb_$v -o dispatch -f fp8 -t 4096 -I 3 -p tcp $M
done; done
for v in final final2; do
  echo -n "tcp prefill combine bf16 ch=1 $v: "; B env FABEP_CHANNELS=1 $D/fb_$v -o combine -f bf16 -t 4096 -I 3 -p tcp $M
  echo -n "tcp prefill dispatch fp8 zc default $v: "; B env FABEP_BENCH_ZERO_COPY=1 $D/fb_$v -o dispatch -f fp8 -t 4096 -I 3 -p tcp $M
done
for rep in 1 2; do for v in final final2; do
  echo -n "shm decode dispatch fp8 zc $v: "; B env FABEP_BENCH_ZERO_COPY=1 $D/fb_$v -o dispatch -f fp8 -t 128 -I 100 -p shm $M
  echo -n "shm decode combine bf16 $v: "; B $D/fb_$v -o combine -f bf16 -t 128 -I 100 -p shm $M
done; done
echo -n "8 ranks shm check final2: "; B $D/fb_final2 -o moe -f fp8 -t 128 -I 5 --check -n 8 -H 7168 -k 8 -e 256 -m -p shm
echo -n "20 ranks shm (oversubscribed) check final2: "; B env FABEP_THREADS=1 $D/fb_final2 -o moe -f bf16 -t 64 -I 3 --check -n 20 -H 1024 -k 4 -e 80 -m -p shm
