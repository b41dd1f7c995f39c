//! Keeping the segment openings record (format version 8, `log::openings`)
//! current: every segment the log writer opens as a head is listed in memory
//! ([`OpeningsList`], part of the state), and the first batch written into a
//! newly opened segment completes only once a record listing the segment has
//! been written (`Core::record_opening`, in `openings/writes.rs`), so that a flush that makes the batch
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
//! rotted: recovery then reads every segment (`pool::open`).

mod writes;

use std::sync::Arc;

use lamina_device::{AlignedBuffer, BlockDevice, DeviceError};

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
    pub(super) fn retained_from(&mut self, floor_segment_sequence: u64) -> Vec<Opening> {
        self.openings
            .retain(|opening| opening.segment_sequence >= floor_segment_sequence);
        self.openings.clone()
    }

    pub fn len(&self) -> usize {
        self.openings.len()
    }
}

pub(super) struct RecorderState {
    pub(super) next_record_sequence: u64,
    /// Every segment opened with a sequence up to this one is listed in a
    /// record already written.
    pub(super) recorded_through_segment_sequence: u64,
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

    pub(super) fn pool_identifier(&self) -> u128 {
        self.pool_identifier
    }

    /// The recorder's state, held while a record is built and written.
    pub(super) async fn lock(&self) -> tokio::sync::MutexGuard<'_, RecorderState> {
        self.state.lock().await
    }
}

/// Writes `record` into its area (not flushed).
pub(super) async fn write_record(
    device: &dyn BlockDevice,
    record: &SegmentOpeningsRecord,
) -> Result<(), DeviceError> {
    device.write(record_offset(record), encoded(record)).await
}

/// The record as written, padded to whole blocks.
pub(super) fn encoded(record: &SegmentOpeningsRecord) -> Arc<AlignedBuffer> {
    Arc::new(AlignedBuffer::from_slice_padded(&record.encode()))
}

/// Where `record` goes: record `n` at the start of area `n % 2`.
pub(super) fn record_offset(record: &SegmentOpeningsRecord) -> u64 {
    let area = if record.record_sequence.is_multiple_of(2) {
        SEGMENT_OPENINGS_AREA_BLOCKS[0]
    } else {
        SEGMENT_OPENINGS_AREA_BLOCKS[1]
    };
    area * BLOCK_SIZE_BYTES
}
