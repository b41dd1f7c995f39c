//! The segment openings record (format version 8): which segments the log
//! writer opened since the checkpoints, so that recovery reads only those
//! (and the heads the checkpoint names) instead of block 0 of every segment
//! of the pool. Written before the first batch of a new segment counts as
//! written, in two alternating areas, never over the newest durable record.
//! See docs/format.md, "Segment openings", and
//! docs/decisions/0030-recovery-from-the-checkpoint.md.

use serde::{Deserialize, Serialize};

use super::frame::{self, FrameError};
use super::geometry::SEGMENT_OPENINGS_AREA_SIZE_BLOCKS;
use crate::convert::to_usize;
use crate::{BLOCK_BYTES, BLOCK_SIZE_BYTES};

/// "LAMINASO" in ASCII, read as a little-endian u64.
pub const OPENINGS_MAGIC: u64 = u64::from_le_bytes(*b"LAMINASO");

/// Bytes a record may take: its area.
fn area_bytes() -> usize {
    to_usize(SEGMENT_OPENINGS_AREA_SIZE_BLOCKS * BLOCK_SIZE_BYTES)
}

/// One segment opened as a log head: its index and the incarnation it got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Opening {
    pub segment_index: u32,
    pub segment_sequence: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentOpeningsRecord {
    /// The pool's identifier, so that a record left by another pool on the
    /// same device is never taken for this one's.
    pub pool_identifier: u128,
    /// Increases with every record written; record `n` goes to area `n % 2`.
    pub record_sequence: u64,
    /// Every segment opened with a segment sequence at or above this one,
    /// up to when the record was built, is listed (unless `overflowed`).
    pub floor_segment_sequence: u64,
    /// The list did not fit the area: recovery must read every segment.
    pub overflowed: bool,
    pub openings: Vec<Opening>,
}

impl SegmentOpeningsRecord {
    /// The record framed and padded to whole blocks; a list too long for
    /// the area is written as overflowed, without its entries.
    pub fn encode(&self) -> Vec<u8> {
        let bytes = frame::encode(OPENINGS_MAGIC, super::FORMAT_VERSION, self, BLOCK_BYTES);
        if bytes.len() <= area_bytes() {
            return bytes;
        }
        let overflowed = Self {
            overflowed: true,
            openings: Vec::new(),
            ..self.clone()
        };
        frame::encode(
            OPENINGS_MAGIC,
            super::FORMAT_VERSION,
            &overflowed,
            BLOCK_BYTES,
        )
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FrameError> {
        frame::decode(OPENINGS_MAGIC, super::FORMAT_VERSION, bytes).map(|(_, record)| record)
    }

    /// The newest of the records in `areas` that belong to `pool_identifier`.
    pub fn newest<'a>(
        areas: impl IntoIterator<Item = &'a [u8]>,
        pool_identifier: u128,
    ) -> Option<Self> {
        areas
            .into_iter()
            .filter_map(|bytes| Self::decode(bytes).ok())
            .filter(|record| record.pool_identifier == pool_identifier)
            .max_by_key(|record| record.record_sequence)
    }

    /// Whether recovery from a checkpoint whose `next_segment_sequence` is
    /// `checkpoint_next_segment_sequence` may read only the listed segments:
    /// the record lists every segment opened since that checkpoint.
    pub fn covers(&self, checkpoint_next_segment_sequence: u64) -> bool {
        !self.overflowed && self.floor_segment_sequence <= checkpoint_next_segment_sequence
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(pool_identifier: u128, record_sequence: u64) -> SegmentOpeningsRecord {
        SegmentOpeningsRecord {
            pool_identifier,
            record_sequence,
            floor_segment_sequence: 10,
            overflowed: false,
            openings: vec![Opening {
                segment_index: 3,
                segment_sequence: 12,
            }],
        }
    }

    #[test]
    fn the_newest_record_of_this_pool_wins() {
        let a = record(7, 4).encode();
        let b = record(7, 5).encode();
        let other = record(8, 9).encode();
        let mut torn = record(7, 6).encode();
        torn[30] ^= 1;
        let newest = SegmentOpeningsRecord::newest([&a[..], &b[..], &other[..], &torn[..]], 7);
        assert_eq!(newest, Some(record(7, 5)));
        assert_eq!(SegmentOpeningsRecord::newest([&other[..]], 7), None);
    }

    #[test]
    fn a_list_too_long_for_the_area_is_written_as_overflowed() {
        let mut long = record(7, 1);
        long.openings = (0..200_000)
            .map(|index| Opening {
                segment_index: index,
                segment_sequence: u64::from(index) + 1_000_000,
            })
            .collect();
        let bytes = long.encode();
        assert!(bytes.len() <= area_bytes());
        let decoded = SegmentOpeningsRecord::decode(&bytes).unwrap();
        assert!(decoded.overflowed && decoded.openings.is_empty());
        assert!(!decoded.covers(u64::MAX));
    }

    #[test]
    fn a_record_covers_checkpoints_from_its_floor_on() {
        let record = record(7, 1);
        assert!(record.covers(10) && record.covers(11));
        assert!(!record.covers(9));
    }
}
