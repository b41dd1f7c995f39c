//! Which blocks of a two-tier pool deserve flash: heat per flash block, and the
//! admission decision for blocks read from capacity.
//!
//! The policy is S3-FIFO (docs/decisions/0004-cache-admission-policy.md) laid
//! onto the log instead of onto a separate cache. The flash log is the main FIFO:
//! the cleaner reaches the oldest flash segments first, and for each live block
//! it asks [`Heat::keep_on_flash`]. A block accessed since the cleaner last saw it
//! (its counter is above zero) is reinserted, that is relocated within flash with
//! its counter decremented; any other is demoted to capacity. A block read from
//! capacity is promoted (moved to flash) only when it was read recently before:
//! a ghost FIFO of recently read capacity blocks plays S3-FIFO's ghost queue, so
//! that one sequential scan, which reads every block once, promotes nothing and
//! cannot push the hot set out. Fresh writes land on flash with the heat of the
//! block they replace, so rewritten-hot data stays and write-once data (a copied
//! file share) leaves at the first cleaning.
//!
//! Per-volume priorities scale this: the counter's ceiling (how many cleanings a
//! block survives unaccessed) and how many recent reads a capacity block needs
//! before promotion. Everything here is memory only: heat is a hint for where
//! blocks go, never for what they contain, so a restart starts cold.

use std::collections::{HashMap, VecDeque};

use crate::volume::{CachePriority, Pin, TierPolicy};

/// Cleanings a block survives without being accessed, at most, per priority.
fn counter_max(policy: TierPolicy) -> u8 {
    match (policy.pin, policy.priority) {
        (Pin::Flash, _) => 7,
        (Pin::Capacity, _) | (Pin::Auto, CachePriority::None) => 0,
        (Pin::Auto, CachePriority::High) => 7,
        (Pin::Auto, CachePriority::Normal) => 3,
        (Pin::Auto, CachePriority::Low) => 1,
    }
}

/// Earlier reads within the ghost window a capacity block needs before it is
/// promoted (None: never promoted).
fn reads_before_promotion(policy: TierPolicy) -> Option<u8> {
    match (policy.pin, policy.priority) {
        (Pin::Flash, _) | (Pin::Auto, CachePriority::High) => Some(0),
        (Pin::Capacity, _) | (Pin::Auto, CachePriority::None) => None,
        (Pin::Auto, CachePriority::Normal) => Some(1),
        (Pin::Auto, CachePriority::Low) => Some(2),
    }
}

/// A FIFO of recently read capacity blocks with how often each was read.
struct Ghost {
    order: VecDeque<u64>,
    reads: HashMap<u64, u8>,
    entries_max: usize,
}

impl Ghost {
    /// Counts a read of `key`; returns the reads counted before this one.
    fn record(&mut self, key: u64) -> u8 {
        if let Some(reads) = self.reads.get_mut(&key) {
            let before = *reads;
            *reads = reads.saturating_add(1);
            return before;
        }
        if self.entries_max == 0 {
            return 0;
        }
        while self.order.len() >= self.entries_max {
            let oldest = self.order.pop_front().expect("a full ghost is not empty");
            self.reads.remove(&oldest);
        }
        self.order.push_back(key);
        self.reads.insert(key, 1);
        0
    }

    fn forget(&mut self, key: u64) {
        // The key's place in `order` goes when it reaches the front; a key
        // recorded again meanwhile gets a second place, which is harmless.
        self.reads.remove(&key);
    }
}

/// See the module documentation.
pub struct Heat {
    /// Per flash data block (indexed from the first flash segment's first block).
    counters: Vec<u8>,
    ghost: Ghost,
}

impl Heat {
    /// Heat for `flash_data_block_count` flash blocks, remembering at most
    /// `ghost_entries_max` recently read capacity blocks.
    pub fn new(flash_data_block_count: u64, ghost_entries_max: usize) -> Self {
        Self {
            counters: vec![0; flash_data_block_count as usize],
            ghost: Ghost {
                order: VecDeque::new(),
                reads: HashMap::new(),
                entries_max: ghost_entries_max,
            },
        }
    }

    /// The counter of flash block `flash_index`.
    pub fn counter(&self, flash_index: u64) -> u8 {
        self.counters[flash_index as usize]
    }

    /// A read or write hit a flash block.
    pub fn flash_accessed(&mut self, flash_index: u64, policy: TierPolicy) {
        let counter = &mut self.counters[flash_index as usize];
        *counter = counter.saturating_add(1).min(counter_max(policy));
    }

    /// A block was just written to flash: new data (`replaced_counter` is the
    /// heat of the flash block it replaces, if any), a relocation within flash
    /// (the counter it keeps) or a promotion.
    pub fn flash_written(&mut self, flash_index: u64, counter: u8, policy: TierPolicy) {
        self.counters[flash_index as usize] = counter.min(counter_max(policy));
    }

    /// The heat a rewrite of a block with `replaced_counter` starts with: a
    /// write is an access.
    pub fn after_rewrite(replaced_counter: Option<u8>) -> u8 {
        replaced_counter.map_or(0, |counter| counter.saturating_add(1))
    }

    /// The cleaner found flash block `flash_index` live in a victim: whether it
    /// stays on flash (its counter is then decremented) or goes to capacity.
    pub fn keep_on_flash(&mut self, flash_index: u64, policy: TierPolicy) -> bool {
        if policy.pin == Pin::Flash {
            return true;
        }
        let counter = &mut self.counters[flash_index as usize];
        *counter = (*counter).min(counter_max(policy));
        if *counter == 0 {
            return false;
        }
        *counter -= 1;
        true
    }

    /// Capacity block `physical_block` was read: whether to promote it now.
    pub fn admit_from_capacity(&mut self, physical_block: u64, policy: TierPolicy) -> bool {
        let Some(needed) = reads_before_promotion(policy) else {
            return false;
        };
        if needed == 0 {
            return true;
        }
        let before = self.ghost.record(physical_block);
        if before >= needed {
            self.ghost.forget(physical_block);
            return true;
        }
        false
    }

    /// Recently read capacity blocks remembered now.
    pub fn ghost_entry_count(&self) -> usize {
        self.ghost.reads.len()
    }
}

/// What one volume's reads and moves did, for `volume stats` and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct VolumeTierCounters {
    /// Blocks read from memory: the memory cache or data not yet written.
    pub memory_read_blocks: u64,
    pub flash_read_blocks: u64,
    pub capacity_read_blocks: u64,
    /// Blocks moved from capacity to flash on access.
    pub promoted_blocks: u64,
    /// Blocks the cleaner moved from flash to capacity.
    pub demoted_blocks: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(priority: CachePriority, pin: Pin) -> TierPolicy {
        TierPolicy { priority, pin }
    }

    #[test]
    fn a_block_stays_on_flash_as_long_as_it_is_accessed_between_cleanings() {
        let normal = TierPolicy::default();
        let mut heat = Heat::new(16, 16);
        heat.flash_written(3, Heat::after_rewrite(None), normal);
        assert!(!heat.keep_on_flash(3, normal), "write-once data leaves");
        heat.flash_written(4, 0, normal);
        heat.flash_accessed(4, normal);
        assert!(heat.keep_on_flash(4, normal));
        assert!(!heat.keep_on_flash(4, normal), "not accessed since");
        for _ in 0..10 {
            heat.flash_accessed(5, normal);
        }
        // The ceiling bounds how long past heat protects a block.
        assert_eq!(heat.counter(5), 3);
        let kept = (0..10)
            .take_while(|_| heat.keep_on_flash(5, normal))
            .count();
        assert_eq!(kept, 3);
    }

    #[test]
    fn priorities_and_pins_scale_residency() {
        let mut heat = Heat::new(8, 8);
        let high = policy(CachePriority::High, Pin::Auto);
        let low = policy(CachePriority::Low, Pin::Auto);
        let none = policy(CachePriority::None, Pin::Auto);
        for _ in 0..10 {
            heat.flash_accessed(0, high);
            heat.flash_accessed(1, low);
            heat.flash_accessed(2, none);
        }
        assert_eq!(
            (heat.counter(0), heat.counter(1), heat.counter(2)),
            (7, 1, 0)
        );
        assert!(!heat.keep_on_flash(2, none));
        let pinned = policy(CachePriority::None, Pin::Flash);
        assert!(heat.keep_on_flash(7, pinned), "pinned blocks never leave");
        heat.flash_accessed(6, TierPolicy::default());
        assert!(!heat.keep_on_flash(6, policy(CachePriority::High, Pin::Capacity)));
    }

    #[test]
    fn a_scan_promotes_nothing_and_a_reread_promotes() {
        let normal = TierPolicy::default();
        let mut heat = Heat::new(0, 1000);
        // One pass over 500 blocks: nothing is promoted.
        assert!((0..500).all(|block| !heat.admit_from_capacity(block, normal)));
        // A second read within the ghost window promotes, once.
        assert!(heat.admit_from_capacity(7, normal));
        assert!(!heat.admit_from_capacity(7, normal));
        // Low priority needs a third read; high and pinned volumes the first;
        // none and capacity-pinned never.
        let low = policy(CachePriority::Low, Pin::Auto);
        assert!(!heat.admit_from_capacity(2000, low));
        assert!(!heat.admit_from_capacity(2000, low));
        assert!(heat.admit_from_capacity(2000, low));
        assert!(heat.admit_from_capacity(3000, policy(CachePriority::High, Pin::Auto)));
        assert!(heat.admit_from_capacity(3001, policy(CachePriority::Low, Pin::Flash)));
        let never = policy(CachePriority::None, Pin::Auto);
        assert!((0..3).all(|_| !heat.admit_from_capacity(4000, never)));
    }

    #[test]
    fn the_ghost_is_bounded_and_forgets_the_oldest() {
        let normal = TierPolicy::default();
        let mut heat = Heat::new(0, 100);
        for block in 0..1000 {
            heat.admit_from_capacity(block, normal);
        }
        assert_eq!(heat.ghost_entry_count(), 100);
        assert!(
            !heat.admit_from_capacity(0, normal),
            "forgotten: a first read again"
        );
        assert!(heat.admit_from_capacity(999, normal));
    }
}
