//! Whether the capacity tier takes writes: in a two-tier pool the capacity
//! device (an object store, decision 0031) can stay unable to make its
//! writes durable for minutes while the flash tier works. After a failed
//! capacity flush the tier's writes are *suspended* (decision 0032): nothing
//! new is demoted or cleaned into it, checkpoints (whose covered batches
//! include its uploads) are refused, and clients' flushes make flash durable
//! without it. A retry of the capacity flush, with a doubling delay, resumes
//! the tier when the store is back. Each change of state is logged once,
//! loudly; the retries in between only at debug level.
//!
//! Lives in the pool's `State` (under its mutex, never across an await).

use std::time::Duration;

use serde::Serialize;

use tokio::time::Instant;

/// The first retry of a suspended tier's flush comes this long after the
/// failure; each failed retry doubles the delay, up to
/// [`CAPACITY_RETRY_DELAY_MS_MAX`].
pub const CAPACITY_RETRY_FIRST_DELAY_MS: u64 = 250;
/// The longest delay between two retries of a suspended tier's flush.
pub const CAPACITY_RETRY_DELAY_MS_MAX: u64 = 30_000;

/// Why and since when the capacity tier's writes are suspended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CapacitySuspension {
    /// The capacity flush's error that suspended them, or the latest retry's.
    pub last_error: String,
    /// When the first failure came, in seconds since the Unix epoch.
    pub since_unix_seconds: u64,
    /// Retries of the capacity flush that failed since.
    pub failed_retries: u64,
}

/// What `pool status` shows of the capacity tier's writes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CapacityWritesStatus {
    /// Set while demotion and checkpoints wait for the capacity tier.
    pub suspended: Option<CapacitySuspension>,
    /// Times the tier's writes were suspended, and resumed, since the pool
    /// opened.
    pub suspensions: u64,
    pub resumptions: u64,
}

/// See the module documentation.
#[derive(Default)]
pub struct CapacityWrites {
    status: CapacityWritesStatus,
    /// When the suspension began (for the time logged at its end).
    suspended_at: Option<Instant>,
    /// When the next retry is due, and the delay after it, while suspended.
    next_retry: Option<Instant>,
    retry_delay_ms: u64,
}

impl CapacityWrites {
    pub fn is_suspended(&self) -> bool {
        self.status.suspended.is_some()
    }

    pub fn status(&self) -> CapacityWritesStatus {
        self.status.clone()
    }

    /// A capacity flush failed with `error`: suspends the tier's writes (and
    /// says so, once), or counts a failed retry and doubles the delay.
    pub fn flush_failed(&mut self, device: &str, error: &str) {
        match &mut self.status.suspended {
            Some(suspension) => {
                suspension.failed_retries += 1;
                suspension.last_error = error.to_string();
                self.retry_delay_ms = (self.retry_delay_ms * 2).min(CAPACITY_RETRY_DELAY_MS_MAX);
                tracing::debug!(device, error, "the capacity tier is still unavailable");
            }
            None => {
                tracing::error!(
                    device,
                    error,
                    "the capacity tier cannot make its writes durable: demotion and \
                     checkpoints are suspended, client writes go on landing on flash \
                     (while it has room), reads of blocks held only by the capacity tier \
                     fail; retrying in the background"
                );
                self.status.suspensions += 1;
                self.status.suspended = Some(CapacitySuspension {
                    last_error: error.to_string(),
                    since_unix_seconds: crate::clock::now_unix_seconds(),
                    failed_retries: 0,
                });
                self.suspended_at = Some(Instant::now());
                self.retry_delay_ms = CAPACITY_RETRY_FIRST_DELAY_MS;
            }
        }
        self.next_retry = Some(Instant::now() + Duration::from_millis(self.retry_delay_ms));
    }

    /// A capacity flush succeeded: resumes the tier's writes if they were
    /// suspended (and says so, once).
    pub fn flush_succeeded(&mut self, device: &str) {
        if let Some(suspension) = self.status.suspended.take() {
            let suspended_ms = self.suspended_at.take().map_or(0, |at| {
                u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX)
            });
            tracing::warn!(
                device,
                suspended_ms,
                failed_retries = suspension.failed_retries,
                "the capacity tier makes its writes durable again: demotion and \
                 checkpoints resume"
            );
            self.status.resumptions += 1;
        }
        self.next_retry = None;
    }

    /// Whether a suspended tier's retry is due now.
    pub fn retry_due(&self) -> bool {
        self.is_suspended()
            && self
                .next_retry
                .is_none_or(|next_retry| Instant::now() >= next_retry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_suspends_once_and_retries_back_off_until_a_success_resumes() {
        let mut writes = CapacityWrites::default();
        assert!(!writes.is_suspended());
        writes.flush_failed("tier", "down");
        assert!(writes.is_suspended());
        assert_eq!(writes.retry_delay_ms, CAPACITY_RETRY_FIRST_DELAY_MS);
        for _ in 0..20 {
            writes.flush_failed("tier", "still down");
        }
        assert_eq!(writes.retry_delay_ms, CAPACITY_RETRY_DELAY_MS_MAX);
        let status = writes.status();
        assert_eq!(status.suspensions, 1);
        let suspension = status.suspended.expect("suspended");
        assert_eq!(suspension.failed_retries, 20);
        assert_eq!(suspension.last_error, "still down");
        writes.flush_succeeded("tier");
        assert!(!writes.is_suspended());
        assert_eq!(writes.status().resumptions, 1);
        writes.flush_succeeded("tier");
        assert_eq!(writes.status().resumptions, 1);
    }
}
