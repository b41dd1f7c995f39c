//! The scaling measurements' fast fill (`checkpoint_scaling.rs`,
//! `open_time.rs`): a device wrapper that, while dropping is on, writes only
//! the summary and the summary's copy of each log batch and drops the batch's
//! data blocks. Everything else goes through the engine's real write path:
//! the maps, the block checksums, the summaries, segment usage, the segment
//! openings record, flushes and checkpoints. The dropped blocks read back as
//! the sparse file's holes, so a pool filled this way must never read them:
//! the measurements only write, checkpoint and open, on pools with a quarter
//! of their segments free, where the cleaner does not run, and with the
//! memory cache's warm-up off. It lets a 64 GiB volume be mapped on a disk
//! with less than 64 GiB free. Test-only: it lives in the tests directory
//! and the engine knows nothing of it.
//!
//! Also: the process's memory: resident (from `/proc/self/status`, after
//! glibc's `malloc_trim` returned what the allocator held free) and the heap
//! bytes allocated and not freed (glibc's `mallinfo2`): the second is what
//! the engine holds, the first what the system sees.

#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use lamina_device::{AlignedBuffer, BlockCheck, BlockDevice, DeviceError};
use lamina_engine::log::batch::Summary;

const BLOCK: usize = 4096;
/// The fewest blocks a batch has: its summary, one data block, the copy.
const BATCH_BLOCKS_MIN: usize = 3;

/// See the module documentation.
pub struct DataDroppingDevice {
    inner: Arc<dyn BlockDevice>,
    dropping: AtomicBool,
    dropped_blocks: AtomicU64,
}

impl DataDroppingDevice {
    /// A wrapper around `inner` that drops batches' data blocks from the start.
    pub fn new(inner: Arc<dyn BlockDevice>) -> Self {
        Self {
            inner,
            dropping: AtomicBool::new(true),
            dropped_blocks: AtomicU64::new(0),
        }
    }

    /// From now on every write reaches the device whole.
    pub fn stop_dropping(&self) {
        self.dropping.store(false, Ordering::Release);
    }

    /// Data blocks not written so far.
    pub fn dropped_blocks(&self) -> u64 {
        self.dropped_blocks.load(Ordering::Relaxed)
    }
}

/// Whether `data` is a log batch: its first block decodes as a summary and
/// its last block is the same bytes (the summary's copy, format version 5).
fn is_batch(data: &[u8]) -> bool {
    data.len() >= BATCH_BLOCKS_MIN * BLOCK
        && data.len().is_multiple_of(BLOCK)
        && data[..BLOCK] == data[data.len() - BLOCK..]
        && Summary::decode(&data[..BLOCK]).is_ok()
}

#[async_trait::async_trait]
impl BlockDevice for DataDroppingDevice {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read(&self, offset: u64, length: usize) -> lamina_device::DeviceReadFuture<'_> {
        self.inner.read(offset, length)
    }

    async fn write(&self, offset: u64, data: Arc<AlignedBuffer>) -> Result<(), DeviceError> {
        if !self.dropping.load(Ordering::Acquire) || !is_batch(&data) {
            return self.inner.write(offset, data).await;
        }
        let summary = Arc::new(AlignedBuffer::from_slice_padded(&data[..BLOCK]));
        let copy_offset = offset + (data.len() - BLOCK) as u64;
        let (first, last) = tokio::join!(
            self.inner.write(offset, summary.clone()),
            self.inner.write(copy_offset, summary)
        );
        self.dropped_blocks
            .fetch_add((data.len() / BLOCK - 2) as u64, Ordering::Relaxed);
        first.and(last)
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

/// glibc's `struct mallinfo2` (malloc.h): sizes in bytes.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct MallocInformation {
    arena: usize,
    ordblks: usize,
    smblks: usize,
    hblks: usize,
    hblkhd: usize,
    usmblks: usize,
    fsmblks: usize,
    uordblks: usize,
    fordblks: usize,
    keepcost: usize,
}

unsafe extern "C" {
    fn mallinfo2() -> MallocInformation;
    fn malloc_trim(pad: usize) -> i32;
}

/// The process's memory (see the module documentation), in bytes.
#[derive(Clone, Copy, Debug)]
pub struct ResidentMemory {
    pub resident_bytes: u64,
    pub anonymous_bytes: u64,
    /// The highest resident memory since the process started.
    pub peak_resident_bytes: u64,
    /// Heap bytes allocated and not freed: small allocations in every
    /// arena and mmapped large ones.
    pub heap_in_use_bytes: u64,
}

impl ResidentMemory {
    pub fn now() -> Self {
        // SAFETY: glibc's malloc_trim and mallinfo2 take no pointers and may
        // be called from any thread at any time; the struct is returned by
        // value with the layout declared above (glibc 2.33 and later).
        let information = unsafe {
            malloc_trim(0);
            mallinfo2()
        };
        let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.trim().strip_suffix("kB"))
                .map(|kib| kib.trim().parse::<u64>().expect("a number of kB") * 1024)
                .unwrap_or_else(|| panic!("{name} in /proc/self/status"))
        };
        Self {
            resident_bytes: field("VmRSS:"),
            anonymous_bytes: field("RssAnon:"),
            peak_resident_bytes: field("VmHWM:"),
            heap_in_use_bytes: (information.uordblks + information.hblkhd) as u64,
        }
    }
}
