//! The supervisor's policy: which background services run, started in
//! order when the pool opens and stopped in the reverse order when it
//! closes (the handles and the stop signal are the core's,
//! `core::supervisor`). The services: the flush-and-checkpoint loop
//! ([`flush_and_checkpoint`]), the paced cleaner (`cleaner::pacing`) and the
//! demoter (`tiering::demoter`), each a struct that owns its state, run on
//! one scaffold ([`periodic`]); a rebuild, an evacuation and the memory
//! cache's warm-up run once under the same supervisor.
//!
//! Also here: the flush a write starts when unflushed data exceeds
//! `dirty_bytes_max`, and the work behind `Pool::close` (which waits for the
//! services to end) and `Pool::abandon` (a crash, for tests: it only tells
//! them to).

mod flush_and_checkpoint;
pub(in crate::pool) mod periodic;

use std::sync::Arc;

use flush_and_checkpoint::{FlushAndCheckpoint, warn_rebuild_blocked};
use periodic::spawn_periodic;

use crate::error::{EngineError, IoError};
use crate::pool::checkpoint::Checkpointer;
use crate::pool::cleaner::pacing::Pacer;
use crate::pool::core::Core;
use crate::pool::repair::evacuation::Evacuation;
use crate::pool::repair::rebuild::Rebuild;
use crate::pool::tiering::demoter::Demoter;

/// Starts the pool's background services, in order: a rebuild cut short
/// (or one the devices call for), the flush-and-checkpoint loop, the paced
/// cleaner, the demoter. [`close`] stops them in the reverse order.
pub(in crate::pool) fn start(core: &Arc<Core>) {
    let limits = core.limits();
    // A rebuild cut short by a crash or a close resumes; if none can,
    // the log says so now, not at the first periodic check.
    Rebuild::new(core).start();
    let blocked = Evacuation::new(core).blocked();
    if let Some(blocked) = blocked {
        warn_rebuild_blocked(blocked);
    }
    if !limits.test_hooks.periodic_flush_and_checkpoint_off {
        let task = FlushAndCheckpoint::new(blocked.is_some());
        spawn_periodic(core, limits.flush_interval_ms, task);
    }
    Pacer::start(core);
    Demoter::start(core);
}

/// Starts a flush in the background when no flush is running; writers
/// call this when their append found unflushed data over `dirty_bytes_max`
/// (in the append's own hold of the state lock).
pub(in crate::pool) fn flush_over_dirty_limit(core: &Arc<Core>) {
    // On a full device a flush cannot finish; writers are held back by
    // the in-flight limit instead, and the next client flush reports it.
    if !core.device_full().is_full() && core.flush_lock().try_lock().is_ok() {
        let flushing = core.clone();
        core.supervisor().spawn("background flush", async move {
            if let Err(error) = flushing.flush().await {
                tracing::error!(%error, "background flush failed");
            }
        });
    }
}

/// Flushes, writes a final checkpoint (so the next open replays nothing) and
/// stops background work, waiting for each task to end its step.
/// While the capacity tier's writes are suspended the checkpoint is
/// skipped with a warning: what clients wrote is durable on flash and the
/// next open replays it (decision 0032).
pub(in crate::pool) async fn close(core: &Arc<Core>) -> Result<(), EngineError> {
    core.flush().await?;
    core.flush_marker().settled().await;
    core.count_flush_marker_bytes();
    match Checkpointer::new(core).checkpoint().await {
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
    core.supervisor().stop().await;
    Ok(())
}

/// Stops background work without flushing: what a crash leaves behind.
pub(in crate::pool) fn abandon(core: &Core) {
    core.supervisor().signal_stop();
}
