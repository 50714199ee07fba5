#!/bin/bash
# session 9 device run 50: pool wake latency at decode.  fb_tr = 3c652f5 +
# tracing of claim runs (FEP_POOL_TRACE=1), the workers' idle spin from
# FEP_POOL_SPIN (default 4000 pauses), record alignment FEP_PAY_ALIGN.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|min_us|ratio_live|channels|check):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
B() { timeout 100 "$@" 2>&1 | S; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
SP=FEP_POOL_SPIN=2000000000
cat /proc/loadavg; nproc
$D/fb_tr -o kernels -K fp8_quant_bf16_b128 -B 1792K -T 8 -I 300 2>&1 | tail -1
for rep in 1 2; do
  echo "#### rep $rep"
  for v in X=1 $SP FEP_PAY_ALIGN=64; do
    echo -n "dispatch fp8 zc $v: "; B env FABEP_BENCH_ZERO_COPY=1 $v $D/fb_tr -o dispatch -f fp8 -t 128 -I 100 $M
  done
  for v in X=1 $SP; do
    echo -n "combine bf16 $v: "; B env $v $D/fb_tr -o combine -f bf16 -t 128 -I 100 $M
    echo -n "combine fp8 $v: "; B env $v $D/fb_tr -o combine -f fp8 -t 128 -I 100 $M
    echo -n "dispatch bf16 copy $v: "; B env $v $D/fb_tr -o dispatch -f bf16 -t 128 -I 100 $M
  done
done
echo "#### traces: fp8 zc pack runs (n 128, 32 claims): dur, join delays of workers 1-7 (us)"
for v in X=1 $SP; do
  echo "## $v"
  FEP_POOL_TRACE=1 FABEP_LOG=debug FABEP_BENCH_ZERO_COPY=1 env $v timeout 100 $D/fb_tr -o dispatch -f fp8 -n 2 -H 7168 -k 8 -e 256 -p shm -t 128 -I 150 > /tmp/tr.txt 2>&1
  grep "POOLTR n 128 claims 32" /tmp/tr.txt | awk '{d=$7; mx=0; s=0; c=0; for(i=10;i<=16;i++){ if($i>mx) mx=$i; if($i>=0){s+=$i;c++} } print d, mx, (c?s/c:-1), $18}' | sort -n > /tmp/trs.txt
  awk '{a[NR]=$1; b[NR]=$2; c[NR]=$3; z[NR]=$4} END {n=NR; print "runs", n}' /tmp/trs.txt
  for col in 1 2 3 4; do sort -n -k$col,$col /tmp/trs.txt | awk -v c=$col '{v[NR]=$c} END {printf "col%d p10 %s p50 %s p90 %s\n", c, v[int(NR*0.1)+1], v[int(NR/2)+1], v[int(NR*0.9)]}'; done
  grep "POOLTR n 128 claims 32" /tmp/tr.txt | sed -n '100,104p'
  grep "dispatch: call" /tmp/tr.txt | awk '{for(i=1;i<=NF;i++) if($i ~ /^(pack|put|wait|build)$/) print $i, $(i+1)}' | sort -k1,1 -k2,2n | awk '{v[$1]=v[$1]" "$2} END {for (k in v) {n=split(v[k],a," "); printf "%s p50 %s p90 %s\n", k, a[int(n/2)], a[int(n*0.9)]}}'
done
cat /proc/loadavg
