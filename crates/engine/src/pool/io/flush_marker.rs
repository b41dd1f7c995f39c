//! Writes the flush marker (`log::marker`) after each device flush, so that
//! recovery knows that the batches of the last flush before a crash were
//! durable: a block of theirs that fails its checksum is then reported as an
//! I/O error instead of being dropped as torn (which would silently return
//! an older version).
//!
//! The marker write costs the flush nothing: it starts after the device
//! flush has completed and is not awaited by the flush that caused it. It
//! waits up to [`FLUSH_MARKER_DELAY_US`] first, and is not written at all if
//! by then the log itself carries the claim (decision 0069): a batch sealed
//! after the flush, written with every batch before it, whose summary's
//! `flushed_through_sequence` says as much (`LogWriter::claims_written`).
//! A writer that flushes after every write thus writes no marker between
//! flushes. The next device flush writes a waiting marker that the log does
//! not carry first, so that it covers it; when no other flush follows, the
//! pool's background task does the same within `flush_interval_ms`
//! (`needs_durability_flush`). A crash inside that window (after a flush
//! completed, before its claim was durable) is the one case where recovery
//! cannot tell rot from a torn write in the last flush's batches;
//! docs/format.md, "Flush markers", bounds it.
//!
//! The wait is one watcher task with one timer, which each flush that
//! leaves a marker waiting moves on (decision 0071): a task, a timer and a
//! hurry per flush cost a database's commits 1.4 eventfd writes and 1.8
//! `epoll_wait`s per flush (BENCHMARKS.md, "Server CPU per commit"). A
//! flush whose claims the log carries drops the waiting marker, and wakes
//! the watcher to end only if it runs on the flush's own thread; one on
//! another thread ends at its deadline or serves the next flush's marker.
//!
//! Lock order: the pool's `flush_lock`, then this component's `write_lock`
//! (held across a marker's write, by the watcher or by `settled`), then its
//! `progress` (never held across an await).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lamina_device::BlockDevice;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::BLOCK_SIZE_BYTES;
use crate::log::geometry::FLUSH_MARKER_BLOCKS;
use crate::log::marker::FlushMarkerRecord;

/// How long a marker waits for the log to carry its claim (decision 0069):
/// long enough for a synchronous writer's next write, which follows the
/// flush's reply by tens to hundreds of microseconds, short against the
/// power-cut window (`flush_interval_ms`, at least 1 ms, default 1 s).
pub const FLUSH_MARKER_DELAY_US: u64 = 1_000;

const _: () = assert!(
    FLUSH_MARKER_DELAY_US <= 1_000,
    "at most the shortest flush_interval_ms"
);

/// What a marker says: through which sequence every batch is durable, and
/// every batch on flash (decision 0032; the same in a one-tier pool).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MarkerClaims {
    pub flushed_through: u64,
    pub flash_flushed_through: u64,
}

impl MarkerClaims {
    /// Whether these claims say at least what `other` says.
    fn covers(&self, other: &Self) -> bool {
        self.flushed_through >= other.flushed_through
            && self.flash_flushed_through >= other.flash_flushed_through
    }

    fn max(self, other: Self) -> Self {
        Self {
            flushed_through: self.flushed_through.max(other.flushed_through),
            flash_flushed_through: self.flash_flushed_through.max(other.flash_flushed_through),
        }
    }

    /// Whether a summary claiming `log_claim` vouches for everything these
    /// claims say (a summary's one claim covers both tiers).
    fn carried_by(&self, log_claim: u64) -> bool {
        log_claim >= self.flash_flushed_through
    }
}

/// How far the markers have got.
#[derive(Clone, Default)]
struct Progress {
    /// The sequence the next marker written gets (its slot is this modulo 2).
    next_marker_sequence: u64,
    /// The claims on the device or on their way: by a marker written or
    /// waiting to be, or by the log's summaries.
    written: MarkerClaims,
    /// The claims of the newest marker a device flush covered.
    durable: MarkerClaims,
    /// A marker waiting for its delay or for the log, if any.
    waiting: Option<Waiting>,
    /// The thread the watcher task runs on, while it runs (it ends once
    /// nothing waits).
    watcher_thread: Option<std::thread::ThreadId>,
}

/// A marker a device flush left to be written unless the log carries it.
#[derive(Clone)]
struct Waiting {
    claims: MarkerClaims,
    /// When the delay ends: the newest flush's completion plus
    /// [`FLUSH_MARKER_DELAY_US`].
    deadline: Instant,
    device: Arc<dyn BlockDevice>,
}

/// The state the watcher task shares with the component.
struct Shared {
    pool_identifier: u128,
    progress: Mutex<Progress>,
    /// `LogWriter::claims_written`, as the batch writes report it.
    log_claim: AtomicU64,
    /// Bytes of markers written, until the pool's counters take them.
    bytes_written: AtomicU64,
    /// Wakes the watcher to look again (see `forget_carried`).
    look_again: Notify,
    /// Held across a marker's numbering and device write, so that whoever
    /// must have the marker written waits for one being written.
    write_lock: Arc<tokio::sync::Mutex<()>>,
}

pub struct FlushMarker {
    shared: Arc<Shared>,
}

impl FlushMarker {
    /// A marker writer that goes on from `newest` (found at recovery) or from
    /// nothing (a new pool).
    pub fn new(pool_identifier: u128, newest: Option<FlushMarkerRecord>) -> Self {
        let progress = newest.map_or(Progress::default(), |marker| {
            let claims = MarkerClaims {
                flushed_through: marker.flushed_through_sequence,
                flash_flushed_through: marker.flash_flushed_through_sequence,
            };
            Progress {
                next_marker_sequence: marker.marker_sequence + 1,
                written: claims,
                durable: claims,
                ..Progress::default()
            }
        });
        Self {
            shared: Arc::new(Shared {
                pool_identifier,
                progress: Mutex::new(progress),
                log_claim: AtomicU64::new(0),
                bytes_written: AtomicU64::new(0),
                look_again: Notify::new(),
                write_lock: Arc::new(tokio::sync::Mutex::new(())),
            }),
        }
    }

    /// The log has written summaries claiming flushes through `claim`, with
    /// every batch before them (`LogWriter::claims_written`).
    pub fn claimed_by_log(&self, claim: u64) {
        self.shared.log_claim.fetch_max(claim, Ordering::AcqRel);
    }

    /// Makes sure the newest marker is written or carried by the log, so
    /// that the device flush the caller is about to issue covers it. Returns
    /// what that flush will make durable. Call under the pool's flush lock.
    pub async fn before_device_flush(&self) -> MarkerClaims {
        if !self.shared.forget_carried() {
            self.settled().await;
        }
        self.shared.progress().written
    }

    /// After a device flush that covered the marker up to `covering` and made
    /// durable what `claims` says: a marker saying so waits for the log to
    /// carry the claim, then is written if it did not, unless what was
    /// written already says as much. The watcher task waits for it, started
    /// here unless it runs: while flushes come closer together than the
    /// delay, one task and one timer serve them all (each flush moves the
    /// deadline on), not a task, a timer and a wake-up per flush.
    /// Call under the pool's flush lock.
    pub fn after_device_flush(
        &self,
        device: &Arc<dyn BlockDevice>,
        covering: MarkerClaims,
        claims: MarkerClaims,
    ) {
        assert!(
            claims.flash_flushed_through >= claims.flushed_through,
            "flash is durable at least as far as both tiers: {claims:?}"
        );
        let deadline = Instant::now() + Duration::from_micros(FLUSH_MARKER_DELAY_US);
        let start_watcher = {
            let mut progress = self.shared.progress();
            progress.durable = progress.durable.max(covering);
            if progress.written.covers(&claims) {
                return;
            }
            progress.written = progress.written.max(claims);
            if claims.carried_by(self.shared.log_claim.load(Ordering::Acquire)) {
                return;
            }
            progress.waiting = Some(Waiting {
                claims: progress.written,
                deadline,
                device: device.clone(),
            });
            let start_watcher = progress.watcher_thread.is_none();
            if start_watcher {
                // Connection threads run a runtime each: the task spawned
                // here runs on this thread.
                progress.watcher_thread = Some(std::thread::current().id());
            }
            start_watcher
        };
        if start_watcher {
            tokio::spawn(watch(self.shared.clone(), deadline));
        }
    }

    /// Whether claims were written that no device flush has covered yet: the
    /// background task then flushes, so that the window in which a crash
    /// leaves the last flush's batches unvouched for stays bounded.
    pub fn needs_durability_flush(&self) -> bool {
        let progress = self.shared.progress();
        !progress.durable.covers(&progress.written)
    }

    /// Bytes of markers written since the last call (for the pool's write
    /// counters).
    pub fn take_bytes_written(&self) -> u64 {
        self.shared.bytes_written.swap(0, Ordering::AcqRel)
    }

    /// Writes the waiting marker now, its delay cut short, unless the log
    /// carries it, after any marker being written, so that it is written
    /// (not flushed) when this returns: for closing the pool, before a
    /// device flush, and for tests that cut power right after a flush. The
    /// write runs in a task of its own, so that it completes even if the
    /// caller is abandoned.
    pub async fn settled(&self) {
        let guard = self.shared.write_lock.clone().lock_owned().await;
        let Some(waiting) = self.shared.take_waiting() else {
            return;
        };
        // The watcher, at its deadline, finds nothing waiting and ends (it
        // is not woken now: that could wake another thread).
        let shared = self.shared.clone();
        tokio::spawn(async move {
            write_unless_carried(&shared, &waiting).await;
            drop(guard);
        })
        .await
        .expect("flush marker write task");
    }
}

impl Shared {
    fn progress(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().expect("flush marker lock poisoned")
    }

    /// The waiting marker, taken: the caller writes it unless carried.
    fn take_waiting(&self) -> Option<Waiting> {
        self.progress().waiting.take()
    }

    /// Whether the log's summaries vouch for everything claimed; if so a
    /// waiting marker is dropped. A watcher on this thread is woken to end
    /// now (a wake-up within the thread, and its timer never fires); one on
    /// another thread is left to end at its deadline or to serve the next
    /// flush's marker (waking it would wake that thread).
    fn forget_carried(&self) -> bool {
        let watcher_here = {
            let mut progress = self.progress();
            if !progress
                .written
                .carried_by(self.log_claim.load(Ordering::Acquire))
            {
                return false;
            }
            progress.waiting = None;
            progress.watcher_thread == Some(std::thread::current().id())
        };
        if watcher_here {
            self.look_again.notify_one();
        }
        true
    }

    /// The marker record to write now for `claims`, or `None` when the log's
    /// summaries already vouch for them.
    fn record_unless_carried(&self, claims: MarkerClaims) -> Option<FlushMarkerRecord> {
        let log_claim = self.log_claim.load(Ordering::Acquire);
        if claims.carried_by(log_claim) {
            return None;
        }
        let mut progress = self.progress();
        let record = FlushMarkerRecord {
            pool_identifier: self.pool_identifier,
            marker_sequence: progress.next_marker_sequence,
            flushed_through_sequence: claims.flushed_through,
            flash_flushed_through_sequence: claims.flash_flushed_through,
        };
        progress.next_marker_sequence += 1;
        Some(record)
    }
}

/// The watcher: waits until the waiting marker's deadline (moved on by
/// each flush that finds a marker waiting) or until told to look again,
/// then writes it unless the log carries it; ends once nothing waits.
async fn watch(shared: Arc<Shared>, mut deadline: Instant) {
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => {}
            () = shared.look_again.notified() => {}
        }
        let guard = shared.write_lock.lock().await;
        let waiting = {
            let mut progress = shared.progress();
            match &progress.waiting {
                None => {
                    progress.watcher_thread = None;
                    return;
                }
                Some(waiting) if Instant::now() < waiting.deadline => {
                    deadline = waiting.deadline;
                    continue;
                }
                Some(_) => progress.waiting.take().expect("matched above"),
            }
        };
        write_unless_carried(&shared, &waiting).await;
        drop(guard);
    }
}

/// Writes a marker saying `waiting.claims` (what was claimed when its
/// flush completed) unless the log carries them.
async fn write_unless_carried(shared: &Shared, waiting: &Waiting) {
    let Some(record) = shared.record_unless_carried(waiting.claims) else {
        return;
    };
    let slot = FLUSH_MARKER_BLOCKS[(record.marker_sequence % 2) as usize];
    let encoded = record.encode();
    // Paired check: recovery verifies the marker after reading it.
    assert_eq!(
        FlushMarkerRecord::decode(&encoded).ok(),
        Some(record),
        "a flush marker does not round-trip"
    );
    let buffer = Arc::new(lamina_device::AlignedBuffer::from_slice_padded(&encoded));
    match waiting.device.write(slot * BLOCK_SIZE_BYTES, buffer).await {
        Ok(()) => {
            shared
                .bytes_written
                .fetch_add(BLOCK_SIZE_BYTES, Ordering::AcqRel);
        }
        // The marker only narrows what recovery must treat as possibly
        // torn; without it recovery falls back to what the log says.
        Err(error) => tracing::error!(%error, "flush marker write failed"),
    }
}

#[cfg(test)]
mod tests {
    use lamina_device::MemoryDevice;

    use super::*;

    const DELAY: Duration = Duration::from_micros(FLUSH_MARKER_DELAY_US);

    fn claims(sequence: u64) -> MarkerClaims {
        MarkerClaims {
            flushed_through: sequence,
            flash_flushed_through: sequence,
        }
    }

    /// The markers on the device, by marker sequence.
    async fn markers_on(device: &Arc<dyn BlockDevice>) -> Vec<FlushMarkerRecord> {
        let mut markers = Vec::new();
        for block in FLUSH_MARKER_BLOCKS {
            let bytes = device
                .read(block * BLOCK_SIZE_BYTES, crate::BLOCK_BYTES)
                .await
                .unwrap();
            markers.extend(FlushMarkerRecord::decode(&bytes).ok());
        }
        markers.sort_by_key(|marker| marker.marker_sequence);
        markers
    }

    fn newest_claim(markers: &[FlushMarkerRecord]) -> Option<u64> {
        markers.last().map(|marker| marker.flushed_through_sequence)
    }

    fn memory_device() -> Arc<dyn BlockDevice> {
        Arc::new(MemoryDevice::new(1 << 20))
    }

    /// Lets the watcher run at the time the clock shows.
    async fn advance(by: Duration) {
        tokio::time::advance(by).await;
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_marker_the_log_does_not_carry_is_written_once_the_delay_after_the_last_flush_ends() {
        let device = memory_device();
        let marker = FlushMarker::new(7, None);
        marker.after_device_flush(&device, claims(0), claims(1));
        advance(DELAY * 6 / 10).await;
        assert!(markers_on(&device).await.is_empty(), "still waiting");
        // The next flush writes the waiting marker before its device flush,
        // then leaves its own waiting, whose delay runs from now: the
        // watcher wakes at the first deadline and waits on.
        assert_eq!(marker.before_device_flush().await, claims(1));
        assert_eq!(newest_claim(&markers_on(&device).await), Some(1));
        marker.after_device_flush(&device, claims(1), claims(2));
        advance(DELAY * 6 / 10).await;
        assert_eq!(
            newest_claim(&markers_on(&device).await),
            Some(1),
            "the second flush's marker waits a whole delay from that flush"
        );
        // Tokio's timers tick in milliseconds: a deadline is rounded up.
        advance(DELAY * 2).await;
        assert_eq!(newest_claim(&markers_on(&device).await), Some(2));
        assert_eq!(marker.take_bytes_written(), 2 * BLOCK_SIZE_BYTES);
        assert!(
            marker.shared.progress().watcher_thread.is_none(),
            "nothing waits: the watcher ended"
        );
        assert!(marker.needs_durability_flush());
    }

    #[tokio::test(start_paused = true)]
    async fn a_marker_the_log_carries_is_not_written_and_the_watcher_ends() {
        let device = memory_device();
        let marker = FlushMarker::new(7, None);
        for sequence in 1..=50 {
            marker.after_device_flush(&device, claims(sequence - 1), claims(sequence));
            advance(DELAY / 4).await;
            // A batch sealed after the flush was written.
            marker.claimed_by_log(sequence);
            assert_eq!(marker.before_device_flush().await, claims(sequence));
        }
        marker.after_device_flush(&device, claims(50), claims(51));
        marker.claimed_by_log(51);
        advance(DELAY * 2).await;
        assert!(markers_on(&device).await.is_empty());
        assert!(marker.shared.progress().watcher_thread.is_none());
        // A flush the log does not carry, settled at once (closing).
        marker.after_device_flush(&device, claims(51), claims(52));
        marker.settled().await;
        assert_eq!(newest_claim(&markers_on(&device).await), Some(52));
        advance(DELAY * 2).await;
        assert_eq!(markers_on(&device).await.len(), 1, "written once");
        assert!(marker.shared.progress().watcher_thread.is_none());
    }
}
