#!/bin/bash
# session 8 device run 47: the 1-channel tcp prefill dispatch (608 ms in
# dev46): is it the waits' sleep after 2 ms?  fb_exp2 with FEP_EXP_NOSLEEP
# yields instead of sleeping.  Also the nanosleep(20 us) this VM gives.
D=$(cd $(dirname $0) && pwd)
export LD_LIBRARY_PATH=$D/../ep7/lib
S() { grep -E "^op:|error" | tail -1 | tr ' ' '\n' | paste - - | awk '$1 ~ /^(median_us|min_us|ratio_live|channels):$/ {printf "%s %s ", $1, $2} END {print ""}'; }
B() { timeout 200 "$@" 2>&1 | S; }
M="-n 2 -H 7168 -k 8 -e 256 -m -p tcp -t 4096 -I 3"
python3 -c "
import time
t=time.perf_counter(); n=2000
for i in range(n): time.sleep(20e-6)
print('nanosleep 20us takes %.1f us' % ((time.perf_counter()-t)/n*1e6))" 2>/dev/null || echo no python
for rep in 1 2; do
  echo -n "sleep (default), ch=1: "; B env FABEP_CHANNELS=1 FABEP_BENCH_ZERO_COPY=1 $D/fb_exp2 -o dispatch -f fp8 $M
  echo -n "no sleep, ch=1: "; B env FEP_EXP_NOSLEEP=1 FABEP_CHANNELS=1 FABEP_BENCH_ZERO_COPY=1 $D/fb_exp2 -o dispatch -f fp8 $M
done
echo -n "sleep (default), ch=1, threads 1: "; B env FABEP_THREADS=1 FABEP_CHANNELS=1 FABEP_BENCH_ZERO_COPY=1 $D/fb_exp2 -o dispatch -f fp8 $M
echo -n "sleep, ch=1, decode: "; B env FABEP_CHANNELS=1 FABEP_BENCH_ZERO_COPY=1 $D/fb_exp2 -o dispatch -f fp8 -n 2 -H 7168 -k 8 -e 256 -m -p tcp -t 128 -I 50
echo -n "no sleep, ch=1, decode: "; B env FEP_EXP_NOSLEEP=1 FABEP_CHANNELS=1 FABEP_BENCH_ZERO_COPY=1 $D/fb_exp2 -o dispatch -f fp8 -n 2 -H 7168 -k 8 -e 256 -m -p tcp -t 128 -I 50
echo -n "sleep, shm ch=1 prefill: "; B env FABEP_CHANNELS=1 FABEP_BENCH_ZERO_COPY=1 $D/fb_exp2 -o dispatch -f fp8 -n 2 -H 7168 -k 8 -e 256 -m -p shm -t 4096 -I 3
echo -n "no sleep, shm ch=1 prefill: "; B env FEP_EXP_NOSLEEP=1 FABEP_CHANNELS=1 FABEP_BENCH_ZERO_COPY=1 $D/fb_exp2 -o dispatch -f fp8 -n 2 -H 7168 -k 8 -e 256 -m -p shm -t 4096 -I 3
