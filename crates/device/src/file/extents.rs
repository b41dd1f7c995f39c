//! Which parts of a range of a file hold no written data yet: holes, and
//! extents allocated ahead of their writes (`fallocate`) that the filesystem
//! marks *unwritten*. Read through the `FS_IOC_FIEMAP` ioctl, with the file's
//! dirty pages synced first (`FIEMAP_FLAG_SYNC`), so that data still in the
//! page cache counts as written. Only these parts may be written with zeros
//! without changing what the file reads as (see `preallocation.rs`); a range
//! whose state the filesystem does not report exactly (delayed allocation,
//! unknown location, inline data) counts as written.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// `_IOWR('f', 11, struct fiemap)`, the same encoding on every Linux
/// architecture lamina builds for; the libc crate does not export it.
const FS_IOC_FIEMAP: libc::Ioctl = 0xC020_660B;
/// Sync the file's data before mapping it.
const FIEMAP_FLAG_SYNC: u32 = 0x1;
/// The extent is the file's last.
const FIEMAP_EXTENT_LAST: u32 = 0x1;
/// The extent's location is not known yet.
const FIEMAP_EXTENT_UNKNOWN: u32 = 0x2;
/// The extent is allocated but reads as zeros until written.
const FIEMAP_EXTENT_UNWRITTEN: u32 = 0x800;

/// Extents asked for per ioctl; a range with more is mapped in several calls.
const EXTENTS_PER_CALL_MAX: usize = 64;

/// `struct fiemap_extent` of `linux/fiemap.h`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct FiemapExtent {
    logical: u64,
    physical: u64,
    length: u64,
    reserved64: [u64; 2],
    flags: u32,
    reserved: [u32; 3],
}

/// `struct fiemap` with room for [`EXTENTS_PER_CALL_MAX`] extents after it.
#[repr(C)]
struct FiemapRequest {
    start: u64,
    length: u64,
    flags: u32,
    mapped_extent_count: u32,
    extent_count: u32,
    reserved: u32,
    extents: [FiemapExtent; EXTENTS_PER_CALL_MAX],
}

/// A range of bytes of the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ByteRange {
    pub offset: u64,
    pub length_bytes: u64,
}

impl ByteRange {
    pub(crate) fn end(&self) -> u64 {
        self.offset + self.length_bytes
    }
}

/// The parts of `range` that hold no written data: holes and unwritten
/// extents, in order, clipped to `range`. Fails where the filesystem has no
/// FIEMAP (`EOPNOTSUPP`), which the caller takes as "cannot tell".
pub(crate) fn unwritten_ranges(file: &File, range: ByteRange) -> io::Result<Vec<ByteRange>> {
    let mut unwritten = Vec::new();
    // Everything before `mapped_up_to` has been accounted for.
    let mut mapped_up_to = range.offset;
    while mapped_up_to < range.end() {
        let extents = map_extents(file, mapped_up_to, range.end() - mapped_up_to)?;
        let Some(last) = extents.last().copied() else {
            break;
        };
        for extent in &extents {
            let start = extent.logical.max(mapped_up_to);
            let end = (extent.logical + extent.length).min(range.end());
            if start > mapped_up_to {
                unwritten.push(ByteRange {
                    offset: mapped_up_to,
                    length_bytes: start.min(range.end()) - mapped_up_to,
                });
            }
            let reads_as_zeros = extent.flags & FIEMAP_EXTENT_UNWRITTEN != 0
                && extent.flags & FIEMAP_EXTENT_UNKNOWN == 0;
            if reads_as_zeros && end > start {
                unwritten.push(ByteRange {
                    offset: start,
                    length_bytes: end - start,
                });
            }
            mapped_up_to = mapped_up_to.max(end);
        }
        if last.flags & FIEMAP_EXTENT_LAST != 0 || last.logical + last.length >= range.end() {
            break;
        }
    }
    if mapped_up_to < range.end() {
        // A hole to the end of the range (or of the file).
        unwritten.push(ByteRange {
            offset: mapped_up_to,
            length_bytes: range.end() - mapped_up_to,
        });
    }
    Ok(merged(unwritten))
}

/// One FIEMAP call: the extents of `start..start + length` (the first may
/// begin before `start`), at most [`EXTENTS_PER_CALL_MAX`].
fn map_extents(file: &File, start: u64, length: u64) -> io::Result<Vec<FiemapExtent>> {
    let mut request = FiemapRequest {
        start,
        length,
        flags: FIEMAP_FLAG_SYNC,
        mapped_extent_count: 0,
        extent_count: u32::try_from(EXTENTS_PER_CALL_MAX).expect("a small constant"),
        reserved: 0,
        extents: [FiemapExtent::default(); EXTENTS_PER_CALL_MAX],
    };
    // SAFETY: `request` is a `struct fiemap` followed by room for the
    // `extent_count` extents it announces, as FS_IOC_FIEMAP requires; the
    // kernel writes only within it, and it outlives the call.
    let result = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_FIEMAP, &raw mut request) };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    let mapped = usize::try_from(request.mapped_extent_count)
        .expect("a u32 fits in usize")
        .min(EXTENTS_PER_CALL_MAX);
    Ok(request.extents[..mapped].to_vec())
}

/// `ranges` in order with touching neighbours joined.
fn merged(ranges: Vec<ByteRange>) -> Vec<ByteRange> {
    let mut joined: Vec<ByteRange> = Vec::with_capacity(ranges.len());
    for range in ranges {
        match joined.last_mut() {
            Some(previous) if previous.end() == range.offset => {
                previous.length_bytes += range.length_bytes;
            }
            _ => joined.push(range),
        }
    }
    joined
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;

    const KIB: u64 = 1 << 10;

    fn range(offset: u64, length_bytes: u64) -> ByteRange {
        ByteRange {
            offset,
            length_bytes,
        }
    }

    /// A file on the temporary directory's filesystem, or `None` where that
    /// filesystem has no FIEMAP or no `fallocate` (tmpfs on some kernels).
    fn file_with_extents(size_bytes: u64) -> Option<(tempfile::TempDir, File)> {
        let directory = tempfile::tempdir_in("/tmp").expect("temp dir");
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(directory.path().join("file"))
            .expect("create");
        file.set_len(size_bytes).expect("size");
        match unwritten_ranges(&file, range(0, size_bytes)) {
            Ok(_) => Some((directory, file)),
            Err(error) => {
                eprintln!("skipped: no FIEMAP on /tmp: {error}");
                None
            }
        }
    }

    fn allocate(file: &File, offset: u64, length_bytes: u64) -> bool {
        let offset = libc::off_t::try_from(offset).expect("small");
        let length = libc::off_t::try_from(length_bytes).expect("small");
        // SAFETY: fallocate on a descriptor this test owns; no memory is shared.
        unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, offset, length) == 0 }
    }

    #[test]
    fn a_sparse_file_is_one_unwritten_range() {
        let Some((_directory, file)) = file_with_extents(1 << 20) else {
            return;
        };
        assert_eq!(
            unwritten_ranges(&file, range(64 * KIB, 128 * KIB)).unwrap(),
            [range(64 * KIB, 128 * KIB)]
        );
    }

    #[test]
    fn written_data_is_excluded_and_allocated_space_is_not() {
        let Some((_directory, file)) = file_with_extents(1 << 20) else {
            return;
        };
        if !allocate(&file, 0, 1 << 20) {
            eprintln!("skipped: no fallocate on /tmp");
            return;
        }
        file.write_all_at(&[7u8; 8192], 256 * KIB).expect("write");
        file.write_all_at(&[9u8; 4096], 768 * KIB).expect("write");
        assert_eq!(
            unwritten_ranges(&file, range(0, 1 << 20)).unwrap(),
            [
                range(0, 256 * KIB),
                range(264 * KIB, 504 * KIB),
                range(772 * KIB, 252 * KIB)
            ]
        );
        // Clipped to the range asked about.
        assert_eq!(
            unwritten_ranges(&file, range(260 * KIB, 12 * KIB)).unwrap(),
            [range(264 * KIB, 8 * KIB)]
        );
        assert_eq!(
            unwritten_ranges(&file, range(256 * KIB, 8 * KIB)).unwrap(),
            []
        );
    }

    #[test]
    fn neighbours_are_merged() {
        assert_eq!(
            merged(vec![range(0, 4), range(4, 4), range(10, 2)]),
            [range(0, 8), range(10, 2)]
        );
    }
}
