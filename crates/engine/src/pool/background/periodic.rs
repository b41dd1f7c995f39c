//! The scaffold every periodic background task runs on
//! ([`spawn_periodic`]): the tokio timer (so that tests can pause and
//! advance time), holding the pool only weakly between steps (its own tasks
//! must not keep a dropped pool alive), stopping once the pool is closed,
//! abandoned, dropped or failed, and logging a failed step. The tasks are
//! the steps; the supervisor (`core::supervisor`) holds their handles.

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::error::{EngineError, IoError};
use crate::pool::core::Core;

/// A periodic background task: what it does on each tick, and the state it
/// keeps between ticks.
pub(in crate::pool) trait Periodic: Send + 'static {
    /// What the task does, for its error messages ("{NAME} failed").
    const NAME: &'static str;

    /// One tick's work on the pool's core (the task builds the services
    /// it calls on it: the cleaner, the checkpointer). Errors are logged and the task goes on at the next
    /// tick; `EngineError::NoSpace` is not logged (space ran out under the
    /// task too: blocked writers reclaim for themselves).
    fn step(&mut self, core: &Arc<Core>) -> impl Future<Output = Result<(), EngineError>> + Send;
}

/// Runs `task` every `interval_ms` (tokio's clock; a step that takes longer
/// delays the next tick, ticks are not made up) until the pool is shut down,
/// dropped or failed. Between ticks the task holds the pool only weakly.
pub(in crate::pool) fn spawn_periodic<T: Periodic>(
    core: &Arc<Core>,
    interval_ms: u64,
    mut task: T,
) {
    assert!(
        interval_ms > 0,
        "PoolLimits::validate refuses 0 ms intervals"
    );
    let interval = Duration::from_millis(interval_ms);
    let weak: Weak<Core> = Arc::downgrade(core);
    let mut stop = core.supervisor().stop_signal();
    let run = async move {
        loop {
            // The sleep ends early when the pool stops, so that `close`
            // does not wait a whole interval for the task to end.
            if tokio::time::timeout(interval, stop.stopped()).await.is_ok() {
                return;
            }
            let Some(core) = weak.upgrade() else { return };
            if core.background_stopped() || core.lock().writer().failed().is_some() {
                return;
            }
            match task.step(&core).await {
                // A capacity tier that cannot make its writes durable is
                // logged when its state changes (`capacity_writes`), not at
                // every tick that meets it.
                Ok(())
                | Err(EngineError::Io(IoError::NoSpace | IoError::CapacityUnavailable { .. })) => {}
                Err(error) => tracing::error!(%error, "{} failed", T::NAME),
            }
        }
    };
    core.supervisor().spawn(T::NAME, run);
}
