//! Batches: the unit the log appends. A batch is one summary block (a frame
//! holding the batch's identity and its records) followed by the data blocks its
//! `Data` records describe, in order, and (format version 5 on) a copy of the
//! summary block, so that one damaged sector never loses a batch's records. The summary travels with the data in the
//! same device write, so no metadata is ever written separately per client write.

use serde::{Deserialize, Serialize};

use super::data_layout::{DataKind, DataLayout, FRAGMENT_UNIT_COUNT_MAX, Placement};
use super::frame::{self, FRAME_HEADER_BYTES, FrameError};
use super::location::Location;
use crate::BLOCK_BYTES;

/// "LAMINALG" in ASCII, read as a little-endian u64.
pub const BATCH_MAGIC: u64 = u64::from_le_bytes(*b"LAMINALG");

/// Data blocks per batch at most: a batch is at most this many blocks plus
/// [`BATCH_OVERHEAD_BLOCKS`].
pub const BATCH_DATA_BLOCKS_MAX: usize = 128;

/// Blocks a batch takes besides its data: the summary and its copy (format
/// version 5).
pub const BATCH_OVERHEAD_BLOCKS: u32 = 2;

/// Bytes of records a summary block can hold (the frame header takes the rest).
pub const SUMMARY_RECORD_BYTES_MAX: usize = BLOCK_BYTES - FRAME_HEADER_BYTES - 64;

/// One change to the pool, in log order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Record {
    /// The next data block of the batch is `logical_block` of `volume_id`;
    /// `checksum` is the crc32c of its 4096 bytes.
    Data {
        volume_id: u32,
        logical_block: u64,
        checksum: u32,
    },
    /// `block_count` blocks from `logical_block` are unmapped (they read as zeros).
    Unmap {
        volume_id: u32,
        logical_block: u64,
        block_count: u64,
    },
    VolumeCreate {
        volume_id: u32,
        name: String,
        size_bytes: u64,
        created_unix_seconds: u64,
    },
    /// Shrinking unmaps every block at or past the new size.
    VolumeResize {
        volume_id: u32,
        size_bytes: u64,
    },
    VolumeRename {
        volume_id: u32,
        name: String,
    },
    VolumeDelete {
        volume_id: u32,
    },
    /// A read-only snapshot of the volume's current contents (a copy of its map).
    SnapshotCreate {
        volume_id: u32,
        snapshot_id: u32,
        name: String,
        created_unix_seconds: u64,
    },
    SnapshotDelete {
        volume_id: u32,
        snapshot_id: u32,
    },
    /// The volume's contents and size become those of its newest snapshot.
    SnapshotRollback {
        volume_id: u32,
        snapshot_id: u32,
    },
    /// A new writable volume whose contents start as those of a snapshot.
    VolumeClone {
        volume_id: u32,
        name: String,
        origin_volume_id: u32,
        origin_snapshot_id: u32,
        created_unix_seconds: u64,
    },
    /// The cleaner moved a block: the next data block of the batch is the new home
    /// of whatever mapped `logical_block` to `from_physical_block` (a location,
    /// `log::location`; summaries with an invalid one are refused) in `volume_id`
    /// (the volume that wrote it), its snapshots and its clones.
    Relocate {
        volume_id: u32,
        logical_block: u64,
        from_physical_block: u64,
        checksum: u32,
    },
    /// The volume's tier policy changes (format version 3).
    VolumePolicy {
        volume_id: u32,
        policy: PolicyRecord,
    },
    /// The next fragment of the batch's packed area holds `logical_block`
    /// (format version 10, decision 0070); `checksum` is the crc32c of the
    /// fragment's `unit_count` units.
    Packed {
        volume_id: u32,
        logical_block: u64,
        unit_count: u8,
        checksum: u32,
    },
    /// As [`Record::Relocate`], but the new home is the next fragment of the
    /// packed area (a fragment moved as is, or a whole block compressed as
    /// it moves); `from` is a location.
    RelocatePacked {
        volume_id: u32,
        logical_block: u64,
        from: u64,
        unit_count: u8,
        checksum: u32,
    },
    /// The codec for the volume's writes from here on (format version 10).
    VolumeCompression {
        volume_id: u32,
        codec: CodecRecord,
    },
}

/// A codec as the log and checkpoints encode it (variant index, then a
/// zstd level as a varint). The domain's `lamina_reduction::Codec`
/// converts to and from it, so that the format owns its bytes; variants
/// are encoded by position and their order must never change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CodecRecord {
    #[default]
    Off,
    Lz4,
    Zstd {
        level: u8,
    },
}

/// A volume's tier policy as the log and checkpoints encode it: the domain's
/// `volume::TierPolicy` converts to and from it, so that the format owns its
/// bytes. Variants are encoded by position (postcard writes the index as a
/// varint), so their order is the format and must never change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRecord {
    pub priority: CachePriorityRecord,
    pub pin: PinRecord,
}

/// A cache priority as encoded: 0 high, 1 normal, 2 low, 3 none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CachePriorityRecord {
    High,
    #[default]
    Normal,
    Low,
    None,
}

/// A pin as encoded: 0 auto, 1 flash, 2 capacity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PinRecord {
    #[default]
    Auto,
    Flash,
    Capacity,
}

impl Record {
    /// An upper bound on the record's encoded size, so that a batch can be sealed
    /// before its summary overflows one block.
    pub fn encoded_bytes_max(&self) -> usize {
        // Tag (1) + varint u32 (5) + varint u64 (10) per field, plus strings.
        match self {
            Record::Data { .. } => 1 + 5 + 10 + 5,
            Record::Unmap { .. } => 1 + 5 + 10 + 10,
            Record::VolumeCreate { name, .. } => 1 + 5 + 5 + name.len() + 10 + 10,
            Record::VolumeResize { .. } => 1 + 5 + 10,
            Record::VolumeRename { name, .. } => 1 + 5 + 5 + name.len(),
            Record::VolumeDelete { .. } => 1 + 5,
            Record::SnapshotCreate { name, .. } => 1 + 5 + 5 + 5 + name.len() + 10,
            Record::SnapshotDelete { .. } | Record::SnapshotRollback { .. } => 1 + 5 + 5,
            Record::VolumeClone { name, .. } => 1 + 5 + 5 + name.len() + 5 + 5 + 10,
            Record::Relocate { .. } => 1 + 5 + 10 + 10 + 5,
            Record::VolumePolicy { .. } => 1 + 5 + 1 + 1,
            Record::Packed { .. } => 1 + 5 + 10 + 2 + 5,
            Record::RelocatePacked { .. } => 1 + 5 + 10 + 10 + 2 + 5,
            Record::VolumeCompression { .. } => 1 + 5 + 1 + 2,
        }
    }

    /// What the record carries into the batch's data region, if anything.
    pub fn data_kind(&self) -> Option<DataKind> {
        if self.carries_data() {
            return Some(DataKind::WholeBlock);
        }
        let unit_count = u32::from(self.fragment_unit_count()?);
        Some(DataKind::Fragment { unit_count })
    }

    /// Whether the record describes the batch's next data block (a whole
    /// block; a fragment of the packed area is [`Self::carries_fragment`]).
    pub fn carries_data(&self) -> bool {
        matches!(self, Record::Data { .. } | Record::Relocate { .. })
    }

    /// The units of the packed area's next fragment, for records that describe one.
    pub fn fragment_unit_count(&self) -> Option<u8> {
        match self {
            Record::Packed { unit_count, .. } | Record::RelocatePacked { unit_count, .. } => {
                Some(*unit_count)
            }
            _ => None,
        }
    }

    /// Whether the record describes the packed area's next fragment.
    pub fn carries_fragment(&self) -> bool {
        self.fragment_unit_count().is_some()
    }

    /// The checksum of the data a record carries (a whole block's, or a
    /// fragment's units'), for records that carry data.
    pub fn data_checksum(&self) -> Option<u32> {
        match self {
            Record::Data { checksum, .. }
            | Record::Relocate { checksum, .. }
            | Record::Packed { checksum, .. }
            | Record::RelocatePacked { checksum, .. } => Some(*checksum),
            _ => None,
        }
    }

    /// The volume and logical block of a record that carries data (a whole
    /// block or a fragment).
    pub fn data_target(&self) -> Option<(u32, u64)> {
        match self {
            Record::Data {
                volume_id,
                logical_block,
                ..
            }
            | Record::Relocate {
                volume_id,
                logical_block,
                ..
            }
            | Record::Packed {
                volume_id,
                logical_block,
                ..
            }
            | Record::RelocatePacked {
                volume_id,
                logical_block,
                ..
            } => Some((*volume_id, *logical_block)),
            _ => None,
        }
    }
}

/// The summary block's payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// The incarnation of the segment this batch belongs to; a batch left from a
    /// segment's earlier use carries an older one and ends the segment's scan.
    pub segment_sequence: u64,
    /// Position of the summary block within the segment, in blocks.
    pub block_in_segment: u32,
    /// Global, strictly increasing across all batches of the pool.
    pub batch_sequence: u64,
    /// Every batch with a sequence up to this one was durable (a completed device
    /// flush covered it) when this batch was built.
    pub flushed_through_sequence: u64,
    pub records: Vec<Record>,
}

impl Summary {
    /// Blocks of the batch's data region (whole blocks and the blocks its
    /// fragments take, `log::data_layout`).
    pub fn data_block_count(&self) -> usize {
        if !self.records.iter().any(Record::carries_fragment) {
            return self
                .records
                .iter()
                .filter(|record| record.carries_data())
                .count();
        }
        let (_, block_count) = self.placements();
        block_count as usize
    }

    /// Where each record that carries data placed it in the data region
    /// (`log::data_layout`), by record index, and the region's blocks.
    pub fn placements(&self) -> (Vec<(usize, Placement)>, u32) {
        DataLayout::of_kinds(self.records.iter().map(Record::data_kind))
    }

    pub fn encode(&self) -> Vec<u8> {
        let bytes = frame::encode(BATCH_MAGIC, super::FORMAT_VERSION, self, BLOCK_BYTES);
        assert_eq!(bytes.len(), BLOCK_BYTES, "summary overflowed its block");
        bytes
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FrameError> {
        Self::decode_versioned(bytes).map(|(_, summary)| summary)
    }

    /// The summary and the format version it was written with (which says
    /// whether its batch ends with a copy of it, see `log::chain`).
    pub fn decode_versioned(bytes: &[u8]) -> Result<(u32, Self), FrameError> {
        let (version, summary): (u32, Summary) =
            frame::decode(BATCH_MAGIC, super::FORMAT_VERSION, bytes)?;
        if let Some(reason) = summary.records.iter().find_map(invalid_record) {
            return Err(FrameError::Decode(reason));
        }
        if summary.data_block_count() > BATCH_DATA_BLOCKS_MAX {
            return Err(FrameError::Decode(format!(
                "{} data records, at most {BATCH_DATA_BLOCKS_MAX}",
                summary.data_block_count()
            )));
        }
        Ok((version, summary))
    }
}

/// Why a decoded record is one no writer makes, if it is: a source that is
/// not a location, a fragment of no units or more than a fragment can take.
fn invalid_record(record: &Record) -> Option<String> {
    let source = match record {
        Record::Relocate {
            from_physical_block,
            ..
        } => Some(*from_physical_block),
        Record::RelocatePacked { from, .. } => Some(*from),
        _ => None,
    };
    if let Some(error) = source.and_then(|raw| Location::from_raw(raw).err()) {
        return Some(error.to_string());
    }
    let unit_count = u32::from(record.fragment_unit_count()?);
    (!(1..=FRAGMENT_UNIT_COUNT_MAX).contains(&unit_count))
        .then(|| format!("a fragment of {unit_count} units"))
}

/// The checksum recorded for a data block.
pub fn block_checksum(block: &[u8]) -> u32 {
    debug_assert_eq!(block.len(), BLOCK_BYTES);
    crc32c::crc32c(block)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_record_encodes_as_two_variant_indexes() {
        let record = Record::VolumePolicy {
            volume_id: 7,
            policy: PolicyRecord {
                priority: CachePriorityRecord::None,
                pin: PinRecord::Capacity,
            },
        };
        // Tag 11 (the record's position), volume 7, priority 3, pin 2.
        let bytes = postcard::to_allocvec(&record).unwrap();
        assert_eq!(bytes, [11, 7, 3, 2]);
        assert_eq!(postcard::from_bytes::<Record>(&bytes).unwrap(), record);
        assert!(postcard::from_bytes::<Record>(&[11, 7, 4, 2]).is_err());
        assert!(postcard::from_bytes::<Record>(&[11, 7, 3, 3]).is_err());
    }

    #[test]
    fn a_full_summary_fits_one_block() {
        let mut records: Vec<Record> = (0..BATCH_DATA_BLOCKS_MAX)
            .map(|index| Record::Data {
                volume_id: u32::MAX,
                logical_block: u64::MAX - index as u64,
                checksum: u32::MAX,
            })
            .collect();
        let used: usize = records.iter().map(Record::encoded_bytes_max).sum();
        let mut spare = SUMMARY_RECORD_BYTES_MAX - used;
        while spare >= 26 {
            records.push(Record::Unmap {
                volume_id: u32::MAX,
                logical_block: u64::MAX,
                block_count: u64::MAX,
            });
            spare -= 26;
        }
        let summary = Summary {
            segment_sequence: u64::MAX,
            block_in_segment: u32::MAX,
            batch_sequence: u64::MAX,
            flushed_through_sequence: u64::MAX,
            records,
        };
        let bytes = summary.encode();
        assert_eq!(Summary::decode(&bytes).unwrap(), summary);
    }
}
