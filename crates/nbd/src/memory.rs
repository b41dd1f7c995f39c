//! An in-memory, sparse export and catalog for tests (this crate's and others').
//! [`MemoryExport`] keeps only the 4 KiB blocks that were written, so untouched
//! and trimmed ranges are reported as holes; it counts operations so tests can
//! check that flags such as FUA reached the backend, and it can be told to fail
//! every operation with an I/O error.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::backend::{Export, ExportCatalog, ExportError, ExportFuture, ExportSummary, Extent};

/// Allocation granularity of [`MemoryExport`].
pub const MEMORY_BLOCK_BYTES: u64 = 4096;

/// The part of a range that falls in one block.
#[derive(Debug, Clone, Copy)]
struct BlockPiece {
    /// Index of the block.
    block: u64,
    /// Where the piece starts within the block.
    within_block: u64,
    /// Bytes in the piece: at most one block.
    length_bytes: u64,
    /// Where the piece starts within the range.
    within_range: u64,
}

impl BlockPiece {
    /// The piece's bytes within its block's buffer.
    fn in_block(&self) -> Range<usize> {
        let start = block_index(self.within_block);
        start..start + block_index(self.length_bytes)
    }

    /// The piece's bytes within the caller's buffer, when the range is one.
    fn in_range(&self) -> Range<usize> {
        let start = usize::try_from(self.within_range)
            .expect("a range read or written through a buffer fits in memory");
        start..start + block_index(self.length_bytes)
    }
}

/// A position or length within one block as an index into its buffer.
fn block_index(bytes: u64) -> usize {
    assert!(bytes <= MEMORY_BLOCK_BYTES, "{bytes} is beyond one block");
    usize::try_from(bytes).expect("one block fits in memory")
}

/// The buffer of a newly allocated block.
fn zeroed_block() -> Box<[u8]> {
    vec![0u8; block_index(MEMORY_BLOCK_BYTES)].into_boxed_slice()
}

/// How many times each operation reached a [`MemoryExport`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryOperationCounts {
    pub reads: u64,
    pub writes: u64,
    pub fua_writes: u64,
    pub flushes: u64,
    pub trims: u64,
    pub write_zeroes: u64,
    pub fast_zero_refusals: u64,
    pub caches: u64,
    pub extents: u64,
}

#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    fua_writes: AtomicU64,
    flushes: AtomicU64,
    trims: AtomicU64,
    write_zeroes: AtomicU64,
    fast_zero_refusals: AtomicU64,
    caches: AtomicU64,
    extents: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A sparse in-memory block device.
pub struct MemoryExport {
    size_bytes: u64,
    read_only: bool,
    /// Whether `write_zeroes` with `fast_only` succeeds; when false it answers
    /// `NotSupported`, as a backend that cannot zero quickly would.
    fast_zero: bool,
    /// Block index to contents; absent blocks are holes reading as zeros.
    blocks: RwLock<HashMap<u64, Box<[u8]>>>,
    failing: AtomicBool,
    counters: Counters,
}

impl std::fmt::Debug for MemoryExport {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("MemoryExport")
            .field("size_bytes", &self.size_bytes)
            .field("read_only", &self.read_only)
            .field("allocated_blocks", &self.allocated_block_count())
            .finish()
    }
}

impl MemoryExport {
    /// A writable export of `size_bytes` (any size, not necessarily aligned), all holes.
    pub fn new(size_bytes: u64) -> Self {
        MemoryExport {
            size_bytes,
            read_only: false,
            fast_zero: true,
            blocks: RwLock::new(HashMap::new()),
            failing: AtomicBool::new(false),
            counters: Counters::default(),
        }
    }

    /// Makes the export read-only (writes, trims and write-zeroes get `ReadOnly`).
    pub fn with_read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Decides whether fast-only write-zeroes are supported.
    pub fn with_fast_zero(mut self, supported: bool) -> Self {
        self.fast_zero = supported;
        self
    }

    /// Fills the export with `data` from offset 0, ignoring read-only (for setting
    /// up test images). Panics if `data` is larger than the export.
    pub fn with_contents(self, data: &[u8]) -> Self {
        assert!(
            data.len() as u64 <= self.size_bytes,
            "contents larger than the export"
        );
        self.store(0, data);
        self
    }

    /// While `failing` is true every operation fails with an I/O error.
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    pub fn allocated_block_count(&self) -> usize {
        self.blocks.read().expect("block map lock").len()
    }

    pub fn operation_counts(&self) -> MemoryOperationCounts {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let counters = &self.counters;
        MemoryOperationCounts {
            reads: load(&counters.reads),
            writes: load(&counters.writes),
            fua_writes: load(&counters.fua_writes),
            flushes: load(&counters.flushes),
            trims: load(&counters.trims),
            write_zeroes: load(&counters.write_zeroes),
            fast_zero_refusals: load(&counters.fast_zero_refusals),
            caches: load(&counters.caches),
            extents: load(&counters.extents),
        }
    }

    /// A copy of the whole export's contents (holes as zeros).
    pub fn contents(&self) -> Vec<u8> {
        let mut out = vec![0u8; usize::try_from(self.size_bytes).expect("export fits in memory")];
        self.load(0, &mut out);
        out
    }

    fn check(&self, offset: u64, length: u64, writing: bool) -> Result<(), ExportError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(ExportError::Io("injected failure".to_string()));
        }
        if writing && self.read_only {
            return Err(ExportError::ReadOnly);
        }
        match offset.checked_add(length) {
            Some(end) if end <= self.size_bytes => Ok(()),
            _ => Err(ExportError::Invalid(format!(
                "{length} bytes at {offset} outside export of {} bytes",
                self.size_bytes
            ))),
        }
    }

    /// Visits the pieces of the blocks covering `[offset, offset + length)`.
    fn for_each_block(offset: u64, length: u64, mut visit: impl FnMut(BlockPiece)) {
        let mut position = offset;
        let end = offset + length;
        while position < end {
            let within_block = position % MEMORY_BLOCK_BYTES;
            let length_bytes = (MEMORY_BLOCK_BYTES - within_block).min(end - position);
            visit(BlockPiece {
                block: position / MEMORY_BLOCK_BYTES,
                within_block,
                length_bytes,
                within_range: position - offset,
            });
            position += length_bytes;
        }
    }

    fn load(&self, offset: u64, buffer: &mut [u8]) {
        let blocks = self.blocks.read().expect("block map lock");
        Self::for_each_block(offset, buffer.len() as u64, |piece| {
            let target = &mut buffer[piece.in_range()];
            match blocks.get(&piece.block) {
                Some(contents) => target.copy_from_slice(&contents[piece.in_block()]),
                None => target.fill(0),
            }
        });
    }

    fn store(&self, offset: u64, data: &[u8]) {
        let mut blocks = self.blocks.write().expect("block map lock");
        Self::for_each_block(offset, data.len() as u64, |piece| {
            let contents = blocks.entry(piece.block).or_insert_with(zeroed_block);
            contents[piece.in_block()].copy_from_slice(&data[piece.in_range()]);
        });
    }

    /// Zeroes a range: whole blocks become holes when `punch` allows, partial
    /// blocks are zeroed in place; without `punch` every block ends up allocated.
    fn zero(&self, offset: u64, length: u64, punch: bool) {
        let mut blocks = self.blocks.write().expect("block map lock");
        Self::for_each_block(offset, length, |piece| {
            if punch && piece.length_bytes == MEMORY_BLOCK_BYTES {
                blocks.remove(&piece.block);
            } else if let Some(contents) = blocks.get_mut(&piece.block) {
                contents[piece.in_block()].fill(0);
            } else if !punch {
                blocks.insert(piece.block, zeroed_block());
            }
        });
    }
}

#[async_trait::async_trait]
impl Export for MemoryExport {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn read<'a>(&'a self, offset: u64, buffer: &'a mut [u8]) -> ExportFuture<'a> {
        ExportFuture::from(async move {
            bump(&self.counters.reads);
            self.check(offset, buffer.len() as u64, false)?;
            self.load(offset, buffer);
            Ok(())
        })
    }

    async fn extents(&self, offset: u64, length: u64) -> Result<Vec<Extent>, ExportError> {
        bump(&self.counters.extents);
        self.check(offset, length, false)?;
        let blocks = self.blocks.read().expect("block map lock");
        let mut extents: Vec<Extent> = Vec::new();
        Self::for_each_block(offset, length, |piece| {
            let hole = !blocks.contains_key(&piece.block);
            match extents.last_mut() {
                Some(last) if last.hole == hole => last.length += piece.length_bytes,
                _ => extents.push(Extent {
                    length: piece.length_bytes,
                    hole,
                    zero: hole,
                }),
            }
        });
        Ok(extents)
    }

    fn write<'a>(&'a self, offset: u64, data: &'a [u8], fua: bool) -> ExportFuture<'a> {
        ExportFuture::from(async move {
            bump(&self.counters.writes);
            if fua {
                bump(&self.counters.fua_writes);
            }
            self.check(offset, data.len() as u64, true)?;
            self.store(offset, data);
            Ok(())
        })
    }

    fn write_without_waiting(&self, offset: u64, data: &[u8]) -> Option<Result<(), ExportError>> {
        // Always at once: the server's tests then run the path real exports take.
        bump(&self.counters.writes);
        let checked = self.check(offset, data.len() as u64, true);
        Some(checked.map(|()| self.store(offset, data)))
    }

    async fn flush(&self) -> Result<(), ExportError> {
        bump(&self.counters.flushes);
        self.check(0, 0, false)
    }

    async fn trim(&self, offset: u64, length: u64, _fua: bool) -> Result<(), ExportError> {
        bump(&self.counters.trims);
        self.check(offset, length, true)?;
        self.zero(offset, length, true);
        Ok(())
    }

    async fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        _fua: bool,
        may_punch_hole: bool,
        fast_only: bool,
    ) -> Result<(), ExportError> {
        bump(&self.counters.write_zeroes);
        self.check(offset, length, true)?;
        if fast_only && !self.fast_zero {
            bump(&self.counters.fast_zero_refusals);
            return Err(ExportError::NotSupported);
        }
        self.zero(offset, length, may_punch_hole);
        Ok(())
    }

    async fn cache(&self, offset: u64, length: u64) -> Result<(), ExportError> {
        bump(&self.counters.caches);
        self.check(offset, length, false)
    }
}

/// A catalog of exports kept in memory; exports may be added and removed while
/// the server runs (connections already open keep their export).
#[derive(Default)]
pub struct MemoryCatalog {
    entries: RwLock<Vec<(ExportSummary, Arc<dyn Export>)>>,
    default_name: RwLock<Option<String>>,
}

impl std::fmt::Debug for MemoryCatalog {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("MemoryCatalog")
            .field("exports", &self.list())
            .finish()
    }
}

impl MemoryCatalog {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) the export called `name`.
    pub fn insert(&self, name: &str, description: &str, export: Arc<dyn Export>) {
        let mut entries = self.entries.write().expect("catalog lock");
        entries.retain(|(summary, _)| summary.name != name);
        entries.push((
            ExportSummary {
                name: name.to_string(),
                description: description.to_string(),
            },
            export,
        ));
    }

    /// Removes the export called `name`; true if it existed.
    pub fn remove(&self, name: &str) -> bool {
        let mut entries = self.entries.write().expect("catalog lock");
        let before = entries.len();
        entries.retain(|(summary, _)| summary.name != name);
        entries.len() != before
    }

    /// Makes the empty name open `name` (unless an export is literally called "").
    pub fn set_default(&self, name: Option<&str>) {
        *self.default_name.write().expect("catalog lock") = name.map(str::to_string);
    }
}

impl ExportCatalog for MemoryCatalog {
    fn list(&self) -> Vec<ExportSummary> {
        let entries = self.entries.read().expect("catalog lock");
        entries.iter().map(|(summary, _)| summary.clone()).collect()
    }

    fn open(&self, name: &str) -> Option<(ExportSummary, Arc<dyn Export>)> {
        let entries = self.entries.read().expect("catalog lock");
        let find = |wanted: &str| {
            entries
                .iter()
                .find(|(summary, _)| summary.name == wanted)
                .map(|(summary, export)| (summary.clone(), Arc::clone(export)))
        };
        find(name).or_else(|| {
            if name.is_empty() {
                let default_name = self.default_name.read().expect("catalog lock");
                default_name.as_deref().and_then(find)
            } else {
                None
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sparse_read_write_and_extents() {
        let export = MemoryExport::new(5 * MEMORY_BLOCK_BYTES + 100);
        assert_eq!(
            export.extents(0, export.size_bytes()).await.unwrap(),
            vec![Extent {
                length: export.size_bytes(),
                hole: true,
                zero: true
            }]
        );
        export.write(4000, &[7u8; 200], false).await.unwrap();
        assert_eq!(export.allocated_block_count(), 2);
        let mut buffer = vec![1u8; 300];
        export.read(3950, &mut buffer).await.unwrap();
        assert!(buffer[..50].iter().all(|&byte| byte == 0));
        assert!(buffer[50..250].iter().all(|&byte| byte == 7));
        assert!(buffer[250..].iter().all(|&byte| byte == 0));
        let extents = export.extents(0, export.size_bytes()).await.unwrap();
        assert_eq!(extents.len(), 2);
        assert_eq!(
            extents[0],
            Extent {
                length: 8192,
                hole: false,
                zero: false
            }
        );
        assert_eq!(extents[1].length, export.size_bytes() - 8192);
        assert!(extents[1].hole);
        // The tail block is partial; reading and writing it works.
        export
            .write(5 * MEMORY_BLOCK_BYTES + 99, &[9], true)
            .await
            .unwrap();
        assert_eq!(export.operation_counts().fua_writes, 1);
        assert!(
            export
                .write(5 * MEMORY_BLOCK_BYTES + 100, &[9], false)
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn trim_and_zero() {
        let export = MemoryExport::new(4 * MEMORY_BLOCK_BYTES).with_contents(&[0xaa; 4 * 4096]);
        assert_eq!(export.allocated_block_count(), 4);
        // Trim of one whole block and half of the next: one hole, one zeroed half.
        export.trim(4096, 6144, false).await.unwrap();
        assert_eq!(export.allocated_block_count(), 3);
        let contents = export.contents();
        assert!(contents[..4096].iter().all(|&byte| byte == 0xaa));
        assert!(contents[4096..10240].iter().all(|&byte| byte == 0));
        assert!(contents[10240..].iter().all(|&byte| byte == 0xaa));
        // Zeroing without punching keeps blocks allocated.
        export
            .write_zeroes(0, 16384, false, false, false)
            .await
            .unwrap();
        assert_eq!(export.allocated_block_count(), 4);
        assert!(export.contents().iter().all(|&byte| byte == 0));
        export
            .write_zeroes(0, 16384, false, true, false)
            .await
            .unwrap();
        assert_eq!(export.allocated_block_count(), 0);
        let slow = MemoryExport::new(4096).with_fast_zero(false);
        assert!(matches!(
            slow.write_zeroes(0, 4096, false, true, true).await,
            Err(ExportError::NotSupported)
        ));
    }

    #[tokio::test]
    async fn read_only_and_failures() {
        let export = MemoryExport::new(4096).with_read_only(true);
        assert!(matches!(
            export.write(0, &[1], false).await,
            Err(ExportError::ReadOnly)
        ));
        assert!(matches!(
            export.trim(0, 1, false).await,
            Err(ExportError::ReadOnly)
        ));
        let mut byte = [0u8];
        export.read(0, &mut byte).await.unwrap();
        export.set_failing(true);
        assert!(matches!(
            export.read(0, &mut byte).await,
            Err(ExportError::Io(_))
        ));
        assert!(matches!(export.flush().await, Err(ExportError::Io(_))));
    }

    #[test]
    fn catalog_lookup() {
        let catalog = MemoryCatalog::new();
        catalog.insert("a", "first", Arc::new(MemoryExport::new(4096)));
        catalog.insert("b", "", Arc::new(MemoryExport::new(8192)));
        assert_eq!(catalog.list().len(), 2);
        assert_eq!(catalog.open("b").unwrap().1.size_bytes(), 8192);
        assert!(catalog.open("").is_none());
        catalog.set_default(Some("a"));
        assert_eq!(catalog.open("").unwrap().0.name, "a");
        assert!(catalog.remove("a"));
        assert!(catalog.open("a").is_none());
        assert!(!catalog.remove("a"));
    }
}
