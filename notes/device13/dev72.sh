#!/bin/bash
# session 13 device run 72: the final library of this session (2bd350e,
# built --disable-shared; its EP path is session 11's, 88e3028): the
# issue's table (decode two repetitions, prefill one), then the new
# allreduce/arnorm --check and fabep_demo at 8 and 16 ranks, forked and
# under mpirun, and MoE --check at 8 ranks.  Also: does this machine have
# an RDMA device (verbs)?  Run as: dev72.sh table; dev72.sh checks
C=$PWD/.carry
mkdir -p /tmp/fl && for d in $C/debs/*.deb; do dpkg -x $d /tmp/fl; done
export LD_LIBRARY_PATH=/tmp/fl/usr/lib/x86_64-linux-gnu:/tmp/fl/lib/x86_64-linux-gnu
export FI_PROVIDER_PATH=/tmp/fl/usr/lib/x86_64-linux-gnu/libfabric
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "#### RDMA devices: $(ls /sys/class/infiniband | wc -l) in /sys/class/infiniband"
$C/finfo -p verbs 2>&1 | tail -1
nproc; grep -m1 "model name" /proc/cpuinfo; cat /proc/loadavg
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|min_us|ref_live_us|ratio_live|ceiling_live|ceiling_overlap|channels|check):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p shm"
one() { local name=$1 t=$2 it=$3; shift 3; echo -n "$name: "; timeout 100 env "$@" $C/fb $ARGS -t $t -I $it $M 2>&1 | S; }
phases() {
  ARGS="-o dispatch -f bf16"; one "dispatch bf16 zc sb" $1 $2 FABEP_BENCH_ZERO_COPY=1 FABEP_BENCH_SEND_BUFFER=1
  ARGS="-o dispatch -f bf16"; one "dispatch bf16 zc" $1 $2 FABEP_BENCH_ZERO_COPY=1
  ARGS="-o dispatch -f bf16"; one "dispatch bf16 copy" $1 $2 X=1
  ARGS="-o dispatch -f fp8"; one "dispatch fp8 zc" $1 $2 FABEP_BENCH_ZERO_COPY=1
  ARGS="-o dispatch -f fp8"; one "dispatch fp8 copy" $1 $2 X=1
  ARGS="-o dispatch -f fp8pre"; one "dispatch fp8pre zc sb" $1 $2 FABEP_BENCH_ZERO_COPY=1 FABEP_BENCH_SEND_BUFFER=1
  ARGS="-o combine -f bf16"; one "combine bf16" $1 $2 X=1
  ARGS="-o combine -f fp8"; one "combine fp8" $1 $2 X=1
}
if [ "${1:-all}" != checks ]; then
for rep in 1 2; do echo "#### table decode rep $rep"; phases 128 100; done
echo "#### table prefill"; phases 4096 5
cat /proc/loadavg
fi
[ "${1:-all}" = table ] && exit 0
t() { echo "### $*"; timeout 120 "$@" 2>&1 | grep -v "^#" | tail -12; echo "rc=${PIPESTATUS[0]}"; }
echo "#### checks"
for n in 2 8; do for op in allreduce arnorm; do for r in 1 128 1024; do
  t $C/fb -o $op -n $n -p shm --rows $r --check -m -I 5
done; done; done
for r in 16 4096; do t $C/fb -o arnorm -n 16 -p shm -f fp32 --rows $r --cols 2880 --check -m -I 3; done
t $C/fdemo -n 8 -I 20
t $C/fdemo -n 16 -t 32 -H 7168 -k 8 -e 256 -I 10
t $C/fb -o moe -n 8 -t 128 -H 7168 -k 8 -e 256 -f fp8 -I 10 --check -m -p shm
export FABEP_ROOT=127.0.0.1:29517 FABEP_HEAP_SIZE=1G FABEP_TIMEOUT_MS=60000
X="-x FABEP_ROOT -x FABEP_HEAP_SIZE -x LD_LIBRARY_PATH -x FI_PROVIDER_PATH -x FABEP_TIMEOUT_MS"
for r in 16 1024; do for op in allreduce arnorm; do
  t mpirun --oversubscribe -np 8 $X $C/fb -o $op --rows $r --check -m -I 5
done; done
t mpirun --oversubscribe -np 8 $X $C/fb -o moe -t 128 -H 7168 -k 8 -e 256 -f bf16 -I 10 --check -m
cat /proc/loadavg
