#!/bin/bash
# 4 KiB random reads through one lamina binary under several [server] settings
# (decision 0048: connection threads and their idle spin), each with the memory
# cache warm (3 GiB, the 2 GiB volume read through once) or cold (0). One pool
# (6 GiB file, 2 GiB volume of random data), made once and shared. Prints label,
# depth, IOPS, p50, p99 and server CPU us/op (utime + stime over fio's run, ramp
# included). SERVER_PREFIX and CLIENT_PREFIX wrap the daemon and fio (for example
# "taskset -c 1" and "taskset -c 0" to keep the client off the daemon's core, as
# a remote client is).
# Usage: scripts/bench-read-variants.sh BIN 'LABEL|CACHE_BYTES|SERVER_LINES'...
# (SERVER_LINES: TOML lines for [server], \n between them; QDS, default "1 32";
# RUNTIME, default 5; BENCH_DIR, default /tmp/lamina-bench-read-variants).
# Example: scripts/bench-read-variants.sh target/release/lamina 'cold|0|' \
#   'cold-spin|0|connection_thread_idle_spin_us = 100' 'shared-warm|3221225472|connection_threads = 0'
set -u
. "$(dirname "$0")/bench-lib.sh"
BIN=$1; shift
D=${BENCH_DIR:-/tmp/lamina-bench-read-variants}; RT=${RUNTIME:-5}
DATA=$D/data; SOCK=$DATA/nbd.sock; URI="nbd+unix:///default?socket=$SOCK"
mkdir -p $D
printf '[web]\naddress = ""\n[server]\ntcp_address = ""\n[limits]\nmemory_cache_bytes = 0\n' > $D/prefill.toml
prefill_pool $BIN $DATA $D/prefill.toml 6G 2G
run_variant() { # label cache-bytes server-lines
  local label=$1 cache=$2 extra=$3 pid qd c0 c1
  printf '[web]\naddress = ""\n[server]\ntcp_address = ""\n%b\n[limits]\nmemory_cache_bytes = %s\n' "$extra" "$cache" > $D/variant.toml
  ${SERVER_PREFIX:-} $BIN serve --data $DATA --config $D/variant.toml >$D/variant.log 2>&1 & pid=$!
  wait_for_socket $SOCK
  if [ "$cache" != 0 ]; then
    fio --name=warm --ioengine=nbd --uri="$URI" --rw=read --bs=1M --size=2G --iodepth=8 >/dev/null 2>&1
  fi
  for qd in ${QDS:-1 32}; do
    c0=$(cpu_of $pid)
    ${CLIENT_PREFIX:-} fio --name=t --ioengine=nbd --uri="$URI" --bs=4k --size=2G --time_based --runtime=$RT \
      --ramp_time=1 --randrepeat=0 --norandommap --rw=randread --iodepth=$qd --output-format=json > $D/last.json 2>/dev/null
    c1=$(cpu_of $pid)
    python3 - "$label" $qd $c0 $c1 $RT $D/last.json <<'PY'
import json, sys
label, qd, c0, c1, rt, path = sys.argv[1:]
text = open(path).read(); read = json.loads(text[text.index('{'):])['jobs'][0]['read']
p = read['clat_ns'].get('percentile', {})
operations = read['iops'] * (float(rt) + 1); cpu_us = (float(c1) - float(c0)) / 100 * 1e6
print(f"{label:24s} qd={qd:2s} iops={read['iops']:8.0f} p50={p.get('50.000000', 0) / 1000:6.1f} "
      f"p99={p.get('99.000000', 0) / 1000:7.1f} cpu_us_per_op={cpu_us / operations:6.2f}")
PY
  done
  kill -INT $pid; wait $pid
}
for variant in "$@"; do
  label=${variant%%|*}; rest=${variant#*|}
  run_variant "$label" "${rest%%|*}" "${rest#*|}"
done
