//! Prepares a file's chunks ahead of the writes into them, in one of two
//! ways ([`FilePreallocation`]):
//!
//! - **Allocate** (decision 0049): a direct write into a hole makes the
//!   filesystem allocate blocks, which ext4 and XFS cannot do without
//!   blocking, so io_uring hands such writes to a worker thread; the first
//!   write into each chunk of [`PREALLOCATION_CHUNK_BYTES`] (per open of the
//!   device) first allocates the whole chunk with one `fallocate` that keeps
//!   the file's size and every byte already written. Writes racing the claim
//!   go ahead without waiting for it (the kernel serialises them).
//! - **Zeroes** (decision 0062, the default): allocated space is *unwritten*
//!   to the filesystem until data is written there, and every write that
//!   turns unwritten space into written space changes the file's extent
//!   tree, which the next `fdatasync` must commit to the filesystem's
//!   journal: on this machine's ext4 a flush after a 4 KiB write into such
//!   space took 86–179 µs against 37 µs after an overwrite. A log-structured
//!   pool writes where it has not written before for its whole first pass, so
//!   every client flush paid that commit. Here the first write into a chunk
//!   also writes zeros over the chunk's parts that hold no written data
//!   (holes and unwritten extents, read with FIEMAP: `extents.rs`), so that
//!   the writes and flushes after it are overwrites. Writing zeros where the
//!   file reads as zeros changes no byte the file holds; while it runs, every
//!   other write into the chunk waits, so that no zero lands on data written
//!   meanwhile. The preparation runs on a blocking-pool thread that finishes
//!   it even when the write that started it is abandoned.
//!
//! A filesystem that cannot do either (no `fallocate`, no FIEMAP) turns the
//! component off, or down to allocating, with one line; any other failure (a
//! full host filesystem) leaves the write to report it.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use tokio::sync::Notify;

use super::extents::{ByteRange, unwritten_ranges};
use crate::AlignedBuffer;

/// Bytes prepared at once: a segment's worth by default, so that one
/// preparation serves about a thousand 4 KiB writes.
pub(crate) const PREALLOCATION_CHUNK_BYTES: u64 = 4 << 20;

/// Zeros written per write call of a preparation.
const ZERO_WRITE_BYTES_MAX: usize = 1 << 20;

/// Chunks one word of a chunk map covers.
const CHUNKS_PER_WORD: u64 = u64::BITS as u64;

const _: () = assert!(PREALLOCATION_CHUNK_BYTES.is_power_of_two());
const _: () = assert!(PREALLOCATION_CHUNK_BYTES.is_multiple_of(crate::DEVICE_ALIGNMENT_BYTES));
const _: () = assert!((ZERO_WRITE_BYTES_MAX as u64).is_multiple_of(crate::DEVICE_ALIGNMENT_BYTES));

/// How a regular file on the io_uring backend is prepared ahead of writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum FilePreallocation {
    /// Nothing ahead: writes into holes allocate as they go.
    Off = 0,
    /// `fallocate` each chunk on its first write (space allocated, unwritten).
    Allocate = 1,
    /// Allocate each chunk and write zeros over its unwritten parts on its
    /// first write, so that later writes and flushes are overwrites.
    #[default]
    Zeroes = 2,
}

impl FilePreallocation {
    fn from_index(index: u8) -> Self {
        match index {
            0 => Self::Off,
            1 => Self::Allocate,
            2 => Self::Zeroes,
            _ => unreachable!("a preallocation mode is stored by its index"),
        }
    }
}

/// One word of chunk bits per [`CHUNKS_PER_WORD`] chunks.
struct ChunkMap(Box<[AtomicU64]>);

impl ChunkMap {
    fn new(chunk_count: u64) -> Self {
        let word_count = chunk_count.div_ceil(CHUNKS_PER_WORD);
        Self((0..word_count).map(|_| AtomicU64::new(0)).collect())
    }

    fn word_and_bit(&self, chunk: u64) -> Option<(&AtomicU64, u64)> {
        let word = usize::try_from(chunk / CHUNKS_PER_WORD).ok()?;
        Some((self.0.get(word)?, 1u64 << (chunk % CHUNKS_PER_WORD)))
    }

    fn is_set(&self, chunk: u64) -> bool {
        self.word_and_bit(chunk)
            .is_none_or(|(word, bit)| word.load(Ordering::Acquire) & bit != 0)
    }

    /// Sets the bit; whether this call set it (no earlier call did).
    fn set(&self, chunk: u64) -> bool {
        let Some((word, bit)) = self.word_and_bit(chunk) else {
            // Past the end: the write's own range check reports it.
            return false;
        };
        // Read first: every write asks, almost always about a chunk claimed
        // long ago, and a plain load keeps the word's cache line shared
        // between the threads writing instead of moving it on each write.
        if word.load(Ordering::Acquire) & bit != 0 {
            return false;
        }
        word.fetch_or(bit, Ordering::AcqRel) & bit == 0
    }
}

/// The chunks of one open file claimed and prepared so far.
pub(crate) struct Preallocation {
    device_name: String,
    /// The device's file, for the preparations' system calls.
    file: Arc<File>,
    size_bytes: u64,
    /// A [`FilePreallocation`] as its index: lowered for good when the
    /// filesystem refuses what it needs.
    mode: AtomicU8,
    /// Set once some write claimed the chunk's preparation.
    claimed: ChunkMap,
    /// Set once the chunk's preparation finished (or failed): writes go ahead.
    ready: ChunkMap,
    /// Woken whenever a chunk becomes ready.
    became_ready: Notify,
}

/// A chunk a write must prepare before it goes ahead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ChunkToAllocate {
    pub offset: u64,
    pub length_bytes: u64,
}

/// What a write must do about one chunk it touches.
pub(crate) enum ChunkTurn {
    /// Nothing: prepared, or being allocated by a write that does not make
    /// others wait.
    GoAhead,
    /// This write claimed the chunk: it prepares it.
    Prepare(ChunkToAllocate),
    /// Another write is writing zeros there: wait until the chunk is ready.
    Wait,
}

impl Preallocation {
    pub(crate) fn new(
        device_name: &str,
        file: Arc<File>,
        size_bytes: u64,
        mode: FilePreallocation,
    ) -> Self {
        let chunk_count = size_bytes.div_ceil(PREALLOCATION_CHUNK_BYTES);
        Self {
            device_name: device_name.to_string(),
            file,
            size_bytes,
            mode: AtomicU8::new(mode as u8),
            claimed: ChunkMap::new(chunk_count),
            ready: ChunkMap::new(chunk_count),
            became_ready: Notify::new(),
        }
    }

    pub(crate) fn mode(&self) -> FilePreallocation {
        FilePreallocation::from_index(self.mode.load(Ordering::Relaxed))
    }

    /// Lowers the mode from `from` to `to`; whether this call did.
    fn lower_mode(&self, from: FilePreallocation, to: FilePreallocation) -> bool {
        self.mode
            .compare_exchange(from as u8, to as u8, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// The chunks `offset..offset + length_bytes` touches (none when off).
    pub(crate) fn chunks(&self, offset: u64, length_bytes: u64) -> std::ops::Range<u64> {
        if length_bytes == 0 || self.mode() == FilePreallocation::Off {
            return 0..0;
        }
        offset / PREALLOCATION_CHUNK_BYTES
            ..(offset + length_bytes).div_ceil(PREALLOCATION_CHUNK_BYTES)
    }

    /// Whether a write into `chunk` may go ahead, must prepare it, or must
    /// wait for the write preparing it.
    pub(crate) fn turn(&self, chunk: u64) -> ChunkTurn {
        if self.ready.is_set(chunk) {
            return ChunkTurn::GoAhead;
        }
        if self.claimed.set(chunk) {
            let start = chunk * PREALLOCATION_CHUNK_BYTES;
            let end = (start + PREALLOCATION_CHUNK_BYTES).min(self.size_bytes);
            return ChunkTurn::Prepare(ChunkToAllocate {
                offset: start,
                length_bytes: end - start,
            });
        }
        match self.mode() {
            // Allocation needs no exclusion: the kernel orders it against writes.
            FilePreallocation::Allocate | FilePreallocation::Off => ChunkTurn::GoAhead,
            FilePreallocation::Zeroes => ChunkTurn::Wait,
        }
    }

    /// Waits until `chunk` is ready.
    pub(crate) async fn wait_ready(&self, chunk: u64) {
        loop {
            let notified = self.became_ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.ready.is_set(chunk) {
                return;
            }
            notified.await;
        }
    }

    /// Marks `chunk` ready and wakes the writes waiting for it.
    fn mark_ready(&self, chunk: ChunkToAllocate) {
        self.ready.set(chunk.offset / PREALLOCATION_CHUNK_BYTES);
        self.became_ready.notify_waiters();
    }

    /// Prepares `chunk` on the calling (blocking-pool) thread and marks it
    /// ready whatever happens: allocates it and, in `Zeroes` mode, writes
    /// zeros over its unwritten parts outside `skip` (the range the write
    /// that claimed it is about to write).
    pub(crate) fn prepare(&self, chunk: ChunkToAllocate, skip: ByteRange) {
        let file = self.file.as_ref();
        let allocated = allocate(file, chunk);
        let allocated = self.allocated(chunk, allocated);
        if allocated && self.mode() == FilePreallocation::Zeroes {
            let result = write_zeroes(file, chunk, skip);
            self.zeroed(chunk, result);
        }
        self.mark_ready(chunk);
    }

    /// Takes the outcome of allocating a chunk: a filesystem that cannot
    /// allocate ahead turns allocation off for good; other failures are left
    /// to the writes. Whether the chunk is allocated.
    fn allocated(&self, chunk: ChunkToAllocate, result: io::Result<()>) -> bool {
        let Err(error) = result else {
            return true;
        };
        let device = self.device_name.as_str();
        if is_unsupported(&error) {
            let lowered = self.lower_mode(FilePreallocation::Zeroes, FilePreallocation::Off)
                || self.lower_mode(FilePreallocation::Allocate, FilePreallocation::Off);
            if lowered {
                tracing::info!(device, %error, "the filesystem cannot allocate ahead; writes into holes may be slower");
            }
            return false;
        }
        tracing::warn!(
            device,
            offset = chunk.offset,
            length = chunk.length_bytes,
            %error,
            "allocating a chunk of the device file ahead of its writes failed"
        );
        false
    }

    /// Takes the outcome of writing a chunk's zeros: a filesystem without
    /// FIEMAP goes down to allocating only; other failures are logged (the
    /// chunk stays as allocated, which reads the same).
    fn zeroed(&self, chunk: ChunkToAllocate, result: io::Result<()>) {
        let Err(error) = result else {
            return;
        };
        let device = self.device_name.as_str();
        if is_unsupported(&error) {
            if self.lower_mode(FilePreallocation::Zeroes, FilePreallocation::Allocate) {
                tracing::info!(device, %error, "the filesystem cannot map its extents; chunks are allocated ahead but not written ahead, so flushes may commit extent changes");
            }
            return;
        }
        tracing::warn!(
            device,
            offset = chunk.offset,
            length = chunk.length_bytes,
            %error,
            "writing zeros ahead of the device file's writes failed; the chunk stays allocated"
        );
    }
}

fn is_unsupported(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL | libc::ENOTTY)
    )
}

/// `fallocate` keeping the size: allocates the chunk, leaving any data as it is.
fn allocate(file: &File, chunk: ChunkToAllocate) -> io::Result<()> {
    let offset = libc::off_t::try_from(chunk.offset).map_err(io::Error::other)?;
    let length = libc::off_t::try_from(chunk.length_bytes).map_err(io::Error::other)?;
    // SAFETY: fallocate on a descriptor the device owns; no memory is shared
    // with the kernel.
    let result =
        unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, offset, length) };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Writes zeros over the parts of `chunk` that hold no written data, except
/// `skip`. Only whole device blocks are written (the extents of a filesystem
/// with smaller blocks are rounded inwards, leaving a sliver unwritten).
fn write_zeroes(file: &File, chunk: ChunkToAllocate, skip: ByteRange) -> io::Result<()> {
    let whole = ByteRange {
        offset: chunk.offset,
        length_bytes: chunk.length_bytes,
    };
    let zeros = Arc::new(AlignedBuffer::zeroed(ZERO_WRITE_BYTES_MAX));
    for range in unwritten_ranges(file, whole)? {
        for part in outside(range, skip) {
            write_zero_range(file, part, &zeros)?;
        }
    }
    Ok(())
}

/// `range` without `skip`: up to two ranges.
fn outside(range: ByteRange, skip: ByteRange) -> impl Iterator<Item = ByteRange> {
    let before = ByteRange {
        offset: range.offset,
        length_bytes: skip.offset.clamp(range.offset, range.end()) - range.offset,
    };
    let after_start = skip.end().clamp(range.offset, range.end());
    let after = ByteRange {
        offset: after_start,
        length_bytes: range.end() - after_start,
    };
    [before, after]
        .into_iter()
        .filter(|part| part.length_bytes > 0)
}

fn write_zero_range(file: &File, range: ByteRange, zeros: &AlignedBuffer) -> io::Result<()> {
    let alignment = crate::DEVICE_ALIGNMENT_BYTES;
    let mut offset = range.offset.next_multiple_of(alignment);
    let end = range.end() - range.end() % alignment;
    while offset < end {
        let length = (end - offset).min(zeros.len() as u64);
        let length = usize::try_from(length).expect("at most ZERO_WRITE_BYTES_MAX");
        file.write_all_at(&zeros[..length], offset)?;
        offset += length as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn preallocation(size_bytes: u64, mode: FilePreallocation) -> Preallocation {
        let file = tempfile::tempfile().expect("temporary file");
        Preallocation::new("test", Arc::new(file), size_bytes, mode)
    }

    fn prepare_turn(preallocation: &Preallocation, chunk: u64) -> Option<ChunkToAllocate> {
        match preallocation.turn(chunk) {
            ChunkTurn::Prepare(chunk) => Some(chunk),
            _ => None,
        }
    }

    #[test]
    fn each_chunk_is_claimed_once_and_clipped_to_the_file() {
        let preallocation = preallocation(10 * MIB, FilePreallocation::Zeroes);
        assert_eq!(preallocation.chunks(4 * MIB - 4096, 8192), 0..2);
        assert_eq!(
            prepare_turn(&preallocation, 1),
            Some(ChunkToAllocate {
                offset: 4 * MIB,
                length_bytes: 4 * MIB
            })
        );
        assert!(matches!(preallocation.turn(1), ChunkTurn::Wait));
        preallocation.mark_ready(ChunkToAllocate {
            offset: 4 * MIB,
            length_bytes: 4 * MIB,
        });
        assert!(matches!(preallocation.turn(1), ChunkTurn::GoAhead));
        assert_eq!(
            prepare_turn(&preallocation, 2),
            Some(ChunkToAllocate {
                offset: 8 * MIB,
                length_bytes: 2 * MIB
            })
        );
    }

    #[test]
    fn allocating_makes_no_write_wait() {
        let preallocation = preallocation(8 * MIB, FilePreallocation::Allocate);
        assert!(prepare_turn(&preallocation, 0).is_some());
        assert!(matches!(preallocation.turn(0), ChunkTurn::GoAhead));
    }

    #[test]
    fn a_filesystem_without_fallocate_turns_it_off_and_other_errors_do_not() {
        let preallocation = preallocation(64 * MIB, FilePreallocation::Zeroes);
        let chunk = prepare_turn(&preallocation, 0).unwrap();
        assert!(!preallocation.allocated(chunk, Err(io::Error::from_raw_os_error(libc::ENOSPC))));
        assert_eq!(preallocation.chunks(4 * MIB, 4096), 1..2);
        assert!(
            !preallocation.allocated(chunk, Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP)))
        );
        assert_eq!(preallocation.chunks(8 * MIB, 4096), 0..0);
    }

    #[test]
    fn a_filesystem_without_fiemap_goes_down_to_allocating() {
        let preallocation = preallocation(64 * MIB, FilePreallocation::Zeroes);
        let chunk = prepare_turn(&preallocation, 0).unwrap();
        preallocation.zeroed(chunk, Err(io::Error::from_raw_os_error(libc::EIO)));
        assert_eq!(preallocation.mode(), FilePreallocation::Zeroes);
        preallocation.zeroed(chunk, Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP)));
        assert_eq!(preallocation.mode(), FilePreallocation::Allocate);
    }

    #[test]
    fn nothing_is_claimed_for_empty_or_out_of_range_writes() {
        let preallocation = preallocation(4 * MIB, FilePreallocation::Zeroes);
        assert_eq!(preallocation.chunks(0, 0), 0..0);
        assert!(matches!(preallocation.turn(1 << 30), ChunkTurn::GoAhead));
        let off = super::tests::preallocation(4 * MIB, FilePreallocation::Off);
        assert_eq!(off.chunks(0, 4096), 0..0);
    }

    #[test]
    fn the_claiming_write_s_own_range_is_left_out() {
        let range = |offset, length_bytes| ByteRange {
            offset,
            length_bytes,
        };
        let parts = |skip| outside(range(100, 50), skip).collect::<Vec<_>>();
        assert_eq!(parts(range(120, 10)), [range(100, 20), range(130, 20)]);
        assert_eq!(parts(range(0, 110)), [range(110, 40)]);
        assert_eq!(parts(range(140, 100)), [range(100, 40)]);
        assert_eq!(parts(range(0, 1000)), []);
        assert_eq!(parts(range(500, 10)), [range(100, 50)]);
    }
}
