#!/bin/bash
# session 10 device run 65: pipelined runs (FABEP_MOE_CHUNK) with 8
# channels, never tried with channels (sessions 4-6 tried them with one
# endpoint, where they lost).  The library of e82d1ab (fb_cur); chunk sizes
# alternate within each repetition, every phase on the same lease.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|min_us|ratio_live|channels|check):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
B() { timeout 100 "$@" 2>&1 | S; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
nproc; cat /proc/loadavg
sweep() { # name tokens iters "chunks" env...
  local name=$1 t=$2 it=$3 ch=$4; shift 4
  for c in $ch; do echo -n "$name chunk $c: "; B env FABEP_MOE_CHUNK=$c "$@" $D/fb_cur $ARGS -t $t -I $it $M; done
}
for rep in 1 2; do
  echo "#### decode rep $rep"
  ARGS="-o dispatch -f fp8"; sweep "dispatch fp8 zc" 128 100 "0 131072 262144 524288" FABEP_BENCH_ZERO_COPY=1
  ARGS="-o dispatch -f bf16"; sweep "dispatch bf16 copy" 128 100 "0 262144 524288" X=1
  ARGS="-o combine -f bf16"; sweep "combine bf16" 128 100 "0 262144 524288 1048576" X=1
  ARGS="-o combine -f fp8"; sweep "combine fp8" 128 100 "0 262144 524288" X=1
done
echo "#### per call, decode fp8 zc (p50 p90 of 400 calls)"
for c in 0 262144; do echo "## chunk $c"
FABEP_MOE_CHUNK=$c FABEP_LOG=debug FABEP_BENCH_ZERO_COPY=1 timeout 100 $D/fb_cur -o dispatch -f fp8 -n 2 -H 7168 -k 8 -e 256 -p shm -t 128 -I 200 2>&1 | grep "dispatch: call" | awk '{for(i=1;i<=NF;i++) if($i ~ /^(pack|put|wait|build)$/) print $i, $(i+1)}' | sort -k1,1 -k2,2n | awk '{v[$1]=v[$1]" "$2} END {for (k in v) {n=split(v[k],a," "); printf "%s p50 %s p90 %s\n", k, a[int(n/2)], a[int(n*0.9)]}}'
done
for rep in 1 2; do
  echo "#### prefill rep $rep"
  ARGS="-o dispatch -f fp8"; sweep "dispatch fp8 zc" 4096 5 "0 1048576 4194304" FABEP_BENCH_ZERO_COPY=1
  ARGS="-o combine -f bf16"; sweep "combine bf16" 4096 5 "0 1048576 4194304" X=1
  ARGS="-o dispatch -f bf16"; sweep "dispatch bf16 copy" 4096 5 "0 1048576 4194304" X=1
done
echo "#### check with chunks"
for c in 131072 1048576; do
B env FABEP_MOE_CHUNK=$c $D/fb_cur -o moe -f fp8 -t 128 -I 10 --check -n 2 -H 7168 -k 8 -e 256 -m -p shm
B env FABEP_MOE_CHUNK=$c $D/fb_cur -o moe -f bf16 -t 4096 -I 3 --check -n 2 -H 7168 -k 8 -e 256 -m -p shm
done
cat /proc/loadavg
