//! The volume layer: thin volumes, their names and sizes, and their block maps.
//! It applies log records to the in-memory state (the same code for live writes
//! and for replay during recovery, so that the two cannot disagree) and reports
//! every physical block a change displaces, for segment space accounting.

pub mod map;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::BLOCK_SIZE_BYTES;
use crate::error::EngineError;
use crate::log::batch::Record;
use map::{BlockMap, Mapping};

/// Longest volume name, in bytes.
pub const VOLUME_NAME_LENGTH_MAX: usize = 64;

/// Largest volume size: 2^50 bytes (1 PiB), far beyond any device, small enough
/// that block arithmetic never overflows.
pub const VOLUME_SIZE_BYTES_MAX: u64 = 1 << 50;

/// Volume names: 1 to 64 characters from `A-Z a-z 0-9 . _ -`, not starting with
/// `.` or `-`. (`@` is reserved for snapshots, `/` for paths.)
pub fn validate_volume_name(name: &str) -> Result<(), EngineError> {
    let invalid = |reason: &str| {
        Err(EngineError::InvalidName {
            name: name.to_string(),
            reason: reason.to_string(),
        })
    };
    if name.is_empty() || name.len() > VOLUME_NAME_LENGTH_MAX {
        return invalid("must be 1 to 64 characters");
    }
    if name.starts_with('.') || name.starts_with('-') {
        return invalid("must not start with '.' or '-'");
    }
    if !name
        .chars()
        .all(|character| character.is_ascii_alphanumeric() || "._-".contains(character))
    {
        return invalid("allowed characters are A-Z a-z 0-9 . _ -");
    }
    Ok(())
}

pub fn validate_volume_size(size_bytes: u64) -> Result<(), EngineError> {
    let invalid = |reason: &str| {
        Err(EngineError::InvalidSize {
            size_bytes,
            reason: reason.to_string(),
        })
    };
    if size_bytes == 0 {
        return invalid("must be greater than zero");
    }
    if !size_bytes.is_multiple_of(BLOCK_SIZE_BYTES) {
        return invalid("must be a multiple of 4 KiB");
    }
    if size_bytes > VOLUME_SIZE_BYTES_MAX {
        return invalid("must be at most 1 PiB");
    }
    Ok(())
}

/// What `volume list` shows about a volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VolumeInfo {
    pub volume_id: u32,
    pub name: String,
    pub size_bytes: u64,
    /// Bytes of device space its mapped blocks use.
    pub allocated_bytes: u64,
    pub created_unix_seconds: u64,
}

pub struct Volume {
    pub volume_id: u32,
    pub name: String,
    pub size_bytes: u64,
    pub created_unix_seconds: u64,
    pub map: BlockMap,
}

impl Volume {
    pub fn info(&self) -> VolumeInfo {
        VolumeInfo {
            volume_id: self.volume_id,
            name: self.name.clone(),
            size_bytes: self.size_bytes,
            allocated_bytes: self.map.mapped_count() * BLOCK_SIZE_BYTES,
            created_unix_seconds: self.created_unix_seconds,
        }
    }

    pub fn block_count(&self) -> u64 {
        self.size_bytes / BLOCK_SIZE_BYTES
    }
}

/// Every volume of a pool, by identifier and by name.
#[derive(Default)]
pub struct VolumeTable {
    volumes: BTreeMap<u32, Volume>,
    by_name: BTreeMap<String, u32>,
    pub next_volume_id: u32,
}

impl VolumeTable {
    /// An empty table; volume identifiers start at 1.
    pub fn new() -> Self {
        Self {
            next_volume_id: 1,
            ..Self::default()
        }
    }

    pub fn get(&self, volume_id: u32) -> Option<&Volume> {
        self.volumes.get(&volume_id)
    }

    pub fn id_of(&self, name: &str) -> Result<u32, EngineError> {
        self.by_name
            .get(name)
            .copied()
            .ok_or_else(|| EngineError::NoSuchVolume(name.to_string()))
    }

    pub fn iter(&self) -> impl Iterator<Item = &Volume> {
        self.volumes.values()
    }

    pub fn insert(&mut self, volume: Volume) {
        assert!(
            !self.by_name.contains_key(&volume.name),
            "duplicate volume name {}",
            volume.name
        );
        self.next_volume_id = self.next_volume_id.max(volume.volume_id + 1);
        self.by_name.insert(volume.name.clone(), volume.volume_id);
        let previous = self.volumes.insert(volume.volume_id, volume);
        assert!(previous.is_none(), "duplicate volume identifier");
    }

    /// Applies one record. A `Data` record needs the physical block its data went
    /// to. Records for volumes that do not exist (possible only when replaying
    /// after an unflushed volume deletion was lost with its successors) are ignored.
    /// `displaced` receives each physical block that stops being referenced.
    pub fn apply(
        &mut self,
        record: &Record,
        physical_block: Option<u64>,
        displaced: &mut dyn FnMut(u64),
    ) {
        match record {
            Record::Data {
                volume_id,
                logical_block,
                checksum,
            } => {
                let physical_block = physical_block.expect("data record applied without its block");
                if let Some(volume) = self.volumes.get_mut(volume_id)
                    && *logical_block < volume.block_count()
                {
                    let mapping = Mapping {
                        physical_block,
                        checksum: *checksum,
                    };
                    if let Some(old) = volume.map.set(*logical_block, mapping) {
                        displaced(old);
                    }
                    return;
                }
                // The block is written but belongs to nothing: it is garbage at once.
                displaced(physical_block);
            }
            Record::Unmap {
                volume_id,
                logical_block,
                block_count,
            } => {
                if let Some(volume) = self.volumes.get_mut(volume_id) {
                    volume
                        .map
                        .unmap_range(*logical_block, *block_count, displaced);
                }
            }
            Record::VolumeCreate {
                volume_id,
                name,
                size_bytes,
                created_unix_seconds,
            } => {
                if self.volumes.contains_key(volume_id) || self.by_name.contains_key(name) {
                    return;
                }
                self.insert(Volume {
                    volume_id: *volume_id,
                    name: name.clone(),
                    size_bytes: *size_bytes,
                    created_unix_seconds: *created_unix_seconds,
                    map: BlockMap::default(),
                });
            }
            Record::VolumeResize {
                volume_id,
                size_bytes,
            } => {
                if let Some(volume) = self.volumes.get_mut(volume_id) {
                    let new_block_count = size_bytes / BLOCK_SIZE_BYTES;
                    if new_block_count < volume.block_count() {
                        volume.map.unmap_range(
                            new_block_count,
                            u64::MAX - new_block_count,
                            displaced,
                        );
                    }
                    volume.size_bytes = *size_bytes;
                }
            }
            Record::VolumeRename { volume_id, name } => {
                if self.by_name.contains_key(name) {
                    return;
                }
                if let Some(volume) = self.volumes.get_mut(volume_id) {
                    self.by_name.remove(&volume.name);
                    volume.name = name.clone();
                    self.by_name.insert(name.clone(), *volume_id);
                }
            }
            Record::VolumeDelete { volume_id } => {
                if let Some(mut volume) = self.volumes.remove(volume_id) {
                    self.by_name.remove(&volume.name);
                    volume.map.unmap_range(0, u64::MAX, displaced);
                }
            }
        }
    }
}
