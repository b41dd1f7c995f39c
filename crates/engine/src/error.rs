//! Typed engine errors, one type per kind of operation: opening a pool
//! ([`OpenError`]), creating one ([`CreateError`]), volume and snapshot
//! operations ([`VolumeError`]) and reading and writing data ([`IoError`]).
//! Each carries enough context (device, volume, offsets) to say what failed
//! where; each maps to one NBD error code at the protocol edge. [`EngineError`]
//! is the umbrella the engine's functions return, so that `?` works across
//! operations and a caller that needs only "an engine error" keeps one type.
//!
//! The messages describe the engine's refusal in the engine's terms; they name
//! no command-line flag. Where a user can override a refusal, the CLI adds how
//! (it recognises the error by its variant, or by [`EngineError::kind`] through
//! the admin API).

use lamina_device::DeviceError;

/// Any engine error.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error(transparent)]
    Create(#[from] CreateError),
    #[error(transparent)]
    Volume(#[from] VolumeError),
    #[error(transparent)]
    Io(#[from] IoError),
    /// The pool's runtime limits are out of range (`PoolLimits::validate`).
    #[error("invalid pool limits: {0}")]
    InvalidLimits(#[from] crate::pool::core::limits::LimitsError),
}

/// Opening a pool: the device holds no pool, a pool this lamina cannot read,
/// or a damaged one.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{device} is not a lamina pool (no lamina superblock at offset 0)")]
    NotAPool { device: String },
    #[error(
        "{device} holds a lamina pool of format version {found}, newer than this lamina supports ({supported}); upgrade lamina"
    )]
    NewerFormat {
        device: String,
        found: u32,
        supported: u32,
    },
    #[error(
        "{device} holds a lamina pool of format version {found}, from a development build older than this lamina reads ({supported}); recreate the pool"
    )]
    OlderFormat {
        device: String,
        found: u32,
        supported: u32,
    },
    #[error(
        "{device} is truncated: the pool was created on {expected_bytes} bytes but the device has {actual_bytes}"
    )]
    Truncated {
        device: String,
        expected_bytes: u64,
        actual_bytes: u64,
    },
    #[error("{device}: corrupt {structure} at offset {offset}: {reason}")]
    Corrupt {
        device: String,
        structure: &'static str,
        offset: u64,
        reason: String,
    },
    #[error(
        "{device}: the capacity tier's device does not belong to this pool (no matching label at offset {offset}); give the capacity device the pool was created with"
    )]
    WrongCapacityDevice { device: String, offset: u64 },
    /// The superblock's geometry addresses more blocks than a map entry
    /// holds (`volume::map::PHYSICAL_BLOCK_COUNT_MAX`).
    #[error(
        "{device}: the pool spans {size_bytes} bytes, more than this lamina addresses ({maximum_bytes} bytes: 2^40 blocks of 4 KiB)"
    )]
    DeviceTooLarge {
        device: String,
        size_bytes: u64,
        maximum_bytes: u64,
    },
    /// Segments that hold data are striped over more lost devices than
    /// their redundancy covers (an array after more losses than it was
    /// rebuilt for): opening would serve errors for their blocks.
    /// Restoring a lost flash device: the capacity tier holds no checkpoint
    /// slot copy that decodes.
    #[error(
        "{device}: the capacity tier holds no copy of a checkpoint slot (at offset {offset} and after): the pool was last written by a lamina older than format version 9, which kept its checkpoints' slots on flash only, so it cannot be restored without its flash device"
    )]
    NoCheckpointCopy { device: String, offset: u64 },
    /// Restoring a lost flash device onto a device of another size.
    #[error(
        "{device}: the new flash device must have exactly the lost one's size, {expected_bytes} bytes (the capacity tier's addresses start there), but has {actual_bytes}"
    )]
    FlashSizeMismatch {
        device: String,
        expected_bytes: u64,
        actual_bytes: u64,
    },
    #[error(
        "{device}: {segment_count} segments holding data ({live_bytes} bytes) lie on more lost devices than their parity covers; bring the missing devices back"
    )]
    SegmentsLost {
        device: String,
        segment_count: usize,
        live_bytes: u64,
    },
}

/// Creating a pool: the device is not one to create it on.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error(
        "{device} already holds data (found non-zero bytes at offset {offset}); the pool is created only over an empty device unless forced"
    )]
    DeviceNotEmpty { device: String, offset: u64 },
    #[error(
        "{device} is too small for a pool: {size_bytes} bytes, at least {minimum_bytes} needed"
    )]
    DeviceTooSmall {
        device: String,
        size_bytes: u64,
        minimum_bytes: u64,
    },
    /// The block map addresses 2^40 blocks (`volume::map::PHYSICAL_BLOCK_COUNT_MAX`).
    #[error(
        "{device} is too large for a pool: {size_bytes} bytes, at most {maximum_bytes} (2^40 blocks of 4 KiB)"
    )]
    DeviceTooLarge {
        device: String,
        size_bytes: u64,
        maximum_bytes: u64,
    },
    #[error(
        "the segment size ({segment_size_blocks} blocks) is not a multiple of the tiers' rows ({flash_row_blocks} blocks on flash, {capacity_row_blocks} on capacity)"
    )]
    SegmentNotWholeRows {
        segment_size_blocks: u64,
        flash_row_blocks: u64,
        capacity_row_blocks: u64,
    },
}

/// Volume and snapshot operations: names, sizes, and what depends on what.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("no such volume: {0}")]
    NoSuchVolume(String),
    #[error("no such snapshot: {volume}@{snapshot}")]
    NoSuchSnapshot { volume: String, snapshot: String },
    #[error("snapshot {volume}@{snapshot} already exists")]
    SnapshotExists { volume: String, snapshot: String },
    #[error("{what} has clones that depend on it: {clones}; delete those clones first")]
    HasClones { what: String, clones: String },
    #[error(
        "{volume}@{snapshot} is not the newest snapshot of {volume}; newer snapshots: {newer} (delete them first, or clone {volume}@{snapshot} instead)"
    )]
    NotNewestSnapshot {
        volume: String,
        snapshot: String,
        newer: String,
    },
    #[error("{0} is a read-only snapshot")]
    ReadOnly(String),
    #[error("volume {0} already exists")]
    VolumeExists(String),
    #[error("invalid volume or snapshot name {name:?}: {reason}")]
    InvalidName { name: String, reason: String },
    #[error("invalid size {size_bytes}: {reason}")]
    InvalidSize { size_bytes: u64, reason: String },
    #[error(
        "shrinking volume {volume} from {from_bytes} to {to_bytes} bytes discards its tail; the resize must be forced"
    )]
    ShrinkNeedsForce {
        volume: String,
        from_bytes: u64,
        to_bytes: u64,
    },
}

/// Reading and writing data: damaged blocks, requests out of range, no space,
/// and a pool that failed.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error(
        "checksum mismatch reading volume {volume} block {logical_block} (device block {physical_block}): data is corrupt and no redundancy could repair it"
    )]
    ChecksumMismatch {
        volume: String,
        logical_block: u64,
        physical_block: u64,
    },
    #[error(
        "volume {volume} block {logical_block}: its compressed fragment is damaged and no redundancy could repair it: {source}"
    )]
    FragmentDamaged {
        volume: String,
        logical_block: u64,
        #[source]
        source: crate::log::fragment::FragmentError,
    },
    #[error(
        "volume {volume} block {logical_block} is lost: its only copy was on the flash device the pool was restored without (write it again to use it)"
    )]
    BlockLost { volume: String, logical_block: u64 },
    #[error(
        "volume {volume} block {logical_block} moved on the device under each of {attempts} reads of it (cleaner, tiering or writes moving it faster than it could be read); nothing is damaged, try again"
    )]
    KeptMoving {
        volume: String,
        logical_block: u64,
        attempts: usize,
    },
    #[error(
        "request beyond the end of volume {volume}: offset {offset} length {length}, size {size_bytes}"
    )]
    OutOfRange {
        volume: String,
        offset: u64,
        length: u64,
        size_bytes: u64,
    },
    #[error(
        "the pool is full: no free segment to place the write (free space by trimming or deleting data)"
    )]
    NoSpace,
    #[error(
        "{device} is out of space under the pool (waited {waited_ms} ms): written data waits in memory for space to return; free space on its file system or device"
    )]
    DeviceFull { device: String, waited_ms: u64 },
    #[error("the pool has failed after an earlier write error and refuses further writes: {0}")]
    Failed(String),
    #[error("a scrub is already running (see `lamina pool status`)")]
    ScrubRunning,
    #[error("a rebuild is already running (see `lamina pool status`)")]
    RebuildRunning,
    #[error("the pool was closed while a rebuild ran; it resumes when the pool opens")]
    RebuildInterrupted,
    #[error(
        "{segment_count} segments still hold data to move after {passes} passes without progress (free space ran short: clients' writes outpaced the cleaner); the pool keeps serving, and the next rebuild check starts again"
    )]
    EvacuationStalled { segment_count: usize, passes: usize },
    #[error(
        "{device}: the capacity tier cannot make its writes durable ({error}); demotion and checkpoints are suspended until it can, client writes go on landing on flash while it has room"
    )]
    CapacityUnavailable { device: String, error: String },
}

impl EngineError {
    /// A corrupt structure found while opening a pool.
    pub fn corrupt(
        device: &str,
        structure: &'static str,
        offset: u64,
        reason: impl Into<String>,
    ) -> Self {
        Self::Open(OpenError::Corrupt {
            device: device.to_string(),
            structure,
            offset,
            reason: reason.into(),
        })
    }

    /// The error's variant in snake case (`"shrink_needs_force"`,
    /// `"device_not_empty"`, `"device"` for a device error): a stable,
    /// machine-readable name for the admin API, so that its clients need not
    /// read the message.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Device(_) => "device",
            Self::Open(error) => error.kind(),
            Self::Create(error) => error.kind(),
            Self::Volume(error) => error.kind(),
            Self::Io(error) => error.kind(),
            Self::InvalidLimits(_) => "invalid_limits",
        }
    }
}

impl OpenError {
    fn kind(&self) -> &'static str {
        match self {
            Self::NotAPool { .. } => "not_a_pool",
            Self::NewerFormat { .. } => "newer_format",
            Self::OlderFormat { .. } => "older_format",
            Self::Truncated { .. } => "truncated",
            Self::Corrupt { .. } => "corrupt",
            Self::WrongCapacityDevice { .. } => "wrong_capacity_device",
            Self::DeviceTooLarge { .. } => "device_too_large",
            Self::SegmentsLost { .. } => "segments_lost",
            Self::NoCheckpointCopy { .. } => "no_checkpoint_copy",
            Self::FlashSizeMismatch { .. } => "flash_size_mismatch",
        }
    }
}

impl CreateError {
    fn kind(&self) -> &'static str {
        match self {
            Self::DeviceNotEmpty { .. } => "device_not_empty",
            Self::DeviceTooSmall { .. } => "device_too_small",
            Self::DeviceTooLarge { .. } => "device_too_large",
            Self::SegmentNotWholeRows { .. } => "segment_not_whole_rows",
        }
    }
}

impl VolumeError {
    fn kind(&self) -> &'static str {
        match self {
            Self::NoSuchVolume(_) => "no_such_volume",
            Self::NoSuchSnapshot { .. } => "no_such_snapshot",
            Self::SnapshotExists { .. } => "snapshot_exists",
            Self::HasClones { .. } => "has_clones",
            Self::NotNewestSnapshot { .. } => "not_newest_snapshot",
            Self::ReadOnly(_) => "read_only",
            Self::VolumeExists(_) => "volume_exists",
            Self::InvalidName { .. } => "invalid_name",
            Self::InvalidSize { .. } => "invalid_size",
            Self::ShrinkNeedsForce { .. } => "shrink_needs_force",
        }
    }
}

impl IoError {
    fn kind(&self) -> &'static str {
        match self {
            Self::ChecksumMismatch { .. } => "checksum_mismatch",
            Self::FragmentDamaged { .. } => "fragment_damaged",
            Self::BlockLost { .. } => "block_lost",
            Self::KeptMoving { .. } => "kept_moving",
            Self::OutOfRange { .. } => "out_of_range",
            Self::NoSpace => "no_space",
            Self::DeviceFull { .. } => "device_full",
            Self::Failed(_) => "failed",
            Self::ScrubRunning => "scrub_running",
            Self::RebuildRunning => "rebuild_running",
            Self::RebuildInterrupted => "rebuild_interrupted",
            Self::EvacuationStalled { .. } => "evacuation_stalled",
            Self::CapacityUnavailable { .. } => "capacity_unavailable",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_no_command_line_flag() {
        let errors: [EngineError; 2] = [
            CreateError::DeviceNotEmpty {
                device: "flash".into(),
                offset: 7,
            }
            .into(),
            VolumeError::ShrinkNeedsForce {
                volume: "db".into(),
                from_bytes: 2,
                to_bytes: 1,
            }
            .into(),
        ];
        for error in errors {
            assert!(!error.to_string().contains("--"), "{error}");
        }
    }
}
