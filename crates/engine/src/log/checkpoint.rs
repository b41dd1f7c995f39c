//! Checkpoints: the persisted maps. A checkpoint's body is written into
//! ordinary segments; then a small slot record naming those segments, with the
//! body's length and crc32c, is written into one of two fixed slots,
//! alternating. A body is a base (every volume and its map, plus the log
//! positions it covers) or, from format version 7, an increment: the map
//! chunks that changed since the checkpoint before it, and the small tables
//! whole. A slot names its checkpoint's body and the chain before it (base
//! first), and recovery applies the increments to the base's image
//! ([`Body::apply`]). Recovery takes the valid slot with the highest
//! checkpoint sequence whose chain also verifies, and falls back to the other
//! slot otherwise.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::batch::{CodecRecord, PolicyRecord};
use super::frame::{self, FrameError};
use crate::BLOCK_BYTES;

/// "LAMINACP" in ASCII, read as a little-endian u64.
pub const SLOT_MAGIC: u64 = u64::from_le_bytes(*b"LAMINACP");
/// "LAMINACB" in ASCII, read as a little-endian u64.
pub const BODY_MAGIC: u64 = u64::from_le_bytes(*b"LAMINACB");
/// "LAMINACI" in ASCII, read as a little-endian u64 (format version 7).
pub const INCREMENT_MAGIC: u64 = u64::from_le_bytes(*b"LAMINACI");

/// The first format version with incremental checkpoints.
pub const INCREMENTS_VERSION: u32 = 7;

/// The first format version whose bodies and increments end with the
/// volumes' codecs (`volume_compressions`, decision 0070).
pub const COMPRESSIONS_VERSION: u32 = 10;
const _: () = assert!(INCREMENTS_VERSION < COMPRESSIONS_VERSION);
const _: () = assert!(COMPRESSIONS_VERSION <= super::FORMAT_VERSION);

/// A chain holds at most this many increments after its base; the next
/// checkpoint is a new base.
pub const CHECKPOINT_INCREMENTS_MAX: usize = 4;

/// A chain's increments hold at most this percentage of its base's bytes;
/// an increment that would pass it is written as a new base instead, so that
/// a chain's bodies hold at most 1.5 bases.
pub const CHECKPOINT_INCREMENTS_PERCENT_OF_BASE_MAX: u64 = 50;

/// One body of a slot's chain: where it is and how to check it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotLink {
    pub checkpoint_sequence: u64,
    pub covered_batch_sequence: u64,
    pub body_bytes: u64,
    pub body_checksum: u32,
    pub body_segments: Vec<u32>,
}

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
    /// The chain before this checkpoint, base first; empty when this
    /// checkpoint's body is a base (format version 7).
    pub earlier_links: Vec<SlotLink>,
}

/// The slot as format versions 2 to 6 wrote it: always a base.
#[derive(Deserialize)]
struct SlotVersion6 {
    checkpoint_sequence: u64,
    covered_batch_sequence: u64,
    body_bytes: u64,
    body_checksum: u32,
    body_segments: Vec<u32>,
}

impl Slot {
    pub fn encode(&self) -> Vec<u8> {
        frame::encode(SLOT_MAGIC, super::FORMAT_VERSION, self, BLOCK_BYTES)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FrameError> {
        let (version, _) = frame::peek_header(SLOT_MAGIC, bytes)?;
        if version < INCREMENTS_VERSION {
            let (_, old): (u32, SlotVersion6) =
                frame::decode(SLOT_MAGIC, super::FORMAT_VERSION, bytes)?;
            return Ok(Self {
                checkpoint_sequence: old.checkpoint_sequence,
                covered_batch_sequence: old.covered_batch_sequence,
                body_bytes: old.body_bytes,
                body_checksum: old.body_checksum,
                body_segments: old.body_segments,
                earlier_links: Vec::new(),
            });
        }
        frame::decode(SLOT_MAGIC, super::FORMAT_VERSION, bytes).map(|(_, slot)| slot)
    }

    /// This slot's own checkpoint as a link.
    pub fn own_link(&self) -> SlotLink {
        SlotLink {
            checkpoint_sequence: self.checkpoint_sequence,
            covered_batch_sequence: self.covered_batch_sequence,
            body_bytes: self.body_bytes,
            body_checksum: self.body_checksum,
            body_segments: self.body_segments.clone(),
        }
    }

    /// Every link of the chain, base first, this slot's own last.
    pub fn chain(&self) -> Vec<SlotLink> {
        let mut chain = self.earlier_links.clone();
        chain.push(self.own_link());
        chain
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
    /// Codecs of the volumes whose codec is not `Off` (format version 10;
    /// empty in bodies of earlier versions).
    pub volume_compressions: Vec<VolumeCompressionImage>,
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

/// A volume's codec (format version 10).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeCompressionImage {
    pub volume_id: u32,
    pub codec: CodecRecord,
}

/// The body as format versions 4 to 9 wrote it: version 3's fields, then
/// the counters and the placement hints.
#[derive(Deserialize)]
struct BodyVersion9 {
    version_3: BodyVersion3,
    counters: CountersImage,
    placement: PlacementImage,
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
            return Ok(Self::from_older(BodyVersion9 {
                version_3: BodyVersion3 {
                    version_2: old,
                    volume_policies: Vec::new(),
                },
                counters: CountersImage::default(),
                placement: PlacementImage::default(),
            }));
        }
        if version == 3 {
            let (_, old): (u32, BodyVersion3) =
                frame::decode(BODY_MAGIC, super::FORMAT_VERSION, bytes)?;
            return Ok(Self::from_older(BodyVersion9 {
                version_3: old,
                counters: CountersImage::default(),
                placement: PlacementImage::default(),
            }));
        }
        if version < COMPRESSIONS_VERSION {
            let (_, old): (u32, BodyVersion9) =
                frame::decode(BODY_MAGIC, super::FORMAT_VERSION, bytes)?;
            return Ok(Self::from_older(old));
        }
        frame::decode(BODY_MAGIC, super::FORMAT_VERSION, bytes).map(|(_, body)| body)
    }

    /// A body of an older version: its fields, with zero counters and no
    /// placement hints before version 4 (the caller's), and no codecs (they
    /// came with version 10).
    fn from_older(older: BodyVersion9) -> Self {
        let BodyVersion9 {
            version_3:
                BodyVersion3 {
                    version_2: old,
                    volume_policies,
                },
            counters,
            placement,
        } = older;
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
            counters,
            placement,
            volume_compressions: Vec::new(),
        }
    }
}

/// A map of the previous checkpoint: a volume's live map (no snapshot) or
/// one of its snapshots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MapSource {
    pub volume_id: u32,
    pub snapshot_id: Option<u32>,
}

/// A map in an increment: the map `source` names in the previous checkpoint
/// (none: an empty map) with each patch applied to its chunk.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapDelta {
    pub source: Option<MapSource>,
    /// Strictly increasing `chunk_index`.
    pub patches: Vec<ChunkPatch>,
}

/// The entries of one chunk that changed: entry `entries[k]` (strictly
/// increasing, < 512) is now `physical_blocks[k]` (0: unmapped) with
/// `checksums[k]`; the others are what the source map's chunk holds (none
/// there: unmapped).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChunkPatch {
    pub chunk_index: u64,
    pub entries: Vec<u16>,
    pub physical_blocks: Vec<u64>,
    pub checksums: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotDelta {
    pub snapshot_id: u32,
    pub name: String,
    pub size_bytes: u64,
    pub created_unix_seconds: u64,
    pub map: MapDelta,
}

/// A volume in an increment: its record whole, its maps as changes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeDelta {
    pub volume_id: u32,
    pub name: String,
    pub size_bytes: u64,
    pub created_unix_seconds: u64,
    pub origin: Option<(u32, u32)>,
    pub map: MapDelta,
    pub snapshots: Vec<SnapshotDelta>,
}

/// An incremental checkpoint body (format version 7): what changed since
/// checkpoint `previous_checkpoint_sequence`. Every field but
/// `previous_checkpoint_sequence`, `chunks` and `volumes` is what a base
/// holds, written whole.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Increment {
    pub checkpoint_sequence: u64,
    pub covered_batch_sequence: u64,
    pub previous_checkpoint_sequence: u64,
    pub next_segment_sequence: u64,
    pub next_volume_id: u32,
    pub next_snapshot_id: u32,
    pub heads: Vec<HeadImage>,
    pub volumes: Vec<VolumeDelta>,
    pub segment_last_batch_sequences: Vec<u64>,
    pub volume_policies: Vec<VolumePolicyImage>,
    pub counters: CountersImage,
    pub placement: PlacementImage,
    /// As a base's (format version 10; empty in increments of earlier
    /// versions).
    pub volume_compressions: Vec<VolumeCompressionImage>,
}

/// The increment as format versions 7 to 9 wrote it: every field but the
/// codecs.
#[derive(Deserialize)]
struct IncrementVersion9 {
    checkpoint_sequence: u64,
    covered_batch_sequence: u64,
    previous_checkpoint_sequence: u64,
    next_segment_sequence: u64,
    next_volume_id: u32,
    next_snapshot_id: u32,
    heads: Vec<HeadImage>,
    volumes: Vec<VolumeDelta>,
    segment_last_batch_sequences: Vec<u64>,
    volume_policies: Vec<VolumePolicyImage>,
    counters: CountersImage,
    placement: PlacementImage,
}

impl Increment {
    pub fn encode(&self) -> Vec<u8> {
        frame::encode(INCREMENT_MAGIC, super::FORMAT_VERSION, self, BLOCK_BYTES)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FrameError> {
        let (version, _) = frame::peek_header(INCREMENT_MAGIC, bytes)?;
        if version < COMPRESSIONS_VERSION {
            let (_, old): (u32, IncrementVersion9) =
                frame::decode(INCREMENT_MAGIC, super::FORMAT_VERSION, bytes)?;
            return Ok(Self::from_version_9(old));
        }
        frame::decode(INCREMENT_MAGIC, super::FORMAT_VERSION, bytes).map(|(_, body)| body)
    }

    /// An increment of versions 7 to 9: its fields, and no codecs.
    fn from_version_9(old: IncrementVersion9) -> Self {
        Self {
            checkpoint_sequence: old.checkpoint_sequence,
            covered_batch_sequence: old.covered_batch_sequence,
            previous_checkpoint_sequence: old.previous_checkpoint_sequence,
            next_segment_sequence: old.next_segment_sequence,
            next_volume_id: old.next_volume_id,
            next_snapshot_id: old.next_snapshot_id,
            heads: old.heads,
            volumes: old.volumes,
            segment_last_batch_sequences: old.segment_last_batch_sequences,
            volume_policies: old.volume_policies,
            counters: old.counters,
            placement: old.placement,
            volume_compressions: Vec::new(),
        }
    }
}

/// A body of either kind, as read from a chain's link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AnyBody {
    Base(Body),
    Increment(Increment),
}

impl AnyBody {
    /// Decodes a base or an increment, by its magic.
    pub fn decode(bytes: &[u8]) -> Result<Self, FrameError> {
        match frame::peek_header(INCREMENT_MAGIC, bytes) {
            Ok(_) => Increment::decode(bytes).map(Self::Increment),
            Err(FrameError::WrongMagic) => Body::decode(bytes).map(Self::Base),
            Err(error) => Err(error),
        }
    }

    pub fn checkpoint_sequence(&self) -> u64 {
        match self {
            Self::Base(body) => body.checkpoint_sequence,
            Self::Increment(increment) => increment.checkpoint_sequence,
        }
    }

    pub fn covered_batch_sequence(&self) -> u64 {
        match self {
            Self::Base(body) => body.covered_batch_sequence,
            Self::Increment(increment) => increment.covered_batch_sequence,
        }
    }
}

impl Body {
    /// Applies `increment` (the checkpoint after this one) to this image:
    /// afterwards it is the image a base taken at the increment's checkpoint
    /// would hold, except that chunks no map refers to any more stay in
    /// `chunks` (each patch adds a chunk built on the one it changes).
    pub fn apply(&mut self, increment: Increment) -> Result<(), String> {
        if increment.previous_checkpoint_sequence != self.checkpoint_sequence
            || increment.covered_batch_sequence < self.covered_batch_sequence
        {
            return Err(format!(
                "increment {} follows checkpoint {}, not {}",
                increment.checkpoint_sequence,
                increment.previous_checkpoint_sequence,
                self.checkpoint_sequence
            ));
        }
        let previous = maps_by_source(std::mem::take(&mut self.volumes));
        let mut patcher = Patcher {
            previous: &previous,
            chunks: &mut self.chunks,
            added: HashMap::new(),
        };
        let mut volumes = Vec::with_capacity(increment.volumes.len());
        for volume in increment.volumes {
            let mut snapshots = Vec::with_capacity(volume.snapshots.len());
            for snapshot in volume.snapshots {
                snapshots.push(SnapshotImage {
                    snapshot_id: snapshot.snapshot_id,
                    name: snapshot.name,
                    size_bytes: snapshot.size_bytes,
                    created_unix_seconds: snapshot.created_unix_seconds,
                    map: patcher.apply(snapshot.map)?,
                });
            }
            volumes.push(VolumeImage {
                volume_id: volume.volume_id,
                name: volume.name,
                size_bytes: volume.size_bytes,
                created_unix_seconds: volume.created_unix_seconds,
                origin: volume.origin,
                map: patcher.apply(volume.map)?,
                snapshots,
            });
        }
        self.volumes = volumes;
        self.checkpoint_sequence = increment.checkpoint_sequence;
        self.covered_batch_sequence = increment.covered_batch_sequence;
        self.next_segment_sequence = increment.next_segment_sequence;
        self.next_volume_id = increment.next_volume_id;
        self.next_snapshot_id = increment.next_snapshot_id;
        self.heads = increment.heads;
        self.segment_last_batch_sequences = increment.segment_last_batch_sequences;
        self.volume_policies = increment.volume_policies;
        self.counters = increment.counters;
        self.placement = increment.placement;
        self.volume_compressions = increment.volume_compressions;
        Ok(())
    }
}

/// Every map of `volumes` by the name an increment's source gives it.
fn maps_by_source(volumes: Vec<VolumeImage>) -> HashMap<MapSource, MapImage> {
    volumes
        .into_iter()
        .flat_map(|volume| {
            let volume_id = volume.volume_id;
            let live = MapSource {
                volume_id,
                snapshot_id: None,
            };
            let snapshots = volume.snapshots.into_iter().map(move |snapshot| {
                let source = MapSource {
                    volume_id,
                    snapshot_id: Some(snapshot.snapshot_id),
                };
                (source, snapshot.map)
            });
            std::iter::once((live, volume.map)).chain(snapshots)
        })
        .collect()
}

/// Applies one increment's map changes to an image: the previous
/// checkpoint's maps, the image's chunk list (patched chunks are appended),
/// and the patches applied so far, so that maps that changed a shared chunk
/// alike (a snapshot taken after the checkpoint and its volume) share the
/// result again.
struct Patcher<'a> {
    previous: &'a HashMap<MapSource, MapImage>,
    chunks: &'a mut Vec<ChunkImage>,
    added: HashMap<(Option<u32>, ChunkPatch), u32>,
}

impl Patcher<'_> {
    fn apply(&mut self, delta: MapDelta) -> Result<MapImage, String> {
        if delta
            .patches
            .windows(2)
            .any(|pair| pair[0].chunk_index >= pair[1].chunk_index)
        {
            return Err("increment map patches are not in chunk order".to_string());
        }
        let mut chunks: BTreeMap<u64, u32> = match delta.source {
            None => BTreeMap::new(),
            Some(source) => {
                let map = self.previous.get(&source).ok_or_else(|| {
                    format!("increment names map {source:?}, not in the previous checkpoint")
                })?;
                map.chunk_indexes
                    .iter()
                    .copied()
                    .zip(map.chunk_references.iter().copied())
                    .collect()
            }
        };
        for patch in delta.patches {
            let entries_valid = patch.entries.len() == patch.physical_blocks.len()
                && patch.entries.len() == patch.checksums.len()
                && patch.entries.windows(2).all(|pair| pair[0] < pair[1])
                && patch
                    .entries
                    .last()
                    .is_none_or(|last| (*last as usize) < 512);
            if !entries_valid {
                return Err(format!(
                    "increment patch of chunk {} is malformed",
                    patch.chunk_index
                ));
            }
            let chunk_index = patch.chunk_index;
            let base = chunks.get(&chunk_index).copied();
            let key = (base, patch);
            let reference = match self.added.get(&key) {
                Some(reference) => *reference,
                None => {
                    let reference = u32::try_from(self.chunks.len())
                        .map_err(|_| "more than 2^32 chunks in a chain".to_string())?;
                    self.chunks.push(ChunkImage {
                        base,
                        entries: key.1.entries.clone(),
                        physical_blocks: key.1.physical_blocks.clone(),
                        checksums: key.1.checksums.clone(),
                    });
                    self.added.insert(key, reference);
                    reference
                }
            };
            chunks.insert(chunk_index, reference);
        }
        Ok(MapImage {
            chunk_indexes: chunks.keys().copied().collect(),
            chunk_references: chunks.values().copied().collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty_base(checkpoint_sequence: u64) -> Body {
        Body {
            checkpoint_sequence,
            covered_batch_sequence: 10,
            next_segment_sequence: 1,
            next_volume_id: 2,
            next_snapshot_id: 1,
            heads: Vec::new(),
            chunks: vec![ChunkImage {
                base: None,
                entries: vec![0, 1],
                physical_blocks: vec![100, 101],
                checksums: vec![7, 8],
            }],
            volumes: vec![VolumeImage {
                volume_id: 1,
                name: "v".to_string(),
                size_bytes: 1 << 30,
                created_unix_seconds: 0,
                origin: None,
                map: MapImage {
                    chunk_indexes: vec![3],
                    chunk_references: vec![0],
                },
                snapshots: Vec::new(),
            }],
            segment_last_batch_sequences: vec![0, 10],
            volume_policies: Vec::new(),
            counters: CountersImage::default(),
            placement: PlacementImage::default(),
            volume_compressions: Vec::new(),
        }
    }

    fn patch(chunk_index: u64, entry: u16, physical_block: u64) -> ChunkPatch {
        ChunkPatch {
            chunk_index,
            entries: vec![entry],
            physical_blocks: vec![physical_block],
            checksums: vec![9],
        }
    }

    #[test]
    fn an_increment_applies_to_its_previous_checkpoint_only() {
        let live = MapSource {
            volume_id: 1,
            snapshot_id: None,
        };
        // A snapshot taken from the live map after one change, and one more
        // change to the live map: the shared patch is stored once.
        let increment = Increment {
            checkpoint_sequence: 6,
            covered_batch_sequence: 12,
            previous_checkpoint_sequence: 5,
            next_segment_sequence: 2,
            next_volume_id: 2,
            next_snapshot_id: 2,
            heads: Vec::new(),
            volumes: vec![VolumeDelta {
                volume_id: 1,
                name: "v".to_string(),
                size_bytes: 1 << 30,
                created_unix_seconds: 0,
                origin: None,
                map: MapDelta {
                    source: Some(live),
                    patches: vec![patch(3, 1, 0), patch(4, 0, 200)],
                },
                snapshots: vec![SnapshotDelta {
                    snapshot_id: 1,
                    name: "s".to_string(),
                    size_bytes: 1 << 30,
                    created_unix_seconds: 0,
                    map: MapDelta {
                        source: Some(live),
                        patches: vec![patch(4, 0, 200)],
                    },
                }],
            }],
            segment_last_batch_sequences: vec![0, 12],
            volume_policies: Vec::new(),
            counters: CountersImage::default(),
            placement: PlacementImage::default(),
            volume_compressions: Vec::new(),
        };
        let encoded = increment.encode();
        assert_eq!(
            AnyBody::decode(&encoded).unwrap(),
            AnyBody::Increment(increment.clone())
        );
        let mut wrong = empty_base(4);
        assert!(
            wrong.apply(increment.clone()).is_err(),
            "not its previous checkpoint"
        );
        let mut body = empty_base(5);
        body.apply(increment.clone()).unwrap();
        assert_eq!(body.checkpoint_sequence, 6);
        assert_eq!(body.covered_batch_sequence, 12);
        assert_eq!(body.segment_last_batch_sequences, vec![0, 12]);
        let volume = &body.volumes[0];
        // Snapshots are applied first: its chunk 4 is new (chunk 1), and the
        // live map shares it; the live map's chunk 3 is chunk 0 patched (2).
        assert_eq!(volume.snapshots[0].map.chunk_indexes, vec![3, 4]);
        assert_eq!(volume.snapshots[0].map.chunk_references, vec![0, 1]);
        assert_eq!(volume.map.chunk_indexes, vec![3, 4]);
        assert_eq!(volume.map.chunk_references, vec![2, 1]);
        assert_eq!(body.chunks.len(), 3);
        assert_eq!(body.chunks[1].base, None);
        assert_eq!(body.chunks[1].physical_blocks, vec![200]);
        assert_eq!(body.chunks[2].base, Some(0));
        assert_eq!(body.chunks[2].physical_blocks, vec![0]);
        // A source the previous checkpoint does not hold is refused.
        let mut unknown = increment;
        unknown.volumes[0].map.source = Some(MapSource {
            volume_id: 9,
            snapshot_id: None,
        });
        assert!(empty_base(5).apply(unknown).is_err());
    }

    #[test]
    fn a_version_6_slot_reads_as_a_base() {
        let old = (4u64, 40u64, 8192u64, 77u32, vec![5u32, 6]);
        let bytes = frame::encode(SLOT_MAGIC, 6, &old, BLOCK_BYTES);
        let slot = Slot::decode(&bytes).unwrap();
        assert_eq!(slot.checkpoint_sequence, 4);
        assert_eq!(slot.body_segments, vec![5, 6]);
        assert!(slot.earlier_links.is_empty());
        let chained = Slot {
            earlier_links: vec![slot.own_link()],
            checkpoint_sequence: 5,
            ..slot
        };
        assert_eq!(Slot::decode(&chained.encode()).unwrap(), chained);
        assert_eq!(chained.chain().len(), 2);
    }

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

    /// Payload bytes written as they are (postcard writes a tuple's `u8`s
    /// one byte each, with no length).
    struct RawPayload(Vec<u8>);

    impl Serialize for RawPayload {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeTuple;
            let mut tuple = serializer.serialize_tuple(self.0.len())?;
            for byte in &self.0 {
                tuple.serialize_element(byte)?;
            }
            tuple.end()
        }
    }

    /// A value's encoding as version 9 wrote it: the same fields without the
    /// codecs table, the empty table's length byte being the last.
    fn framed_as_version_9<T: Serialize>(magic: u64, value: &T) -> Vec<u8> {
        let mut payload = postcard::to_allocvec(value).unwrap();
        assert_eq!(payload.pop(), Some(0), "an empty last table");
        frame::encode(magic, 9, &RawPayload(payload), BLOCK_BYTES)
    }

    #[test]
    fn version_9_bodies_and_increments_decode_without_codecs_and_version_10_keeps_them() {
        let compressions = vec![
            VolumeCompressionImage {
                volume_id: 1,
                codec: CodecRecord::Lz4,
            },
            VolumeCompressionImage {
                volume_id: 4,
                codec: CodecRecord::Zstd { level: 19 },
            },
        ];
        let base = empty_base(5);
        let old = framed_as_version_9(BODY_MAGIC, &base);
        assert_eq!(Body::decode(&old).unwrap(), base);
        let with_codecs = Body {
            volume_compressions: compressions.clone(),
            ..empty_base(5)
        };
        assert_eq!(Body::decode(&with_codecs.encode()).unwrap(), with_codecs);

        let increment = Increment {
            checkpoint_sequence: 6,
            covered_batch_sequence: 12,
            previous_checkpoint_sequence: 5,
            next_segment_sequence: 2,
            next_volume_id: 2,
            next_snapshot_id: 1,
            heads: Vec::new(),
            volumes: Vec::new(),
            segment_last_batch_sequences: vec![0, 12],
            volume_policies: Vec::new(),
            counters: CountersImage::default(),
            placement: PlacementImage::default(),
            volume_compressions: Vec::new(),
        };
        let old = framed_as_version_9(INCREMENT_MAGIC, &increment);
        assert_eq!(Increment::decode(&old).unwrap(), increment);
        let increment = Increment {
            volume_compressions: compressions.clone(),
            ..increment
        };
        assert_eq!(Increment::decode(&increment.encode()).unwrap(), increment);
        // An increment's table replaces its base's.
        let mut image = with_codecs;
        image
            .apply(Increment {
                volume_compressions: compressions[1..].to_vec(),
                ..increment
            })
            .unwrap();
        assert_eq!(image.volume_compressions, compressions[1..]);
    }
}
