//! The device layer: the only way lamina touches bytes. A device is a flat array of
//! bytes with read, write, flush and size; everything above (layout, log, volumes)
//! is written against the [`BlockDevice`] trait so that the same engine runs on a
//! file or block device (io_uring, O_DIRECT), in memory, or on a fault-injecting
//! wrapper that simulates I/O errors, bit flips and power cuts in tests, or behind a
//! rotating-disk latency model that makes any device behave like a capacity disk.

mod buffer;
mod concatenated;
mod error;
mod faulty;
mod file;
mod lock;
mod memory;
mod rotating;

pub use buffer::{AlignedBuffer, LARGE_RECYCLED_BUFFER_BYTES_MAX};
pub use concatenated::ConcatenatedDevice;
pub use error::{DeviceError, DeviceErrorKind};
pub use faulty::{FaultyDevice, PowerCutStyle};
pub use file::{
    FileDevice, FileDeviceOptions, FilePreallocation, IoBackend, thread_has_device_completions,
};
pub use lock::{CREATED_FILE_MODE, LockHolder, find_flock_holder};
pub use memory::MemoryDevice;
pub use rotating::{RotatingDiskDevice, RotatingDiskModel, RotatingDiskStatistics};

/// The alignment, in bytes, of every offset and length passed to a device, and of
/// every buffer. 4096 satisfies O_DIRECT on all devices lamina targets.
pub const DEVICE_ALIGNMENT_BYTES: u64 = 4096;

/// The unit a power cut may tear a write at: a write in flight may persist any
/// subset of its 512-byte sectors.
pub const SECTOR_SIZE_BYTES: u64 = 512;

/// A byte count or a position within a buffer in memory, as a `usize`. The
/// buffer exists, so the value fits; a failure is a programmer error.
pub(crate) fn buffer_length(bytes: u64) -> usize {
    usize::try_from(bytes).expect("a length within a buffer in memory fits in a usize")
}

/// Bytes a device's read future may take. A cache-miss read of a client
/// block makes one device read, so its future is held in place in the
/// caller's future, not boxed (decision 0044): `FileDevice` and
/// `MemoryDevice` build theirs with `StackFuture::from`, which fails to
/// compile if it grows past this; devices that wrap another's read (arrays,
/// fault injection, tiers) box theirs with `from_or_box`. `FileDevice`'s
/// needs about 250 bytes (2026-11-29).
pub const DEVICE_READ_FUTURE_BYTES: usize = 512;

/// The future of [`BlockDevice::read`].
pub type DeviceReadFuture<'a> =
    stackfuture::StackFuture<'a, Result<AlignedBuffer, DeviceError>, DEVICE_READ_FUTURE_BYTES>;

/// Where bytes live. Offsets and lengths are multiples of [`DEVICE_ALIGNMENT_BYTES`].
///
/// Durability model (the same as a disk with a volatile write cache): a completed
/// `write` is visible to later reads at once but may be lost or torn by a power cut
/// until a `flush` that started after the write completed has itself completed.
#[async_trait::async_trait]
pub trait BlockDevice: Send + Sync + 'static {
    /// A short human name for errors and logs (a path, or "memory").
    fn name(&self) -> &str;

    /// Usable size in bytes (a multiple of [`DEVICE_ALIGNMENT_BYTES`]).
    fn size_bytes(&self) -> u64;

    /// Reads `length` bytes at `offset` into a fresh aligned buffer. The
    /// future is returned in place rather than boxed (see
    /// [`DeviceReadFuture`]).
    fn read(&self, offset: u64, length: usize) -> DeviceReadFuture<'_>;

    /// Writes the whole of `data` at `offset`. The buffer is shared so that the
    /// caller can keep serving reads from it while the write is in flight.
    async fn write(
        &self,
        offset: u64,
        data: std::sync::Arc<AlignedBuffer>,
    ) -> Result<(), DeviceError>;

    /// Makes every write that completed before this call durable.
    async fn flush(&self) -> Result<(), DeviceError>;

    /// Makes every write to `offset..offset + length` that completed before
    /// this call durable; it may make more durable. A device made of parts
    /// (`ConcatenatedDevice`) flushes only the parts the range touches, so
    /// that a pool can make its flash tier durable while its capacity tier
    /// (an object store that is away) cannot be. The default flushes
    /// everything.
    async fn flush_range(&self, offset: u64, length: u64) -> Result<(), DeviceError> {
        let _ = (offset, length);
        self.flush().await
    }

    /// The block at `offset` failed the caller's check (its checksum): rebuilds
    /// it from the device's redundancy, returns the first candidate that passes
    /// `is_valid`, and rewrites the damaged copy. `Ok(None)` when the device has
    /// no redundancy (the default) or no candidate passes.
    async fn recover_block(
        &self,
        offset: u64,
        is_valid: BlockCheck<'_>,
    ) -> Result<Option<AlignedBuffer>, DeviceError> {
        let _ = (offset, is_valid);
        Ok(None)
    }

    /// [`BlockDevice::recover_block`] for a range read as a whole (a
    /// metadata frame of several blocks): the first stored copy of the whole
    /// range that passes `is_valid`, the bad copies rewritten. By default a
    /// single block is recovered as such and longer ranges not at all.
    async fn recover_range(
        &self,
        offset: u64,
        length: usize,
        is_valid: BlockCheck<'_>,
    ) -> Result<Option<AlignedBuffer>, DeviceError> {
        if length as u64 == DEVICE_ALIGNMENT_BYTES {
            return self.recover_block(offset, is_valid).await;
        }
        Ok(None)
    }

    /// The first rebuild of `offset..offset + length` (a block or two) from
    /// the device's redundancy that passes `is_valid`, **rewriting nothing**:
    /// for a caller that can judge only part of the range (a compressed
    /// fragment in a block shared with others, decision 0070), which serves
    /// what it checked and leaves the repair to a check of the whole (scrub).
    /// `Ok(None)` when the device has no redundancy (the default) or no
    /// rebuild passes.
    async fn reconstruct_range(
        &self,
        offset: u64,
        length: usize,
        is_valid: BlockCheck<'_>,
    ) -> Result<Option<AlignedBuffer>, DeviceError> {
        let _ = (offset, length, is_valid);
        Ok(None)
    }

    /// Whether a replacement device beneath this one is being rebuilt (an
    /// array member being replaced): the layer above then calls
    /// [`BlockDevice::rebuild_range`] over everything it keeps and
    /// [`BlockDevice::finish_rebuild`] at the end. False by default.
    fn rebuild_pending(&self) -> bool {
        false
    }

    /// Writes to the replacement what it must hold of `offset..offset +
    /// length`, rebuilt from the other members and checked block by block
    /// with `is_valid` (a block the layer above does not know passes).
    /// Idempotent, and ranges are given in ascending order. Nothing to do by
    /// default.
    async fn rebuild_range(
        &self,
        offset: u64,
        length: u64,
        is_valid: PlacedBlockCheck<'_>,
    ) -> Result<RebuildReport, DeviceError> {
        let _ = (offset, length, is_valid);
        Ok(RebuildReport::default())
    }

    /// Scrub: checks every column of every row of `offset..offset +
    /// length` that holds a block `blocks` holds (its data against
    /// `blocks.is_valid`, the row's parity or copies against its data), and
    /// rewrites what disagrees so that every row is whole again: after a
    /// scrub that reports nothing unrepairable, losing as many more devices
    /// as the redundancy covers loses none of the held blocks. The default,
    /// for a device without redundancy, reads the held blocks and counts
    /// those that fail as unrepairable.
    async fn scrub_range(
        &self,
        offset: u64,
        length: u64,
        blocks: &dyn ScrubBlocks,
    ) -> Result<ScrubReport, DeviceError> {
        scrub_without_redundancy(self, offset, length, blocks).await
    }

    /// Scrub of a metadata frame kept in copies (an array's mirrored
    /// prefix) at `offset..offset + length`: every copy that fails
    /// `is_valid` is rewritten from one that passes. Nothing to check by
    /// default (one copy).
    async fn scrub_copies(
        &self,
        offset: u64,
        length: usize,
        is_valid: BlockCheck<'_>,
    ) -> Result<ScrubReport, DeviceError> {
        let _ = (offset, length, is_valid);
        Ok(ScrubReport::default())
    }

    /// Every range was rebuilt: the replacement takes its member's place.
    async fn finish_rebuild(&self) -> Result<(), DeviceError> {
        Ok(())
    }

    /// How the region `offset..offset + length` (one of the layer above's
    /// segments) is laid out now: how much of it holds data, the alignment of
    /// writes into it, and whether it lost redundancy. `None` (the default)
    /// when the device lays every region out alike: all of it usable, at the
    /// alignment the layer above was created with.
    fn region_shape(&self, offset: u64, length: u64) -> Option<RegionShape> {
        let _ = (offset, length);
        None
    }

    /// The region `offset..offset + length` holds nothing the layer above
    /// needs and is about to be written from its start: the device lays it
    /// out over the devices in use now (an array narrowed to its surviving
    /// or widened to its added members), durably before returning, and
    /// returns the shape every later read and write of the region follows
    /// until the region is opened again. `None` (the default) as for
    /// [`BlockDevice::region_shape`].
    async fn open_region(
        &self,
        offset: u64,
        length: u64,
    ) -> Result<Option<RegionShape>, DeviceError> {
        let _ = (offset, length);
        Ok(None)
    }

    /// Opens every region `offset..offset + length_bytes`, for each of
    /// `offsets`, as [`BlockDevice::open_region`] does, durably before
    /// returning, and returns their shapes in the same order. A device that
    /// records layouts may record the whole batch in one durable update (an
    /// array: one zone-table write, not one per region), which is why the
    /// caller must own every region (none written or read meanwhile). On an
    /// error each region is either laid out as before or as it would be
    /// now, and the caller may open it again. The default opens them one at
    /// a time.
    async fn open_regions(
        &self,
        offsets: &[u64],
        length_bytes: u64,
    ) -> Result<Vec<Option<RegionShape>>, DeviceError> {
        let mut shapes = Vec::with_capacity(offsets.len());
        for offset in offsets {
            shapes.push(self.open_region(*offset, length_bytes).await?);
        }
        Ok(shapes)
    }

    /// Restores the redundancy of what the device keeps outside regions (an
    /// array's mirrored metadata, copied again onto a member in use after a
    /// holder was lost), so that it survives as many more losses as new
    /// regions do. Nothing to do by default.
    async fn restore_metadata_redundancy(&self) -> Result<(), DeviceError> {
        Ok(())
    }

    /// Bytes a region `offset..offset + length` opened now would hold (what
    /// [`BlockDevice::open_region`] would make of it), for the layer above's
    /// estimate of its room after a loss, removal or addition. `None` as
    /// for [`BlockDevice::region_shape`].
    fn new_region_usable_bytes(&self, offset: u64, length: u64) -> Option<u64> {
        let _ = (offset, length);
        None
    }

    /// Whether the device keeps redundancy from which a damaged block can be
    /// rebuilt (an array's parity or mirrors). False by default; a device
    /// that wraps another says what the wrapped one says.
    fn has_redundancy(&self) -> bool {
        false
    }

    /// Whether a region opened now would have the device's full redundancy:
    /// false while members are lost and too few remain to lay a region out
    /// without them. Moving data out of degraded regions restores redundancy
    /// only while this holds. True by default.
    fn new_regions_redundant(&self) -> bool {
        true
    }
}

/// What [`BlockDevice::region_shape`] and [`BlockDevice::open_region`] say of
/// one region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionShape {
    /// Bytes from the region's start that hold data; the rest of the region
    /// is neither read nor written. At most the region's length, a multiple
    /// of `row_bytes`.
    pub usable_bytes: u64,
    /// Every write into the region starts at a multiple of this many bytes
    /// from the region's start (an array's data bytes per row).
    pub row_bytes: u64,
    /// Part of the region lives on a device out of use (lost, or being
    /// removed): its data is readable but has less redundancy than the
    /// device offers, until it is moved to a region opened since.
    pub degraded: bool,
    /// The region is laid out over exactly the devices a region opened now
    /// would use; false after a loss (it holds a lost device) or an
    /// addition (it lacks the new one): opened again before it is written,
    /// it gets the full redundancy or width of the devices in use.
    pub current: bool,
    /// Its data can be read: no more of its devices are lost than its
    /// redundancy covers. False means what the region holds is lost.
    pub readable: bool,
}

/// What [`BlockDevice::rebuild_range`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RebuildReport {
    /// Blocks written to the replacement.
    pub blocks_rebuilt: u64,
    /// Rows whose data blocks all passed the caller's check.
    pub rows_verified: u64,
    /// Blocks that no reconstruction made pass the check (written as
    /// reconstructed; the layer above reports them as errors when read).
    pub blocks_unrepairable: u64,
}

impl RebuildReport {
    pub fn add(&mut self, other: RebuildReport) {
        self.blocks_rebuilt += other.blocks_rebuilt;
        self.rows_verified += other.rows_verified;
        self.blocks_unrepairable += other.blocks_unrepairable;
    }
}

/// What a scrub is told of the blocks of a range, by device block index.
pub trait ScrubBlocks: Send + Sync {
    /// Whether the layer above keeps the block (its contents matter).
    fn is_held(&self, block_index: u64) -> bool;
    /// Whether `contents` is what the layer above keeps at `block_index`;
    /// true for a held block it cannot check (metadata without a checksum
    /// of its own) and for a block it does not hold.
    fn is_valid(&self, block_index: u64, contents: &[u8]) -> bool;
    /// Whether two rebuilds of held block `block_index` that both pass
    /// [`ScrubBlocks::is_valid`] are the same to the layer above: by default
    /// byte for byte; a block of compressed fragments only where live
    /// fragments lie (the rest is never read).
    fn same_for_holder(&self, block_index: u64, first: &[u8], second: &[u8]) -> bool {
        let _ = block_index;
        first == second
    }
}

/// [`ScrubBlocks`] seen through a shift of block indexes: the blocks of a
/// part of a device that starts `shift_blocks` into the whole (for
/// `ConcatenatedDevice`'s second part).
pub struct ShiftedScrubBlocks<'a> {
    pub blocks: &'a dyn ScrubBlocks,
    pub shift_blocks: u64,
}

impl ScrubBlocks for ShiftedScrubBlocks<'_> {
    fn is_held(&self, block_index: u64) -> bool {
        self.blocks.is_held(block_index + self.shift_blocks)
    }

    fn is_valid(&self, block_index: u64, contents: &[u8]) -> bool {
        self.blocks
            .is_valid(block_index + self.shift_blocks, contents)
    }

    fn same_for_holder(&self, block_index: u64, first: &[u8], second: &[u8]) -> bool {
        self.blocks
            .same_for_holder(block_index + self.shift_blocks, first, second)
    }
}

/// What [`BlockDevice::scrub_range`] and [`BlockDevice::scrub_copies`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubReport {
    /// Rows (or copies) whose every column was checked.
    pub rows_checked: u64,
    /// Held blocks checked against the caller's check.
    pub blocks_checked: u64,
    /// Held blocks that failed their check, rebuilt and rewritten.
    pub blocks_repaired: u64,
    /// Other columns rewritten so that the row agrees with its data again:
    /// parity, copies, columns the caller does not hold.
    pub parity_repaired: u64,
    /// Rows no reconstruction made whole with every held block passing, or
    /// where two reconstructions disagree on a held block the checks cannot
    /// tell right from wrong: left as they are, reported.
    pub rows_unrepairable: u64,
    /// Device block indexes of the held blocks of those rows that fail
    /// their check (the caller may find they died meanwhile).
    pub unrepairable_blocks: Vec<u64>,
    /// Paths of the members faulted because nearly all their columns failed
    /// (their data is rebuilt rather than repaired block by block).
    pub members_faulted: Vec<String>,
}

impl ScrubReport {
    pub fn add(&mut self, other: ScrubReport) {
        self.rows_checked += other.rows_checked;
        self.blocks_checked += other.blocks_checked;
        self.blocks_repaired += other.blocks_repaired;
        self.parity_repaired += other.parity_repaired;
        self.rows_unrepairable += other.rows_unrepairable;
        self.unrepairable_blocks.extend(other.unrepairable_blocks);
        self.members_faulted.extend(other.members_faulted);
    }
}

/// [`BlockDevice::scrub_range`] of a device with no redundancy: each run of
/// held blocks read and checked; a failing block is offered to
/// [`BlockDevice::recover_block`] (a wrapper may still hold a copy) and
/// counted unrepairable when that finds nothing.
pub async fn scrub_without_redundancy<D: BlockDevice + ?Sized>(
    device: &D,
    offset: u64,
    length: u64,
    blocks: &dyn ScrubBlocks,
) -> Result<ScrubReport, DeviceError> {
    let first = offset / DEVICE_ALIGNMENT_BYTES;
    let end = first + length / DEVICE_ALIGNMENT_BYTES;
    let mut report = ScrubReport::default();
    let mut block = first;
    while block < end {
        if !blocks.is_held(block) {
            block += 1;
            continue;
        }
        let run_end = (block..end)
            .find(|index| !blocks.is_held(*index))
            .unwrap_or(end);
        let data = device
            .read(
                block * DEVICE_ALIGNMENT_BYTES,
                buffer_length((run_end - block) * DEVICE_ALIGNMENT_BYTES),
            )
            .await?;
        for (index, contents) in
            (block..run_end).zip(data.chunks_exact(buffer_length(DEVICE_ALIGNMENT_BYTES)))
        {
            report.blocks_checked += 1;
            if blocks.is_valid(index, contents) {
                continue;
            }
            let check = |contents: &[u8]| blocks.is_valid(index, contents);
            match device
                .recover_block(index * DEVICE_ALIGNMENT_BYTES, &check)
                .await?
            {
                Some(_) => report.blocks_repaired += 1,
                None => {
                    report.rows_unrepairable += 1;
                    report.unrepairable_blocks.push(index);
                }
            }
        }
        block = run_end;
    }
    Ok(report)
}

/// What the layer above knows the block at a device block index must hold:
/// `is_valid(block_index, contents)`.
pub type PlacedBlockCheck<'a> = &'a (dyn Fn(u64, &[u8]) -> bool + Send + Sync);

/// What the layer above knows a block must hold (its checksum): how a device
/// with redundancy tells a good reconstruction from a bad one.
pub type BlockCheck<'a> = &'a (dyn Fn(&[u8]) -> bool + Send + Sync);

/// Checks an I/O request against the device's geometry. Misaligned requests are
/// programmer errors in the layers above, so they panic; out-of-range requests are
/// operating errors (a truncated device) and return a typed error.
pub fn check_request(
    device_name: &str,
    device_size_bytes: u64,
    offset: u64,
    length: u64,
) -> Result<(), DeviceError> {
    assert!(
        offset.is_multiple_of(DEVICE_ALIGNMENT_BYTES)
            && length.is_multiple_of(DEVICE_ALIGNMENT_BYTES),
        "misaligned device request on {device_name}: offset {offset} length {length}"
    );
    match offset.checked_add(length) {
        Some(end) if end <= device_size_bytes => Ok(()),
        _ => Err(DeviceError::new(
            DeviceErrorKind::OutOfRange {
                size_bytes: device_size_bytes,
            },
            device_name,
            offset,
            length,
        )),
    }
}
