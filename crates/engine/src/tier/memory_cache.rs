//! A memory cache of device blocks, the top of the memory → flash → capacity
//! hierarchy. It is keyed by *physical* block: in a log-structured store a
//! physical block's contents never change while it is mapped, so the cache needs
//! no invalidation on overwrite, only when a segment is freed for reuse.
//!
//! Eviction is CLOCK (second chance): a hit sets a reference bit, the hand clears
//! bits and evicts the first unreferenced slot. Readers still verify every block
//! they take from the cache against the checksum in the map, as for device reads.
//!
//! For a warm restart (`pool::cache_warmup`) the cache lists what it holds,
//! hottest first, and takes blocks loaded in the background only into room it
//! has: a warm-up never evicts what clients brought in since the start.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::{BLOCK_BYTES, BLOCK_SIZE_BYTES};

const BLOCK: usize = BLOCK_BYTES;

struct Slot {
    physical_block: u64,
    referenced: bool,
}

struct State {
    index_of: HashMap<u64, usize>,
    slots: Vec<Slot>,
    /// `slots.len()` blocks of data, slot `i` at `i * 4096`.
    data: Vec<u8>,
    hand: usize,
    /// Slots emptied by invalidation.
    free_slots: Vec<usize>,
    hits: u64,
    misses: u64,
}

/// See the module documentation.
pub struct MemoryCache {
    capacity_blocks: usize,
    state: Mutex<State>,
}

/// Hit and miss counts, for statistics.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct CacheStatistics {
    pub capacity_bytes: u64,
    pub cached_bytes: u64,
    pub hits: u64,
    pub misses: u64,
}

impl MemoryCache {
    pub fn new(capacity_bytes: u64) -> Self {
        Self {
            capacity_blocks: (capacity_bytes / BLOCK_SIZE_BYTES) as usize,
            state: Mutex::new(State {
                index_of: HashMap::new(),
                slots: Vec::new(),
                data: Vec::new(),
                hand: 0,
                free_slots: Vec::new(),
                hits: 0,
                misses: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("memory cache lock poisoned")
    }

    /// Copies the block into `destination` if cached.
    pub fn get(&self, physical_block: u64, destination: &mut [u8]) -> bool {
        if self.capacity_blocks == 0 {
            return false;
        }
        let mut state = self.lock();
        match state.index_of.get(&physical_block).copied() {
            Some(index) => {
                state.slots[index].referenced = true;
                destination.copy_from_slice(&state.data[index * BLOCK..(index + 1) * BLOCK]);
                state.hits += 1;
                true
            }
            None => {
                state.misses += 1;
                false
            }
        }
    }

    /// Caches a block's contents (replacing any copy).
    pub fn insert(&self, physical_block: u64, contents: &[u8]) {
        assert_eq!(contents.len(), BLOCK);
        if self.capacity_blocks == 0 {
            return;
        }
        let mut state = self.lock();
        let index = if let Some(index) = state.index_of.get(&physical_block).copied() {
            index
        } else if let Some(index) = state.free_slots.pop() {
            state.slots[index] = Slot {
                physical_block,
                referenced: false,
            };
            state.index_of.insert(physical_block, index);
            index
        } else if state.slots.len() < self.capacity_blocks {
            state.slots.push(Slot {
                physical_block,
                referenced: false,
            });
            let new_length = state.data.len() + BLOCK;
            state.data.resize(new_length, 0);
            let index = state.slots.len() - 1;
            state.index_of.insert(physical_block, index);
            index
        } else {
            loop {
                let hand = state.hand;
                state.hand = (hand + 1) % state.slots.len();
                if state.slots[hand].referenced {
                    state.slots[hand].referenced = false;
                    continue;
                }
                let evicted = state.slots[hand].physical_block;
                state.index_of.remove(&evicted);
                state.slots[hand] = Slot {
                    physical_block,
                    referenced: false,
                };
                state.index_of.insert(physical_block, hand);
                break hand;
            }
        };
        state.data[index * BLOCK..(index + 1) * BLOCK].copy_from_slice(contents);
    }

    /// Caches a block's contents only if the cache has room for it without
    /// evicting anything (or already holds it); returns whether it is cached.
    /// For background loading, which must not push out what clients use.
    pub fn insert_if_room(&self, physical_block: u64, contents: &[u8]) -> bool {
        assert_eq!(contents.len(), BLOCK);
        if self.capacity_blocks == 0 {
            return false;
        }
        {
            let state = self.lock();
            let has_room = state.index_of.contains_key(&physical_block)
                || !state.free_slots.is_empty()
                || state.slots.len() < self.capacity_blocks;
            if !has_room {
                return false;
            }
        }
        // Nothing else evicts under `insert` while room is left, and a
        // concurrent insert that took the last room costs one eviction at most.
        self.insert(physical_block, contents);
        true
    }

    /// The physical blocks cached, hottest first: those referenced since the
    /// hand last passed them, then the others from the one the hand would
    /// evict last to the one it would evict next.
    pub fn physical_blocks_hottest_first(&self) -> Vec<u64> {
        let state = self.lock();
        let slot_count = state.slots.len();
        let mut referenced = Vec::new();
        let mut unreferenced = Vec::new();
        // Walking backwards from just behind the hand visits the slots the hand
        // reaches last first.
        for step in 1..=slot_count {
            let index = (state.hand + slot_count - step) % slot_count;
            let slot = &state.slots[index];
            if slot.physical_block == u64::MAX {
                continue;
            }
            if slot.referenced {
                referenced.push(slot.physical_block);
            } else {
                unreferenced.push(slot.physical_block);
            }
        }
        referenced.extend(unreferenced);
        referenced
    }

    /// Forgets every block in `first_block..first_block + block_count` (a segment
    /// about to be reused).
    pub fn invalidate_range(&self, first_block: u64, block_count: u64) {
        if self.capacity_blocks == 0 {
            return;
        }
        let mut state = self.lock();
        for physical_block in first_block..first_block + block_count {
            if let Some(index) = state.index_of.remove(&physical_block) {
                // The slot goes on the free list, reused before anything is evicted.
                state.slots[index].physical_block = u64::MAX;
                state.slots[index].referenced = false;
                state.free_slots.push(index);
            }
        }
    }

    pub fn statistics(&self) -> CacheStatistics {
        let state = self.lock();
        CacheStatistics {
            capacity_bytes: self.capacity_blocks as u64 * BLOCK_SIZE_BYTES,
            cached_bytes: state.index_of.len() as u64 * BLOCK_SIZE_BYTES,
            hits: state.hits,
            misses: state.misses,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(value: u8) -> Vec<u8> {
        vec![value; BLOCK]
    }

    #[test]
    fn hits_evictions_and_invalidation() {
        let cache = MemoryCache::new(2 * BLOCK_SIZE_BYTES);
        let mut out = block(0);
        assert!(!cache.get(10, &mut out));
        cache.insert(10, &block(1));
        cache.insert(11, &block(2));
        assert!(cache.get(10, &mut out) && out == block(1));
        // 10 was referenced, so 11 is evicted for 12.
        cache.insert(12, &block(3));
        assert!(cache.get(10, &mut out));
        assert!(!cache.get(11, &mut out));
        assert!(cache.get(12, &mut out) && out == block(3));
        cache.invalidate_range(12, 1);
        assert!(!cache.get(12, &mut out));
        cache.insert(13, &block(4));
        assert!(cache.get(13, &mut out) && out == block(4));
        assert!(cache.get(10, &mut out) && out == block(1));
        let statistics = cache.statistics();
        assert_eq!(statistics.cached_bytes, 2 * BLOCK_SIZE_BYTES);
        assert_eq!(cache.physical_blocks_hottest_first().len(), 2);
        let disabled = MemoryCache::new(0);
        disabled.insert(1, &block(1));
        assert!(!disabled.get(1, &mut out));
        assert!(!disabled.insert_if_room(1, &block(1)));
    }

    #[test]
    fn lists_referenced_blocks_first_and_loads_only_into_room() {
        let cache = MemoryCache::new(3 * BLOCK_SIZE_BYTES);
        let mut out = block(0);
        for physical_block in [20, 21, 22] {
            assert!(cache.insert_if_room(physical_block, &block(1)));
        }
        assert!(cache.get(21, &mut out));
        let listed = cache.physical_blocks_hottest_first();
        assert_eq!(listed[0], 21, "the referenced block leads");
        assert_eq!(listed.len(), 3);
        // Full: a background load is refused, nothing is evicted.
        assert!(!cache.insert_if_room(23, &block(2)));
        for physical_block in [20, 21, 22] {
            assert!(cache.get(physical_block, &mut out));
        }
        // Already cached blocks are still accepted (same contents).
        assert!(cache.insert_if_room(20, &block(1)));
        cache.invalidate_range(22, 1);
        assert!(cache.insert_if_room(23, &block(2)));
        assert!(cache.get(23, &mut out) && out == block(2));
    }
}
