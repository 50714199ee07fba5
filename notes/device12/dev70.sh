#!/bin/bash
# session 12 device run 70: combine's final sum in the own run (49348b5,
# fb_fused = 88e3028) against the library before it (fb_base = d336468),
# alternating within each repetition on one lease; then how many tokens
# the own run summed per call (debug line), decode and prefill.
# Both binaries --disable-shared, Debian's libfabric 1.17 carried in debs/.
C=$PWD/.carry
mkdir -p /tmp/fl && for d in $C/debs/*.deb; do dpkg -x $d /tmp/fl; done
export LD_LIBRARY_PATH=/tmp/fl/usr/lib/x86_64-linux-gnu:/tmp/fl/lib/x86_64-linux-gnu
export FI_PROVIDER_PATH=/tmp/fl/usr/lib/x86_64-linux-gnu/libfabric
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|min_us|ratio_live|channels|check):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
B() { timeout 100 "$@" 2>&1 | S; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
nproc; lscpu | grep -E "Model name|NUMA node\(s\)"; cat /proc/loadavg
ab() { # name tokens iters args
  local name=$1 t=$2 it=$3; shift 3
  for v in base fused; do echo -n "$name $v: "; B $C/fb_$v "$@" -t $t -I $it $M; done
}
for rep in 1 2 3; do
  echo "#### decode rep $rep"
  ab "combine bf16" 128 100 -o combine -f bf16
  ab "combine fp8" 128 100 -o combine -f fp8
done
for rep in 1 2; do
  echo "#### prefill rep $rep"
  ab "combine bf16" 4096 5 -o combine -f bf16
  ab "combine fp8" 4096 5 -o combine -f fp8
done
pc() { # per call p50/p90 of the combine debug line's parts, and the fused count
  awk '/combine: call/ {for(i=1;i<=NF;i++){ if($i ~ /^(put|wait|sum|total)$/) print $i, $(i+1); if($i=="run") print "own", $(i+1); if($i=="of" && $(i+2)=="tokens") print "fused", $(i-1)}}' | tr -d ',' |
  sort -k1,1 -k2,2n | awk '{v[$1]=v[$1]" "$2} END {for (k in v) {n=split(v[k],a," "); printf "%s p50 %s p90 %s; ", k, a[int(n/2)+1], a[int(n*0.9)]} print ""}'
}
for v in base fused; do
  echo "#### per call, $v, decode bf16 (200 calls x 2 ranks)"
  FABEP_LOG=debug timeout 100 $C/fb_$v -o combine -f bf16 -n 2 -H 7168 -k 8 -e 256 -p shm -t 128 -I 200 2>&1 | pc
  echo "#### per call, $v, prefill bf16 (10 calls x 2 ranks)"
  FABEP_LOG=debug timeout 100 $C/fb_$v -o combine -f bf16 -n 2 -H 7168 -k 8 -e 256 -p shm -t 4096 -I 10 2>&1 | pc
done
echo "#### check (fused)"
B $C/fb_fused -o moe -f bf16 -t 128 -I 20 --check $M
B $C/fb_fused -o moe -f fp8 -t 4096 -I 3 --check $M
B $C/fb_fused -o moe -f fp8 -t 128 -I 5 --check -n 8 -H 7168 -k 8 -e 256 -m -p shm
cat /proc/loadavg
