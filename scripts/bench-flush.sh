#!/bin/bash
# Synchronous 4 KiB writes side by side (issue 46): fio --ioengine=nbd
# --rw=randwrite --bs=4k --iodepth=1 --fsync=1 against each lamina build given
# (a fresh embedded pool file of 4 GiB, its 1 GiB default volume), qemu-nbd
# (--cache=none --aio=io_uring) and nbdkit file, both on a fully written 1 GiB
# file. Prints, per server and round: write+flush pairs per second, fio's write
# and FLUSH latency, and server CPU per pair; for lamina builds that report it,
# the mean time per device flush in each stage (pool status, flush_stages).
# A script rather than a lamina-bench preset: fio's sync latencies and the
# stage breakdown are not in lamina-bench's compare profiles yet.
#
# Usage: scripts/bench-flush.sh ROUNDS SECONDS LABEL=LAMINA_BINARY...
# A label ending in "+nomarker" runs its build with
# LAMINA_MEASURE_NO_FLUSH_MARKER=1 (measurement builds only).
set -u
ROUNDS=${1:?rounds}; RUN_SECONDS=${2:?seconds}; shift 2
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench-flush.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cpu_ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
wait_export() { # uri
  for _ in $(seq 1 200); do nbdinfo --size "$1" >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "no export at $1" >&2; return 1
}
measure() { # label uri pid
  local before after
  before=$(cpu_ticks "$3")
  fio --name=sync --ioengine=nbd --uri="$2" --rw=randwrite --bs=4k --iodepth=1 --fsync=1 \
      --runtime="$RUN_SECONDS" --time_based --size=1G --output-format=json > "$WORK/fio.json" 2>/dev/null
  after=$(cpu_ticks "$3")
  python3 - "$1" "$before" "$after" "$WORK/fio.json" "$(getconf CLK_TCK)" <<'PY'
import json, sys
label, before, after, path, ticks_per_second = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
text = open(path).read()
job = json.loads(text[text.index('{'):])['jobs'][0]
write, flush = job['write'], job['sync']
percentile = lambda latency, key: latency['percentile'][key] / 1000
pairs = write['total_ios']
cpu_us = (after - before) / ticks_per_second / pairs * 1e6 if pairs else float('nan')
print(f"{label:24s} pairs/s {write['iops']:7.0f}  write p50 {percentile(write['clat_ns'], '50.000000'):5.0f}  "
      f"flush p50 {percentile(flush['lat_ns'], '50.000000'):5.0f} p99 {percentile(flush['lat_ns'], '99.000000'):6.0f} us  "
      f"cpu/pair {cpu_us:5.1f} us")
PY
}
stages() { # label data_dir binary
  "$3" pool status --json --data "$2" 2>/dev/null | python3 -c '
import json, sys
try:
    stages = json.load(sys.stdin)["flush_stages"]
except Exception:
    sys.exit(0)
count = stages["device_flushes"] or 1
names = ["batch_writes", "flush_lock", "capacity_flush", "marker_write", "device_flush"]
print("  stages, mean us per device flush (%d, %d covered): " % (stages["device_flushes"], stages["covered_flushes"])
      + ", ".join("%s %.0f" % (name, stages[name + "_microseconds"] / count) for name in names))'
}
run_lamina() { # label binary
  local data="$WORK/lamina" environment=LAMINA_BENCH=1
  [[ $1 == *+nomarker ]] && environment=LAMINA_MEASURE_NO_FLUSH_MARKER=1
  rm -rf "$data"; mkdir -p "$data"
  printf 'data_dir = "%s"\n[server]\ntcp_address = ""\n[pool]\nembedded_size_bytes = 4294967296\ndefault_volume_bytes = 1073741824\n' "$data" > "$WORK/lamina.toml"
  env "$environment" "$2" serve --config "$WORK/lamina.toml" > "$WORK/lamina.log" 2>&1 & local pid=$!
  local uri="nbd+unix:///default?socket=$data/nbd.sock"
  wait_export "$uri" && measure "$1" "$uri" "$pid" && stages "$1" "$data" "$2"
  kill "$pid"; wait "$pid" 2>/dev/null
}
written_file() { dd if=/dev/urandom of="$WORK/peer.img" bs=4M count=256 status=none; sync "$WORK/peer.img"; }
run_peer() { # label command...
  local label=$1; shift
  written_file; rm -f "$WORK/peer.sock"
  "$@" & local pid=$!
  local uri="nbd+unix:///?socket=$WORK/peer.sock"
  wait_export "$uri" && measure "$label" "$uri" "$pid"
  kill "$pid"; wait "$pid" 2>/dev/null
}
for round in $(seq 1 "$ROUNDS"); do
  echo "# round $round $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
  for build in "$@"; do run_lamina "${build%%=*}" "${build#*=}"; done
  run_peer "qemu-nbd written" qemu-nbd -t --cache=none --aio=io_uring -f raw -k "$WORK/peer.sock" "$WORK/peer.img"
  run_peer "nbdkit file written" nbdkit -f -U "$WORK/peer.sock" file "$WORK/peer.img"
done
