#!/bin/bash
# session 9 device run 52: on a lease whose decode medians are 10x slow:
# host steal time, and fewer threads per rank.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|min_us|ratio_live|channels|check):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
B() { timeout 100 "$@" 2>&1 | S; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
st() { awk '/^cpu /{print "user",$2,"nice",$3,"sys",$4,"idle",$5,"iowait",$6,"irq",$7,"soft",$8,"steal",$9}' /proc/stat; }
cat /proc/loadavg
st; sleep 5; echo "after 5 s idle:"; st
for th in 8 7 6 4; do
  echo -n "T$th dispatch fp8 zc: "; B env FABEP_THREADS=$th FABEP_BENCH_ZERO_COPY=1 $D/fb_new -o dispatch -f fp8 -t 128 -I 100 $M
  st
done
echo -n "T8 again: "; B env FABEP_BENCH_ZERO_COPY=1 $D/fb_new -o dispatch -f fp8 -t 128 -I 100 $M
st
echo "per-cpu steal/idle:"; awk '/^cpu[0-9]/{print $1, "idle", $5, "steal", $9}' /proc/stat | tr '\n' ';'; echo
ps -eo pid,psr,pcpu,stat,comm --sort=-pcpu | head -8
cat /proc/loadavg
