//! Background activity, supervised: one scaffold ([`spawn_periodic`]) runs
//! each of the pool's periodic tasks — the flush-and-checkpoint loop here,
//! the paced cleaner (`cleaner::pacing`) and the demoter
//! (`tiering::demoter`) — under the pool's supervisor
//! (`core::supervisor`), which keeps their join handles and stops them in
//! order. The scaffold owns what the tasks share: the tokio timer (so that
//! tests can pause and advance time), holding the pool only weakly between
//! steps (its own tasks must not keep a dropped pool alive), stopping once
//! the pool is closed, abandoned, dropped or failed, and logging a failed
//! step. The tasks are the steps.
//!
//! Also here: the flush a write starts when unflushed data exceeds
//! `dirty_bytes_max`, the usage warnings, and `close`/`abandon`, which stop
//! background work: `close` waits for the tasks to end, `abandon` (a crash,
//! for tests) only tells them to.

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{EngineError, IoError};
use crate::pool::core::{Inner, Pool};

/// A periodic background task: what it does on each tick, and the state it
/// keeps between ticks.
pub(super) trait Periodic: Send + 'static {
    /// What the task does, for its error messages ("{NAME} failed").
    const NAME: &'static str;

    /// One tick's work. Errors are logged and the task goes on at the next
    /// tick; `EngineError::NoSpace` is not logged (space ran out under the
    /// task too: blocked writers reclaim for themselves).
    fn step(&mut self, pool: &Pool) -> impl Future<Output = Result<(), EngineError>> + Send;
}

/// Runs `task` every `interval_ms` (tokio's clock; a step that takes longer
/// delays the next tick, ticks are not made up) until the pool is shut down,
/// dropped or failed. Between ticks the task holds the pool only weakly.
pub(super) fn spawn_periodic<T: Periodic>(pool: &Pool, interval_ms: u64, mut task: T) {
    assert!(
        interval_ms > 0,
        "PoolLimits::validate refuses 0 ms intervals"
    );
    let interval = Duration::from_millis(interval_ms);
    let weak: Weak<Inner> = Arc::downgrade(&pool.inner);
    let mut stop = pool.inner.supervisor.stop_signal();
    let run = async move {
        loop {
            // The sleep ends early when the pool stops, so that `close`
            // does not wait a whole interval for the task to end.
            if tokio::time::timeout(interval, stop.stopped()).await.is_ok() {
                return;
            }
            let Some(inner) = weak.upgrade() else { return };
            let pool = Pool { inner };
            if pool.background_stopped() || pool.inner.lock().writer().failed().is_some() {
                return;
            }
            match task.step(&pool).await {
                // A capacity tier that cannot make its writes durable is
                // logged when its state changes (`capacity_writes`), not at
                // every tick that meets it.
                Ok(())
                | Err(EngineError::Io(IoError::NoSpace | IoError::CapacityUnavailable { .. })) => {}
                Err(error) => tracing::error!(%error, "{} failed", T::NAME),
            }
        }
    };
    pool.inner.supervisor.spawn(T::NAME, run);
}

/// The flush-and-checkpoint loop: flushes when unflushed data gets older than
/// `flush_interval_ms`, checkpoints when `checkpoint_interval_bytes` of log
/// has accumulated or `checkpoint_interval_ms` has passed, warns about used
/// space, and cleans in passes when the paced cleaner is off.
struct FlushAndCheckpoint {
    last_checkpoint: Instant,
    /// The usage warning threshold last crossed (0: none).
    warned_percent: u8,
    /// When the loop last looked for a rebuild to start.
    last_rebuild_check: Instant,
    /// When it last warned that no rebuild can restore the redundancy
    /// (`None` while one can, or nothing is degraded).
    last_blocked_warning: Option<Instant>,
}

/// How often the background loop looks for lost redundancy to restore
/// (a device lost by an I/O error, rather than `lamina device fail`).
pub const REBUILD_CHECK_INTERVAL_MS: u64 = 5_000;

/// How often, at most, the log repeats that no rebuild can restore the
/// pool's redundancy while that lasts (a warning logged once scrolls away,
/// and a reader of the log later cannot tell it still holds).
pub const REBUILD_BLOCKED_WARNING_INTERVAL_MS: u64 = 60_000;

impl FlushAndCheckpoint {
    /// `warned_blocked`: the opening pool has just warned that no rebuild
    /// can run, so the loop's first warning waits its interval.
    fn new(warned_blocked: bool) -> Self {
        Self {
            last_checkpoint: Instant::now(),
            warned_percent: 0,
            last_rebuild_check: Instant::now(),
            last_blocked_warning: warned_blocked.then(Instant::now),
        }
    }

    /// Starts a rebuild the devices beneath call for, every
    /// [`REBUILD_CHECK_INTERVAL_MS`]; while none can run although the pool
    /// has less redundancy than it was made with, says why, again every
    /// [`REBUILD_BLOCKED_WARNING_INTERVAL_MS`].
    fn check_rebuild(&mut self, pool: &Pool) {
        if self.last_rebuild_check.elapsed() < Duration::from_millis(REBUILD_CHECK_INTERVAL_MS) {
            return;
        }
        self.last_rebuild_check = Instant::now();
        pool.start_rebuild();
        let Some(blocked) = pool.rebuild_blocked() else {
            self.last_blocked_warning = None;
            return;
        };
        let due = self.last_blocked_warning.is_none_or(|warned| {
            warned.elapsed() >= Duration::from_millis(REBUILD_BLOCKED_WARNING_INTERVAL_MS)
        });
        if due {
            warn_rebuild_blocked(blocked);
            self.last_blocked_warning = Some(Instant::now());
        }
    }
}

/// The log's word that the pool runs with less redundancy than it was made
/// with and no rebuild restores it.
fn warn_rebuild_blocked(blocked: crate::pool::repair::evacuation::RebuildBlocked) {
    tracing::warn!(
        reason = %blocked,
        "redundancy is reduced and no rebuild can restore it"
    );
}

/// What the flush-and-checkpoint loop sees of the pool at a tick.
struct Dirt {
    /// Records not yet durable.
    unflushed: bool,
    log_bytes_since_checkpoint: u64,
    /// Dead segments that only checkpoints free.
    dead_segments_wait_for_checkpoints: bool,
}

impl Periodic for FlushAndCheckpoint {
    const NAME: &'static str = "background flush and checkpoint";

    /// Each part logs its own error, so that a failed flush does not keep the
    /// checkpoint from being tried.
    async fn step(&mut self, pool: &Pool) -> Result<(), EngineError> {
        if pool.inner.device_full.is_full() {
            // Flushing or checkpointing would only wait for space.
            return Ok(());
        }
        let dirt = pool.dirt();
        if dirt.unflushed {
            // Both tiers, so that what was demoted becomes durable and frees
            // its flash segments; flash alone while the capacity tier's
            // writes are suspended (its retries are the demoter's).
            let flushed = if pool.capacity_writes_suspended() {
                pool.flush().await
            } else {
                pool.flush_all().await
            };
            match flushed {
                Ok(()) | Err(EngineError::Io(IoError::CapacityUnavailable { .. })) => {}
                Err(error) => tracing::error!(%error, "background flush failed"),
            }
        }
        if let Err(error) = pool.flush_marker_durably().await {
            tracing::error!(%error, "background flush of the flush marker failed");
        }
        let limits = &pool.inner.limits;
        let due_by_time = (dirt.log_bytes_since_checkpoint > 0
            || dirt.dead_segments_wait_for_checkpoints)
            && self.last_checkpoint.elapsed()
                >= Duration::from_millis(limits.checkpoint_interval_ms);
        pool.warn_about_usage(&mut self.warned_percent);
        self.check_rebuild(pool);
        if let Err(error) = pool.clean_in_background().await {
            tracing::error!(%error, "background cleaning failed");
        }
        if dirt.log_bytes_since_checkpoint >= limits.checkpoint_interval_bytes || due_by_time {
            self.last_checkpoint = Instant::now();
            match pool.checkpoint().await {
                Ok(()) | Err(EngineError::Io(IoError::CapacityUnavailable { .. })) => {}
                Err(error) => tracing::error!(%error, "background checkpoint failed"),
            }
        }
        Ok(())
    }
}

impl Pool {
    /// Starts the pool's periodic background tasks.
    pub(super) fn start_background(&self) {
        let limits = &self.inner.limits;
        // A rebuild cut short by a crash or a close resumes; if none can,
        // the log says so now, not at the first periodic check.
        self.start_rebuild();
        let blocked = self.rebuild_blocked();
        if let Some(blocked) = blocked {
            warn_rebuild_blocked(blocked);
        }
        if !limits.test_hooks.periodic_flush_and_checkpoint_off {
            let task = FlushAndCheckpoint::new(blocked.is_some());
            spawn_periodic(self, limits.flush_interval_ms, task);
        }
        self.start_paced_cleaner();
        self.start_demoter();
    }

    /// Whether the pool was closed or abandoned: background work stops.
    pub(super) fn background_stopped(&self) -> bool {
        self.inner.supervisor.is_stopping()
    }

    fn dirt(&self) -> Dirt {
        let state = self.inner.lock();
        // Dead segments written since the older checkpoint become free only
        // through checkpoints (the others through the flush); an idle pool
        // must still take them, or trimmed space never returns.
        let dead_segments_wait_for_checkpoints =
            state.space().any_dead_segment_waits_for_checkpoints();
        Dirt {
            unflushed: state.writer().has_unsealed_records()
                || state.writer().sealed_through() > state.writer().durable_through(),
            log_bytes_since_checkpoint: state
                .checkpoint_schedule()
                .bytes_since_last(state.counters().sealed_bytes()),
            dead_segments_wait_for_checkpoints,
        }
    }

    /// Starts a flush in the background when unflushed data exceeds
    /// `dirty_bytes_max` and no flush is running (writers call this).
    pub(super) fn maybe_flush_in_background(&self) {
        let over = {
            let state = self.inner.lock();
            state.counters().unflushed_bytes() > self.inner.limits.dirty_bytes_max
        };
        // On a full device a flush cannot finish; writers are held back by
        // the in-flight limit instead, and the next client flush reports it.
        let over = over && !self.inner.device_full.is_full();
        if over && self.inner.flush_lock.try_lock().is_ok() {
            let pool = self.clone();
            self.inner.supervisor.spawn("background flush", async move {
                if let Err(error) = pool.flush().await {
                    tracing::error!(%error, "background flush failed");
                }
            });
        }
    }

    /// Logs a warning when used space crosses a configured threshold upward,
    /// and a note when it falls back below.
    fn warn_about_usage(&self, warned_percent: &mut u8) {
        let status = self.status();
        let crossed = status.usage_warning_percent;
        if crossed > *warned_percent {
            tracing::warn!(
                used_percent = format!("{:.1}", status.used_percent),
                threshold_percent = crossed,
                free_bytes = status.free_bytes,
                "pool space is running low: trim or delete data, or add capacity"
            );
        } else if crossed < *warned_percent {
            tracing::info!(
                used_percent = format!("{:.1}", status.used_percent),
                "pool space usage dropped"
            );
        }
        *warned_percent = crossed;
    }

    /// Flushes, writes a final checkpoint (so the next open replays nothing) and
    /// stops background work, waiting for each task to end its step.
    /// While the capacity tier's writes are suspended the checkpoint is
    /// skipped with a warning: what clients wrote is durable on flash and the
    /// next open replays it (decision 0032).
    pub async fn close(&self) -> Result<(), EngineError> {
        self.flush().await?;
        self.inner.flush_marker.settled().await;
        match self.checkpoint().await {
            Ok(()) => {}
            Err(EngineError::Io(IoError::CapacityUnavailable { device, error })) => {
                tracing::warn!(
                    device,
                    error,
                    "closed without a final checkpoint: the capacity tier is unavailable; \
                     the next open replays the log"
                );
            }
            Err(error) => return Err(error),
        }
        self.inner.supervisor.stop().await;
        Ok(())
    }

    /// Stops background work without flushing: what a crash leaves behind, for tests.
    pub fn abandon(&self) {
        self.inner.supervisor.signal_stop();
    }
}
