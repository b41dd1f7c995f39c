//! Loading the checkpoint recovery starts from: both slots are read, the
//! newest whose whole chain of bodies verifies is kept (falling back to the
//! other slot), and the older one is kept too when it still verifies and
//! shares no segment with the newest, so that fallback stays possible. A body
//! that fails its checksum on a device with redundancy is rebuilt block by
//! block ([`repair_body`]).

use std::collections::HashSet;

use lamina_device::BlockDevice;

use super::superblock::read_metadata;
use crate::convert::to_usize;
use crate::error::EngineError;
use crate::log::checkpoint::{AnyBody, Body, Slot, SlotLink};
use crate::log::geometry::{CHECKPOINT_SLOT_BLOCKS, CHECKPOINT_SLOT_SIZE_BLOCKS, Geometry};
use crate::pool::core::state::State;
use crate::pool::space::DurableCheckpoint;
use crate::pool::space::segment_shapes::{BodyPiece, SegmentShapes};
use crate::volume::VolumeTable;
use crate::{BLOCK_BYTES, BLOCK_SIZE_BYTES};

/// A checkpoint slot that verified, with its index.
#[derive(Clone)]
pub(super) struct FoundSlot {
    pub(super) slot_index: usize,
    pub(super) slot: Slot,
}

/// The checkpoint recovery starts from: its slot, body and volumes.
pub(super) struct NewestCheckpoint {
    pub(super) slot_index: usize,
    pub(super) slot: Slot,
    pub(super) body: Body,
    pub(super) volumes: VolumeTable,
}

/// The checkpoints recovery keeps.
pub(super) struct KeptCheckpoints {
    pub(super) newest: NewestCheckpoint,
    /// The older checkpoint, if its body verifies too (fallback stays possible).
    pub(super) older: Option<FoundSlot>,
    /// Whether both slots hold a checkpoint that verifies.
    pub(super) both_slots_valid: bool,
    pub(super) next_checkpoint_sequence: u64,
}

impl KeptCheckpoints {
    /// Segments holding a body of a kept checkpoint's chain.
    pub(super) fn held_segments(&self) -> HashSet<u32> {
        let slots =
            std::iter::once(&self.newest.slot).chain(self.older.iter().map(|older| &older.slot));
        slots
            .flat_map(Slot::chain)
            .flat_map(|link| link.body_segments)
            .collect()
    }

    /// The batch both kept checkpoints cover.
    pub(super) fn fallback_covered(&self) -> u64 {
        let covered = self.newest.slot.covered_batch_sequence;
        self.older.as_ref().map_or(covered, |older| {
            older.slot.covered_batch_sequence.min(covered)
        })
    }

    /// The kept checkpoints as the space allocator holds them, oldest first.
    /// The older one's `next_segment_sequence` is not known (its body is
    /// not read on its own): `older_floor`, at most that.
    pub(super) fn durable_checkpoints(&self, older_floor: u64) -> Vec<DurableCheckpoint> {
        let older = self
            .older
            .iter()
            .map(|older| DurableCheckpoint::of_slot(older.slot_index, &older.slot, older_floor));
        let newest = DurableCheckpoint::of_slot(
            self.newest.slot_index,
            &self.newest.slot,
            self.newest.body.next_segment_sequence,
        );
        older.chain(std::iter::once(newest)).collect()
    }
}

/// Reads both checkpoint slots and keeps those that verify, newest first.
pub(super) async fn read_slots(
    device: &dyn BlockDevice,
    geometry: &Geometry,
    name: &str,
) -> Result<Vec<FoundSlot>, EngineError> {
    let mut slots = Vec::new();
    for (slot_index, slot_block) in CHECKPOINT_SLOT_BLOCKS.iter().enumerate() {
        let decodes = |bytes: &[u8]| Slot::decode(bytes).is_ok();
        let bytes = read_metadata(
            device,
            slot_block * BLOCK_SIZE_BYTES,
            to_usize(CHECKPOINT_SLOT_SIZE_BLOCKS * BLOCK_SIZE_BYTES),
            &decodes,
        )
        .await?;
        match Slot::decode(&bytes) {
            Ok(slot) if slot_segments_valid(&slot, geometry) => {
                slots.push(FoundSlot { slot_index, slot });
            }
            Ok(_) => {
                tracing::warn!(device = %name, slot_index, "checkpoint slot names segments beyond the device")
            }
            Err(error) => {
                tracing::warn!(device = %name, slot_index, %error, "checkpoint slot is not valid")
            }
        }
    }
    slots.sort_by_key(|found| std::cmp::Reverse(found.slot.checkpoint_sequence));
    Ok(slots)
}

/// The newest checkpoint whose body verifies (falling back to the other
/// slot), and the older one if its body verifies too.
pub(super) async fn load_checkpoints(
    device: &dyn BlockDevice,
    shapes: &SegmentShapes,
    name: &str,
) -> Result<KeptCheckpoints, EngineError> {
    let slots = read_slots(device, shapes.geometry(), name).await?;
    let mut newest = None;
    let mut failures = Vec::new();
    for found in &slots {
        match read_chain(device, shapes, &found.slot).await {
            Ok((body, volumes)) => {
                newest = Some(NewestCheckpoint {
                    slot_index: found.slot_index,
                    slot: found.slot.clone(),
                    body,
                    volumes,
                });
                break;
            }
            Err(error) => {
                tracing::error!(
                    device = %name, slot_index = found.slot_index,
                    checkpoint = found.slot.checkpoint_sequence, %error,
                    "checkpoint body is corrupt; falling back to the previous checkpoint"
                );
                failures.push(format!(
                    "checkpoint {}: {error}",
                    found.slot.checkpoint_sequence
                ));
            }
        }
    }
    let Some(newest) = newest else {
        // Falling back further than the older slot would need the log since
        // an older checkpoint, which may have been reused: refused rather
        // than recovered to older data.
        return Err(EngineError::corrupt(
            name,
            "checkpoint",
            CHECKPOINT_SLOT_BLOCKS[0] * BLOCK_SIZE_BYTES,
            format!(
                "neither checkpoint slot holds a valid checkpoint ({}); the log before them may have been reused, so no older state can be recovered",
                if failures.is_empty() {
                    "no slot verifies".to_string()
                } else {
                    failures.join("; ")
                }
            ),
        ));
    };
    let older = usable_older_checkpoint(device, shapes, name, &slots, &newest).await;
    let next_checkpoint_sequence = slots
        .iter()
        .map(|found| found.slot.checkpoint_sequence)
        .max()
        .unwrap_or(0)
        + 1;
    Ok(KeptCheckpoints {
        both_slots_valid: slots.len() == 2 && older.is_some(),
        newest,
        older,
        next_checkpoint_sequence,
    })
}

/// The checkpoint older than `newest`, if it counts: its segments are kept
/// and fallback to it stays possible only if its body verifies too (a slot
/// can be intact while its body segments were reused, or name segments that
/// hold data) and it shares no segment with `newest`.
pub(super) async fn usable_older_checkpoint(
    device: &dyn BlockDevice,
    shapes: &SegmentShapes,
    name: &str,
    slots: &[FoundSlot],
    newest: &NewestCheckpoint,
) -> Option<FoundSlot> {
    let older = slots
        .iter()
        .find(|found| found.slot.checkpoint_sequence < newest.slot.checkpoint_sequence)?;
    let newest_chain = newest.slot.chain();
    // Usually the older slot's chain is a prefix of the newest's, already
    // verified; otherwise it is read and checked whole.
    let verified = older
        .slot
        .chain()
        .iter()
        .all(|link| newest_chain.contains(link));
    let checked = if verified {
        Ok(())
    } else {
        read_chain(device, shapes, &older.slot).await.map(|_| ())
    };
    if let Err(error) = checked {
        tracing::warn!(
            device = %name, slot_index = older.slot_index,
            checkpoint = older.slot.checkpoint_sequence, %error,
            "the older checkpoint is not usable; it will be replaced"
        );
        return None;
    }
    // Links both chains hold share their segments; no other segment may be
    // claimed by both.
    let newest_segments: std::collections::HashMap<u32, u64> = newest_chain
        .iter()
        .flat_map(|link| {
            link.body_segments
                .iter()
                .map(|segment| (*segment, link.checkpoint_sequence))
        })
        .collect();
    let shared = older.slot.chain().iter().any(|link| {
        !newest_chain.contains(link)
            && link
                .body_segments
                .iter()
                .any(|segment| newest_segments.contains_key(segment))
    });
    if shared {
        tracing::warn!(device = %name, "both checkpoints claim the same segments; keeping only the newer");
        return None;
    }
    Some(older.clone())
}

/// Loads what the checkpoint holds into an empty state: volumes, write
/// counters, placement hints and each segment's newest batch.
pub(super) fn restore_from_checkpoint(state: &mut State, newest: &mut NewestCheckpoint) {
    let volumes = std::mem::replace(&mut newest.volumes, VolumeTable::new());
    state.restore_checkpoint(volumes, &newest.body);
}

pub(super) fn slot_segments_valid(slot: &Slot, geometry: &Geometry) -> bool {
    slot.chain().iter().all(|link| {
        link.body_segments
            .iter()
            .all(|segment| u64::from(*segment) < geometry.segment_count)
    })
}

/// Reads every body of the slot's chain, checks each against its link and
/// the link before it, applies the increments to the base's image and
/// rebuilds the volumes from the result.
pub(super) async fn read_chain(
    device: &dyn BlockDevice,
    shapes: &SegmentShapes,
    slot: &Slot,
) -> Result<(Body, VolumeTable), String> {
    let mut image: Option<Body> = None;
    for link in slot.chain() {
        let failed = |error: String| {
            format!(
                "checkpoint {} of the chain: {error}",
                link.checkpoint_sequence
            )
        };
        let bytes = read_link(device, shapes, &link).await.map_err(failed)?;
        let body = AnyBody::decode(&bytes).map_err(|error| failed(error.to_string()))?;
        if body.checkpoint_sequence() != link.checkpoint_sequence
            || body.covered_batch_sequence() != link.covered_batch_sequence
        {
            return Err(failed("body belongs to another checkpoint".to_string()));
        }
        match (&mut image, body) {
            (None, AnyBody::Base(base)) => image = Some(base),
            (Some(image), AnyBody::Increment(increment)) => {
                image.apply(increment).map_err(failed)?
            }
            (None, AnyBody::Increment(_)) => {
                return Err(failed("the chain starts with an increment".to_string()));
            }
            (Some(_), AnyBody::Base(_)) => {
                return Err(failed("a base in the middle of a chain".to_string()));
            }
        }
    }
    let body = image.expect("a chain has at least its own link");
    let volumes = VolumeTable::from_checkpoint(&body, shapes.geometry())
        .map_err(|error| error.to_string())?;
    Ok((body, volumes))
}

/// One body of a chain, read and checked against its link's checksum.
pub(super) async fn read_link(
    device: &dyn BlockDevice,
    shapes: &SegmentShapes,
    link: &SlotLink,
) -> Result<Vec<u8>, String> {
    let geometry = shapes.geometry();
    let pieces = shapes
        .body_pieces(&link.body_segments, link.body_bytes)
        .ok_or_else(|| "link names an impossible set of segments".to_string())?;
    // The slot is read from the device: a length past the address space is
    // corrupt, not a reason to panic.
    let body_bytes = usize::try_from(link.body_bytes)
        .map_err(|_| format!("body of {} bytes does not fit in memory", link.body_bytes))?;
    let mut bytes = Vec::with_capacity(body_bytes);
    for piece in &pieces {
        let data = device
            .read(
                geometry.segment_first_block(piece.segment_index) * BLOCK_SIZE_BYTES,
                to_usize(piece.length_bytes.next_multiple_of(BLOCK_SIZE_BYTES)),
            )
            .await
            .map_err(|error| error.to_string())?;
        bytes.extend_from_slice(&data[..to_usize(piece.length_bytes)]);
    }
    if crc32c::crc32c(&bytes) != link.body_checksum
        && !repair_body(device, geometry, &pieces, &mut bytes, link.body_checksum).await
    {
        return Err("body checksum does not match the link".to_string());
    }
    Ok(bytes)
}

/// Where one block of a body lies: its range in the body and its device offset.
pub(super) struct BodyBlock {
    body_start: usize,
    body_end: usize,
    device_offset: u64,
}

/// A body that fails its checksum, on a device with redundancy (an array):
/// each block in turn is rebuilt from the redundancy, and the first
/// candidate that makes the whole body match its checksum replaces it (the
/// device rewrites the damaged copy). A base is needed by both slots' chains,
/// so unlike a body of the old format it has no other slot to fall back on
/// when a member flips a bit in it. Without redundancy, or with more than
/// one damaged block, it fails.
pub(super) async fn repair_body(
    device: &dyn BlockDevice,
    geometry: &Geometry,
    pieces: &[BodyPiece],
    bytes: &mut [u8],
    expected_checksum: u32,
) -> bool {
    let block_bytes = BLOCK_BYTES;
    let blocks: Vec<BodyBlock> = pieces
        .iter()
        .flat_map(|piece| {
            let start = to_usize(piece.body_offset);
            let end = start + to_usize(piece.length_bytes);
            let first = geometry.segment_first_block(piece.segment_index) * BLOCK_SIZE_BYTES;
            (start..end)
                .step_by(block_bytes)
                .map(move |body_start| BodyBlock {
                    body_start,
                    body_end: (body_start + block_bytes).min(end),
                    device_offset: first + (body_start - start) as u64,
                })
        })
        .collect();
    // The checksum of everything after each block, so that a candidate is
    // checked in O(block) rather than O(body).
    let mut suffixes = vec![0u32; blocks.len()];
    let mut suffix = 0u32;
    for (index, block) in blocks.iter().enumerate().rev() {
        suffixes[index] = suffix;
        let length = bytes.len() - block.body_end;
        suffix = crc32c::crc32c_combine(
            crc32c::crc32c(&bytes[block.body_start..block.body_end]),
            suffix,
            length,
        );
    }
    let mut prefix = 0u32;
    for (index, block) in blocks.iter().enumerate() {
        let length = block.body_end - block.body_start;
        let suffix = suffixes[index];
        let suffix_length = bytes.len() - block.body_end;
        let check = move |candidate: &[u8]| {
            let with_block = crc32c::crc32c_append(prefix, &candidate[..length]);
            crc32c::crc32c_combine(with_block, suffix, suffix_length) == expected_checksum
        };
        if let Ok(Some(candidate)) = device.recover_block(block.device_offset, &check).await {
            bytes[block.body_start..block.body_end].copy_from_slice(&candidate[..length]);
            tracing::warn!(
                device = device.name(),
                offset = block.device_offset,
                "checkpoint body block rebuilt from the device's redundancy"
            );
            return true;
        }
        prefix = crc32c::crc32c_append(prefix, &bytes[block.body_start..block.body_end]);
    }
    false
}
