//! A fault-injecting wrapper around any device, usable in tests and in production
//! builds (to rehearse failures on real hardware). It can fail reads, writes or
//! flushes at chosen offsets or at a random rate, refuse writes as a full file
//! system would (ENOSPC, until told that space returned), flip bits, and simulate a power
//! cut: every write that no completed flush covers is kept, dropped or torn at
//! 512-byte sector boundaries, at random, exactly as a disk with a volatile cache
//! may leave it. After a power cut the wrapper refuses all I/O, like a dead
//! process's file descriptors, and the test reopens the inner device.
//!
//! To roll back writes on any inner device, the wrapper reads each write's
//! pre-image before writing, and on a power cut restores, newest first, every
//! sector that the cut decided not to keep.

use std::ops::Range;
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Mutex;

use crate::{AlignedBuffer, BlockDevice, DeviceError, DeviceErrorKind, SECTOR_SIZE_BYTES};

/// How a power cut treats writes that no completed flush covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowerCutStyle {
    /// Every unflushed write is lost.
    DropAll,
    /// Every unflushed write happens to reach the media.
    KeepAll,
    /// Each unflushed write is kept, dropped, torn at a sector boundary (a prefix
    /// survives) or scattered (any subset of its sectors survives), at random.
    Random,
    /// Every unflushed write is torn: its even sectors survive, its odd ones
    /// keep what was there, so every 4 KiB block it wrote is half old, half
    /// new (the worst case for a format that relies on a flush between two
    /// copies, which `Random` meets only rarely).
    TearAll,
}

struct PendingWrite {
    /// Order of the write among all writes, so that a flush can tell which
    /// pending writes it covers even when another flush ran meanwhile.
    sequence: u64,
    offset: u64,
    pre_image: AlignedBuffer,
}

#[derive(Default)]
struct FaultPlan {
    read_failures: Vec<Range<u64>>,
    write_failures: Vec<Range<u64>>,
    read_failure_probability: f64,
    write_failure_probability: f64,
    fail_flushes: bool,
    /// Writes fail as on a full file system (nothing written); reads and
    /// flushes still work, as they do there.
    out_of_space: bool,
}

struct State {
    pending: Vec<PendingWrite>,
    /// Sequence the next write gets.
    next_write_sequence: u64,
    plan: FaultPlan,
    rng: SmallRng,
    powered_off: bool,
    bytes_written: u64,
}

/// See the module documentation.
pub struct FaultyDevice<D: BlockDevice> {
    inner: Arc<D>,
    name: String,
    state: Mutex<State>,
}

fn overlaps(ranges: &[Range<u64>], offset: u64, length: u64) -> bool {
    ranges
        .iter()
        .any(|range| offset < range.end && range.start < offset + length)
}

impl<D: BlockDevice> FaultyDevice<D> {
    pub fn new(inner: Arc<D>, seed: u64) -> Self {
        let name = format!("faulty({})", inner.name());
        Self {
            inner,
            name,
            state: Mutex::new(State {
                pending: Vec::new(),
                next_write_sequence: 0,
                plan: FaultPlan::default(),
                rng: SmallRng::seed_from_u64(seed),
                powered_off: false,
                bytes_written: 0,
            }),
        }
    }

    pub fn inner(&self) -> &Arc<D> {
        &self.inner
    }

    fn error(&self, offset: u64, length: u64) -> DeviceError {
        DeviceError::new(DeviceErrorKind::Injected, &self.name, offset, length)
    }

    /// Reads overlapping `range` fail from now on.
    pub async fn fail_reads_in(&self, range: Range<u64>) {
        self.state.lock().await.plan.read_failures.push(range);
    }

    /// Writes overlapping `range` fail from now on (nothing is written).
    pub async fn fail_writes_in(&self, range: Range<u64>) {
        self.state.lock().await.plan.write_failures.push(range);
    }

    /// Each read and each write fails with the given probability.
    pub async fn fail_at_rate(&self, read_probability: f64, write_probability: f64) {
        let mut state = self.state.lock().await;
        state.plan.read_failure_probability = read_probability;
        state.plan.write_failure_probability = write_probability;
    }

    /// Flushes fail from now on (and make nothing durable).
    pub async fn fail_flushes(&self, fail: bool) {
        self.state.lock().await.plan.fail_flushes = fail;
    }

    /// Writes fail with ENOSPC from now on while `out_of_space` is true, as on
    /// a file system that filled up; false is space returning.
    pub async fn run_out_of_space(&self, out_of_space: bool) {
        self.state.lock().await.plan.out_of_space = out_of_space;
    }

    /// Removes every planned failure.
    pub async fn heal(&self) {
        self.state.lock().await.plan = FaultPlan::default();
    }

    /// Flips one bit of the stored data, durably, as silent media corruption would.
    pub async fn flip_bit(&self, byte_offset: u64, bit_index: u8) -> Result<(), DeviceError> {
        let _state = self.state.lock().await;
        let block_offset = byte_offset - byte_offset % crate::DEVICE_ALIGNMENT_BYTES;
        let mut block = self
            .inner
            .read(
                block_offset,
                crate::buffer_length(crate::DEVICE_ALIGNMENT_BYTES),
            )
            .await?;
        block[crate::buffer_length(byte_offset - block_offset)] ^= 1 << (bit_index % 8);
        self.inner.write(block_offset, Arc::new(block)).await?;
        self.inner.flush().await
    }

    /// Bytes written through this device so far (for write-amplification figures).
    pub async fn bytes_written(&self) -> u64 {
        self.state.lock().await.bytes_written
    }

    /// Simulates a power cut: unflushed writes are kept, dropped or torn according
    /// to `style`, and all later I/O through this wrapper fails. Returns how many
    /// unflushed writes were affected.
    pub async fn power_cut(&self, style: PowerCutStyle) -> Result<usize, DeviceError> {
        let mut state = self.state.lock().await;
        state.powered_off = true;
        let pending = std::mem::take(&mut state.pending);
        let count = pending.len();
        // Sectors whose newest surviving content is already decided, so that an
        // older write's pre-image must not overwrite them.
        let mut decided: std::collections::HashSet<u64> = std::collections::HashSet::new();
        for write in pending.iter().rev() {
            let sector_count = write.pre_image.len() as u64 / SECTOR_SIZE_BYTES;
            let keep: Vec<bool> = match style {
                PowerCutStyle::DropAll => vec![false; sector_count as usize],
                PowerCutStyle::KeepAll => vec![true; sector_count as usize],
                PowerCutStyle::TearAll => (0..sector_count).map(|index| index % 2 == 0).collect(),
                PowerCutStyle::Random => match state.rng.random_range(0..4u8) {
                    0 => vec![true; sector_count as usize],
                    1 => vec![false; sector_count as usize],
                    2 => {
                        let prefix = state.rng.random_range(0..=sector_count);
                        (0..sector_count).map(|index| index < prefix).collect()
                    }
                    _ => (0..sector_count)
                        .map(|_| state.rng.random_bool(0.5))
                        .collect(),
                },
            };
            for (index, kept) in keep.iter().enumerate() {
                let sector_offset = write.offset + index as u64 * SECTOR_SIZE_BYTES;
                if decided.contains(&sector_offset) {
                    continue;
                }
                if *kept {
                    decided.insert(sector_offset);
                    continue;
                }
                // Restoring a sector means rewriting its aligned block on the inner
                // device with this sector replaced by the pre-image.
                let block_offset = sector_offset - sector_offset % crate::DEVICE_ALIGNMENT_BYTES;
                let mut block = self
                    .inner
                    .read(
                        block_offset,
                        crate::buffer_length(crate::DEVICE_ALIGNMENT_BYTES),
                    )
                    .await?;
                let within_block = crate::buffer_length(sector_offset - block_offset);
                let sector_bytes = crate::buffer_length(SECTOR_SIZE_BYTES);
                let within_write = index * sector_bytes;
                block[within_block..within_block + sector_bytes]
                    .copy_from_slice(&write.pre_image[within_write..within_write + sector_bytes]);
                self.inner.write(block_offset, Arc::new(block)).await?;
            }
        }
        self.inner.flush().await?;
        Ok(count)
    }
}

#[async_trait::async_trait]
impl<D: BlockDevice> BlockDevice for FaultyDevice<D> {
    fn name(&self) -> &str {
        &self.name
    }

    fn has_redundancy(&self) -> bool {
        self.inner.has_redundancy()
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read(&self, offset: u64, length: usize) -> crate::DeviceReadFuture<'_> {
        crate::DeviceReadFuture::from_or_box(async move {
            {
                let mut state = self.state.lock().await;
                let probability = state.plan.read_failure_probability;
                if state.powered_off
                    || overlaps(&state.plan.read_failures, offset, length as u64)
                    || (probability > 0.0 && state.rng.random_bool(probability))
                {
                    return Err(self.error(offset, length as u64));
                }
            }
            self.inner.read(offset, length).await
        })
    }

    async fn write(&self, offset: u64, data: Arc<AlignedBuffer>) -> Result<(), DeviceError> {
        // The lock is held across the write so that a power cut sees every write
        // either entirely before it (pending, with its pre-image) or not at all.
        let mut state = self.state.lock().await;
        let length = data.len() as u64;
        let probability = state.plan.write_failure_probability;
        if state.powered_off
            || overlaps(&state.plan.write_failures, offset, length)
            || (probability > 0.0 && state.rng.random_bool(probability))
        {
            return Err(self.error(offset, length));
        }
        if state.plan.out_of_space {
            let full = std::io::Error::from_raw_os_error(libc::ENOSPC);
            return Err(DeviceError::new(
                DeviceErrorKind::from(full),
                &self.name,
                offset,
                length,
            ));
        }
        let pre_image = self.inner.read(offset, data.len()).await?;
        let sequence = state.next_write_sequence;
        state.next_write_sequence += 1;
        state.pending.push(PendingWrite {
            sequence,
            offset,
            pre_image,
        });
        state.bytes_written += length;
        self.inner.write(offset, data).await
    }

    async fn flush(&self) -> Result<(), DeviceError> {
        // Writes completed before the flush starts become durable; a concurrent
        // flush may already have retired some of them, so match by sequence.
        let covered_before = {
            let state = self.state.lock().await;
            if state.powered_off || state.plan.fail_flushes {
                return Err(self.error(0, 0));
            }
            state.next_write_sequence
        };
        self.inner.flush().await?;
        let mut state = self.state.lock().await;
        if state.powered_off {
            return Err(self.error(0, 0));
        }
        state
            .pending
            .retain(|write| write.sequence >= covered_before);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryDevice;

    async fn write_byte(device: &FaultyDevice<MemoryDevice>, offset: u64, value: u8) {
        let mut buffer = AlignedBuffer::zeroed(4096);
        buffer.fill(value);
        device.write(offset, Arc::new(buffer)).await.unwrap();
    }

    #[tokio::test]
    async fn flushed_writes_survive_and_unflushed_are_dropped() {
        let inner = Arc::new(MemoryDevice::new(65536));
        let device = FaultyDevice::new(inner.clone(), 1);
        write_byte(&device, 0, 1).await;
        device.flush().await.unwrap();
        write_byte(&device, 0, 2).await;
        write_byte(&device, 4096, 3).await;
        assert_eq!(device.power_cut(PowerCutStyle::DropAll).await.unwrap(), 2);
        assert!(device.read(0, 4096).await.is_err(), "dead after power cut");
        let image = inner.snapshot();
        assert!(image[..4096].iter().all(|byte| *byte == 1));
        assert!(image[4096..8192].iter().all(|byte| *byte == 0));
    }

    /// A memory device whose flush yields, so that two flushes interleave.
    struct SlowFlush(MemoryDevice);

    #[async_trait::async_trait]
    impl BlockDevice for SlowFlush {
        fn name(&self) -> &str {
            "slow-flush"
        }

        fn size_bytes(&self) -> u64 {
            self.0.size_bytes()
        }

        fn read(&self, offset: u64, length: usize) -> crate::DeviceReadFuture<'_> {
            self.0.read(offset, length)
        }

        async fn write(&self, offset: u64, data: Arc<AlignedBuffer>) -> Result<(), DeviceError> {
            self.0.write(offset, data).await
        }

        async fn flush(&self) -> Result<(), DeviceError> {
            for _ in 0..4 {
                tokio::task::yield_now().await;
            }
            self.0.flush().await
        }
    }

    /// Two flushes that overlap both cover the writes before them; neither may
    /// retire writes the other already retired, nor writes made after it began.
    #[tokio::test(flavor = "current_thread")]
    async fn overlapping_flushes_retire_each_write_once() {
        let device = Arc::new(FaultyDevice::new(
            Arc::new(SlowFlush(MemoryDevice::new(65536))),
            1,
        ));
        let mut buffer = AlignedBuffer::zeroed(4096);
        buffer.fill(1);
        device.write(0, Arc::new(buffer)).await.unwrap();
        let (first, second) = tokio::join!(device.flush(), device.flush());
        first.unwrap();
        second.unwrap();
        let mut buffer = AlignedBuffer::zeroed(4096);
        buffer.fill(2);
        device.write(4096, Arc::new(buffer)).await.unwrap();
        // Only the write after both flushes is still pending.
        assert_eq!(device.power_cut(PowerCutStyle::DropAll).await.unwrap(), 1);
    }

    #[tokio::test]
    async fn random_cuts_leave_each_sector_old_or_new() {
        for seed in 0..50 {
            let inner = Arc::new(MemoryDevice::new(65536));
            let device = FaultyDevice::new(inner.clone(), seed);
            write_byte(&device, 0, 1).await;
            device.flush().await.unwrap();
            write_byte(&device, 0, 2).await;
            write_byte(&device, 0, 3).await;
            device.power_cut(PowerCutStyle::Random).await.unwrap();
            let image = inner.snapshot();
            for sector in image[..4096].chunks(512) {
                assert!(sector.iter().all(|byte| *byte == sector[0]));
                assert!([1, 2, 3].contains(&sector[0]));
            }
        }
    }

    #[tokio::test]
    async fn injected_failures_and_bit_flips() {
        let inner = Arc::new(MemoryDevice::new(65536));
        let device = FaultyDevice::new(inner.clone(), 7);
        device.fail_writes_in(8192..12288).await;
        let buffer = Arc::new(AlignedBuffer::zeroed(4096));
        assert!(device.write(8192, buffer.clone()).await.is_err());
        assert!(device.write(0, buffer).await.is_ok());
        device.flip_bit(5, 0).await.unwrap();
        assert_eq!(device.read(0, 4096).await.unwrap()[5], 1);
        device.fail_reads_in(0..4096).await;
        assert!(device.read(0, 4096).await.is_err());
        device.heal().await;
        assert!(device.read(0, 4096).await.is_ok());
    }

    #[tokio::test]
    async fn out_of_space_refuses_writes_until_space_returns() {
        let inner = Arc::new(MemoryDevice::new(65536));
        let device = FaultyDevice::new(inner.clone(), 3);
        device.run_out_of_space(true).await;
        let mut buffer = AlignedBuffer::zeroed(4096);
        buffer.fill(9);
        let buffer = Arc::new(buffer);
        let error = device.write(0, buffer.clone()).await.unwrap_err();
        assert!(error.is_out_of_space(), "{error}");
        assert_eq!(inner.snapshot()[0], 0, "nothing written");
        device.flush().await.unwrap();
        assert!(device.read(0, 4096).await.is_ok());
        device.run_out_of_space(false).await;
        device.write(0, buffer).await.unwrap();
        assert_eq!(inner.snapshot()[0], 9);
    }
}
