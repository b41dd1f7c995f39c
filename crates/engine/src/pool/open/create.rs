//! Creating a pool: the geometry a device of a given size gets, the checks
//! that each tier has room and that the device is empty, and the first
//! writes of a new pool (superblock and copy, capacity label, zeroed flush
//! markers, slots and segment openings areas). Restoring a lost flash device
//! writes the same areas (`flash_restore.rs`).

use lamina_device::BlockDevice;

use crate::convert::to_usize;
use crate::error::{CreateError, EngineError};
use crate::log::geometry::{
    CHECKPOINT_SLOT_BLOCKS, FLUSH_MARKER_BLOCKS, Geometry, SEGMENT_OPENINGS_AREA_BLOCKS,
    SEGMENT_OPENINGS_AREA_SIZE_BLOCKS, SUPERBLOCK_BLOCK, SUPERBLOCK_COPY_BLOCK, Tier,
};
use crate::log::openings::SegmentOpeningsRecord;
use crate::log::superblock::Superblock;
use crate::pool::core::aligned;
use crate::pool::core::limits::PoolOptions;
use crate::pool::openings::write_record;
use crate::pool::space::{self};
use crate::{BLOCK_BYTES, BLOCK_SIZE_BYTES};

/// Flash segments of a two-tier pool beyond its reserves, at least: room for
/// the log heads, promotions and the demoter's free target.
pub(super) const FLASH_WORKING_SEGMENT_COUNT_MIN: usize = 8;

/// Capacity segments of a two-tier pool beyond its reserves, at least.
pub(super) const CAPACITY_WORKING_SEGMENT_COUNT_MIN: usize = 4;

/// Bytes of the device's start that must be zero before a pool is created on it
/// without `PoolOptions::force`.
pub(super) const EMPTY_CHECK_BYTES: u64 = 1 << 20;

/// The geometry `options` ask for on a device of `device`'s size: one tier
/// on the whole device, or a flash tier on its first
/// `options.flash_region_bytes` and a capacity tier on the rest.
pub(super) fn geometry_for_device(
    device: &dyn BlockDevice,
    options: &PoolOptions,
) -> Result<Geometry, EngineError> {
    let geometry = tiers_for_device(device, options)?;
    geometry
        .with_rows(options.flash_row_blocks, options.capacity_row_blocks)
        .ok_or(EngineError::Create(CreateError::SegmentNotWholeRows {
            segment_size_blocks: geometry.segment_size_blocks,
            flash_row_blocks: options.flash_row_blocks,
            capacity_row_blocks: options.capacity_row_blocks,
        }))
}

/// [`geometry_for_device`] before row alignment.
pub(super) fn tiers_for_device(
    device: &dyn BlockDevice,
    options: &PoolOptions,
) -> Result<Geometry, EngineError> {
    let size_bytes = device.size_bytes();
    let segment_size_bytes = options.segment_size_bytes;
    let Some(flash_bytes) = options.flash_region_bytes else {
        return Geometry::for_device(size_bytes, segment_size_bytes).ok_or_else(|| {
            EngineError::Create(CreateError::DeviceTooSmall {
                device: device.name().to_string(),
                size_bytes,
                minimum_bytes: Geometry::minimum_device_bytes(segment_size_bytes),
            })
        });
    };
    assert!(
        flash_bytes.is_multiple_of(BLOCK_SIZE_BYTES) && flash_bytes <= size_bytes,
        "the flash region must be whole blocks of the device"
    );
    if Geometry::for_device(flash_bytes, segment_size_bytes).is_none() {
        return Err(EngineError::Create(CreateError::DeviceTooSmall {
            device: format!("{} (flash tier)", device.name()),
            size_bytes: flash_bytes,
            minimum_bytes: Geometry::minimum_device_bytes(segment_size_bytes),
        }));
    }
    let capacity_bytes = size_bytes - flash_bytes;
    Geometry::for_tiers(flash_bytes, capacity_bytes, segment_size_bytes).ok_or_else(|| {
        EngineError::Create(CreateError::DeviceTooSmall {
            device: format!("{} (capacity tier)", device.name()),
            size_bytes: capacity_bytes,
            minimum_bytes: Geometry::minimum_capacity_bytes(segment_size_bytes),
        })
    })
}

/// Checks that each tier of a two-tier geometry has room beyond its
/// reserves. Flash keeps the records' and the cleaner's reserves and needs
/// room beyond them to work; capacity keeps the checkpoint bodies' reserve
/// (sized by both tiers' mappings, about 1.2% of them) and the reserve for
/// cleaning its own segments.
pub(super) fn check_tier_sizes(device_name: &str, geometry: &Geometry) -> Result<(), EngineError> {
    assert!(geometry.has_capacity_tier());
    let flash_needed = space::RECORD_RESERVE_SEGMENT_COUNT
        + space::cleaner_reserve_segment_count(geometry)
        + FLASH_WORKING_SEGMENT_COUNT_MIN;
    if to_usize(geometry.flash_segment_count) < flash_needed {
        return Err(EngineError::Create(CreateError::DeviceTooSmall {
            device: format!("{device_name} (flash tier)"),
            size_bytes: geometry.flash_region_bytes(),
            minimum_bytes: crate::log::geometry::DATA_START_BLOCK * BLOCK_SIZE_BYTES
                + flash_needed as u64 * geometry.segment_size_bytes(),
        }));
    }
    let capacity_needed = space::checkpoint_reserve_segment_count(geometry)
        + space::CAPACITY_RESERVE_SEGMENT_COUNT
        + CAPACITY_WORKING_SEGMENT_COUNT_MIN;
    if to_usize(geometry.capacity_segment_count()) < capacity_needed {
        return Err(EngineError::Create(CreateError::DeviceTooSmall {
            device: format!(
                "{device_name} (capacity tier, which holds the checkpoints of both tiers)"
            ),
            size_bytes: geometry.tier_data_bytes(Tier::Capacity),
            minimum_bytes: crate::log::geometry::CAPACITY_DATA_START_BLOCKS * BLOCK_SIZE_BYTES
                + capacity_needed as u64 * geometry.segment_size_bytes(),
        }));
    }
    Ok(())
}

/// Byte offsets where each tier's device starts: the flash device's holds
/// the superblock, the capacity device's its label.
pub(super) fn tier_device_starts(geometry: &Geometry) -> Vec<u64> {
    let mut device_starts = vec![0];
    if geometry.has_capacity_tier() {
        device_starts.push(geometry.capacity_start_block * BLOCK_SIZE_BYTES);
    }
    device_starts
}

/// Refuses a device whose tiers' first [`EMPTY_CHECK_BYTES`] hold any
/// non-zero byte: it may hold a pool or other data.
pub(super) async fn check_device_starts_empty(
    device: &dyn BlockDevice,
    device_starts: &[u64],
) -> Result<(), EngineError> {
    let size_bytes = device.size_bytes();
    for start in device_starts.iter().copied() {
        let length = EMPTY_CHECK_BYTES.min(size_bytes - start);
        let head = device.read(start, to_usize(length)).await?;
        if let Some(position) = head.iter().position(|byte| *byte != 0) {
            return Err(EngineError::Create(CreateError::DeviceNotEmpty {
                device: device.name().to_string(),
                offset: start + position as u64,
            }));
        }
    }
    Ok(())
}

/// Writes what a new pool starts with, then flushes: the superblock and its
/// copy on the flash device (the capacity device's label and its copy at the
/// same places of that device), zeroed flush markers and zeroed slots.
pub(super) async fn write_new_pool(
    device: &dyn BlockDevice,
    superblock: &Superblock,
    device_starts: &[u64],
) -> Result<(), EngineError> {
    for start in device_starts {
        write_superblock_and_copy(device, *start, superblock).await?;
    }
    write_zeroed_flush_markers(device).await?;
    // Invalidate both slots, so that a forced re-create never finds an old pool's checkpoint.
    for slot_block in CHECKPOINT_SLOT_BLOCKS {
        device
            .write(slot_block * BLOCK_SIZE_BYTES, aligned(&[0u8; BLOCK_BYTES]))
            .await?;
    }
    write_empty_openings_areas(device).await?;
    // Record 1: nothing opened yet.
    let first_record = SegmentOpeningsRecord {
        pool_identifier: superblock.pool_identifier,
        record_sequence: 1,
        floor_segment_sequence: 0,
        overflowed: false,
        openings: Vec::new(),
    };
    write_record(device, &first_record).await?;
    device.flush().await?;
    Ok(())
}

/// Writes `superblock` at blocks 0 and 128 from `start` (the flash device's
/// superblock and its copy, or the capacity device's label and its copy).
pub(super) async fn write_superblock_and_copy(
    device: &dyn BlockDevice,
    start: u64,
    superblock: &Superblock,
) -> Result<(), EngineError> {
    for block in [SUPERBLOCK_BLOCK, SUPERBLOCK_COPY_BLOCK] {
        device
            .write(
                start + block * BLOCK_SIZE_BYTES,
                aligned(&superblock.encode()),
            )
            .await?;
    }
    Ok(())
}

/// Zeros over both flush markers. Written when a flash device is set up, so
/// that a pool file on a file system that later runs full never needs space
/// for them.
pub(super) async fn write_zeroed_flush_markers(
    device: &dyn BlockDevice,
) -> Result<(), EngineError> {
    let markers_bytes = FLUSH_MARKER_BLOCKS.len() * BLOCK_BYTES;
    device
        .write(
            FLUSH_MARKER_BLOCKS[0] * BLOCK_SIZE_BYTES,
            aligned(&vec![0u8; markers_bytes]),
        )
        .await?;
    Ok(())
}

/// Zeros over both areas of the segment openings record (the blocks are
/// then allocated in a pool file).
pub(super) async fn write_empty_openings_areas(
    device: &dyn BlockDevice,
) -> Result<(), EngineError> {
    let area_bytes = to_usize(SEGMENT_OPENINGS_AREA_SIZE_BLOCKS * BLOCK_SIZE_BYTES);
    for area in SEGMENT_OPENINGS_AREA_BLOCKS {
        device
            .write(area * BLOCK_SIZE_BYTES, aligned(&vec![0u8; area_bytes]))
            .await?;
    }
    Ok(())
}
