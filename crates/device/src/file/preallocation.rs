//! Allocates a sparse file's blocks ahead of the writes into them. A direct
//! write into a hole of a file makes the filesystem allocate blocks, which
//! ext4 and XFS cannot do without blocking, so io_uring hands each such write
//! to a worker thread instead of issuing it inline: on a new sparse pool file
//! two thirds of the first pass's writes went that way (BENCHMARKS, issue
//! 20). The first write into each chunk of [`PREALLOCATION_CHUNK_BYTES`]
//! (per open of the device) first allocates the whole chunk with one
//! `fallocate` that keeps the file's size and leaves every byte already
//! written as it is; later writes there are overwrites. A chunk is claimed
//! once; writes racing the claim go ahead without waiting for it (the kernel
//! serialises them against the allocation). A filesystem that cannot
//! allocate ahead (no `fallocate`) turns the component off; any other failure
//! (a full host filesystem) leaves the write to report it.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Bytes allocated at once: a few segments' worth, so that one `fallocate`
/// (itself run on an io_uring worker) serves about a thousand 4 KiB writes.
pub(crate) const PREALLOCATION_CHUNK_BYTES: u64 = 4 << 20;

/// Chunks one word of the claim map covers.
const CHUNKS_PER_WORD: u64 = u64::BITS as u64;

const _: () = assert!(PREALLOCATION_CHUNK_BYTES.is_power_of_two());
const _: () = assert!(PREALLOCATION_CHUNK_BYTES.is_multiple_of(crate::DEVICE_ALIGNMENT_BYTES));

/// The chunks of one open file claimed for allocation so far.
pub(crate) struct Preallocation {
    size_bytes: u64,
    /// One bit per chunk: set once some write claimed its allocation.
    claimed: Box<[AtomicU64]>,
    /// Set when the filesystem refused to allocate ahead.
    off: AtomicBool,
}

/// A chunk a write must allocate before it goes ahead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ChunkToAllocate {
    pub offset: u64,
    pub length_bytes: u64,
}

impl Preallocation {
    pub(crate) fn new(size_bytes: u64) -> Self {
        let chunk_count = size_bytes.div_ceil(PREALLOCATION_CHUNK_BYTES);
        let word_count = chunk_count.div_ceil(CHUNKS_PER_WORD);
        Self {
            size_bytes,
            claimed: (0..word_count).map(|_| AtomicU64::new(0)).collect(),
            off: AtomicBool::new(false),
        }
    }

    /// The chunks of `offset..offset + length_bytes` no write claimed before,
    /// claimed now by the caller, which allocates them (clipped to the file).
    pub(crate) fn claim(
        &self,
        offset: u64,
        length_bytes: u64,
    ) -> impl Iterator<Item = ChunkToAllocate> + '_ {
        let first_chunk = offset / PREALLOCATION_CHUNK_BYTES;
        let end_chunk = (offset + length_bytes).div_ceil(PREALLOCATION_CHUNK_BYTES);
        let chunks = if self.off.load(Ordering::Relaxed) || length_bytes == 0 {
            0..0
        } else {
            first_chunk..end_chunk
        };
        chunks
            .filter(|chunk| self.claim_chunk(*chunk))
            .map(|chunk| {
                let start = chunk * PREALLOCATION_CHUNK_BYTES;
                let end = (start + PREALLOCATION_CHUNK_BYTES).min(self.size_bytes);
                ChunkToAllocate {
                    offset: start,
                    length_bytes: end - start,
                }
            })
    }

    /// Whether this call claimed `chunk` (no earlier call did).
    fn claim_chunk(&self, chunk: u64) -> bool {
        let word = usize::try_from(chunk / CHUNKS_PER_WORD).expect("a word index fits in usize");
        let bit = 1u64 << (chunk % CHUNKS_PER_WORD);
        let Some(word) = self.claimed.get(word) else {
            // Past the end: the write's own range check reports it.
            return false;
        };
        // Read first: every write asks, almost always about a chunk claimed
        // long ago, and a plain load keeps the word's cache line shared
        // between the threads writing instead of moving it on each write.
        if word.load(Ordering::Relaxed) & bit != 0 {
            return false;
        }
        word.fetch_or(bit, Ordering::Relaxed) & bit == 0
    }

    /// Takes the outcome of allocating a chunk: a filesystem that cannot
    /// allocate ahead turns allocation off for good; other failures are left
    /// to the writes.
    pub(crate) fn allocated(&self, device: &str, chunk: ChunkToAllocate, result: io::Result<()>) {
        let Err(error) = result else {
            return;
        };
        let unsupported = matches!(
            error.raw_os_error(),
            Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL)
        );
        if unsupported {
            if !self.off.swap(true, Ordering::Relaxed) {
                tracing::info!(device, %error, "the filesystem cannot allocate ahead; writes into holes may be slower");
            }
            return;
        }
        tracing::warn!(
            device,
            offset = chunk.offset,
            length = chunk.length_bytes,
            %error,
            "allocating a chunk of the device file ahead of its writes failed"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn each_chunk_is_claimed_once_and_clipped_to_the_file() {
        let preallocation = Preallocation::new(10 * MIB);
        let first: Vec<_> = preallocation.claim(4 * MIB - 4096, 8192).collect();
        assert_eq!(
            first,
            [
                ChunkToAllocate {
                    offset: 0,
                    length_bytes: 4 * MIB
                },
                ChunkToAllocate {
                    offset: 4 * MIB,
                    length_bytes: 4 * MIB
                },
            ]
        );
        assert_eq!(preallocation.claim(5 * MIB, 4096).count(), 0);
        let last: Vec<_> = preallocation.claim(9 * MIB, 4096).collect();
        assert_eq!(
            last,
            [ChunkToAllocate {
                offset: 8 * MIB,
                length_bytes: 2 * MIB
            }]
        );
        assert_eq!(preallocation.claim(0, 10 * MIB).count(), 0);
    }

    #[test]
    fn a_filesystem_without_fallocate_turns_it_off_and_other_errors_do_not() {
        let preallocation = Preallocation::new(64 * MIB);
        let chunk = preallocation.claim(0, 4096).next().unwrap();
        preallocation.allocated(
            "test",
            chunk,
            Err(io::Error::from_raw_os_error(libc::ENOSPC)),
        );
        assert_eq!(preallocation.claim(4 * MIB, 4096).count(), 1);
        preallocation.allocated(
            "test",
            chunk,
            Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP)),
        );
        assert_eq!(preallocation.claim(8 * MIB, 4096).count(), 0);
    }

    #[test]
    fn nothing_is_claimed_for_empty_or_out_of_range_writes() {
        let preallocation = Preallocation::new(4 * MIB);
        assert_eq!(preallocation.claim(0, 0).count(), 0);
        assert_eq!(preallocation.claim(1 << 40, 4096).count(), 0);
    }
}
