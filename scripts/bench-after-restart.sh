#!/usr/bin/env bash
# After a restart (issue 46, item 3): each server is given the same 1 GiB of
# written data, stopped cleanly and started again before each workload, and
# measured at once with fio --ioengine=nbd, 4 KiB, QD32: random read, random
# write, 70/30. lamina runs its default configuration (1 GiB memory cache,
# warm restart on); nbdkit `file` keeps the host page cache across its
# restart; qemu-nbd runs `--cache=none --aio=io_uring` (O_DIRECT) and, as a
# second peer, `--cache=writeback --aio=io_uring` (page cache).
#
#   scripts/bench-after-restart.sh BINARY [ROUNDS] [SIZE] [SECONDS] [SERVERS]
#
# Defaults: 3 rounds, 1G, 10-second runs, servers
# "lamina nbdkit qemu-none qemu-writeback". Every server starts empty (a
# sparse image, lamina a new data directory) and the data is written into it
# over NBD with nbdcopy, as a client would, then flushed. Each round, each
# server, each workload: SIGTERM, start again, wait until nbdinfo answers,
# fio for SECONDS. Prints one line per measurement: round, server, workload,
# IOPS, server CPU µs per operation (utime + stime of the server process over
# the fio run ÷ operations), and for lamina the warm-up's log line. Only the
# processes it started are stopped, by PID. A server `lamina-no-warmup` is
# lamina with `memory_cache_warm_restart = false`, to see what the warm-up
# brings and costs; a server `lamina-before` is lamina run from the binary
# LAMINA_BEFORE_BINARY names (another build, side by side in the same run).
set -euo pipefail
# The system Python has libnbd's bindings (nbdsh); another python3 on PATH may not.
export PATH="/usr/bin:/bin:$PATH"
binary=$(realpath "$1")
rounds=${2:-3}
size=${3:-1G}
seconds=${4:-10}
servers=${5:-"lamina nbdkit qemu-none qemu-writeback"}

work=$(mktemp -d /tmp/bench-after-restart.XXXXXX)
server=""
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

size_bytes=$(numfmt --from=iec "$size")
ticks_per_second=$(getconf CLK_TCK)

wait_ready() {
  until nbdinfo --size "$1" >/dev/null 2>&1; do sleep 0.02; done
}

uri_of() {
  case $1 in
    lamina*) echo "nbd+unix:///default?socket=$work/$1/data/nbd.sock" ;;
    *) echo "nbd+unix:///?socket=$work/$1/nbd.sock" ;;
  esac
}

# Starts server $1 on its existing data; sets $server to its PID.
start() {
  local name=$1 directory="$work/$1"
  rm -f "$directory/nbd.sock"
  case $name in
    lamina*)
      local program=$binary
      if [ "$name" = lamina-before ]; then program=$LAMINA_BEFORE_BINARY; fi
      LAMINA_LOG=info "$program" serve --data "$directory/data" --config "$directory/lamina.toml" \
        >>"$directory/out" 2>>"$directory/log" &
      ;;
    nbdkit)
      nbdkit --unix "$directory/nbd.sock" --foreground file "$directory/image.raw" \
        >>"$directory/log" 2>&1 &
      ;;
    qemu-none | qemu-writeback)
      qemu-nbd --socket="$directory/nbd.sock" --format=raw --persistent --shared=4 \
        --cache="${name#qemu-}" --aio=io_uring "$directory/image.raw" >>"$directory/log" 2>&1 &
      ;;
  esac
  server=$!
  wait_ready "$(uri_of "$name")"
}

stop() {
  kill -TERM "$server"
  wait "$server" || true
  server=""
}

# A new copy of the data in server $1, written over NBD and flushed, then stopped.
prepare() {
  local name=$1 directory="$work/$1"
  rm -rf "$directory"
  mkdir -m 0700 -p "$directory"
  if [[ $name == lamina* ]]; then
    mkdir -m 0700 "$directory/data"
    printf '[server]\ntcp_address = ""\n[web]\naddress = ""\n' >"$directory/lamina.toml"
    if [ "$name" = lamina-no-warmup ]; then
      printf '[limits]\nmemory_cache_warm_restart = false\n' >>"$directory/lamina.toml"
    fi
  else
    truncate -s "$size_bytes" "$directory/image.raw"
  fi
  start "$name"
  nbdcopy "$work/data.img" "$(uri_of "$name")"
  nbdsh -u "$(uri_of "$name")" -c 'h.flush()'
  stop
}

cpu_ticks() {
  awk '{ print $14 + $15 }' "/proc/$1/stat"
}

# fio's workload $2 (randread, randwrite, rw70) against URI $1; prints IOPS and operations.
run_fio() {
  local mix=()
  case $2 in
    rw70) mix=(--rw=randrw --rwmixread=70) ;;
    *) mix=(--rw="$2") ;;
  esac
  fio --name=after-restart --ioengine=nbd --uri="$1" "${mix[@]}" --bs=4k --iodepth=32 \
    --size="$size_bytes" --time_based --runtime="$seconds" --norandommap --randrepeat=0 \
    --output-format=json |
    python3 -c '
import json, sys
text = sys.stdin.read()
job = json.loads(text[text.index("{"):])["jobs"][0]
print(round(job["read"]["iops"] + job["write"]["iops"]), job["read"]["total_ios"] + job["write"]["total_ios"])'
}

fio --name=data --filename="$work/data.img" --rw=write --bs=1M --size="$size_bytes" \
  --refill_buffers --output=/dev/null

echo "# date $(date -u +%FT%TZ) size $size seconds $seconds rounds $rounds"
for round in $(seq 1 "$rounds"); do
  for name in $servers; do
    prepare "$name"
    for workload in randread randwrite rw70; do
      start "$name"
      before=$(cpu_ticks "$server")
      read -r iops operations < <(run_fio "$(uri_of "$name")" "$workload")
      after=$(cpu_ticks "$server")
      cpu_us=$(python3 -c "print(round(($after - $before) * 1e6 / $ticks_per_second / max($operations, 1), 1))")
      echo "round $round server $name workload $workload iops $iops cpu_us_per_op $cpu_us"
      stop
      if [ "$name" = lamina ] || [ "$name" = lamina-before ]; then
        grep -h "warm-up finished" "$work/$name/log" | tail -1 | sed 's/\x1b\[[0-9;]*m//g; s/^/#   /' || true
      fi
    done
  done
done
