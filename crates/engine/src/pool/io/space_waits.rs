//! Writes that found no free segment and waited for space: each one runs
//! (or waits for) a foreground reclaim, a flush, cleaning pass or
//! checkpoint in the client's own write path, which is what the paced
//! cleaner is there to prevent. Counted since the pool opened, with the
//! time they waited, for `pool status` and `/metrics`: the operator's sign
//! that cleaning falls behind the clients' writes (and the benchmarks'
//! explanation of a latency spike).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

/// See the module documentation.
#[derive(Default)]
pub(in crate::pool) struct SpaceWaits {
    count: AtomicU64,
    microseconds: AtomicU64,
}

/// What `pool status` shows of the waits since the pool opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SpaceWaitsStatus {
    /// Writes that found no free segment and waited for a reclaim.
    pub count: u64,
    /// The time they waited, in all, in milliseconds.
    pub milliseconds: u64,
}

impl SpaceWaits {
    /// Counts one write that waited `waited` for space.
    pub(in crate::pool) fn record(&self, waited: Duration) {
        let microseconds = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.microseconds.fetch_add(microseconds, Ordering::Relaxed);
    }

    pub(in crate::pool) fn status(&self) -> SpaceWaitsStatus {
        SpaceWaitsStatus {
            count: self.count.load(Ordering::Relaxed),
            milliseconds: self.microseconds.load(Ordering::Relaxed) / 1000,
        }
    }
}
