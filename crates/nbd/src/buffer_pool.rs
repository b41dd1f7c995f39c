//! Payload buffers of one connection, recycled: a read's reply buffer or a
//! write's payload goes back to the connection's free list once its reply is
//! written, and the next request of that size takes it instead of asking the
//! allocator (whose large-chunk path, for 4 KiB and up, showed in profiles of
//! cache-miss reads).

use std::sync::{Arc, Mutex};

/// Free buffers a connection keeps; its in-flight requests bound how many it
/// ever has out at once, so a deep queue of small requests allocates nothing.
pub(crate) const RECYCLED_BUFFERS_MAX: usize = 64;

/// Buffers larger than this go back to the allocator: keeping them would pin
/// memory that only rare large requests use.
pub(crate) const RECYCLED_BUFFER_BYTES_MAX: usize = 128 * 1024;

/// A connection's free list, shared by its reader (which takes buffers) and
/// its writer (which returns them once their reply is on the socket).
#[derive(Clone, Default)]
pub(crate) struct BufferPool {
    free: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl BufferPool {
    /// A buffer of `length` bytes, all zero: a backend that fills less than
    /// it should can then only ever send zeros, never another request's data.
    pub(crate) fn zeroed(&self, length: usize) -> Vec<u8> {
        let mut buffer = self.take(length);
        buffer.clear();
        buffer.resize(length, 0);
        buffer
    }

    /// A buffer of `length` bytes with unspecified contents (old bytes of this
    /// connection's earlier requests), for a payload read from the socket that
    /// overwrites all of it before anything looks at it.
    pub(crate) fn for_overwrite(&self, length: usize) -> Vec<u8> {
        let mut buffer = self.take(length);
        buffer.truncate(length);
        buffer.resize(length, 0);
        buffer
    }

    /// Gives a buffer back for reuse (or to the allocator, see the limits).
    pub(crate) fn give_back(&self, buffer: Vec<u8>) {
        if buffer.capacity() == 0 || buffer.capacity() > RECYCLED_BUFFER_BYTES_MAX {
            return;
        }
        let mut free = self.lock();
        if free.len() < RECYCLED_BUFFERS_MAX {
            free.push(buffer);
        }
    }

    fn take(&self, length: usize) -> Vec<u8> {
        if length <= RECYCLED_BUFFER_BYTES_MAX {
            let mut free = self.lock();
            if let Some(position) = free.iter().rposition(|buffer| buffer.capacity() >= length) {
                return free.swap_remove(position);
            }
        }
        Vec::with_capacity(length)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        // Every update is a single push or remove: a poisoned list is intact.
        self.free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_zeroed_or_as_they_were() {
        let pool = BufferPool::default();
        let mut buffer = pool.zeroed(4096);
        buffer.fill(7);
        let address = buffer.as_ptr() as usize;
        pool.give_back(buffer);
        let again = pool.for_overwrite(4096);
        assert_eq!(again.as_ptr() as usize, address);
        assert_eq!(again.len(), 4096);
        pool.give_back(again);
        let zeroed = pool.zeroed(1000);
        assert_eq!(zeroed.as_ptr() as usize, address);
        assert!(zeroed.iter().all(|byte| *byte == 0));
        pool.give_back(vec![0; RECYCLED_BUFFER_BYTES_MAX + 1]);
        assert_eq!(pool.lock().len(), 0);
    }
}
