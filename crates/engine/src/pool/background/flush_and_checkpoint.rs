//! The flush-and-checkpoint service: on each tick it flushes when unflushed
//! data gets older than `flush_interval_ms`, checkpoints when
//! `checkpoint_interval_bytes` of log has accumulated or
//! `checkpoint_interval_ms` has passed, warns about used space, looks for a
//! rebuild to start, and cleans in passes when the paced cleaner is off. It
//! owns what it keeps between ticks, holds the pool's core only weakly
//! between them, and builds on the core the services it calls (the cleaner,
//! the checkpointer, a rebuild or an evacuation).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{EngineError, IoError};
use crate::pool::background::periodic::Periodic;
use crate::pool::checkpoint::Checkpointer;
use crate::pool::cleaner::Cleaner;
use crate::pool::core::Core;
use crate::pool::repair::evacuation::Evacuation;
use crate::pool::repair::rebuild::Rebuild;

/// The flush-and-checkpoint loop: flushes when unflushed data gets older than
/// `flush_interval_ms`, checkpoints when `checkpoint_interval_bytes` of log
/// has accumulated or `checkpoint_interval_ms` has passed, warns about used
/// space, and cleans in passes when the paced cleaner is off.
pub(super) struct FlushAndCheckpoint {
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
    pub(super) fn new(warned_blocked: bool) -> Self {
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
    fn check_rebuild(&mut self, core: &Arc<Core>) {
        if self.last_rebuild_check.elapsed() < Duration::from_millis(REBUILD_CHECK_INTERVAL_MS) {
            return;
        }
        self.last_rebuild_check = Instant::now();
        Rebuild::new(core).start();
        let Some(blocked) = Evacuation::new(core).blocked() else {
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
pub(super) fn warn_rebuild_blocked(blocked: crate::pool::repair::evacuation::RebuildBlocked) {
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
    async fn step(&mut self, core: &Arc<Core>) -> Result<(), EngineError> {
        if core.device_full().is_full() {
            // Flushing or checkpointing would only wait for space.
            return Ok(());
        }
        let dirt = dirt(core);
        if dirt.unflushed {
            // Both tiers, so that what was demoted becomes durable and frees
            // its flash segments; flash alone while the capacity tier's
            // writes are suspended (its retries are the demoter's).
            let flushed = if core.capacity_writes_suspended() {
                core.flush().await
            } else {
                core.flush_all().await
            };
            match flushed {
                Ok(()) | Err(EngineError::Io(IoError::CapacityUnavailable { .. })) => {}
                Err(error) => tracing::error!(%error, "background flush failed"),
            }
        }
        if let Err(error) = core.flush_marker_durably().await {
            tracing::error!(%error, "background flush of the flush marker failed");
        }
        let limits = core.limits();
        let due_by_time = (dirt.log_bytes_since_checkpoint > 0
            || dirt.dead_segments_wait_for_checkpoints)
            && self.last_checkpoint.elapsed()
                >= Duration::from_millis(limits.checkpoint_interval_ms);
        warn_about_usage(core, &mut self.warned_percent);
        self.check_rebuild(core);
        if let Err(error) = Cleaner::new(core).clean_in_background().await {
            tracing::error!(%error, "background cleaning failed");
        }
        if dirt.log_bytes_since_checkpoint >= limits.checkpoint_interval_bytes || due_by_time {
            self.last_checkpoint = Instant::now();
            match Checkpointer::new(core).checkpoint().await {
                Ok(()) | Err(EngineError::Io(IoError::CapacityUnavailable { .. })) => {}
                Err(error) => tracing::error!(%error, "background checkpoint failed"),
            }
        }
        Ok(())
    }
}

/// What the loop sees of the pool now.
fn dirt(core: &Core) -> Dirt {
    let state = core.lock();
    // Dead segments written since the older checkpoint become free only
    // through checkpoints (the others through the flush); an idle pool
    // must still take them, or trimmed space never returns.
    let dead_segments_wait_for_checkpoints = state.space().any_dead_segment_waits_for_checkpoints();
    Dirt {
        unflushed: state.writer().has_unsealed_records()
            || state.writer().sealed_through() > state.writer().durable_through(),
        log_bytes_since_checkpoint: state
            .checkpoint_schedule()
            .bytes_since_last(state.counters().sealed_bytes()),
        dead_segments_wait_for_checkpoints,
    }
}

/// Logs a warning when used space crosses a configured threshold upward,
/// and a note when it falls back below.
fn warn_about_usage(core: &Core, warned_percent: &mut u8) {
    let status = core.status();
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
