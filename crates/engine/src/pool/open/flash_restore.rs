//! Restoring a two-tier pool whose flash device is lost, from its capacity
//! tier alone (format version 9, decision 0038). The capacity device holds the
//! pool's label (a copy of the superblock), a copy of each checkpoint slot and
//! every checkpoint body; this writes onto a new, empty flash device what
//! recovery reads from flash (the superblock, its copy and the slots), so that
//! `Pool::open_restored` then recovers the pool as of the newest checkpoint
//! whose chain verifies (the capacity tier's batches after it are replayed
//! only where they move contents that checkpoint holds: the flash held the
//! rest of what came after it, so the volumes are as of that one point,
//! decision 0056) and marks lost the map entries whose data went with the
//! flash device: they read as I/O errors and hold no space; see
//! docs/format.md, "Slot copies on the capacity tier".

use lamina_device::BlockDevice;

use crate::convert::to_usize;
use crate::error::{EngineError, OpenError};
use crate::log::checkpoint::Slot;
use crate::log::geometry::{
    CAPACITY_SLOT_COPY_BLOCKS, CAPACITY_SLOT_COPY_SIZE_BLOCKS, CHECKPOINT_SLOT_BLOCKS,
    SUPERBLOCK_BLOCK, SUPERBLOCK_COPY_BLOCK,
};
use crate::log::superblock::Superblock;
use crate::pool::core::aligned;
use crate::pool::open::create::{
    check_device_starts_empty, write_empty_openings_areas, write_superblock_and_copy,
    write_zeroed_flush_markers,
};
use crate::{BLOCK_BYTES, BLOCK_SIZE_BYTES};

/// What a restore found on the capacity tier and wrote onto the new flash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoredFlash {
    /// The checkpoints whose slot copies decoded, newest first (recovery
    /// still checks their bodies and falls back to the older one).
    pub checkpoint_sequences: Vec<u64>,
}

/// The device a restore writes onto: the new flash device followed by the
/// pool's capacity device, as one address space (`ConcatenatedDevice`).
pub struct FlashRestore<'a> {
    pub device: &'a dyn BlockDevice,
    /// Where the capacity device starts in `device`: the new flash device's
    /// size, which must be the lost one's.
    pub flash_region_bytes: u64,
    /// Write over a flash device that already holds data.
    pub force: bool,
}

/// Writes onto the flash region of `restore.device` the superblock and
/// the checkpoint slots copied on the capacity tier, then flushes; open
/// the pool with `Pool::open_restored` afterwards (`Pool::open` would
/// leave the lost blocks mapped to the new flash, holding its space).
/// Refuses a flash region of
/// another size than the lost one's, a flash device holding data (unless
/// forced), a capacity device without a label, and one without a usable
/// slot copy (a pool last written by a build older than format version 9).
pub(in crate::pool) async fn restore_flash(
    restore: FlashRestore<'_>,
) -> Result<RestoredFlash, EngineError> {
    let device = restore.device;
    let superblock = read_capacity_label(device, restore.flash_region_bytes).await?;
    if !restore.force {
        check_device_starts_empty(device, &[0]).await?;
    }
    let copies = read_slot_copies(device, restore.flash_region_bytes).await?;
    if copies.iter().all(Option::is_none) {
        return Err(EngineError::Open(OpenError::NoCheckpointCopy {
            device: device.name().to_string(),
            offset: restore.flash_region_bytes,
        }));
    }
    write_flash_metadata(device, &superblock, &copies).await?;
    let mut checkpoint_sequences: Vec<u64> = copies
        .iter()
        .flatten()
        .map(|slot| slot.checkpoint_sequence)
        .collect();
    checkpoint_sequences.sort_unstable_by(|a, b| b.cmp(a));
    tracing::warn!(
        device = device.name(),
        ?checkpoint_sequences,
        "flash device restored from the capacity tier: blocks that were on the lost flash only will read as errors"
    );
    Ok(RestoredFlash {
        checkpoint_sequences,
    })
}

/// The size of the flash device the pool on `capacity` (a capacity
/// device alone, without the flash before it) was created with: what a
/// new flash device must measure to restore it.
pub(in crate::pool) async fn lost_flash_region_bytes(
    capacity: &dyn BlockDevice,
) -> Result<u64, EngineError> {
    let superblock = label_at(capacity, 0).await?;
    if !superblock.geometry.has_capacity_tier() {
        return Err(EngineError::Open(OpenError::NotAPool {
            device: capacity.name().to_string(),
        }));
    }
    Ok(superblock.geometry.capacity_start_block * BLOCK_SIZE_BYTES)
}

/// The superblock a capacity label at `offset` of `device` holds (or, when
/// the label fails its checks, the label's copy).
async fn label_at(device: &dyn BlockDevice, offset: u64) -> Result<Superblock, EngineError> {
    for block in [SUPERBLOCK_BLOCK, SUPERBLOCK_COPY_BLOCK] {
        let bytes = device
            .read(offset + block * BLOCK_SIZE_BYTES, BLOCK_BYTES)
            .await?;
        if let Ok((_, superblock)) = Superblock::decode(&bytes) {
            return Ok(superblock);
        }
    }
    Err(EngineError::Open(OpenError::NotAPool {
        device: format!("{} (capacity tier at offset {offset})", device.name()),
    }))
}

/// The superblock the capacity device's label holds, checked against the
/// restore's geometry.
async fn read_capacity_label(
    device: &dyn BlockDevice,
    flash_region_bytes: u64,
) -> Result<Superblock, EngineError> {
    let name = device.name().to_string();
    let superblock = label_at(device, flash_region_bytes).await?;
    let geometry = superblock.geometry;
    if !geometry.has_capacity_tier()
        || geometry.capacity_start_block * BLOCK_SIZE_BYTES != flash_region_bytes
    {
        return Err(EngineError::Open(OpenError::FlashSizeMismatch {
            device: name,
            expected_bytes: geometry.capacity_start_block * BLOCK_SIZE_BYTES,
            actual_bytes: flash_region_bytes,
        }));
    }
    if device.size_bytes() < geometry.device_size_bytes {
        return Err(EngineError::Open(OpenError::Truncated {
            device: name,
            expected_bytes: geometry.device_size_bytes,
            actual_bytes: device.size_bytes(),
        }));
    }
    Ok(superblock)
}

/// Each slot copy that decodes, by slot index.
async fn read_slot_copies(
    device: &dyn BlockDevice,
    flash_region_bytes: u64,
) -> Result<[Option<Slot>; 2], EngineError> {
    let mut copies = [None, None];
    for (slot_index, copy) in copies.iter_mut().enumerate() {
        let offset = flash_region_bytes + CAPACITY_SLOT_COPY_BLOCKS[slot_index] * BLOCK_SIZE_BYTES;
        let bytes = device
            .read(
                offset,
                to_usize(CAPACITY_SLOT_COPY_SIZE_BLOCKS * BLOCK_SIZE_BYTES),
            )
            .await?;
        match Slot::decode(&bytes) {
            Ok(slot) => *copy = Some(slot),
            Err(error) => tracing::warn!(
                device = device.name(),
                slot_index,
                %error,
                "no usable checkpoint slot copy on the capacity tier"
            ),
        }
    }
    Ok(copies)
}

/// Writes the flash device's metadata: the superblock and its copy, zeroed
/// flush markers, each slot from its copy (zeroed without one) and empty
/// segment openings areas (so that recovery scans every segment), then
/// flushes.
async fn write_flash_metadata(
    device: &dyn BlockDevice,
    superblock: &Superblock,
    copies: &[Option<Slot>; 2],
) -> Result<(), EngineError> {
    write_superblock_and_copy(device, 0, superblock).await?;
    write_zeroed_flush_markers(device).await?;
    for (slot_index, copy) in copies.iter().enumerate() {
        let encoded = match copy {
            Some(slot) => slot.encode(),
            None => vec![0u8; BLOCK_BYTES],
        };
        device
            .write(
                CHECKPOINT_SLOT_BLOCKS[slot_index] * BLOCK_SIZE_BYTES,
                aligned(&encoded),
            )
            .await?;
    }
    write_empty_openings_areas(device).await?;
    device.flush().await?;
    Ok(())
}
