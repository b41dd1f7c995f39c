#!/bin/bash
# Cache-miss benchmark (issue 20): lamina servers (memory_cache_bytes = 0, fio
# --ioengine=nbd over the Unix socket) against fio io_uring O_DIRECT on a file of
# the same data (the device ceiling), 4 KiB random read QD32 and QD1, 70/30 and
# random write QD32; server CPU µs/op from utime+stime in /proc/PID/stat.
# The device row reads a separate file, and the host of this virtual machine caches a few
# GiB of its disk: compare it with lamina only when both files were read as recently
# (BENCHMARKS "Where a cache-miss read's time goes"). The writes of the last two
# workloads spread the pool's data over its whole file, so lamina's own file is no
# fairer here; scripts/bench-read-ceiling.sh, which only reads, uses it.
# Usage: scripts/bench-cache-miss.sh RUNS LABEL=LAMINA_BINARY...
# (RUNTIME=seconds per workload, default 10; BENCH_DIR, default /tmp/lamina-bench-cache-miss.)
set -u
. "$(dirname "$0")/bench-lib.sh"
B=${BENCH_DIR:-/tmp/lamina-bench-cache-miss}
mkdir -p $B
RUNS=$1; shift
SIZE=2G
RUNTIME=${RUNTIME:-10}
OUT=$B/results.txt
: > $OUT.raw
DATA=$B/data
SOCK=$DATA/nbd.sock
URI="nbd+unix:///default?socket=$SOCK"
cfg=$B/lamina.toml
printf '[web]\naddress = ""\n[server]\ntcp_address = ""\n[pool]\ndefault_volume_bytes = 2147483648\n[limits]\nmemory_cache_bytes = 0\n' > $cfg
first_bin=${1#*=}
prefill_pool $first_bin $DATA $cfg 6G $SIZE
if [ ! -e $B/device.img ]; then
  fio --name=fill --filename=$B/device.img --ioengine=io_uring --direct=1 --rw=write --bs=1M --size=$SIZE --iodepth=8 --refill_buffers >/dev/null
fi
# workload name, fio args
workloads=(
 "randread32|--rw=randread --iodepth=32"
 "randread1|--rw=randread --iodepth=1"
 "rw7030|--rw=randrw --rwmixread=70 --iodepth=32"
 "randwrite32|--rw=randwrite --iodepth=32"
)
run_one() { # label target workload
  local label=$1 target=$2 wl=$3 args=$4 pid=${5:-}
  local c0=0 c1=0
  [ -n "$pid" ] && c0=$(cpu_of $pid)
  fio --name=t $target --bs=4k --size=$SIZE --time_based --runtime=$RUNTIME --ramp_time=1 --randrepeat=0 --norandommap $args --output-format=json > $B/last.json 2>/dev/null
  [ -n "$pid" ] && c1=$(cpu_of $pid)
  python3 - "$label" "$wl" "$c0" "$c1" "$RUNTIME" "$B/last.json" >> $OUT.raw <<'PY'
import json,sys
label,wl,c0,c1,rt,_=sys.argv[1:]
t=open(sys.argv[6]).read(); j=json.loads(t[t.index('{'):])['jobs'][0]
ios=0; iops=0; p=None
for d in ('read','write'):
    ios+=j[d]['total_ios']; iops+=j[d]['iops']
r=j['read'] if j['read']['total_ios'] else j['write']
pct=r['clat_ns'].get('percentile',{})
p50=pct.get('50.000000',0)/1000; p99=pct.get('99.000000',0)/1000
tck=100.0
cpu_us=(float(c1)-float(c0))/tck*1e6
# CPU covers ramp + runtime; fio's total_ios excludes ramp: scale by runtime share
ops_all=iops*(float(rt)+1)
cpuop=cpu_us/ops_all if ops_all and float(c1)>0 else 0
print(f"{label} {wl} iops={iops:.0f} p50={p50:.1f} p99={p99:.1f} cpu_us_per_op={cpuop:.2f}")
PY
  tail -1 $OUT.raw
}
for run in $(seq 1 $RUNS); do
  uptime | tee -a $OUT.raw
  for spec in "$@"; do
    label=${spec%%=*}; bin=${spec#*=}
    $bin serve --data $DATA --config $cfg >$B/serve-$label.log 2>&1 & pid=$!
    wait_for_socket $SOCK
    for w in "${workloads[@]}"; do
      run_one $label "--ioengine=nbd --uri=$URI" "${w%%|*}" "${w#*|}" $pid
    done
    kill -INT $pid; wait $pid
  done
  for w in "${workloads[@]}"; do
    run_one device "--filename=$B/device.img --ioengine=io_uring --direct=1" "${w%%|*}" "${w#*|}"
  done
done
