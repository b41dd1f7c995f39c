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
//! a ghost of recently read capacity blocks (as many as the flash holds, 4
//! bytes each) plays S3-FIFO's ghost queue, so that one sequential scan, which
//! reads every block once, promotes nothing and cannot push the hot set out.
//! `lamina_model::cache::HeatPolicy` runs this struct on synthetic traces; the
//! figures are in the decision note's "Engine policy (log FIFO)". Fresh writes land on flash with the heat of the
//! block they replace, so rewritten-hot data stays and write-once data (a copied
//! file share) leaves at the first cleaning.
//!
//! Per-volume priorities scale this: the counter's ceiling (how many cleanings a
//! block survives unaccessed) and how many recent reads a capacity block needs
//! before promotion. Everything here is memory only: heat is a hint for where
//! blocks go, never for what they contain, so a restart starts cold.

use crate::convert::to_usize;
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

/// Cleanings one access buys a block. High priority counts double, so that its
/// working set outlasts a low-priority stream that turns flash over faster than
/// the working set is re-read (measured in crates/cli/tests/tiering.rs: with one
/// count per access, a high-priority set warmed by three reads lost 25% to 87%
/// of its blocks to one flash's worth of low-priority writes).
fn access_increment(policy: TierPolicy) -> u8 {
    match (policy.pin, policy.priority) {
        (Pin::Flash, _) | (Pin::Auto, CachePriority::High) => 2,
        _ => 1,
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

/// Ghost entries per 100 flash blocks. The ghost's length is the window in
/// which a second read promotes. Shorter windows promote only hotter blocks
/// and were up to 1 point better on Zipf traces (docs/decisions/
/// 0004-cache-admission-policy.md, "Engine policy (log FIFO)"), but a loop over
/// a working set that fits in flash and is longer than the window would then
/// be promoted slowly or never, and a scan longer than the window makes every
/// block start over. As long as the flash (S3-FIFO's choice too), such a loop
/// is all on flash after three passes (`lamina_model::cache::HeatPolicy`'s
/// tests).
const GHOST_ENTRIES_PERCENT_OF_FLASH: usize = 100;

/// Ghost entries per bucket. A block's entry can only be in the bucket its
/// hash picks, and each bucket forgets its oldest entry first, so the ghost is
/// a FIFO per bucket: close to one FIFO of all entries, without links.
const GHOST_BUCKET_ENTRIES: usize = 8;

/// Low bits of a ghost entry that count reads (1..=15; 0 is an empty entry).
const GHOST_READ_BITS: u32 = 4;
const GHOST_READS_MAX: u32 = (1 << GHOST_READ_BITS) - 1;

/// Recently read capacity blocks with how often each was read, as 28-bit
/// fingerprints and read counts packed into 4 bytes per entry (a `VecDeque`
/// and a `HashMap` took about 40). Two blocks with the same bucket and
/// fingerprint share an entry; at most `GHOST_BUCKET_ENTRIES` in 2^28 lookups
/// of a block never read find a false entry, and then the block is promoted a
/// read early: heat is a hint, never a correctness matter.
struct Ghost {
    /// Buckets of `GHOST_BUCKET_ENTRIES` (the last one may be shorter), newest
    /// entry first; an entry is `fingerprint << GHOST_READ_BITS | reads`.
    entries: Vec<u32>,
    /// Non-empty entries.
    entry_count: usize,
    /// State of a linear congruential generator picking which entry a full
    /// bucket forgets (fixed seed: runs repeat).
    random: u64,
}

impl Ghost {
    fn new(entries_max: usize) -> Self {
        Self {
            entries: vec![0; entries_max],
            entry_count: 0,
            random: 0x853c_49e6_748f_ea9b,
        }
    }

    /// The bucket of `key` (a range of `entries`) and its fingerprint.
    fn locate(&self, key: u64) -> (std::ops::Range<usize>, u32) {
        // A multiply-xorshift mix: the high half picks the bucket, the low
        // half is the fingerprint, so the two are independent.
        let mut hash = key.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        hash ^= hash >> 29;
        hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        hash ^= hash >> 32;
        let bucket_count = self.entries.len().div_ceil(GHOST_BUCKET_ENTRIES);
        let bucket = (((hash >> 32) * bucket_count as u64) >> 32) as usize;
        let start = bucket * GHOST_BUCKET_ENTRIES;
        let end = (start + GHOST_BUCKET_ENTRIES).min(self.entries.len());
        let low_bits = u32::try_from(hash & u64::from(u32::MAX)).expect("masked to 32 bits");
        let fingerprint = (low_bits >> GHOST_READ_BITS).max(1);
        (start..end, fingerprint)
    }

    fn find(&self, bucket: &std::ops::Range<usize>, fingerprint: u32) -> Option<usize> {
        bucket
            .clone()
            .find(|index| self.entries[*index] >> GHOST_READ_BITS == fingerprint)
    }

    /// Counts a read of `key`; returns the reads counted before this one.
    fn record(&mut self, key: u64) -> u8 {
        if self.entries.is_empty() {
            return 0;
        }
        let (bucket, fingerprint) = self.locate(key);
        if let Some(index) = self.find(&bucket, fingerprint) {
            let entry = self.entries[index];
            let before = entry & GHOST_READS_MAX;
            self.entries[index] = entry - before + (before + 1).min(GHOST_READS_MAX);
            return before as u8;
        }
        // The newest entry goes first. A full bucket forgets an entry of its
        // older half picked at random rather than always its oldest: a loop
        // over a few more blocks than fit one bucket would otherwise push out
        // each of its blocks just before that block comes round again, and
        // never be promoted (each promotion frees an entry, so a loop that
        // fits the ghost as a whole is soon all promoted).
        let length = bucket.len();
        let dropped = if self.entries[bucket.end - 1] == 0 {
            self.entry_count += 1;
            length - 1
        } else {
            self.random = self
                .random
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            let older_half = length / 2;
            length - 1 - ((self.random >> 33) as usize % older_half.max(1))
        };
        self.entries[bucket.start..bucket.start + dropped + 1].rotate_right(1);
        self.entries[bucket.start] = fingerprint << GHOST_READ_BITS | 1;
        0
    }

    fn forget(&mut self, key: u64) {
        if self.entries.is_empty() {
            return;
        }
        let (bucket, fingerprint) = self.locate(key);
        if let Some(index) = self.find(&bucket, fingerprint) {
            self.entries[index..bucket.end].rotate_left(1);
            self.entries[bucket.end - 1] = 0;
            self.entry_count -= 1;
        }
    }
}

/// See the module documentation.
pub struct Heat {
    /// Per flash data block (indexed from the first flash segment's first block).
    counters: Vec<u8>,
    ghost: Ghost,
}

impl Heat {
    /// Heat for `flash_data_block_count` flash blocks, remembering
    /// recently read capacity blocks: as many as there are flash blocks
    /// ([`GHOST_ENTRIES_PERCENT_OF_FLASH`]), at most `ghost_entries_max`
    /// (4 bytes each).
    pub fn new(flash_data_block_count: u64, ghost_entries_max: usize) -> Self {
        Self {
            counters: vec![0; to_usize(flash_data_block_count)],
            ghost: Ghost::new(ghost_entries_max.min(
                to_usize(flash_data_block_count).saturating_mul(GHOST_ENTRIES_PERCENT_OF_FLASH)
                    / 100,
            )),
        }
    }

    /// The counter of flash block `flash_index`.
    pub fn counter(&self, flash_index: u64) -> u8 {
        self.counters[to_usize(flash_index)]
    }

    /// A read or write hit a flash block.
    pub fn flash_accessed(&mut self, flash_index: u64, policy: TierPolicy) {
        let counter = &mut self.counters[to_usize(flash_index)];
        *counter = counter
            .saturating_add(access_increment(policy))
            .min(counter_max(policy));
    }

    /// A block was just written to flash: new data (`replaced_counter` is the
    /// heat of the flash block it replaces, if any), a relocation within flash
    /// (the counter it keeps) or a promotion.
    pub fn flash_written(&mut self, flash_index: u64, counter: u8, policy: TierPolicy) {
        self.counters[to_usize(flash_index)] = counter.min(counter_max(policy));
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
        let counter = &mut self.counters[to_usize(flash_index)];
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
        self.ghost.entry_count
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
        // One access buys a high-priority block two cleanings, others one.
        heat.flash_written(3, 0, high);
        heat.flash_written(4, 0, TierPolicy::default());
        heat.flash_accessed(3, high);
        heat.flash_accessed(4, TierPolicy::default());
        assert_eq!((heat.counter(3), heat.counter(4)), (2, 1));
        assert!(!heat.keep_on_flash(2, none));
        let pinned = policy(CachePriority::None, Pin::Flash);
        assert!(heat.keep_on_flash(7, pinned), "pinned blocks never leave");
        heat.flash_accessed(6, TierPolicy::default());
        assert!(!heat.keep_on_flash(6, policy(CachePriority::High, Pin::Capacity)));
    }

    #[test]
    fn a_scan_promotes_nothing_and_a_reread_promotes() {
        let normal = TierPolicy::default();
        // The ghost forgets per bucket of 8, so it keeps a whole pass only
        // when it is a few times longer.
        let mut heat = Heat::new(8000, 4000);
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
        let mut heat = Heat::new(1000, 100);
        for block in 0..1000 {
            heat.admit_from_capacity(block, normal);
        }
        assert_eq!(heat.ghost_entry_count(), 100);
        assert!(
            !heat.admit_from_capacity(0, normal),
            "forgotten: a first read again"
        );
        assert!(heat.admit_from_capacity(999, normal));
        // The ghost is at most as long as the flash.
        let mut heat = Heat::new(100, 1000);
        for block in 0..1000 {
            heat.admit_from_capacity(block, normal);
        }
        assert_eq!(heat.ghost_entry_count(), 100);
    }

    /// Fingerprints may collide, but so rarely that a long scan of blocks
    /// never read before promotes none of them.
    #[test]
    fn a_long_scan_through_a_full_ghost_promotes_nothing() {
        let normal = TierPolicy::default();
        let mut heat = Heat::new(1 << 17, 1 << 16);
        let promoted = (0..1_000_000u64)
            .filter(|block| heat.admit_from_capacity(block * 7 + 3, normal))
            .count();
        assert_eq!(promoted, 0);
        assert_eq!(heat.ghost_entry_count(), 1 << 16);
    }
}
