//! Writing the segment openings records (`openings/mod.rs`) from the
//! pool: the first batch of a newly opened segment waits for a record that
//! lists it (`Core::record_opening`), and open writes one of its own,
//! flushed (`Core::record_now_durably`). Kept apart from `core/mod.rs`, which
//! only calls these methods, so that neither module imports the other.

use lamina_device::DeviceError;

use crate::pool::core::{Core, write_retried_while_full};
use crate::pool::openings::{RecorderState, encoded, record_offset};

impl Core {
    /// Makes sure a record listing the segment opened with
    /// `segment_sequence` has been written, before the write of its first
    /// batch counts as complete.
    pub(in crate::pool) async fn record_opening(
        &self,
        segment_sequence: u64,
    ) -> Result<(), DeviceError> {
        let mut recorder = self.openings().lock().await;
        if recorder.recorded_through_segment_sequence >= segment_sequence {
            return Ok(());
        }
        self.write_next_record(&mut recorder).await
    }

    /// Writes a record now and flushes it (at open, so that the newest
    /// record is this run's and lists what recovery found).
    pub(in crate::pool) async fn record_now_durably(&self) -> Result<(), DeviceError> {
        let mut recorder = self.openings().lock().await;
        self.write_next_record(&mut recorder).await?;
        // The record lives on flash.
        self.flush_flash().await
    }

    /// Builds and writes the next record.
    async fn write_next_record(&self, recorder: &mut RecorderState) -> Result<(), DeviceError> {
        let (record, through) = self.lock().openings_record(
            self.openings().pool_identifier(),
            recorder.next_record_sequence,
        );
        // Retried while the device is full, like the batch waiting for it.
        write_retried_while_full(self, record_offset(&record), &encoded(&record)).await?;
        recorder.next_record_sequence += 1;
        recorder.recorded_through_segment_sequence =
            recorder.recorded_through_segment_sequence.max(through);
        Ok(())
    }
}
