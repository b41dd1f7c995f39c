//! Write-behind for writers that flush after almost every write (issue 46):
//! a database's commit, `fio --fsync=1`, a journal. A write is acknowledged
//! once it is in the open batch, so the FLUSH that follows is where the
//! batch is written, and the flush waits for that write before the device
//! flush (measured: about 150 µs of a 260 µs flush on a pool file). When
//! the recent flushes each came after at most
//! [`WRITES_PER_FLUSH_SYNCHRONOUS_MAX`] writes, the write path seals the
//! open batch as soon as it appends a write and starts its device write, so
//! that by the time the client's FLUSH arrives the write is under way or
//! done. The batch is the one the flush would have sealed a few
//! microseconds later, so the bytes written do not change; a writer that
//! streams without flushing stops it after
//! [`WRITES_PER_FLUSH_SYNCHRONOUS_MAX`] writes, so its batches fill as
//! before. Sealing is allowed at any point of the log (every flush does
//! it), so recovery is unchanged.

use std::sync::atomic::{AtomicU64, Ordering};

/// Writes between two client flushes at most for the flushes to count as a
/// synchronous writer's (a commit is a write or two, then a flush).
pub(in crate::pool) const WRITES_PER_FLUSH_SYNCHRONOUS_MAX: u64 = 2;

/// Consecutive synchronous flushes before writes are sealed at once: enough
/// that a writer that flushes now and then is not taken for one that
/// flushes after every write.
pub(in crate::pool) const SYNCHRONOUS_FLUSH_STREAK_MIN: u64 = 8;

/// See the module documentation.
#[derive(Default)]
pub(in crate::pool) struct WriteBehind {
    /// Client writes appended since the last client flush.
    writes_since_flush: AtomicU64,
    /// Consecutive client flushes that each came after at most
    /// [`WRITES_PER_FLUSH_SYNCHRONOUS_MAX`] writes.
    synchronous_flushes: AtomicU64,
    /// Open batches sealed by a write rather than by a flush or by filling.
    sealed_at_write: AtomicU64,
}

impl WriteBehind {
    /// Counts a client write appended to the open batch; whether the batch
    /// should be sealed and written now.
    pub(in crate::pool) fn write_appended(&self) -> bool {
        let writes = self.writes_since_flush.fetch_add(1, Ordering::Relaxed) + 1;
        writes <= WRITES_PER_FLUSH_SYNCHRONOUS_MAX
            && self.synchronous_flushes.load(Ordering::Relaxed) >= SYNCHRONOUS_FLUSH_STREAK_MIN
    }

    /// Counts a batch the write path sealed.
    pub(in crate::pool) fn sealed(&self) {
        self.sealed_at_write.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a client flush.
    pub(in crate::pool) fn flushed(&self) {
        let writes = self.writes_since_flush.swap(0, Ordering::Relaxed);
        if writes <= WRITES_PER_FLUSH_SYNCHRONOUS_MAX {
            // Saturating: a streak only needs to reach the minimum.
            let _ = self.synchronous_flushes.fetch_update(
                Ordering::Relaxed,
                Ordering::Relaxed,
                |streak| Some(streak.saturating_add(1)),
            );
        } else {
            self.synchronous_flushes.store(0, Ordering::Relaxed);
        }
    }

    /// Open batches sealed by a write since the pool opened.
    pub(in crate::pool) fn sealed_at_write(&self) -> u64 {
        self.sealed_at_write.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn synchronous(write_behind: &WriteBehind) {
        for _ in 0..SYNCHRONOUS_FLUSH_STREAK_MIN {
            assert!(!write_behind.write_appended() || write_behind.sealed_at_write() == 0);
            write_behind.flushed();
        }
    }

    #[test]
    fn writes_are_sealed_once_flushes_follow_every_write() {
        let write_behind = WriteBehind::default();
        assert!(!write_behind.write_appended(), "no flushes seen yet");
        write_behind.flushed();
        synchronous(&write_behind);
        assert!(write_behind.write_appended());
        assert!(write_behind.write_appended());
        assert!(
            !write_behind.write_appended(),
            "a third write without a flush: a streaming writer"
        );
        write_behind.flushed();
        assert!(
            !write_behind.write_appended(),
            "the streak ended with the flush after three writes"
        );
    }

    #[test]
    fn a_writer_that_flushes_now_and_then_is_not_sealed_early() {
        let write_behind = WriteBehind::default();
        for _ in 0..100 {
            for _ in 0..WRITES_PER_FLUSH_SYNCHRONOUS_MAX + 1 {
                assert!(!write_behind.write_appended());
            }
            write_behind.flushed();
        }
    }
}
