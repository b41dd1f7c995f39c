//! A checkpoint's image: the volumes and maps copied under the state lock
//! (cheap: chunks are shared) and encoded outside it into a base body. The
//! checkpointer (`checkpoint/mod.rs`) and increments (`checkpoint/increment.rs`)
//! both build on it.

use std::sync::Arc;

use lamina_reduction::Codec;

use crate::log::checkpoint::{
    Body, ChunkImage, CountersImage, HeadImage, MapImage, PlacementImage, SnapshotImage,
    VolumeCompressionImage, VolumeImage, VolumePolicyImage,
};
use crate::volume::map::{BlockMap, CHUNK_ENTRY_COUNT, Chunk};
use crate::volume::{TierPolicy, VolumeTable};

/// A volume's maps, copied under the state lock (cheap: chunks are shared) and
/// encoded outside it.
pub(in crate::pool) struct VolumeCopy {
    pub(in crate::pool) volume_id: u32,
    pub(in crate::pool) name: String,
    pub(in crate::pool) size_bytes: u64,
    pub(in crate::pool) created_unix_seconds: u64,
    pub(in crate::pool) origin: Option<(u32, u32)>,
    pub(in crate::pool) map: BlockMap,
    pub(in crate::pool) policy: TierPolicy,
    pub(in crate::pool) compression: Codec,
    pub(in crate::pool) snapshots: Vec<SnapshotCopy>,
}

pub(in crate::pool) struct SnapshotCopy {
    pub(in crate::pool) snapshot_id: u32,
    pub(in crate::pool) name: String,
    pub(in crate::pool) size_bytes: u64,
    pub(in crate::pool) created_unix_seconds: u64,
    pub(in crate::pool) map: BlockMap,
}

/// Distinct chunks, found by identity: maps that share a chunk in memory share
/// one image in the body, and a chunk that differs from the same chunk of the
/// map before it in its chain is stored as the difference, so that a
/// checkpoint's size grows with distinct mappings, not with snapshots.
#[derive(Default)]
struct ChunkTable {
    chunks: Vec<ChunkImage>,
    by_identity: std::collections::HashMap<*const Chunk, u32>,
    /// Keeps every chunk seen alive, so that no address is reused while encoding.
    held: Vec<Arc<Chunk>>,
}

impl ChunkTable {
    /// Encodes `map`, storing chunks new to the table as differences from the
    /// same chunk of `base` (a map encoded earlier) when it has one.
    fn image(&mut self, map: &BlockMap, base: Option<&BlockMap>) -> MapImage {
        let mut image = MapImage::default();
        for (chunk_index, chunk) in map.shared_chunks() {
            image.chunk_indexes.push(chunk_index);
            image
                .chunk_references
                .push(self.reference(chunk_index, chunk, base));
        }
        image
    }

    /// The reference of `chunk` (at `chunk_index`), stored now if the table
    /// does not hold it yet.
    fn reference(&mut self, chunk_index: u64, chunk: &Arc<Chunk>, base: Option<&BlockMap>) -> u32 {
        match self.by_identity.get(&Arc::as_ptr(chunk)) {
            Some(reference) => *reference,
            None => self.add(chunk_index, chunk, base),
        }
    }

    fn into_chunks(self) -> Vec<ChunkImage> {
        self.chunks
    }

    /// Stores a chunk new to the table, as the entries where it differs from
    /// chunk `chunk_index` of `base` if the table holds that one (from all
    /// entries otherwise). Returns its reference.
    fn add(&mut self, chunk_index: u64, chunk: &Arc<Chunk>, base: Option<&BlockMap>) -> u32 {
        let base_chunk = base
            .and_then(|base| base.shared_chunk(chunk_index))
            .and_then(|base_chunk| {
                let reference = self.by_identity.get(&Arc::as_ptr(base_chunk))?;
                Some((*reference, base_chunk))
            });
        let mut chunk_image = ChunkImage {
            base: base_chunk.map(|(reference, _)| reference),
            entries: Vec::new(),
            physical_blocks: Vec::new(),
            checksums: Vec::new(),
        };
        for entry in 0..CHUNK_ENTRY_COUNT {
            let (base_physical, base_checksum) = base_chunk.map_or((0, 0), |(_, base)| {
                (base.raw_location(entry), base.checksum(entry))
            });
            let physical = chunk.raw_location(entry);
            // An unmapped entry's checksum means nothing: compared as zero.
            let checksum = if physical == 0 {
                0
            } else {
                chunk.checksum(entry)
            };
            let base_checksum = if base_physical == 0 { 0 } else { base_checksum };
            if (physical, checksum) != (base_physical, base_checksum) {
                chunk_image.entries.push(
                    u16::try_from(entry).expect("entry indexes are below CHUNK_ENTRY_COUNT (512)"),
                );
                chunk_image.physical_blocks.push(physical);
                chunk_image.checksums.push(checksum);
            }
        }
        self.chunks.push(chunk_image);
        self.held.push(chunk.clone());
        let reference = u32::try_from(self.chunks.len() - 1).expect(
            "a checkpoint holds fewer than 2^32 distinct chunks (the format's reference width)",
        );
        self.by_identity.insert(Arc::as_ptr(chunk), reference);
        reference
    }
}

/// Which checkpoint is being written, and into which slot.
#[derive(Clone, Copy, Debug)]
pub(in crate::pool) struct CheckpointTarget {
    pub(in crate::pool) checkpoint_sequence: u64,
    /// The slot not holding the newest durable checkpoint.
    pub(in crate::pool) slot_index: usize,
    /// Every batch up to this one is sealed, and flushed before the body is
    /// written: the body's maps include them all.
    pub(in crate::pool) covered_batch_sequence: u64,
    /// The body's `next_segment_sequence`: segments opened from here on are
    /// the segment openings record's business once this is durable.
    pub(in crate::pool) next_segment_sequence: u64,
}

/// What a checkpoint copies of the state under the lock; the body is built
/// from it outside the lock.
pub(in crate::pool) struct CheckpointSnapshot {
    pub(in crate::pool) target: CheckpointTarget,
    pub(in crate::pool) next_segment_sequence: u64,
    pub(in crate::pool) next_volume_id: u32,
    pub(in crate::pool) next_snapshot_id: u32,
    pub(in crate::pool) heads: Vec<HeadImage>,
    pub(in crate::pool) volumes: Vec<VolumeCopy>,
    pub(in crate::pool) segment_last_batch_sequences: Vec<u64>,
    pub(in crate::pool) counters: CountersImage,
    pub(in crate::pool) placement: PlacementImage,
}

/// Copies every volume's and snapshot's map (cheap: chunks are shared).
pub(in crate::pool) fn copy_volumes(volumes: &VolumeTable) -> Vec<VolumeCopy> {
    volumes
        .iter()
        .map(|volume| VolumeCopy {
            volume_id: volume.volume_id,
            name: volume.name.clone(),
            size_bytes: volume.size_bytes,
            created_unix_seconds: volume.created_unix_seconds,
            origin: volume
                .origin
                .map(|origin| (origin.volume_id, origin.snapshot_id)),
            map: volume.map.clone(),
            policy: volume.policy,
            compression: volume.compression,
            snapshots: volume
                .snapshots
                .iter()
                .map(|snapshot| SnapshotCopy {
                    snapshot_id: snapshot.snapshot_id,
                    name: snapshot.name.clone(),
                    size_bytes: snapshot.size_bytes,
                    created_unix_seconds: snapshot.created_unix_seconds,
                    map: snapshot.map.clone(),
                })
                .collect(),
        })
        .collect()
}

/// The volumes' images and the table of the chunks they share. Volumes go
/// in identifier order, so that a clone's origin snapshot is encoded before
/// the clone uses it as a base.
fn volume_images(volumes: &[VolumeCopy]) -> (Vec<VolumeImage>, Vec<ChunkImage>) {
    let mut table = ChunkTable::default();
    let mut images: Vec<VolumeImage> = Vec::with_capacity(volumes.len());
    for volume in volumes {
        let origin_map = origin_map(volumes, volume);
        // Each map is stored as its difference from the one before it in
        // the volume's chain: origin snapshot, own snapshots, live map.
        let mut before = origin_map;
        let mut snapshots = Vec::with_capacity(volume.snapshots.len());
        for snapshot in &volume.snapshots {
            snapshots.push(SnapshotImage {
                snapshot_id: snapshot.snapshot_id,
                name: snapshot.name.clone(),
                size_bytes: snapshot.size_bytes,
                created_unix_seconds: snapshot.created_unix_seconds,
                map: table.image(&snapshot.map, before),
            });
            before = Some(&snapshot.map);
        }
        images.push(VolumeImage {
            volume_id: volume.volume_id,
            name: volume.name.clone(),
            size_bytes: volume.size_bytes,
            created_unix_seconds: volume.created_unix_seconds,
            origin: volume.origin,
            map: table.image(&volume.map, before),
            snapshots,
        });
    }
    (images, table.into_chunks())
}

/// The tier policies of the volumes that do not have the default one.
pub(in crate::pool) fn volume_policies(volumes: &[VolumeCopy]) -> Vec<VolumePolicyImage> {
    volumes
        .iter()
        .filter(|volume| volume.policy != TierPolicy::default())
        .map(|volume| VolumePolicyImage {
            volume_id: volume.volume_id,
            policy: volume.policy.into(),
        })
        .collect()
}

/// The codecs of the volumes whose codec is not `Off`.
pub(in crate::pool) fn volume_compressions(volumes: &[VolumeCopy]) -> Vec<VolumeCompressionImage> {
    volumes
        .iter()
        .filter(|volume| volume.compression != Codec::Off)
        .map(|volume| VolumeCompressionImage {
            volume_id: volume.volume_id,
            codec: volume.compression.into(),
        })
        .collect()
}

/// The map `volume`'s chain starts from: the snapshot it was cloned from.
fn origin_map<'a>(volumes: &'a [VolumeCopy], volume: &VolumeCopy) -> Option<&'a BlockMap> {
    let (origin_volume, origin_snapshot) = volume.origin?;
    let origin = volumes
        .iter()
        .find(|candidate| candidate.volume_id == origin_volume)?;
    origin
        .snapshots
        .iter()
        .find(|snapshot| snapshot.snapshot_id == origin_snapshot)
        .map(|snapshot| &snapshot.map)
}

/// The base body the snapshot describes, encoded.
pub(in crate::pool) fn encode_body(snapshot: CheckpointSnapshot) -> Vec<u8> {
    let (volumes, chunks) = volume_images(&snapshot.volumes);
    let volume_policies = volume_policies(&snapshot.volumes);
    let volume_compressions = volume_compressions(&snapshot.volumes);
    let body = Body {
        checkpoint_sequence: snapshot.target.checkpoint_sequence,
        covered_batch_sequence: snapshot.target.covered_batch_sequence,
        next_segment_sequence: snapshot.next_segment_sequence,
        next_volume_id: snapshot.next_volume_id,
        next_snapshot_id: snapshot.next_snapshot_id,
        heads: snapshot.heads,
        chunks,
        volumes,
        segment_last_batch_sequences: snapshot.segment_last_batch_sequences,
        volume_policies,
        counters: snapshot.counters,
        placement: snapshot.placement,
        volume_compressions,
    };
    let encoded = body.encode();
    // Decoding costs about what encoding did: debug builds only.
    debug_assert!(
        Body::decode(&encoded).is_ok_and(|decoded| decoded == body),
        "checkpoint {} body does not decode to what was encoded",
        body.checkpoint_sequence
    );
    encoded
}
