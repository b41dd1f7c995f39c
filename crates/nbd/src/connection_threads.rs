//! Connection threads: a fixed set of OS threads, each running a tokio runtime
//! of its own on that one thread, among which the accept loops place new
//! connections (decision 0048). A connection stays on its thread from its
//! handshake to its last reply, and so do the device requests it starts (each
//! thread has its own io_uring per device) and the engine's tasks it spawns
//! (the writes of the batches it seals): a request is read, served, completed
//! and answered without waking another thread. On the 2-core machines these
//! are measured on, a hand-off between threads was a quarter of the daemon's
//! CPU per cache-miss read (BENCHMARKS.md, issue 20).

use std::cell::RefCell;
use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// Most connection threads a server may start: more threads than this buy
/// nothing on any machine lamina targets and only cost memory and descriptors.
pub const CONNECTION_THREADS_MAX: usize = 256;

/// The default of [`ConnectionThreadOptions::idle_spin_us`]: no spin. On the
/// 2-core machines measured, with the client on the same machine, any spin
/// (30 or 100 µs) made cache-miss reads at queue depth 1 slower (p50 105-111
/// against 82-85 µs) and cost a core; with the client on a core of its own,
/// a 100 µs spin made them faster (104 against 124 µs) and cache hits much
/// faster (29 against 68 µs). A controller with cores to spare may turn it on
/// (BENCHMARKS.md, "Connection threads").
pub const IDLE_SPIN_US_DEFAULT: u64 = 0;

/// Longest idle spin allowed: past a millisecond a sleep is cheaper.
pub const IDLE_SPIN_US_MAX: u64 = 1_000;

/// A readiness check a thread may call while it spins.
pub type ReadyCheck = Arc<dyn Fn() -> bool + Send + Sync>;

/// How connection threads wait when they have nothing to do.
#[derive(Clone)]
pub struct ConnectionThreadOptions {
    /// Longest time a thread with connections but nothing to run looks for a
    /// request on its connections' sockets, or for `ready`, before it sleeps
    /// (0, the default: it sleeps at once). What it finds then costs no
    /// wake-up of the thread, but the spin costs the core.
    pub idle_spin_us: u64,
    /// Something else worth spinning for: in the daemon, completions of the
    /// thread's device rings.
    pub ready: Option<ReadyCheck>,
}

impl Default for ConnectionThreadOptions {
    fn default() -> Self {
        Self {
            idle_spin_us: IDLE_SPIN_US_DEFAULT,
            ready: None,
        }
    }
}

thread_local! {
    /// The sockets of the connections this thread serves, for the idle spin.
    static CONNECTION_SOCKETS: RefCell<Vec<libc::pollfd>> = const { RefCell::new(Vec::new()) };
}

/// A connection's socket in its thread's idle spin, while this lives. Made and
/// dropped on the connection's thread.
pub(crate) struct SpinRegistration(RawFd);

impl SpinRegistration {
    pub(crate) fn new(socket: RawFd) -> Self {
        CONNECTION_SOCKETS.with(|sockets| {
            sockets.borrow_mut().push(libc::pollfd {
                fd: socket,
                events: libc::POLLIN,
                revents: 0,
            });
        });
        Self(socket)
    }
}

impl Drop for SpinRegistration {
    fn drop(&mut self) {
        CONNECTION_SOCKETS.with(|sockets| {
            let mut sockets = sockets.borrow_mut();
            if let Some(position) = sockets.iter().position(|entry| entry.fd == self.0) {
                sockets.swap_remove(position);
            }
        });
    }
}

/// Called just before the thread sleeps: spins for at most `idle_spin_us`
/// while none of its connections' sockets is readable and `ready` says no.
/// Whatever it finds, the runtime's reactor then finds without sleeping.
fn spin_before_sleeping(options: &ConnectionThreadOptions) {
    if options.idle_spin_us == 0 {
        return;
    }
    CONNECTION_SOCKETS.with(|sockets| {
        let mut sockets = sockets.borrow_mut();
        if sockets.is_empty() {
            return;
        }
        let deadline = Instant::now() + Duration::from_micros(options.idle_spin_us);
        let count = libc::nfds_t::try_from(sockets.len()).expect("sockets fit in nfds_t");
        loop {
            // SAFETY: the pointer and count describe the thread's own vector,
            // borrowed for the call; a timeout of 0 never blocks.
            let found = unsafe { libc::poll(sockets.as_mut_ptr(), count, 0) };
            if found != 0 || options.ready.as_ref().is_some_and(|ready| ready()) {
                return;
            }
            if Instant::now() >= deadline {
                return;
            }
            std::hint::spin_loop();
        }
    });
}

/// One thread, its runtime's handle and how many connections it serves.
struct ConnectionThread {
    handle: Handle,
    connection_count: Arc<AtomicUsize>,
    stop: Option<oneshot::Sender<()>>,
    join: Option<JoinHandle<()>>,
}

/// See the module documentation. Dropping it stops every thread, dropping what
/// its runtime still holds: it must outlive the tasks placed on it that matter
/// (the daemon drops it after closing the pool).
pub struct ConnectionThreads {
    threads: Vec<ConnectionThread>,
}

/// Where a connection was placed: the runtime to spawn it on, and its count on
/// that thread, given back when the connection's task ends.
pub(crate) struct Placement {
    pub(crate) handle: Handle,
    pub(crate) guard: PlacementGuard,
}

/// Holds one connection's place in its thread's count.
pub(crate) struct PlacementGuard(Arc<AtomicUsize>);

impl Drop for PlacementGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ConnectionThreads {
    /// Starts `count` threads (1 to [`CONNECTION_THREADS_MAX`]), named
    /// `lamina-nbd-N`.
    pub fn start(count: usize, options: ConnectionThreadOptions) -> io::Result<Self> {
        assert!(
            (1..=CONNECTION_THREADS_MAX).contains(&count),
            "connection thread count out of range: {count}"
        );
        assert!(
            options.idle_spin_us <= IDLE_SPIN_US_MAX,
            "idle spin out of range: {} us",
            options.idle_spin_us
        );
        let threads = (0..count)
            .map(|index| start_thread(index, options.clone()))
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Self { threads })
    }

    /// As many threads as the machine has cores.
    pub fn default_count() -> usize {
        std::thread::available_parallelism()
            .map(usize::from)
            .unwrap_or(1)
            .min(CONNECTION_THREADS_MAX)
    }

    pub fn count(&self) -> usize {
        self.threads.len()
    }

    /// Connections each thread serves now, by thread.
    pub fn connection_counts(&self) -> Vec<usize> {
        self.threads
            .iter()
            .map(|thread| thread.connection_count.load(Ordering::Relaxed))
            .collect()
    }

    /// The thread serving the fewest connections (the first of equals), counted
    /// as serving one more until the returned guard is dropped.
    pub(crate) fn place(&self) -> Placement {
        let thread = self
            .threads
            .iter()
            .min_by_key(|thread| thread.connection_count.load(Ordering::Relaxed))
            .expect("at least one connection thread");
        thread.connection_count.fetch_add(1, Ordering::Relaxed);
        Placement {
            handle: thread.handle.clone(),
            guard: PlacementGuard(thread.connection_count.clone()),
        }
    }
}

fn start_thread(index: usize, options: ConnectionThreadOptions) -> io::Result<ConnectionThread> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_park(move || spin_before_sleeping(&options))
        .thread_name(format!("lamina-nbd-{index}"))
        .build()?;
    let handle = runtime.handle().clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let join = std::thread::Builder::new()
        .name(format!("lamina-nbd-{index}"))
        .spawn(move || {
            // Runs the tasks placed here until the threads are dropped; a
            // dropped sender ends the wait as a send does.
            runtime.block_on(async {
                let _ = stopped.await;
            });
        })?;
    Ok(ConnectionThread {
        handle,
        connection_count: Arc::new(AtomicUsize::new(0)),
        stop: Some(stop),
        join: Some(join),
    })
}

impl Drop for ConnectionThreads {
    fn drop(&mut self) {
        for thread in &mut self.threads {
            if let Some(stop) = thread.stop.take() {
                let _ = stop.send(());
            }
        }
        for thread in &mut self.threads {
            if let Some(join) = thread.join.take()
                && join.join().is_err()
            {
                tracing::error!("a connection thread panicked");
            }
        }
    }
}

impl std::fmt::Debug for ConnectionThreads {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ConnectionThreads")
            .field("connection_counts", &self.connection_counts())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_go_to_the_least_loaded_thread_and_run_there() {
        let threads = ConnectionThreads::start(2, ConnectionThreadOptions::default()).unwrap();
        let first = threads.place();
        let second = threads.place();
        assert_eq!(threads.connection_counts(), vec![1, 1]);
        let names: Vec<String> = [&first, &second]
            .iter()
            .map(|placement| {
                let (sender, receiver) = std::sync::mpsc::channel();
                placement.handle.spawn(async move {
                    let name = std::thread::current().name().map(str::to_string);
                    sender.send(name.unwrap_or_default()).unwrap();
                });
                receiver.recv().unwrap()
            })
            .collect();
        assert_eq!(names, vec!["lamina-nbd-0", "lamina-nbd-1"]);
        drop(first);
        assert_eq!(threads.connection_counts(), vec![0, 1]);
        let third = threads.place();
        assert_eq!(threads.connection_counts(), vec![1, 1]);
        drop((second, third));
        assert_eq!(threads.connection_counts(), vec![0, 0]);
    }

    #[test]
    fn dropping_the_threads_stops_them_with_tasks_still_pending() {
        let threads = ConnectionThreads::start(1, ConnectionThreadOptions::default()).unwrap();
        let placement = threads.place();
        let (sender, receiver) = std::sync::mpsc::channel::<()>();
        placement.handle.spawn(async move {
            let _sender = sender;
            std::future::pending::<()>().await;
        });
        drop(threads);
        // The pending task was dropped with its runtime, and its sender with it.
        assert!(receiver.recv().is_err());
    }
}
