# Helpers shared by the benchmark scripts that stay scripts (bench-write-punts.sh,
# bench-scrub-repair.sh; decision 0060) and by the retired ones run from history
# (`git show 307f72b:scripts/NAME`); sourced, not run.

# CPU time (user + system, in clock ticks of 1/100 s) a process has used.
cpu_of() { awk '{print $14+$15}' /proc/$1/stat; }

# Waits until a daemon's NBD socket exists, then a second for it to settle.
wait_for_socket() { while [ ! -S "$1" ]; do sleep 0.2; done; sleep 1; }

# Makes DATA a pool with one volume "default" of VOLUME_SIZE on a FLASH_SIZE
# file, filled with random data through NBD, once: later calls find
# DATA/prefilled and return. Usage: prefill_pool BIN DATA CONFIG FLASH_SIZE VOLUME_SIZE
prefill_pool() {
  local bin=$1 data=$2 config=$3 flash_size=$4 volume_size=$5 pid
  [ -e $data/prefilled ] && return
  rm -rf $data; mkdir -p $data
  $bin pool create --data $data --flash $data/flash.img:$flash_size >/dev/null
  $bin serve --data $data --config $config >$data/../serve-prefill.log 2>&1 & pid=$!
  wait_for_socket $data/nbd.sock
  $bin volume create --data $data default $volume_size
  fio --name=fill --ioengine=nbd --uri="nbd+unix:///default?socket=$data/nbd.sock" \
    --rw=write --bs=1M --size=$volume_size --iodepth=8 --refill_buffers >/dev/null
  kill -INT $pid; wait $pid
  touch $data/prefilled
}
