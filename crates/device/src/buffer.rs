//! A heap buffer aligned to [`crate::DEVICE_ALIGNMENT_BYTES`], as O_DIRECT requires.
//! It is the one buffer type that crosses the device boundary, so that data read
//! from or written to a device is never copied just to fix its alignment.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;

use crate::DEVICE_ALIGNMENT_BYTES;

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
        assert!(
            (length as u64).is_multiple_of(DEVICE_ALIGNMENT_BYTES),
            "buffer length {length} is not aligned"
        );
        if length == 0 {
            return Self {
                pointer: NonNull::dangling(),
                length: 0,
                capacity: 0,
            };
        }
        let layout = Self::layout(length);
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let pointer = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Self {
            pointer,
            length,
            capacity: length,
        }
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
        if self.capacity != 0 {
            // SAFETY: allocated in `zeroed` with exactly this layout.
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
}
