//! The pool's shared core: the [`Pool`] handle and what every part of the
//! engine reaches through it ([`Core`]: the device, the limits, the state
//! mutex, the locks that order background work, the cache, the flush marker,
//! the integrity counters), and the two waits everything builds on: batch
//! writes to the device (retried while the device under the pool is full)
//! and waiting for batch writes to complete. `Core`'s fields are private to
//! this module: the services and the core's operations in other files reach
//! each part through a method named after it, and the state only through
//! [`Core::lock`] and `State`'s named operations.
//!
//! Lock order (a lock may be taken while holding only locks above it):
//! 1. `reclaim_lock()`, then `cleaner_lock()` (async; one foreground
//!    reclaim, taken by a writer's `Cleaner::reclaim`, which cleans under
//!    it; one cleaning pass, taken by the `Cleaner` and by evacuation's
//!    move of a victim);
//! 2. `checkpoint_lock()` (async; one checkpoint at a time, taken by the
//!    `Checkpointer`);
//! 3. `flush_lock()` (async; one device flush at a time, taken by the
//!    core's flushes in `tiering/flush.rs`), and apart from it the segment
//!    openings recorder's (async; one record write at a time, taken by
//!    batch writes holding no other lock);
//! 4. an `rmw_lock(stripe)` (async; read-modify-write of one block, taken
//!    by writes, `io/write.rs`);
//! 5. `state` ([`Core::lock`], std mutex): never held across an `.await`,
//!    and never while taking another lock; the memory cache's shard mutexes
//!    and the device-full condition's own mutex are leaves taken inside or
//!    outside it.
//!
//! `state` is the one global lock of the hot paths: a read takes it once to
//! plan, a write once per batch of blocks appended (the checksums computed
//! before), and the cache is looked in and filled outside it (one-tier
//! pools). What each path takes, in order: docs/ARCHITECTURE.md, "What the
//! hot paths take".
//!
//! The background budget's mutex (`budget`) is a leaf too; its `acquire` is
//! awaited holding none of the locks above (work waiting for its turn
//! must not hold up a writer's reclaim or a flush).

pub(super) mod counters;
pub mod integrity;
pub(crate) mod limits;
pub(super) mod state;
pub(super) mod supervisor;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lamina_device::{AlignedBuffer, BlockDevice, DeviceError};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::budget::BackgroundBudget;
use crate::convert::milliseconds_saturating;
use crate::error::{EngineError, IoError};
use crate::log::geometry::Geometry;
use crate::pool::cache_warmup::progress::CacheWarmer;
use crate::pool::checkpoint::increment::CheckpointChain;
use crate::pool::core::integrity::Integrity;
use crate::pool::core::limits::PoolLimits;
use crate::pool::core::state::State;
use crate::pool::core::supervisor::Supervisor;
use crate::pool::io::device_full::{DEVICE_FULL_FIRST_RETRY_DELAY_MS, DeviceFull};
use crate::pool::io::flush_marker::FlushMarker;
use crate::pool::io::flush_stages::FlushStages;
use crate::pool::io::space_waits::SpaceWaits;
use crate::pool::io::write_behind::WriteBehind;
use crate::pool::io::writer::InFlightBatch;
use crate::pool::openings::OpeningsRecorder;
use crate::pool::repair::rebuild::progress::Rebuilder;
use crate::pool::repair::scrub::progress::Scrubber;
use crate::pool::space::segment_shapes::SegmentShapes;
use crate::tier::memory_cache::MemoryCache;
use crate::{BLOCK_BYTES, BLOCK_SIZE_BYTES};

/// Number of striped locks serialising read-modify-write of partial blocks.
pub(super) const RMW_LOCK_COUNT: usize = 1024;

/// The pool's shared core: what every part of the engine works on. Its
/// parts are private to `core/`; the subsystems reach them through the
/// named methods below (the state only through [`Core::lock`]).
pub(crate) struct Core {
    device: Arc<dyn BlockDevice>,
    geometry: Geometry,
    /// Each segment's size and row on the device (narrower on an array
    /// after a loss).
    shapes: SegmentShapes,
    limits: PoolLimits,
    state: Mutex<State>,
    /// Woken whenever an in-flight batch completes.
    progress: Notify,
    /// One device flush at a time, so that concurrent flushes coalesce.
    flush_lock: tokio::sync::Mutex<()>,
    /// One checkpoint at a time; holds the chain the next one may extend.
    checkpoint_lock: tokio::sync::Mutex<CheckpointChain>,
    /// One cleaning pass at a time.
    cleaner_lock: tokio::sync::Mutex<()>,
    /// One foreground reclaim at a time; other blocked writers wait for it.
    reclaim_lock: tokio::sync::Mutex<()>,
    rmw_locks: Vec<tokio::sync::Mutex<()>>,
    cache: Arc<MemoryCache>,
    /// Whether batch writes are waiting for space under the device.
    device_full: DeviceFull,
    /// The background tasks' handles and their stop signal, set when the
    /// pool is closed or abandoned: background work stops.
    supervisor: Supervisor,
    /// Damage found and what was done about it.
    integrity: Integrity,
    /// The durable record of how far completed flushes reached.
    flush_marker: FlushMarker,
    /// Writes the segment openings record before a new segment's first
    /// batch counts as written.
    openings: OpeningsRecorder,
    /// Scrub's progress (one scrub at a time).
    scrub: Scrubber,
    /// The rebuild's progress (one rebuild at a time).
    rebuild: Rebuilder,
    /// The memory cache's warm-up after a restart (one per opening).
    cache_warmup: CacheWarmer,
    /// The rate background work (rebuild, cleaner, demoter, scrub) may
    /// issue, following client latency.
    budget: BackgroundBudget,
    /// Writes that found no free segment and waited for a reclaim.
    space_waits: SpaceWaits,
    /// Where the flash tier's flushes spend their time.
    flush_stages: FlushStages,
    /// Whether writes are sealed at once for a writer that flushes after
    /// each of them.
    write_behind: WriteBehind,
}

/// A pool on one device. Cheap to clone; all clones share one engine.
#[derive(Clone)]
pub struct Pool {
    pub(super) core: Arc<Core>,
}

/// What a core is built from: the device, the limits, the recovered (or
/// new) state and the flush marker and openings recorder that go on from it.
pub(in crate::pool) struct CoreParts {
    pub(in crate::pool) device: Arc<dyn BlockDevice>,
    pub(in crate::pool) limits: PoolLimits,
    pub(in crate::pool) state: State,
    pub(in crate::pool) flush_marker: FlushMarker,
    pub(in crate::pool) openings: OpeningsRecorder,
}

impl Core {
    pub(in crate::pool) fn new(parts: CoreParts) -> Arc<Self> {
        let CoreParts {
            device,
            limits,
            state,
            flush_marker,
            openings,
        } = parts;
        let budget = BackgroundBudget::new(limits.background_impact, limits.background_budget());
        Arc::new(Self {
            cache: state.cache().clone(),
            shapes: state.shapes().clone(),
            device,
            geometry: *state.geometry(),
            limits,
            state: Mutex::new(state),
            progress: Notify::new(),
            flush_lock: tokio::sync::Mutex::new(()),
            checkpoint_lock: tokio::sync::Mutex::new(CheckpointChain::default()),
            cleaner_lock: tokio::sync::Mutex::new(()),
            reclaim_lock: tokio::sync::Mutex::new(()),
            rmw_locks: (0..RMW_LOCK_COUNT)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            device_full: DeviceFull::default(),
            supervisor: Supervisor::default(),
            integrity: Integrity::default(),
            scrub: Scrubber::default(),
            rebuild: Rebuilder::default(),
            cache_warmup: CacheWarmer::default(),
            budget,
            space_waits: SpaceWaits::default(),
            flush_stages: FlushStages::default(),
            write_behind: WriteBehind::default(),
            flush_marker,
            openings,
        })
    }
}

/// The core's parts, by name, for the subsystems that work on them.
impl Core {
    pub(in crate::pool) fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.device
    }

    pub(in crate::pool) fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Each segment's size and row on the device.
    pub(in crate::pool) fn shapes(&self) -> &SegmentShapes {
        &self.shapes
    }

    pub(in crate::pool) fn limits(&self) -> &PoolLimits {
        &self.limits
    }

    /// One device flush at a time (lock order 3).
    pub(in crate::pool) fn flush_lock(&self) -> &tokio::sync::Mutex<()> {
        &self.flush_lock
    }

    /// One checkpoint at a time, holding the chain the next one may extend
    /// (lock order 2).
    pub(in crate::pool) fn checkpoint_lock(&self) -> &tokio::sync::Mutex<CheckpointChain> {
        &self.checkpoint_lock
    }

    /// One cleaning pass at a time (lock order 1).
    pub(in crate::pool) fn cleaner_lock(&self) -> &tokio::sync::Mutex<()> {
        &self.cleaner_lock
    }

    /// One foreground reclaim at a time (lock order 1, after the cleaner's).
    pub(in crate::pool) fn reclaim_lock(&self) -> &tokio::sync::Mutex<()> {
        &self.reclaim_lock
    }

    /// The read-modify-write lock of stripe `index` (lock order 4).
    pub(in crate::pool) fn rmw_lock(&self, index: usize) -> &tokio::sync::Mutex<()> {
        &self.rmw_locks[index]
    }

    pub(in crate::pool) fn cache(&self) -> &Arc<MemoryCache> {
        &self.cache
    }

    pub(in crate::pool) fn device_full(&self) -> &DeviceFull {
        &self.device_full
    }

    pub(in crate::pool) fn supervisor(&self) -> &Supervisor {
        &self.supervisor
    }

    pub(in crate::pool) fn integrity(&self) -> &Integrity {
        &self.integrity
    }

    pub(in crate::pool) fn flush_marker(&self) -> &FlushMarker {
        &self.flush_marker
    }

    pub(in crate::pool) fn openings(&self) -> &OpeningsRecorder {
        &self.openings
    }

    pub(in crate::pool) fn scrub(&self) -> &Scrubber {
        &self.scrub
    }

    pub(in crate::pool) fn rebuild(&self) -> &Rebuilder {
        &self.rebuild
    }

    pub(in crate::pool) fn cache_warmup(&self) -> &CacheWarmer {
        &self.cache_warmup
    }

    pub(in crate::pool) fn budget(&self) -> &BackgroundBudget {
        &self.budget
    }

    pub(in crate::pool) fn space_waits(&self) -> &SpaceWaits {
        &self.space_waits
    }

    pub(in crate::pool) fn flush_stages(&self) -> &FlushStages {
        &self.flush_stages
    }

    pub(in crate::pool) fn write_behind(&self) -> &WriteBehind {
        &self.write_behind
    }
}

impl Core {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("pool state lock poisoned")
    }

    /// Whether the pool was closed or abandoned: background work stops.
    pub(in crate::pool) fn background_stopped(&self) -> bool {
        self.supervisor.is_stopping()
    }

    /// Waits until `condition` holds, re-checking whenever a batch completes.
    pub(in crate::pool) async fn wait_for(&self, condition: impl Fn(&State) -> bool) {
        loop {
            let notified = self.progress.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if condition(&self.lock()) {
                return;
            }
            notified.await;
        }
    }

    /// Writes sealed batches to the device in background tasks, so that a client
    /// that goes away mid-request cannot leave a batch unwritten.
    pub(in crate::pool) fn spawn_writes(self: &Arc<Self>, batches: Vec<Arc<InFlightBatch>>) {
        for batch in batches {
            let core = self.clone();
            tokio::spawn(async move {
                let result = match batch.opens_segment {
                    // The first batch of a new segment: written once the
                    // segment openings record lists the segment too.
                    Some(segment_sequence) => {
                        let (recorded, written) = tokio::join!(
                            core.record_opening(segment_sequence),
                            write_batch(&core, &batch)
                        );
                        recorded.and(written)
                    }
                    None => write_batch(&core, &batch).await,
                };
                if result.is_ok() {
                    // Recently written blocks are the likeliest to be read soon.
                    for (index, block) in batch.buffer.chunks(BLOCK_BYTES).enumerate().skip(1) {
                        core.cache.insert(batch.summary_block + index as u64, block);
                    }
                }
                {
                    let mut state = core.lock();
                    if let Err(error) = result {
                        tracing::error!(%error, "batch write failed; the pool refuses further writes");
                        state.fail_writes(error.to_string());
                    }
                    state.batch_written(&batch);
                    // The summaries on the device may now vouch for the last
                    // flush, so that its marker need not be written.
                    core.flush_marker
                        .claimed_by_log(state.writer().claims_written());
                }
                core.progress.notify_waiters();
            });
        }
    }
}

/// Writes one sealed batch. While the device is out of space the write is
/// retried (the whole batch: a write at the same place is idempotent, so a
/// partial one does no harm); any other error, or the pool shutting down, ends
/// the attempts with that error.
pub(super) async fn write_batch(core: &Core, batch: &InFlightBatch) -> Result<(), DeviceError> {
    batch.check_summary();
    let offset = batch.summary_block * BLOCK_SIZE_BYTES;
    write_retried_while_full(core, offset, &batch.buffer).await
}

/// Writes `buffer` at `offset`, retried like a batch (see [`write_batch`])
/// while the device is out of space: the log's own writes, which a batch's
/// completion waits for (the segment openings record).
pub(super) async fn write_retried_while_full(
    core: &Core,
    offset: u64,
    buffer: &Arc<AlignedBuffer>,
) -> Result<(), DeviceError> {
    let retry_interval_ms = core.limits.device_full_retry_interval_ms;
    let mut delay_ms = DEVICE_FULL_FIRST_RETRY_DELAY_MS.min(retry_interval_ms);
    let mut waiting = false;
    loop {
        let result = core.device.write(offset, buffer.clone()).await;
        let shutting_down = core.supervisor.is_stopping();
        match result {
            Err(error) if error.is_out_of_space() && !shutting_down => {
                if !waiting {
                    waiting = true;
                    core.device_full.batch_waits(
                        &error,
                        retry_interval_ms,
                        core.limits.device_full_wait_ms_max,
                    );
                    // Flushes waiting for this batch re-check their bound.
                    core.progress.notify_waiters();
                }
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                core.device_full.retried();
                delay_ms = (delay_ms * 2).min(retry_interval_ms);
            }
            result => {
                if waiting {
                    core.device_full.batch_stopped_waiting(result.is_ok());
                }
                return result;
            }
        }
    }
}

impl Core {
    /// Waits until `condition` holds, re-checking whenever a batch completes,
    /// like `wait_for`; but while the device is full this waits at
    /// most `device_full_wait_ms_max` from the call, then fails with
    /// [`IoError::DeviceFull`] (ENOSPC to NBD clients). For a flush
    /// waiting for its batches and a writer waiting for an in-flight slot; the
    /// batches stay in flight, so a later flush can still make them durable.
    pub(in crate::pool) async fn wait_unless_device_full(
        &self,
        condition: impl Fn(&State) -> bool,
    ) -> Result<(), EngineError> {
        let started = Instant::now();
        let wait_max = Duration::from_millis(self.limits.device_full_wait_ms_max);
        loop {
            let notified = self.progress.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if condition(&self.lock()) {
                return Ok(());
            }
            if !self.device_full.is_full() {
                notified.await;
                continue;
            }
            let waited = started.elapsed();
            if waited >= wait_max {
                return Err(EngineError::Io(IoError::DeviceFull {
                    device: self.device.name().to_string(),
                    waited_ms: milliseconds_saturating(waited),
                }));
            }
            // Progress wakes this early; the deadline ends the wait otherwise.
            let _ = tokio::time::timeout(wait_max - waited, notified).await;
        }
    }
}

/// An aligned copy of a byte slice, for writes of metadata.
pub(super) fn aligned(bytes: &[u8]) -> Arc<AlignedBuffer> {
    Arc::new(AlignedBuffer::from_slice_padded(bytes))
}
