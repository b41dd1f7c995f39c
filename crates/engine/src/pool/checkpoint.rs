//! Writing a checkpoint: persist every volume and its map so that recovery needs
//! to replay only the batches appended since. The maps are copied under the state
//! lock (cheap: chunks are shared), the log is flushed up to the point the copy
//! covers, the body is written into free segments, and only then is the slot
//! written, into the slot not holding the newest durable checkpoint, so that a
//! torn slot write always leaves the previous checkpoint intact.

use std::sync::Arc;

use lamina_device::AlignedBuffer;

use super::inner::Pool;
use super::space::DurableCheckpoint;
use crate::BLOCK_SIZE_BYTES;
use crate::error::EngineError;
use crate::log::checkpoint::{
    Body, ChunkImage, HeadImage, MapImage, Slot, SnapshotImage, VolumeImage, VolumePolicyImage,
};
use crate::log::geometry::CHECKPOINT_SLOT_BLOCKS;
use crate::volume::TierPolicy;
use crate::volume::map::{BlockMap, CHUNK_ENTRY_COUNT, Chunk};

/// A volume's maps, copied under the state lock (cheap: chunks are shared) and
/// encoded outside it.
struct VolumeCopy {
    volume_id: u32,
    name: String,
    size_bytes: u64,
    created_unix_seconds: u64,
    origin: Option<(u32, u32)>,
    map: BlockMap,
    policy: TierPolicy,
    snapshots: Vec<SnapshotCopy>,
}

struct SnapshotCopy {
    snapshot_id: u32,
    name: String,
    size_bytes: u64,
    created_unix_seconds: u64,
    map: BlockMap,
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
            let reference = match self.by_identity.get(&Arc::as_ptr(chunk)) {
                Some(reference) => *reference,
                None => {
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
                        let (base_physical, base_checksum) = base_chunk
                            .map_or((0, 0), |(_, base)| {
                                (base.physical_blocks[entry], base.checksums[entry])
                            });
                        let physical = chunk.physical_blocks[entry];
                        let checksum = if physical == 0 {
                            0
                        } else {
                            chunk.checksums[entry]
                        };
                        let base_checksum = if base_physical == 0 { 0 } else { base_checksum };
                        if (physical, checksum) != (base_physical, base_checksum) {
                            chunk_image.entries.push(entry as u16);
                            chunk_image.physical_blocks.push(physical);
                            chunk_image.checksums.push(checksum);
                        }
                    }
                    self.chunks.push(chunk_image);
                    self.held.push(chunk.clone());
                    let reference = (self.chunks.len() - 1) as u32;
                    self.by_identity.insert(Arc::as_ptr(chunk), reference);
                    reference
                }
            };
            image.chunk_indexes.push(chunk_index);
            image.chunk_references.push(reference);
        }
        image
    }
}

impl Pool {
    /// Writes a checkpoint now. Safe to call at any time; concurrent calls queue.
    pub async fn checkpoint(&self) -> Result<(), EngineError> {
        let _guard = self.inner.checkpoint_lock.lock().await;
        let (
            checkpoint_sequence,
            slot_index,
            covered,
            next_segment_sequence,
            (next_volume_id, next_snapshot_id),
            heads,
            volumes,
            segment_last,
            counters,
            placement,
        ) = {
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
            let volumes: Vec<VolumeCopy> = state
                .volumes()
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
                .collect();
            (
                checkpoint_sequence,
                slot_index,
                state.writer().sealed_through(),
                state.writer().next_segment_sequence(),
                (
                    state.volumes().next_volume_id,
                    state.volumes().next_snapshot_id,
                ),
                state
                    .writer()
                    .heads()
                    .iter()
                    .flatten()
                    .map(|head| HeadImage {
                        segment_index: head.segment_index,
                        segment_sequence: head.segment_sequence,
                        next_block_in_segment: head.next_block_in_segment,
                    })
                    .collect::<Vec<_>>(),
                volumes,
                state
                    .space()
                    .segments()
                    .iter()
                    .map(|segment| segment.last_batch_sequence)
                    .collect::<Vec<_>>(),
                state.counters().lifetime(),
                state.placement().image(),
            )
        };
        self.flush_through(covered).await?;
        let encoded = tokio::task::spawn_blocking(move || {
            let mut table = ChunkTable::default();
            // Volumes in identifier order, so that a clone's origin snapshot is
            // encoded before the clone uses it as a base.
            let mut images: Vec<VolumeImage> = Vec::with_capacity(volumes.len());
            for volume in &volumes {
                let origin_map = volume.origin.and_then(|(origin_volume, origin_snapshot)| {
                    let origin = volumes
                        .iter()
                        .find(|candidate| candidate.volume_id == origin_volume)?;
                    origin
                        .snapshots
                        .iter()
                        .find(|snapshot| snapshot.snapshot_id == origin_snapshot)
                        .map(|snapshot| &snapshot.map)
                });
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
            let volume_policies = volumes
                .iter()
                .filter(|volume| volume.policy != TierPolicy::default())
                .map(|volume| VolumePolicyImage {
                    volume_id: volume.volume_id,
                    policy: volume.policy.into(),
                })
                .collect();
            let volumes = images;
            Body {
                checkpoint_sequence,
                covered_batch_sequence: covered,
                next_segment_sequence,
                next_volume_id,
                next_snapshot_id,
                heads,
                chunks: table.chunks,
                volumes,
                segment_last_batch_sequences: segment_last,
                volume_policies,
                counters,
                placement,
            }
            .encode()
        })
        .await
        .expect("checkpoint encoding task");
        let result = self
            .write_checkpoint(checkpoint_sequence, slot_index, covered, &encoded)
            .await;
        // A body that found the device full was abandoned before any slot
        // named it: the pool goes on with its previous checkpoints.
        if let Err(error) = &result
            && !matches!(error, EngineError::DeviceFull { .. })
        {
            self.inner
                .lock()
                .writer_mut()
                .fail(format!("checkpoint failed: {error}"));
        }
        result
    }

    async fn write_checkpoint(
        &self,
        checkpoint_sequence: u64,
        slot_index: usize,
        covered: u64,
        encoded: &[u8],
    ) -> Result<(), EngineError> {
        let geometry = self.inner.geometry;
        let segment_bytes = geometry.segment_size_bytes() as usize;
        let needed = encoded.len().div_ceil(segment_bytes);
        let body_segments: Vec<u32> = self
            .inner
            .lock()
            .space_mut()
            .take_checkpoint_body_segments(needed, checkpoint_sequence)
            .ok_or(EngineError::NoSpace)?;
        let device = &self.inner.device;
        for (piece, segment_index) in encoded.chunks(segment_bytes).zip(&body_segments) {
            let offset = geometry.segment_first_block(*segment_index) * BLOCK_SIZE_BYTES;
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
                    .return_checkpoint_body_segments(&body_segments);
                tracing::warn!(%error, "checkpoint skipped: the device under the pool is out of space");
                return Err(EngineError::DeviceFull {
                    device: device.name().to_string(),
                    waited_ms: 0,
                });
            }
        }
        device.flush().await?;
        let slot = Slot {
            checkpoint_sequence,
            covered_batch_sequence: covered,
            body_bytes: encoded.len() as u64,
            body_checksum: crc32c::crc32c(encoded),
            body_segments: body_segments.clone(),
        };
        let slot_offset = CHECKPOINT_SLOT_BLOCKS[slot_index] * BLOCK_SIZE_BYTES;
        device
            .write(slot_offset, super::inner::aligned(&slot.encode()))
            .await?;
        device.flush().await?;
        let mut state = self.inner.lock();
        // Device bytes, as written: each body piece padded to whole blocks, and the slot.
        let body_bytes =
            encoded.len().div_ceil(BLOCK_SIZE_BYTES as usize) as u64 * BLOCK_SIZE_BYTES;
        state
            .counters_mut()
            .checkpoint_written(body_bytes + BLOCK_SIZE_BYTES);
        state.checkpoint_became_durable(DurableCheckpoint {
            slot_index,
            checkpoint_sequence,
            covered_batch_sequence: covered,
            body_segments,
        });
        tracing::debug!(
            checkpoint_sequence,
            covered,
            bytes = encoded.len(),
            "checkpoint durable"
        );
        Ok(())
    }
}
