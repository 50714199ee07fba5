#!/bin/bash
# session 9 device run 51: the bench remaking the caller's tokens before
# each dispatch (fb_new) against as before (fb_old, 3c652f5), same library;
# and the FP8 kernel with the machine shared as two ranks share it.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|min_us|ratio_live|channels|check):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
B() { timeout 100 "$@" 2>&1 | S; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
cat /proc/loadavg; lscpu | grep -E "Model name|Thread|Core|Socket|L2|L3"
echo "#### fp8 quant kernel, 128 rows of 7168 (us)"
K="-o kernels -K fp8_quant_bf16_b128 -B 1792K -I 2000"
echo -n "T8 alone: "; $D/fb_new $K -T 8 2>&1 | tail -1
echo -n "T16 alone: "; $D/fb_new $K -T 16 2>&1 | tail -1
echo "two T8 at once:"; ($D/fb_new $K -T 8 2>&1 | tail -1 &); $D/fb_new $K -T 8 2>&1 | tail -1; sleep 2
ab() { # name tokens iters env...
  local name=$1 t=$2 it=$3; shift 3
  for v in old new; do echo -n "$name $v: "; B env "$@" $D/fb_$v $ARGS -t $t -I $it $M; done
}
for rep in 1 2; do
  echo "#### decode rep $rep"
  ARGS="-o dispatch -f fp8"; ab "dispatch fp8 zc" 128 100 FABEP_BENCH_ZERO_COPY=1
  ARGS="-o dispatch -f bf16"; ab "dispatch bf16 zc" 128 100 FABEP_BENCH_ZERO_COPY=1
  ARGS="-o dispatch -f bf16"; ab "dispatch bf16 copy" 128 100 X=1
  ARGS="-o dispatch -f fp8pre"; ab "dispatch fp8pre zc" 128 100 FABEP_BENCH_ZERO_COPY=1
done
echo "#### prefill"
ARGS="-o dispatch -f fp8"; ab "dispatch fp8 zc" 4096 5 FABEP_BENCH_ZERO_COPY=1
ARGS="-o dispatch -f bf16"; ab "dispatch bf16 zc" 4096 5 FABEP_BENCH_ZERO_COPY=1
ARGS="-o dispatch -f bf16"; ab "dispatch bf16 copy" 4096 5 X=1
echo "#### per call, decode fp8 zc (p50 p90 of 400 calls)"
for v in old new; do echo "## $v"
FABEP_LOG=debug FABEP_BENCH_ZERO_COPY=1 timeout 100 $D/fb_$v -o dispatch -f fp8 -n 2 -H 7168 -k 8 -e 256 -p shm -t 128 -I 200 2>&1 | grep "dispatch: call" | awk '{for(i=1;i<=NF;i++) if($i ~ /^(pack|put|wait|build)$/) print $i, $(i+1)}' | sort -k1,1 -k2,2n | awk '{v[$1]=v[$1]" "$2} END {for (k in v) {n=split(v[k],a," "); printf "%s p50 %s p90 %s\n", k, a[int(n/2)], a[int(n*0.9)]}}'
done
echo "#### check"
B $D/fb_new -o moe -f fp8pre -t 128 -I 10 --check $M
B $D/fb_new -o moe -f bf16 -t 128 -I 10 --check $M
cat /proc/loadavg
