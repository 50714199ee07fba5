#!/bin/bash
# session 9 device run 53: where a slow lease's threads spend the time:
# per-thread run delay (/proc/*/task/*/schedstat: on CPU ns, runqueue wait
# ns, slices) and context switches over the phase's loop.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|min_us|ratio_live|channels|check):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
snap() { for p in $(pgrep -f "fb_new -o dispatch"); do for t in /proc/$p/task/*; do
  echo "$p $(basename $t) $(cat $t/schedstat 2>/dev/null) $(grep -E '^(voluntary|nonvoluntary)_ctxt' $t/status 2>/dev/null | awk '{printf "%s ", $2}') $(awk '{print $39}' $t/stat 2>/dev/null)"; done; done; }
run() {
  FABEP_BENCH_ZERO_COPY=1 timeout 100 $D/fb_new -o dispatch -f fp8 -t 128 -I 800 -n 2 -H 7168 -k 8 -e 256 -m -p shm "$@" > /tmp/o.txt 2>&1 &
  sleep 3; snap > /tmp/s0.txt; sleep 3; snap > /tmp/s1.txt; wait
  S < /tmp/o.txt
  join <(awk '{print $1"/"$2, $3, $4, $5, $6, $7}' /tmp/s0.txt | sort) <(awk '{print $1"/"$2, $3, $4, $5, $6, $7, $8}' /tmp/s1.txt | sort) | awk '{printf "%s oncpu %.0f ms rqwait %.1f ms slices %d vcs %d nvcs %d cpu %s\n", $1, ($7-$2)/1e6, ($8-$3)/1e6, $9-$4, $10-$5, $11-$6, $12; w+=($8-$3); c+=($7-$2)} END {printf "total oncpu %.0f ms rqwait %.1f ms over 3 s\n", c/1e6, w/1e6}'
}
cat /proc/loadavg
echo "## T8"; run
echo "## T8 again"; run
cat /proc/loadavg
