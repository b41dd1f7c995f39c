#!/bin/bash
# Scaling with connections (issue 20, goal 4): random 4 KiB reads (memory cache
# warm) and writes through N NBD connections at once (fio --ioengine=nbd, one
# connection per job, --numjobs=N, QD32/N per connection so that the total
# queue depth stays 32), for each lamina binary given, side by side. Reports
# total IOPS, p99 over all jobs and the server's CPU µs per operation
# (utime+stime from /proc/PID/stat).
# Usage: scripts/bench-connections.sh RUNS LABEL=LAMINA_BINARY...
# (RUNTIME=seconds per point, default 8; CONNECTIONS="1 2 4 8";
#  BENCH_DIR, default /tmp/lamina-bench-connections.)
set -u
. "$(dirname "$0")/bench-lib.sh"
B=${BENCH_DIR:-/tmp/lamina-bench-connections}
mkdir -p $B
RUNS=$1; shift
SIZE=1G
RUNTIME=${RUNTIME:-8}
CONNECTIONS=${CONNECTIONS:-"1 2 4 8"}
OUT=$B/results.txt
DATA=$B/data
SOCK=$DATA/nbd.sock
URI="nbd+unix:///default?socket=$SOCK"
cfg=$B/lamina.toml
# A 2 GiB cache over a 1 GiB volume: every read is a hit once warm.
printf '[web]\naddress = ""\n[server]\ntcp_address = ""\n[pool]\ndefault_volume_bytes = 1073741824\n[limits]\nmemory_cache_bytes = 2147483648\n' > $cfg
first_bin=${1#*=}
prefill_pool $first_bin $DATA $cfg 4G $SIZE
run_one() { # label workload connections pid fio-args...
  local label=$1 wl=$2 n=$3 pid=$4; shift 4
  local depth=$((32 / n)) c0 c1
  c0=$(cpu_of $pid)
  fio --name=t --ioengine=nbd --uri="$URI" --bs=4k --size=$SIZE --time_based \
    --runtime=$RUNTIME --ramp_time=1 --randrepeat=0 --norandommap \
    --numjobs=$n --iodepth=$depth --group_reporting "$@" \
    --output-format=json > $B/last.json 2>/dev/null
  c1=$(cpu_of $pid)
  python3 - "$label" "$wl" "$n" "$c0" "$c1" "$RUNTIME" "$B/last.json" >> $OUT <<'PY'
import json, sys
label, wl, n, c0, c1, rt, path = sys.argv[1:]
t = open(path).read(); j = json.loads(t[t.index('{'):])['jobs'][0]
iops = sum(j[d]['iops'] for d in ('read', 'write'))
r = j['read'] if j['read']['total_ios'] else j['write']
pct = r['clat_ns'].get('percentile', {})
p50 = pct.get('50.000000', 0) / 1000; p99 = pct.get('99.000000', 0) / 1000
cpu_us = (float(c1) - float(c0)) / 100.0 * 1e6
# The CPU covers the ramp and the run; fio's IOPS the run: scale by the share.
ops = iops * (float(rt) + 1)
print(f"{label} {wl} connections={n} iops={iops:.0f} p50={p50:.1f} p99={p99:.1f} "
      f"cpu_us_per_op={cpu_us / ops if ops else 0:.2f}")
PY
  tail -1 $OUT
}
for run in $(seq 1 $RUNS); do
  for spec in "$@"; do
    uptime | tee -a $OUT
    label=${spec%%=*}; bin=${spec#*=}
    $bin serve --data $DATA --config $cfg >$B/serve-$label.log 2>&1 & pid=$!
    wait_for_socket $SOCK
    # Warm the cache (the prefill's blocks were cached before the restart).
    fio --name=warm --ioengine=nbd --uri="$URI" --rw=read --bs=1M --size=$SIZE --iodepth=8 >/dev/null
    for n in $CONNECTIONS; do
      run_one $label randread $n $pid --rw=randread
      run_one $label randwrite $n $pid --rw=randwrite
    done
    kill -INT $pid; wait $pid
  done
done
