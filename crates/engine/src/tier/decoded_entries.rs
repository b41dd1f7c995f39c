//! Which slots of a memory-cache shard hold a compressed block *decoded*
//! (issue 44, goal 3; decision 0075). The cache holds the device blocks
//! fragments are packed in, so a hit on a compressed block costs a decode
//! (about 1.8 µs with lz4 on this project's machines). A fragment read again
//! from the cache is kept decoded as well, in a slot of the same shard under
//! a key no device block has ([`decoded_key`]), so that its next hits cost a
//! copy and a checksum, as an uncompressed hit does. ZFS does the same above
//! its compressed ARC (the dbuf cache, a small share of the ARC).
//!
//! Decoded blocks are copies of data the packed blocks also hold, so they
//! may take at most [`DECODED_PERCENT_MAX`] of a shard's slots: past that
//! share a new one replaces the oldest decoded block (found by a hand of its
//! own) rather than the CLOCK's victim, and a working set that fits the
//! cache only compressed keeps fitting. Room that nothing holds is taken
//! without limit, as written blocks take it: a cache that is not full has
//! nothing to protect.
//!
//! Only a fragment decoded from the cache twice within a short while is
//! kept: a filter of the fragments decoded lately, one entry per slot of
//! the share (a new fragment takes the entry of any it hashes onto), says
//! whether this is the second time. Keeping every fragment decoded from a
//! hit cost about 1–2 µs of CPU per read under uniform random reads, where
//! nearly no decoded copy is read again before it is replaced.
//!
//! A decoded slot remembers the fragment's checksum (the map's, over its
//! units) and the decoded block's, so that a hit is taken only for the
//! fragment the map names now and is checked after the copy, like every
//! other cache hit. Range invalidations find the decoded blocks of a
//! segment by their first device block ([`DecodedEntries::keys_in`]).

use std::collections::BTreeSet;

use crate::log::location::Location;

/// The share of a shard's slots, in per cent, that decoded copies of
/// compressed blocks may take.
pub const DECODED_PERCENT_MAX: u64 = 10;

const _: () = assert!(DECODED_PERCENT_MAX <= 100);

/// Set in the key of a decoded block: device blocks stay below 2^40
/// (`Location`) and locations below 2^56, so no device block's key has it.
const DECODED_KEY_TAG: u64 = 1 << 63;

/// The bits of a decoded key that hold its location (`Location` leaves
/// bits 56..64 zero); the rest is the tag alone, which tells a decoded key
/// from the cache's empty-slot marker (every bit set).
const LOCATION_MASK: u64 = (1 << 56) - 1;

/// The cache key of `location`'s decoded block. Its low bits are the
/// fragment's first device block, so it lives in that block's shard.
pub fn decoded_key(location: Location) -> u64 {
    assert!(location.is_fragment(), "{location} is not a fragment");
    DECODED_KEY_TAG | location.raw()
}

/// Whether a cache key is a decoded block's rather than a device block's
/// (or the mark of an empty slot).
pub fn is_decoded_key(key: u64) -> bool {
    key & !LOCATION_MASK == DECODED_KEY_TAG
}

/// What a decoded slot must match to be served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodedChecksums {
    /// The fragment's checksum, over its units, as the map holds it.
    pub fragment: u32,
    /// The decoded 4 KiB block's crc32c, checked after each copy out.
    pub block: u32,
}

/// The decoded slots of one shard (see the module documentation). Which
/// slots hold decoded blocks is told by their keys ([`is_decoded_key`]).
pub struct DecodedEntries {
    /// Each decoded slot's checksums (default for other slots).
    checksums: Vec<DecodedChecksums>,
    /// Decoded keys by first device block, for range invalidation.
    by_block: BTreeSet<(u64, u64)>,
    /// The most slots decoded blocks may take.
    decoded_blocks_max: usize,
    /// Where the search for the decoded block to replace resumes.
    hand: usize,
    /// The fragments decoded lately, by a hash of their key (0: none).
    recently_decoded: Vec<u64>,
}

/// The fewest entries of the filter of fragments decoded lately.
const RECENTLY_DECODED_ENTRIES_MIN: usize = 64;

impl DecodedEntries {
    pub fn new(capacity_blocks: usize) -> Self {
        let decoded_blocks_max =
            usize::try_from(capacity_blocks as u64 * DECODED_PERCENT_MAX / 100)
                .expect("a share of a shard's slots fits in usize");
        Self {
            checksums: Vec::new(),
            by_block: BTreeSet::new(),
            decoded_blocks_max,
            hand: 0,
            recently_decoded: vec![0; decoded_blocks_max.max(RECENTLY_DECODED_ENTRIES_MIN)],
        }
    }

    /// Whether `key`'s fragment was decoded from the cache lately (then it
    /// is to be kept decoded); else it is remembered as decoded now.
    pub fn decoded_again(&mut self, key: u64) -> bool {
        let mixed = key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
        let index = usize::try_from(mixed % self.recently_decoded.len() as u64)
            .expect("an index below a vector's length");
        if self.recently_decoded[index] == key {
            self.recently_decoded[index] = 0;
            return true;
        }
        self.recently_decoded[index] = key;
        false
    }

    /// A new slot was added to the shard.
    pub fn push_slot(&mut self) {
        self.checksums.push(DecodedChecksums::default());
    }

    pub fn count(&self) -> usize {
        self.by_block.len()
    }

    /// Whether another decoded block may take a slot from other blocks.
    pub fn has_share_left(&self) -> bool {
        self.count() < self.decoded_blocks_max
    }

    /// The checksums of slot `index`, which holds the decoded block of `key`.
    pub fn checksums(&self, index: usize, key: u64) -> DecodedChecksums {
        assert!(is_decoded_key(key), "slot {index} holds no decoded block");
        self.checksums[index]
    }

    /// Records that slot `index` holds the decoded block of `key` now.
    pub fn occupy(&mut self, index: usize, key: u64, checksums: DecodedChecksums) {
        assert!(is_decoded_key(key));
        self.checksums[index] = checksums;
        assert!(
            self.by_block.insert((first_block_of(key), key)),
            "a decoded key takes one slot"
        );
    }

    /// Slot `index`, which held `key`, holds it no more (evicted, replaced
    /// or forgotten); nothing to do for a slot that held no decoded block.
    pub fn vacate(&mut self, index: usize, key: u64) {
        if !is_decoded_key(key) {
            return;
        }
        self.checksums[index] = DecodedChecksums::default();
        assert!(
            self.by_block.remove(&(first_block_of(key), key)),
            "a decoded slot's key is listed"
        );
    }

    /// The next decoded slot from the hand on, given every slot's key: the
    /// oldest decoded block, in about the order they came. At least one slot
    /// is decoded.
    pub fn next_victim(&mut self, keys: &[u64]) -> usize {
        assert!(self.count() > 0, "a decoded block to replace");
        loop {
            let hand = self.hand;
            self.hand = (hand + 1) % keys.len();
            if is_decoded_key(keys[hand]) {
                return hand;
            }
        }
    }

    /// The keys of decoded blocks whose fragment starts in
    /// `first_block..end_block`.
    pub fn keys_in(&self, first_block: u64, end_block: u64) -> Vec<u64> {
        self.by_block
            .range((first_block, 0)..(end_block, 0))
            .map(|&(_, key)| key)
            .collect()
    }
}

/// The first device block of a decoded key's fragment.
fn first_block_of(key: u64) -> u64 {
    Location::from_raw(key & !DECODED_KEY_TAG)
        .expect("a decoded key holds a location")
        .block()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_apart_from_blocks_and_found_by_their_first_block() {
        let location = Location::fragment(77, 200, 100);
        let key = decoded_key(location);
        assert!(is_decoded_key(key) && !is_decoded_key(77) && !is_decoded_key(u64::MAX));
        assert_eq!(key % 16, 77 % 16, "the first block's shard");
        let mut entries = DecodedEntries::new(100);
        entries.push_slot();
        entries.push_slot();
        let checksums = DecodedChecksums {
            fragment: 1,
            block: 2,
        };
        assert!(!entries.decoded_again(key) && entries.decoded_again(key));
        assert!(!entries.decoded_again(key), "remembered once");
        entries.occupy(1, key, checksums);
        assert_eq!(entries.keys_in(77, 78), vec![key]);
        assert!(entries.keys_in(78, 200).is_empty() && entries.keys_in(0, 77).is_empty());
        assert_eq!(entries.checksums(1, key), checksums);
        assert_eq!(entries.next_victim(&[5, key]), 1);
        entries.vacate(1, key);
        entries.vacate(0, 5);
        assert_eq!(entries.count(), 0);
    }
}
