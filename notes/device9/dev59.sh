#!/bin/bash
# session 9 device run 59: the allreduce's local work claimed by the
# threads that come (fb_fin, f405984) against 3c652f5's (fb_new); and the
# issue's decode phases once more with the final library.  Alternating.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(path|rows|median_us|min_us|ratio|ratio_live|channels|check):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
B() { timeout 100 "$@" 2>&1 | S; }
cat /proc/loadavg
for rep in 1 2; do
  for n in 2 8; do for op in allreduce arnorm; do for rows in 8 128 4096; do
    for v in new fin; do echo -n "rep $rep $op n$n rows $rows $v: "; B $D/fb_$v -o $op -n $n -p shm --rows $rows --cols 7168 -I 50 -m; done
  done; done; done
done
echo "#### check"
for n in 2 8; do B $D/fb_fin -o arnorm -n $n -p shm --rows 512 --cols 7168 -I 5 --check -m; B $D/fb_fin -o allreduce -n $n -p shm --rows 4096 --cols 7168 -I 3 --check -m; done
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm -t 128 -I 100"
echo "#### decode, final"
for rep in 1 2; do
  for v in new fin; do echo -n "dispatch fp8 zc $v: "; B env FABEP_BENCH_ZERO_COPY=1 $D/fb_$v -o dispatch -f fp8 $M; done
  for v in new fin; do echo -n "combine bf16 $v: "; B $D/fb_$v -o combine -f bf16 $M; done
done
cat /proc/loadavg
