//! Restoring a volume table from a checkpoint body. The body's checksum only
//! says it was written whole; these checks reject contents no correct lamina
//! writes (chunks built from later ones, maps out of order, clones of missing
//! snapshots, ...), so that recovery reports a damaged checkpoint instead of
//! tripping one of the table's assertions. Chunks shared between maps in the
//! body are shared again in memory.

use std::collections::HashSet;
use std::sync::Arc;

use lamina_reduction::Codec;

use super::map::{BlockMap, CHUNK_ENTRY_COUNT, Chunk, LOST_PHYSICAL_BLOCK};
use super::{
    Origin, Snapshot, TierPolicy, VOLUME_SIZE_BYTES_MAX, Volume, VolumeTable, validate_volume_name,
};
use crate::BLOCK_SIZE_BYTES;
use crate::log::checkpoint::{Body, ChunkImage, MapImage, SnapshotImage, VolumeImage};
use crate::log::geometry::Geometry;
use crate::log::location::Location;

/// What makes a checksummed checkpoint body unusable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RestoreError {
    #[error("a log head lies outside the segments")]
    HeadOutsideSegments,
    #[error("map chunk {index} is malformed")]
    MalformedChunk { index: usize },
    #[error("map chunk {index} maps a block outside the segments")]
    ChunkOutsideSegments { index: usize },
    #[error("{owner} has a malformed map")]
    MalformedMap { owner: String },
    #[error("{owner} names a map chunk that does not exist")]
    MissingChunk { owner: String },
    #[error("{owner} maps beyond the largest volume size")]
    MapBeyondSizeMax { owner: String },
    #[error("volume {name} appears twice")]
    DuplicateVolume { name: String },
    #[error("volume name {name:?} is not valid")]
    InvalidVolumeName { name: String },
    #[error("volume {name} has an origin that does not exist")]
    MissingOrigin { name: String },
    #[error("{owner} is duplicated, out of order or misnamed")]
    InvalidSnapshot { owner: String },
    #[error("a tier policy names volume {volume_id}, which does not exist")]
    StrayPolicy { volume_id: u32 },
    #[error("a codec names volume {volume_id}, which does not exist")]
    StrayCompression { volume_id: u32 },
    #[error("the codec of volume {volume_id} is not valid: {reason}")]
    InvalidCompression { volume_id: u32, reason: String },
}

impl VolumeTable {
    /// The volumes, snapshots and clones of a checkpoint body, after checking
    /// it for contents no correct lamina writes.
    pub fn from_checkpoint(body: &Body, geometry: &Geometry) -> Result<Self, RestoreError> {
        if body
            .heads
            .iter()
            .any(|head| u64::from(head.segment_index) >= geometry.segment_count)
        {
            return Err(RestoreError::HeadOutsideSegments);
        }
        let chunks = restore_chunks(&body.chunks, geometry)?;
        let mut table = VolumeTable::new();
        let mut snapshot_ids = HashSet::new();
        for image in &body.volumes {
            let volume = table.restore_volume(image, &chunks, &mut snapshot_ids)?;
            table.insert(volume);
        }
        table.restore_policies(body)?;
        table.restore_compressions(body)?;
        table.next_volume_id = table.next_volume_id.max(body.next_volume_id);
        table.next_snapshot_id = table.next_snapshot_id.max(body.next_snapshot_id);
        Ok(table)
    }

    /// One volume of the body with its snapshots, checked against the
    /// volumes restored before it (its origin among them).
    fn restore_volume(
        &self,
        image: &VolumeImage,
        chunks: &[Arc<Chunk>],
        snapshot_ids: &mut HashSet<u32>,
    ) -> Result<Volume, RestoreError> {
        if self.by_name.contains_key(&image.name) || self.volumes.contains_key(&image.volume_id) {
            return Err(RestoreError::DuplicateVolume {
                name: image.name.clone(),
            });
        }
        if validate_volume_name(&image.name).is_err() {
            return Err(RestoreError::InvalidVolumeName {
                name: image.name.clone(),
            });
        }
        let origin = self.restore_origin(image)?;
        let snapshots = restore_snapshots(image, chunks, snapshot_ids)?;
        let owner = format!("volume {}", image.name);
        Ok(Volume {
            volume_id: image.volume_id,
            name: image.name.clone(),
            size_bytes: image.size_bytes,
            created_unix_seconds: image.created_unix_seconds,
            map: restore_map(&image.map, chunks, &owner)?,
            origin,
            snapshots,
            // Set from the body's policy and codec tables afterwards.
            policy: TierPolicy::default(),
            compression: Codec::Off,
        })
    }

    /// Sets the policies of the body's policy table, whose every entry must
    /// name a volume; the first entry for a volume wins.
    fn restore_policies(&mut self, body: &Body) -> Result<(), RestoreError> {
        if let Some(stray) = body
            .volume_policies
            .iter()
            .find(|policy| !self.volumes.contains_key(&policy.volume_id))
        {
            return Err(RestoreError::StrayPolicy {
                volume_id: stray.volume_id,
            });
        }
        for policy in body.volume_policies.iter().rev() {
            let volume = self
                .volumes
                .get_mut(&policy.volume_id)
                .expect("checked above");
            volume.policy = TierPolicy::from(policy.policy);
        }
        Ok(())
    }

    /// Sets the codecs of the body's codec table, whose every entry must
    /// name a volume and a valid codec; the first entry for a volume wins.
    fn restore_compressions(&mut self, body: &Body) -> Result<(), RestoreError> {
        for image in body.volume_compressions.iter().rev() {
            let volume_id = image.volume_id;
            let codec =
                Codec::try_from(image.codec).map_err(|error| RestoreError::InvalidCompression {
                    volume_id,
                    reason: error.to_string(),
                })?;
            let volume = self
                .volumes
                .get_mut(&volume_id)
                .ok_or(RestoreError::StrayCompression { volume_id })?;
            volume.compression = codec;
        }
        Ok(())
    }

    /// The snapshot a volume was cloned from, which must already be in the
    /// table. A clone is always younger than the volume it comes from, which
    /// also rules out cycles.
    fn restore_origin(&self, image: &VolumeImage) -> Result<Option<Origin>, RestoreError> {
        let Some((origin_volume_id, origin_snapshot_id)) = image.origin else {
            return Ok(None);
        };
        let exists = origin_volume_id < image.volume_id
            && self
                .get(origin_volume_id)
                .is_some_and(|origin| origin.snapshot(origin_snapshot_id).is_some());
        if !exists {
            return Err(RestoreError::MissingOrigin {
                name: image.name.clone(),
            });
        }
        Ok(Some(Origin {
            volume_id: origin_volume_id,
            snapshot_id: origin_snapshot_id,
        }))
    }
}

/// A volume's snapshots: validly named, each named once in the volume, each
/// identifier once in the pool, in increasing identifier order.
fn restore_snapshots(
    image: &VolumeImage,
    chunks: &[Arc<Chunk>],
    snapshot_ids: &mut HashSet<u32>,
) -> Result<Vec<Snapshot>, RestoreError> {
    let mut snapshots: Vec<Snapshot> = Vec::with_capacity(image.snapshots.len());
    for snapshot in &image.snapshots {
        let owner = format!("snapshot {}@{}", image.name, snapshot.name);
        if !snapshot_valid(snapshot, &snapshots, snapshot_ids) {
            return Err(RestoreError::InvalidSnapshot { owner });
        }
        snapshots.push(Snapshot {
            snapshot_id: snapshot.snapshot_id,
            name: snapshot.name.clone(),
            size_bytes: snapshot.size_bytes,
            created_unix_seconds: snapshot.created_unix_seconds,
            map: restore_map(&snapshot.map, chunks, &owner)?,
        });
    }
    Ok(snapshots)
}

/// Whether a snapshot can follow `earlier` (its volume's snapshots restored
/// so far); records its identifier as taken in the pool.
fn snapshot_valid(
    snapshot: &SnapshotImage,
    earlier: &[Snapshot],
    snapshot_ids: &mut HashSet<u32>,
) -> bool {
    validate_volume_name(&snapshot.name).is_ok()
        && snapshot_ids.insert(snapshot.snapshot_id)
        && !earlier.iter().any(|earlier| {
            earlier.name == snapshot.name || earlier.snapshot_id >= snapshot.snapshot_id
        })
}

/// Every chunk of the body, each built from an earlier one (or from empty).
fn restore_chunks(
    images: &[ChunkImage],
    geometry: &Geometry,
) -> Result<Vec<Arc<Chunk>>, RestoreError> {
    let mut chunks: Vec<Arc<Chunk>> = Vec::with_capacity(images.len());
    for (index, image) in images.iter().enumerate() {
        let chunk = restore_chunk(index, image, &chunks, geometry)?;
        chunks.push(Arc::new(chunk));
    }
    Ok(chunks)
}

/// Chunk `index`: its base (an earlier chunk) with the entries that differ.
fn restore_chunk(
    index: usize,
    image: &ChunkImage,
    earlier: &[Arc<Chunk>],
    geometry: &Geometry,
) -> Result<Chunk, RestoreError> {
    let mut chunk = match image.base {
        None => Chunk::empty(),
        Some(base) if (base as usize) < index => Chunk::clone(&earlier[base as usize]),
        Some(_) => return Err(RestoreError::MalformedChunk { index }),
    };
    if !chunk_entries_valid(image) {
        return Err(RestoreError::MalformedChunk { index });
    }
    let entries = image
        .entries
        .iter()
        .zip(&image.physical_blocks)
        .zip(&image.checksums);
    for ((entry, raw), checksum) in entries {
        let location = if *raw == 0 {
            None
        } else {
            let location =
                Location::from_raw(*raw).map_err(|_| RestoreError::MalformedChunk { index })?;
            let last_block = location.block() + u64::from(location.block_count()) - 1;
            let occupies_device = location.block() != LOST_PHYSICAL_BLOCK || location.is_fragment();
            if occupies_device
                && !(geometry.is_data_block(location.block()) && geometry.is_data_block(last_block))
            {
                return Err(RestoreError::ChunkOutsideSegments { index });
            }
            Some(location)
        };
        chunk.set_entry(usize::from(*entry), location, *checksum);
    }
    Ok(chunk)
}

/// Whether a chunk's entries are parallel lists, strictly increasing and
/// within a chunk.
fn chunk_entries_valid(image: &ChunkImage) -> bool {
    image.entries.len() == image.physical_blocks.len()
        && image.entries.len() == image.checksums.len()
        && image.entries.windows(2).all(|pair| pair[0] < pair[1])
        && image
            .entries
            .last()
            .is_none_or(|last| (*last as usize) < CHUNK_ENTRY_COUNT)
}

/// A map from its chunk list; `owner` names the volume or snapshot for errors.
fn restore_map(
    image: &MapImage,
    chunks: &[Arc<Chunk>],
    owner: &str,
) -> Result<BlockMap, RestoreError> {
    if image.chunk_indexes.len() != image.chunk_references.len()
        || image
            .chunk_indexes
            .windows(2)
            .any(|pair| pair[0] >= pair[1])
    {
        return Err(RestoreError::MalformedMap {
            owner: owner.to_string(),
        });
    }
    let mut map = BlockMap::default();
    for (chunk_index, reference) in image.chunk_indexes.iter().zip(&image.chunk_references) {
        let chunk = chunks
            .get(*reference as usize)
            .ok_or_else(|| RestoreError::MissingChunk {
                owner: owner.to_string(),
            })?;
        if *chunk_index > VOLUME_SIZE_BYTES_MAX / BLOCK_SIZE_BYTES {
            return Err(RestoreError::MapBeyondSizeMax {
                owner: owner.to_string(),
            });
        }
        map.insert_shared_chunk(*chunk_index, chunk.clone());
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::batch::{CachePriorityRecord, CodecRecord, PinRecord, PolicyRecord};
    use crate::log::checkpoint::{
        CountersImage, PlacementImage, VolumeCompressionImage, VolumePolicyImage,
    };
    use crate::log::geometry::DATA_START_BLOCK;

    fn geometry() -> Geometry {
        Geometry::for_device(64 << 20, 1 << 20).unwrap()
    }

    fn map_of(chunk: u32) -> MapImage {
        MapImage {
            chunk_indexes: vec![0],
            chunk_references: vec![chunk],
        }
    }

    /// Volume 1 "base" with snapshot 5 "s" (chunk 0), its live map (chunk 1,
    /// built on chunk 0), and volume 2 "copy" cloned from base@s.
    fn body() -> Body {
        let chunk = |base, physical_block| ChunkImage {
            base,
            entries: vec![3],
            physical_blocks: vec![physical_block],
            checksums: vec![7],
        };
        let volume = |volume_id, name: &str, origin, map, snapshots| VolumeImage {
            volume_id,
            name: name.to_string(),
            size_bytes: 1 << 20,
            created_unix_seconds: 1,
            origin,
            map,
            snapshots,
        };
        let snapshot = SnapshotImage {
            snapshot_id: 5,
            name: "s".to_string(),
            size_bytes: 1 << 20,
            created_unix_seconds: 1,
            map: map_of(0),
        };
        Body {
            checkpoint_sequence: 1,
            covered_batch_sequence: 1,
            next_segment_sequence: 1,
            next_volume_id: 3,
            next_snapshot_id: 6,
            heads: Vec::new(),
            chunks: vec![
                chunk(None, DATA_START_BLOCK),
                chunk(Some(0), DATA_START_BLOCK + 1),
            ],
            volumes: vec![
                volume(1, "base", None, map_of(1), vec![snapshot]),
                volume(2, "copy", Some((1, 5)), map_of(0), Vec::new()),
            ],
            segment_last_batch_sequences: Vec::new(),
            volume_policies: vec![VolumePolicyImage {
                volume_id: 2,
                policy: PolicyRecord {
                    priority: CachePriorityRecord::Low,
                    pin: PinRecord::Capacity,
                },
            }],
            counters: CountersImage::default(),
            placement: PlacementImage::default(),
            volume_compressions: vec![VolumeCompressionImage {
                volume_id: 2,
                codec: CodecRecord::Zstd { level: 5 },
            }],
        }
    }

    #[test]
    fn a_body_restores_its_volumes_snapshots_clones_policies_and_codecs() {
        let table = VolumeTable::from_checkpoint(&body(), &geometry()).unwrap();
        let base = table.get(1).unwrap();
        assert_eq!(
            base.map.get(3).unwrap().physical_block(),
            DATA_START_BLOCK + 1
        );
        assert_eq!(
            base.snapshots[0].map.get(3).unwrap().physical_block(),
            DATA_START_BLOCK
        );
        let copy = table.get(2).unwrap();
        assert_eq!(
            copy.origin,
            Some(Origin {
                volume_id: 1,
                snapshot_id: 5
            })
        );
        assert_eq!(copy.policy.pin, super::super::Pin::Capacity);
        assert_eq!(base.policy, TierPolicy::default());
        assert_eq!(copy.compression, Codec::zstd(5).unwrap());
        assert_eq!(base.compression, Codec::Off);
        assert_eq!(table.compression(2), Codec::zstd(5).unwrap());
        assert_eq!((table.next_volume_id, table.next_snapshot_id), (3, 6));
    }

    #[test]
    fn bodies_no_correct_lamina_writes_are_refused() {
        let refused = |change: &dyn Fn(&mut Body)| {
            let mut body = body();
            change(&mut body);
            VolumeTable::from_checkpoint(&body, &geometry())
                .err()
                .unwrap()
        };
        assert_eq!(
            refused(&|body| body.chunks[0].base = Some(1)),
            RestoreError::MalformedChunk { index: 0 }
        );
        // Block 2 lies in the superblock area (block 1 there means lost,
        // format version 9, and is accepted).
        assert_eq!(
            refused(&|body| body.chunks[1].physical_blocks[0] = 2),
            RestoreError::ChunkOutsideSegments { index: 1 }
        );
        // A location with its reserved top byte set (format version 10), and
        // a fragment in block 1 (which, as a fragment, is not the lost block).
        assert_eq!(
            refused(&|body| body.chunks[1].physical_blocks[0] = 1 << 56 | DATA_START_BLOCK),
            RestoreError::MalformedChunk { index: 1 }
        );
        assert_eq!(
            refused(&|body| {
                body.chunks[1].physical_blocks[0] = Location::fragment(1, 0, 4).raw();
            }),
            RestoreError::ChunkOutsideSegments { index: 1 }
        );
        assert_eq!(
            refused(&|body| body.volumes[1].map = map_of(9)),
            RestoreError::MissingChunk {
                owner: "volume copy".to_string()
            }
        );
        assert_eq!(
            refused(&|body| body.volumes[1].origin = Some((1, 4))),
            RestoreError::MissingOrigin {
                name: "copy".to_string()
            }
        );
        assert_eq!(
            refused(&|body| body.volumes[1].name = "base".to_string()),
            RestoreError::DuplicateVolume {
                name: "base".to_string()
            }
        );
        assert_eq!(
            refused(&|body| body.volume_policies[0].volume_id = 8),
            RestoreError::StrayPolicy { volume_id: 8 }
        );
        assert_eq!(
            refused(&|body| body.volume_compressions[0].volume_id = 8),
            RestoreError::StrayCompression { volume_id: 8 }
        );
        assert!(matches!(
            refused(&|body| body.volume_compressions[0].codec = CodecRecord::Zstd { level: 0 }),
            RestoreError::InvalidCompression { volume_id: 2, .. }
        ));
        assert_eq!(
            refused(&|body| body.volumes[0].snapshots[0].name = ".s".to_string()),
            RestoreError::InvalidSnapshot {
                owner: "snapshot base@.s".to_string()
            }
        );
    }
}
