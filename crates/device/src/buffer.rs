//! A heap buffer aligned to [`crate::DEVICE_ALIGNMENT_BYTES`], as O_DIRECT requires.
//! It is the one buffer type that crosses the device boundary, so that data read
//! from or written to a device is never copied just to fix its alignment.
//!
//! One-block buffers, the size of nearly every request on the hot path, are
//! recycled through a small per-thread free list instead of going back to the
//! allocator: a cache-miss read then costs no malloc, free or page of memset.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::cell::RefCell;
use std::ptr::NonNull;

use crate::DEVICE_ALIGNMENT_BYTES;

/// The one size of buffer that is recycled: one device block, which is what a
/// 4 KiB read or write from a client asks of a device.
const RECYCLED_BUFFER_BYTES: usize = 4096;

/// Free one-block buffers kept per thread; beyond it, dropped buffers go back
/// to the allocator. Enough for a deep queue of 4 KiB requests per thread,
/// small enough (256 KiB) not to matter.
const RECYCLED_BUFFERS_PER_THREAD_MAX: usize = 64;

/// A free one-block allocation: always fully initialised (it was zeroed
/// when first allocated and only ever written since).
struct FreeBlock(NonNull<u8>);

impl Drop for FreeBlock {
    fn drop(&mut self) {
        // SAFETY: allocated in `AlignedBuffer::allocate` with this layout.
        unsafe {
            dealloc(
                self.0.as_ptr(),
                AlignedBuffer::layout(RECYCLED_BUFFER_BYTES),
            )
        };
    }
}

thread_local! {
    static FREE_BLOCKS: RefCell<Vec<FreeBlock>> =
        RefCell::new(Vec::with_capacity(RECYCLED_BUFFERS_PER_THREAD_MAX));
}

/// A free one-block allocation of this thread, if it has one.
fn take_free_block() -> Option<NonNull<u8>> {
    FREE_BLOCKS
        .try_with(|free| {
            let block = free.borrow_mut().pop()?;
            let pointer = block.0;
            std::mem::forget(block);
            Some(pointer)
        })
        .ok()
        .flatten()
}

/// Keeps a one-block allocation for reuse; false (the caller frees it) when
/// this thread's list is full or being torn down.
fn keep_free_block(pointer: NonNull<u8>) -> bool {
    FREE_BLOCKS
        .try_with(|free| {
            let mut free = free.borrow_mut();
            if free.len() >= RECYCLED_BUFFERS_PER_THREAD_MAX {
                return false;
            }
            free.push(FreeBlock(pointer));
            true
        })
        .unwrap_or(false)
}

/// An owned, zero-initialised, 4096-byte-aligned byte buffer of fixed length.
pub struct AlignedBuffer {
    pointer: NonNull<u8>,
    length: usize,
    /// Bytes allocated; at least `length` (shrinking keeps the allocation).
    capacity: usize,
}

// SAFETY: the buffer owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuffer {}
// SAFETY: shared references only allow reads, like &Vec<u8>.
unsafe impl Sync for AlignedBuffer {}

impl AlignedBuffer {
    /// A zeroed buffer of `length` bytes; `length` must be a multiple of the alignment.
    pub fn zeroed(length: usize) -> Self {
        let (mut buffer, recycled) = Self::allocate(length);
        if recycled {
            buffer.fill(0);
        }
        buffer
    }

    /// A buffer of `length` bytes whose contents are unspecified (left over
    /// from an earlier use of its memory in this process), for a device read
    /// that overwrites all of it: it saves clearing a block that the device
    /// is about to fill. Whoever uses it must expose its bytes only once they
    /// have all been overwritten.
    pub fn for_overwrite(length: usize) -> Self {
        Self::allocate(length).0
    }

    /// A buffer of `length` bytes, recycled (with old contents: true) or
    /// freshly allocated and zeroed (false).
    fn allocate(length: usize) -> (Self, bool) {
        assert!(
            (length as u64).is_multiple_of(DEVICE_ALIGNMENT_BYTES),
            "buffer length {length} is not aligned"
        );
        if length == 0 {
            let empty = Self {
                pointer: NonNull::dangling(),
                length: 0,
                capacity: 0,
            };
            return (empty, false);
        }
        if length == RECYCLED_BUFFER_BYTES
            && let Some(pointer) = take_free_block()
        {
            let buffer = Self {
                pointer,
                length,
                capacity: length,
            };
            return (buffer, true);
        }
        let layout = Self::layout(length);
        // SAFETY: the layout has a non-zero size. Zeroed so that every byte is
        // initialised, which a recycled buffer then stays.
        let raw = unsafe { alloc_zeroed(layout) };
        let pointer = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        let buffer = Self {
            pointer,
            length,
            capacity: length,
        };
        (buffer, false)
    }

    /// Shortens the buffer to `length` bytes (an aligned length), keeping its
    /// allocation, so that a partly filled buffer can be written without a copy.
    pub fn truncate(&mut self, length: usize) {
        assert!((length as u64).is_multiple_of(DEVICE_ALIGNMENT_BYTES) && length <= self.length);
        self.length = length;
    }

    /// A buffer holding a copy of `data`, zero-padded up to the alignment.
    pub fn from_slice_padded(data: &[u8]) -> Self {
        let length = data
            .len()
            .next_multiple_of(crate::buffer_length(DEVICE_ALIGNMENT_BYTES));
        let mut buffer = Self::zeroed(length);
        buffer[..data.len()].copy_from_slice(data);
        buffer
    }

    fn layout(length: usize) -> Layout {
        Layout::from_size_align(length, crate::buffer_length(DEVICE_ALIGNMENT_BYTES))
            .expect("aligned buffer layout")
    }

    pub fn len(&self) -> usize {
        self.length
    }

    pub fn is_empty(&self) -> bool {
        self.length == 0
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        if self.capacity == RECYCLED_BUFFER_BYTES && keep_free_block(self.pointer) {
            return;
        }
        if self.capacity != 0 {
            // SAFETY: allocated in `allocate` with exactly this layout.
            unsafe { dealloc(self.pointer.as_ptr(), Self::layout(self.capacity)) };
        }
    }
}

impl std::ops::Deref for AlignedBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: pointer is valid for `length` initialised bytes (or dangling with length 0).
        unsafe { std::slice::from_raw_parts(self.pointer.as_ptr(), self.length) }
    }
}

impl std::ops::DerefMut for AlignedBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in Deref, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.pointer.as_ptr(), self.length) }
    }
}

impl Clone for AlignedBuffer {
    fn clone(&self) -> Self {
        let mut copy = Self::zeroed(self.length);
        copy.copy_from_slice(self);
        copy
    }
}

impl std::fmt::Debug for AlignedBuffer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "AlignedBuffer({} bytes)", self.length)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_zeroed() {
        let buffer = AlignedBuffer::zeroed(8192);
        assert_eq!(buffer.as_ptr() as usize % 4096, 0);
        assert!(buffer.iter().all(|byte| *byte == 0));
        let padded = AlignedBuffer::from_slice_padded(b"abc");
        assert_eq!(padded.len(), 4096);
        assert_eq!(&padded[..3], b"abc");
        assert_eq!(padded[3], 0);
    }

    #[test]
    fn recycled_blocks_are_reused_and_zeroed_on_request() {
        let mut first = AlignedBuffer::for_overwrite(4096);
        first.fill(0xa5);
        let address = first.as_ptr() as usize;
        drop(first);
        // The same thread gets the same block back, with its old contents
        // when it asks for a buffer to overwrite...
        let again = AlignedBuffer::for_overwrite(4096);
        assert_eq!(again.as_ptr() as usize, address);
        assert!(again.iter().all(|byte| *byte == 0xa5));
        drop(again);
        // ...and cleared when it asks for zeros.
        let zeroed = AlignedBuffer::zeroed(4096);
        assert_eq!(zeroed.as_ptr() as usize, address);
        assert!(zeroed.iter().all(|byte| *byte == 0));
    }
}
