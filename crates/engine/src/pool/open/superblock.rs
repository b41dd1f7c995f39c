//! What opening reads first: the superblock (or its copy when block 0 is
//! damaged), the capacity device's label, the flush marker, and the checks of
//! the geometry they describe. Also the read of any metadata frame that falls
//! back to the device's redundancy when a copy fails its checks
//! ([`read_metadata`]). Nothing is rewritten until the whole pool has been
//! validated (`CheckedDevice::repair`).

use lamina_device::{AlignedBuffer, BlockDevice};

use crate::error::{EngineError, OpenError};
use crate::log::frame::FrameError;
use crate::log::geometry::{
    FLUSH_MARKER_BLOCKS, Geometry, SUPERBLOCK_BLOCK, SUPERBLOCK_COPY_BLOCK,
};
use crate::log::marker::FlushMarkerRecord;
use crate::log::superblock::Superblock;
use crate::log::{FORMAT_VERSION, FORMAT_VERSION_READ_MIN};
use crate::pool::core::aligned;
use crate::{BLOCK_BYTES, BLOCK_SIZE_BYTES};

/// The device's superblock and, in a two-tier pool, its capacity label,
/// checked against the device.
pub(super) struct CheckedDevice {
    pub(super) superblock: Superblock,
    pub(super) found: FoundSuperblock,
    pub(super) label: Option<FoundLabel>,
}

impl CheckedDevice {
    /// Rewrites whichever superblock or label copy was found damaged or stale.
    pub(super) async fn repair(
        &self,
        device: &dyn BlockDevice,
        name: &str,
    ) -> Result<(), EngineError> {
        self.found.repair(device, name).await?;
        if let Some(label) = &self.label {
            label.repair(device, &self.superblock, name).await?;
        }
        Ok(())
    }
}

/// Reads and validates the superblock (and the capacity label): the
/// geometry must be sound and the device large enough.
pub(super) async fn check_device(
    device: &dyn BlockDevice,
    name: &str,
) -> Result<CheckedDevice, EngineError> {
    let found = read_superblock(device, name).await?;
    let superblock = found.superblock.clone();
    let geometry = superblock.geometry;
    if let Err(reason) = validate_geometry(&geometry) {
        return Err(EngineError::corrupt(name, "superblock", 0, reason));
    }
    if device.size_bytes() < geometry.device_size_bytes {
        return Err(EngineError::Open(OpenError::Truncated {
            device: name.to_string(),
            expected_bytes: geometry.device_size_bytes,
            actual_bytes: device.size_bytes(),
        }));
    }
    let label = if geometry.has_capacity_tier() {
        Some(check_capacity_label(device, &superblock, name).await?)
    } else {
        None
    };
    Ok(CheckedDevice {
        superblock,
        found,
        label,
    })
}

/// The newest flush marker of this pool, if any.
pub(super) async fn read_flush_marker(
    device: &dyn BlockDevice,
    superblock: &Superblock,
) -> Result<Option<FlushMarkerRecord>, EngineError> {
    let marker_bytes = device
        .read(
            FLUSH_MARKER_BLOCKS[0] * BLOCK_SIZE_BYTES,
            FLUSH_MARKER_BLOCKS.len() * BLOCK_BYTES,
        )
        .await?;
    Ok(FlushMarkerRecord::newest(
        marker_bytes.chunks(BLOCK_BYTES),
        superblock.pool_identifier,
    ))
}

/// The superblock as found: from block 0 or, when that fails its checksum,
/// from its copy; and which of the two must be (re)written once the pool has
/// been validated.
pub(super) struct FoundSuperblock {
    superblock: Superblock,
    primary_damaged: bool,
    copy_stale: bool,
    /// The format version it was written with.
    version: u32,
}

impl FoundSuperblock {
    /// Whether an older format version wrote the pool: it is upgraded at open.
    pub(super) fn older_format(&self) -> bool {
        self.version < FORMAT_VERSION
    }

    /// Rewrites a damaged superblock from its copy, and writes the copy of a
    /// pool that has none (made before format version 5) or a damaged one.
    /// An older version's superblock and copy are rewritten in this version,
    /// so that builds older than this one refuse the pool (`NewerFormat`)
    /// once its checkpoints are in this version.
    pub(super) async fn repair(
        &self,
        device: &dyn BlockDevice,
        name: &str,
    ) -> Result<(), EngineError> {
        let encoded = aligned(&self.superblock.encode());
        if self.older_format() {
            device
                .write(SUPERBLOCK_BLOCK * BLOCK_SIZE_BYTES, encoded.clone())
                .await?;
            device
                .write(SUPERBLOCK_COPY_BLOCK * BLOCK_SIZE_BYTES, encoded)
                .await?;
            tracing::info!(
                device = name,
                from = self.version,
                to = FORMAT_VERSION,
                "pool format upgraded"
            );
            return Ok(());
        }
        if self.primary_damaged {
            device
                .write(SUPERBLOCK_BLOCK * BLOCK_SIZE_BYTES, encoded.clone())
                .await?;
            tracing::warn!(device = name, "superblock rewritten from its copy");
        }
        if self.copy_stale {
            device
                .write(SUPERBLOCK_COPY_BLOCK * BLOCK_SIZE_BYTES, encoded)
                .await?;
        }
        Ok(())
    }
}

/// The capacity device's label (a copy of the superblock at its block 0) as
/// found, and which of it and its copy (its block 128) must be rewritten.
pub(super) struct FoundLabel {
    start_block: u64,
    label_damaged: bool,
    copy_stale: bool,
}

impl FoundLabel {
    pub(super) async fn repair(
        &self,
        device: &dyn BlockDevice,
        superblock: &Superblock,
        name: &str,
    ) -> Result<(), EngineError> {
        let encoded = aligned(&superblock.encode());
        let rewrite = [
            (self.label_damaged, SUPERBLOCK_BLOCK),
            (self.copy_stale, SUPERBLOCK_COPY_BLOCK),
        ];
        for (needed, block) in rewrite {
            if needed {
                let offset = (self.start_block + block) * BLOCK_SIZE_BYTES;
                device.write(offset, encoded.clone()).await?;
            }
        }
        if self.label_damaged {
            tracing::warn!(device = name, "capacity label rewritten from its copy");
        }
        Ok(())
    }
}

/// Checks that the capacity device is this pool's: its label, or when the
/// label holds a lamina superblock that fails its checksum, the label's copy,
/// is this pool's superblock.
pub(super) async fn check_capacity_label(
    device: &dyn BlockDevice,
    superblock: &Superblock,
    name: &str,
) -> Result<FoundLabel, EngineError> {
    let start_block = superblock.geometry.capacity_start_block;
    let block = BLOCK_BYTES;
    let label_offset = start_block * BLOCK_SIZE_BYTES;
    let label = device.read(label_offset, block).await?;
    let copy_offset = (start_block + SUPERBLOCK_COPY_BLOCK) * BLOCK_SIZE_BYTES;
    let copy = device.read(copy_offset, block).await?;
    let is_this_pool =
        |bytes: &[u8]| Superblock::decode(bytes).is_ok_and(|(_, found)| found == *superblock);
    let copy_matches = is_this_pool(&copy);
    if is_this_pool(&label) {
        return Ok(FoundLabel {
            start_block,
            label_damaged: false,
            copy_stale: !copy_matches,
        });
    }
    let damaged = !matches!(
        Superblock::decode(&label),
        Ok(_) | Err(FrameError::WrongMagic)
    );
    if damaged && copy_matches {
        tracing::warn!(
            device = name,
            "the capacity label is damaged; using its copy"
        );
        return Ok(FoundLabel {
            start_block,
            label_damaged: true,
            copy_stale: false,
        });
    }
    Err(EngineError::Open(OpenError::WrongCapacityDevice {
        device: name.to_string(),
        offset: label_offset,
    }))
}

/// Reads the superblock, falling back to its copy when block 0 holds a
/// lamina superblock that fails its checksum. A block 0 without the magic is
/// not a pool, whatever block 128 holds: the device may have been reused
/// (a file system written over it), and its copy must not bring it back.
pub(super) async fn read_superblock(
    device: &dyn BlockDevice,
    name: &str,
) -> Result<FoundSuperblock, EngineError> {
    let block = BLOCK_BYTES;
    let decodes = |bytes: &[u8]| Superblock::decode(bytes).is_ok();
    let primary_bytes =
        read_metadata(device, SUPERBLOCK_BLOCK * BLOCK_SIZE_BYTES, block, &decodes).await?;
    let copy_bytes = read_metadata(
        device,
        SUPERBLOCK_COPY_BLOCK * BLOCK_SIZE_BYTES,
        block,
        &decodes,
    )
    .await?;
    let copy = Superblock::decode(&copy_bytes).ok();
    let primary_error = match Superblock::decode(&primary_bytes) {
        Ok((version, _)) if version < FORMAT_VERSION_READ_MIN => {
            return Err(EngineError::Open(OpenError::OlderFormat {
                device: name.to_string(),
                found: version,
                supported: FORMAT_VERSION_READ_MIN,
            }));
        }
        Ok((version, superblock)) => {
            let copy_stale = copy.is_none_or(|(_, copy)| copy != superblock);
            return Ok(FoundSuperblock {
                superblock,
                primary_damaged: false,
                copy_stale,
                version,
            });
        }
        Err(FrameError::WrongMagic) => {
            return Err(EngineError::Open(OpenError::NotAPool {
                device: name.to_string(),
            }));
        }
        Err(FrameError::NewerVersion(found)) => {
            return Err(EngineError::Open(OpenError::NewerFormat {
                device: name.to_string(),
                found,
                supported: FORMAT_VERSION,
            }));
        }
        Err(error) => error,
    };
    match copy {
        Some((version, superblock)) if version >= FORMAT_VERSION_READ_MIN => {
            tracing::warn!(
                device = name,
                error = %primary_error,
                "the superblock is damaged; using its copy"
            );
            Ok(FoundSuperblock {
                superblock,
                primary_damaged: true,
                copy_stale: false,
                version,
            })
        }
        _ => Err(EngineError::corrupt(
            name,
            "superblock",
            0,
            primary_error.to_string(),
        )),
    }
}

/// Checks what checksums cannot: that a superblock written by a buggy or hostile
/// program describes a geometry the engine can work with.
pub(super) fn validate_geometry(geometry: &Geometry) -> Result<(), String> {
    let flash_end_block = geometry
        .flash_segment_count
        .checked_mul(geometry.segment_size_blocks)
        .and_then(|blocks| blocks.checked_add(crate::log::geometry::DATA_START_BLOCK));
    let capacity_end_block = geometry
        .capacity_segment_count()
        .checked_mul(geometry.segment_size_blocks)
        .and_then(|blocks| blocks.checked_add(geometry.capacity_start_block))
        .and_then(|blocks| blocks.checked_add(crate::log::geometry::CAPACITY_DATA_START_BLOCKS));
    let tiers_valid = if geometry.has_capacity_tier() {
        geometry.capacity_segment_count() >= crate::log::geometry::CAPACITY_SEGMENT_COUNT_MIN
            && flash_end_block.is_some_and(|end| end <= geometry.capacity_start_block)
            && capacity_end_block
                .and_then(|blocks| blocks.checked_mul(BLOCK_SIZE_BYTES))
                .is_some_and(|end| end <= geometry.device_size_bytes)
    } else {
        geometry.capacity_start_block == 0
            && flash_end_block
                .and_then(|blocks| blocks.checked_mul(BLOCK_SIZE_BYTES))
                .is_some_and(|end| end <= geometry.device_size_bytes)
    };
    let valid = geometry.segment_size_blocks >= 16
        && geometry.segment_size_blocks <= (1 << 20)
        && geometry.flash_segment_count >= 8
        && geometry.flash_segment_count <= geometry.segment_count
        && geometry.segment_count <= u64::from(u32::MAX)
        && geometry.with_rows(geometry.flash_row_blocks, geometry.capacity_row_blocks)
            == Some(*geometry)
        && tiers_valid;
    if valid {
        Ok(())
    } else {
        Err(format!("impossible geometry {geometry:?}"))
    }
}

/// Reads metadata at `offset`; when it fails `is_valid` (its frame's
/// checks), the device's redundancy is asked for a copy that passes (another
/// member of an array: the metadata blocks are mirrored on every member),
/// which also rewrites the bad copy. Without one, the bytes as read.
pub(super) async fn read_metadata(
    device: &dyn BlockDevice,
    offset: u64,
    length: usize,
    is_valid: lamina_device::BlockCheck<'_>,
) -> Result<AlignedBuffer, EngineError> {
    let bytes = device.read(offset, length).await?;
    if is_valid(&bytes) {
        return Ok(bytes);
    }
    match device.recover_range(offset, length, is_valid).await? {
        Some(good) => {
            tracing::warn!(
                offset,
                length,
                "damaged metadata read from another device's copy"
            );
            Ok(good)
        }
        None => Ok(bytes),
    }
}
