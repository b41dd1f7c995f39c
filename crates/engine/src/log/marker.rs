//! The flush marker: a block that says how far completed flushes reached. A
//! batch's summary records what was durable when the batch was built, so the
//! batches of the last flush before a crash have no later batch to vouch for
//! them; without more, recovery could not tell a block of theirs that rotted
//! from one torn by the crash, and would drop it (an older version, silently).
//! After each device flush the engine writes this marker (two alternating
//! blocks, so that a torn marker write leaves the previous one); recovery takes
//! the newest valid one. See docs/format.md, "Flush markers".

use serde::{Deserialize, Serialize};

use super::frame::{self, FrameError};
use crate::BLOCK_BYTES;

/// "LAMINAFM" in ASCII, read as a little-endian u64.
pub const MARKER_MAGIC: u64 = u64::from_le_bytes(*b"LAMINAFM");

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlushMarkerRecord {
    /// The pool's identifier, so that a marker left by another pool on the
    /// same device is never taken for this one's.
    pub pool_identifier: u128,
    /// Increases with every marker written; marker `n` goes to slot `n % 2`.
    pub marker_sequence: u64,
    /// Every batch with a sequence up to this one was durable when the
    /// marker was written.
    pub flushed_through_sequence: u64,
    /// Every batch on the flash tier with a sequence up to this one was
    /// durable (at least `flushed_through_sequence`; more in a two-tier pool
    /// whose capacity batches wait for their upload).
    pub flash_flushed_through_sequence: u64,
}

/// A marker as written before `flash_flushed_through_sequence` existed.
#[derive(Deserialize)]
struct MarkerBeforeFlashClaim {
    pool_identifier: u128,
    marker_sequence: u64,
    flushed_through_sequence: u64,
}

impl FlushMarkerRecord {
    pub fn encode(&self) -> Vec<u8> {
        frame::encode(MARKER_MAGIC, super::FORMAT_VERSION, self, BLOCK_BYTES)
    }

    /// A marker of either layout (one without the flash claim reads with
    /// it equal to the log's).
    pub fn decode(bytes: &[u8]) -> Result<Self, FrameError> {
        match frame::decode(MARKER_MAGIC, super::FORMAT_VERSION, bytes) {
            Ok((_, marker)) => Ok(marker),
            Err(FrameError::Decode(_)) => {
                let (_, old): (u32, MarkerBeforeFlashClaim) =
                    frame::decode(MARKER_MAGIC, super::FORMAT_VERSION, bytes)?;
                Ok(Self {
                    pool_identifier: old.pool_identifier,
                    marker_sequence: old.marker_sequence,
                    flushed_through_sequence: old.flushed_through_sequence,
                    flash_flushed_through_sequence: old.flushed_through_sequence,
                })
            }
            Err(error) => Err(error),
        }
    }

    /// The newest of the markers in `slots` that belong to `pool_identifier`.
    pub fn newest<'a>(
        slots: impl IntoIterator<Item = &'a [u8]>,
        pool_identifier: u128,
    ) -> Option<Self> {
        slots
            .into_iter()
            .filter_map(|bytes| Self::decode(bytes).ok())
            .filter(|marker| marker.pool_identifier == pool_identifier)
            .max_by_key(|marker| marker.marker_sequence)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_marker_of_this_pool_wins() {
        let marker = |pool_identifier, marker_sequence| FlushMarkerRecord {
            pool_identifier,
            marker_sequence,
            flushed_through_sequence: marker_sequence * 10,
            flash_flushed_through_sequence: marker_sequence * 10 + 3,
        };
        let a = marker(7, 4).encode();
        let b = marker(7, 5).encode();
        let other = marker(8, 9).encode();
        let mut torn = marker(7, 6).encode();
        torn[25] ^= 1;
        let newest = FlushMarkerRecord::newest([&a[..], &b[..], &other[..], &torn[..]], 7);
        assert_eq!(newest, Some(marker(7, 5)));
        assert_eq!(FlushMarkerRecord::newest([&other[..]], 7), None);
    }

    /// A marker written before the flash claim existed reads with the flash
    /// claim equal to the log's; one written now carries both.
    #[test]
    fn a_marker_without_the_flash_claim_reads_with_it_equal_to_the_log_claim() {
        #[derive(Serialize)]
        struct Old {
            pool_identifier: u128,
            marker_sequence: u64,
            flushed_through_sequence: u64,
        }
        let old = Old {
            pool_identifier: 9,
            marker_sequence: 4,
            flushed_through_sequence: 70,
        };
        let bytes = frame::encode(MARKER_MAGIC, 8, &old, BLOCK_BYTES);
        let read = FlushMarkerRecord::decode(&bytes).unwrap();
        assert_eq!(
            (
                read.flushed_through_sequence,
                read.flash_flushed_through_sequence
            ),
            (70, 70)
        );
        let new = FlushMarkerRecord {
            flash_flushed_through_sequence: 95,
            ..read
        };
        assert_eq!(FlushMarkerRecord::decode(&new.encode()).unwrap(), new);
    }
}
