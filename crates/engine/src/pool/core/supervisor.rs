//! The supervisor of the pool's long-running background tasks: it holds the
//! join handle of every task it started, the one signal that tells them to
//! stop, and stops them in order. What runs and when is decided by the
//! background module (`pool/background.rs`); this part is kept in the core,
//! below every task, so that the core can own it without naming the tasks
//! (and the tasks can reach it through the core).
//!
//! Stopping is cooperative: a task sees the signal between its steps (its
//! sleep ends at once) and ends after the step it is in; nothing is
//! cancelled in the middle of a device write or a checkpoint.

use std::future::Future;
use std::sync::Mutex;

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The pool's background tasks and their stop signal.
pub(crate) struct Supervisor {
    /// `true` once the pool is closed or abandoned.
    stopping: watch::Sender<bool>,
    /// The tasks started, in start order.
    tasks: Mutex<Vec<SupervisedTask>>,
}

/// One task the supervisor started.
struct SupervisedTask {
    /// What the task does, for the log.
    name: &'static str,
    handle: JoinHandle<()>,
}

/// What a task waits on to learn that it must stop.
pub(crate) struct StopSignal {
    stopping: watch::Receiver<bool>,
}

impl StopSignal {
    /// Resolves once the supervisor is stopping (or gone with its pool).
    pub(crate) async fn stopped(&mut self) {
        // An error means the pool's core was dropped: stop as well.
        let _ = self.stopping.wait_for(|stopping| *stopping).await;
    }
}

impl Default for Supervisor {
    fn default() -> Self {
        let (stopping, _) = watch::channel(false);
        Self {
            stopping,
            tasks: Mutex::new(Vec::new()),
        }
    }
}

impl Supervisor {
    /// Whether the pool was closed or abandoned: background work stops,
    /// and batch writes stop retrying on a full device.
    pub(crate) fn is_stopping(&self) -> bool {
        *self.stopping.borrow()
    }

    /// The signal a task waits on between its steps.
    pub(crate) fn stop_signal(&self) -> StopSignal {
        StopSignal {
            stopping: self.stopping.subscribe(),
        }
    }

    /// Starts `task` on the current runtime and keeps its handle. Handles
    /// of tasks that have ended are let go of here.
    pub(crate) fn spawn(
        &self,
        name: &'static str,
        task: impl Future<Output = ()> + Send + 'static,
    ) {
        let handle = tokio::spawn(task);
        let mut tasks = self.tasks.lock().expect("supervisor lock poisoned");
        tasks.retain(|task| !task.handle.is_finished());
        tasks.push(SupervisedTask { name, handle });
    }

    /// Tells every task to stop, without waiting: what a crash leaves
    /// behind (`Pool::abandon`), and the first half of [`Self::stop`].
    pub(crate) fn signal_stop(&self) {
        self.stopping.send_replace(true);
    }

    /// Tells every task to stop and waits for each to end, newest first
    /// (the reverse of the order they were started in: the background
    /// module starts the flush-and-checkpoint loop first, so that it is the
    /// last to end).
    pub(crate) async fn stop(&self) {
        self.signal_stop();
        let tasks = std::mem::take(&mut *self.tasks.lock().expect("supervisor lock poisoned"));
        for task in tasks.into_iter().rev() {
            if let Err(error) = task.handle.await {
                tracing::error!(task = task.name, %error, "a background task ended abnormally");
            }
        }
    }
}
