//! Incremental checkpoints (format version 7, decision 0026): which kind the
//! next checkpoint is, and the increment's body. The chain the next
//! checkpoint may extend is held by the checkpoint lock itself, so that only
//! a checkpoint that became durable extends it: any checkpoint that fails
//! leaves it empty, and the next one is a base (the failed one had already
//! reset the maps' change sets).

use crate::log::checkpoint::{
    CHECKPOINT_INCREMENTS_MAX, CHECKPOINT_INCREMENTS_PERCENT_OF_BASE_MAX, ChunkPatch, Increment,
    MapDelta, MapSource, SlotLink, SnapshotDelta, VolumeDelta,
};
use crate::pool::checkpoint::image::{
    CheckpointSnapshot, VolumeCopy, encode_body, volume_compressions, volume_policies,
};
use crate::volume::map::BlockMap;

/// The newest durable checkpoint's chain, which the next checkpoint extends
/// when it is an increment. Empty after open and create, and after a
/// checkpoint that failed: the next checkpoint is then a base.
#[derive(Debug, Default)]
pub(in crate::pool) struct CheckpointChain {
    /// Base first, the newest durable checkpoint last.
    links: Vec<SlotLink>,
}

impl CheckpointChain {
    /// The chain after `newest` became durable, as a base (`earlier_links`
    /// empty) or after the links it extends.
    pub(in crate::pool) fn after(earlier_links: Vec<SlotLink>, newest: SlotLink) -> Self {
        let mut links = earlier_links;
        links.push(newest);
        Self { links }
    }

    fn base_bytes(&self) -> u64 {
        self.links.first().map_or(0, |base| base.body_bytes)
    }

    fn increments_bytes(&self) -> u64 {
        self.links.iter().skip(1).map(|link| link.body_bytes).sum()
    }
}

/// An encoded checkpoint body and the chain before it (empty for a base).
pub(in crate::pool) struct EncodedCheckpoint {
    pub(in crate::pool) bytes: Vec<u8>,
    pub(in crate::pool) earlier_links: Vec<SlotLink>,
}

/// Encodes the next checkpoint: an increment on `chain` when the chain has
/// room for it (`CHECKPOINT_INCREMENTS_MAX` increments, and their bytes
/// within `CHECKPOINT_INCREMENTS_PERCENT_OF_BASE_MAX` percent of the base's),
/// a new base otherwise. Runs outside the state lock.
/// `whatever_their_bytes` drops the bytes rule (a test hook,
/// `TestHooks::checkpoint_increments_whatever_their_bytes`).
pub(in crate::pool) fn encode_checkpoint(
    snapshot: CheckpointSnapshot,
    chain: CheckpointChain,
    whatever_their_bytes: bool,
) -> EncodedCheckpoint {
    let increment_count = chain.links.len().saturating_sub(1);
    if let Some(previous) = chain.links.last()
        && increment_count < CHECKPOINT_INCREMENTS_MAX
    {
        let increment = increment_of(&snapshot, previous.checkpoint_sequence);
        let bytes = increment.encode();
        let allowed = chain.base_bytes() * CHECKPOINT_INCREMENTS_PERCENT_OF_BASE_MAX / 100;
        if whatever_their_bytes || chain.increments_bytes() + bytes.len() as u64 <= allowed {
            debug_assert!(
                Increment::decode(&bytes).is_ok_and(|decoded| decoded == increment),
                "checkpoint {} increment does not decode to what was encoded",
                increment.checkpoint_sequence
            );
            return EncodedCheckpoint {
                bytes,
                earlier_links: chain.links,
            };
        }
    }
    EncodedCheckpoint {
        bytes: encode_body(snapshot),
        earlier_links: Vec::new(),
    }
}

/// The increment the snapshot describes after checkpoint `previous_sequence`:
/// each map's source and changed entries.
fn increment_of(snapshot: &CheckpointSnapshot, previous_sequence: u64) -> Increment {
    Increment {
        checkpoint_sequence: snapshot.target.checkpoint_sequence,
        covered_batch_sequence: snapshot.target.covered_batch_sequence,
        previous_checkpoint_sequence: previous_sequence,
        next_segment_sequence: snapshot.next_segment_sequence,
        next_volume_id: snapshot.next_volume_id,
        next_snapshot_id: snapshot.next_snapshot_id,
        heads: snapshot.heads.clone(),
        volumes: snapshot.volumes.iter().map(volume_delta).collect(),
        segment_last_batch_sequences: snapshot.segment_last_batch_sequences.clone(),
        volume_policies: volume_policies(&snapshot.volumes),
        counters: snapshot.counters,
        placement: snapshot.placement.clone(),
        volume_compressions: volume_compressions(&snapshot.volumes),
    }
}

/// A volume's record whole and its maps as changes.
fn volume_delta(volume: &VolumeCopy) -> VolumeDelta {
    VolumeDelta {
        volume_id: volume.volume_id,
        name: volume.name.clone(),
        size_bytes: volume.size_bytes,
        created_unix_seconds: volume.created_unix_seconds,
        origin: volume.origin,
        map: map_delta(&volume.map),
        snapshots: volume
            .snapshots
            .iter()
            .map(|snapshot| SnapshotDelta {
                snapshot_id: snapshot.snapshot_id,
                name: snapshot.name.clone(),
                size_bytes: snapshot.size_bytes,
                created_unix_seconds: snapshot.created_unix_seconds,
                map: map_delta(&snapshot.map),
            })
            .collect(),
    }
}

/// A map as its source in the previous checkpoint and, per changed chunk,
/// the changed entries' values now.
fn map_delta(map: &BlockMap) -> MapDelta {
    let changes = map.changes();
    // A map with no source must hold nothing but its changes, or the
    // increment would lose the rest (a map restored by recovery has no
    // source: the first checkpoint after open is a base for that reason).
    if changes.source.is_none() {
        for (chunk_index, _) in map.shared_chunks() {
            assert!(
                changes.changed_chunks.contains_key(&chunk_index),
                "a map without a source in the previous checkpoint holds unchanged chunk {chunk_index}"
            );
        }
    }
    let patches = changes
        .changed_chunks
        .iter()
        .map(|(chunk_index, changed)| {
            let chunk = map.shared_chunk(*chunk_index);
            let mut patch = ChunkPatch {
                chunk_index: *chunk_index,
                ..ChunkPatch::default()
            };
            for entry in changed.entries() {
                let (physical_block, checksum) = chunk.map_or((0, 0), |chunk| {
                    (chunk.raw_location(entry), chunk.checksum(entry))
                });
                patch.entries.push(
                    u16::try_from(entry).expect("entry indexes are below CHUNK_ENTRY_COUNT (512)"),
                );
                patch.physical_blocks.push(physical_block);
                // An unmapped entry's checksum means nothing: written as zero.
                patch
                    .checksums
                    .push(if physical_block == 0 { 0 } else { checksum });
            }
            patch
        })
        .collect();
    MapDelta {
        source: changes.source.map(|name| MapSource {
            volume_id: name.volume_id,
            snapshot_id: name.snapshot_id,
        }),
        patches,
    }
}
