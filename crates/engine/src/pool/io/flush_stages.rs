//! Where a flush's time goes (issue 46): the flash tier's flushes counted
//! since the pool opened, with the time spent in each stage a flush waits
//! for, in order: the batch writes it must cover (the open batch sealed by
//! the flush, and any still in flight), the flush lock (another flush
//! under way), the capacity tier's flush (two-tier pools), the previous
//! flush marker's write (which the device flush must cover), and the
//! device flush itself. A flush that finds its batches already made durable
//! by another is counted as covered and spends time only in the stages it
//! waited in. Shown by `pool status` and `/metrics`; the benchmarks divide
//! each stage's time by the flushes to say where a FLUSH's latency goes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

/// The stages of a flush, in the order a flush goes through them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::pool) enum FlushStage {
    BatchWrites,
    FlushLock,
    CapacityFlush,
    MarkerWrite,
    DeviceFlush,
}

const STAGE_COUNT: usize = 5;

// One time counter per stage.
const _: () = assert!(FlushStage::DeviceFlush as usize + 1 == STAGE_COUNT);

/// See the module documentation.
#[derive(Default)]
pub(in crate::pool) struct FlushStages {
    /// Flushes that issued a device flush.
    device_flushes: AtomicU64,
    /// Flushes whose batches another flush made durable.
    covered: AtomicU64,
    nanoseconds: [AtomicU64; STAGE_COUNT],
}

/// What `pool status` shows of the flash tier's flushes since the pool
/// opened: how many, and the time spent in each stage in all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FlushStagesStatus {
    /// Flushes that issued a device flush.
    pub device_flushes: u64,
    /// Flushes whose batches another flush had made (or was making) durable.
    pub covered_flushes: u64,
    /// Waiting for the batch writes the flush covers.
    pub batch_writes_microseconds: u64,
    /// Waiting for another flush to finish (the flush lock).
    pub flush_lock_microseconds: u64,
    /// The capacity tier's flush (two-tier pools).
    pub capacity_flush_microseconds: u64,
    /// Waiting for the previous flush marker's write.
    pub marker_write_microseconds: u64,
    /// The device flush.
    pub device_flush_microseconds: u64,
    /// Open batches sealed and written right after a write, because
    /// flushes follow every write (`write_behind`): the batch writes such
    /// a flush no longer waits for from the start.
    pub batches_sealed_at_write: u64,
}

impl FlushStages {
    /// Adds `spent` to `stage`.
    pub(in crate::pool) fn spent(&self, stage: FlushStage, spent: Duration) {
        let nanoseconds = u64::try_from(spent.as_nanos()).unwrap_or(u64::MAX);
        self.nanoseconds[stage as usize].fetch_add(nanoseconds, Ordering::Relaxed);
    }

    /// Counts a flush that issued a device flush.
    pub(in crate::pool) fn device_flushed(&self) {
        self.device_flushes.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a flush that another flush covered.
    pub(in crate::pool) fn covered(&self) {
        self.covered.fetch_add(1, Ordering::Relaxed);
    }

    pub(in crate::pool) fn status(&self) -> FlushStagesStatus {
        let microseconds =
            |stage: FlushStage| self.nanoseconds[stage as usize].load(Ordering::Relaxed) / 1_000;
        FlushStagesStatus {
            device_flushes: self.device_flushes.load(Ordering::Relaxed),
            covered_flushes: self.covered.load(Ordering::Relaxed),
            batch_writes_microseconds: microseconds(FlushStage::BatchWrites),
            flush_lock_microseconds: microseconds(FlushStage::FlushLock),
            capacity_flush_microseconds: microseconds(FlushStage::CapacityFlush),
            marker_write_microseconds: microseconds(FlushStage::MarkerWrite),
            device_flush_microseconds: microseconds(FlushStage::DeviceFlush),
            batches_sealed_at_write: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_add_up_separately() {
        let stages = FlushStages::default();
        stages.spent(FlushStage::BatchWrites, Duration::from_micros(30));
        stages.spent(FlushStage::DeviceFlush, Duration::from_micros(100));
        stages.spent(FlushStage::DeviceFlush, Duration::from_micros(50));
        stages.device_flushed();
        stages.covered();
        stages.covered();
        assert_eq!(
            stages.status(),
            FlushStagesStatus {
                device_flushes: 1,
                covered_flushes: 2,
                batch_writes_microseconds: 30,
                device_flush_microseconds: 150,
                ..FlushStagesStatus::default()
            }
        );
    }
}
