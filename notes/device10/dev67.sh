#!/bin/bash
# session 10 device run 67: waking the pool's sleeping workers.  fb_fan =
# 027cfdf + an experiment: FEP_POOL_FANOUT=f makes a wake rouse f workers,
# each of which rouses f more (the caller pays f wake-ups instead of 7);
# unset, every sleeper at once (the library).  The debug line's "wake" is
# the caller's wake call at the start of dispatch_send.  Alternating.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
cat /proc/loadavg
P() { sort -k1,1 -k2,2n | awk '{v[$1]=v[$1]" "$2} END {for (k in v) {n=split(v[k],a," "); printf "  %s p50 %s p90 %s\n", k, a[int(n/2)], a[int(n*0.9)]}}' | sort; }
run() { # label env... -- args
  echo "## $1"; shift
  env FABEP_LOG=debug "$@" -n 2 -H 7168 -k 8 -e 256 -p shm -m > /tmp/o.txt 2>&1
  grep -E "^op:" /tmp/o.txt | tr ' ' '\n' | paste - - | awk '$1 ~ /^(op|median_us|min_us|ref_live_us|ratio_live):$/ {printf "%s %s ", $1, $2} END {print ""}'
  grep "call [0-9]*:" /tmp/o.txt | sed 's/^fabep\[\([0-9]*\):[0-9]*\] debug: fabep_moe_\([a-z]*\): call \([0-9]*\):/\2 \1 \3/' > /tmp/c.txt
  awk '{for(i=4;i<=NF;i++) if($i ~ /^(pack|put|wait|build|reduce|sum|total|wake)$/) print $1"."$i, $(i+1)}' /tmp/c.txt | grep -v "^combine.total\|^dispatch.total" | P
  awk '{for(i=4;i<=NF;i++) if($i=="total") {k=$1" "$3; if(!(k in mx) || $(i+1)>mx[k]) mx[k]=$(i+1)}} END {for(k in mx) {split(k,a," "); print a[1]".slowest", mx[k]}}' /tmp/c.txt | P
}
for rep in 1 2 3; do
  for f in none 1 2; do
    E=X=1; [ $f != none ] && E=FEP_POOL_FANOUT=$f
    run "decode fp8 zc dispatch, fanout $f, rep $rep" $E FABEP_BENCH_ZERO_COPY=1 $D/fb_fan -o dispatch -f fp8 -t 128 -I 200
  done
  for f in none 2; do
    E=X=1; [ $f != none ] && E=FEP_POOL_FANOUT=$f
    run "decode combine bf16, fanout $f, rep $rep" $E $D/fb_fan -o combine -f bf16 -t 128 -I 200
  done
done
cat /proc/loadavg
