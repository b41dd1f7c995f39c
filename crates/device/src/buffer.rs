//! A heap buffer aligned to [`crate::DEVICE_ALIGNMENT_BYTES`], as O_DIRECT requires.
//! It is the one buffer type that crosses the device boundary, so that data read
//! from or written to a device is never copied just to fix its alignment.
//!
//! Buffers are recycled instead of going back to the allocator, in two
//! classes: one-block buffers, the size of nearly every request on the hot
//! path, through a small per-thread free list (a cache-miss read then costs
//! no malloc, free or page of memset); and large ones of up to
//! [`LARGE_RECYCLED_BUFFER_BYTES_MAX`], the size of the engine's batch
//! buffers, through one free list shared by all threads (a batch taken for
//! overwrite then costs no half-megabyte memset, which was 6 % of the
//! daemon's CPU under 4 KiB random writes). The large class is shared because
//! its buffers are taken on one thread (the connection's, appending under
//! the state lock) and freed on another (the batch's write task, woken by the
//! device's completions): per-thread lists missed nearly every time.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::cell::RefCell;
use std::ptr::NonNull;
use std::sync::Mutex;

use crate::DEVICE_ALIGNMENT_BYTES;

/// The one size of small buffer that is recycled: one device block, which is
/// what a 4 KiB read or write from a client asks of a device.
const RECYCLED_BUFFER_BYTES: usize = 4096;

/// Free one-block buffers kept per thread; beyond it, dropped buffers go back
/// to the allocator. Enough for a deep queue of 4 KiB requests per thread,
/// small enough (256 KiB) not to matter.
const RECYCLED_BUFFERS_PER_THREAD_MAX: usize = 64;

/// The largest buffer kept for reuse: a log batch (its summary, up to 128
/// data blocks and the summary's copy, 520 KiB) fits, a segment does not.
pub const LARGE_RECYCLED_BUFFER_BYTES_MAX: usize = 1024 * 1024;

/// Free large buffers kept in all (at most 16 MiB): more than the batches
/// commonly in flight at once, few enough not to pin much memory.
const LARGE_RECYCLED_BUFFERS_MAX: usize = 16;

const _: () = assert!(RECYCLED_BUFFER_BYTES < LARGE_RECYCLED_BUFFER_BYTES_MAX);

/// A free allocation of `capacity` bytes: always fully initialised (it was
/// zeroed when first allocated and only ever written since).
struct FreeAllocation {
    pointer: NonNull<u8>,
    capacity: usize,
}

// SAFETY: a free allocation is owned by the list that holds it and by no
// one else, like a Vec<u8>'s buffer; moving it between threads is sound.
unsafe impl Send for FreeAllocation {}

impl Drop for FreeAllocation {
    fn drop(&mut self) {
        // SAFETY: allocated in `AlignedBuffer::allocate` with this layout.
        unsafe { dealloc(self.pointer.as_ptr(), AlignedBuffer::layout(self.capacity)) };
    }
}

thread_local! {
    static FREE_BLOCKS: RefCell<Vec<FreeAllocation>> =
        RefCell::new(Vec::with_capacity(RECYCLED_BUFFERS_PER_THREAD_MAX));
}

/// The free large allocations of every thread.
static FREE_LARGE: Mutex<Vec<FreeAllocation>> = Mutex::new(Vec::new());

/// Whether an allocation of `capacity` bytes is of the large recycled class.
fn is_large_recycled_capacity(capacity: usize) -> bool {
    capacity > RECYCLED_BUFFER_BYTES && capacity <= LARGE_RECYCLED_BUFFER_BYTES_MAX
}

fn free_large() -> std::sync::MutexGuard<'static, Vec<FreeAllocation>> {
    // Every update is a single push or remove: a poisoned list is intact.
    FREE_LARGE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A free allocation of exactly `capacity` bytes, if one is kept.
fn take_free_allocation(capacity: usize) -> Option<NonNull<u8>> {
    let free = if capacity == RECYCLED_BUFFER_BYTES {
        FREE_BLOCKS
            .try_with(|free| free.borrow_mut().pop())
            .ok()
            .flatten()?
    } else if is_large_recycled_capacity(capacity) {
        let mut list = free_large();
        let position = list.iter().rposition(|free| free.capacity == capacity)?;
        list.swap_remove(position)
    } else {
        return None;
    };
    let pointer = free.pointer;
    std::mem::forget(free);
    Some(pointer)
}

/// Keeps an allocation of `capacity` bytes for reuse; false (the caller
/// frees it) when it is of no recycled size, or, for a block, when this
/// thread's list is full or being torn down. A full large list makes room
/// by freeing its oldest allocation.
fn keep_free_allocation(pointer: NonNull<u8>, capacity: usize) -> bool {
    if capacity == RECYCLED_BUFFER_BYTES {
        return FREE_BLOCKS
            .try_with(|free| {
                let mut free = free.borrow_mut();
                if free.len() >= RECYCLED_BUFFERS_PER_THREAD_MAX {
                    return false;
                }
                free.push(FreeAllocation { pointer, capacity });
                true
            })
            .unwrap_or(false);
    }
    if !is_large_recycled_capacity(capacity) {
        return false;
    }
    // Full, the oldest goes back to the allocator: reads of assorted sizes
    // (the cleaner's runs) must not crowd out the sizes asked for again and
    // again (a full batch's).
    let oldest = {
        let mut list = free_large();
        let oldest = (list.len() >= LARGE_RECYCLED_BUFFERS_MAX).then(|| list.remove(0));
        list.push(FreeAllocation { pointer, capacity });
        oldest
    };
    drop(oldest);
    true
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
        if let Some(pointer) = take_free_allocation(length) {
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
        if keep_free_allocation(self.pointer, self.capacity) {
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
    fn a_large_buffer_freed_on_another_thread_is_reused_uncleared() {
        // A length no other test asks for, so that no parallel test takes it.
        let length = LARGE_RECYCLED_BUFFER_BYTES_MAX - 3 * 4096;
        let mut first = AlignedBuffer::for_overwrite(length);
        first.fill(0x5a);
        let address = first.as_ptr() as usize;
        std::thread::spawn(move || drop(first)).join().unwrap();
        let again = AlignedBuffer::for_overwrite(length);
        assert_eq!(again.as_ptr() as usize, address);
        assert!(again.iter().all(|byte| *byte == 0x5a));
        drop(again);
        let zeroed = AlignedBuffer::zeroed(length);
        assert_eq!(zeroed.as_ptr() as usize, address);
        assert!(zeroed.iter().all(|byte| *byte == 0));
        // A list full of other sizes (the cleaner's assorted reads) makes
        // room for the newest buffer freed, instead of refusing it.
        let mut kept = AlignedBuffer::for_overwrite(length);
        kept.fill(0x77);
        let kept_address = kept.as_ptr() as usize;
        let others: Vec<AlignedBuffer> = (0..LARGE_RECYCLED_BUFFERS_MAX)
            .map(|index| AlignedBuffer::for_overwrite(length - 4096 * (4 + index)))
            .collect();
        drop(others);
        drop(kept);
        let again = AlignedBuffer::for_overwrite(length);
        assert_eq!(again.as_ptr() as usize, kept_address);
        assert!(again.iter().all(|byte| *byte == 0x77), "recycled, not new");
        // Beyond the largest recycled size, buffers go back to the allocator.
        assert!(!is_large_recycled_capacity(
            LARGE_RECYCLED_BUFFER_BYTES_MAX + 4096
        ));
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
