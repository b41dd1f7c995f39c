#!/bin/bash
# Scrub rate with every row needing repair against a clean scrub (issue 42,
# item 3), on one raid6 pool of six member files served by the daemon: a
# volume filled with random data through NBD and flushed, then ROUNDS rounds
# of: a clean scrub; random bytes over one column of every row (4 MiB
# chunks past the labels, alternately on members 1 and 2, so that no device
# has more than half its columns bad and none is faulted) and a scrub; two
# columns of every row (members 1 and 2, then 3 and 4, alternately) and a
# scrub. Last, member 5 overwritten whole past its labels and a scrub, which
# faults it (more than 90 % of its columns bad). Prints each scrub's live
# blocks, repairs, parity repairs, faulted devices, elapsed time and MiB/s of
# live data, and the daemon's CPU seconds per scrub. Needs nbdcopy, dd and
# python3.
# Usage: scripts/bench-scrub-repair.sh LAMINA_BINARY [MEMBER_SIZE] [VOLUME_SIZE]
# (BENCH_DIR, default /tmp/lamina-bench-scrub; ROUNDS, default 3).
set -eu
. "$(dirname "$0")/bench-lib.sh"
bin=$1; member_size=${2:-320M}; volume_size=${3:-1G}
D=${BENCH_DIR:-/tmp/lamina-bench-scrub}; rounds=${ROUNDS:-3}
rm -rf $D; mkdir -p $D
members=$(for i in 0 1 2 3 4 5; do printf '%s/m%s.img:%s,' $D $i $member_size; done)
$bin pool create --data $D/data --flash ${members%,} --redundancy raid6 >/dev/null
printf '[web]\naddress = ""\n[server]\ntcp_address = ""\n[limits]\nmemory_cache_bytes = 0\nrebuild_automatic = false\n' > $D/lamina.toml
$bin serve --data $D/data --config $D/lamina.toml > $D/serve.log 2>&1 & pid=$!
wait_for_socket $D/data/nbd.sock
$bin volume create --data $D/data v $volume_size >/dev/null
head -c $(python3 -c "print(int('${volume_size%G}')<<30)") /dev/urandom > $D/source.img
nbdcopy --flush $D/source.img "nbd+unix:///v?socket=$D/data/nbd.sock"

# Random bytes over member $1 from member block 66 (past the label area and a
# one-block zone table's two copies): the whole of it, or with $2 = 0 or 1
# every other 4 MiB chunk (the even or the odd ones), written O_DIRECT.
chunk_bytes=$((4 << 20))
damage() {
  local size=$(stat -c %s $D/m$1.img) start=$((66 * 4096)) which=${2:-all} offset index=0
  if [ $which = all ]; then
    dd if=/dev/urandom of=$D/m$1.img bs=1M seek=$start count=$((size - start)) \
      iflag=count_bytes oflag=direct,seek_bytes conv=notrunc status=none
    return
  fi
  for ((offset = start; offset + chunk_bytes <= size; offset += chunk_bytes, index++)); do
    [ $((index % 2)) = $which ] || continue
    dd if=/dev/urandom of=$D/m$1.img bs=1M seek=$offset count=$chunk_bytes \
      iflag=count_bytes oflag=direct,seek_bytes conv=notrunc status=none
  done
}

scrub() {
  local before=$(cpu_of $pid) json
  json=$($bin pool scrub --data $D/data --wait --json)
  local after=$(cpu_of $pid)
  python3 -c "
import json,sys
s=json.loads(sys.argv[1]); cpu=(int(sys.argv[3])-int(sys.argv[2]))/100
mib=s['blocks_scrubbed']*4096/2**20; t=s['elapsed_ms']/1000
print(f\"{sys.argv[4]:<18} live {s['blocks_scrubbed']:>7} repaired {s['blocks_repaired']:>7} parity {s['parity_repaired']:>7} unrepairable {s['blocks_unrepairable']} faulted {s['devices_faulted']} {t:6.2f} s {mib/t:7.1f} MiB/s cpu {cpu:5.2f} s\")
" "$json" $before $after "$1"
}

for round in $(seq $rounds); do
  scrub "clean"
  damage 1 0; damage 2 1; scrub "one column a row"
  damage 1 0; damage 2 0; damage 3 1; damage 4 1; scrub "two columns a row"
done
damage 5; scrub "one device wiped"
$bin pool status --data $D/data | grep -E "^ +[0-9] " || true
kill -INT $pid; wait $pid
