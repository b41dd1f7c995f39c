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
//! A failed capacity flush suspends the capacity tier's writes
//! (`capacity_writes`) instead of failing the pool; the demoter retries it
//! with a doubling delay, and `Pool::resume_capacity_writes` at once.

use lamina_device::DeviceError;

use crate::BLOCK_SIZE_BYTES;
use crate::error::{EngineError, IoError};
use crate::pool::core::{Inner, Pool};

impl Inner {
    /// Flushes the flash tier (the whole device in a one-tier pool).
    pub(in crate::pool) async fn flush_flash(&self) -> Result<(), DeviceError> {
        if !self.geometry.has_capacity_tier() {
            return self.device.flush().await;
        }
        let flash_bytes = self.geometry.capacity_start_block * BLOCK_SIZE_BYTES;
        self.device.flush_range(0, flash_bytes).await
    }

    /// Flushes the capacity tier of a two-tier pool.
    async fn flush_capacity_tier(&self) -> Result<(), DeviceError> {
        let capacity_start_bytes = self.geometry.capacity_start_block * BLOCK_SIZE_BYTES;
        self.device
            .flush_range(
                capacity_start_bytes,
                self.geometry.device_size_bytes - capacity_start_bytes,
            )
            .await
    }

    /// The error a refused capacity flush reports.
    pub(in crate::pool) fn capacity_unavailable(&self, error: String) -> EngineError {
        EngineError::Io(IoError::CapacityUnavailable {
            device: self.device.name().to_string(),
            error,
        })
    }
}

impl Pool {
    /// Makes every batch sealed so far durable on both tiers: what frees
    /// dead segments and what a checkpoint covers. In a two-tier pool whose
    /// capacity tier's writes are suspended this makes flash durable and
    /// fails with `IoError::CapacityUnavailable` (the pool goes on).
    pub async fn flush_all(&self) -> Result<(), EngineError> {
        let target = self.seal_for_flush()?;
        self.flush_all_through(target).await
    }

    /// Makes every batch up to `target` durable on both tiers (see
    /// [`Pool::flush_all`]).
    pub(in crate::pool) async fn flush_all_through(&self, target: u64) -> Result<(), EngineError> {
        self.flush_through(target).await?;
        if !self.inner.geometry.has_capacity_tier()
            || self.inner.lock().writer().durable_through() >= target
        {
            return Ok(());
        }
        self.flush_capacity(false).await
    }

    /// Flushes the capacity tier and makes what it covers durable; refused
    /// at once while the tier's writes are suspended, unless `retry`.
    pub(in crate::pool) async fn flush_capacity(&self, retry: bool) -> Result<(), EngineError> {
        let covered = {
            let state = self.inner.lock();
            state.check_failed()?;
            if let Some(suspension) = &state.capacity_writes().status().suspended
                && !retry
            {
                return Err(self
                    .inner
                    .capacity_unavailable(suspension.last_error.clone()));
            }
            state.writer().written_through()
        };
        let result = self.inner.flush_capacity_tier().await;
        let mut state = self.inner.lock();
        let device = self.inner.device.name();
        match result {
            Ok(()) => {
                state.capacity_writes_mut().flush_succeeded(device);
                state.writer_mut().capacity_flushed(covered);
                // Deaths just made durable free their segments (decision 0006).
                state.free_reusable_dead_segments();
                Ok(())
            }
            Err(error) => {
                state
                    .capacity_writes_mut()
                    .flush_failed(device, &error.to_string());
                Err(self.inner.capacity_unavailable(error.to_string()))
            }
        }
    }

    /// Tries the capacity tier's flush now if its writes are suspended;
    /// once it succeeds, demotion and checkpoints resume. `Ok` when the tier
    /// takes writes (a one-tier pool has none to suspend).
    pub async fn resume_capacity_writes(&self) -> Result<(), EngineError> {
        if !self.inner.lock().capacity_writes().is_suspended() {
            return Ok(());
        }
        self.flush_capacity(true).await
    }

    /// The demoter's part: a suspended tier's retry, when due. Returns
    /// whether the tier takes writes now. Failed retries are not errors of
    /// the demoter (`capacity_writes` logs the changes of state).
    pub(in crate::pool) async fn retry_capacity_writes_when_due(&self) -> bool {
        let due = {
            let state = self.inner.lock();
            if !state.capacity_writes().is_suspended() {
                return true;
            }
            state.capacity_writes().retry_due()
        };
        due && self.flush_capacity(true).await.is_ok()
    }

    /// Whether the capacity tier's writes are suspended.
    pub(in crate::pool) fn capacity_writes_suspended(&self) -> bool {
        self.inner.lock().capacity_writes().is_suspended()
    }
}
