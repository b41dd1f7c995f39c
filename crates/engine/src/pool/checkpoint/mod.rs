//! Writing a checkpoint: persist every volume and its map so that recovery needs
//! to replay only the batches appended since. The maps are copied under the state
//! lock (cheap: chunks are shared), the log is flushed up to the point the copy
//! covers, the body is written into free segments, and only then is the slot
//! written, into the slot not holding the newest durable checkpoint, so that a
//! torn slot write always leaves the previous checkpoint intact.
//!
//! The checkpointer is a service ([`Checkpointer`]): built with an `Arc` of
//! the core, whose checkpoint lock holds the chain the next checkpoint may
//! extend (one checkpoint at a time). Building one is a clone of the `Arc`:
//! the flush-and-checkpoint loop, the paced cleaner and the demoter build
//! one on the core at each step that checkpoints (between steps they hold
//! the pool only weakly, so that their tasks never keep a dropped pool
//! alive), as do scrub, the cleaner, evacuation, opening and the front
//! (`Pool::checkpoint`). It flushes through the core's own operations
//! (`tiering/flush.rs`).

pub(super) mod image;
pub(super) mod increment;

use std::collections::HashSet;
use std::sync::Arc;

use lamina_device::{AlignedBuffer, DeviceError};

use super::space::{DurableCheckpoint, SegmentState};
use crate::convert::to_usize;
use crate::error::{EngineError, IoError};
use crate::log::checkpoint::{HeadImage, Slot, SlotLink};
use crate::log::geometry::{
    CAPACITY_SLOT_COPY_BLOCKS, CAPACITY_SLOT_COPY_SIZE_BLOCKS, CHECKPOINT_SLOT_BLOCKS,
};
use crate::pool::checkpoint::image::{CheckpointSnapshot, CheckpointTarget, copy_volumes};
use crate::pool::checkpoint::increment::{CheckpointChain, EncodedCheckpoint, encode_checkpoint};
use crate::pool::core::Core;
use crate::{BLOCK_BYTES, BLOCK_SIZE_BYTES};

/// Whether a checkpoint may be an increment on the chain.
#[derive(Clone, Copy)]
enum CheckpointKind {
    Any,
    Base,
}

/// Writes the pool's checkpoints: holds the core whose maps it copies, whose
/// log it flushes up to the copy and whose free segments take the body.
#[derive(Clone)]
pub(in crate::pool) struct Checkpointer {
    core: Arc<Core>,
}

impl Checkpointer {
    pub(in crate::pool) fn new(core: &Arc<Core>) -> Self {
        Self { core: core.clone() }
    }

    /// Writes a checkpoint now. Safe to call at any time; concurrent calls queue.
    pub(in crate::pool) async fn checkpoint(&self) -> Result<(), EngineError> {
        self.checkpoint_as(CheckpointKind::Any).await
    }

    /// Writes a base checkpoint now, whatever the chain: two in a row free
    /// every older body (the evacuation moves checkpoint bodies off
    /// degraded or narrow segments so).
    pub(in crate::pool) async fn checkpoint_base(&self) -> Result<(), EngineError> {
        self.checkpoint_as(CheckpointKind::Base).await
    }

    async fn checkpoint_as(&self, kind: CheckpointKind) -> Result<(), EngineError> {
        let mut chain_guard = self.core.checkpoint_lock().lock().await;
        // The batches it would cover include uploads the capacity tier cannot
        // make durable now (decision 0032): refused at once, the pool goes on.
        if let Some(suspension) = self.core.lock().capacity_writes().status().suspended {
            return Err(self.core.capacity_unavailable(suspension.last_error));
        }
        // Taken out: a checkpoint that does not become durable leaves the
        // chain empty, so that the next one is a base.
        let chain = match kind {
            CheckpointKind::Any => std::mem::take(&mut *chain_guard),
            CheckpointKind::Base => CheckpointChain::default(),
        };
        let snapshot = self.take_checkpoint_snapshot()?;
        let target = snapshot.target;
        self.core
            .flush_all_through(target.covered_batch_sequence)
            .await?;
        let whatever_their_bytes = self
            .core
            .limits()
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
            && !matches!(
                error,
                EngineError::Io(IoError::DeviceFull { .. } | IoError::CapacityUnavailable { .. })
            )
        {
            self.core
                .lock()
                .fail_writes(format!("checkpoint failed: {error}"));
        }
        result
    }

    /// Seals the open batches (handing them to the device) and copies what
    /// the checkpoint needs, all in one hold of the state lock, so that the
    /// copy covers exactly the batches sealed so far.
    fn take_checkpoint_snapshot(&self) -> Result<CheckpointSnapshot, EngineError> {
        let mut state = self.core.lock();
        state.check_failed()?;
        let sealed = state.seal_open_batch();
        self.core.spawn_writes(sealed);
        let checkpoint_sequence = state.take_checkpoint_sequence();
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
                next_segment_sequence: state.writer().next_segment_sequence(),
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
        state.checkpoint_copied();
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
        let slot = Slot {
            checkpoint_sequence: target.checkpoint_sequence,
            covered_batch_sequence: target.covered_batch_sequence,
            body_bytes: encoded.len() as u64,
            body_checksum: crc32c::crc32c(encoded),
            body_segments: body_segments.clone(),
            earlier_links: checkpoint.earlier_links.clone(),
        };
        // Before the flush that makes the body durable: the copy never names
        // a body that is not (on an object tier both land in one commit).
        self.write_slot_copy(target, &slot, &body_segments).await?;
        self.flush_body(&body_segments).await?;
        self.write_slot(target, &slot).await?;
        // The slot lives on flash.
        self.core.flush_flash().await?;
        let mut state = self.core.lock();
        // Device bytes, as written: each body piece padded to whole blocks, and the slot.
        let body_bytes = encoded.len().div_ceil(BLOCK_BYTES) as u64 * BLOCK_SIZE_BYTES;
        let durable =
            DurableCheckpoint::of_slot(target.slot_index, &slot, target.next_segment_sequence);
        state.checkpoint_written(durable, body_bytes + BLOCK_SIZE_BYTES);
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
        let shapes = self.core.shapes();
        let mut state = self.core.lock();
        let body_segments = state
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
        let geometry = self.core.geometry();
        let device = self.core.device();
        let pieces = self
            .core
            .shapes()
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
                return Err(self.body_write_failed(error, body_segments));
            }
        }
        Ok(())
    }

    /// The error a failed write of a body (or of its slot's copy) ends the
    /// checkpoint with. When the device under the pool is out of space, the
    /// body's segments are given back (no slot names them yet) and the
    /// checkpoint is skipped with `DeviceFull`: the pool goes on.
    fn body_write_failed(&self, error: DeviceError, body_segments: &[u32]) -> EngineError {
        if !error.is_out_of_space() {
            return error.into();
        }
        self.core
            .lock()
            .return_checkpoint_body_segments(body_segments);
        tracing::warn!(%error, "checkpoint skipped: the device under the pool is out of space");
        EngineError::Io(IoError::DeviceFull {
            device: self.core.device().name().to_string(),
            waited_ms: 0,
        })
    }

    /// Makes the body durable on whichever tier holds it. A capacity tier
    /// that cannot gives the body's segments back (no slot names them) and
    /// skips the checkpoint with `CapacityUnavailable`; the pool goes on.
    async fn flush_body(&self, body_segments: &[u32]) -> Result<(), EngineError> {
        self.core.flush_flash().await?;
        if !self.core.geometry().has_capacity_tier() {
            return Ok(());
        }
        if let Err(error) = self.core.flush_capacity(false).await {
            self.core
                .lock()
                .return_checkpoint_body_segments(body_segments);
            tracing::warn!(%error, "checkpoint skipped: its body could not be made durable");
            return Err(error);
        }
        Ok(())
    }

    /// In a two-tier pool, writes the slot's copy into the capacity label
    /// area of the slot it goes to (format version 9), from which a lost
    /// flash device is restored (`flash_restore`). A slot too long for the
    /// area leaves a zero block there instead, so that no stale copy names
    /// bodies that are freed. A failed write ends the checkpoint as a failed
    /// body write does.
    async fn write_slot_copy(
        &self,
        target: CheckpointTarget,
        slot: &Slot,
        body_segments: &[u32],
    ) -> Result<(), EngineError> {
        let geometry = self.core.geometry();
        if !geometry.has_capacity_tier() {
            return Ok(());
        }
        let mut encoded_slot = slot.encode();
        if encoded_slot.len() as u64 > CAPACITY_SLOT_COPY_SIZE_BLOCKS * BLOCK_SIZE_BYTES {
            tracing::warn!(
                checkpoint_sequence = target.checkpoint_sequence,
                slot_bytes = encoded_slot.len(),
                "the checkpoint's slot is too long to copy onto the capacity tier: \
                 restoring a lost flash device will use an earlier checkpoint or none"
            );
            encoded_slot = vec![0; BLOCK_BYTES];
        }
        let copy_block =
            geometry.capacity_start_block + CAPACITY_SLOT_COPY_BLOCKS[target.slot_index];
        let written = self
            .core
            .device()
            .write(
                copy_block * BLOCK_SIZE_BYTES,
                crate::pool::core::aligned(&encoded_slot),
            )
            .await;
        written.map_err(|error| self.body_write_failed(error, body_segments))?;
        Ok(())
    }

    /// Writes the slot naming the body, into the slot not holding the newest
    /// durable checkpoint.
    async fn write_slot(&self, target: CheckpointTarget, slot: &Slot) -> Result<(), EngineError> {
        // The slot names exactly the segments the body was written into,
        // all still this checkpoint's.
        assert!(
            self.core
                .shapes()
                .body_pieces(&slot.body_segments, slot.body_bytes)
                .is_some()
        );
        {
            let state = self.core.lock();
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
        self.core
            .device()
            .write(slot_offset, crate::pool::core::aligned(&encoded_slot))
            .await?;
        Ok(())
    }
}
