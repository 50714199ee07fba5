#!/bin/bash
# session 9 device run 60: on a lease still slow with the final library:
# per-call phase times (fb_fin) and the joined runs' trace (fb_jw).
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
M="-n 2 -H 7168 -k 8 -e 256 -p shm -t 128"
cat /proc/loadavg
pc() { grep "$1: call" | awk '{for(i=1;i<=NF;i++) if($i ~ /^(pack|put|wait|build|reduce|sum)$/) print $i, $(i+1)}' | sort -k1,1 -k2,2n | awk '{v[$1]=v[$1]" "$2} END {for (k in v) {n=split(v[k],a," "); printf "%s p50 %s p90 %s p99 %s\n", k, a[int(n/2)], a[int(n*0.9)], a[int(n*0.99)]}}'; }
for rep in 1 2; do
echo "## fin dispatch fp8 zc per call"
FABEP_LOG=debug FABEP_BENCH_ZERO_COPY=1 timeout 100 $D/fb_fin -o dispatch -f fp8 $M -I 200 -m > /tmp/a.txt 2>&1
grep "^op:" /tmp/a.txt | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|ratio_live):$/ {printf "%s %s ", $1, $2} END {print ""}'
pc dispatch < /tmp/a.txt
echo "## fin combine bf16 per call"
FABEP_LOG=debug timeout 100 $D/fb_fin -o combine -f bf16 $M -I 200 -m > /tmp/a.txt 2>&1
grep "^op:" /tmp/a.txt | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|ratio_live):$/ {printf "%s %s ", $1, $2} END {print ""}'
pc combine < /tmp/a.txt
done
grep "combine: call" /tmp/a.txt | sed -n '200,203p'
q() { awk -v f=$1 '{for(i=1;i<=NF;i++) if($i==f) print $(i+1)}' | sort -n | awk '{v[NR]=$1} END {printf "n %d p50 %s p90 %s p99 %s max %s\n", NR, v[int(NR*0.5)+1], v[int(NR*0.9)+1], v[int(NR*0.99)+1], v[NR]}'; }
echo "## jw dispatch fp8 zc"
FEP_POOL_TRACE=1 FABEP_BENCH_ZERO_COPY=1 timeout 100 $D/fb_jw -o dispatch -f fp8 $M -I 200 -m > /tmp/jw.txt 2>&1
grep "^op:" /tmp/jw.txt | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|ratio_live):$/ {printf "%s %s ", $1, $2} END {print ""}'
echo -n "total: "; grep "^JW" /tmp/jw.txt | q total
echo -n "close->last: "; grep "^JW" /tmp/jw.txt | q close
grep "^JW" /tmp/jw.txt | awk '$5 > 100 {n++} END {print "runs with close->last > 100 us:", n+0, "of", NR}'
cat /proc/loadavg; awk '/^cpu /{print "steal", $9, "idle", $5, "user", $2, "sys", $4}' /proc/stat
