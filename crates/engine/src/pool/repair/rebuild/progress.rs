//! The rebuild's progress and findings: counters the rebuild (`rebuild/mod.rs`)
//! updates and `pool status` reads (bytes done and to do, rate, time left),
//! owned here so that the pool's shared state needs nothing of the rebuild.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::EngineError;

/// What the rebuild is doing, named as mdadm and zpool name it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RebuildState {
    /// No rebuild since the pool opened.
    #[default]
    None,
    Rebuilding,
    Finished,
    /// The rebuild stopped: see `error`.
    Failed,
}

/// Where a rebuild puts what the lost device held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RebuildKind {
    /// Onto a new device taking the lost one's place (`device replace`).
    #[default]
    Replacement,
    /// Into the free space of the devices left: the data of every segment
    /// with a column on the lost device moves to segments laid out over the
    /// others (`repair/evacuation.rs`).
    DistributedSpare,
    /// After a device was added: the data of segments narrower than the
    /// array now is moves to segments laid out over every device in use
    /// (`device add --rebalance`).
    Rebalance,
}

/// The latest rebuild's progress (since the pool opened).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RebuildStatus {
    pub state: RebuildState,
    pub kind: RebuildKind,
    /// Bytes the pool keeps (metadata and segments in use) to rebuild.
    pub bytes_total: u64,
    pub bytes_done: u64,
    /// Of `bytes_done`, those that needed no work: what the replacement
    /// held already (a rebuild resumed after a restart, from its label) or
    /// never holds (regions laid out without it).
    pub bytes_skipped: u64,
    /// Over the rebuild so far, of the bytes that needed work.
    pub bytes_per_second: u64,
    /// At the rate so far; absent until there is a rate.
    pub seconds_left: Option<u64>,
    /// Rows whose data passed every checksum the pool knows.
    pub rows_verified: u64,
    /// Blocks no reconstruction made pass their checksum (reading them is an
    /// I/O error, as before the rebuild).
    pub blocks_unrepairable: u64,
    pub elapsed_ms: u64,
    pub error: Option<String>,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct Rebuilder {
    running: AtomicBool,
    pub(in crate::pool) bytes_total: AtomicU64,
    pub(in crate::pool) bytes_done: AtomicU64,
    pub(in crate::pool) bytes_skipped: AtomicU64,
    pub(in crate::pool) rows_verified: AtomicU64,
    pub(in crate::pool) blocks_unrepairable: AtomicU64,
    outcome: Mutex<RebuildOutcome>,
}

#[derive(Debug, Default)]
struct RebuildOutcome {
    state: RebuildState,
    kind: RebuildKind,
    started: Option<Instant>,
    elapsed: Duration,
    error: Option<String>,
}

impl Rebuilder {
    /// Starts a rebuild; false if one is running.
    pub(in crate::pool) fn start(&self, kind: RebuildKind) -> bool {
        if self.running.swap(true, Ordering::SeqCst) {
            return false;
        }
        for counter in [
            &self.bytes_total,
            &self.bytes_done,
            &self.bytes_skipped,
            &self.rows_verified,
            &self.blocks_unrepairable,
        ] {
            counter.store(0, Ordering::Relaxed);
        }
        *self.outcome.lock().expect("rebuild outcome lock") = RebuildOutcome {
            state: RebuildState::Rebuilding,
            kind,
            started: Some(Instant::now()),
            elapsed: Duration::ZERO,
            error: None,
        };
        true
    }

    /// Logs how a rebuild of either kind ended, records it for status, and
    /// answers with the final status.
    pub(in crate::pool) fn end(
        &self,
        result: Result<(), EngineError>,
    ) -> Result<RebuildStatus, EngineError> {
        let error = result.as_ref().err().map(ToString::to_string);
        match &error {
            Some(error) => tracing::error!(%error, "rebuild failed"),
            None => tracing::warn!(status = ?self.status(), "rebuild finished"),
        }
        self.finish(error);
        result.map(|()| self.status())
    }

    fn finish(&self, error: Option<String>) {
        let mut outcome = self.outcome.lock().expect("rebuild outcome lock");
        outcome.elapsed = outcome
            .started
            .map(|started| started.elapsed())
            .unwrap_or_default();
        outcome.started = None;
        outcome.state = match error {
            Some(_) => RebuildState::Failed,
            None => RebuildState::Finished,
        };
        outcome.error = error;
        self.running.store(false, Ordering::SeqCst);
    }

    pub fn status(&self) -> RebuildStatus {
        let outcome = self.outcome.lock().expect("rebuild outcome lock");
        let elapsed = outcome
            .started
            .map_or(outcome.elapsed, |started| started.elapsed());
        let bytes_total = self.bytes_total.load(Ordering::Relaxed);
        let bytes_done = self.bytes_done.load(Ordering::Relaxed);
        let bytes_skipped = self.bytes_skipped.load(Ordering::Relaxed);
        let seconds = elapsed.as_secs_f64();
        // Skipped bytes pass at once: counted in the rate, they would
        // promise a resumed rebuild's remaining work far too soon.
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let bytes_per_second = if seconds > 0.0 {
            (bytes_done.saturating_sub(bytes_skipped) as f64 / seconds) as u64
        } else {
            0
        };
        let seconds_left = (outcome.state == RebuildState::Rebuilding && bytes_per_second > 0)
            .then(|| bytes_total.saturating_sub(bytes_done) / bytes_per_second);
        RebuildStatus {
            state: outcome.state,
            kind: outcome.kind,
            bytes_total,
            bytes_done,
            bytes_skipped,
            bytes_per_second,
            seconds_left,
            rows_verified: self.rows_verified.load(Ordering::Relaxed),
            blocks_unrepairable: self.blocks_unrepairable.load(Ordering::Relaxed),
            elapsed_ms: u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
            error: outcome.error.clone(),
        }
    }
}
