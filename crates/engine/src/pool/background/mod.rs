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

use flush_and_checkpoint::{FlushAndCheckpoint, warn_rebuild_blocked};
use periodic::spawn_periodic;

use crate::error::{EngineError, IoError};
use crate::pool::checkpoint::Checkpointer;
use crate::pool::cleaner::pacing::Pacer;
use crate::pool::core::Pool;
use crate::pool::tiering::demoter::Demoter;

/// Starts the pool's background services, in order: a rebuild cut short
/// (or one the devices call for), the flush-and-checkpoint loop, the paced
/// cleaner, the demoter. [`close`] stops them in the reverse order.
pub(in crate::pool) fn start(pool: &Pool) {
    let limits = &pool.inner.limits;
    // A rebuild cut short by a crash or a close resumes; if none can,
    // the log says so now, not at the first periodic check.
    pool.start_rebuild();
    let blocked = pool.rebuild_blocked();
    if let Some(blocked) = blocked {
        warn_rebuild_blocked(blocked);
    }
    if !limits.test_hooks.periodic_flush_and_checkpoint_off {
        let task = FlushAndCheckpoint::new(blocked.is_some());
        spawn_periodic(pool, limits.flush_interval_ms, task);
    }
    Pacer::start(pool);
    Demoter::start(pool);
}

/// Starts a flush in the background when unflushed data exceeds
/// `dirty_bytes_max` and no flush is running (writers call this).
pub(in crate::pool) fn flush_when_over_dirty_limit(pool: &Pool) {
    let over = {
        let state = pool.inner.lock();
        state.counters().unflushed_bytes() > pool.inner.limits.dirty_bytes_max
    };
    // On a full device a flush cannot finish; writers are held back by
    // the in-flight limit instead, and the next client flush reports it.
    let over = over && !pool.inner.device_full.is_full();
    if over && pool.inner.flush_lock.try_lock().is_ok() {
        let flushing = pool.clone();
        pool.inner.supervisor.spawn("background flush", async move {
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
pub(in crate::pool) async fn close(pool: &Pool) -> Result<(), EngineError> {
    pool.flush().await?;
    pool.inner.flush_marker.settled().await;
    match Checkpointer::new(&pool.inner).checkpoint().await {
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
    pool.inner.supervisor.stop().await;
    Ok(())
}

/// Stops background work without flushing: what a crash leaves behind.
pub(in crate::pool) fn abandon(pool: &Pool) {
    pool.inner.supervisor.signal_stop();
}
