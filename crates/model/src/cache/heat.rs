//! The engine's own flash placement as a cache policy: the log FIFO of a
//! two-tier pool, every decision taken by the engine's `tier::heat::Heat`.

use std::collections::HashMap;

use lamina_engine::tier::heat::Heat;
use lamina_engine::{Pin, TierPolicy};

use super::policy::CachePolicy;
use crate::convert::to_usize;

/// "No key": a free or dead flash slot of [`HeatPolicy`].
const NO_KEY: u64 = u64::MAX;

/// The engine's own placement, simulated: flash is the log of a two-tier pool
/// and every decision is taken by the real [`Heat`] the engine uses
/// (`tier::heat`), so that what is measured here is what the pool does.
///
/// Flash is a ring of `capacity_entries` slots (4 KiB blocks) in segments of
/// `segment_slots`, written at the head and cleaned at the tail: the log order
/// is the FIFO. A key resident in a slot is a block on flash; any other key is
/// on capacity. A request of a resident key is a hit and a
/// [`Heat::flash_accessed`]; a request of any other key asks
/// [`Heat::admit_from_capacity`] (the key is its capacity address), and an
/// admitted key is appended at the head with counter 0, as the engine's
/// promotion does. After every append, while fewer than `free_percent` of the
/// segments are free (the demoter's target, `tier_flash_free_percent`), the
/// oldest segment is cleaned: each live slot asks [`Heat::keep_on_flash`]; kept
/// keys are appended at the head with the counter heat left them
/// ([`Heat::flash_written`], as a relocation) and the others are demoted, that is
/// evicted. So at most `100 - free_percent`% of the slots hold data, as in the
/// engine, and a policy compared with this one at the same `capacity_entries`
/// is given the whole flash.
///
/// Simplifications, each noted because it could flatter or hurt the figure:
/// the trace is reads only (no client writes land on flash, so no slot dies
/// except by [`CachePolicy::remove`]); there is no memory cache in front of
/// flash; the demoter runs after every append rather than every
/// `tier_demotion_interval_ms`; capacity addresses are stable (no capacity
/// cleaning, and a demoted key returns to the address it had, where the engine
/// would give it a new one: the ghost keeps no entry for a promoted key either
/// way); one volume, unpinned, of one priority.
pub struct HeatPolicy {
    heat: Heat,
    tier_policy: TierPolicy,
    capacity_entries: usize,
    segment_slots: usize,
    /// Free slots the cleaner restores after each append.
    free_target_slots: usize,
    /// The key in each slot, [`NO_KEY`] for a free or dead one.
    slots: Vec<u64>,
    slot_of: HashMap<u64, u32>,
    /// Log positions (slot = position modulo the slot count): the oldest
    /// occupied one, and the next to write.
    tail_position: u64,
    head_position: u64,
    /// Scratch for a cleaned segment's kept keys with their counters.
    kept: Vec<(u64, u8)>,
    promoted_count: u64,
    relocated_count: u64,
}

impl HeatPolicy {
    /// Segments per flash in [`HeatPolicy::new`]: enough that the free target
    /// is several segments and a segment is a small share of flash, as in a
    /// pool (where one 4 MiB segment is well under 1% of flash).
    pub const SEGMENT_COUNT: usize = 100;
    /// The engine's default `tier_flash_free_percent`.
    pub const FREE_PERCENT: usize = 10;
    /// The engine's default `tier_ghost_entries_max`.
    pub const GHOST_ENTRIES_MAX: usize = 1 << 24;
    /// The counter a promoted block starts with (`pool::state::append_relocation`).
    pub const PROMOTED_COUNTER: u8 = 0;

    /// A flash of `capacity_entries` slots in [`Self::SEGMENT_COUNT`] segments
    /// (fewer, of one slot, when it is smaller), the engine's default free
    /// target and ghost limit, and a normal-priority volume.
    pub fn new(capacity_entries: usize) -> Self {
        Self::with_layout(
            capacity_entries,
            (capacity_entries / Self::SEGMENT_COUNT).max(1),
            Self::FREE_PERCENT,
            Self::GHOST_ENTRIES_MAX,
            TierPolicy::default(),
        )
    }

    /// A flash of `capacity_entries` slots (rounded down to whole segments of
    /// `segment_slots`) of which the cleaner keeps `free_percent` free, a ghost
    /// limit and the volume's policy (unpinned).
    pub fn with_layout(
        capacity_entries: usize,
        segment_slots: usize,
        free_percent: usize,
        ghost_entries_max: usize,
        tier_policy: TierPolicy,
    ) -> Self {
        assert!(segment_slots > 0, "a segment holds at least one slot");
        assert!(free_percent < 100, "some of flash must hold data");
        assert_eq!(
            tier_policy.pin,
            Pin::Auto,
            "pinned volumes are not simulated (a full pinned flash never frees)"
        );
        let segment_count = capacity_entries / segment_slots;
        assert!(segment_count > 0, "flash needs room for one segment");
        let slot_count = segment_count * segment_slots;
        assert!(
            u32::try_from(slot_count).is_ok(),
            "slots are indexed in 32 bits: {slot_count} is too many"
        );
        Self {
            heat: Heat::new(slot_count as u64, ghost_entries_max),
            tier_policy,
            capacity_entries: slot_count,
            segment_slots,
            free_target_slots: segment_count * free_percent / 100 * segment_slots,
            slots: vec![NO_KEY; slot_count],
            slot_of: HashMap::with_capacity(slot_count),
            tail_position: 0,
            head_position: 0,
            kept: Vec::with_capacity(segment_slots),
            promoted_count: 0,
            relocated_count: 0,
        }
    }

    /// Keys promoted from capacity so far (flash writes of promotions).
    pub fn promoted_count(&self) -> u64 {
        self.promoted_count
    }

    /// Keys the cleaner kept and rewrote within flash so far (flash writes
    /// that a cache outside the log would not make).
    pub fn relocated_count(&self) -> u64 {
        self.relocated_count
    }

    /// The engine's heat, for inspection.
    pub fn heat(&self) -> &Heat {
        &self.heat
    }

    fn free_slots(&self) -> usize {
        self.slots.len() - to_usize(self.head_position - self.tail_position)
    }

    /// Writes `key` at the head of the log with `counter`; a slot must be free.
    fn append(&mut self, key: u64, counter: u8) {
        assert!(self.free_slots() > 0, "append to a full flash");
        let slot = to_usize(self.head_position % self.slots.len() as u64);
        self.head_position += 1;
        self.slots[slot] = key;
        self.slot_of.insert(
            key,
            u32::try_from(slot).expect("with_layout checks slots fit in 32 bits"),
        );
        self.heat
            .flash_written(slot as u64, counter, self.tier_policy);
    }

    /// Cleans the oldest segment: heat keeps some of its live keys (rewritten
    /// at the head) and the others are demoted into `evicted`.
    fn clean_oldest_segment(&mut self, evicted: &mut Vec<u64>) {
        assert!(
            self.head_position - self.tail_position >= self.segment_slots as u64,
            "only whole written segments are cleaned"
        );
        self.kept.clear();
        for position in self.tail_position..self.tail_position + self.segment_slots as u64 {
            let slot = to_usize(position % self.slots.len() as u64);
            let key = std::mem::replace(&mut self.slots[slot], NO_KEY);
            if key == NO_KEY {
                continue;
            }
            self.slot_of.remove(&key);
            if self.heat.keep_on_flash(slot as u64, self.tier_policy) {
                self.kept.push((key, self.heat.counter(slot as u64)));
            } else {
                evicted.push(key);
            }
        }
        self.tail_position += self.segment_slots as u64;
        let mut kept = std::mem::take(&mut self.kept);
        self.relocated_count += kept.len() as u64;
        for (key, counter) in kept.drain(..) {
            self.append(key, counter);
        }
        self.kept = kept;
    }
}

impl CachePolicy for HeatPolicy {
    fn name(&self) -> &'static str {
        "heat"
    }

    fn capacity_entries(&self) -> usize {
        self.capacity_entries
    }

    fn len(&self) -> usize {
        self.slot_of.len()
    }

    fn contains(&self, key: u64) -> bool {
        self.slot_of.contains_key(&key)
    }

    fn access(&mut self, key: u64) -> bool {
        match self.slot_of.get(&key) {
            Some(slot) => {
                self.heat.flash_accessed(u64::from(*slot), self.tier_policy);
                true
            }
            None => false,
        }
    }

    fn insert(&mut self, key: u64, evicted: &mut Vec<u64>) -> bool {
        assert!(!self.contains(key), "key {key} inserted while resident");
        if !self.heat.admit_from_capacity(key, self.tier_policy) {
            return false;
        }
        // Writers find a free slot: the demoter keeps some, and a blocked
        // writer cleans (each cleaning frees at least what it does not keep,
        // and kept counters fall, so this ends).
        while self.free_slots() == 0 {
            self.clean_oldest_segment(evicted);
        }
        self.append(key, Self::PROMOTED_COUNTER);
        self.promoted_count += 1;
        while self.free_slots() < self.free_target_slots {
            self.clean_oldest_segment(evicted);
        }
        true
    }

    fn remove(&mut self, key: u64) -> bool {
        // The slot stays written and dead until its segment is cleaned, as a
        // freed block's does.
        match self.slot_of.remove(&key) {
            Some(slot) => {
                self.slots[slot as usize] = NO_KEY;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    /// The engine's policy on a small flash of 10 segments of 10 slots: a key
    /// is promoted on its second read, the cleaner keeps keys read on flash
    /// and demotes the others, and a tenth of the flash stays free.
    #[test]
    fn heat_policy_promotes_rereads_and_the_cleaner_keeps_what_is_read() {
        let mut policy = HeatPolicy::with_layout(100, 10, 10, 1000, TierPolicy::default());
        let mut evicted = Vec::new();
        let read = |policy: &mut HeatPolicy, key: u64, evicted: &mut Vec<u64>| {
            let hit = policy.access(key);
            if !hit {
                policy.insert(key, evicted);
            }
            assert!(policy.len() <= 90, "the free target holds");
            hit
        };
        for key in 0..90 {
            assert!(!read(&mut policy, key, &mut evicted));
            assert!(!policy.contains(key), "a first read promotes nothing");
            assert!(!read(&mut policy, key, &mut evicted));
            assert!(policy.contains(key), "a second read promotes");
        }
        assert!(evicted.is_empty(), "90 slots fit beside the free tenth");
        // Keys 0..10 are read on flash between promotions of new keys, which
        // make the cleaner go round the flash many times.
        for round in 0..30u64 {
            for key in 0..10 {
                assert!(read(&mut policy, key, &mut evicted), "hot key {key} left");
            }
            for key in 1000 + 10 * round..1010 + 10 * round {
                read(&mut policy, key, &mut evicted);
                read(&mut policy, key, &mut evicted);
            }
        }
        assert!((0..10).all(|key| policy.contains(key)));
        assert!(
            (10..90).all(|key| !policy.contains(key) && evicted.contains(&key)),
            "keys never read on flash were demoted"
        );
        assert!(policy.promoted_count() == 90 + 300);
        assert!(policy.relocated_count() > 0);
    }

    /// A loop over a working set that fits in flash (85% of it, beside the
    /// free tenth) ends up all on flash within a few passes, though the loop
    /// is almost as long as the ghost.
    #[test]
    fn heat_policy_promotes_a_looping_working_set_that_fits() {
        let mut policy = HeatPolicy::new(1000);
        let mut evicted = Vec::new();
        for _pass in 0..4 {
            for key in 0..850u64 {
                if !policy.access(key) {
                    policy.insert(key, &mut evicted);
                }
            }
        }
        assert_eq!(policy.len(), 850);
        assert!((0..850u64).all(|key| policy.access(key)));
        assert!(evicted.is_empty());
    }
}
