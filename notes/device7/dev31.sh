#!/bin/bash
# session 7 device run 31: decode-sized channel writes: slices spread over
# their own 2 MiB regions (one page table each), and THP on the buffers.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
cat /sys/kernel/mm/transparent_hugepage/enabled; uname -r
for rep in 1 2; do
 for S in 1835008 7340032; do
  for P in 1 4 8; do
   for env in "X=1" "CHAN_SPREAD=1" "CHAN_THP=1" "CHAN_THP=1 CHAN_SPREAD=1"; do
    for m in 0 1; do
     echo -n "$env: "; env $env timeout 60 $D/chan $P $S 200 $m 2>&1 | tail -2
    done
   done
  done
 done
done
