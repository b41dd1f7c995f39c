#!/bin/bash
# Interleaved A/B of lamina builds on 4 KiB random reads (issue 20): per round, nbdkit
# memory (2 GiB, filled) and then each LABEL=LAMINA_BINARY with its memory cache warm (3 GiB
# cache, the 2 GiB volume read through once after the start) and cold (memory_cache_bytes =
# 0), QD32 and QD1 each. One pool (6 GiB file, 2 GiB volume of random data) made by the
# first binary and shared. Prints label, depth, IOPS, p50, p99 and server CPU us/op
# (utime + stime from /proc/PID/stat over fio's run, ramp included).
# Usage: scripts/bench-read-ab.sh ROUNDS LABEL=LAMINA_BINARY... (RUNTIME seconds, default 6;
# BENCH_DIR, default /tmp/lamina-bench-read-ab; SKIP_WARM=1 or SKIP_COLD=1 to leave one
# out). Needs fio and nbdkit.
set -u
. "$(dirname "$0")/bench-lib.sh"
ROUNDS=$1; shift; RT=${RUNTIME:-6}; D=${BENCH_DIR:-/tmp/lamina-bench-read-ab}; SIZE=2G
mkdir -p $D; OUT=$D/results.txt; : > $OUT
fiojob() { # label pid target fio-args...
  local label=$1 pid=$2 target=$3; shift 3; local c0; c0=$(cpu_of $pid)
  fio --name=t $target --bs=4k --size=$SIZE --time_based --runtime=$RT --ramp_time=1 --randrepeat=0 \
    --norandommap "$@" --output-format=json > $D/last.json 2>/dev/null
  local c1; c1=$(cpu_of $pid)
  python3 - $label "$*" $c0 $c1 $RT $D/last.json >> $OUT <<'PY'
import json, sys
label, args, c0, c1, rt, path = sys.argv[1:]
text = open(path).read(); read = json.loads(text[text.index('{'):])['jobs'][0]['read']
percentiles = read['clat_ns'].get('percentile', {})
operations = read['iops'] * (float(rt) + 1); cpu_us = (float(c1) - float(c0)) / 100 * 1e6
print(f"{label} qd={args.split('iodepth=')[1].split()[0]} iops={read['iops']:.0f} "
      f"p50={percentiles.get('50.000000', 0) / 1000:.1f} p99={percentiles.get('99.000000', 0) / 1000:.1f} "
      f"cpu_us_per_op={cpu_us / operations:.2f}")
PY
  tail -1 $OUT; }
both() { fiojob "$@" --rw=randread --iodepth=32; fiojob "$@" --rw=randread --iodepth=1; }
DATA=$D/data; SOCK=$DATA/nbd.sock; URI="nbd+unix:///default?socket=$SOCK"
cold=$D/cold.toml; warm=$D/warm.toml
printf '[web]\naddress = ""\n[server]\ntcp_address = ""\n[pool]\ndefault_volume_bytes = 2147483648\n[limits]\nmemory_cache_bytes = 0\n' > $cold
printf '[web]\naddress = ""\n[server]\ntcp_address = ""\n[pool]\ndefault_volume_bytes = 2147483648\n[limits]\nmemory_cache_bytes = 3221225472\n' > $warm
prefill_pool ${1#*=} $DATA $cold 6G $SIZE
NS=$D/nbdkit.sock
for round in $(seq 1 $ROUNDS); do
  echo "round $round $(uptime)" | tee -a $OUT
  rm -f $NS; nbdkit -U $NS -f memory size=$SIZE & pid=$!; while [ ! -S $NS ]; do sleep 0.1; done
  fio --name=fill --ioengine=nbd --uri="nbd+unix:///?socket=$NS" --rw=write --bs=1M --size=$SIZE --iodepth=8 --refill_buffers >/dev/null 2>&1
  both nbdkit-memory $pid "--ioengine=nbd --uri=nbd+unix:///?socket=$NS"; kill $pid; wait $pid 2>/dev/null
  for spec in "$@"; do
    label=${spec%%=*}; bin=${spec#*=}
    if [ -z "${SKIP_WARM:-}" ]; then
      $bin serve --data $DATA --config $warm >$D/serve-warm.log 2>&1 & pid=$!
      wait_for_socket $SOCK
      fio --name=warm --ioengine=nbd --uri="$URI" --rw=read --bs=1M --size=$SIZE --iodepth=8 >/dev/null 2>&1
      both $label-warm $pid "--ioengine=nbd --uri=$URI"; kill -INT $pid; wait $pid
    fi
    if [ -z "${SKIP_COLD:-}" ]; then
      $bin serve --data $DATA --config $cold >$D/serve-cold.log 2>&1 & pid=$!
      wait_for_socket $SOCK
      both $label-cold $pid "--ioengine=nbd --uri=$URI"; kill -INT $pid; wait $pid
    fi
  done
done
