//! The io_uring engine behind [`super::FileDevice`], with no thread of its own:
//! one ring per device for each thread that does I/O on it (decision 0048; at
//! most `RINGS_PER_DEVICE_MAX`, then threads share), each shared by whoever
//! polls its requests. A caller puts its request's record (with its buffer) in
//! a slab slot of its thread's ring and its submission entry in that ring, both
//! under one short mutex, then waits on the slot. One **reaper task** per ring,
//! on the runtime of the ring's first caller, does the system calls: it passes
//! everything pushed since its last turn to the kernel in one `io_uring_enter`,
//! so that requests issued together (a connection's burst) cost one call, and
//! it reaps completions when the ring's registered eventfd, watched by the
//! reactor through `AsyncFd`, says there are some. It resubmits the rest of
//! short or interrupted transfers and wakes the callers whose requests
//! finished, from a worker thread, so no thread outside the runtime sits
//! between a request and its caller (decision 0041). On a connection thread
//! (a runtime on one thread) the caller, its ring and the reaper share that
//! thread, so a request is submitted, reaped and its caller woken without a
//! hand-off. Having woken several callers, the reaper goes behind them in the
//! worker's run queue before it submits, so that the requests they start next
//! go to the kernel together. A flush is an `fdatasync` of the file, which
//! covers writes completed through any of the device's rings.
//!
//! A slot keeps the request's buffer until its completion is reaped, so a caller
//! that drops its future cannot free memory the kernel still uses: the slot is
//! marked abandoned and freed at the completion. Dropping the device waits for
//! every request the kernel holds. The reaper runs on the runtime of the task
//! that first needed it; when that runtime shuts down, the reaper wakes every
//! waiting caller and the first one polled again starts a new reaper on its own
//! runtime. The rings have none of the single-issuer, deferred or cooperative
//! task-run flags: on a multi-thread runtime several threads touch one ring,
//! and without an interrupt the kernel would not post a completion for a
//! submitting worker asleep on a futex.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::task::{Context, Poll, Waker};

use io_uring::{EnterFlags, IoUring, opcode, squeue, types};
use slab::Slab;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::AlignedBuffer;

/// The index of the device file in the ring's registered file table.
const DEVICE_FILE_INDEX: u32 = 0;

/// The largest transfer Linux performs in one read or write system call
/// (MAX_RW_COUNT, rounded down to the device alignment). Larger requests are split
/// by the short-transfer path.
const TRANSFER_MAX_BYTES: usize = 0x7fff_f000;

/// Callers woken by one reaping from which the reaper waits for them to run
/// before it submits, so that the requests they start go to the kernel in one
/// `io_uring_enter`. A lone woken caller is not waited for (a wait costs the
/// worker a trip through its reactor): its next request wakes the reaper,
/// which then runs right after it.
const BATCHED_WAKES_MIN: usize = 2;

/// What became of a submission.
enum Submission {
    Done,
    /// The kernel took only part (short of resources); try again.
    Retry,
    /// The ring is being dropped or is broken.
    Stop,
}

/// Sizes of the queues between callers and the kernel.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RingLimits {
    /// Submission queue entries of the ring: at most this many requests are inside
    /// the kernel at once (the completion queue, twice as large, never overflows).
    pub ring_entries: u32,
    /// Requests accepted from callers and not yet answered (waiting for room in
    /// the ring, in it, or abandoned and still in the kernel); further callers
    /// wait for a permit.
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

/// Where a request is.
enum Stage {
    /// Accepted, waiting for room in the ring (or resubmission of its rest).
    Waiting,
    /// Its submission entry is in the ring; the kernel may use its buffer.
    InKernel,
    /// Finished; the caller takes the result.
    Done(io::Result<Completed>),
}

/// A request accepted by the ring: the operation, how far it has got, who waits
/// for it, and the permit that counts it against `in_flight_requests_max`.
struct Slot {
    operation: Operation,
    offset: u64,
    done_bytes: usize,
    stage: Stage,
    waker: Option<Waker>,
    /// The caller dropped its future: free the slot once the kernel is done.
    abandoned: bool,
    /// Released with the slot, not when the caller gives up, so that abandoned
    /// requests still count against the limit while the kernel has them.
    _permit: OwnedSemaphorePermit,
}

impl Slot {
    fn length(&self) -> usize {
        match &self.operation {
            Operation::Read { buffer } => buffer.len(),
            Operation::Write { buffer } => buffer.len(),
            Operation::Flush => 0,
        }
    }

    /// The submission entry for the rest of this request.
    fn entry(&mut self, key: usize) -> squeue::Entry {
        let offset = self.offset + self.done_bytes as u64;
        let remaining_bytes = (self.length() - self.done_bytes).min(TRANSFER_MAX_BYTES);
        let done_bytes = self.done_bytes;
        let transfer_bytes =
            u32::try_from(remaining_bytes).expect("TRANSFER_MAX_BYTES fits in a u32");
        let entry = match &mut self.operation {
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
        entry.user_data(key as u64)
    }

    /// Accounts for one completion: `None` if the rest of the transfer must go
    /// round again (short, interrupted or transiently refused), else the result.
    fn transfer_result(&mut self, result: i32) -> Option<io::Result<Completed>> {
        if result < 0 {
            let errno = -result;
            if errno == libc::EINTR || errno == libc::EAGAIN {
                return None;
            }
            return Some(Err(io::Error::from_raw_os_error(errno)));
        }
        let transferred_bytes =
            usize::try_from(result).expect("a non-negative i32 fits in a usize");
        match self.operation {
            Operation::Flush => return Some(Ok(Completed::Flush)),
            Operation::Read { .. } if transferred_bytes == 0 => {
                return Some(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "read returned end of file inside the device",
                )));
            }
            Operation::Write { .. } if transferred_bytes == 0 => {
                return Some(Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "write transferred no bytes",
                )));
            }
            _ => {}
        }
        self.done_bytes += transferred_bytes;
        assert!(
            self.done_bytes <= self.length(),
            "kernel reported more bytes than requested"
        );
        if self.done_bytes < self.length() {
            return None;
        }
        // The buffer leaves the slot only now, after the kernel is done with it.
        match std::mem::replace(&mut self.operation, Operation::Flush) {
            Operation::Read { buffer } => Some(Ok(Completed::Read(buffer))),
            _ => Some(Ok(Completed::Write)),
        }
    }
}

/// Whether a reaper task serves the ring.
enum Reaper {
    /// None yet, or its runtime shut down: the next caller starts one.
    Stopped,
    Running {
        /// Set by the first caller that pushes an entry after the reaper's last
        /// turn (that caller wakes it); cleared by the reaper's next turn.
        submit_requested: bool,
        waker: Option<Waker>,
    },
}

/// Everything the mutex guards, including the right to touch the submission and
/// completion queues.
struct State {
    slots: Slab<Slot>,
    /// Keys of requests waiting for room in the ring, oldest first.
    waiting: VecDeque<usize>,
    /// Entries pushed into the ring whose completion has not been reaped.
    in_kernel_count: usize,
    /// Entries pushed into the ring and not yet passed to `io_uring_enter`.
    unsubmitted_count: u32,
    reaper: Reaper,
    /// Set when the device is dropped: the reaper stops, the drop reaps.
    shutting_down: bool,
    /// Set if the ring failed in a way it cannot recover from; new requests fail at once.
    broken: Option<String>,
}

/// The ring and its state, shared by the device, its callers and the reaper.
struct Shared {
    ring: IoUring,
    state: Mutex<State>,
    /// Registered with the ring: the kernel signals it for every completion.
    completion_event: OwnedFd,
    /// Keeps the device's descriptor open while the ring refers to it.
    _file: Arc<File>,
    ring_entries: usize,
    device_name: String,
}

fn broken_error(reason: &str) -> io::Error {
    io::Error::other(format!("io_uring ring failed: {reason}"))
}

/// Whether an `io_uring_enter` error is worth trying again.
fn transient(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
    )
}

impl Shared {
    /// Completions posted and not yet reaped; true also when another thread
    /// holds the ring's mutex (something is happening: stop waiting for it).
    fn has_completions(&self) -> bool {
        let Ok(state) = self.state.try_lock() else {
            return true;
        };
        // SAFETY: the completion queue is only touched under the state mutex,
        // held here; nothing is taken from it, so its head is left as it is.
        let empty = unsafe { self.ring.completion_shared() }.is_empty();
        drop(state);
        !empty
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update under this lock leaves the state consistent before anything
        // that can panic, so a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Puts a request's entry into the ring. The caller checked there is room.
    fn push(&self, state: &mut State, key: usize) {
        let entry = state.slots[key].entry(key);
        // SAFETY: the submission queue is only touched under the state mutex, which
        // the caller holds. The entry points at the slot's buffer, which stays in
        // the slot (heap memory, not moved when the slab grows) until the entry's
        // completion is reaped; the registered file stays open as long as the ring.
        let pushed = unsafe { self.ring.submission_shared().push(&entry) };
        assert!(
            pushed.is_ok(),
            "submission queue overflow: at most ring_entries entries are ever in the kernel"
        );
        state.slots[key].stage = Stage::InKernel;
        state.in_kernel_count += 1;
        state.unsubmitted_count += 1;
    }

    /// Moves waiting requests into the ring while it has room.
    fn fill_ring(&self, state: &mut State) {
        while state.in_kernel_count < self.ring_entries {
            let Some(key) = state.waiting.pop_front() else {
                break;
            };
            self.push(state, key);
        }
    }

    /// Takes every completion the kernel posted; collects the wakers of the
    /// callers whose requests finished.
    fn reap(&self, state: &mut State, wakers: &mut Vec<Waker>) {
        // SAFETY: the completion queue is only touched under the state mutex, which
        // the caller holds.
        let completions = unsafe { self.ring.completion_shared() };
        for completion in completions {
            state.in_kernel_count -= 1;
            let key = usize::try_from(completion.user_data())
                .expect("user data is a slab key this ring set");
            let slot = &mut state.slots[key];
            match slot.transfer_result(completion.result()) {
                None if state.shutting_down => {
                    // Nobody waits any more; the rest of the transfer is dropped.
                    state.slots.remove(key);
                }
                None => {
                    slot.stage = Stage::Waiting;
                    state.waiting.push_front(key);
                }
                Some(_) if slot.abandoned => {
                    // The caller went away; its buffer is freed here, after the kernel.
                    state.slots.remove(key);
                }
                Some(result) => {
                    slot.stage = Stage::Done(result);
                    wakers.extend(slot.waker.take());
                }
            }
        }
    }

    /// Passes `count` pushed entries to the kernel (and with `wait`, waits for a
    /// completion). Entries the kernel did not take are handed back for a later
    /// call; false if that later call is needed.
    fn enter(&self, count: u32, wait: bool) -> bool {
        let (minimum, flags) = if wait {
            (1, EnterFlags::GETEVENTS.bits())
        } else {
            (0, 0)
        };
        // SAFETY: `count` entries were pushed and not yet submitted (the caller took
        // them from `unsubmitted_count`), so the kernel reads only complete entries;
        // no argument pointer is passed.
        let entered = unsafe {
            self.ring
                .submitter()
                .enter::<libc::sigset_t>(count, minimum, flags, None)
        };
        let submitted = match entered {
            Ok(submitted) => u32::try_from(submitted).unwrap_or(count).min(count),
            Err(error) if transient(&error) => 0,
            Err(error) => {
                self.fail_permanently(&error);
                return true;
            }
        };
        if submitted == count {
            return true;
        }
        self.lock().unsubmitted_count += count - submitted;
        false
    }

    /// Waits until the reaper has something to do: completions (the eventfd
    /// fired) or entries to submit. Ready(false) when the reaper should stop.
    fn poll_work(&self, context: &mut Context<'_>, event: &AsyncFd<CompletionEvent>) -> Poll<bool> {
        let mut fired = false;
        // The counter is never read: every completion writes the eventfd, and each
        // write is a new edge for the reactor, so clearing the readiness before
        // reaping loses no completion.
        loop {
            match event.poll_read_ready(context) {
                Poll::Ready(Ok(mut ready)) => {
                    ready.clear_ready();
                    fired = true;
                }
                Poll::Ready(Err(error)) => {
                    self.fail_permanently(&error);
                    return Poll::Ready(false);
                }
                Poll::Pending => break,
            }
        }
        let mut state = self.lock();
        if state.shutting_down || state.broken.is_some() {
            return Poll::Ready(false);
        }
        let Reaper::Running {
            submit_requested,
            waker,
        } = &mut state.reaper
        else {
            unreachable!("a running reaper is registered")
        };
        if !waker.as_ref().is_some_and(|w| w.will_wake(context.waker())) {
            *waker = Some(context.waker().clone());
        }
        if fired || *submit_requested {
            Poll::Ready(true)
        } else {
            Poll::Pending
        }
    }

    /// Reaps every completion and wakes the callers whose requests finished;
    /// returns how many were woken, or `None` when the reaper should stop. When
    /// several were woken, callers are told a submission is already coming, so
    /// that the entries they push next go to the kernel together.
    fn reap_and_wake(&self, wakers: &mut Vec<Waker>) -> Option<usize> {
        {
            let mut state = self.lock();
            if state.shutting_down || state.broken.is_some() {
                return None;
            }
            self.reap(&mut state, wakers);
            if wakers.len() >= BATCHED_WAKES_MIN
                && let Reaper::Running {
                    submit_requested, ..
                } = &mut state.reaper
            {
                *submit_requested = true;
            }
        }
        let woken = wakers.len();
        for waker in wakers.drain(..) {
            waker.wake();
        }
        Some(woken)
    }

    /// Refills the ring from the waiting requests and passes everything pushed
    /// since the last submission to the kernel in one `io_uring_enter`.
    fn submit(&self) -> Submission {
        let count = {
            let mut state = self.lock();
            if state.shutting_down || state.broken.is_some() {
                return Submission::Stop;
            }
            if let Reaper::Running {
                submit_requested, ..
            } = &mut state.reaper
            {
                *submit_requested = false;
            }
            self.fill_ring(&mut state);
            std::mem::take(&mut state.unsubmitted_count)
        };
        if count == 0 || self.enter(count, false) {
            Submission::Done
        } else {
            Submission::Retry
        }
    }

    /// The ring cannot be entered any more. Every waiting caller gets an error;
    /// the buffers the kernel may still hold are leaked rather than freed under it.
    fn fail_permanently(&self, error: &io::Error) {
        tracing::error!(device = %self.device_name, %error, "io_uring ring failed; device unusable");
        let mut wakers = Vec::new();
        let mut state = self.lock();
        state.broken = Some(error.to_string());
        state.waiting.clear();
        let keys: Vec<usize> = state.slots.iter().map(|(key, _)| key).collect();
        for key in keys {
            let slot = &mut state.slots[key];
            if matches!(slot.stage, Stage::Done(_)) {
                continue;
            }
            if matches!(slot.stage, Stage::InKernel) {
                std::mem::forget(std::mem::replace(&mut slot.operation, Operation::Flush));
            }
            if slot.abandoned {
                state.slots.remove(key);
                continue;
            }
            slot.stage = Stage::Done(Err(broken_error(&error.to_string())));
            wakers.extend(slot.waker.take());
        }
        drop(state);
        for waker in wakers {
            waker.wake();
        }
    }

    /// Waits (blocking) until the kernel holds no request of this ring. Only
    /// called once `shutting_down` is set, so the reaper no longer reaps.
    fn wait_for_kernel(&self) {
        loop {
            let count = {
                let mut state = self.lock();
                if state.broken.is_some() {
                    return;
                }
                self.reap(&mut state, &mut Vec::new());
                if state.in_kernel_count == 0 {
                    return;
                }
                std::mem::take(&mut state.unsubmitted_count)
            };
            if !self.enter(count, true) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }
}

/// The ring's eventfd as the reactor sees it.
struct CompletionEvent(Arc<Shared>);

impl AsRawFd for CompletionEvent {
    fn as_raw_fd(&self) -> RawFd {
        self.0.completion_event.as_raw_fd()
    }
}

/// On the reaper's end (normally, or dropped with its runtime): marks the ring
/// as unserved and wakes every waiting caller, so that one starts a new reaper.
struct ReaperStopped(Arc<Shared>);

impl Drop for ReaperStopped {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.reaper = Reaper::Stopped;
        let wakers: Vec<Waker> = state
            .slots
            .iter_mut()
            .filter_map(|(_, slot)| slot.waker.take())
            .collect();
        drop(state);
        for waker in wakers {
            waker.wake();
        }
    }
}

/// The reaper task: a turn whenever a caller asks for a submission or the
/// eventfd says completions arrived. The guard is made before the task is
/// spawned, so that it runs even if the task is dropped before its first poll.
fn reap_until_stopped(shared: Arc<Shared>) -> impl std::future::Future<Output = ()> + Send {
    let stopped = ReaperStopped(shared.clone());
    async move {
        let _stopped = stopped;
        // SAFETY: the eventfd is owned by `Shared`, which the `CompletionEvent`
        // keeps alive, so it stays open and the same descriptor for the whole life
        // of the registration.
        let registered = unsafe {
            AsyncFd::register_with_interest(CompletionEvent(shared.clone()), Interest::READABLE)
        };
        let event = match registered {
            Ok(event) => event,
            Err(error) => {
                shared.fail_permanently(&error.into_parts().1);
                return;
            }
        };
        let mut wakers = Vec::with_capacity(shared.ring_entries);
        loop {
            if !std::future::poll_fn(|context| shared.poll_work(context, &event)).await {
                return;
            }
            let Some(woken) = shared.reap_and_wake(&mut wakers) else {
                return;
            };
            if woken >= BATCHED_WAKES_MIN {
                // Behind the callers just woken in this worker's queue: their next
                // requests join this submission.
                yield_behind_queued().await;
            }
            loop {
                match shared.submit() {
                    Submission::Done => break,
                    Submission::Stop => return,
                    // The kernel was short of resources: try again shortly.
                    Submission::Retry => tokio::task::yield_now().await,
                }
            }
        }
    }
}

/// Returns after going once to the back of the worker's run queue. Unlike
/// `tokio::task::yield_now`, which tokio defers until the worker parks or polls
/// its reactor (on a busy worker, dozens of tasks later, with every caller's
/// entry waiting for this submission), a wake from inside the poll queues the
/// task at once, behind what is already ready.
async fn yield_behind_queued() {
    let mut yielded = false;
    std::future::poll_fn(|context| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        context.waker().wake_by_ref();
        Poll::Pending
    })
    .await;
}

/// A caller's claim on its slot; dropping it before the result abandons the slot.
struct Claim<'a> {
    shared: &'a Arc<Shared>,
    key: usize,
    finished: bool,
}

impl Claim<'_> {
    fn poll_result(&mut self, context: &Context<'_>) -> Poll<io::Result<Completed>> {
        let mut state = self.shared.lock();
        let slot = &mut state.slots[self.key];
        if let Stage::Done(_) = slot.stage {
            let slot = state.slots.remove(self.key);
            self.finished = true;
            drop(state);
            let Stage::Done(result) = slot.stage else {
                unreachable!("checked above")
            };
            return Poll::Ready(result);
        }
        if !slot
            .waker
            .as_ref()
            .is_some_and(|w| w.will_wake(context.waker()))
        {
            slot.waker = Some(context.waker().clone());
        }
        let start = matches!(state.reaper, Reaper::Stopped).then(start_reaper_handle);
        if start.is_some() {
            state.reaper = Reaper::Running {
                submit_requested: true,
                waker: None,
            };
        }
        drop(state);
        if let Some(handle) = start {
            handle.spawn(reap_until_stopped(self.shared.clone()));
        }
        Poll::Pending
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut state = self.shared.lock();
        let slot = &mut state.slots[self.key];
        if matches!(slot.stage, Stage::Done(_)) {
            let slot = state.slots.remove(self.key);
            drop(state);
            drop(slot);
            return;
        }
        slot.abandoned = true;
        slot.waker = None;
        if matches!(slot.stage, Stage::Waiting) && state.broken.is_none() {
            // Not in the kernel: nothing to wait for.
            if let Some(position) = state.waiting.iter().position(|key| *key == self.key) {
                state.waiting.remove(position);
                state.slots.remove(self.key);
            }
        }
    }
}

/// The runtime a new reaper runs on: the caller's.
fn start_reaper_handle() -> tokio::runtime::Handle {
    tokio::runtime::Handle::try_current()
        .expect("a FileDevice on io_uring must be used from a tokio runtime with I/O enabled")
}

/// Rings one device may have, one per thread that does I/O on it, at most
/// (threads past this many share rings, as every thread did before decision
/// 0048). A ring costs two descriptors and a few tens of KiB.
const RINGS_PER_DEVICE_MAX: usize = 8;

/// Hands each thread its place among a device's rings, the same place on every
/// device, in the order the threads first do device I/O.
static NEXT_THREAD_RING_INDEX: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static THREAD_RING_INDEX: usize =
        NEXT_THREAD_RING_INDEX.fetch_add(1, Ordering::Relaxed) % RINGS_PER_DEVICE_MAX;
    /// The rings this thread set up, for [`thread_has_device_completions`].
    static THREAD_RINGS: RefCell<Vec<Weak<Shared>>> = const { RefCell::new(Vec::new()) };
}

/// Whether a ring this thread set up has completions not yet reaped, or is
/// busy with another thread. A thread about to sleep asks this while it spins
/// briefly (decision 0048): a completion found here costs no wake-up, since the
/// reactor's next look finds the ring's eventfd ready.
pub fn thread_has_device_completions() -> bool {
    THREAD_RINGS.with(|rings| {
        let mut rings = rings.borrow_mut();
        rings.retain(|ring| ring.strong_count() > 0);
        rings
            .iter()
            .filter_map(Weak::upgrade)
            .any(|shared| shared.has_completions())
    })
}

/// Sets up one ring on the device's file, with its eventfd registered.
fn set_up_shared(
    file: Arc<File>,
    device_name: &str,
    limits: RingLimits,
) -> io::Result<Arc<Shared>> {
    // SAFETY: eventfd takes no pointers; the returned descriptor is checked below.
    let raw_event = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if raw_event < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw_event` is a freshly created descriptor that nothing else owns.
    let completion_event = unsafe { OwnedFd::from_raw_fd(raw_event) };
    let ring = IoUring::new(limits.ring_entries)?;
    // Registering the file spares the kernel a descriptor lookup per request.
    ring.submitter().register_files(&[file.as_raw_fd()])?;
    ring.submitter()
        .register_eventfd(completion_event.as_raw_fd())?;
    Ok(Arc::new(Shared {
        ring,
        state: Mutex::new(State {
            slots: Slab::with_capacity(limits.ring_entries as usize),
            waiting: VecDeque::new(),
            in_kernel_count: 0,
            unsubmitted_count: 0,
            reaper: Reaper::Stopped,
            shutting_down: false,
            broken: None,
        }),
        completion_event,
        _file: file,
        ring_entries: limits.ring_entries as usize,
        device_name: device_name.to_string(),
    }))
}

/// The caller side of the device's rings: one per thread that does I/O on the
/// device (decision 0048), so that a thread serving its own connections
/// submits, reaps and wakes on itself, with no hand-off to another thread.
/// The in-flight limit is the device's, over all its rings.
pub(crate) struct Ring {
    /// By thread ring index; the first is set up at start, the others on a
    /// thread's first request (or, where that fails, pointed at the first).
    shards: Box<[OnceLock<Arc<Shared>>]>,
    file: Arc<File>,
    limits: RingLimits,
    device_name: String,
    permits: Arc<Semaphore>,
}

impl Ring {
    /// Sets up the first ring. Fails (with the error of `io_uring_setup`) where
    /// io_uring is unavailable, so that the caller can fall back.
    pub(crate) fn start(file: File, device_name: &str, limits: RingLimits) -> io::Result<Self> {
        assert!(limits.ring_entries >= 1, "ring_entries must be positive");
        assert!(
            limits.in_flight_requests_max >= 1,
            "in_flight_requests_max must be positive"
        );
        let file = Arc::new(file);
        let first = set_up_shared(file.clone(), device_name, limits)?;
        let shards: Box<[OnceLock<Arc<Shared>>]> =
            (0..RINGS_PER_DEVICE_MAX).map(|_| OnceLock::new()).collect();
        shards[0]
            .set(first)
            .unwrap_or_else(|_| unreachable!("a new cell is empty"));
        Ok(Self {
            shards,
            file,
            limits,
            device_name: device_name.to_string(),
            permits: Arc::new(Semaphore::new(limits.in_flight_requests_max)),
        })
    }

    /// Rings set up so far (a cell pointed at the first ring after a failed
    /// setup is not counted again).
    pub(crate) fn ring_count(&self) -> usize {
        let first = self.shards[0].get();
        1 + self
            .shards
            .iter()
            .skip(1)
            .filter_map(OnceLock::get)
            .filter(|shared| !first.is_some_and(|first| Arc::ptr_eq(first, shared)))
            .count()
    }

    /// The ring of the calling thread, set up on its first request.
    fn shared(&self) -> &Arc<Shared> {
        let index = THREAD_RING_INDEX.with(|index| *index);
        let cell = &self.shards[index];
        if let Some(shared) = cell.get() {
            return shared;
        }
        let first = self.shards[0]
            .get()
            .expect("the first ring is set up at start");
        let shared = match set_up_shared(self.file.clone(), &self.device_name, self.limits) {
            Ok(shared) => shared,
            Err(error) => {
                tracing::warn!(device = %self.device_name, %error,
                    "cannot set up another io_uring ring; this thread shares the first");
                first.clone()
            }
        };
        // Two threads with the same index may race here; the loser's ring is
        // dropped unused.
        let _ = cell.set(shared);
        let shared = cell.get().expect("set above");
        THREAD_RINGS.with(|rings| {
            let mut rings = rings.borrow_mut();
            // Rings of devices dropped since are forgotten here, so that a
            // thread that opens device after device keeps a short list.
            rings.retain(|ring| ring.strong_count() > 0);
            rings.push(Arc::downgrade(shared));
        });
        shared
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
        let shared = self.shared();
        let key = Self::accept(shared, operation, offset, permit)?;
        let mut claim = Claim {
            shared,
            key,
            finished: false,
        };
        std::future::poll_fn(|context| claim.poll_result(context)).await
    }

    /// Gives a request a slot and, room permitting, puts it in the ring; asks the
    /// reaper (starting one if none runs) to submit it.
    fn accept(
        shared: &Arc<Shared>,
        operation: Operation,
        offset: u64,
        permit: OwnedSemaphorePermit,
    ) -> io::Result<usize> {
        let mut state = shared.lock();
        if let Some(reason) = &state.broken {
            return Err(broken_error(reason));
        }
        let start = matches!(state.reaper, Reaper::Stopped).then(start_reaper_handle);
        let key = state.slots.insert(Slot {
            operation,
            offset,
            done_bytes: 0,
            stage: Stage::Waiting,
            waker: None,
            abandoned: false,
            _permit: permit,
        });
        if state.waiting.is_empty() && state.in_kernel_count < shared.ring_entries {
            shared.push(&mut state, key);
        } else {
            state.waiting.push_back(key);
        }
        let wake = match &mut state.reaper {
            Reaper::Running {
                submit_requested,
                waker,
            } => {
                if *submit_requested {
                    None
                } else {
                    *submit_requested = true;
                    waker.clone()
                }
            }
            Reaper::Stopped => {
                state.reaper = Reaper::Running {
                    submit_requested: true,
                    waker: None,
                };
                None
            }
        };
        drop(state);
        if let Some(handle) = start {
            handle.spawn(reap_until_stopped(shared.clone()));
        }
        if let Some(waker) = wake {
            waker.wake();
        }
        Ok(key)
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // Every caller's future borrowed this device, so all of them are gone:
        // each ring's waiting requests are dropped, and those in the kernel are
        // waited for (once per ring: a cell may point at the first ring).
        let mut done: Vec<&Arc<Shared>> = Vec::with_capacity(self.shards.len());
        for shared in self.shards.iter().filter_map(OnceLock::get) {
            if done.iter().any(|seen| Arc::ptr_eq(seen, shared)) {
                continue;
            }
            done.push(shared);
            shared.shut_down();
        }
    }
}

impl Shared {
    /// Stops the reaper and waits until the kernel holds no request of this ring.
    fn shut_down(&self) {
        let reaper = {
            let mut state = self.lock();
            state.shutting_down = true;
            while let Some(key) = state.waiting.pop_front() {
                state.slots.remove(key);
            }
            match std::mem::replace(&mut state.reaper, Reaper::Stopped) {
                Reaper::Running { waker, .. } => waker,
                Reaper::Stopped => None,
            }
        };
        if let Some(waker) = reaper {
            waker.wake();
        }
        self.wait_for_kernel();
    }
}
