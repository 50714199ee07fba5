#!/bin/bash
# session 7 device run 29: several shm channels per rank (own domain, ep,
# cq each; thread j writes slice j to the peer's channel j), 2 ranks both
# writing, against one channel (the raw write) and threaded memcpy.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
nproc; lscpu | grep -E "Model name|NUMA|Socket|L3"
for rep in 1 2; do
 for S in 1835008 58720256; do
  it=200; [ $S -gt 10000000 ] && it=20
  for P in 1 2 4 8; do
   for m in 0 1 2; do
    timeout 60 $D/chan $P $S $it $m 2>&1 | tail -2
   done
  done
 done
done
