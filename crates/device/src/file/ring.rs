//! The io_uring engine behind [`super::FileDevice`]: one dedicated thread owns the
//! ring and the file; async callers hand it requests through a mutex-guarded queue
//! and await a oneshot reply. The thread batches every queued request into one
//! `submit_and_wait`, reaps completions, resubmits the remainder of short transfers
//! and answers the callers. Each in-flight request record owns its buffer until its
//! completion arrives, so a caller that drops its future can never free memory the
//! kernel is still reading from or writing into.
//!
//! The thread sleeps inside `submit_and_wait`; to wake it for new work it always
//! keeps one read of an eventfd in the ring, and a caller writes that eventfd only
//! when the thread said it was about to sleep, so a busy ring costs callers no
//! system call at all.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use io_uring::{IoUring, opcode, squeue, types};
use slab::Slab;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use crate::AlignedBuffer;

/// The user data of the eventfd read that wakes the ring thread; request records
/// use their slab key, which never reaches this value.
const WAKE_USER_DATA: u64 = u64::MAX;

/// The index of the device file in the ring's registered file table.
const DEVICE_FILE_INDEX: u32 = 0;

/// The index of the wake eventfd in the ring's registered file table.
const WAKE_FILE_INDEX: u32 = 1;

/// The largest transfer Linux performs in one read or write system call
/// (MAX_RW_COUNT, rounded down to the device alignment). Larger requests are split
/// by the short-transfer path.
const TRANSFER_MAX_BYTES: usize = 0x7fff_f000;

/// Sizes of the queues between callers, the ring thread and the kernel.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RingLimits {
    /// Submission queue entries of the ring; one is kept for the wake read, so at
    /// most `ring_entries - 1` requests are inside the kernel at once.
    pub ring_entries: u32,
    /// Requests accepted from callers and not yet answered (queued plus in the
    /// ring); further callers wait for a permit.
    pub in_flight_requests_max: usize,
}

/// One operation on the device, owning the memory the kernel will use.
pub(crate) enum Operation {
    Read { buffer: AlignedBuffer },
    Write { buffer: Arc<AlignedBuffer> },
    Flush,
}

/// The successful result of an [`Operation`].
pub(crate) enum Completed {
    Read(AlignedBuffer),
    Write,
    Flush,
}

/// A request accepted by the ring: the operation, how far it has got, the caller
/// to answer and the permit that counts it against `in_flight_requests_max`.
struct Request {
    operation: Operation,
    offset: u64,
    done_bytes: usize,
    reply: oneshot::Sender<io::Result<Completed>>,
    /// Released when the request is answered, not when the caller gives up, so that
    /// abandoned requests still count against the limit while the kernel has them.
    _permit: OwnedSemaphorePermit,
}

impl Request {
    fn length(&self) -> usize {
        match &self.operation {
            Operation::Read { buffer } => buffer.len(),
            Operation::Write { buffer } => buffer.len(),
            Operation::Flush => 0,
        }
    }
}

/// State shared between callers and the ring thread.
struct Queue {
    requests: VecDeque<Request>,
    /// Set by the ring thread just before it blocks in the kernel; the first caller
    /// that queues a request afterwards clears it and writes the wake eventfd.
    ring_thread_sleeping: bool,
    /// Set when the device is dropped: the thread finishes everything it holds and exits.
    shutting_down: bool,
    /// Set if the ring failed in a way it cannot recover from; new requests fail at once.
    broken: Option<String>,
}

struct Shared {
    queue: Mutex<Queue>,
    wake_event: OwnedFd,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic while holding this lock leaves the queue consistent (every update
        // is a single push or flag store), so a poisoned lock is still usable.
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn wake(&self) {
        let increment: u64 = 1;
        // SAFETY: the eventfd is open for the lifetime of `self`, and the source is
        // a valid 8-byte value, which is what an eventfd write takes.
        let written = unsafe {
            libc::write(
                self.wake_event.as_raw_fd(),
                (&raw const increment).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        // A non-blocking eventfd write only fails if the counter would overflow,
        // which means the thread already has a pending wake-up; nothing is lost.
        let _ = written;
    }
}

/// The caller side of the ring: queues requests and owns the thread.
pub(crate) struct Ring {
    shared: Arc<Shared>,
    permits: Arc<Semaphore>,
    thread: Option<JoinHandle<()>>,
}

impl Ring {
    /// Sets up the ring and starts its thread. Fails (with the error of
    /// `io_uring_setup`) where io_uring is unavailable, so that the caller can fall back.
    pub(crate) fn start(file: File, device_name: &str, limits: RingLimits) -> io::Result<Self> {
        assert!(
            limits.ring_entries >= 2,
            "ring_entries must leave room for the wake read and one request"
        );
        assert!(
            limits.in_flight_requests_max >= 1,
            "in_flight_requests_max must be positive"
        );
        // SAFETY: eventfd takes no pointers; the returned descriptor is checked below.
        let raw_event = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw_event < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw_event` is a freshly created descriptor that nothing else owns.
        let wake_event = unsafe { OwnedFd::from_raw_fd(raw_event) };
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                requests: VecDeque::with_capacity(limits.in_flight_requests_max),
                ring_thread_sleeping: false,
                shutting_down: false,
                broken: None,
            }),
            wake_event,
        });
        // The ring is created on its own thread because a single-issuer ring only
        // accepts submissions from the thread that created it; the setup result
        // comes back here so that the caller can still fall back.
        let (setup_sender, setup_result) = std::sync::mpsc::sync_channel(1);
        let thread_shared = shared.clone();
        let device_name = device_name.to_string();
        let thread = std::thread::Builder::new()
            .name("lamina-uring".to_string())
            .spawn(move || {
                let ring = match setup_ring(limits.ring_entries, &file, &thread_shared.wake_event) {
                    Ok(ring) => ring,
                    Err(error) => {
                        let _ = setup_sender.send(Err(error));
                        return;
                    }
                };
                let _ = setup_sender.send(Ok(()));
                let request_slots_max = limits.ring_entries as usize - 1;
                RingThread {
                    ring,
                    _file: file,
                    shared: thread_shared,
                    in_flight: Slab::with_capacity(request_slots_max),
                    pending: VecDeque::with_capacity(limits.in_flight_requests_max),
                    request_slots_max,
                    wake_buffer: Box::new(0),
                    wake_read_armed: false,
                    completions: Vec::with_capacity(limits.ring_entries as usize * 2),
                    device_name,
                }
                .run();
            })?;
        let setup = setup_result
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("io_uring ring thread died during setup")));
        if let Err(error) = setup {
            let _ = thread.join();
            return Err(error);
        }
        Ok(Self {
            shared,
            permits: Arc::new(Semaphore::new(limits.in_flight_requests_max)),
            thread: Some(thread),
        })
    }

    /// Runs one operation at `offset` and waits for its result. Dropping the returned
    /// future at any point is safe: the request then completes unobserved.
    pub(crate) async fn execute(&self, operation: Operation, offset: u64) -> io::Result<Completed> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the ring's semaphore is never closed");
        let (reply, answer) = oneshot::channel();
        let request = Request {
            operation,
            offset,
            done_bytes: 0,
            reply,
            _permit: permit,
        };
        let wake = {
            let mut queue = self.shared.lock();
            if let Some(reason) = &queue.broken {
                return Err(io::Error::other(format!("io_uring ring failed: {reason}")));
            }
            queue.requests.push_back(request);
            std::mem::take(&mut queue.ring_thread_sleeping)
        };
        if wake {
            self.shared.wake();
        }
        match answer.await {
            Ok(result) => result,
            Err(_) => Err(io::Error::other("io_uring ring thread stopped")),
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        self.shared.lock().shutting_down = true;
        self.shared.wake();
        if let Some(thread) = self.thread.take() {
            // The thread exits once the kernel has returned every buffer it was given,
            // which is what makes it safe to close the file and free the records.
            if thread.join().is_err() {
                tracing::error!("io_uring ring thread panicked");
            }
        }
    }
}

/// Creates the ring with the flags that cut per-request kernel work where the
/// kernel has them (completion work deferred to the one thread that waits, 6.1+),
/// and without them on older kernels; then registers the device and wake files.
fn setup_ring(ring_entries: u32, file: &File, wake_event: &OwnedFd) -> io::Result<IoUring> {
    let ring = match IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_coop_taskrun()
        .build(ring_entries)
    {
        Ok(ring) => ring,
        Err(error) if error.raw_os_error() == Some(libc::EINVAL) => IoUring::new(ring_entries)?,
        Err(error) => return Err(error),
    };
    // Registering the files spares the kernel a descriptor lookup per request.
    ring.submitter()
        .register_files(&[file.as_raw_fd(), wake_event.as_raw_fd()])?;
    Ok(ring)
}

/// The ring thread's state. Only this thread touches the ring.
struct RingThread {
    ring: IoUring,
    /// Keeps the device's descriptor open while the ring refers to it.
    _file: File,
    shared: Arc<Shared>,
    /// Requests whose SQE is in the ring, keyed by user data.
    in_flight: Slab<Request>,
    /// Requests taken from the queue (or resubmitted) but not yet in the ring.
    pending: VecDeque<Request>,
    /// `ring_entries - 1`: one submission slot stays free for the wake read, so the
    /// submission queue never overflows and the completion queue (twice as large)
    /// never either.
    request_slots_max: usize,
    /// Where the wake read puts the eventfd counter; boxed so its address is stable.
    wake_buffer: Box<u64>,
    wake_read_armed: bool,
    /// Reused buffer of (user data, result) pairs, so reaping allocates nothing.
    completions: Vec<(u64, i32)>,
    device_name: String,
}

impl RingThread {
    fn run(mut self) {
        loop {
            {
                let shared = self.shared.clone();
                let mut queue = shared.lock();
                self.pending.extend(queue.requests.drain(..));
                if !self.wake_read_armed && !queue.shutting_down {
                    self.arm_wake_read();
                }
                if queue.shutting_down
                    && self.pending.is_empty()
                    && self.in_flight.is_empty()
                    && !self.wake_read_armed
                {
                    return;
                }
                // From here until the lock is next taken, a new request must wake
                // the thread: it is either about to block or already blocked.
                queue.ring_thread_sleeping = true;
            }
            while self.in_flight.len() < self.request_slots_max {
                let Some(request) = self.pending.pop_front() else {
                    break;
                };
                self.push_request(request);
            }
            // Everything pushed goes to the kernel in this one call. Something is
            // always in the ring here (the wake read, or requests during shutdown),
            // so waiting for one completion cannot hang.
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(error)
                    if matches!(
                        error.raw_os_error(),
                        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                    ) =>
                {
                    // Interrupted, or the kernel is short of resources: reap what is
                    // there and try again.
                }
                Err(error) => {
                    self.fail_permanently(&error);
                    return;
                }
            }
            self.reap();
        }
    }

    fn arm_wake_read(&mut self) {
        let entry = opcode::Read::new(
            types::Fixed(WAKE_FILE_INDEX),
            (&raw mut *self.wake_buffer).cast(),
            u32::try_from(std::mem::size_of::<u64>()).expect("eight bytes fit in a u32"),
        )
        .build()
        .user_data(WAKE_USER_DATA);
        self.push_entry(&entry);
        self.wake_read_armed = true;
    }

    /// Puts one request's SQE into the submission queue and its record into the
    /// in-flight table, where it stays (with its buffer) until its CQE is reaped.
    fn push_request(&mut self, mut request: Request) {
        let offset = request.offset + request.done_bytes as u64;
        let remaining_bytes = (request.length() - request.done_bytes).min(TRANSFER_MAX_BYTES);
        let done_bytes = request.done_bytes;
        let transfer_bytes =
            u32::try_from(remaining_bytes).expect("TRANSFER_MAX_BYTES fits in a u32");
        let entry = match &mut request.operation {
            Operation::Read { buffer } => opcode::Read::new(
                types::Fixed(DEVICE_FILE_INDEX),
                buffer[done_bytes..].as_mut_ptr(),
                transfer_bytes,
            )
            .offset(offset)
            .build(),
            Operation::Write { buffer } => opcode::Write::new(
                types::Fixed(DEVICE_FILE_INDEX),
                buffer[done_bytes..].as_ptr(),
                transfer_bytes,
            )
            .offset(offset)
            .build(),
            Operation::Flush => opcode::Fsync::new(types::Fixed(DEVICE_FILE_INDEX))
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
        };
        let key = self.in_flight.insert(request);
        self.push_entry(&entry.user_data(key as u64));
    }

    fn push_entry(&mut self, entry: &squeue::Entry) {
        // SAFETY: every buffer an entry points at lives until its CQE is reaped: the
        // wake buffer is owned by this thread, which only exits once the wake read
        // has completed, and request buffers are owned by their record in
        // `in_flight`, which is removed only in `reap`. Heap buffers do not move
        // when the slab grows. The registered files stay open as long as the ring.
        let pushed = unsafe { self.ring.submission().push(entry) };
        assert!(
            pushed.is_ok(),
            "submission queue overflow: at most ring_entries entries are ever outstanding"
        );
    }

    fn reap(&mut self) {
        self.completions.clear();
        self.completions.extend(
            self.ring
                .completion()
                .map(|entry| (entry.user_data(), entry.result())),
        );
        for index in 0..self.completions.len() {
            let (user_data, result) = self.completions[index];
            if user_data == WAKE_USER_DATA {
                self.wake_read_armed = false;
                if result < 0 && result != -libc::EAGAIN && result != -libc::EINTR {
                    tracing::warn!(
                        device = %self.device_name,
                        error = %io::Error::from_raw_os_error(-result),
                        "io_uring wake read failed"
                    );
                }
                continue;
            }
            let key = usize::try_from(user_data).expect("user data is a slab key this ring set");
            let request = self.in_flight.remove(key);
            self.complete(request, result);
        }
    }

    /// Answers a request whose SQE completed, or sends the rest of a short transfer
    /// (or a transiently failed one) round again.
    fn complete(&mut self, mut request: Request, result: i32) {
        if result < 0 {
            let errno = -result;
            if errno == libc::EINTR || errno == libc::EAGAIN {
                self.pending.push_front(request);
                return;
            }
            let _ = request.reply.send(Err(io::Error::from_raw_os_error(errno)));
            return;
        }
        let transferred_bytes =
            usize::try_from(result).expect("a non-negative i32 fits in a usize");
        let completed = match request.operation {
            Operation::Flush => Ok(Completed::Flush),
            Operation::Read { .. } | Operation::Write { .. } if transferred_bytes == 0 => {
                let error = match request.operation {
                    Operation::Read { .. } => io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "read returned end of file inside the device",
                    ),
                    _ => io::Error::new(io::ErrorKind::WriteZero, "write transferred no bytes"),
                };
                Err(error)
            }
            _ => {
                request.done_bytes += transferred_bytes;
                assert!(
                    request.done_bytes <= request.length(),
                    "kernel reported more bytes than requested"
                );
                if request.done_bytes < request.length() {
                    self.pending.push_front(request);
                    return;
                }
                match request.operation {
                    Operation::Read { buffer } => Ok(Completed::Read(buffer)),
                    _ => Ok(Completed::Write),
                }
            }
        };
        // The caller may have gone away; its buffer is freed here, after the CQE.
        let _ = request.reply.send(completed);
    }

    /// The ring cannot be entered any more. Every caller gets an error; the buffers
    /// the kernel may still hold are leaked rather than freed under it.
    fn fail_permanently(&mut self, error: &io::Error) {
        tracing::error!(device = %self.device_name, %error, "io_uring ring failed; device unusable");
        let reason = error.to_string();
        let queued: Vec<Request> = {
            let mut queue = self.shared.lock();
            queue.broken = Some(reason.clone());
            queue.requests.drain(..).collect()
        };
        let failure = || io::Error::other(format!("io_uring ring failed: {reason}"));
        for request in self.pending.drain(..).chain(queued) {
            let _ = request.reply.send(Err(failure()));
        }
        for request in self.in_flight.drain() {
            let Request {
                operation, reply, ..
            } = request;
            std::mem::forget(operation);
            let _ = reply.send(Err(failure()));
        }
        if self.wake_read_armed {
            std::mem::forget(std::mem::replace(&mut self.wake_buffer, Box::new(0)));
        }
    }
}
