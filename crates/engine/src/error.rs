//! Typed engine errors. Each carries enough context (device, volume, offsets) to
//! say what failed where; each maps to one NBD error code at the protocol edge.

use lamina_device::DeviceError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Device(#[from] DeviceError),
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
        "{device} already holds data (found non-zero bytes at offset {offset}); use --force to overwrite it"
    )]
    DeviceNotEmpty { device: String, offset: u64 },
    #[error(
        "{device}: the capacity tier's device does not belong to this pool (no matching label at offset {offset}); give the capacity device the pool was created with"
    )]
    WrongCapacityDevice { device: String, offset: u64 },
    #[error(
        "{device} is too small for a pool: {size_bytes} bytes, at least {minimum_bytes} needed"
    )]
    DeviceTooSmall {
        device: String,
        size_bytes: u64,
        minimum_bytes: u64,
    },
    #[error(
        "checksum mismatch reading volume {volume} block {logical_block} (device block {physical_block}): data is corrupt and there is no redundancy to repair it"
    )]
    ChecksumMismatch {
        volume: String,
        logical_block: u64,
        physical_block: u64,
    },
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
        "shrinking volume {volume} from {from_bytes} to {to_bytes} bytes discards its tail; pass --force to do it"
    )]
    ShrinkNeedsForce {
        volume: String,
        from_bytes: u64,
        to_bytes: u64,
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
    #[error("invalid pool limits: {0}")]
    InvalidLimits(#[from] crate::pool::limits::LimitsError),
}

impl EngineError {
    pub fn corrupt(
        device: &str,
        structure: &'static str,
        offset: u64,
        reason: impl Into<String>,
    ) -> Self {
        Self::Corrupt {
            device: device.to_string(),
            structure,
            offset,
            reason: reason.into(),
        }
    }
}
