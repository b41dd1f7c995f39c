//! The pool's write counters (client bytes, device bytes by kind, blocks the
//! cleaner relocated), carried across restarts through checkpoints, and the
//! checkpoint schedule's counters. Write amplification is read from here.

use crate::BLOCK_SIZE_BYTES;
use crate::log::checkpoint::CountersImage;

/// Bytes and blocks written since the pool opened, plus the lifetime totals
/// of the checkpoint it was opened from.
#[derive(Debug, Default)]
pub struct WriteCounters {
    /// Bytes of sealed batches (summaries, data and copies).
    sealed_bytes: u64,
    /// Bytes of sealed batches made durable by device flushes.
    flushed_bytes: u64,
    client_bytes: u64,
    /// Bytes of checkpoint bodies and slots written.
    checkpoint_bytes: u64,
    /// Bytes of flush markers written.
    marker_bytes: u64,
    /// Blocks the cleaner and the demoter have moved.
    relocated_blocks: u64,
    /// The counters over the pool's life up to the checkpoint it was opened
    /// from; the fields above count since then.
    before_open: CountersImage,
}

impl WriteCounters {
    /// Counters that go on from a checkpoint's `before_open` totals.
    pub fn continuing(before_open: CountersImage) -> Self {
        Self {
            before_open,
            ..Self::default()
        }
    }

    pub fn batch_sealed(&mut self, block_count: u32) {
        self.sealed_bytes += u64::from(block_count) * BLOCK_SIZE_BYTES;
    }

    /// A device flush made durable what was sealed when it started
    /// (`sealed_bytes_at_flush`, from [`WriteCounters::sealed_bytes`]).
    pub fn flushed(&mut self, sealed_bytes_at_flush: u64) {
        assert!(sealed_bytes_at_flush <= self.sealed_bytes);
        self.flushed_bytes = self.flushed_bytes.max(sealed_bytes_at_flush);
    }

    pub fn client_block_written(&mut self) {
        self.client_bytes += BLOCK_SIZE_BYTES;
    }

    pub fn checkpoint_written(&mut self, bytes: u64) {
        self.checkpoint_bytes += bytes;
    }

    pub fn marker_written(&mut self, bytes: u64) {
        self.marker_bytes += bytes;
    }

    pub fn block_relocated(&mut self) {
        self.relocated_blocks += 1;
    }

    pub fn sealed_bytes(&self) -> u64 {
        self.sealed_bytes
    }

    /// Sealed bytes not yet made durable by a flush.
    pub fn unflushed_bytes(&self) -> u64 {
        self.sealed_bytes - self.flushed_bytes
    }

    /// Client bytes written since the pool opened.
    pub fn client_bytes(&self) -> u64 {
        self.client_bytes
    }

    /// Blocks moved since the pool opened.
    pub fn relocated_blocks(&self) -> u64 {
        self.relocated_blocks
    }

    /// Client blocks written over the pool's life (as far as checkpoints
    /// kept it): the clock that segment and block lifespans are counted in,
    /// which goes on across restarts with the placement hints.
    pub fn client_blocks_written(&self) -> u64 {
        (self.before_open.client_bytes_written + self.client_bytes) / BLOCK_SIZE_BYTES
    }

    /// The write counters over the pool's life (those kept in its newest
    /// checkpoint when it opened, plus what was written since).
    pub fn lifetime(&self) -> CountersImage {
        let before = self.before_open;
        CountersImage {
            client_bytes_written: before.client_bytes_written + self.client_bytes,
            device_bytes_written: before.device_bytes_written
                + self.sealed_bytes
                + self.checkpoint_bytes
                + self.marker_bytes,
            cleaner_relocated_blocks: before.cleaner_relocated_blocks + self.relocated_blocks,
        }
    }
}

/// When the next background checkpoint is due, and its sequence.
#[derive(Debug)]
pub struct CheckpointSchedule {
    next_sequence: u64,
    /// Sealed bytes when the last checkpoint was taken.
    sealed_bytes_at_last: u64,
}

impl CheckpointSchedule {
    pub fn starting_at(next_sequence: u64) -> Self {
        assert!(next_sequence >= 1);
        Self {
            next_sequence,
            sealed_bytes_at_last: 0,
        }
    }

    pub fn next_sequence(&self) -> u64 {
        self.next_sequence
    }

    /// Takes the next checkpoint sequence, noting the sealed bytes it covers.
    pub fn take_sequence(&mut self, sealed_bytes: u64) -> u64 {
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        self.sealed_bytes_at_last = sealed_bytes;
        sequence
    }

    /// Log bytes sealed since the last checkpoint.
    pub fn bytes_since_last(&self, sealed_bytes: u64) -> u64 {
        sealed_bytes - self.sealed_bytes_at_last
    }
}
