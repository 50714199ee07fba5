#!/bin/bash
# session 12 device run 71: decode combine, fused (88e3028) against base
# (d336468), five more alternating repetitions and per-call parts twice
# (dev70 was mixed at decode); then the table with fb_fused.
C=$PWD/.carry
mkdir -p /tmp/fl && for d in $C/debs/*.deb; do dpkg -x $d /tmp/fl; done
export LD_LIBRARY_PATH=/tmp/fl/usr/lib/x86_64-linux-gnu:/tmp/fl/lib/x86_64-linux-gnu
export FI_PROVIDER_PATH=/tmp/fl/usr/lib/x86_64-linux-gnu/libfabric
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|min_us|ref_live_us|ratio_live|channels|check):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
B() { timeout 100 "$@" 2>&1 | S; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
cat /proc/loadavg
ab() { local name=$1 t=$2 it=$3; shift 3
  for v in base fused; do echo -n "$name $v: "; B $C/fb_$v "$@" -t $t -I $it $M; done; }
pc() { awk '/combine: call/ {for(i=1;i<=NF;i++){ if($i ~ /^(put|wait|sum|total)$/) print $i, $(i+1); if($i=="run") print "own", $(i+1); if($i=="of" && $(i+2)=="tokens") print "fused", $(i-1)}}' | tr -d ',)' |
  sort -k1,1 -k2,2n | awk '{v[$1]=v[$1]" "$2} END {for (k in v) {n=split(v[k],a," "); printf "%s p50 %s p90 %s; ", k, a[int(n/2)+1], a[int(n*0.9)]} print ""}'; }
for rep in 1 2 3 4 5; do
  echo "#### decode rep $rep"
  ab "combine bf16" 128 100 -o combine -f bf16
  ab "combine fp8" 128 100 -o combine -f fp8
done
for rep in 1 2; do for v in base fused; do
  echo "#### per call, $v, decode bf16, rep $rep"
  FABEP_LOG=debug timeout 100 $C/fb_$v -o combine -f bf16 -n 2 -H 7168 -k 8 -e 256 -p shm -t 128 -I 200 2>&1 | pc
done; done
one() { local name=$1 t=$2 it=$3; shift 3; echo -n "$name: "; B env "$@" $C/fb_fused $ARGS -t $t -I $it $M; }
phases() {
  ARGS="-o dispatch -f fp8"; one "dispatch fp8 zc" $1 $2 FABEP_BENCH_ZERO_COPY=1
  ARGS="-o dispatch -f bf16"; one "dispatch bf16 zc" $1 $2 FABEP_BENCH_ZERO_COPY=1
  ARGS="-o dispatch -f bf16"; one "dispatch bf16 zc sb" $1 $2 FABEP_BENCH_ZERO_COPY=1 FABEP_BENCH_SEND_BUFFER=1
  ARGS="-o dispatch -f bf16"; one "dispatch bf16 copy" $1 $2 X=1
  ARGS="-o dispatch -f fp8"; one "dispatch fp8 copy" $1 $2 X=1
  ARGS="-o dispatch -f fp8pre"; one "dispatch fp8pre zc sb" $1 $2 FABEP_BENCH_ZERO_COPY=1 FABEP_BENCH_SEND_BUFFER=1
  ARGS="-o combine -f bf16"; one "combine bf16" $1 $2 X=1
  ARGS="-o combine -f fp8"; one "combine fp8" $1 $2 X=1
}
for rep in 1 2; do echo "#### table decode rep $rep"; phases 128 100; done
echo "#### table prefill"; phases 4096 5
cat /proc/loadavg
