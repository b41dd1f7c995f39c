//! Writing a checkpoint: persist every volume and its map so that recovery needs
//! to replay only the batches appended since. The maps are copied under the state
//! lock (cheap: chunks are shared), the log is flushed up to the point the copy
//! covers, the body is written into free segments, and only then is the slot
//! written, into the slot not holding the newest durable checkpoint, so that a
//! torn slot write always leaves the previous checkpoint intact.

use std::sync::Arc;

use lamina_device::AlignedBuffer;

use super::Pool;
use super::state::{Allocation, DurableCheckpoint, SegmentState};
use crate::BLOCK_SIZE_BYTES;
use crate::error::EngineError;
use crate::log::checkpoint::{Body, ChunkImage, HeadImage, Slot, VolumeImage};
use crate::log::geometry::CHECKPOINT_SLOT_BLOCKS;

impl Pool {
    /// Writes a checkpoint now. Safe to call at any time; concurrent calls queue.
    pub async fn checkpoint(&self) -> Result<(), EngineError> {
        let _guard = self.inner.checkpoint_lock.lock().await;
        let (
            checkpoint_sequence,
            slot_index,
            covered,
            next_segment_sequence,
            next_volume_id,
            heads,
            volumes,
            segment_last,
        ) = {
            let mut state = self.inner.lock();
            state.check_failed()?;
            let sealed = state.seal_open_batch();
            self.spawn_writes(sealed.into_iter().collect());
            let checkpoint_sequence = state.next_checkpoint_sequence;
            state.next_checkpoint_sequence += 1;
            let slot_index = state
                .durable_checkpoints
                .last()
                .map_or(0, |latest| 1 - latest.slot_index);
            state.bytes_at_last_checkpoint = state.sealed_bytes_total;
            let volumes: Vec<_> = state
                .volumes
                .iter()
                .map(|volume| {
                    (
                        volume.volume_id,
                        volume.name.clone(),
                        volume.size_bytes,
                        volume.created_unix_seconds,
                        volume.map.clone(),
                    )
                })
                .collect();
            (
                checkpoint_sequence,
                slot_index,
                state.sealed_through,
                state.next_segment_sequence,
                state.volumes.next_volume_id,
                state
                    .heads
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
                    .segments
                    .iter()
                    .map(|segment| segment.last_batch_sequence)
                    .collect::<Vec<_>>(),
            )
        };
        self.flush_through(covered).await?;
        let encoded = tokio::task::spawn_blocking(move || {
            Body {
                checkpoint_sequence,
                covered_batch_sequence: covered,
                next_segment_sequence,
                next_volume_id,
                heads,
                volumes: volumes
                    .into_iter()
                    .map(
                        |(volume_id, name, size_bytes, created_unix_seconds, map)| VolumeImage {
                            volume_id,
                            name,
                            size_bytes,
                            created_unix_seconds,
                            chunks: map
                                .chunks()
                                .map(|(chunk_index, chunk)| ChunkImage {
                                    chunk_index,
                                    physical_blocks: chunk.physical_blocks.to_vec(),
                                    checksums: chunk.checksums.to_vec(),
                                })
                                .collect(),
                        },
                    )
                    .collect(),
                segment_last_batch_sequences: segment_last,
            }
            .encode()
        })
        .await
        .expect("checkpoint encoding task");
        let result = self
            .write_checkpoint(checkpoint_sequence, slot_index, covered, &encoded)
            .await;
        if let Err(error) = &result {
            self.inner
                .lock()
                .failed
                .get_or_insert(format!("checkpoint failed: {error}"));
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
        let body_segments: Vec<u32> = {
            let mut state = self.inner.lock();
            let mut taken = Vec::with_capacity(needed);
            for _ in 0..needed {
                match state.take_free_segment(Allocation::Checkpoint) {
                    Some(index) => taken.push(index),
                    None => {
                        for index in taken {
                            state.free_segments.push_front(index);
                        }
                        return Err(EngineError::NoSpace);
                    }
                }
            }
            for index in &taken {
                state.segments[*index as usize].state = SegmentState::Checkpoint {
                    checkpoint_sequence,
                };
            }
            taken
        };
        let device = &self.inner.device;
        for (piece, segment_index) in encoded.chunks(segment_bytes).zip(&body_segments) {
            let offset = geometry.segment_first_block(*segment_index) * BLOCK_SIZE_BYTES;
            device
                .write(offset, Arc::new(AlignedBuffer::from_slice_padded(piece)))
                .await?;
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
            .write(slot_offset, super::aligned(&slot.encode()))
            .await?;
        device.flush().await?;
        let mut state = self.inner.lock();
        // Device bytes, as written: each body piece padded to whole blocks, and the slot.
        state.checkpoint_bytes_written += encoded.len().div_ceil(BLOCK_SIZE_BYTES as usize) as u64
            * BLOCK_SIZE_BYTES
            + BLOCK_SIZE_BYTES;
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
