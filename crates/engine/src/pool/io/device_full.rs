//! The store under the pool running out of space (a sparse pool file on a file
//! system that filled up, a thin device, a quota): unlike other device errors
//! this is not a broken device, so a batch write that fails with it stays in
//! flight and is retried with backoff until space returns, instead of failing
//! the pool until a restart. Reads go on (in-flight batches serve their own
//! blocks); writers are held back by the in-flight batch limit and a FLUSH
//! waits for the retried batches, each for at most `device_full_wait_ms_max`,
//! then fails with ENOSPC: a flush never reports success for data that is not
//! durable, and a client's write does not hang for as long as the disk is
//! full. The condition is logged once at WARN, shown by `pool status` and
//! `/metrics`, and clears by itself when the last waiting batch is written.
//! A checkpoint body that finds the device full is abandoned (no slot names
//! it yet) and the pool keeps its previous checkpoints.
//!
//! Only batch writes wait. A device *flush* that fails for want of space keeps
//! the fail-stop of every other error: after a failed fsync the kernel may have
//! dropped the pages it could not write, so a later fsync could report success
//! for data that is gone, and the engine no longer holds those batches to
//! write them again.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use lamina_device::DeviceError;
use serde::Serialize;
use tokio::time::Instant;

use crate::convert::milliseconds_saturating;

/// The first wait before a batch write that found the device full is retried;
/// each later wait doubles, up to `device_full_retry_interval_ms`.
/// The first wait before a batch write that found the device full is tried
/// again; later waits double up to `device_full_retry_interval_ms`.
pub(in crate::pool) const DEVICE_FULL_FIRST_RETRY_DELAY_MS: u64 = 10;

/// What `pool status` shows while the device is full.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceFullStatus {
    /// The error of the write that found the device full.
    pub reason: String,
    pub since_unix_seconds: u64,
    /// Sealed batches waiting for space to be written.
    pub waiting_batch_count: usize,
}

struct Condition {
    reason: String,
    since: Instant,
    since_unix_seconds: u64,
    waiting_batch_count: usize,
}

/// Whether the device is out of space now, and how often writes were retried.
#[derive(Default)]
pub(crate) struct DeviceFull {
    condition: Mutex<Option<Condition>>,
    /// Batch writes tried again after finding the device full, over the
    /// pool's time open.
    retries_total: AtomicU64,
}

impl DeviceFull {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Condition>> {
        self.condition.lock().expect("device full condition lock")
    }

    pub fn is_full(&self) -> bool {
        self.lock().is_some()
    }

    pub fn status(&self) -> Option<DeviceFullStatus> {
        self.lock().as_ref().map(|condition| DeviceFullStatus {
            reason: condition.reason.clone(),
            since_unix_seconds: condition.since_unix_seconds,
            waiting_batch_count: condition.waiting_batch_count,
        })
    }

    /// A batch write is tried again after finding the device full.
    pub(in crate::pool) fn retried(&self) {
        self.retries_total.fetch_add(1, Ordering::Relaxed);
    }

    pub fn retries_total(&self) -> u64 {
        self.retries_total.load(Ordering::Relaxed)
    }

    /// A batch write found the device full and starts waiting for space; the
    /// first one of an episode logs the condition.
    pub(in crate::pool) fn batch_waits(
        &self,
        error: &DeviceError,
        retry_interval_ms: u64,
        wait_ms_max: u64,
    ) {
        let mut condition = self.lock();
        match condition.as_mut() {
            Some(condition) => condition.waiting_batch_count += 1,
            None => {
                tracing::warn!(
                    %error,
                    retry_interval_ms,
                    wait_ms_max,
                    "the device under the pool is out of space: batch writes wait and are \
                     retried, writes and flushes fail with ENOSPC after waiting; free space on the file \
                     system or device and writing resumes by itself"
                );
                *condition = Some(Condition {
                    reason: error.to_string(),
                    since: Instant::now(),
                    since_unix_seconds: crate::clock::now_unix_seconds(),
                    waiting_batch_count: 1,
                });
            }
        }
    }

    /// A batch that waited for space stopped waiting (written, or failed for
    /// another reason); the last one ends the episode.
    pub(in crate::pool) fn batch_stopped_waiting(&self, written: bool) {
        let mut guard = self.lock();
        let condition = guard
            .as_mut()
            .expect("a waiting batch implies the device-full condition");
        condition.waiting_batch_count -= 1;
        if condition.waiting_batch_count == 0 {
            if written {
                tracing::info!(
                    full_for_ms = milliseconds_saturating(condition.since.elapsed()),
                    "space returned under the pool: waiting batch writes completed"
                );
            }
            *guard = None;
        }
    }
}
