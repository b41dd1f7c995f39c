#!/usr/bin/env bash
# Compression through NBD (issue 44, goals 2, 3 and 5's setting): for each
# codec, a fresh lamina daemon (embedded pool, its default volume created
# with that codec, memory cache off so that reads reach the device) is given
# an image made on this machine (IMAGE, e.g. `mkfs.ext4 -d /usr/share`) with
# nbdcopy, then measured with fio --ioengine=nbd, 4 KiB, QD32: random reads
# over the image's data (cache misses), random writes of fio's random bytes
# (incompressible), random writes of fio's compressible buffers
# (buffer_compress_percentage=50: synthetic, as its generator makes them).
# Prints per round, codec and workload: MiB/s or IOPS and the server's CPU
# µs per operation (utime + stime ÷ operations, to 0.1 µs from clock ticks;
# nbdcopy: per 4 KiB block).
#
#   scripts/bench-compression.sh BINARY IMAGE [ROUNDS] [SECONDS] [CODECS]
#
# With CACHE_BYTES set, the memory cache has that size and only random
# reads run, twice (the first warms the cache), the second reporting the
# cache's hits ÷ lookups over it (issue 44, goal 4; a fragment's read looks
# up the one or two blocks it is packed in) and the share of reads served from
# decoded copies without a lookup of packed blocks (decision 0075). IODEPTH
# sets fio's queue depth (default 32), READ_DISTRIBUTION fio's
# random_distribution (default random: uniform; e.g. zipf:1.1 for a hot set).
# COPY_IMAGE=0 leaves the volume empty (IMAGE only sizes it): writes then
# meet no data the codec compressed before, and reads find none.
#
# Defaults: 3 rounds, 10 s per fio run, codecs "off lz4 zstd:1". Codecs
# alternate within each round. Only the processes it starts are stopped, by
# PID. Needs fio, nbdcopy.
set -euo pipefail
BIN=$(realpath "${1:?binary}"); IMAGE=$(realpath "${2:?image}")
ROUNDS=${3:-3}; RUN_SECONDS=${4:-10}; CODECS=${5:-"off lz4 zstd:1"}
. "$(dirname "$0")/bench-lib.sh"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench-compression.XXXXXX")
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
IMAGE_BYTES=$(stat -c %s "$IMAGE")
VOLUME_BYTES=$(( (IMAGE_BYTES + 4095) / 4096 * 4096 ))
POOL_BYTES=$(( VOLUME_BYTES * 3 + (1 << 30) ))

start() {
  local codec=$1
  rm -rf "$WORK/data"; mkdir -p "$WORK/data"
  cat >"$WORK/config.toml" <<CONFIG
[server]
tcp_address = ""
[pool]
embedded_size_bytes = $POOL_BYTES
default_volume_bytes = $VOLUME_BYTES
compression = "$codec"
[limits]
memory_cache_bytes = ${CACHE_BYTES:-0}
CONFIG
  "$BIN" serve --data "$WORK/data" --config "$WORK/config.toml" >"$WORK/serve.log" 2>&1 &
  PID=$!
  wait_for_socket "$WORK/data/nbd.sock"
}

stop() { kill -INT "$PID"; wait "$PID" || true; PID=; }

uri() { echo "nbd+unix:///default?socket=$WORK/data/nbd.sock"; }

# fio JOB_ARGS...: prints IOPS and server CPU µs per operation.
run_fio() {
  local before after output iops operations
  before=$(cpu_of "$PID")
  fio --name=run --ioengine=nbd --uri="$(uri)" --bs=4k --iodepth="${IODEPTH:-32}" \
    --random_distribution="${READ_DISTRIBUTION:-random}" \
    --size="$VOLUME_BYTES" --time_based --runtime="$RUN_SECONDS" \
    --output-format=json --output="$WORK/fio.json" "$@" >"$WORK/fio.log" 2>&1
  after=$(cpu_of "$PID")
  iops=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print(round(j["read"]["iops"]+j["write"]["iops"]))' "$WORK/fio.json")
  operations=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print(j["read"]["total_ios"]+j["write"]["total_ios"])' "$WORK/fio.json")
  echo "$iops $(python3 -c "print(round(($after - $before) * 10000 / $operations, 1))")"
}

for round in $(seq 1 "$ROUNDS"); do
  for codec in $CODECS; do
    start "$codec"
    before=$(cpu_of "$PID"); started=$(date +%s.%N)
    [ "${COPY_IMAGE:-1}" = 0 ] || nbdcopy --flush "$IMAGE" "$(uri)"
    ended=$(date +%s.%N); after=$(cpu_of "$PID")
    blocks=$(( IMAGE_BYTES / 4096 ))
    mibs=$(python3 -c "print(round($IMAGE_BYTES / 1048576 / ($ended - $started), 1))")
    echo "round $round codec $codec nbdcopy-image MiB/s $mibs cpu-us-per-block $(( (after - before) * 10000 / blocks ))"
    stored=$("$BIN" pool status --data "$WORK/data" --json 2>/dev/null | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j.get("stored_bytes", j.get("used_bytes")))' || echo "?")
    echo "round $round codec $codec stored-bytes $stored"
    if [ -n "${CACHE_BYTES:-}" ]; then
      run_fio --rw=randread >/dev/null
      hits() { "$BIN" pool status --data "$WORK/data" --json | python3 -c 'import json,sys; c=json.load(sys.stdin)["memory_cache"]; print(c["hits"], c["misses"], c.get("decoded_hits", 0))'; }
      read -r hits_before misses_before decoded_before <<<"$(hits)"
      measured=$(run_fio --rw=randread)
      read -r hits_after misses_after decoded_after <<<"$(hits)"
      ratio=$(python3 -c "h=$hits_after-$hits_before; m=$misses_after-$misses_before; print(round(h/max(1,h+m),3))")
      decoded=$(python3 -c "d=$decoded_after-$decoded_before; h=$hits_after-$hits_before; m=$misses_after-$misses_before; print(round(d/max(1,d+h+m),3))")
      echo "round $round codec $codec cached-randread $measured hit-ratio $ratio decoded-share $decoded"
      stop
      continue
    fi
    echo "round $round codec $codec randread $(run_fio --rw=randread)"
    echo "round $round codec $codec randwrite-random $(run_fio --rw=randwrite --refill_buffers)"
    echo "round $round codec $codec randwrite-compressible $(run_fio --rw=randwrite --refill_buffers --buffer_compress_percentage=50 --buffer_compress_chunk=4096)"
    stop
  done
done
