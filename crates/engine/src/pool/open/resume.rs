//! Setting the pool up to go on after replay: the segment table rebuilt from
//! the recovered maps, a refusal when segments holding data cannot be read,
//! the losses of a restore without the flash device marked, and the kept
//! checkpoints, openings list and sequences the pool continues with.

use std::collections::HashSet;

use super::checkpoints::KeptCheckpoints;
use super::replay::ReplayOutcome;
use super::scan::{ScanScope, ScannedLog};
use crate::BLOCK_SIZE_BYTES;
use crate::convert::segment_index;
use crate::error::{EngineError, OpenError};
use crate::log::geometry::Tier;

use crate::pool::core::integrity::{RecoveryFindings, RestorePoint};
use crate::pool::core::state::{LogResume, State};
use crate::pool::space::{self, RecoveredSegments};

/// Sequence numbers skipped after a recovery, so that new batches and segments
/// can never share a sequence with a stale, unreachable one left by the crash.
/// Far more than the batches or segments that can be unflushed at once.
pub(super) const RECOVERY_BATCH_SEQUENCE_GAP: u64 = 1 << 24;
pub(super) const RECOVERY_SEGMENT_SEQUENCE_GAP: u64 = 1 << 16;

/// After a restore without the flash device, records the point the pool is
/// as of (the checkpoint) and marks lost every map entry whose data is
/// gone, counted in `findings` and logged:
/// - every entry on the flash tier: its data was on the lost device only;
/// - every entry the replay left as the checkpoint had it that points into
///   a capacity segment opened again since the checkpoint. The block died
///   after the checkpoint (overwritten, or moved, by a batch on the lost
///   flash that the replay cannot see) and the segment was reused, so the
///   block holds other data now; left mapped, it would read as a checksum
///   error at best and, sharing its block with the new data, corrupt the
///   segment's usage.
pub(super) fn mark_restored_losses(
    state: &mut State,
    scanned: &ScannedLog,
    kept: &KeptCheckpoints,
    replay: &ReplayOutcome,
    name: &str,
    findings: &mut RecoveryFindings,
) {
    let point = RestorePoint {
        checkpoint_sequence: kept.newest.slot.checkpoint_sequence,
        covered_batch_sequence: kept.newest.slot.covered_batch_sequence,
    };
    let body = &kept.newest.body;
    let geometry = *state.geometry();
    let reopened: HashSet<u32> = scanned
        .probed
        .iter()
        .filter(|opening| opening.segment_sequence >= body.next_segment_sequence)
        .map(|opening| opening.segment_index)
        .collect();
    let lost = state.mark_lost(&|location, changed| {
        // A fragment lies in one segment: its first block decides.
        geometry.tier_of_block(location.block()) == Tier::Flash
            || (!changed && reopened.contains(&geometry.segment_of(location.block())))
    });
    tracing::warn!(
        device = name,
        checkpoint_sequence = point.checkpoint_sequence,
        covered_batch_sequence = point.covered_batch_sequence,
        lost_block_entries = lost,
        later_versions_skipped = replay.later_versions_skipped,
        moves_in_new_form_kept = replay.new_forms_kept,
        "flash device restored: every volume is as of the checkpoint (nothing written after it is restored); map entries whose data was on the lost flash only are marked lost and read as errors"
    );
    findings.restored_as_of = Some(point);
    findings.blocks_marked_lost = lost;
}

/// Sets up what the pool goes on with after replay: the kept checkpoints,
/// the openings its segment openings records go on listing, the checkpoint
/// numbering and the log's next sequences. Returns the highest segment
/// sequence given before this run, which no record of this run is written
/// for (the ones it needs are in the openings list).
pub(super) fn continue_after_replay(
    state: &mut State,
    kept: &KeptCheckpoints,
    scope: &ScanScope,
    scanned: &ScannedLog,
    replay: &ReplayOutcome,
) -> u64 {
    let highest_segment_sequence = replay
        .highest_segment_sequence
        .max(kept.newest.body.next_segment_sequence.saturating_sub(1));
    state.restore_durable_checkpoints(kept.durable_checkpoints(scope.older_floor()));
    let openings = scope.openings_to_keep(
        &scanned.probed,
        state.space().openings_floor_segment_sequence(),
    );
    // The skipped sequences count as sealed and durable, so that the log
    // stays dense from the next checkpoint's point of view. Durable once
    // the device flush after this returns.
    state.resume_log(LogResume {
        openings,
        next_checkpoint_sequence: kept.next_checkpoint_sequence,
        next_batch_sequence: replay.highest_sequence + 1 + RECOVERY_BATCH_SEQUENCE_GAP,
        next_segment_sequence: highest_segment_sequence + 1 + RECOVERY_SEGMENT_SEQUENCE_GAP,
    });
    state.writer().next_segment_sequence() - 1
}

/// Segment usage from the recovered maps, counting each physical block once
/// however many snapshots and clones share it; then every segment's state.
pub(super) fn rebuild_segment_table(
    state: &mut State,
    held: &HashSet<u32>,
    kept: &KeptCheckpoints,
    highest_sequence: u64,
    name: &str,
) -> Result<(), EngineError> {
    let geometry = *state.geometry();
    let mut live_units = vec![0u32; state.space().segments().len()];
    let block_count = geometry.device_size_bytes / BLOCK_SIZE_BYTES;
    // Each location is counted once however many maps hold it: whole blocks
    // in a bitmap, fragments (several to a block) in a set.
    let mut counted = vec![0u64; usize::try_from(block_count.div_ceil(64)).expect("fits memory")];
    let mut counted_fragments = HashSet::new();
    let mut live_location_count = 0u64;
    state.volumes().for_each_distinct_location(&mut |location| {
        let block = location.block();
        let first_time = if location.is_fragment() {
            counted_fragments.insert(location)
        } else {
            let word = usize::try_from(block / 64).expect("a device block");
            let bit = block % 64;
            let first_time = counted[word] & (1 << bit) == 0;
            counted[word] |= 1 << bit;
            first_time
        };
        if first_time {
            live_units[geometry.segment_of(block) as usize] += location.units();
            live_location_count += 1;
        }
    });
    if let Some(segment) = held
        .iter()
        .find(|segment| live_units[**segment as usize] > 0)
    {
        return Err(EngineError::corrupt(
            name,
            "checkpoint",
            geometry.segment_first_block(*segment) * BLOCK_SIZE_BYTES,
            format!("segment {segment} holds both a checkpoint body and mapped data"),
        ));
    }
    state.rebuild_segment_table(RecoveredSegments {
        live_units: &live_units,
        live_location_count,
        held,
        fallback_covered: kept.fallback_covered(),
        highest_sequence,
    });
    Ok(())
}

/// Refuses to open when segments holding data (live blocks or a kept
/// checkpoint's body) cannot be read: their devices are lost beyond their
/// redundancy. Their blocks would be read errors; the devices may still
/// come back, so nothing is changed.
pub(super) fn refuse_lost_segments(state: &State, name: &str) -> Result<(), EngineError> {
    let mut lost = (0_usize, 0_u64);
    for (index, segment) in state.space().segments().iter().enumerate() {
        let index = segment_index(index as u64);
        let holds_data = segment.live_blocks() > 0
            || matches!(segment.state, space::SegmentState::Checkpoint { .. });
        if holds_data && !state.shapes().layout(index).readable {
            lost.0 += 1;
            lost.1 += u64::from(segment.live_blocks()) * BLOCK_SIZE_BYTES;
        }
    }
    if lost.0 == 0 {
        return Ok(());
    }
    Err(EngineError::Open(OpenError::SegmentsLost {
        device: name.to_string(),
        segment_count: lost.0,
        live_bytes: lost.1,
    }))
}
