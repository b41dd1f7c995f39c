#!/bin/bash
# Whether a concurrent NBD client's load slows the device itself (issue 20, the device row
# of the cache-miss benchmarks): fio io_uring O_DIRECT 4 KiB random reads at QD32 on a
# 2 GiB file of random data, alone and while a second fio drives nbdkit null over NBD at
# 20K, 40K and 70K IOPS (the client's share of a cache-miss run). Three rounds.
# Usage: scripts/bench-device-under-client.sh (BENCH_DIR, default
# /tmp/lamina-bench-device-under-client). Needs fio and nbdkit.
set -u
D=${BENCH_DIR:-/tmp/lamina-bench-device-under-client}; mkdir -p $D; F=$D/device.img
[ -f $F ] || head -c 2G /dev/urandom > $F
dd if=$F of=/dev/null bs=1M 2>/dev/null
report() { python3 - "$1" "$2" <<'PY'
import json, sys
kind, path = sys.argv[1:]
text = open(path).read(); job = json.loads(text[text.index('{'):])['jobs'][0]; read = job['read']
if kind == 'device':
    print(f"device iops={read['iops']:.0f} p50={read['clat_ns']['percentile']['50.000000'] / 1000:.0f}")
else:
    print(f"  client iops={read['iops']:.0f} usr={job['usr_cpu']:.0f}% sys={job['sys_cpu']:.0f}%")
PY
}
device() {
  fio --name=d --filename=$F --ioengine=io_uring --direct=1 --readonly --bs=4k --size=2G --time_based \
    --runtime=6 --ramp_time=1 --randrepeat=0 --norandommap --rw=randread --iodepth=32 \
    --output-format=json > $D/device.json 2>/dev/null
  report device $D/device.json; }
NS=$D/null.sock; rm -f $NS; nbdkit -U $NS -f null size=2G & null_pid=$!
while [ ! -S $NS ]; do sleep 0.1; done
for round in 1 2 3; do
  echo "round $round $(uptime)"
  device
  for rate in 20000 40000 70000; do
    fio --name=c --ioengine=nbd --uri="nbd+unix:///?socket=$NS" --bs=4k --size=2G --time_based --runtime=9 \
      --rw=randread --iodepth=32 --rate_iops=$rate --output-format=json > $D/client.json 2>/dev/null & client_pid=$!
    sleep 1; echo -n "with the client at $rate: "; device; wait $client_pid
    report client $D/client.json
  done
done
kill $null_pid
