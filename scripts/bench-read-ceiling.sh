#!/bin/bash
# The NBD read ceiling (issue 20) of this machine with fio's nbd engine: 4 KiB random read at QD32
# and QD1 against servers that do no device I/O (nbdkit null and memory), against lamina
# with its memory cache warm and cold (memory_cache_bytes = 0), and fio io_uring O_DIRECT
# on lamina's own pool file, over the range its data fills (the device). Two more rows
# bound what a server can do here: qemu-nbd without its cache (--cache=none
# --aio=io_uring, O_DIRECT) serving that same file read-only over the same range (a peer's
# cache miss), and lamina reading a volume never written (its cost per request when no
# block is looked up, copied or sent: the replies are holes). Rounds interleaved; server
# CPU us/op from /proc/PID/stat.
# Why the device row reads lamina's file and not a copy of the data: this machine's disk
# is virtual and the host caches a few GiB of it. A file read in the last minutes reads
# at up to 3 x the speed of one that was not (fio QD32 on lamina's pool file: 28.0K IOPS
# on a first pass, 72.7K on the next; 2026-11-29), so a ceiling measured on another file
# compares two different host cache states.
# Usage: scripts/bench-read-ceiling.sh LAMINA_BINARY (ROUNDS, default 3; RUNTIME seconds, default 6;
# BENCH_DIR, default /tmp/lamina-bench-read-ceiling). Needs fio and nbdkit.
set -u
. "$(dirname "$0")/bench-lib.sh"
BIN=$1; ROUNDS=${ROUNDS:-3}; RT=${RUNTIME:-6}; D=${BENCH_DIR:-/tmp/lamina-bench-read-ceiling}
mkdir -p $D; OUT=$D/results.txt; : > $OUT
SIZE=2G
fiojob() { # label pid target args
  local label=$1 pid=$2 target=$3; shift 3
  local c0=0; [ "$pid" != - ] && c0=$(cpu_of $pid)
  fio --name=t $target --bs=4k --size=${JOB_SIZE:-$SIZE} --time_based --runtime=$RT --ramp_time=1 --randrepeat=0 --norandommap "$@" --output-format=json > $D/last.json 2>/dev/null
  local c1=0; [ "$pid" != - ] && c1=$(cpu_of $pid)
  python3 - $label "$*" $c0 $c1 $RT $D/last.json >> $OUT <<'PY'
import json,sys
label,args,c0,c1,rt,f=sys.argv[1:]
t=open(f).read(); j=json.loads(t[t.index('{'):])['jobs'][0]; r=j['read']
pct=r['clat_ns'].get('percentile',{})
ops=r['iops']*(float(rt)+1); cpu=(float(c1)-float(c0))/100*1e6
print(f"{label} qd={args.split('iodepth=')[1].split()[0]} iops={r['iops']:.0f} p50={pct.get('50.000000',0)/1000:.1f} p99={pct.get('99.000000',0)/1000:.1f} cpu_us_per_op={(cpu/ops if ops and float(c1)>0 else 0):.2f}")
PY
  tail -1 $OUT
}
both() { fiojob "$@" --rw=randread --iodepth=32; fiojob "$@" --rw=randread --iodepth=1; }
# lamina pool with 2 GiB of data
DATA=$D/data; SOCK=$DATA/nbd.sock; URI="nbd+unix:///default?socket=$SOCK"
cold=$D/cold.toml; warm=$D/warm.toml
printf '[web]\naddress = ""\n[server]\ntcp_address = ""\n[pool]\ndefault_volume_bytes = 2147483648\n[limits]\nmemory_cache_bytes = 0\n' > $cold
printf '[web]\naddress = ""\n[server]\ntcp_address = ""\n[pool]\ndefault_volume_bytes = 2147483648\n[limits]\nmemory_cache_bytes = 3221225472\n' > $warm
prefill_pool $BIN $DATA $cold 6G $SIZE
# The range of the pool file the data fills (segments are taken from the start).
USED=$($BIN pool status --data $DATA --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["used_bytes"] // 1048576 + 1)')M
NS=$D/nbdkit.sock
for round in $(seq 1 $ROUNDS); do
  echo "round $round $(uptime)" >> $OUT
  rm -f $NS; nbdkit -U $NS -f null size=$SIZE & pid=$!; while [ ! -S $NS ]; do sleep 0.1; done
  both nbdkit-null $pid "--ioengine=nbd --uri=nbd+unix:///?socket=$NS"; kill $pid; wait $pid 2>/dev/null
  rm -f $NS; nbdkit -U $NS -f memory size=$SIZE & pid=$!; while [ ! -S $NS ]; do sleep 0.1; done
  fio --name=fill --ioengine=nbd --uri="nbd+unix:///?socket=$NS" --rw=write --bs=1M --size=$SIZE --iodepth=8 --refill_buffers >/dev/null 2>&1
  both nbdkit-memory $pid "--ioengine=nbd --uri=nbd+unix:///?socket=$NS"; kill $pid; wait $pid 2>/dev/null
  $BIN serve --data $DATA --config $warm >$D/serve-warm.log 2>&1 & pid=$!
  wait_for_socket $SOCK
  fio --name=warm --ioengine=nbd --uri="$URI" --rw=read --bs=1M --size=$SIZE --iodepth=8 >/dev/null 2>&1
  both lamina-warm $pid "--ioengine=nbd --uri=$URI"
  $BIN volume create --data $DATA holes $SIZE >/dev/null 2>&1 || true
  both lamina-holes $pid "--ioengine=nbd --uri=nbd+unix:///holes?socket=$SOCK"; kill -INT $pid; wait $pid
  $BIN serve --data $DATA --config $cold >$D/serve-cold.log 2>&1 & pid=$!
  wait_for_socket $SOCK
  both lamina-cold $pid "--ioengine=nbd --uri=$URI"; kill -INT $pid; wait $pid
  JOB_SIZE=$USED both device - "--filename=$DATA/flash.img --ioengine=io_uring --direct=1 --readonly"
  QS=$D/qemu.sock; rm -f $QS
  qemu-nbd -t -k $QS -r -f raw --cache=none --aio=io_uring -x cold $DATA/flash.img & pid=$!
  while [ ! -S $QS ]; do sleep 0.1; done
  JOB_SIZE=$USED both qemu-nbd-cold $pid "--ioengine=nbd --uri=nbd+unix:///cold?socket=$QS"; kill $pid; wait $pid 2>/dev/null
done
