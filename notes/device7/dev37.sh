#!/bin/bash
# session 7 device run 37: per-call phase times (FABEP_LOG=debug) of the
# phases still below 0.7 at decode, final library, default channels.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
M="-n 2 -H 7168 -k 8 -e 256 -p shm -t 128 -I 60"
echo "## dispatch fp8 zc"; FABEP_LOG=debug FABEP_BENCH_ZERO_COPY=1 timeout 100 $D/fabep_bench_final -o dispatch -f fp8 $M 2>&1 | grep "dispatch: call" | sed -n '80,92p'
echo "## dispatch fp8pre zc sb"; FABEP_LOG=debug FABEP_BENCH_ZERO_COPY=1 FABEP_BENCH_SEND_BUFFER=1 timeout 100 $D/fabep_bench_final -o dispatch -f fp8pre $M 2>&1 | grep "dispatch: call" | sed -n '80,92p'
echo "## dispatch bf16 copy"; FABEP_LOG=debug timeout 100 $D/fabep_bench_final -o dispatch -f bf16 $M 2>&1 | grep "dispatch: call" | sed -n '80,92p'
echo "## combine fp8"; FABEP_LOG=debug timeout 100 $D/fabep_bench_final -o combine -f fp8 $M 2>&1 | grep "combine: call" | sed -n '80,92p'
echo "## combine bf16"; FABEP_LOG=debug timeout 100 $D/fabep_bench_final -o combine -f bf16 $M 2>&1 | grep "combine: call" | sed -n '80,92p'
