//! Writing a checkpoint: persist every volume and its map so that recovery needs
//! to replay only the batches appended since. The maps are copied under the state
//! lock (cheap: chunks are shared), the log is flushed up to the point the copy
//! covers, the body is written into free segments, and only then is the slot
//! written, into the slot not holding the newest durable checkpoint, so that a
//! torn slot write always leaves the previous checkpoint intact.

use std::collections::HashSet;
use std::sync::Arc;

use lamina_device::AlignedBuffer;

use super::checkpoint_increment::{CheckpointChain, EncodedCheckpoint, encode_checkpoint};
use super::inner::Pool;
use super::space::{CheckpointBody, DurableCheckpoint, SegmentState};
use crate::convert::to_usize;
use crate::error::{EngineError, IoError};
use crate::log::checkpoint::{
    Body, ChunkImage, CountersImage, HeadImage, MapImage, PlacementImage, Slot, SlotLink,
    SnapshotImage, VolumeImage, VolumePolicyImage,
};
use crate::log::geometry::CHECKPOINT_SLOT_BLOCKS;
use crate::volume::map::{BlockMap, CHUNK_ENTRY_COUNT, Chunk};
use crate::volume::{TierPolicy, VolumeTable};
use crate::{BLOCK_BYTES, BLOCK_SIZE_BYTES};

/// A volume's maps, copied under the state lock (cheap: chunks are shared) and
/// encoded outside it.
pub(super) struct VolumeCopy {
    pub(super) volume_id: u32,
    pub(super) name: String,
    pub(super) size_bytes: u64,
    pub(super) created_unix_seconds: u64,
    pub(super) origin: Option<(u32, u32)>,
    pub(super) map: BlockMap,
    pub(super) policy: TierPolicy,
    pub(super) snapshots: Vec<SnapshotCopy>,
}

pub(super) struct SnapshotCopy {
    pub(super) snapshot_id: u32,
    pub(super) name: String,
    pub(super) size_bytes: u64,
    pub(super) created_unix_seconds: u64,
    pub(super) map: BlockMap,
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
                (base.physical_blocks[entry], base.checksums[entry])
            });
            let physical = chunk.physical_blocks[entry];
            // An unmapped entry's checksum means nothing: compared as zero.
            let checksum = if physical == 0 {
                0
            } else {
                chunk.checksums[entry]
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
pub(super) struct CheckpointTarget {
    pub(super) checkpoint_sequence: u64,
    /// The slot not holding the newest durable checkpoint.
    slot_index: usize,
    /// Every batch up to this one is sealed, and flushed before the body is
    /// written: the body's maps include them all.
    pub(super) covered_batch_sequence: u64,
}

/// What a checkpoint copies of the state under the lock; the body is built
/// from it outside the lock.
pub(super) struct CheckpointSnapshot {
    pub(super) target: CheckpointTarget,
    pub(super) next_segment_sequence: u64,
    pub(super) next_volume_id: u32,
    pub(super) next_snapshot_id: u32,
    pub(super) heads: Vec<HeadImage>,
    pub(super) volumes: Vec<VolumeCopy>,
    pub(super) segment_last_batch_sequences: Vec<u64>,
    pub(super) counters: CountersImage,
    pub(super) placement: PlacementImage,
}

/// Copies every volume's and snapshot's map (cheap: chunks are shared).
fn copy_volumes(volumes: &VolumeTable) -> Vec<VolumeCopy> {
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
pub(super) fn volume_policies(volumes: &[VolumeCopy]) -> Vec<VolumePolicyImage> {
    volumes
        .iter()
        .filter(|volume| volume.policy != TierPolicy::default())
        .map(|volume| VolumePolicyImage {
            volume_id: volume.volume_id,
            policy: volume.policy.into(),
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
pub(super) fn encode_body(snapshot: CheckpointSnapshot) -> Vec<u8> {
    let (volumes, chunks) = volume_images(&snapshot.volumes);
    let volume_policies = volume_policies(&snapshot.volumes);
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

/// Whether a checkpoint may be an increment on the chain.
#[derive(Clone, Copy)]
enum CheckpointKind {
    Any,
    Base,
}

impl Pool {
    /// Writes a checkpoint now. Safe to call at any time; concurrent calls queue.
    pub async fn checkpoint(&self) -> Result<(), EngineError> {
        self.checkpoint_as(CheckpointKind::Any).await
    }

    /// Writes a base checkpoint now, whatever the chain: two in a row free
    /// every older body (the evacuation moves checkpoint bodies off
    /// degraded or narrow segments so).
    pub async fn checkpoint_base(&self) -> Result<(), EngineError> {
        self.checkpoint_as(CheckpointKind::Base).await
    }

    async fn checkpoint_as(&self, kind: CheckpointKind) -> Result<(), EngineError> {
        let mut chain_guard = self.inner.checkpoint_lock.lock().await;
        // Taken out: a checkpoint that does not become durable leaves the
        // chain empty, so that the next one is a base.
        let chain = match kind {
            CheckpointKind::Any => std::mem::take(&mut *chain_guard),
            CheckpointKind::Base => CheckpointChain::default(),
        };
        let snapshot = self.take_checkpoint_snapshot()?;
        let target = snapshot.target;
        self.flush_through(target.covered_batch_sequence).await?;
        let whatever_their_bytes = self
            .inner
            .limits
            .test_hooks
            .checkpoint_increments_whatever_their_bytes;
        let encoded = tokio::task::spawn_blocking(move || {
            encode_checkpoint(snapshot, chain, whatever_their_bytes)
        })
        .await
        .expect("checkpoint encoding task");
        let result = self.write_checkpoint(target, &encoded).await;
        if let Ok(newest) = &result {
            *chain_guard = CheckpointChain::after(encoded.earlier_links, newest.clone());
        }
        let result = result.map(|_| ());
        // A body that found the device full was abandoned before any slot
        // named it: the pool goes on with its previous checkpoints.
        if let Err(error) = &result
            && !matches!(error, EngineError::Io(IoError::DeviceFull { .. }))
        {
            self.inner
                .lock()
                .writer_mut()
                .fail(format!("checkpoint failed: {error}"));
        }
        result
    }

    /// Seals the open batches (handing them to the device) and copies what
    /// the checkpoint needs, all in one hold of the state lock, so that the
    /// copy covers exactly the batches sealed so far.
    fn take_checkpoint_snapshot(&self) -> Result<CheckpointSnapshot, EngineError> {
        let mut state = self.inner.lock();
        state.check_failed()?;
        let sealed = state.seal_open_batch();
        self.spawn_writes(sealed);
        let sealed_bytes = state.counters().sealed_bytes();
        let checkpoint_sequence = state.checkpoint_schedule_mut().take_sequence(sealed_bytes);
        let slot_index = state
            .space()
            .durable_checkpoints()
            .last()
            .map_or(0, |latest| 1 - latest.slot_index);
        let heads = state
            .writer()
            .heads()
            .iter()
            .flatten()
            .map(|head| HeadImage {
                segment_index: head.segment_index,
                segment_sequence: head.segment_sequence,
                next_block_in_segment: head.next_block_in_segment,
            })
            .collect();
        let snapshot = CheckpointSnapshot {
            target: CheckpointTarget {
                checkpoint_sequence,
                slot_index,
                covered_batch_sequence: state.writer().sealed_through(),
            },
            next_segment_sequence: state.writer().next_segment_sequence(),
            next_volume_id: state.volumes().next_volume_id(),
            next_snapshot_id: state.volumes().next_snapshot_id(),
            heads,
            volumes: copy_volumes(state.volumes()),
            segment_last_batch_sequences: state
                .space()
                .segments()
                .iter()
                .map(|segment| segment.last_batch_sequence)
                .collect(),
            counters: state.counters().lifetime(),
            placement: state.placement().image(),
        };
        // In the same hold of the lock as the copy: every later change is
        // the next checkpoint's.
        state.volumes_mut().checkpoint_taken();
        Ok(snapshot)
    }

    /// Writes the encoded body into free segments, then the slot that names
    /// them, each followed by a device flush, and records the checkpoint as
    /// durable.
    async fn write_checkpoint(
        &self,
        target: CheckpointTarget,
        checkpoint: &EncodedCheckpoint,
    ) -> Result<SlotLink, EngineError> {
        let encoded = &checkpoint.bytes[..];
        let body_segments = self.take_body_segments(target, encoded.len())?;
        self.write_body(encoded, &body_segments).await?;
        self.inner.device.flush().await?;
        let slot = Slot {
            checkpoint_sequence: target.checkpoint_sequence,
            covered_batch_sequence: target.covered_batch_sequence,
            body_bytes: encoded.len() as u64,
            body_checksum: crc32c::crc32c(encoded),
            body_segments: body_segments.clone(),
            earlier_links: checkpoint.earlier_links.clone(),
        };
        self.write_slot(target, &slot).await?;
        self.inner.device.flush().await?;
        let mut state = self.inner.lock();
        // Device bytes, as written: each body piece padded to whole blocks, and the slot.
        let body_bytes = encoded.len().div_ceil(BLOCK_BYTES) as u64 * BLOCK_SIZE_BYTES;
        state
            .counters_mut()
            .checkpoint_written(body_bytes + BLOCK_SIZE_BYTES);
        state.checkpoint_became_durable(DurableCheckpoint {
            slot_index: target.slot_index,
            checkpoint_sequence: target.checkpoint_sequence,
            covered_batch_sequence: target.covered_batch_sequence,
            body_segments,
            earlier_links: checkpoint
                .earlier_links
                .iter()
                .map(|link| CheckpointBody {
                    checkpoint_sequence: link.checkpoint_sequence,
                    body_segments: link.body_segments.clone(),
                })
                .collect(),
        });
        tracing::debug!(
            checkpoint_sequence = target.checkpoint_sequence,
            covered = target.covered_batch_sequence,
            bytes = encoded.len(),
            increment = !checkpoint.earlier_links.is_empty(),
            "checkpoint durable"
        );
        Ok(slot.own_link())
    }

    /// Takes free segments enough for a body of `body_bytes`.
    fn take_body_segments(
        &self,
        target: CheckpointTarget,
        body_bytes: usize,
    ) -> Result<Vec<u32>, EngineError> {
        let shapes = &self.inner.shapes;
        let mut state = self.inner.lock();
        let body_segments = state
            .space_mut()
            .take_checkpoint_body_segments(
                body_bytes as u64,
                |segment| shapes.size_bytes(segment),
                target.checkpoint_sequence,
            )
            .ok_or(EngineError::Io(IoError::NoSpace))?;
        // Taken from the free lists (the allocator checks each was free):
        // distinct, none holds a body a durable checkpoint names, and they
        // hold the body exactly.
        assert!(
            shapes
                .body_pieces(&body_segments, body_bytes as u64)
                .is_some(),
            "checkpoint {} body segments {body_segments:?} do not hold {body_bytes} bytes",
            target.checkpoint_sequence
        );
        let distinct: HashSet<u32> = body_segments.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            body_segments.len(),
            "checkpoint {} body segments {body_segments:?} are not distinct",
            target.checkpoint_sequence
        );
        let held = state.space().held_body_segments();
        assert!(
            held.iter().all(|segment| !distinct.contains(segment)),
            "checkpoint {} body segments {body_segments:?} overlap a kept checkpoint's",
            target.checkpoint_sequence,
        );
        Ok(body_segments)
    }

    /// Writes the body, a segment's worth at a time. When the device under
    /// the pool is out of space, its segments are given back and the
    /// checkpoint is skipped with `DeviceFull`.
    async fn write_body(&self, encoded: &[u8], body_segments: &[u32]) -> Result<(), EngineError> {
        let geometry = self.inner.geometry;
        let device = &self.inner.device;
        let pieces = self
            .inner
            .shapes
            .body_pieces(body_segments, encoded.len() as u64)
            .expect("the body's segments were taken to hold it");
        for body_piece in pieces {
            let start = to_usize(body_piece.body_offset);
            let piece = &encoded[start..start + to_usize(body_piece.length_bytes)];
            let offset = geometry.segment_first_block(body_piece.segment_index) * BLOCK_SIZE_BYTES;
            let written = device
                .write(offset, Arc::new(AlignedBuffer::from_slice_padded(piece)))
                .await;
            if let Err(error) = written {
                if !error.is_out_of_space() {
                    return Err(error.into());
                }
                // No slot names this body yet, so its segments are free again.
                self.inner
                    .lock()
                    .space_mut()
                    .return_checkpoint_body_segments(body_segments);
                tracing::warn!(%error, "checkpoint skipped: the device under the pool is out of space");
                return Err(EngineError::Io(IoError::DeviceFull {
                    device: device.name().to_string(),
                    waited_ms: 0,
                }));
            }
        }
        Ok(())
    }

    /// Writes the slot naming the body, into the slot not holding the newest
    /// durable checkpoint.
    async fn write_slot(&self, target: CheckpointTarget, slot: &Slot) -> Result<(), EngineError> {
        // The slot names exactly the segments the body was written into,
        // all still this checkpoint's.
        assert!(
            self.inner
                .shapes
                .body_pieces(&slot.body_segments, slot.body_bytes)
                .is_some()
        );
        {
            let state = self.inner.lock();
            for segment_index in &slot.body_segments {
                assert_eq!(
                    state.space().segment(*segment_index).state,
                    SegmentState::Checkpoint {
                        checkpoint_sequence: target.checkpoint_sequence
                    },
                    "segment {segment_index} of checkpoint {}'s body",
                    target.checkpoint_sequence
                );
            }
        }
        let encoded_slot = slot.encode();
        debug_assert_eq!(Slot::decode(&encoded_slot).ok().as_ref(), Some(slot));
        let slot_offset = CHECKPOINT_SLOT_BLOCKS[target.slot_index] * BLOCK_SIZE_BYTES;
        self.inner
            .device
            .write(slot_offset, super::inner::aligned(&encoded_slot))
            .await?;
        Ok(())
    }
}
