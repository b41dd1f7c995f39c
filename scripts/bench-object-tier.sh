#!/bin/bash
# Object-store capacity tier benchmark (issue 22). Starts its own SeaweedFS
# (`weed mini`, the command line of crates/objects/src/test_support.rs) on free
# loopback ports in a temporary directory and lamina daemons on Unix sockets
# (no TCP, no web, memory cache off), and measures:
#   reads      4 KiB random reads (fio --ioengine=nbd, QD1 and QD16) of a
#              working set on flash (--pin flash) and only in the object tier
#              (--pin capacity, demoted), side by side in each run; server CPU
#              per operation (lamina and weed: utime+stime from /proc/PID/stat)
#   promotion  the demoted working set, set to --pin auto, read pass after
#              pass until >= 95 % of a pass's reads come from flash
#   demotion   a volume of FILL_MULTIPLE x flash written with nbdcopy, the
#              object tier sampled every second from `pool status --json`
#   curves     latency versus load (open loop, `lamina bench run --profile
#              rate-sweep`, 4 KiB random reads at CURVE_RATES IOPS): the
#              working set on flash (all-flash), only in the object tier,
#              and a volume of 2 x flash read whole (flash + object tier);
#              one report and plot (OUT_DIR/curves.svg) with the three curves
#   file       the reads and promotion phases (those in PHASES) again on a
#              two-tier pool whose capacity tier is a plain file (no disk
#              model), for comparison
# Results (one line per measurement, then medians and ratios) go to
# OUT_DIR/results.txt; the daemons' and weed's logs to OUT_DIR too.
# Before each phase it waits (up to LOAD_WAIT_MAX_S) until the 1-minute load
# average is at most LOAD_MAX, and records the load.
# Usage: scripts/bench-object-tier.sh   (environment, with defaults:
#   LAMINA=target/release/lamina RUNS=3 RUNTIME=20 PHASES="reads promotion demotion file"
#   CURVE_RATES=100,200,400,800,1600,3200,6400,12800,25600 CURVE_SECONDS=8
#   WORKING_SET_MIB=256 FLASH_MIB=512 FILL_MULTIPLE=3 PASSES_MAX=8
#   LOAD_MAX=3 LOAD_WAIT_MAX_S=600 OUT_DIR=/tmp/lamina-bench-object-tier.XXXX)
# It kills only the processes it started, by PID, and removes its temporary
# directory on exit.
set -u -o pipefail

LAMINA=$(realpath "${LAMINA:-target/release/lamina}")
RUNS=${RUNS:-3}
RUNTIME=${RUNTIME:-20}
PHASES=${PHASES:-"reads promotion demotion file"}
WORKING_SET_MIB=${WORKING_SET_MIB:-256}
FLASH_MIB=${FLASH_MIB:-512}
FILL_MULTIPLE=${FILL_MULTIPLE:-3}
PASSES_MAX=${PASSES_MAX:-8}
LOAD_MAX=${LOAD_MAX:-3}
LOAD_WAIT_MAX_S=${LOAD_WAIT_MAX_S:-600}
PROMOTED_PERCENT=95
DEMOTION_WAIT_MAX_S=${DEMOTION_WAIT_MAX_S:-300}
CURVE_RATES=${CURVE_RATES:-100,200,400,800,1600,3200,6400,12800,25600}
CURVE_SECONDS=${CURVE_SECONDS:-8}
BUCKET=lamina-bench
OUT_DIR=${OUT_DIR:-$(mktemp -d /tmp/lamina-bench-object-tier.XXXXXX)}
mkdir -p "$OUT_DIR"
RESULTS=$OUT_DIR/results.txt
WORK=$(mktemp -d /tmp/lamina-bench-object-tier-work.XXXXXX)
STARTED_PIDS=()

log() { echo "$*" | tee -a "$RESULTS"; }
fail() { log "FAILED: $*"; exit 1; }

cleanup() {
  local pid
  for pid in "${STARTED_PIDS[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null
    fi
    wait "$pid" 2>/dev/null
  done
  cp "$WORK"/*.log "$OUT_DIR"/ 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

forget_pid() { # stop tracking a PID that was stopped already
  local kept=() pid
  for pid in "${STARTED_PIDS[@]}"; do [ "$pid" != "$1" ] && kept+=("$pid"); done
  STARTED_PIDS=("${kept[@]}")
}

wait_for_quiet() { # phase name
  local waited=0 load
  while :; do
    load=$(cut -d' ' -f1 /proc/loadavg)
    if awk -v l="$load" -v m="$LOAD_MAX" 'BEGIN { exit !(l <= m) }'; then break; fi
    if [ "$waited" -ge "$LOAD_WAIT_MAX_S" ]; then
      log "load $load still above $LOAD_MAX after ${waited}s: measuring anyway"
      break
    fi
    sleep 10; waited=$((waited + 10))
  done
  log "phase $1: $(date -u '+%F %T UTC') uptime: $(uptime)"
}

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# --- SeaweedFS ---------------------------------------------------------------

free_ports() { # ten distinct free loopback ports, bound together then released
  python3 -c '
import socket
s = [socket.socket() for _ in range(10)]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))'
}

start_weed() {
  local dir=$WORK/seaweed
  mkdir -p "$dir/data"
  read -r S3_PORT S3_GRPC MASTER_PORT MASTER_GRPC VOLUME_PORT VOLUME_GRPC \
    FILER_PORT FILER_GRPC ADMIN_PORT ADMIN_GRPC <<<"$(free_ports)"
  export AWS_ACCESS_KEY_ID=lamina$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
  export AWS_SECRET_ACCESS_KEY=secret$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
  printf '{"identities":[{"name":"lamina-bench","credentials":[{"accessKey":"%s","secretKey":"%s"}],"actions":["Admin","Read","Write","List","Tagging"]}]}\n' \
    "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" >"$dir/s3-identities.json"
  WEED_ARGS=(mini -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1
    -s3.config="$dir/s3-identities.json" -s3.port="$S3_PORT" -s3.port.grpc="$S3_GRPC"
    -master.port="$MASTER_PORT" -master.port.grpc="$MASTER_GRPC"
    -volume.port="$VOLUME_PORT" -volume.port.grpc="$VOLUME_GRPC"
    -filer.port="$FILER_PORT" -filer.port.grpc="$FILER_GRPC"
    -admin.port="$ADMIN_PORT" -admin.port.grpc="$ADMIN_GRPC"
    -s3.localSocket="$dir/s3.sock" -filer.localSocket="$dir/filer.sock"
    -admin.ui=false -webdav=false -s3.port.iceberg=0 -s3.port.lance=0
    -master.telemetry=false -master.volumeSizeLimitMB=64)
  (cd "$dir" && exec weed "${WEED_ARGS[@]}") >"$WORK/weed.log" 2>&1 &
  WEED_PID=$!
  STARTED_PIDS+=("$WEED_PID")
  local deadline=$((SECONDS + 60))
  # Ready when S3 answers HTTP and a file written through the filer reads back.
  until curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$S3_PORT/" &&
    curl -s -o /dev/null --max-time 2 -X PUT --data-binary probe \
      "http://127.0.0.1:$FILER_PORT/lamina-readiness-probe" &&
    [ "$(curl -s --max-time 2 "http://127.0.0.1:$FILER_PORT/lamina-readiness-probe")" = probe ]; do
    kill -0 "$WEED_PID" 2>/dev/null || fail "weed mini exited while starting (see weed.log)"
    [ $SECONDS -lt $deadline ] || fail "weed mini not ready within 60 s"
    sleep 0.2
  done
  deadline=$((SECONDS + 30))
  until weed_shell "s3.bucket.list" | awk '{ print $1 }' | grep -qx "$BUCKET"; do
    weed_shell "s3.bucket.create -name $BUCKET" >/dev/null
    [ $SECONDS -lt $deadline ] || fail "could not create bucket $BUCKET"
    sleep 0.2
  done
  log "weed mini (pid $WEED_PID = $(cat /proc/$WEED_PID/comm), $(weed version 2>&1 | head -1)) on S3 port $S3_PORT, bucket $BUCKET"
}

weed_shell() { # one command; host:port.grpcPort, or weed assumes port + 10000
  echo "$1" | (cd "$WORK/seaweed" && timeout 20 weed shell -master="127.0.0.1:$MASTER_PORT.$MASTER_GRPC") 2>&1
}

# --- lamina ------------------------------------------------------------------

lamina() { LAMINA_LOG=warn "$LAMINA" "$@"; }

create_pool() { # name capacity-arguments...
  local name=$1; shift
  DATA=$WORK/$name
  mkdir -p "$DATA"
  lamina pool create --data "$DATA" --flash "$DATA/flash.img:${FLASH_MIB}M" "$@" --json \
    >"$WORK/$name-create.json" || fail "pool create $name $*"
  printf '[web]\naddress = ""\n[server]\ntcp_address = ""\n[limits]\nmemory_cache_bytes = 0\nmemory_cache_warm_restart = false\n[object_store]\naccess_key_id = "%s"\nsecret_access_key = "%s"\n' \
    "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" >"$WORK/$name.toml"
  # A simple command in the background: $! is lamina itself (its CPU time is read).
  LAMINA_LOG=warn "$LAMINA" serve --data "$DATA" --config "$WORK/$name.toml" >"$WORK/$name-serve.log" 2>&1 &
  DAEMON_PID=$!
  STARTED_PIDS+=("$DAEMON_PID")
  SOCKET=$DATA/nbd.sock
  local deadline=$((SECONDS + 60))
  until [ -S "$SOCKET" ] && lamina pool status --data "$DATA" --json >/dev/null 2>&1; do
    kill -0 "$DAEMON_PID" 2>/dev/null || fail "lamina serve exited while starting (see $name-serve.log)"
    [ $SECONDS -lt $deadline ] || fail "lamina serve not ready within 60 s"
    sleep 0.2
  done
  log "pool $name: lamina serve pid $DAEMON_PID, flash ${FLASH_MIB} MiB, capacity $*"
}

stop_daemon() {
  kill -TERM "$DAEMON_PID"
  wait "$DAEMON_PID"
  log "lamina serve pid $DAEMON_PID stopped: exit status $?"
  forget_pid "$DAEMON_PID"
}

uri() { echo "nbd+unix:///$1?socket=$SOCKET"; }

random_file() { # MiB -> path of a file of that many random MiB
  local path=$WORK/random-$1M.img
  [ -e "$path" ] || head -c "$(($1 << 20))" /dev/urandom >"$path"
  echo "$path"
}

volume_create() { # name MiB policy-arguments...
  local name=$1 mib=$2; shift 2
  lamina volume create --data "$DATA" "$name" "${mib}M" "$@" >/dev/null || fail "volume create $name"
}

write_volume() { # name MiB
  local started=$SECONDS
  nbdcopy "$(random_file "$2")" "$(uri "$1")" || fail "nbdcopy into $1"
  log "wrote $2 MiB into $1 with nbdcopy in $((SECONDS - started)) s"
}

stats() { lamina volume stats --data "$DATA" "$1" --json; }
stat_field() { stats "$1" | jq -r "$2"; }

wait_for_tier() { # volume tier(flash|capacity) bytes
  local deadline=$((SECONDS + DEMOTION_WAIT_MAX_S)) started=$SECONDS value
  while :; do
    value=$(stat_field "$1" ".${2}_bytes")
    [ "$value" -ge "$3" ] && break
    if [ $SECONDS -ge $deadline ]; then
      log "STALL: $1 has $value of $3 bytes on $2 after $DEMOTION_WAIT_MAX_S s"
      stats "$1" | tee -a "$RESULTS"
      return 1
    fi
    sleep 1
  done
  log "$1: $3 bytes on $2 after $((SECONDS - started)) s of waiting"
}

# --- measurements ------------------------------------------------------------

fio_summary() { # json-file -> "iops p50_us p99_us total_ios"
  python3 - "$1" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
job = json.loads(text[text.index('{'):])['jobs'][0]['read']
percentiles = job['clat_ns'].get('percentile', {})
print(f"{job['iops']:.0f} {percentiles.get('50.000000', 0) / 1000:.0f} "
      f"{percentiles.get('99.000000', 0) / 1000:.0f} {job['total_ios']}")
PY
}

# One timed 4 KiB random read run; one result line with the server CPU per
# operation (ticks of 10 ms over the whole fio run, divided by every request
# of it, ramp included).
read_run() { # pool volume qd run
  local pool=$1 volume=$2 qd=$3 run=$4 json=$WORK/fio.json
  local lamina0 weed0=0 lamina1 weed1=0
  lamina0=$(cpu_ticks "$DAEMON_PID")
  [ -n "${WEED_PID:-}" ] && weed0=$(cpu_ticks "$WEED_PID")
  fio --name=read --ioengine=nbd --uri="$(uri "$volume")" --rw=randread --bs=4k \
    --size="${WORKING_SET_MIB}M" --iodepth="$qd" --time_based --runtime="$RUNTIME" \
    --ramp_time=1 --randrepeat=0 --norandommap --output-format=json >"$json" 2>"$WORK/fio.err" ||
    fail "fio on $volume: $(cat "$WORK/fio.err")"
  lamina1=$(cpu_ticks "$DAEMON_PID")
  [ -n "${WEED_PID:-}" ] && weed1=$(cpu_ticks "$WEED_PID")
  read -r iops p50 p99 _ <<<"$(fio_summary "$json")"
  local operations=$((iops * (RUNTIME + 1)))
  log "$(printf 'reads pool=%s volume=%s qd=%s run=%s iops=%s p50_us=%s p99_us=%s lamina_cpu_us_per_op=%s weed_cpu_us_per_op=%s load=%s' \
    "$pool" "$volume" "$qd" "$run" "$iops" "$p50" "$p99" \
    "$(awk -v c=$((lamina1 - lamina0)) -v o=$operations 'BEGIN { printf "%.1f", c * 10000 / o }')" \
    "$(awk -v c=$((weed1 - weed0)) -v o=$operations 'BEGIN { printf "%.1f", c * 10000 / o }')" \
    "$(cut -d' ' -f1 /proc/loadavg)")"
}

# Two volumes of WORKING_SET_MIB: `onflash` (--pin flash) and `demoted`
# (--pin capacity). Written demoted first, then a --pin capacity filler of
# flash's size (so that the demoter, which works only while flash is fuller
# than tier_flash_free_percent, demotes all of `demoted`), then onflash.
prepare_working_sets() {
  volume_create demoted "$WORKING_SET_MIB" --pin capacity
  volume_create filler "$FLASH_MIB" --pin capacity
  volume_create onflash "$WORKING_SET_MIB" --pin flash
  write_volume demoted "$WORKING_SET_MIB"
  write_volume filler "$FLASH_MIB"
  write_volume onflash "$WORKING_SET_MIB"
  wait_for_tier demoted capacity $((WORKING_SET_MIB << 20)) || return 1
  wait_for_tier onflash flash $((WORKING_SET_MIB << 20)) || return 1
  stats demoted | jq -c '{volume, flash_bytes, capacity_bytes}' | tee -a "$RESULTS"
  stats onflash | jq -c '{volume, flash_bytes, capacity_bytes}' | tee -a "$RESULTS"
}

reads_phase() { # pool
  wait_for_quiet "reads ($1)"
  local run qd volume
  for run in $(seq 1 "$RUNS"); do
    for qd in 1 16; do
      for volume in onflash demoted; do read_run "$1" "$volume" "$qd" "$run"; done
    done
  done
  local counters
  counters=$(stats demoted | jq -c .counters)
  log "demoted's counters after the reads: $counters"
  lamina pool status --data "$DATA" --json | jq -c '.object_tier // empty' | tee -a "$RESULTS"
}

# Passes over the demoted working set (with the other volumes deleted first) (each block once per pass, random
# order, QD16) after setting it to --pin auto, until one pass reads at least
# PROMOTED_PERCENT % of its blocks from flash.
promotion_phase() { # pool
  wait_for_quiet "promotion ($1)"
  # The working set must fit in flash beside what stays there: without the
  # pinned volume (as much as the working set) and the filler, it does.
  lamina volume delete --data "$DATA" onflash >/dev/null || fail "volume delete onflash"
  lamina volume delete --data "$DATA" filler >/dev/null || fail "volume delete filler"
  lamina volume set --data "$DATA" demoted --pin auto >/dev/null || fail "volume set --pin auto"
  local started=$SECONDS pass before after json=$WORK/fio.json
  for pass in $(seq 1 "$PASSES_MAX"); do
    before=$(stats demoted | jq -c .counters)
    local pass_started=$SECONDS
    fio --name=pass --ioengine=nbd --uri="$(uri demoted)" --rw=randread --bs=4k \
      --size="${WORKING_SET_MIB}M" --iodepth=16 --randrepeat=0 --output-format=json \
      >"$json" 2>"$WORK/fio.err" || fail "fio pass $pass: $(cat "$WORK/fio.err")"
    after=$(stats demoted | jq -c .counters)
    read -r iops p50 p99 _ <<<"$(fio_summary "$json")"
    local share
    share=$(jq -rn --argjson b "$before" --argjson a "$after" '
      (($a.flash_read_blocks - $b.flash_read_blocks)) as $f
      | (($a.capacity_read_blocks - $b.capacity_read_blocks)) as $c
      | (($a.memory_read_blocks - $b.memory_read_blocks)) as $m
      | "\($f * 1000 / ($f + $c + $m) | floor / 10) flash_blocks=\($f) capacity_blocks=\($c) memory_blocks=\($m) promoted_blocks=\($a.promoted_blocks - $b.promoted_blocks)"')
    log "promotion pool=$1 pass=$pass seconds=$((SECONDS - pass_started)) elapsed_s=$((SECONDS - started)) iops=$iops p50_us=$p50 p99_us=$p99 flash_percent=$share"
    if awk -v s="${share%% *}" -v t=$PROMOTED_PERCENT 'BEGIN { exit !(s >= t) }'; then
      log "promotion pool=$1: >= $PROMOTED_PERCENT % of a pass from flash at pass $pass, $((SECONDS - started)) s after the first read"
      stats demoted | jq -c '{flash_bytes, capacity_bytes, counters}' | tee -a "$RESULTS"
      return 0
    fi
  done
  log "promotion pool=$1: not reached in $PASSES_MAX passes"
  stats demoted | jq -c '{flash_bytes, capacity_bytes, counters}' | tee -a "$RESULTS"
}

# Latency versus load on one pool: `onflash` (all-flash) and `demoted`
# (object tier alone) from prepare_working_sets, and `mixed`, 2 x flash with
# --pin auto written last and read whole (flash + object tier: what flash
# holds of it is logged before and after).
curves_phase() {
  wait_for_quiet curves
  volume_create mixed $((FLASH_MIB * 2))
  write_volume mixed $((FLASH_MIB * 2))
  stats mixed | jq -c '{volume, flash_bytes, capacity_bytes}' | tee -a "$RESULTS"
  local mixed_before
  mixed_before=$(stats mixed | jq -c .counters)
  "$LAMINA" bench run --profile rate-sweep --mix randread4k --rate-jobs 4 \
    --rate-targets "$CURVE_RATES" --runtime "$CURVE_SECONDS" --size "${WORKING_SET_MIB}M" \
    --server-pid "$DAEMON_PID" --plot "$OUT_DIR/curves-working-set.svg" --json \
    --uri "all-flash=$(uri onflash)" --uri "object-tier=$(uri demoted)" \
    >"$OUT_DIR/curves-working-set.json" 2>"$WORK/curves.err" || fail "bench run: $(cat "$WORK/curves.err")"
  "$LAMINA" bench run --profile rate-sweep --mix randread4k --rate-jobs 4 \
    --rate-targets "$CURVE_RATES" --runtime "$CURVE_SECONDS" \
    --server-pid "$DAEMON_PID" --plot "$OUT_DIR/curves-mixed.svg" --json \
    --uri "flash+object-tier=$(uri mixed)" \
    >"$OUT_DIR/curves-mixed.json" 2>"$WORK/curves.err" || fail "bench run: $(cat "$WORK/curves.err")"
  local report
  for report in working-set mixed; do
    jq -r '.servers[] | .server as $s | .points[] | select(.target_iops != null)
      | "curve \($s) offered=\(.target_iops) achieved=\(.measurement.total_iops | floor) p50_us=\(.measurement.p50_us | floor) p99_us=\(.measurement.p99_us | floor)"' \
      "$OUT_DIR/curves-$report.json" | tee -a "$RESULTS"
  done
  log "mixed: counters before the sweep $mixed_before, after $(stats mixed | jq -c .counters)"
  stats mixed | jq -c '{volume, flash_bytes, capacity_bytes}' | tee -a "$RESULTS"
}

object_tier_sample() { # -> "stored_bytes pending_bytes objects puts put_bytes put_p50_us put_p99_us put_errors"
  lamina pool status --data "$DATA" --json | jq -r '.object_tier as $o
    | ($o.requests[] | select(.kind == "put")) as $p
    | "\($o.stored_bytes) \($o.pending_bytes) \($o.object_count) \($p.count) \($p.bytes) \($p.latency_p50_us) \($p.latency_p99_us) \($p.errors)"'
}

# A volume of FILL_MULTIPLE x flash written with nbdcopy while the object
# tier is sampled every second; afterwards until stored bytes stop growing.
demotion_phase() {
  wait_for_quiet demotion
  local mib=$((FLASH_MIB * FILL_MULTIPLE)) samples=$WORK/demotion-samples.txt
  random_file "$mib" >/dev/null
  create_pool demotion --capacity "s3://$BUCKET/demotion" --s3-endpoint "http://127.0.0.1:$S3_PORT"
  volume_create big "$mib"
  (
    started=$(date +%s.%N)
    while :; do
      echo "$(awk -v s="$started" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }') $(object_tier_sample)"
      sleep 1
    done
  ) >"$samples" 2>/dev/null &
  local sampler=$!
  STARTED_PIDS+=("$sampler")
  local fill_started
  fill_started=$(date +%s.%N)
  write_volume big "$mib"
  rm -f "$WORK/random-${mib}M.img"
  local fill_seconds
  fill_seconds=$(awk -v s="$fill_started" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }')
  # Until stored bytes have not grown for 10 samples.
  local deadline=$((SECONDS + DEMOTION_WAIT_MAX_S)) last="" same=0 stored
  while [ $SECONDS -lt $deadline ] && [ $same -lt 10 ]; do
    sleep 1
    stored=$(tail -1 "$samples" | cut -d' ' -f2)
    if [ "$stored" = "$last" ]; then same=$((same + 1)); else same=0; last=$stored; fi
  done
  kill "$sampler"; wait "$sampler" 2>/dev/null; forget_pid "$sampler"
  cp "$samples" "$OUT_DIR/"
  log "demotion: nbdcopy of $mib MiB took $fill_seconds s; samples (t stored pending objects puts put_bytes put_p50_us put_p99_us put_errors) in demotion-samples.txt"
  python3 - "$samples" "$fill_seconds" <<'PY' | tee -a "$RESULTS"
import sys
rows = [l.split() for l in open(sys.argv[1]) if len(l.split()) == 9]
rows = [[float(r[0])] + [int(x) for x in r[1:]] for r in rows]
fill = float(sys.argv[2])
MiB, GiB = 1 << 20, 1 << 30
first = next(r for r in rows if r[1] > rows[0][1])
last = next(r for r in rows if r[1] == rows[-1][1])
span = last[0] - first[0] + 1
grown = last[1] - rows[0][1]
during = [r for r in rows if r[0] <= fill]
after_fill = during[-1] if during else rows[0]
print(f"demotion: stored {grown / MiB:.0f} MiB in objects from t={first[0] - 1:.0f}s to t={last[0]:.0f}s: "
      f"{grown / MiB / span:.1f} MiB/s overall; during the fill {(after_fill[1] - rows[0][1]) / MiB / max(fill, 1):.1f} MiB/s")
best = max(((rows[i + 5][1] - rows[i][1]) / (rows[i + 5][0] - rows[i][0]) for i in range(len(rows) - 5)), default=0)
print(f"demotion: best 5-sample window {best / MiB:.1f} MiB/s")
end = rows[-1]
print(f"demotion: {end[4]} PUTs ({end[8]} failed), {end[5] / MiB:.0f} MiB uploaded: "
      f"{end[4] / (end[5] / GiB):.0f} PUTs per GiB uploaded, {end[4] / (end[1] / GiB):.0f} per GiB stored; "
      f"{end[3]} objects; PUT p50 {end[6] / 1000:.1f} ms, p99 {end[7] / 1000:.1f} ms (since the pool opened)")
PY
  lamina pool status --data "$DATA" --json | jq -c '{object_tier, demoted_blocks, background}' | tee -a "$RESULTS"
  stats big | jq -c '{flash_bytes, capacity_bytes}' | tee -a "$RESULTS"
  stop_daemon
}

summary() {
  python3 - "$RESULTS" <<'PY' | tee -a "$RESULTS"
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    if not line.startswith("reads "):
        continue
    fields = dict(f.split("=") for f in line.split()[1:])
    key = (fields["pool"], fields["qd"], fields["volume"])
    rows.setdefault(key, []).append(fields)
print("summary: medians over runs (pool qd volume: iops p50_us p99_us lamina_cpu_us_per_op weed_cpu_us_per_op)")
medians = {}
for key, runs in sorted(rows.items()):
    m = {name: statistics.median(float(r[name]) for r in runs)
         for name in ("iops", "p50_us", "p99_us", "lamina_cpu_us_per_op", "weed_cpu_us_per_op")}
    medians[key] = m
    print("summary:", *key, f"{m['iops']:.0f} {m['p50_us']:.0f} {m['p99_us']:.0f} "
          f"{m['lamina_cpu_us_per_op']:.1f} {m['weed_cpu_us_per_op']:.1f} (runs {len(runs)})")
for (pool, qd, volume), m in sorted(medians.items()):
    if volume != "demoted" or (pool, qd, "onflash") not in medians:
        continue
    f = medians[(pool, qd, "onflash")]
    ratios = [f"{name} {m[name] / f[name]:.2f}" if f[name] else f"{name} -"
              for name in ("iops", "p50_us", "p99_us", "lamina_cpu_us_per_op")]
    # Ratio of medians; also the median of the per-run ratios (side by side).
    per_run = [float(d["iops"]) / float(o["iops"])
               for d, o in zip(rows[(pool, qd, "demoted")], rows[(pool, qd, "onflash")])]
    print(f"summary: ratio capacity/flash pool={pool} qd={qd}:", ", ".join(ratios),
          f"(median of per-run iops ratios {statistics.median(per_run):.3f})")
PY
}

# --- main ----------------------------------------------------------------------

[ -x "$LAMINA" ] || fail "no lamina binary at $LAMINA (cargo build --release -p lamina)"
for tool in weed fio nbdcopy jq curl python3; do
  command -v "$tool" >/dev/null || fail "$tool is not installed"
done
# Random data files, SeaweedFS's copies, flash images and the capacity file
# together; a full disk turns into truncated fio output and a failed daemon.
needed_mib=$((3 * WORKING_SET_MIB + 6 * FLASH_MIB + 2 * FILL_MULTIPLE * FLASH_MIB))
available_mib=$(($(df --output=avail -k "$(dirname "$WORK")" | tail -1) / 1024))
[ "$available_mib" -ge "$needed_mib" ] ||
  fail "$available_mib MiB free under $(dirname "$WORK"), about $needed_mib MiB needed"
log "date: $(date -u) machine: nproc $(nproc), kernel $(uname -r), $(free -g | awk '/Mem:/ { print $2 }') GiB"
log "lamina: $LAMINA ($(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null)), fio $(fio --version), RUNS=$RUNS RUNTIME=$RUNTIME WORKING_SET_MIB=$WORKING_SET_MIB FLASH_MIB=$FLASH_MIB"
start_weed
case " $PHASES " in *" reads "* | *" curves "* | *" promotion "*)
  wait_for_quiet "setup (s3)"
  create_pool s3 --capacity "s3://$BUCKET/reads" --s3-endpoint "http://127.0.0.1:$S3_PORT"
  if prepare_working_sets; then
    case " $PHASES " in *" reads "*) reads_phase s3 ;; esac
    case " $PHASES " in *" curves "*) curves_phase ;; esac
    case " $PHASES " in *" promotion "*) promotion_phase s3 ;; esac
  fi
  stop_daemon
  ;;
esac
case " $PHASES " in *" demotion "*) demotion_phase ;; esac
case " $PHASES " in *" file "*)
  wait_for_quiet "setup (file)"
  create_pool file --capacity "$WORK/file/capacity.img:4G"
  saved_weed_pid=$WEED_PID; WEED_PID=""
  if prepare_working_sets; then
    case " $PHASES " in *" reads "*) reads_phase file ;; esac
    case " $PHASES " in *" promotion "*) promotion_phase file ;; esac
  fi
  WEED_PID=$saved_weed_pid
  stop_daemon
  ;;
esac
summary
log "done: $(date -u); results in $RESULTS"
