//! Flushing the two tiers apart (decision 0032). A client's flush needs only
//! the flash tier durable (client data and control records are never written
//! to capacity); the capacity tier's flush, which on an object store uploads
//! what was demoted, is made by the work that needs it — the demoter and the
//! cleaner before they count on freed segments, checkpoints for the batches
//! they cover, the background loop — and never under the `flush_lock`, so a
//! slow or unreachable store never holds up a client's flush. The log's
//! durable point (`LogWriter::durable_through`: the log's claims and the
//! reuse of dead segments) is the lower of the two tiers', so a flash
//! segment whose blocks were demoted is reused only once their capacity
//! copies are durable.
//!
//! These are the core's operations (`impl Core`): sealing the open batch,
//! the flash flush with its flush marker (what `Pool::flush` does), the
//! capacity flush, both (`Pool::flush_all`), and the capacity tier's
//! retries, so that the services, which hold the core and not the front,
//! flush through them too; the front's flushes delegate to them.
//!
//! A failed capacity flush suspends the capacity tier's writes
//! (`capacity_writes`) instead of failing the pool; the demoter retries it
//! with a doubling delay, and `Pool::resume_capacity_writes` at once.

use std::sync::Arc;
use tokio::time::Instant;

use lamina_device::DeviceError;

use crate::BLOCK_SIZE_BYTES;
use crate::error::{EngineError, IoError};
use crate::pool::core::Core;
use crate::pool::io::flush_marker::MarkerClaims;
use crate::pool::io::flush_stages::FlushStage;
use crate::pool::io::writer::LogWriter;

/// How long a client's flush waits for the capacity tier's flush before it
/// goes on with flash alone (decision 0032): long enough for an object
/// store's upload of a few segments (PUT p99 1.3 s measured on SeaweedFS),
/// short enough that a store going away costs a client little before the
/// tier's writes are suspended.
pub const CLIENT_FLUSH_CAPACITY_WAIT_MS: u64 = 2_000;

/// What a flush marker written now says (see `flush_marker`).
pub(in crate::pool) fn marker_claims(writer: &LogWriter) -> MarkerClaims {
    MarkerClaims {
        flushed_through: writer.durable_through(),
        flash_flushed_through: writer.flash_durable_through().max(writer.durable_through()),
    }
}

impl Core {
    /// Flushes the flash tier (the whole device in a one-tier pool).
    pub(in crate::pool) async fn flush_flash(&self) -> Result<(), DeviceError> {
        if !self.geometry().has_capacity_tier() {
            return self.device().flush().await;
        }
        let flash_bytes = self.geometry().capacity_start_block * BLOCK_SIZE_BYTES;
        self.device().flush_range(0, flash_bytes).await
    }

    /// Flushes the capacity tier of a two-tier pool.
    async fn flush_capacity_tier(&self) -> Result<(), DeviceError> {
        let capacity_start_bytes = self.geometry().capacity_start_block * BLOCK_SIZE_BYTES;
        self.device()
            .flush_range(
                capacity_start_bytes,
                self.geometry().device_size_bytes - capacity_start_bytes,
            )
            .await
    }

    /// Makes every batch up to `target` durable on both tiers (see
    /// `Pool::flush_all`).
    pub(in crate::pool) async fn flush_all_through(&self, target: u64) -> Result<(), EngineError> {
        self.flush_through(target).await?;
        if !self.geometry().has_capacity_tier() || self.lock().writer().durable_through() >= target
        {
            return Ok(());
        }
        self.flush_capacity(false).await
    }

    /// Flushes the capacity tier and makes what it covers durable; refused
    /// at once while the tier's writes are suspended, unless `retry`.
    pub(in crate::pool) async fn flush_capacity(&self, retry: bool) -> Result<(), EngineError> {
        let covered = {
            let state = self.lock();
            state.check_failed()?;
            if let Some(suspension) = &state.capacity_writes().status().suspended
                && !retry
            {
                return Err(self.capacity_unavailable(suspension.last_error.clone()));
            }
            state.writer().written_through()
        };
        let result = self.flush_capacity_tier().await;
        let mut state = self.lock();
        let device = self.device().name();
        match result {
            Ok(()) => {
                state.capacity_flush_succeeded(device, covered);
                Ok(())
            }
            Err(error) => {
                state.capacity_flush_failed(device, &error.to_string());
                Err(self.capacity_unavailable(error.to_string()))
            }
        }
    }

    /// Whether the capacity tier's writes are suspended.
    pub(in crate::pool) fn capacity_writes_suspended(&self) -> bool {
        self.lock().capacity_writes().is_suspended()
    }

    /// Seals the open batches and starts their writes: the sequence a
    /// flush must make durable for every write acknowledged so far; refused
    /// once the pool has failed. (Write-behind seals in the write's own
    /// hold of the state lock: `io/write.rs`.)
    pub(in crate::pool) fn seal_for_flush(self: &Arc<Self>) -> Result<u64, EngineError> {
        let mut state = self.lock();
        state.check_failed()?;
        let batches = state.seal_open_batch();
        let through = state.writer().sealed_through();
        drop(state);
        self.spawn_writes(batches);
        Ok(through)
    }

    /// Makes every batch up to `target` on flash durable (in a one-tier
    /// pool, every batch up to `target`); see `tier_flush` for capacity.
    pub(in crate::pool) async fn flush_through(&self, target: u64) -> Result<(), EngineError> {
        if self.lock().writer().flash_durable_through() >= target {
            self.flush_stages().covered();
            return Ok(());
        }
        let stages = self.flush_stages();
        let mut stage_started = Instant::now();
        let mut stage_ended = |stage| {
            let now = Instant::now();
            stages.spent(stage, now - stage_started);
            stage_started = now;
        };
        self.wait_unless_device_full(|state| {
            state.writer().written_through() >= target || state.writer().failed().is_some()
        })
        .await?;
        stage_ended(FlushStage::BatchWrites);
        let _guard = self.flush_lock().lock().await;
        stage_ended(FlushStage::FlushLock);
        let (covered, sealed_bytes) = {
            let state = self.lock();
            state.check_failed()?;
            if state.writer().flash_durable_through() >= target {
                stages.covered();
                return Ok(());
            }
            (
                state.writer().written_through(),
                state.counters().sealed_bytes(),
            )
        };
        // While the capacity tier takes writes, a client's flush makes it
        // durable too (every batch through `target` is written), so that the
        // log's claim covers every batch a client was told is durable:
        // recovery then reports a damaged block of such a batch as an error
        // instead of dropping it as part of a torn tail. A failure suspends
        // the tier's writes, and a capacity flush slower than
        // `CLIENT_FLUSH_CAPACITY_WAIT_MS` is given up (the device's flush is
        // safe to abandon); either way the flush goes on with flash alone,
        // where the client's data is (decision 0032).
        if self.geometry().has_capacity_tier() && !self.capacity_writes_suspended() {
            let wait = std::time::Duration::from_millis(CLIENT_FLUSH_CAPACITY_WAIT_MS);
            let _ = tokio::time::timeout(wait, self.flush_capacity(false)).await;
        }
        stage_ended(FlushStage::CapacityFlush);
        let marker_covered = self.flush_marker().before_device_flush().await;
        stage_ended(FlushStage::MarkerWrite);
        let flushed = self.flush_flash().await;
        stage_ended(FlushStage::DeviceFlush);
        stages.device_flushed();
        if let Err(error) = flushed {
            let mut state = self.lock();
            state.fail_writes(error.to_string());
            return Err(error.into());
        }
        let claims = {
            let mut state = self.lock();
            state.flash_flush_completed(covered, sealed_bytes);
            marker_claims(state.writer())
        };
        self.write_flush_marker(marker_covered, claims);
        Ok(())
    }

    /// After a device flush: starts the flush marker's wait and write (see
    /// `flush_marker`) and counts the bytes of markers written so far.
    pub(in crate::pool) fn write_flush_marker(
        &self,
        marker_covered: MarkerClaims,
        claims: MarkerClaims,
    ) {
        self.flush_marker()
            .after_device_flush(self.device(), marker_covered, claims);
        self.count_flush_marker_bytes();
    }

    /// Adds the bytes of flush markers written since the last count to the
    /// pool's write counters.
    pub(in crate::pool) fn count_flush_marker_bytes(&self) {
        let marker_bytes = self.flush_marker().take_bytes_written();
        if marker_bytes > 0 {
            self.lock().flush_marker_written(marker_bytes);
        }
    }

    /// The error a refused capacity flush reports.
    pub(in crate::pool) fn capacity_unavailable(&self, error: String) -> EngineError {
        EngineError::Io(IoError::CapacityUnavailable {
            device: self.device().name().to_string(),
            error,
        })
    }
}

impl Core {
    /// Makes every write acknowledged so far durable on flash (what
    /// `Pool::flush` does): seals the open batch and flushes through it.
    pub(in crate::pool) async fn flush(self: &Arc<Self>) -> Result<(), EngineError> {
        self.write_behind().flushed();
        let target = self.seal_for_flush()?;
        self.flush_through(target).await
    }

    /// Makes every batch sealed so far durable on both tiers: what frees
    /// dead segments and what a checkpoint covers. In a two-tier pool whose
    /// capacity tier's writes are suspended this makes flash durable and
    /// fails with `IoError::CapacityUnavailable` (the pool goes on).
    pub(in crate::pool) async fn flush_all(self: &Arc<Self>) -> Result<(), EngineError> {
        let target = self.seal_for_flush()?;
        self.flush_all_through(target).await
    }

    /// Makes the newest flush marker durable when no flush has covered it
    /// yet (the flush-and-checkpoint loop's part of `flush_marker`).
    pub(in crate::pool) async fn flush_marker_durably(&self) -> Result<(), EngineError> {
        if !self.flush_marker().needs_durability_flush() {
            return Ok(());
        }
        let _guard = self.flush_lock().lock().await;
        self.lock().check_failed()?;
        let marker_covered = self.flush_marker().before_device_flush().await;
        // The marker lives on flash.
        self.flush_flash().await?;
        let claims = marker_claims(self.lock().writer());
        self.write_flush_marker(marker_covered, claims);
        Ok(())
    }

    /// Tries the capacity tier's flush now if its writes are suspended;
    /// once it succeeds, demotion and checkpoints resume. `Ok` when the tier
    /// takes writes (a one-tier pool has none to suspend).
    pub(in crate::pool) async fn resume_capacity_writes(&self) -> Result<(), EngineError> {
        if !self.capacity_writes_suspended() {
            return Ok(());
        }
        self.flush_capacity(true).await
    }

    /// The demoter's part: a suspended tier's retry, when due. Returns
    /// whether the tier takes writes now. Failed retries are not errors of
    /// the demoter (`capacity_writes` logs the changes of state).
    pub(in crate::pool) async fn retry_capacity_writes_when_due(&self) -> bool {
        let due = {
            let state = self.lock();
            if !state.capacity_writes().is_suspended() {
                return true;
            }
            state.capacity_writes().retry_due()
        };
        due && self.flush_capacity(true).await.is_ok()
    }
}
