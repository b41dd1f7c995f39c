#!/bin/bash
# PostgreSQL on ext4 on each server's export (issue 46): nbdfuse exposes a
# 2 GiB export as a file, losetup makes it a block device, mkfs.ext4 and mount,
# Debian's PostgreSQL (initdb as user postgres), pgbench -i -s 10, then pgbench
# with 4 clients for SECONDS. Servers: each lamina build given (a fresh
# embedded 6 GiB pool file, its 2 GiB default volume), qemu-nbd
# (--cache=none --aio=io_uring) and nbdkit file on a fully written 2 GiB file.
# Prints TPS and the server's CPU seconds during the run. Needs root (losetup,
# mount) and postgresql, libnbd-bin (nbdfuse), fuse3: a script because
# lamina-bench does not set up filesystems or databases.
#
# Usage: sudo scripts/bench-pgbench.sh ROUNDS SECONDS LABEL=LAMINA_BINARY[@CODEC]...
# (the default volume created with CODEC, issue 44; PEERS=0 skips the peers)
set -u
ROUNDS=${1:?rounds}; RUN_SECONDS=${2:?seconds}; shift 2
PG_BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench-pgbench.XXXXXX")
chmod 755 "$WORK"
PG_DATA= LOOP= FUSE_PID= SERVER_PID=
teardown() {
  [ -n "$PG_DATA" ] && runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast stop >/dev/null 2>&1
  mountpoint -q "$WORK/mnt" && umount "$WORK/mnt"
  [ -n "$LOOP" ] && losetup -d "$LOOP" 2>/dev/null
  if [ -n "$FUSE_PID" ]; then
    fusermount3 -u "$WORK/fuse" 2>/dev/null || umount "$WORK/fuse" 2>/dev/null
    kill "$FUSE_PID" 2>/dev/null; wait "$FUSE_PID" 2>/dev/null
  fi
  [ -n "$SERVER_PID" ] && { kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; }
  PG_DATA= LOOP= FUSE_PID= SERVER_PID=
}
trap 'teardown; rm -rf "$WORK"' EXIT
database_on() { # label uri
  mkdir -p "$WORK/fuse" "$WORK/mnt" "$WORK/socket"
  nbdfuse "$WORK/fuse/disk" "$2" </dev/null >/dev/null 2>&1 & FUSE_PID=$!
  for _ in $(seq 1 100); do [ -s "$WORK/fuse/disk" ] && break; sleep 0.1; done
  LOOP=$(losetup --find --show --direct-io=off "$WORK/fuse/disk")
  mkfs.ext4 -q -F "$LOOP" >/dev/null 2>&1
  mount -t ext4 "$LOOP" "$WORK/mnt" && chown postgres "$WORK/mnt" "$WORK/socket"
  PG_DATA=$WORK/mnt/pg
  runuser -u postgres -- "$PG_BIN/initdb" -D "$PG_DATA" >/dev/null 2>&1
  runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$WORK/socket/pg.log" \
    -o "-k $WORK/socket -p 5499 -c listen_addresses=''" -w start >/dev/null
  runuser -u postgres -- pgbench -h "$WORK/socket" -p 5499 -i -s 10 -q postgres >/dev/null 2>&1
  local before after tps
  before=$(awk '{print $14+$15}' "/proc/$SERVER_PID/stat")
  tps=$(runuser -u postgres -- pgbench -h "$WORK/socket" -p 5499 -c 4 -j 2 -T "$RUN_SECONDS" postgres 2>/dev/null \
        | awk '/^tps/ {print $3; exit}')
  after=$(awk '{print $14+$15}' "/proc/$SERVER_PID/stat")
  python3 -c "print(f'$1'.ljust(24), 'tps', '$tps', 'server cpu s', round(($after - $before) / $(getconf CLK_TCK), 2))"
  teardown
}
lamina_database() { # label binary [codec]
  local data="$WORK/lamina"
  rm -rf "$data"; mkdir -p "$data"
  printf 'data_dir = "%s"\n[server]\ntcp_address = ""\n[pool]\nembedded_size_bytes = 6442450944\ndefault_volume_bytes = 2147483648\n' "$data" > "$WORK/lamina.toml"
  # Only when a codec is asked for: builds before issue 44 refuse the key.
  [ -n "${3:-}" ] && printf 'compression = "%s"\n' "$3" >> "$WORK/lamina.toml"
  "$2" serve --config "$WORK/lamina.toml" > "$WORK/lamina.log" 2>&1 & SERVER_PID=$!
  for _ in $(seq 1 200); do nbdinfo --size "nbd+unix:///default?socket=$data/nbd.sock" >/dev/null 2>&1 && break; sleep 0.05; done
  database_on "$1" "nbd+unix:///default?socket=$data/nbd.sock"
  rm -rf "$data"
}
peer_database() { # label command...
  local label=$1; shift
  dd if=/dev/urandom of="$WORK/peer.img" bs=4M count=512 status=none; sync "$WORK/peer.img"
  rm -f "$WORK/peer.sock"
  "$@" & SERVER_PID=$!
  for _ in $(seq 1 200); do nbdinfo --size "nbd+unix:///?socket=$WORK/peer.sock" >/dev/null 2>&1 && break; sleep 0.05; done
  database_on "$label" "nbd+unix:///?socket=$WORK/peer.sock"
  rm -f "$WORK/peer.img"
}
for round in $(seq 1 "$ROUNDS"); do
  echo "# round $round $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
  for build in "$@"; do
    spec=${build#*=}; codec=
    [[ $spec == *@* ]] && codec=${spec##*@}
    lamina_database "${build%%=*}" "${spec%@*}" "$codec"
  done
  [ "${PEERS:-1}" = 0 ] && continue
  peer_database "qemu-nbd written" qemu-nbd -t --cache=none --aio=io_uring -f raw -k "$WORK/peer.sock" "$WORK/peer.img"
  peer_database "nbdkit file written" nbdkit -f -U "$WORK/peer.sock" file "$WORK/peer.img"
done
