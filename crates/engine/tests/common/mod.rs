//! Helpers shared by the engine's integration tests: finding the newest
//! checkpoint slot on a memory device, and corrupting it so that recovery must
//! fall back to the older checkpoint; the crash tests' shadow model lives in
//! `shadow.rs`, block contents and writes in `blocks.rs`, pool options and
//! limits in `pools.rs`, reads held at a gate in `read_gate.rs`, this
//! machine's files as data in `machine_files.rs`.

#![allow(dead_code)]

pub mod blocks;
pub mod machine_files;
pub mod pools;
pub mod read_gate;
pub mod shadow;

use lamina_device::MemoryDevice;
use lamina_engine::log::checkpoint::Slot;
use lamina_engine::log::geometry::CHECKPOINT_SLOT_BLOCKS;
use lamina_engine::log::superblock::Superblock;

const BLOCK: usize = 4096;

/// The valid slot with the highest checkpoint sequence, and its device block.
pub fn newest_slot(memory: &MemoryDevice) -> (u64, Slot) {
    CHECKPOINT_SLOT_BLOCKS
        .iter()
        .filter_map(|block| {
            let mut bytes = vec![0u8; BLOCK];
            memory.read_sync(block * BLOCK as u64, &mut bytes);
            Slot::decode(&bytes).ok().map(|slot| (*block, slot))
        })
        .max_by_key(|(_, slot)| slot.checkpoint_sequence)
        .expect("a valid checkpoint slot")
}

/// The device block where checkpoint `checkpoint_sequence`'s body starts,
/// if the newest slot's chain holds it.
pub fn checkpoint_body_block(memory: &MemoryDevice, checkpoint_sequence: u64) -> Option<u64> {
    let (_, slot) = newest_slot(memory);
    let link = slot
        .chain()
        .into_iter()
        .find(|link| link.checkpoint_sequence == checkpoint_sequence)?;
    let mut bytes = vec![0u8; BLOCK];
    memory.read_sync(0, &mut bytes);
    let (_, superblock) = Superblock::decode(&bytes).expect("the superblock decodes");
    Some(
        superblock
            .geometry
            .segment_first_block(link.body_segments[0]),
    )
}

/// Flips a bit in the payload of checkpoint `checkpoint_sequence`'s body (a
/// base or an increment of the newest slot's chain), so that its checksum
/// fails.
pub fn corrupt_checkpoint_body(memory: &MemoryDevice, checkpoint_sequence: u64) {
    let block = checkpoint_body_block(memory, checkpoint_sequence)
        .expect("the newest slot's chain holds the checkpoint");
    let mut bytes = vec![0u8; BLOCK];
    memory.read_sync(block * BLOCK as u64, &mut bytes);
    // Past the 24-byte frame header: every body is longer than that.
    bytes[26] ^= 0x10;
    memory.write_sync(block * BLOCK as u64, &bytes);
}

/// Flips a bit in the newest checkpoint's body (a base or an increment), so
/// that recovery must fall back to the older slot. Returns whether it was an
/// increment.
pub fn corrupt_newest_checkpoint_body(memory: &MemoryDevice) -> bool {
    let (_, slot) = newest_slot(memory);
    corrupt_checkpoint_body(memory, slot.checkpoint_sequence);
    !slot.earlier_links.is_empty()
}

/// Flips a bit in the newest checkpoint slot, so that recovery must fall back to
/// the previous checkpoint and replay everything after it.
pub fn corrupt_newest_checkpoint_slot(memory: &MemoryDevice) {
    let (block, _) = newest_slot(memory);
    let mut bytes = vec![0u8; BLOCK];
    memory.read_sync(block * BLOCK as u64, &mut bytes);
    bytes[30] ^= 0x10;
    memory.write_sync(block * BLOCK as u64, &bytes);
}

/// A device that passes requests to the one under it, for tests that need to
/// see or steer the pool's I/O: it records the longest read made while
/// `recording` is set, can make every read, write or flush take a while (a
/// memory device answers at once, so nothing else would run meanwhile), and
/// can hold reads at a gate until it opens.
pub struct InstrumentedDevice {
    inner: std::sync::Arc<dyn lamina_device::BlockDevice>,
    pub recording: std::sync::atomic::AtomicBool,
    pub longest_read_bytes: std::sync::atomic::AtomicUsize,
    /// Bytes read while `recording`, all reads together.
    pub read_bytes: std::sync::atomic::AtomicUsize,
    flush_delay: std::time::Duration,
    read_delay: std::time::Duration,
    write_delay: std::time::Duration,
    read_gate: Option<tokio::sync::watch::Receiver<bool>>,
}

impl InstrumentedDevice {
    pub fn new(inner: std::sync::Arc<dyn lamina_device::BlockDevice>) -> Self {
        Self {
            inner,
            recording: false.into(),
            longest_read_bytes: 0.into(),
            read_bytes: 0.into(),
            flush_delay: std::time::Duration::ZERO,
            read_delay: std::time::Duration::ZERO,
            write_delay: std::time::Duration::ZERO,
            read_gate: None,
        }
    }

    /// Every flush first sleeps for `delay`.
    pub fn with_flush_delay(mut self, delay: std::time::Duration) -> Self {
        self.flush_delay = delay;
        self
    }

    /// Every read first sleeps for `delay` (tokio's clock): a slow device,
    /// for clients and background work alike.
    pub fn with_read_delay(mut self, delay: std::time::Duration) -> Self {
        self.read_delay = delay;
        self
    }

    /// Every write first sleeps for `delay` (tokio's clock), so that the
    /// pool's batches, relocations and checkpoints take time.
    pub fn with_write_delay(mut self, delay: std::time::Duration) -> Self {
        self.write_delay = delay;
        self
    }

    /// Every read first waits until `gate` holds `true`.
    pub fn with_read_gate(mut self, gate: tokio::sync::watch::Receiver<bool>) -> Self {
        self.read_gate = Some(gate);
        self
    }
}

#[async_trait::async_trait]
impl lamina_device::BlockDevice for InstrumentedDevice {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn has_redundancy(&self) -> bool {
        self.inner.has_redundancy()
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read(&self, offset: u64, length: usize) -> lamina_device::DeviceReadFuture<'_> {
        lamina_device::DeviceReadFuture::from_or_box(async move {
            if let Some(gate) = &self.read_gate {
                let mut gate = gate.clone();
                gate.wait_for(|open| *open)
                    .await
                    .expect("gate sender alive");
            }
            if !self.read_delay.is_zero() {
                tokio::time::sleep(self.read_delay).await;
            }
            if self.recording.load(std::sync::atomic::Ordering::Relaxed) {
                self.longest_read_bytes
                    .fetch_max(length, std::sync::atomic::Ordering::Relaxed);
                self.read_bytes
                    .fetch_add(length, std::sync::atomic::Ordering::Relaxed);
            }
            self.inner.read(offset, length).await
        })
    }

    async fn write(
        &self,
        offset: u64,
        data: std::sync::Arc<lamina_device::AlignedBuffer>,
    ) -> Result<(), lamina_device::DeviceError> {
        if !self.write_delay.is_zero() {
            tokio::time::sleep(self.write_delay).await;
        }
        self.inner.write(offset, data).await
    }

    async fn flush(&self) -> Result<(), lamina_device::DeviceError> {
        if !self.flush_delay.is_zero() {
            tokio::time::sleep(self.flush_delay).await;
        }
        self.inner.flush().await
    }
}

/// Flips a bit in the payload of the newest (or the older) segment openings
/// record (format version 8), as a rotted sector would. Returns false when
/// no area holds a record.
pub fn corrupt_segment_openings_record(memory: &MemoryDevice, newest: bool) -> bool {
    use lamina_engine::log::geometry::SEGMENT_OPENINGS_AREA_BLOCKS;
    use lamina_engine::log::openings::SegmentOpeningsRecord;
    let mut found: Vec<(u64, u64)> = SEGMENT_OPENINGS_AREA_BLOCKS
        .iter()
        .filter_map(|block| {
            let mut bytes = vec![0u8; 128 * BLOCK];
            memory.read_sync(block * BLOCK as u64, &mut bytes);
            SegmentOpeningsRecord::decode(&bytes)
                .ok()
                .map(|record| (record.record_sequence, *block))
        })
        .collect();
    found.sort_unstable();
    let chosen = if newest { found.last() } else { found.first() };
    let Some((_, block)) = chosen else {
        return false;
    };
    let mut bytes = vec![0u8; BLOCK];
    memory.read_sync(block * BLOCK as u64, &mut bytes);
    bytes[25] ^= 0x04;
    memory.write_sync(block * BLOCK as u64, &bytes);
    true
}
