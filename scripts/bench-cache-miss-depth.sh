#!/bin/bash
# Where a cache-miss read waits (issue 20, goal 1): 4 KiB random reads against lamina
# with its memory cache off (one connection at QD32 and QD64, two at QD16, four at QD8),
# then fio io_uring O_DIRECT on lamina's own pool file over the range the data fills
# (the device, QD32 and QD16). For each run: fio's IOPS and p50, and from
# /sys/block/$DISK/stat over the run the device's reads a second, its mean queue depth
# (time_in_queue ÷ wall time) and its mean time per read (read ticks ÷ reads), with
# the server's CPU µs per read. Little's law ties them: a server that keeps fewer of
# the client's requests at the device gets fewer IOPS from it.
# Usage: scripts/bench-cache-miss-depth.sh LAMINA_BINARY (RUNTIME seconds, default 6;
# BENCH_DIR, default /tmp/lamina-bench-read-ceiling, shared with bench-read-ceiling.sh;
# DISK, default the disk holding BENCH_DIR). Needs fio.
set -u
. "$(dirname "$0")/bench-lib.sh"
BIN=$1; RT=${RUNTIME:-6}; D=${BENCH_DIR:-/tmp/lamina-bench-read-ceiling}
mkdir -p $D
DISK=${DISK:-$(lsblk -no PKNAME "$(df --output=source $D | tail -1)" 2>/dev/null | head -1)}
[ -n "$DISK" ] || DISK=$(basename "$(df --output=source $D | tail -1)")
DATA=$D/data; SOCK=$DATA/nbd.sock; URI="nbd+unix:///default?socket=$SOCK"
cold=$D/cold.toml
printf '[web]\naddress = ""\n[server]\ntcp_address = ""\n[pool]\ndefault_volume_bytes = 2147483648\n[limits]\nmemory_cache_bytes = 0\n' > $cold
prefill_pool $BIN $DATA $cold 6G 2G
USED=$($BIN pool status --data $DATA --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["used_bytes"] // 1048576 + 1)')M
run() { # label pid fio-args...
  local label=$1 pid=$2; shift 2
  local c0=0 c1=0 t0 t1
  [ "$pid" != - ] && c0=$(cpu_of $pid)
  cat /sys/block/$DISK/stat > $D/stat0; t0=$(date +%s.%N)
  fio --name=t --bs=4k --time_based --runtime=$RT --ramp_time=1 --randrepeat=0 --norandommap \
    --rw=randread --group_reporting "$@" --output-format=json > $D/last.json 2>/dev/null
  cat /sys/block/$DISK/stat > $D/stat1; t1=$(date +%s.%N)
  [ "$pid" != - ] && c1=$(cpu_of $pid)
  python3 - "$label" $c0 $c1 $RT $D/last.json $D/stat0 $D/stat1 $t0 $t1 <<'PY'
import json, sys
label, c0, c1, rt, path, s0, s1, t0, t1 = sys.argv[1:]
a = [int(x) for x in open(s0).read().split()]; b = [int(x) for x in open(s1).read().split()]
wall_ms = (float(t1) - float(t0)) * 1000
reads = b[0] - a[0]; read_ms = b[3] - a[3]; queue_ms = b[10] - a[10]
text = open(path).read(); r = json.loads(text[text.index('{'):])['jobs'][0]['read']
p50 = r['clat_ns'].get('percentile', {}).get('50.000000', 0) / 1000
operations = r['iops'] * (float(rt) + 1); cpu_us = (float(c1) - float(c0)) / 100 * 1e6
cpu = f"{cpu_us / operations:.2f}" if float(c1) > 0 else "-"
print(f"{label:14s} iops={r['iops']:.0f} p50_us={p50:.0f} device_reads_per_s={reads / wall_ms * 1000:.0f} "
      f"device_depth={queue_ms / wall_ms:.1f} device_us_per_read={read_ms / max(reads, 1) * 1000:.0f} server_cpu_us_per_read={cpu}")
PY
}
$BIN serve --data $DATA --config $cold > $D/serve-cold.log 2>&1 & pid=$!
wait_for_socket $SOCK
run lamina-1x32 $pid --ioengine=nbd --uri=$URI --size=2G --iodepth=32
run lamina-1x64 $pid --ioengine=nbd --uri=$URI --size=2G --iodepth=64
run lamina-2x16 $pid --ioengine=nbd --uri=$URI --size=2G --iodepth=16 --numjobs=2
run lamina-4x8 $pid --ioengine=nbd --uri=$URI --size=2G --iodepth=8 --numjobs=4
kill -INT $pid; wait $pid
run device-32 - --filename=$DATA/flash.img --ioengine=io_uring --direct=1 --readonly --size=$USED --iodepth=32
run device-16 - --filename=$DATA/flash.img --ioengine=io_uring --direct=1 --readonly --size=$USED --iodepth=16
