#!/usr/bin/env bash
# Cold data compressed harder (issue 44, decision 0074): for each pair of a
# volume codec and a cold codec, a fresh two-tier pool (256 MiB flash file,
# 3 GiB capacity file, 4 MiB segments, memory cache off) and a daemon whose
# config sets `[tiering] cold_compression`; IMAGE (e.g. `mkfs.ext4 -d
# /usr/share IMAGE 1200M`) is copied onto a volume of that codec with
# `nbdcopy --flush`, 4 times flash's size, so that the demoter moves most of
# it to capacity while the copy runs; the run ends at the first of 4 polls
# (0.5 s apart) that find `demoted_blocks` unchanged, and the export is
# compared with the image
# (`qemu-img compare`). Prints one line per round and pair:
#
#   volume_codec cold_codec copy_s until_quiet_s demoted_blocks
#   capacity_used_bytes volume_stored_bytes volume_logical_bytes
#   volume_capacity_bytes server_cpu_s
#
# capacity_used_bytes is `pool status`'s (whole segments); server_cpu_s the
# daemon's utime + stime over the copy and the demotion.
#
#   scripts/bench-cold-compression.sh BINARY IMAGE [ROUNDS] [PAIRS]
#
# Defaults: 3 rounds, pairs "lz4/off lz4/zstd:9 off/off off/zstd:9".
set -euo pipefail
LAMINA=$(realpath "$1"); IMAGE=$(realpath "$2"); ROUNDS=${3:-3}
PAIRS=${4:-"lz4/off lz4/zstd:9 off/off off/zstd:9"}
WORK=$(mktemp -d /tmp/bench-cold-compression.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
SIZE=$(stat -c %s "$IMAGE")
TICKS=$(getconf CLK_TCK)

demoted() {
  "$LAMINA" pool status --data "$1" --json \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["demoted_blocks"])'
}

one_run() {
  local codec=$1 cold=$2 data=$WORK/data
  rm -rf "${WORK:?}"/*
  "$LAMINA" pool create --data "$data" --flash "$WORK/flash.img:256M" \
    --capacity "$WORK/capacity.img:3G" --segment-size 4M --json >/dev/null
  "$LAMINA" volume create img "$SIZE" --compression "$codec" --data "$data" --json >/dev/null
  printf '[server]\ntcp_address = ""\n[limits]\nmemory_cache_bytes = 0\n[tiering]\ncold_compression = "%s"\n' \
    "$cold" >"$WORK/config.toml"
  LAMINA_LOG=warn "$LAMINA" serve --data "$data" --config "$WORK/config.toml" \
    >/dev/null 2>"$WORK/serve.log" &
  local pid=$! uri="nbd+unix:///img?socket=$data/nbd.sock"
  for _ in $(seq 100); do nbdinfo --size "$uri" >/dev/null 2>&1 && break; sleep 0.1; done
  local cpu0 t0 t1 quiet last=-1 same=0 now
  cpu0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  t0=$(date +%s.%N)
  nbdcopy --flush "$IMAGE" "$uri"
  t1=$(date +%s.%N)
  quiet=$t1
  while [ "$same" -lt 4 ]; do
    now=$(demoted "$data")
    if [ "$now" = "$last" ]; then
      [ "$same" -eq 0 ] && quiet=$(date +%s.%N)
      same=$((same + 1))
    else
      same=0
      last=$now
    fi
    sleep 0.5
  done
  local cpu1 status stats
  cpu1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  status=$("$LAMINA" pool status --data "$data" --json)
  stats=$("$LAMINA" volume stats img --data "$data" --json)
  qemu-img compare -q -f raw -F raw "$IMAGE" "$uri" || { echo "export differs from the image" >&2; exit 1; }
  kill "$pid"; wait "$pid" || true
  STATUS=$status STATS=$stats python3 - "$codec" "$cold" "$t0" "$t1" "$quiet" "$cpu0" "$cpu1" "$TICKS" <<'PY'
import json, os, sys
codec, cold, t0, t1, quiet, cpu0, cpu1, ticks = sys.argv[1:]
status, stats = json.loads(os.environ["STATUS"]), json.loads(os.environ["STATS"])
print(codec, cold, "%.1f" % (float(t1) - float(t0)), "%.1f" % (float(quiet) - float(t0)),
      status["demoted_blocks"], status["capacity"]["used_bytes"], stats["stored_bytes"],
      stats["logical_bytes"], stats["capacity_bytes"],
      "%.1f" % ((float(cpu1) - float(cpu0)) / float(ticks)))
PY
}

for _ in $(seq "$ROUNDS"); do
  for pair in $PAIRS; do
    one_run "${pair%%/*}" "${pair#*/}"
  done
done
