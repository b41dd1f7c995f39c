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
}

impl FlushMarkerRecord {
    pub fn encode(&self) -> Vec<u8> {
        frame::encode(MARKER_MAGIC, super::FORMAT_VERSION, self, BLOCK_BYTES)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FrameError> {
        frame::decode(MARKER_MAGIC, super::FORMAT_VERSION, bytes).map(|(_, marker)| marker)
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
}
