#!/bin/bash
# session 10 device run 66: where a decode call's time goes beyond its
# four parts.  fb_t = e82d1ab + a "total" in the debug line (send half's
# entry to receive half's return); per call of both ranks, and the
# slowest rank of each call against the bench's median.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
cat /proc/loadavg
P() { # the p50/p90 of every "name value" pair on stdin
  sort -k1,1 -k2,2n | awk '{v[$1]=v[$1]" "$2} END {for (k in v) {n=split(v[k],a," "); printf "  %s p50 %s p90 %s\n", k, a[int(n/2)], a[int(n*0.9)]}}'
}
run() { # label env... -- args
  echo "## $1"; shift
  env FABEP_LOG=debug "$@" -n 2 -H 7168 -k 8 -e 256 -p shm -m > /tmp/o.txt 2>&1
  grep -E "^op:" /tmp/o.txt | tr ' ' '\n' | paste - - | awk '$1 ~ /^(op|median_us|min_us|ref_live_us|ratio_live):$/ {printf "%s %s ", $1, $2} END {print ""}'
  grep "call [0-9]*:" /tmp/o.txt | sed 's/^fabep\[\([0-9]*\):[0-9]*\] debug: fabep_moe_\([a-z]*\): call \([0-9]*\):/\2 \1 \3/' > /tmp/c.txt
  awk '{for(i=4;i<=NF;i++) if($i ~ /^(pack|put|wait|build|reduce|sum|total)$/) print $1"."$i, $(i+1)}' /tmp/c.txt | P
  # per call: the slowest rank's total, and the gap between the ranks
  awk '{for(i=4;i<=NF;i++) if($i=="total") {k=$1" "$3; if(!(k in mx) || $(i+1)>mx[k]) mx[k]=$(i+1); if(!(k in mn) || $(i+1)<mn[k]) mn[k]=$(i+1)}} END {for(k in mx) {split(k,a," "); print a[1]".slowest", mx[k]; print a[1]".gap", mx[k]-mn[k]}}' /tmp/c.txt | P
}
for rep in 1 2; do
run "decode fp8 zc dispatch, rep $rep" FABEP_BENCH_ZERO_COPY=1 $D/fb_t -o dispatch -f fp8 -t 128 -I 300
run "decode combine bf16, rep $rep" X=1 $D/fb_t -o combine -f bf16 -t 128 -I 300
run "decode bf16 copy dispatch, rep $rep" X=1 $D/fb_t -o dispatch -f bf16 -t 128 -I 300
done
echo "## kernel alone: fp8 quant of 128 rows of 7168, 8 threads"
$D/fb_t -o kernels -K fp8_quant_bf16_b128 -B 1792K -T 8 -I 300 -m 2>&1 | grep -E "^op|median" | head -3
$D/fb_t -o kernels -K fp8_quant_bf16_b128 -B 1792K -T 1 -I 300 -m 2>&1 | grep -E "^op|median" | head -3
cat /proc/loadavg
