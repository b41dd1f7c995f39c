#!/bin/bash
# Writes io_uring hands to io-wq worker threads on a new pool file (decision
# 0049): a fresh 4 GiB embedded pool (memory cache off), a 1 GiB sequential fill
# through NBD, then one 6 s fio run of 4 KiB random writes at QD32, each under
# `perf stat` of the io_uring submission and io-wq tracepoints of the daemon.
# Prints the fill time, the pool file's allocated and apparent sizes, both
# counts for each phase and the run's IOPS. Needs fio, perf (root) and bc.
# Usage: scripts/bench-write-punts.sh LABEL LAMINA_BINARY (BENCH_DIR, default
# /tmp/lamina-bench-write-punts).
set -u
. "$(dirname "$0")/bench-lib.sh"
label=$1; bin=$2; D=${BENCH_DIR:-/tmp/lamina-bench-write-punts}/$label
rm -rf $D; mkdir -p $D/data
printf '[web]\naddress = ""\n[server]\ntcp_address = ""\n[pool]\nembedded_size_bytes = 4294967296\ndefault_volume_bytes = 1073741824\n[limits]\nmemory_cache_bytes = 0\n' > $D/lamina.toml
$bin serve --data $D/data --config $D/lamina.toml > $D/serve.log 2>&1 & pid=$!
wait_for_socket $D/data/nbd.sock
uri="nbd+unix:///default?socket=$D/data/nbd.sock"
perf stat -e io_uring:io_uring_queue_async_work,io_uring:io_uring_submit_req -p $pid -o $D/fill.perf &
perf_pid=$!
t0=$(date +%s.%N)
fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --size=1G --iodepth=8 --refill_buffers >/dev/null 2>&1
t1=$(date +%s.%N)
kill -INT $perf_pid; wait $perf_pid
perf stat -e io_uring:io_uring_queue_async_work,io_uring:io_uring_submit_req -p $pid -o $D/run.perf &
perf_pid=$!
fio --name=t --ioengine=nbd --uri="$uri" --bs=4k --size=1G --time_based --runtime=6 --randrepeat=0 --norandommap --rw=randwrite --iodepth=32 --output-format=json > $D/run.json 2>/dev/null
kill -INT $perf_pid; wait $perf_pid
echo "$label fill_s=$(echo "$t1 - $t0" | bc) allocated=$(du -h $D/data/pool.img 2>/dev/null | cut -f1) $(du -h --apparent-size $D/data/pool.img | cut -f1)"
grep io_uring $D/fill.perf $D/run.perf
python3 -c "import json;t=open('$D/run.json').read();j=json.loads(t[t.index('{'):])['jobs'][0];print('iops',round(j['write']['iops']))"
kill -INT $pid; wait $pid
rm -rf $D
