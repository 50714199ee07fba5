#!/bin/bash
# session 10 device run 68: fabep_comm_wake.  fb_wake = the library with
# fabep_comm_wake and the bench that calls it (untimed) before each
# dispatch's token making and each combine's barrier; FABEP_BENCH_WAKE=0
# leaves it out.  Same binary, alternating, 3 repetitions at decode.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|min_us|ref_live_us|ratio_live|wake|check):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
B() { timeout 100 "$@" 2>&1 | S; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
cat /proc/loadavg
ab() { # name tokens iters env...
  local name=$1 t=$2 it=$3; shift 3
  for v in 0 1; do echo -n "$name wake $v: "; B env FABEP_BENCH_WAKE=$v "$@" $D/fb_wake $ARGS -t $t -I $it $M; done
}
phases() {
  ARGS="-o dispatch -f fp8"; ab "dispatch fp8 zc" $1 $2 FABEP_BENCH_ZERO_COPY=1
  ARGS="-o dispatch -f bf16"; ab "dispatch bf16 zc" $1 $2 FABEP_BENCH_ZERO_COPY=1
  ARGS="-o dispatch -f bf16"; ab "dispatch bf16 zc sb" $1 $2 FABEP_BENCH_ZERO_COPY=1 FABEP_BENCH_SEND_BUFFER=1
  ARGS="-o dispatch -f bf16"; ab "dispatch bf16 copy" $1 $2 X=1
  ARGS="-o dispatch -f fp8pre"; ab "dispatch fp8pre zc sb" $1 $2 FABEP_BENCH_ZERO_COPY=1 FABEP_BENCH_SEND_BUFFER=1
  ARGS="-o combine -f bf16"; ab "combine bf16" $1 $2 X=1
  ARGS="-o combine -f fp8"; ab "combine fp8" $1 $2 X=1
}
for rep in 1 2 3; do echo "#### decode rep $rep"; phases 128 100; done
echo "#### per call, decode fp8 zc (p50 p90 of 400 calls)"
for v in 0 1; do echo "## wake $v"
FABEP_BENCH_WAKE=$v FABEP_LOG=debug FABEP_BENCH_ZERO_COPY=1 timeout 100 $D/fb_wake -o dispatch -f fp8 -n 2 -H 7168 -k 8 -e 256 -p shm -t 128 -I 200 2>&1 | grep "dispatch: call" | awk '{for(i=1;i<=NF;i++) if($i ~ /^(pack|put|wait|build|total)$/) print $i, $(i+1)}' | sort -k1,1 -k2,2n | awk '{v[$1]=v[$1]" "$2} END {for (k in v) {n=split(v[k],a," "); printf "%s p50 %s p90 %s\n", k, a[int(n/2)], a[int(n*0.9)]}}' | sort
done
echo "#### prefill"; phases 4096 5
echo "#### 8 ranks decode"
M="-n 8 -H 7168 -k 8 -e 256 -m -p shm"
ARGS="-o combine -f bf16"; ab "8r combine bf16" 128 30 X=1
ARGS="-o dispatch -f fp8"; ab "8r dispatch fp8 zc" 128 30 FABEP_BENCH_ZERO_COPY=1
echo "#### check"
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
B $D/fb_wake -o moe -f fp8 -t 128 -I 10 --check $M
B $D/fb_wake -o moe -f bf16 -t 4096 -I 3 --check $M
cat /proc/loadavg
