//! Keeping the segment openings record (format version 8, `log::openings`)
//! current: every segment the log writer opens as a head is listed in memory
//! ([`OpeningsList`], part of the state), and the first batch written into a
//! newly opened segment completes only once a record listing the segment has
//! been written ([`record_opening`]), so that a flush that makes the batch
//! durable makes the record durable too. Recovery then reads only the listed
//! segments (docs/decisions/0030-recovery-from-the-checkpoint.md).
//!
//! Records are written one at a time (the recorder's mutex), so that two
//! writes of one area never race, alternately into two areas. Whatever a
//! power cut leaves in an area is a record that was complete (then it lists
//! every segment opened before it was built), the durable content before an
//! unflushed write, or a torn frame. A batch is durable only after a flush
//! that followed its record's write, so the newest record that verifies
//! lists every segment holding durable batches, unless an area is torn or
//! rotted: recovery then reads every segment (`pool::recovery`).

use lamina_device::{BlockDevice, DeviceError};

use super::inner::{Inner, aligned, write_retried_while_full};
use super::state::State;
use crate::BLOCK_SIZE_BYTES;
use crate::log::geometry::SEGMENT_OPENINGS_AREA_BLOCKS;
use crate::log::openings::{Opening, SegmentOpeningsRecord};

/// The segments opened as log heads whose incarnations recovery from a
/// durable checkpoint may need, oldest first.
#[derive(Default)]
pub struct OpeningsList {
    openings: Vec<Opening>,
}

impl OpeningsList {
    /// The list recovery found (openings the record before the crash listed,
    /// or incarnations a whole scan met).
    pub fn starting_with(mut openings: Vec<Opening>) -> Self {
        openings.sort_by_key(|opening| (opening.segment_sequence, opening.segment_index));
        openings.dedup();
        Self { openings }
    }

    /// A segment was opened as a head with incarnation `segment_sequence`.
    pub fn opened(&mut self, segment_index: u32, segment_sequence: u64) {
        self.openings.push(Opening {
            segment_index,
            segment_sequence,
        });
    }

    /// Drops the openings below `floor_segment_sequence` (no durable
    /// checkpoint needs them: both were taken after them) and returns the
    /// rest.
    fn retained_from(&mut self, floor_segment_sequence: u64) -> Vec<Opening> {
        self.openings
            .retain(|opening| opening.segment_sequence >= floor_segment_sequence);
        self.openings.clone()
    }

    pub fn len(&self) -> usize {
        self.openings.len()
    }
}

struct RecorderState {
    next_record_sequence: u64,
    /// Every segment opened with a sequence up to this one is listed in a
    /// record already written.
    recorded_through_segment_sequence: u64,
}

/// Writes the segment openings records, one at a time.
pub(crate) struct OpeningsRecorder {
    pool_identifier: u128,
    state: tokio::sync::Mutex<RecorderState>,
}

impl OpeningsRecorder {
    /// A recorder whose next record is `next_record_sequence`, segments up
    /// to `recorded_through_segment_sequence` not needing another record.
    pub fn new(
        pool_identifier: u128,
        next_record_sequence: u64,
        recorded_through_segment_sequence: u64,
    ) -> Self {
        Self {
            pool_identifier,
            state: tokio::sync::Mutex::new(RecorderState {
                next_record_sequence,
                recorded_through_segment_sequence,
            }),
        }
    }
}

/// The record listing every opening a durable checkpoint may need, and the
/// highest segment sequence it accounts for.
pub(super) fn build_record(
    state: &mut State,
    pool_identifier: u128,
    record_sequence: u64,
) -> (SegmentOpeningsRecord, u64) {
    let floor_segment_sequence = state.space().openings_floor_segment_sequence();
    let openings = state.openings_mut().retained_from(floor_segment_sequence);
    let through = state.writer().next_segment_sequence() - 1;
    let record = SegmentOpeningsRecord {
        pool_identifier,
        record_sequence,
        floor_segment_sequence,
        overflowed: false,
        openings,
    };
    (record, through)
}

/// Writes `record` into its area (not flushed).
pub(super) async fn write_record(
    device: &dyn BlockDevice,
    record: &SegmentOpeningsRecord,
) -> Result<(), DeviceError> {
    device
        .write(record_offset(record), aligned(&record.encode()))
        .await
}

/// Where `record` goes: record `n` at the start of area `n % 2`.
fn record_offset(record: &SegmentOpeningsRecord) -> u64 {
    let area = if record.record_sequence.is_multiple_of(2) {
        SEGMENT_OPENINGS_AREA_BLOCKS[0]
    } else {
        SEGMENT_OPENINGS_AREA_BLOCKS[1]
    };
    area * BLOCK_SIZE_BYTES
}

/// Makes sure a record listing the segment opened with `segment_sequence`
/// has been written, before the write of its first batch counts as
/// complete.
pub(super) async fn record_opening(
    inner: &Inner,
    segment_sequence: u64,
) -> Result<(), DeviceError> {
    let mut recorder = inner.openings.state.lock().await;
    if recorder.recorded_through_segment_sequence >= segment_sequence {
        return Ok(());
    }
    write_next_record(inner, &mut recorder).await
}

/// Writes a record now and flushes it (at open, so that the newest record
/// is this run's and lists what recovery found).
pub(super) async fn record_now_durably(inner: &Inner) -> Result<(), DeviceError> {
    let mut recorder = inner.openings.state.lock().await;
    write_next_record(inner, &mut recorder).await?;
    inner.device.flush().await
}

/// Builds and writes the next record.
async fn write_next_record(inner: &Inner, recorder: &mut RecorderState) -> Result<(), DeviceError> {
    let (record, through) = build_record(
        &mut inner.lock(),
        inner.openings.pool_identifier,
        recorder.next_record_sequence,
    );
    // Retried while the device is full, like the batch waiting for it.
    let offset = record_offset(&record);
    write_retried_while_full(inner, offset, &aligned(&record.encode())).await?;
    recorder.next_record_sequence += 1;
    recorder.recorded_through_segment_sequence =
        recorder.recorded_through_segment_sequence.max(through);
    Ok(())
}
