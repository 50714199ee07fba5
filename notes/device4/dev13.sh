#!/bin/bash
# session 4 device run 7 (final: memcpy team started once): every phase with three references (warm, live,
# cold), decode and prefill; plus shm's initiator-copy path (plain writes,
# atomics after the completions: fabep_bench_fast = delivery without
# FI_DELIVERY_COMPLETE, an experiment, not shipped).
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/lib
O=${OUT:-/tmp/out}; mkdir -p $O
B() { timeout 100 "$@" 2>&1 | grep -E "^op:" | tail -1 | cut -c1-900; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
CFGS="d-bf16-copy:dispatch:bf16:0:0 d-bf16-zc:dispatch:bf16:1:0 d-bf16-zc-sb:dispatch:bf16:1:1 d-fp8-copy:dispatch:fp8:0:0 d-fp8-zc:dispatch:fp8:1:0 d-fp8pre-zc-sb:dispatch:fp8pre:1:1 c-bf16:combine:bf16:0:0 c-fp8:combine:fp8:0:0"
FAST=""
run() { # tokens iters reps file
 for rep in $(seq 1 $3); do
  for c in $CFGS; do IFS=: read nm op f z sb <<< "$c"
    echo "## rep=$rep bin=new t=$1 cfg=$nm"
    FABEP_BENCH_ZERO_COPY=$z FABEP_BENCH_SEND_BUFFER=$sb B $D/fabep_bench_new -o $op -t $1 -I $2 -f $f $M
  done
  for c in $FAST; do IFS=: read nm op f z sb <<< "$c"
    echo "## rep=$rep bin=fast t=$1 cfg=$nm"
    FEP_HACK_NODC=1 FABEP_SIGNAL=delivery FABEP_BENCH_ZERO_COPY=$z FABEP_BENCH_SEND_BUFFER=$sb B $D/fabep_bench_fast -o $op -t $1 -I $2 -f $f $M
  done
 done >> $O/$4 2>&1
}
nproc; lscpu | grep -E "Model name|L3|NUMA node|Socket"
run 128 100 3 s_decode.txt
run 4096 5 2 s_prefill.txt
echo done
