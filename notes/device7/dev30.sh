#!/bin/bash
# session 7 device run 30: where decode-sized channel writes lose: each
# thread's own write time, and process_vm_writev called directly (mode 3).
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
for rep in 1 2; do
 for S in 1835008 7340032; do
  for P in 1 2 4 8; do
   for m in 0 3 2; do
    timeout 60 $D/chan $P $S 200 $m 2>&1 | tail -2
   done
  done
 done
done
