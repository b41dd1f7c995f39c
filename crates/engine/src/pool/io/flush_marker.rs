//! Writes the flush marker (`log::marker`) after each device flush, so that
//! recovery knows that the batches of the last flush before a crash were
//! durable: a block of theirs that fails its checksum is then reported as an
//! I/O error instead of being dropped as torn (which would silently return
//! an older version).
//!
//! The marker write costs the flush nothing: it is issued once the device
//! flush has completed and is not awaited by the flush that caused it. The
//! next device flush awaits it first, so that it covers it; when no other
//! flush follows, the pool's background task makes the marker durable within
//! `flush_interval_ms` (`needs_durability_flush`). A crash inside that window
//! (after a flush completed, before its marker was durable) is the one case
//! where recovery cannot tell rot from a torn write in the last flush's
//! batches; docs/format.md, "Flush markers", bounds it.
//!
//! Lock order: the pool's `flush_lock`, then this component's `pending`
//! (only ever taken under `flush_lock` or at close), then its `progress`
//! (never held across an await).

use std::sync::Arc;
use std::sync::Mutex;

use lamina_device::BlockDevice;
use tokio::task::JoinHandle;

use crate::BLOCK_SIZE_BYTES;
use crate::log::geometry::FLUSH_MARKER_BLOCKS;
use crate::log::marker::FlushMarkerRecord;

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
}

/// How far the markers have got.
#[derive(Clone, Copy, Debug, Default)]
struct Progress {
    /// The sequence the next marker gets (its slot is this modulo 2).
    next_marker_sequence: u64,
    /// The claims of the newest marker written (or being written).
    written: MarkerClaims,
    /// The claims of the newest marker a device flush covered.
    durable: MarkerClaims,
}

pub struct FlushMarker {
    pool_identifier: u128,
    progress: Mutex<Progress>,
    /// The write of the newest marker, awaited before the next device flush.
    pending: tokio::sync::Mutex<Option<JoinHandle<()>>>,
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
            pool_identifier,
            progress: Mutex::new(progress),
            pending: tokio::sync::Mutex::new(None),
        }
    }

    fn progress(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().expect("flush marker lock poisoned")
    }

    /// Waits for the newest marker's write, so that the device flush the
    /// caller is about to issue covers it. Returns what that flush will make
    /// durable. Call under the pool's flush lock.
    pub async fn before_device_flush(&self) -> MarkerClaims {
        self.settled().await;
        self.progress().written
    }

    /// After a device flush that covered the marker up to `covering` and made
    /// durable what `claims` says: starts writing a marker saying so, unless
    /// one already does. Returns the bytes it writes (for the pool's write
    /// counters). Call under the pool's flush lock.
    pub async fn after_device_flush(
        &self,
        device: &Arc<dyn BlockDevice>,
        covering: MarkerClaims,
        claims: MarkerClaims,
    ) -> u64 {
        assert!(
            claims.flash_flushed_through >= claims.flushed_through,
            "flash is durable at least as far as both tiers: {claims:?}"
        );
        let record = {
            let mut progress = self.progress();
            progress.durable = progress.durable.max(covering);
            if progress.written.covers(&claims) {
                return 0;
            }
            let claims = progress.written.max(claims);
            let record = FlushMarkerRecord {
                pool_identifier: self.pool_identifier,
                marker_sequence: progress.next_marker_sequence,
                flushed_through_sequence: claims.flushed_through,
                flash_flushed_through_sequence: claims.flash_flushed_through,
            };
            progress.next_marker_sequence += 1;
            progress.written = claims;
            record
        };
        let slot = FLUSH_MARKER_BLOCKS[(record.marker_sequence % 2) as usize];
        let device = device.clone();
        let write = tokio::spawn(async move {
            let encoded = record.encode();
            // Paired check: recovery verifies the marker after reading it.
            assert_eq!(
                FlushMarkerRecord::decode(&encoded).ok(),
                Some(record),
                "a flush marker does not round-trip"
            );
            let buffer =
                std::sync::Arc::new(lamina_device::AlignedBuffer::from_slice_padded(&encoded));
            if let Err(error) = device.write(slot * BLOCK_SIZE_BYTES, buffer).await {
                // The marker only narrows what recovery must treat as possibly
                // torn; without it recovery falls back to what the log says.
                tracing::error!(%error, "flush marker write failed");
            }
        });
        *self.pending.lock().await = Some(write);
        BLOCK_SIZE_BYTES
    }

    /// Whether a marker was written that no device flush has covered yet: the
    /// background task then flushes, so that the window in which a crash
    /// leaves the last flush's batches unvouched for stays bounded.
    pub fn needs_durability_flush(&self) -> bool {
        let progress = self.progress();
        !progress.durable.covers(&progress.written)
    }

    /// Waits until the newest marker has been written (not flushed): for
    /// closing the pool, and for tests that cut power right after a flush.
    pub async fn settled(&self) {
        if let Some(write) = self.pending.lock().await.take() {
            write.await.expect("flush marker write task");
        }
    }
}
