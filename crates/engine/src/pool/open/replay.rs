//! Replaying the scanned batches in sequence order: which were durable before
//! the crash (the log's summaries and the flush marker say), the unflushed
//! tail's data checked block by block (a torn block is dropped, a damaged
//! flushed one is mapped so that reading it fails), striped rows of the tail
//! written back with matching parity, and the findings logged and counted.

use std::sync::Arc;

use lamina_device::{AlignedBuffer, BlockDevice};

use super::new_forms::NewFormJudge;
use super::scan::{ScannedBatch, ScannedDamage, ScannedLog};
use crate::error::EngineError;
use crate::log::batch::{Record, block_checksum};
use crate::log::chain::SegmentShape;
use crate::log::data_layout::{DataLayout, Placement};
use crate::log::geometry::{Geometry, Tier};
use crate::log::location::{Location, UNIT_BYTES, UNITS_PER_BLOCK};
use crate::log::marker::FlushMarkerRecord;
use crate::pool::core::integrity::RecoveryFindings;
use crate::pool::core::state::State;
use crate::{BLOCK_BYTES, BLOCK_SIZE_BYTES};

/// How `Pool::open_as` treats the flash tier.
#[derive(Clone, Copy)]
pub(super) enum OpenMode {
    Normal,
    /// The flash device is new (`Pool::restore_flash`): replay applies only
    /// moves of contents the checkpoint holds (as they were, or in a new
    /// form, `new_forms`), and what the maps place on flash is lost.
    FlashRestored,
}

/// Sequences that decide how replay treats a batch.
#[derive(Clone, Copy, Debug)]
pub(super) struct ReplayBounds {
    /// The checkpoint covers every batch up to here: they are not replayed.
    pub(super) covered: u64,
    /// The furthest flush the log's own summaries vouch for: batches above it
    /// were the unflushed tail as far as the log alone can tell, so their
    /// data is checked.
    pub(super) log_flushed_through: u64,
    /// The furthest flush the log or the flush marker vouches for: a block up
    /// to here that fails its checksum rotted after it was durable (mapped, so
    /// that reading it is an error); above, it was torn by the crash (dropped).
    pub(super) flushed_through: u64,
    /// The same for batches on the flash tier, which a client's flush may
    /// have made durable while a capacity batch below them waited for its
    /// upload (decision 0032): the flush marker's flash claim, at least
    /// `flushed_through`.
    pub(super) flash_flushed_through: u64,
}

impl ReplayBounds {
    /// Whether `batch` was durable before the crash, as far as the log and
    /// the marker tell.
    fn flushed(&self, geometry: &Geometry, batch: &ScannedBatch) -> bool {
        let sequence = batch.summary.batch_sequence;
        if sequence <= self.flushed_through {
            return true;
        }
        let on_flash = geometry.tier_of_block(batch.summary_block) == Tier::Flash;
        on_flash && sequence <= self.flash_flushed_through
    }
}

/// How replay treats each batch: covered by the checkpoint, vouched for as
/// flushed by the log or by the flush marker, or the unflushed tail.
pub(super) fn replay_bounds(
    scanned: &ScannedLog,
    covered: u64,
    marker: Option<FlushMarkerRecord>,
) -> ReplayBounds {
    let log_flushed_through = scanned
        .batches
        .iter()
        .map(|batch| batch.summary.flushed_through_sequence)
        .fold(covered, u64::max);
    let flushed_through = marker
        .map_or(0, |marker| marker.flushed_through_sequence)
        .max(log_flushed_through);
    let flash_flushed_through = marker
        .map_or(0, |marker| marker.flash_flushed_through_sequence)
        .max(flushed_through);
    ReplayBounds {
        covered,
        log_flushed_through,
        flushed_through,
        flash_flushed_through,
    }
}

/// What replay did.
pub(super) struct ReplayOutcome {
    pub(super) replayed: usize,
    pub(super) highest_sequence: u64,
    pub(super) highest_segment_sequence: u64,
    pub(super) torn_blocks_dropped: u64,
    pub(super) damaged_flushed_blocks: u64,
    /// Records a restore without the flash device did not apply: they
    /// changed, or moved, a version written after the checkpoint.
    pub(super) later_versions_skipped: u64,
    /// Moves a restore without the flash device applied because their new
    /// form (cold compression) decodes to what the maps held (`new_forms`).
    pub(super) new_forms_kept: u64,
}

/// Replays the scanned batches newer than the checkpoint, in sequence order.
/// After a restore without the flash device (`OpenMode::FlashRestored`)
/// only the moves of contents the maps hold are applied (see
/// [`replay_records`]).
pub(super) async fn replay_batches(
    device: &dyn BlockDevice,
    geometry: &Geometry,
    state: &mut State,
    scanned: &ScannedLog,
    bounds: ReplayBounds,
    mode: OpenMode,
) -> Result<ReplayOutcome, EngineError> {
    let mut outcome = ReplayOutcome {
        replayed: 0,
        highest_sequence: bounds.covered,
        highest_segment_sequence: 0,
        torn_blocks_dropped: 0,
        damaged_flushed_blocks: 0,
        later_versions_skipped: 0,
        new_forms_kept: 0,
    };
    let mut judge = NewFormJudge::default();
    let mut previous_sequence: Option<u64> = None;
    for batch in &scanned.batches {
        let sequence = batch.summary.batch_sequence;
        // Sorted and deduplicated by the scan: replay applies records in
        // the order they were written.
        assert!(
            previous_sequence.is_none_or(|previous| sequence > previous),
            "replay out of order: batch {sequence} after {previous_sequence:?}"
        );
        previous_sequence = Some(sequence);
        if sequence <= bounds.covered {
            continue;
        }
        // Flushed batches may be missing: a dead segment whose records
        // were all replaced by later durable ones is rewritten without
        // waiting for checkpoints to cover it (`State::dead_segment_reusable`).
        let only_held_contents = matches!(mode, OpenMode::FlashRestored);
        let checked_data = read_unflushed_data(device, batch, bounds).await?;
        let restored_data = if only_held_contents && checked_data.is_none() {
            read_fragment_data(device, batch).await?
        } else {
            None
        };
        let replayed = BatchToReplay {
            batch,
            checked_data,
            flushed: bounds.flushed(geometry, batch),
            only_held_contents,
            restored_data,
        };
        replay_records(state, &replayed, &mut judge, &mut outcome);
        batch_replayed(geometry, state, batch, &mut outcome);
        if sequence > bounds.log_flushed_through {
            let segment_index = geometry.segment_of(batch.summary_block);
            let at = BatchInSegment {
                shape: state.shapes().shape(segment_index),
                first_block: batch.summary_block - geometry.segment_first_block(segment_index),
            };
            rewrite_unflushed_rows(device, at, batch, replayed.checked_data.as_ref()).await?;
        }
    }
    Ok(outcome)
}

/// On a striped tier (rows of several blocks, `lamina_layout`), the crash
/// may have torn an unflushed batch's rows across the members: some members
/// hold the new blocks, some the old, so that the parity no longer matches
/// the data replay just accepted (the write hole). The batch is written back
/// (summary, data and copy: whole rows from the row boundary it starts at),
/// which gives its rows parity that matches, before anything depends on it:
/// a member lost later is rebuilt from that parity. The data written is
/// `checked_data`, as replay checked and rebuilt it, not a second read: with
/// a member lost, that would rebuild its blocks from the torn parity. On a
/// single device (rows of one block) there is no parity to mend.
///
/// A batch that does not fill whole rows of its segment's shape *now* was
/// written before the segment was laid out again (a rebalance or an
/// evacuation lays a freed segment out at the array's new width). A segment
/// is laid out again only once it is free, which a dead segment becomes once
/// the records replacing all of its blocks are durable (decision 0006): replay
/// finds them after this batch, so its rows hold nothing to mend, and writing
/// them in the new rows would overwrite neighbours (seed 1814 of
/// `rebuild_crashes`). It is left as it is.
pub(super) async fn rewrite_unflushed_rows(
    device: &dyn BlockDevice,
    at: BatchInSegment,
    batch: &ScannedBatch,
    checked_data: Option<&AlignedBuffer>,
) -> Result<(), EngineError> {
    let row_blocks = u64::from(at.shape.row_blocks);
    if row_blocks <= 1 {
        return Ok(());
    }
    // The summary, the data blocks and the summary's copy (format version 5 on).
    let block_count = batch.summary.data_block_count() + 2;
    let end_block = at.first_block + block_count as u64;
    let in_whole_rows = at.first_block.is_multiple_of(row_blocks)
        && end_block.next_multiple_of(row_blocks) <= u64::from(at.shape.size_blocks);
    if !in_whole_rows {
        tracing::debug!(
            summary_block = batch.summary_block,
            batch_sequence = batch.summary.batch_sequence,
            row_blocks,
            "an unflushed batch in a segment laid out again since: its rows are not rewritten"
        );
        return Ok(());
    }
    let offset = batch.summary_block * BLOCK_SIZE_BYTES;
    let mut contents = device.read(offset, block_count * BLOCK_BYTES).await?;
    if let Some(data) = checked_data {
        contents[BLOCK_BYTES..BLOCK_BYTES + data.len()].copy_from_slice(data);
    }
    device.write(offset, Arc::new(contents)).await?;
    Ok(())
}

/// Where a batch lies in its segment as the segment is laid out now.
#[derive(Clone, Copy, Debug)]
pub(super) struct BatchInSegment {
    pub(super) shape: SegmentShape,
    /// The batch's summary block, counted from the segment's first block.
    pub(super) first_block: u64,
}

/// A batch being replayed.
pub(super) struct BatchToReplay<'a> {
    batch: &'a ScannedBatch,
    /// Its data blocks, read back when they may be torn (see
    /// [`read_unflushed_data`]); `None` when they need no check.
    checked_data: Option<AlignedBuffer>,
    /// Whether the log or the flush marker vouches for it: a block that
    /// fails its checksum rotted after it was durable, rather than torn.
    flushed: bool,
    /// Apply only records that move contents the maps hold (a restore
    /// without the flash device, see [`replay_records`]).
    only_held_contents: bool,
    /// For such a restore, the data blocks of a batch holding fragments
    /// when `checked_data` does not hold them: what a move in a new form is
    /// judged by (`new_forms`).
    restored_data: Option<AlignedBuffer>,
}

/// The data blocks of a batch that holds fragments, as read (checked by
/// whoever uses them); `None` for a batch without fragments.
async fn read_fragment_data(
    device: &dyn BlockDevice,
    batch: &ScannedBatch,
) -> Result<Option<AlignedBuffer>, EngineError> {
    let summary = &batch.summary;
    if !summary.records.iter().any(Record::carries_fragment) {
        return Ok(None);
    }
    let offset = (batch.summary_block + 1) * BLOCK_SIZE_BYTES;
    let length = summary.data_block_count() * BLOCK_BYTES;
    Ok(Some(device.read(offset, length).await?))
}

/// The data blocks of a batch beyond what the log vouches for, which may be
/// torn and so are checked; `None` for a batch the log vouches for, or one
/// without data.
pub(super) async fn read_unflushed_data(
    device: &dyn BlockDevice,
    batch: &ScannedBatch,
    bounds: ReplayBounds,
) -> Result<Option<AlignedBuffer>, EngineError> {
    let data_count = batch.summary.data_block_count();
    if batch.summary.batch_sequence <= bounds.log_flushed_through {
        return Ok(None);
    }
    if data_count == 0 {
        return Ok(None);
    }
    let offset = (batch.summary_block + 1) * BLOCK_SIZE_BYTES;
    let mut data = device.read(offset, data_count * BLOCK_BYTES).await?;
    rebuild_failing_blocks(device, batch, &mut data).await;
    Ok(Some(data))
}

/// A block beyond what the log vouches for that fails its checksum was torn
/// by the crash, or damaged after a flush the log does not record (one that
/// completed just before the crash): a device with redundancy rebuilds it
/// when it can (and repairs its copy), so that only a block it cannot
/// rebuild is dropped as torn. A rebuild is judged by every record of the
/// batch whose data touches the blocks rebuilt: a block of fragments passes
/// only when all its fragments (and those continuing into or from it) match
/// (decision 0070), so that the rewrite (here and in
/// [`rewrite_unflushed_rows`]) never changes a byte a record vouches for.
/// On a single device nothing changes.
pub(super) async fn rebuild_failing_blocks(
    device: &dyn BlockDevice,
    batch: &ScannedBatch,
    data: &mut AlignedBuffer,
) {
    let (placements, _) = batch.summary.placements();
    let checked: Vec<(Placement, u32)> = placements
        .iter()
        .filter_map(|(record_index, placement)| {
            let checksum = batch.summary.records[*record_index].data_checksum()?;
            Some((*placement, checksum))
        })
        .collect();
    for (placement, checksum) in &checked {
        if stored_checksum(data, *placement) == *checksum {
            continue;
        }
        let location = placed_location(batch.summary_block, *placement);
        let blocks = data_blocks_of(*placement);
        let judge = BatchJudge::new(data, blocks, &checked);
        let offset = (batch.summary_block + 1 + u64::from(blocks.first)) * BLOCK_SIZE_BYTES;
        let length = blocks.count as usize * BLOCK_BYTES;
        let is_valid = move |candidate: &[u8]| judge.passes(candidate);
        match device.recover_range(offset, length, &is_valid).await {
            Ok(Some(good)) => {
                let start = blocks.first as usize * BLOCK_BYTES;
                data[start..start + length].copy_from_slice(&good[..length]);
            }
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(%error, %location, "rebuilding a block of the log's tail failed");
            }
        }
    }
}

/// Consecutive data blocks of a batch, counted from the block after the
/// summary.
#[derive(Clone, Copy, Debug)]
struct DataBlocks {
    first: u32,
    count: u32,
}

/// Judges a rebuild of some of a batch's data blocks by every record whose
/// data touches them, with the blocks around them as read: a fragment spans
/// two blocks at most, so one block on each side is all it needs.
struct BatchJudge {
    /// The data blocks from one before the rebuilt ones to one after, as read.
    window: Vec<u8>,
    /// The rebuilt blocks, counted from the window's first block.
    rebuilt: DataBlocks,
    /// The placements (counted from the window's first block) and checksums
    /// of the records whose data touches the rebuilt blocks.
    checks: Vec<(Placement, u32)>,
}

impl BatchJudge {
    fn new(data: &[u8], blocks: DataBlocks, checked: &[(Placement, u32)]) -> Self {
        let data_count = u32::try_from(data.len() / BLOCK_BYTES).expect("a batch's data blocks");
        let window_first = blocks.first.saturating_sub(1);
        let window_end = (blocks.first + blocks.count + 1).min(data_count);
        let rebuilt_end = blocks.first + blocks.count;
        let checks = checked
            .iter()
            .filter(|(placement, _)| {
                let touched = data_blocks_of(*placement);
                touched.first < rebuilt_end && touched.first + touched.count > blocks.first
            })
            .map(|(placement, checksum)| (shifted(*placement, window_first), *checksum))
            .collect();
        BatchJudge {
            window: data[window_first as usize * BLOCK_BYTES..window_end as usize * BLOCK_BYTES]
                .to_vec(),
            rebuilt: DataBlocks {
                first: blocks.first - window_first,
                count: blocks.count,
            },
            checks,
        }
    }

    fn passes(&self, candidate: &[u8]) -> bool {
        let mut trial = self.window.clone();
        let start = self.rebuilt.first as usize * BLOCK_BYTES;
        let length = self.rebuilt.count as usize * BLOCK_BYTES;
        trial[start..start + length].copy_from_slice(&candidate[..length]);
        self.checks
            .iter()
            .all(|(placement, checksum)| stored_checksum(&trial, *placement) == *checksum)
    }
}

/// The data blocks a placement's data touches.
fn data_blocks_of(placement: Placement) -> DataBlocks {
    match placement {
        Placement::WholeBlock { data_index } => DataBlocks {
            first: data_index,
            count: 1,
        },
        Placement::Fragment {
            data_index,
            unit_offset,
            unit_count,
        } => DataBlocks {
            first: data_index,
            count: (unit_offset + unit_count).div_ceil(UNITS_PER_BLOCK),
        },
    }
}

/// `placement` counted from data block `first` instead of 0.
fn shifted(placement: Placement, first: u32) -> Placement {
    match placement {
        Placement::WholeBlock { data_index } => Placement::WholeBlock {
            data_index: data_index - first,
        },
        Placement::Fragment {
            data_index,
            unit_offset,
            unit_count,
        } => Placement::Fragment {
            data_index: data_index - first,
            unit_offset,
            unit_count,
        },
    }
}

/// Applies a batch's records to the volumes: a torn block (failing its
/// checksum, never flushed) is dropped, a damaged flushed block is mapped.
///
/// After a restore without the flash device, the maps are the copied
/// checkpoint's and every batch after it that was on flash is gone, so a
/// capacity batch's record is applied only if it moves contents the maps
/// hold (a demotion or capacity cleaning of a version the checkpoint has):
/// one that moves a version written after the checkpoint would make that
/// block newer than blocks whose later writes were on flash only, and the
/// volume a mix of two points in time (decision 0056). A move whose
/// checksum is not the maps' may still carry their contents in a new form
/// (cold compression): `judge` decides from its data (`new_forms`,
/// decision 0074). Skipped, the block keeps the checkpoint's version, or is
/// lost when that was on flash.
pub(super) fn replay_records(
    state: &mut State,
    replayed: &BatchToReplay,
    judge: &mut NewFormJudge,
    outcome: &mut ReplayOutcome,
) {
    let summary_block = replayed.batch.summary_block;
    let mut layout = DataLayout::new();
    for record in &replayed.batch.summary.records {
        let mut skipped =
            replayed.only_held_contents && !state.volumes().moves_held_contents(record);
        let Some(placement) = layout.place(record.data_kind()) else {
            if skipped {
                outcome.later_versions_skipped += 1;
            } else {
                state.replay_record(record, None);
            }
            continue;
        };
        let location = placed_location(summary_block, placement);
        if skipped && moved_in_new_form(state, replayed, judge, record, placement) {
            outcome.new_forms_kept += 1;
            skipped = false;
        }
        let checksum = record
            .data_checksum()
            .expect("only records that carry data are placed");
        let intact = replayed
            .checked_data
            .as_ref()
            .is_none_or(|data| stored_checksum(data, placement) == checksum);
        if skipped {
            outcome.later_versions_skipped += 1;
            continue;
        }
        if !intact && !replayed.flushed {
            outcome.torn_blocks_dropped += 1;
            continue;
        }
        if !intact {
            // Durable, then damaged: mapped with its checksum, so that a
            // read reports the damage rather than the older version.
            outcome.damaged_flushed_blocks += 1;
            tracing::warn!(
                %location,
                ?record,
                "a flushed block fails its checksum; reads of it will fail"
            );
        }
        state.replay_record(record, Some(location));
    }
}

/// After a restore without the flash device, whether `record`, a move the
/// checksum rule skipped, placed at `placement` in its batch, moved the
/// contents the maps hold in a new form (`new_forms`), judged by the
/// batch's data as read.
fn moved_in_new_form(
    state: &State,
    replayed: &BatchToReplay,
    judge: &mut NewFormJudge,
    record: &Record,
    placement: Placement,
) -> bool {
    let data = replayed
        .checked_data
        .as_ref()
        .or(replayed.restored_data.as_ref());
    let (Placement::Fragment { .. }, Some(data)) = (placement, data) else {
        return false;
    };
    let blocks = data_blocks_of(placement);
    let start = blocks.first as usize * BLOCK_BYTES;
    let touched = &data[start..start + blocks.count as usize * BLOCK_BYTES];
    let location = placed_location(replayed.batch.summary_block, placement);
    match judge.check(state.volumes(), record, location, touched) {
        Ok(()) => true,
        Err(reason) => {
            tracing::debug!(%location, ?record, %reason, "a move after the restored checkpoint is skipped");
            false
        }
    }
}

/// The location of a record's data placed at `placement` in the batch whose
/// summary is at `summary_block`.
fn placed_location(summary_block: u64, placement: Placement) -> Location {
    match placement {
        Placement::WholeBlock { data_index } => {
            Location::whole_block(summary_block + 1 + u64::from(data_index))
        }
        Placement::Fragment {
            data_index,
            unit_offset,
            unit_count,
        } => Location::fragment(
            summary_block + 1 + u64::from(data_index),
            unit_offset,
            unit_count,
        ),
    }
}

/// The checksum of what `data` (a batch's data region as read back) holds
/// at `placement`: a whole block's, or a fragment's units'.
fn stored_checksum(data: &[u8], placement: Placement) -> u32 {
    match placement {
        Placement::WholeBlock { data_index } => {
            let start = data_index as usize * BLOCK_BYTES;
            block_checksum(&data[start..start + BLOCK_BYTES])
        }
        Placement::Fragment {
            data_index,
            unit_offset,
            unit_count,
        } => {
            let start = data_index as usize * BLOCK_BYTES + unit_offset as usize * UNIT_BYTES;
            crc32c::crc32c(&data[start..start + unit_count as usize * UNIT_BYTES])
        }
    }
}

/// Accounts for a replayed batch: its segment's placement hints and
/// last batch, and the highest sequences seen.
pub(super) fn batch_replayed(
    geometry: &Geometry,
    state: &mut State,
    batch: &ScannedBatch,
    outcome: &mut ReplayOutcome,
) {
    let summary = &batch.summary;
    let segment_index = geometry.segment_of(batch.summary_block);
    // Written after the checkpoint: its hints there are of an earlier use.
    state.batch_replayed(segment_index, summary.batch_sequence);
    outcome.highest_sequence = outcome.highest_sequence.max(summary.batch_sequence);
    outcome.highest_segment_sequence = outcome
        .highest_segment_sequence
        .max(summary.segment_sequence);
    outcome.replayed += 1;
}

/// Logs what recovery found damaged and sums it up for `pool status`. A batch
/// whose summary and copy were both unreadable is lost if a completed flush
/// covered it (the batch after it in its segment is itself covered); before
/// that point it may have been torn by the crash, which loses nothing flushed.
pub(super) fn report_findings(
    device: &str,
    scanned: &ScannedLog,
    replay: &ReplayOutcome,
    flushed_through: u64,
) -> RecoveryFindings {
    let mut findings = RecoveryFindings {
        summaries_repaired: scanned.summaries_repaired,
        lost_batches: 0,
        torn_blocks_dropped: replay.torn_blocks_dropped,
        damaged_flushed_blocks: replay.damaged_flushed_blocks,
        blocks_marked_lost: 0,
        restored_as_of: None,
    };
    if scanned.summaries_repaired > 0 {
        tracing::warn!(
            device,
            summaries = scanned.summaries_repaired,
            "damaged batch summaries were read from their copies"
        );
    }
    for damage in &scanned.damaged {
        if report_damage(device, damage, flushed_through) {
            findings.lost_batches += 1;
        }
    }
    findings
}

/// Logs one batch whose summary and copy were both unreadable. Returns
/// whether it was flushed, and so is lost.
pub(super) fn report_damage(device: &str, damage: &ScannedDamage, flushed_through: u64) -> bool {
    let flushed = damage.next_batch_sequence > 0 && damage.next_batch_sequence <= flushed_through;
    if flushed {
        tracing::error!(
            device,
            segment_index = damage.segment_index,
            first_block_in_segment = damage.range.first_block_in_segment,
            block_count = damage.range.block_count,
            "a flushed batch is lost: both copies of its summary are damaged, so the \
             blocks it wrote may read as an older version"
        );
    } else {
        tracing::warn!(
            device,
            segment_index = damage.segment_index,
            first_block_in_segment = damage.range.first_block_in_segment,
            block_count = damage.range.block_count,
            "an unreadable batch in the unflushed tail was skipped (torn by the crash)"
        );
    }
    flushed
}
