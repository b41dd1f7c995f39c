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
//! flushes. The next device flush hurries a waiting marker and awaits it
//! first, so that it covers it; when no other flush follows, the pool's
//! background task does the same within `flush_interval_ms`
//! (`needs_durability_flush`). A crash inside that window (after a flush
//! completed, before its claim was durable) is the one case where recovery
//! cannot tell rot from a torn write in the last flush's batches;
//! docs/format.md, "Flush markers", bounds it.
//!
//! Lock order: the pool's `flush_lock`, then this component's `pending`
//! (only ever taken under `flush_lock` or at close), then its `progress`
//! (never held across an await).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lamina_device::BlockDevice;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

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
#[derive(Clone, Copy, Debug, Default)]
struct Progress {
    /// The sequence the next marker written gets (its slot is this modulo 2).
    next_marker_sequence: u64,
    /// The claims on the device or on their way: by a marker written or
    /// waiting to be, or by the log's summaries.
    written: MarkerClaims,
    /// The claims of the newest marker a device flush covered.
    durable: MarkerClaims,
}

/// The state a waiting marker's task shares with the component.
struct Shared {
    pool_identifier: u128,
    progress: Mutex<Progress>,
    /// `LogWriter::claims_written`, as the batch writes report it.
    log_claim: AtomicU64,
    /// Bytes of markers written, until the pool's counters take them.
    bytes_written: AtomicU64,
}

/// A marker waiting for its delay or for the log, and its write.
struct PendingMarker {
    /// Ends the wait at once: a device flush or closing needs the marker.
    hurry: Arc<Notify>,
    task: JoinHandle<()>,
}

pub struct FlushMarker {
    shared: Arc<Shared>,
    /// The newest marker's task, awaited before the next device flush.
    pending: tokio::sync::Mutex<Option<PendingMarker>>,
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
            }
        });
        Self {
            shared: Arc::new(Shared {
                pool_identifier,
                progress: Mutex::new(progress),
                log_claim: AtomicU64::new(0),
                bytes_written: AtomicU64::new(0),
            }),
            pending: tokio::sync::Mutex::new(None),
        }
    }

    /// The log has written summaries claiming flushes through `claim`, with
    /// every batch before them (`LogWriter::claims_written`).
    pub fn claimed_by_log(&self, claim: u64) {
        self.shared.log_claim.fetch_max(claim, Ordering::AcqRel);
    }

    /// Waits for the newest marker's write (hurried: its delay ends now), so
    /// that the device flush the caller is about to issue covers it. Returns
    /// what that flush will make durable. Call under the pool's flush lock.
    pub async fn before_device_flush(&self) -> MarkerClaims {
        if self.shared.carried_by_log() {
            // What the flush must cover is already in the log: the waiting
            // marker, hurried, finds so and ends on its own (or, if it was
            // already being written, adds a redundant marker), and the flush
            // does not wait for that task to be scheduled.
            if let Some(pending) = self.pending.lock().await.take() {
                pending.hurry.notify_one();
            }
        } else {
            self.settled().await;
        }
        self.shared.progress().written
    }

    /// After a device flush that covered the marker up to `covering` and made
    /// durable what `claims` says: a marker saying so waits for the log to
    /// carry the claim, then is written if it did not, unless what was
    /// written already says as much. Call under the pool's flush lock.
    pub async fn after_device_flush(
        &self,
        device: &Arc<dyn BlockDevice>,
        covering: MarkerClaims,
        claims: MarkerClaims,
    ) {
        assert!(
            claims.flash_flushed_through >= claims.flushed_through,
            "flash is durable at least as far as both tiers: {claims:?}"
        );
        let claims = {
            let mut progress = self.shared.progress();
            progress.durable = progress.durable.max(covering);
            if progress.written.covers(&claims) {
                return;
            }
            progress.written = progress.written.max(claims);
            progress.written
        };
        if claims.carried_by(self.shared.log_claim.load(Ordering::Acquire)) {
            return;
        }
        let hurry = Arc::new(Notify::new());
        let task = tokio::spawn(write_unless_carried(
            self.shared.clone(),
            device.clone(),
            claims,
            hurry.clone(),
        ));
        *self.pending.lock().await = Some(PendingMarker { hurry, task });
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

    /// Ends a waiting marker's delay and waits until it has been written (not
    /// flushed) or found carried by the log: for closing the pool, before a
    /// device flush, and for tests that cut power right after a flush.
    pub async fn settled(&self) {
        if let Some(pending) = self.pending.lock().await.take() {
            pending.hurry.notify_one();
            pending.task.await.expect("flush marker write task");
        }
    }
}

impl Shared {
    fn progress(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().expect("flush marker lock poisoned")
    }

    /// Whether the log's summaries already vouch for everything claimed.
    fn carried_by_log(&self) -> bool {
        let log_claim = self.log_claim.load(Ordering::Acquire);
        self.progress().written.carried_by(log_claim)
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

/// A waiting marker's task: waits [`FLUSH_MARKER_DELAY_US`] or until
/// hurried, then writes a marker saying `claims` (what was claimed when its
/// flush completed) unless the log carries them.
async fn write_unless_carried(
    shared: Arc<Shared>,
    device: Arc<dyn BlockDevice>,
    claims: MarkerClaims,
    hurry: Arc<Notify>,
) {
    let delay = Duration::from_micros(FLUSH_MARKER_DELAY_US);
    let _ = tokio::time::timeout(delay, hurry.notified()).await;
    let Some(record) = shared.record_unless_carried(claims) else {
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
    match device.write(slot * BLOCK_SIZE_BYTES, buffer).await {
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
