//! A device wrapper that counts the bytes read and written through it, with
//! writes split at a boundary (the fixed metadata before it, the log after
//! it), so that `array-write-cost` can see what the engine asks of an array
//! and what the array asks of each member, measured the same way on a single
//! device and on every member of an array.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use lamina_device::{AlignedBuffer, BlockCheck, BlockDevice, DeviceError};
use serde::Serialize;

/// Bytes moved through one [`CountingDevice`] (or a sum over several).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ByteCounts {
    pub read_bytes: u64,
    /// Writes that start before the boundary (superblock, flush markers,
    /// checkpoints; labels on a member).
    pub metadata_written_bytes: u64,
    /// Writes that start at or after the boundary (the log's segments).
    pub log_written_bytes: u64,
}

impl ByteCounts {
    pub fn written_bytes(&self) -> u64 {
        self.metadata_written_bytes + self.log_written_bytes
    }

    /// The counts moved between `before` and `self`.
    pub fn since(&self, before: &ByteCounts) -> ByteCounts {
        ByteCounts {
            read_bytes: self.read_bytes - before.read_bytes,
            metadata_written_bytes: self.metadata_written_bytes - before.metadata_written_bytes,
            log_written_bytes: self.log_written_bytes - before.log_written_bytes,
        }
    }

    /// The sum of `counts`.
    pub fn sum(counts: impl Iterator<Item = ByteCounts>) -> ByteCounts {
        counts.fold(ByteCounts::default(), |total, counts| ByteCounts {
            read_bytes: total.read_bytes + counts.read_bytes,
            metadata_written_bytes: total.metadata_written_bytes + counts.metadata_written_bytes,
            log_written_bytes: total.log_written_bytes + counts.log_written_bytes,
        })
    }
}

/// See the module documentation.
pub struct CountingDevice {
    inner: Arc<dyn BlockDevice>,
    /// Device offset where the log starts.
    log_start_bytes: u64,
    read_bytes: AtomicU64,
    metadata_written_bytes: AtomicU64,
    log_written_bytes: AtomicU64,
}

impl CountingDevice {
    pub fn new(inner: Arc<dyn BlockDevice>, log_start_bytes: u64) -> Self {
        Self {
            inner,
            log_start_bytes,
            read_bytes: AtomicU64::new(0),
            metadata_written_bytes: AtomicU64::new(0),
            log_written_bytes: AtomicU64::new(0),
        }
    }

    pub fn counts(&self) -> ByteCounts {
        ByteCounts {
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            metadata_written_bytes: self.metadata_written_bytes.load(Ordering::Relaxed),
            log_written_bytes: self.log_written_bytes.load(Ordering::Relaxed),
        }
    }
}

#[async_trait::async_trait]
impl BlockDevice for CountingDevice {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read(&self, offset: u64, length: usize) -> lamina_device::DeviceReadFuture<'_> {
        lamina_device::DeviceReadFuture::from_or_box(async move {
            self.read_bytes.fetch_add(length as u64, Ordering::Relaxed);
            self.inner.read(offset, length).await
        })
    }

    async fn write(&self, offset: u64, data: Arc<AlignedBuffer>) -> Result<(), DeviceError> {
        // The engine's and the array's writes never straddle the boundary
        // (metadata and segments are written separately), so the start decides.
        let counter = if offset < self.log_start_bytes {
            &self.metadata_written_bytes
        } else {
            &self.log_written_bytes
        };
        counter.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.inner.write(offset, data).await
    }

    async fn flush(&self) -> Result<(), DeviceError> {
        self.inner.flush().await
    }

    async fn recover_block(
        &self,
        offset: u64,
        is_valid: BlockCheck<'_>,
    ) -> Result<Option<AlignedBuffer>, DeviceError> {
        self.inner.recover_block(offset, is_valid).await
    }
}
