//! Checkpoints: the persisted maps. A checkpoint's body (every volume and its
//! map, plus the log positions it covers) is written into ordinary segments; then
//! a small slot record naming those segments, with the body's length and crc32c,
//! is written into one of two fixed slots, alternating. Recovery takes the valid
//! slot with the highest checkpoint sequence whose body also verifies, and falls
//! back to the other slot otherwise.

use serde::{Deserialize, Serialize};

use super::batch::PolicyRecord;
use super::frame::{self, FrameError};
use crate::BLOCK_BYTES;

/// "LAMINACP" in ASCII, read as a little-endian u64.
pub const SLOT_MAGIC: u64 = u64::from_le_bytes(*b"LAMINACP");
/// "LAMINACB" in ASCII, read as a little-endian u64.
pub const BODY_MAGIC: u64 = u64::from_le_bytes(*b"LAMINACB");

/// The record in a checkpoint slot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slot {
    pub checkpoint_sequence: u64,
    /// Every batch up to this sequence is reflected in the body.
    pub covered_batch_sequence: u64,
    /// Length of the framed body in bytes, and the segments holding it, in order.
    pub body_bytes: u64,
    pub body_checksum: u32,
    pub body_segments: Vec<u32>,
}

impl Slot {
    pub fn encode(&self) -> Vec<u8> {
        frame::encode(SLOT_MAGIC, super::FORMAT_VERSION, self, BLOCK_BYTES)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FrameError> {
        frame::decode(SLOT_MAGIC, super::FORMAT_VERSION, bytes).map(|(_, slot)| slot)
    }
}

/// One 512-entry chunk of a map: 2 MiB of logical space. Stored once however
/// many maps (a volume, its snapshots, its clones) share it, and stored as the
/// entries that differ from an earlier chunk (usually the same chunk of the
/// previous snapshot), so that a body grows with distinct mappings rather than
/// with snapshots times chunks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkImage {
    /// An earlier chunk of `Body::chunks` this one starts from; none means an
    /// empty chunk.
    pub base: Option<u32>,
    /// Entries (0..512, strictly increasing) that differ from the base, with
    /// their physical block (0 means unmapped) and checksum.
    pub entries: Vec<u16>,
    pub physical_blocks: Vec<u64>,
    pub checksums: Vec<u32>,
}

/// A map as the chunks it holds: `chunk_indexes[k]` (strictly increasing) is
/// the logical position of `Body::chunks[chunk_references[k]]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapImage {
    pub chunk_indexes: Vec<u64>,
    pub chunk_references: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotImage {
    pub snapshot_id: u32,
    pub name: String,
    pub size_bytes: u64,
    pub created_unix_seconds: u64,
    pub map: MapImage,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeImage {
    pub volume_id: u32,
    pub name: String,
    pub size_bytes: u64,
    pub created_unix_seconds: u64,
    /// (volume, snapshot) this volume was cloned from.
    pub origin: Option<(u32, u32)>,
    pub map: MapImage,
    /// Oldest first.
    pub snapshots: Vec<SnapshotImage>,
}

/// Where the log head was when the checkpoint was taken: replay continues there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadImage {
    pub segment_index: u32,
    pub segment_sequence: u64,
    pub next_block_in_segment: u32,
}

/// The checkpoint body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Body {
    pub checkpoint_sequence: u64,
    pub covered_batch_sequence: u64,
    /// Segments opened after the checkpoint have a sequence at least this.
    pub next_segment_sequence: u64,
    pub next_volume_id: u32,
    pub next_snapshot_id: u32,
    /// The log heads (client and cleaner streams) open at checkpoint time.
    pub heads: Vec<HeadImage>,
    /// Every distinct map chunk, once.
    pub chunks: Vec<ChunkImage>,
    pub volumes: Vec<VolumeImage>,
    /// Per segment, the newest batch ever written into it (0 if none), so that
    /// recovery knows which empty segments no replay can still need.
    pub segment_last_batch_sequences: Vec<u64>,
    /// Tier policies of the volumes that do not have the default one.
    pub volume_policies: Vec<VolumePolicyImage>,
    /// The pool's write counters over its life up to this checkpoint (format
    /// version 4; zero in bodies of earlier versions).
    pub counters: CountersImage,
    /// The cleaner's placement hints (format version 4; empty in bodies of
    /// earlier versions).
    pub placement: PlacementImage,
}

/// What the cleaner knows of each segment's data, so that placement after a
/// restart goes on where it left off (format version 4). Hints only: nothing
/// here affects what a read returns. Times are in client blocks written over
/// the pool's life (`CountersImage::client_bytes_written` / 4096).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementImage {
    /// Per segment, the stream (`Stream` as a number) whose head wrote it last.
    pub segment_streams: Vec<u8>,
    /// Per segment, when clients wrote its data.
    pub segment_data_written_at_blocks: Vec<u64>,
    /// Per segment, when its last batch was written: the age that the
    /// cleaner's cost-benefit weighs.
    pub segment_last_written_at_blocks: Vec<u64>,
    /// Lifespans of the latest client segments the cleaner took, which set
    /// the placement's time scale.
    pub lifespan_samples_blocks: Vec<u64>,
}

/// What a pool has written over its life, for `pool status` (format version
/// 4). Writes after the newest checkpoint are lost from them by a crash.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountersImage {
    pub client_bytes_written: u64,
    /// Log and checkpoint bytes written to the devices.
    pub device_bytes_written: u64,
    pub cleaner_relocated_blocks: u64,
}

/// A volume's tier policy (format version 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumePolicyImage {
    pub volume_id: u32,
    pub policy: PolicyRecord,
}

/// The body as format version 3 wrote it: version 2's fields, then the
/// policy table (postcard writes a nested struct's fields in place, so the
/// nesting is the same bytes).
#[derive(Deserialize)]
struct BodyVersion3 {
    version_2: BodyVersion2,
    volume_policies: Vec<VolumePolicyImage>,
}

/// The body as format version 2 wrote it.
#[derive(Deserialize)]
struct BodyVersion2 {
    checkpoint_sequence: u64,
    covered_batch_sequence: u64,
    next_segment_sequence: u64,
    next_volume_id: u32,
    next_snapshot_id: u32,
    heads: Vec<HeadImage>,
    chunks: Vec<ChunkImage>,
    volumes: Vec<VolumeImage>,
    segment_last_batch_sequences: Vec<u64>,
}

impl Body {
    pub fn encode(&self) -> Vec<u8> {
        frame::encode(BODY_MAGIC, super::FORMAT_VERSION, self, BLOCK_BYTES)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FrameError> {
        let (version, _) = frame::peek_header(BODY_MAGIC, bytes)?;
        if version == 2 {
            let (_, old): (u32, BodyVersion2) =
                frame::decode(BODY_MAGIC, super::FORMAT_VERSION, bytes)?;
            return Ok(Self::from_older(old, Vec::new()));
        }
        if version == 3 {
            let (_, old): (u32, BodyVersion3) =
                frame::decode(BODY_MAGIC, super::FORMAT_VERSION, bytes)?;
            return Ok(Self::from_older(old.version_2, old.volume_policies));
        }
        frame::decode(BODY_MAGIC, super::FORMAT_VERSION, bytes).map(|(_, body)| body)
    }

    /// A body of an older version: its fields, the policy table (empty
    /// before version 3), and zero counters and no placement hints (both
    /// came with version 4).
    fn from_older(old: BodyVersion2, volume_policies: Vec<VolumePolicyImage>) -> Self {
        Self {
            checkpoint_sequence: old.checkpoint_sequence,
            covered_batch_sequence: old.covered_batch_sequence,
            next_segment_sequence: old.next_segment_sequence,
            next_volume_id: old.next_volume_id,
            next_snapshot_id: old.next_snapshot_id,
            heads: old.heads,
            chunks: old.chunks,
            volumes: old.volumes,
            segment_last_batch_sequences: old.segment_last_batch_sequences,
            volume_policies,
            counters: CountersImage::default(),
            placement: PlacementImage::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_2_body_decodes_with_default_policies() {
        let heads = vec![HeadImage {
            segment_index: 3,
            segment_sequence: 9,
            next_block_in_segment: 17,
        }];
        // Version 2's body: the same fields without the policy table.
        let old = (
            5u64,
            40u64,
            12u64,
            2u32,
            1u32,
            heads.clone(),
            Vec::<ChunkImage>::new(),
            Vec::<VolumeImage>::new(),
            vec![0u64, 7, 40],
        );
        let bytes = frame::encode(BODY_MAGIC, 2, &old, BLOCK_BYTES);
        let body = Body::decode(&bytes).unwrap();
        assert_eq!(body.checkpoint_sequence, 5);
        assert_eq!(body.covered_batch_sequence, 40);
        assert_eq!(body.heads, heads);
        assert_eq!(body.segment_last_batch_sequences, vec![0, 7, 40]);
        assert!(body.volume_policies.is_empty());
        assert_eq!(body.counters, CountersImage::default());
    }

    #[test]
    fn a_version_3_body_decodes_with_zero_counters_and_version_4_keeps_them() {
        let policies = vec![VolumePolicyImage {
            volume_id: 2,
            policy: PolicyRecord::default(),
        }];
        // Version 3's body: the same fields without the counters.
        let old = (
            6u64,
            41u64,
            13u64,
            3u32,
            1u32,
            Vec::<HeadImage>::new(),
            Vec::<ChunkImage>::new(),
            Vec::<VolumeImage>::new(),
            vec![0u64, 41],
            policies.clone(),
        );
        let bytes = frame::encode(BODY_MAGIC, 3, &old, BLOCK_BYTES);
        let body = Body::decode(&bytes).unwrap();
        assert_eq!(body.checkpoint_sequence, 6);
        assert_eq!(body.segment_last_batch_sequences, vec![0, 41]);
        assert_eq!(body.volume_policies, policies);
        assert_eq!(body.counters, CountersImage::default());
        assert_eq!(body.placement, PlacementImage::default());
        let counters = CountersImage {
            client_bytes_written: 1 << 30,
            device_bytes_written: 3 << 30,
            cleaner_relocated_blocks: 77,
        };
        let placement = PlacementImage {
            segment_streams: vec![0, 7, 6],
            segment_data_written_at_blocks: vec![10, 20_000, 3],
            segment_last_written_at_blocks: vec![11, 20_100, 9],
            lifespan_samples_blocks: vec![4_096, 5_000],
        };
        let body = Body {
            counters,
            placement,
            ..body
        };
        assert_eq!(Body::decode(&body.encode()).unwrap(), body);
    }
}
