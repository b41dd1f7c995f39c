//! The memory cache's index: which slot holds a physical block, in a table
//! sized once for the shard's capacity, so that a lookup costs one memory
//! miss. A general hash map (hashbrown) keeps its control bytes apart from its
//! entries and pays two misses per lookup on a table of megabytes; here each
//! entry holds the block number and the slot together, 16 bytes, four to a
//! cache line, and probing is linear, so a lookup reads one line in the
//! common case (decision 0047).
//!
//! The table never grows: it has at least twice as many entries as the shard
//! has slots, so it is at most half full and probe runs stay short. Removal
//! shifts the rest of a run back (no tombstones), so a table that has seen
//! many evictions probes as fast as a fresh one. An entry's block number is
//! stored plus one, so that zero means empty and a new table is zeroed memory
//! the kernel gives lazily.

use memmap2::MmapMut;

/// Table entries per slot of the shard at least: the load factor stays at or
/// under one half.
const ENTRIES_PER_SLOT_MIN: usize = 2;

/// The fewest entries of a table (a power of two).
const TABLE_ENTRIES_MIN: usize = 16;

const _: () = assert!(TABLE_ENTRIES_MIN.is_power_of_two());
const _: () = assert!(ENTRIES_PER_SLOT_MIN >= 2, "probe runs stay short");

/// One entry: a block number plus one (zero when empty) and its slot.
#[derive(Clone, Copy, Default)]
struct Entry {
    block_plus_one: u64,
    slot: u32,
}

/// Bytes of an entry in the table: the block number plus one, the slot,
/// four bytes of padding; four entries to a cache line.
const ENTRY_BYTES: usize = 16;
const SLOT_AT: usize = 8;

const _: () = assert!(64 % ENTRY_BYTES == 0, "no entry straddles a cache line");

/// The entries, in one anonymous mapping advised for huge pages: the table
/// of a large cache is tens of megabytes probed at random, and with 4 KiB
/// pages each lookup would also walk the page tables (as the cache's blocks
/// would, decision 0046). A new mapping reads as zeros: every entry empty.
struct EntryTable {
    mapping: MmapMut,
}

impl EntryTable {
    fn new(entry_count: usize) -> Self {
        let length = entry_count * ENTRY_BYTES;
        let mapping = MmapMut::map_anon(length).unwrap_or_else(|error| {
            panic!("the memory cache's index could not reserve {length} bytes: {error}")
        });
        #[cfg(target_os = "linux")]
        // Advice only: without transparent huge pages the table works the same.
        let _ = mapping.advise(memmap2::Advice::HugePage);
        Self { mapping }
    }

    fn get(&self, index: usize) -> Entry {
        let bytes = &self.mapping[index * ENTRY_BYTES..(index + 1) * ENTRY_BYTES];
        Entry {
            block_plus_one: u64::from_ne_bytes(bytes[..SLOT_AT].try_into().expect("8 bytes")),
            slot: u32::from_ne_bytes(bytes[SLOT_AT..SLOT_AT + 4].try_into().expect("4 bytes")),
        }
    }

    fn set(&mut self, index: usize, entry: Entry) {
        let bytes = &mut self.mapping[index * ENTRY_BYTES..(index + 1) * ENTRY_BYTES];
        bytes[..SLOT_AT].copy_from_slice(&entry.block_plus_one.to_ne_bytes());
        bytes[SLOT_AT..SLOT_AT + 4].copy_from_slice(&entry.slot.to_ne_bytes());
    }
}

/// See the module documentation.
pub(super) struct CacheIndex {
    entries: EntryTable,
    /// The table's entry count minus one (the count is a power of two).
    mask: usize,
    /// Bits to shift a multiplied key right by to get its home entry.
    shift: u32,
    count: usize,
}

impl CacheIndex {
    /// An empty index for a shard of `slot_count` slots.
    pub(super) fn new(slot_count: usize) -> Self {
        assert!(
            u32::try_from(slot_count).is_ok(),
            "a shard's slots are numbered in 32 bits: {slot_count}"
        );
        let length = (slot_count * ENTRIES_PER_SLOT_MIN)
            .next_power_of_two()
            .max(TABLE_ENTRIES_MIN);
        Self {
            entries: EntryTable::new(length),
            mask: length - 1,
            shift: 64 - length.trailing_zeros(),
            count: 0,
        }
    }

    /// Where `block`'s probe starts: Fibonacci hashing, whose high bits mix
    /// every bit of the key (a shard's blocks share their low bits).
    fn home(&self, block: u64) -> usize {
        let mixed = block.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift;
        usize::try_from(mixed).expect("a table index fits in usize")
    }

    /// The entry holding `block`, or the empty entry where it would go.
    fn position(&self, block: u64) -> Result<usize, usize> {
        let key = block
            .checked_add(1)
            .expect("block numbers stop short of u64::MAX");
        let mut index = self.home(block);
        loop {
            let entry = self.entries.get(index);
            if entry.block_plus_one == key {
                return Ok(index);
            }
            if entry.block_plus_one == 0 {
                return Err(index);
            }
            index = (index + 1) & self.mask;
        }
    }

    pub(super) fn get(&self, block: u64) -> Option<usize> {
        let index = self.position(block).ok()?;
        Some(self.entries.get(index).slot as usize)
    }

    pub(super) fn contains(&self, block: u64) -> bool {
        self.position(block).is_ok()
    }

    pub(super) fn len(&self) -> usize {
        self.count
    }

    /// Records that `slot` holds `block` (replacing any slot it had).
    pub(super) fn insert(&mut self, block: u64, slot: usize) {
        let entry = Entry {
            block_plus_one: block + 1,
            slot: u32::try_from(slot).expect("slots are numbered in 32 bits"),
        };
        match self.position(block) {
            Ok(index) => self.entries.set(index, entry),
            Err(index) => {
                assert!(
                    self.count < (self.mask + 1) / ENTRIES_PER_SLOT_MIN,
                    "the index holds at most one entry per slot"
                );
                self.entries.set(index, entry);
                self.count += 1;
            }
        }
    }

    /// Forgets `block`; returns the slot it had.
    pub(super) fn remove(&mut self, block: u64) -> Option<usize> {
        let mut hole = self.position(block).ok()?;
        let slot = self.entries.get(hole).slot as usize;
        self.count -= 1;
        // Backward shift: an entry later in the run moves into the hole
        // unless its home lies after the hole (cyclically), where a lookup
        // starting at its home would no longer pass the hole.
        let mut next = hole;
        loop {
            next = (next + 1) & self.mask;
            let entry = self.entries.get(next);
            if entry.block_plus_one == 0 {
                break;
            }
            let home = self.home(entry.block_plus_one - 1);
            let distance_from_home = next.wrapping_sub(home) & self.mask;
            let distance_from_hole = next.wrapping_sub(hole) & self.mask;
            if distance_from_home >= distance_from_hole {
                self.entries.set(hole, entry);
                hole = next;
            }
        }
        self.entries.set(hole, Entry::default());
        Some(slot)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    #[test]
    fn agrees_with_a_hash_map_through_inserts_and_removals() {
        for (slot_count, key_range) in [(8_usize, 20_u64), (100, 300), (1000, 1 << 40)] {
            let mut index = CacheIndex::new(slot_count);
            let mut model: HashMap<u64, usize> = HashMap::new();
            // Seeded, so that a failure reproduces.
            let mut random = SmallRng::seed_from_u64(slot_count as u64);
            for step in 0..20_000 {
                let block = random.random_range(0..key_range);
                if random.random_ratio(1, 3) || model.len() == slot_count {
                    assert_eq!(index.remove(block), model.remove(&block), "step {step}");
                } else {
                    let slot = random.random_range(0..slot_count);
                    index.insert(block, slot);
                    model.insert(block, slot);
                }
                assert_eq!(index.len(), model.len());
                let probe = random.random_range(0..key_range);
                assert_eq!(index.get(probe), model.get(&probe).copied(), "step {step}");
            }
            for (block, slot) in &model {
                assert_eq!(index.get(*block), Some(*slot));
            }
        }
    }

    #[test]
    fn a_full_index_of_colliding_runs_still_finds_every_block() {
        // Multiples of the table length share their low bits; the hash must
        // still spread them, and removals in the middle of runs must keep
        // the rest reachable.
        let mut index = CacheIndex::new(64);
        let blocks: Vec<u64> = (0..64).map(|multiple| multiple * 1024).collect();
        for (slot, block) in blocks.iter().enumerate() {
            index.insert(*block, slot);
        }
        for (slot, block) in blocks.iter().enumerate().step_by(2) {
            assert_eq!(index.remove(*block), Some(slot));
        }
        for (slot, block) in blocks.iter().enumerate() {
            let expected = (slot % 2 == 1).then_some(slot);
            assert_eq!(index.get(*block), expected, "block {block}");
        }
        assert_eq!(index.len(), 32);
    }
}
