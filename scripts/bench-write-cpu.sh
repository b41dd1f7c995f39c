#!/bin/bash
# Server CPU per 4 KiB random write (issue 20, goal 2; decision 0045): for each
# LABEL=LAMINA_BINARY, a fresh 4 GiB embedded pool with a 1 GiB volume (memory
# cache off) filled once through NBD, then RUNS_PER_POOL (default 3) fio runs of
# 4 KiB random writes at QD32 for RUNTIME seconds (default 8); the later runs
# find the cleaner busy, so compare runs of the same position between builds.
# nbdkit memory (1 GiB, filled the same way) is measured in every round as the
# peer. Rounds interleave the servers. Prints one line per run: label, run,
# IOPS, server CPU us per write (utime + stime from /proc/PID/stat over fio's
# completed writes). RW=randrw measures the 70/30 mix instead (rwmixread=70;
# CPU per operation, reads and writes counted together).
# Usage: scripts/bench-write-cpu.sh ROUNDS LABEL=LAMINA_BINARY... (BENCH_DIR,
# default /tmp/lamina-bench-write-cpu). Needs fio and nbdkit.
set -u
. "$(dirname "$0")/bench-lib.sh"
ROUNDS=$1; shift
RT=${RUNTIME:-8}; RUNS_PER_POOL=${RUNS_PER_POOL:-3}; RW=${RW:-randwrite}
B=${BENCH_DIR:-/tmp/lamina-bench-write-cpu}
mkdir -p $B

# label pid uri: RUNS_PER_POOL timed random-write runs against one server.
timed_writes() {
  local label=$1 pid=$2 uri=$3 run c0 c1
  for run in $(seq 1 $RUNS_PER_POOL); do
    c0=$(cpu_of $pid)
    fio --name=t --ioengine=nbd --uri="$uri" --bs=4k --size=1G --time_based --runtime=$RT \
      --randrepeat=0 --norandommap --rw=$RW --rwmixread=70 --iodepth=32 --output-format=json > $B/last.json 2>/dev/null
    c1=$(cpu_of $pid)
    python3 - $label $run $c0 $c1 $B/last.json <<'PY'
import json, sys
label, run, c0, c1, path = sys.argv[1:]
text = open(path).read(); job = json.loads(text[text.index('{'):])['jobs'][0]
iops = job['read']['iops'] + job['write']['iops']
operations = job['read']['total_ios'] + job['write']['total_ios']
cpu_us = (float(c1) - float(c0)) / 100 * 1e6
print(f"{label} run={run} iops={iops:.0f} cpu_us_per_op={cpu_us / operations:.2f}")
PY
  done
}

fill() { fio --name=fill --ioengine=nbd --uri="$1" --rw=write --bs=1M --size=1G --iodepth=8 --refill_buffers >/dev/null 2>&1; }

for round in $(seq 1 $ROUNDS); do
  echo "round $round $(uptime)"
  for spec in "$@"; do
    label=${spec%%=*}; bin=${spec#*=}; D=$B/$label
    rm -rf $D; mkdir -p $D/data
    printf '[web]\naddress = ""\n[server]\ntcp_address = ""\n[pool]\nembedded_size_bytes = 4294967296\ndefault_volume_bytes = 1073741824\n[limits]\nmemory_cache_bytes = 0\n' > $D/lamina.toml
    $bin serve --data $D/data --config $D/lamina.toml > $D/serve.log 2>&1 & pid=$!
    wait_for_socket $D/data/nbd.sock
    uri="nbd+unix:///default?socket=$D/data/nbd.sock"
    fill "$uri"
    timed_writes $label $pid "$uri"
    kill -INT $pid; wait $pid
  done
  NS=$B/nbdkit.sock; rm -f $NS
  nbdkit -U $NS -f memory size=1G & pid=$!
  while [ ! -S $NS ]; do sleep 0.1; done
  fill "nbd+unix:///?socket=$NS"
  timed_writes nbdkit-memory $pid "nbd+unix:///?socket=$NS"
  kill $pid; wait $pid 2>/dev/null
done
