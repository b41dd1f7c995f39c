//! A memory cache of device blocks, the top of the memory → flash → capacity
//! hierarchy. It is keyed by *physical* block: in a log-structured store a
//! physical block's contents never change while it is mapped, so the cache needs
//! no invalidation on overwrite, only when a block dies or a segment is freed
//! for reuse.
//!
//! Eviction is CLOCK (second chance): a hit sets a reference bit, the hand clears
//! bits and evicts the first unreferenced slot. Readers still verify every block
//! they take from the cache against the checksum in the map, as for device reads.
//!
//! The cache is split into shards by physical block (each its own mutex,
//! slots and hand), so that connections reading and writing different blocks
//! do not queue on one lock (decision 0028); a cache too small to split has
//! one shard. Hits and misses are counted outside the locks.
//!
//! A block read from the device is inserted with the shard's *generation*
//! taken when the read was planned (under the pool's state mutex, under which
//! blocks die and segments are freed): every invalidation moves its shards'
//! generations on, so a read that raced with its block's death inserts
//! nothing, and a dead block's stale copy never takes a slot.
//!
//! Blocks just written enter the cache too (decision 0067): recently written
//! data is the likeliest to be read soon, and the warm-restart record then
//! holds it. They enter as a read miss does (unreferenced: a block not read
//! within one lap of the hand leaves), but written blocks not read since may
//! take at most [`WRITTEN_UNREAD_PERCENT_MAX`] of a shard's slots by
//! displacing blocks that were read: past that share a written block takes
//! the slot of an older written-and-unread one, found by a second hand. So a
//! sequential fill of any length, with no reads meanwhile, evicts at most that
//! share of the blocks clients had read; a written block read once is an
//! ordinary cached block from then on. Room that nothing holds is taken
//! without limit: a cache that is not full has nothing to protect.
//!
//! Compressed blocks are cached as the device blocks their fragments are
//! packed in; a fragment read again from the cache is also kept decoded, in
//! a slot under a key of its own, within a share of the shard
//! (`decoded_entries`, decision 0075).
//!
//! For a warm restart (`pool::cache_warmup`) the cache lists what it holds,
//! hottest first, and takes blocks loaded in the background only into room it
//! has: a warm-up never evicts what clients brought in since the start.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::MmapMut;

use super::cache_index::CacheIndex;
use super::decoded_entries::{DecodedChecksums, DecodedEntries, decoded_key, is_decoded_key};
use crate::convert::to_usize;
use crate::log::location::Location;
use crate::{BLOCK_BYTES, BLOCK_SIZE_BYTES};

const BLOCK: usize = BLOCK_BYTES;

/// Shards of a cache large enough to split (a power of two: the shard of a
/// block is its low bits, so a segment's blocks spread over all of them).
const SHARD_COUNT_MAX: usize = 16;

/// The fewest blocks a shard holds: a smaller cache has fewer shards, so that
/// CLOCK's choice of victim stays cache-wide for small caches (and tests).
const SHARD_BLOCKS_MIN: usize = 1024;

/// The block number of a slot that holds nothing.
const EMPTY_SLOT: u64 = u64::MAX;

/// The share of a shard's slots, in per cent, that blocks written and not
/// read since may take by displacing blocks clients read: what a sequential
/// fill can flush of a hot read set at most (decision 0067, measured with
/// `cargo run --release -p lamina-engine --example memory_cache_writes`).
pub const WRITTEN_UNREAD_PERCENT_MAX: u64 = 50;

const _: () = assert!(WRITTEN_UNREAD_PERCENT_MAX <= 100);

/// A shard's block contents: one anonymous mapping of its whole capacity,
/// slot `i` at `i * 4096`. The kernel gives it memory only as slots are
/// first filled, and it is advised for transparent huge pages: a cache hit
/// lands on a random block of gigabytes, and with 4 KiB pages nearly every
/// hit also missed the processor's translation cache and walked the page
/// tables (decision 0046).
struct BlockArena {
    mapping: MmapMut,
}

impl BlockArena {
    fn new(capacity_blocks: usize) -> Self {
        // A zero-length mapping is refused; a shard of no blocks keeps one.
        let length = capacity_blocks.max(1) * BLOCK;
        let mapping = MmapMut::map_anon(length).unwrap_or_else(|error| {
            panic!("the memory cache could not reserve {length} bytes of address space: {error}")
        });
        #[cfg(target_os = "linux")]
        // Advice only: without transparent huge pages the arena works the same.
        let _ = mapping.advise(memmap2::Advice::HugePage);
        Self { mapping }
    }

    fn block(&self, slot: usize) -> &[u8] {
        &self.mapping[slot * BLOCK..(slot + 1) * BLOCK]
    }

    fn block_mut(&mut self, slot: usize) -> &mut [u8] {
        &mut self.mapping[slot * BLOCK..(slot + 1) * BLOCK]
    }
}

/// One shard's blocks and its CLOCK.
struct Shard {
    /// The slot of each cached block.
    index_of: CacheIndex,
    /// The block each slot in use holds (`EMPTY_SLOT` once invalidated).
    blocks: Vec<u64>,
    /// CLOCK's reference bits, one per slot, kept apart from `blocks` so that
    /// a hit writes to a small array that stays in the processor's caches.
    referenced: Vec<bool>,
    /// Whether each slot's block was written and has not been read since it
    /// entered the cache (see the module documentation).
    written_unread: Vec<bool>,
    /// Slots whose `written_unread` is set.
    written_unread_count: usize,
    /// The most slots written-and-unread blocks may take by evicting others.
    written_unread_blocks_max: usize,
    data: BlockArena,
    hand: usize,
    /// The second hand: where the search for the written-and-unread block to
    /// replace resumes, so that they are replaced in about the order they came.
    written_hand: usize,
    /// Slots emptied by invalidation.
    free_slots: Vec<usize>,
    capacity_blocks: usize,
    /// Which slots hold compressed blocks decoded (decision 0075).
    decoded: DecodedEntries,
}

/// A shard behind its lock, with its invalidation count.
struct LockedShard {
    shard: Mutex<Shard>,
    /// Invalidations so far; moved on under `shard`'s lock, read without it.
    generation: AtomicU64,
}

/// What a cache shard had seen when a device read was planned: a block read
/// then is inserted only if its shard has seen no invalidation since.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct CacheGeneration(u64);

/// See the module documentation.
pub struct MemoryCache {
    capacity_blocks: usize,
    written_unread_percent_max: u64,
    shards: Vec<LockedShard>,
    hits: AtomicU64,
    misses: AtomicU64,
    decoded_hits: AtomicU64,
}

/// Hit and miss counts, for statistics.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct CacheStatistics {
    pub capacity_bytes: u64,
    /// Bytes of the slots in use, decoded copies of compressed blocks included.
    pub cached_bytes: u64,
    /// Lookups of device blocks that found them, and that did not.
    pub hits: u64,
    pub misses: u64,
    /// Bytes of the slots holding compressed blocks decoded.
    pub decoded_bytes: u64,
    /// Reads of a compressed block served decoded, without a decode.
    pub decoded_hits: u64,
}

impl Shard {
    fn new(capacity_blocks: usize, written_unread_percent_max: u64) -> Self {
        let written_unread_blocks_max =
            to_usize(capacity_blocks as u64 * written_unread_percent_max / 100);
        Self {
            index_of: CacheIndex::new(capacity_blocks),
            blocks: Vec::new(),
            referenced: Vec::new(),
            written_unread: Vec::new(),
            written_unread_count: 0,
            written_unread_blocks_max,
            data: BlockArena::new(capacity_blocks),
            hand: 0,
            written_hand: 0,
            free_slots: Vec::new(),
            capacity_blocks,
            decoded: DecodedEntries::new(capacity_blocks),
        }
    }

    fn has_room_for(&self, physical_block: u64) -> bool {
        self.index_of.contains(physical_block)
            || !self.free_slots.is_empty()
            || self.blocks.len() < self.capacity_blocks
    }

    /// A slot that holds nothing: a free one or a new one.
    fn empty_slot(&mut self) -> Option<usize> {
        if let Some(index) = self.free_slots.pop() {
            return Some(index);
        }
        if self.blocks.len() < self.capacity_blocks {
            self.blocks.push(EMPTY_SLOT);
            self.referenced.push(false);
            self.written_unread.push(false);
            self.decoded.push_slot();
            return Some(self.blocks.len() - 1);
        }
        None
    }

    /// The slot a block read from the device goes to: its own, an empty one,
    /// or the CLOCK's victim.
    fn slot_for_read(&mut self, physical_block: u64) -> usize {
        if let Some(index) = self.index_of.get(physical_block) {
            return index;
        }
        match self.empty_slot() {
            Some(index) => index,
            None => self.victim(),
        }
    }

    /// The slot a block just written goes to: its own, an empty one, the
    /// CLOCK's victim while written-and-unread blocks are under their share,
    /// else the oldest written-and-unread block's; `None` when that share is
    /// nothing and the shard is full.
    fn slot_for_written(&mut self, physical_block: u64) -> Option<usize> {
        if let Some(index) = self.index_of.get(physical_block) {
            return Some(index);
        }
        if let Some(index) = self.empty_slot() {
            return Some(index);
        }
        if self.written_unread_count < self.written_unread_blocks_max {
            return Some(self.victim());
        }
        (self.written_unread_count > 0).then(|| self.written_victim())
    }

    /// Records that `index` holds `physical_block` now, unreferenced.
    fn occupy(&mut self, index: usize, physical_block: u64, written: bool) {
        if self.written_unread[index] {
            self.written_unread_count -= 1;
        }
        self.decoded.vacate(index, self.blocks[index]);
        self.blocks[index] = physical_block;
        self.referenced[index] = false;
        self.written_unread[index] = written;
        if written {
            self.written_unread_count += 1;
        }
        self.index_of.insert(physical_block, index);
    }

    /// Advances the hand to the first unreferenced slot (clearing the bits it
    /// passes) and forgets that slot's block.
    fn victim(&mut self) -> usize {
        loop {
            let hand = self.hand;
            self.hand = (hand + 1) % self.blocks.len();
            if self.referenced[hand] {
                self.referenced[hand] = false;
                continue;
            }
            let evicted = self.blocks[hand];
            self.index_of.remove(evicted);
            return hand;
        }
    }

    /// Advances the second hand to the next written-and-unread slot and
    /// forgets its block. At least one slot is written and unread.
    fn written_victim(&mut self) -> usize {
        assert!(self.written_unread_count > 0, "a written block to replace");
        loop {
            let hand = self.written_hand;
            self.written_hand = (hand + 1) % self.blocks.len();
            if self.written_unread[hand] {
                let evicted = self.blocks[hand];
                self.index_of.remove(evicted);
                return hand;
            }
        }
    }

    /// Marks a slot read: referenced, and no longer written-and-unread.
    fn mark_read(&mut self, index: usize) {
        self.referenced[index] = true;
        if self.written_unread[index] {
            self.written_unread[index] = false;
            self.written_unread_count -= 1;
        }
    }

    fn insert_read(&mut self, physical_block: u64, contents: &[u8]) {
        let index = self.slot_for_read(physical_block);
        self.occupy(index, physical_block, false);
        self.data.block_mut(index).copy_from_slice(contents);
    }

    fn insert_written(&mut self, physical_block: u64, contents: &[u8]) {
        if let Some(index) = self.slot_for_written(physical_block) {
            self.occupy(index, physical_block, true);
            self.data.block_mut(index).copy_from_slice(contents);
        }
    }

    /// The slot a decoded block goes to: its own, an empty one, the CLOCK's
    /// victim while decoded blocks are under their share, else the oldest
    /// decoded block's; `None` when that share is nothing and the shard is
    /// full.
    fn slot_for_decoded(&mut self, key: u64) -> Option<usize> {
        if let Some(index) = self.index_of.get(key) {
            return Some(index);
        }
        if let Some(index) = self.empty_slot() {
            return Some(index);
        }
        if self.decoded.has_share_left() {
            return Some(self.victim());
        }
        (self.decoded.count() > 0).then(|| {
            let index = self.decoded.next_victim(&self.blocks);
            self.index_of.remove(self.blocks[index]);
            index
        })
    }

    /// Caches `key`'s decoded block, referenced: it enters on its second read.
    fn insert_decoded(&mut self, key: u64, contents: &[u8], checksums: DecodedChecksums) {
        if let Some(index) = self.slot_for_decoded(key) {
            self.occupy(index, key, false);
            self.decoded.occupy(index, key, checksums);
            self.referenced[index] = true;
            self.data.block_mut(index).copy_from_slice(contents);
        }
    }

    /// Copies `key`'s decoded block into `destination` if cached for the
    /// fragment whose checksum is `fragment_checksum`; returns the block's
    /// checksum to check the copy against.
    fn get_decoded(
        &mut self,
        key: u64,
        fragment_checksum: u32,
        destination: &mut [u8],
    ) -> Option<u32> {
        let index = self.index_of.get(key)?;
        let checksums = self.decoded.checksums(index, key);
        if checksums.fragment != fragment_checksum {
            return None;
        }
        self.mark_read(index);
        destination.copy_from_slice(self.data.block(index));
        Some(checksums.block)
    }

    /// Forgets the decoded blocks of fragments starting in
    /// `first_block..end_block`.
    fn forget_decoded_in(&mut self, first_block: u64, end_block: u64) {
        for key in self.decoded.keys_in(first_block, end_block) {
            self.forget(key);
        }
    }

    /// Forgets `physical_block` if cached; its slot goes on the free list,
    /// reused before anything is evicted.
    fn forget(&mut self, physical_block: u64) {
        if let Some(index) = self.index_of.remove(physical_block) {
            if self.written_unread[index] {
                self.written_unread[index] = false;
                self.written_unread_count -= 1;
            }
            self.decoded.vacate(index, physical_block);
            self.blocks[index] = EMPTY_SLOT;
            self.referenced[index] = false;
            self.free_slots.push(index);
        }
    }
}

impl MemoryCache {
    pub fn new(capacity_bytes: u64) -> Self {
        Self::with_written_unread_percent_max(capacity_bytes, WRITTEN_UNREAD_PERCENT_MAX)
    }

    /// A cache whose written-and-unread blocks may take
    /// `written_unread_percent_max` of it by evicting others (the default is
    /// [`WRITTEN_UNREAD_PERCENT_MAX`]; other shares are for measuring).
    pub fn with_written_unread_percent_max(
        capacity_bytes: u64,
        written_unread_percent_max: u64,
    ) -> Self {
        assert!(
            written_unread_percent_max <= 100,
            "a share of the cache: {written_unread_percent_max}%"
        );
        let capacity_blocks = usize::try_from(capacity_bytes / BLOCK_SIZE_BYTES)
            .expect("the cache's size fits in memory");
        let shard_count = (capacity_blocks / SHARD_BLOCKS_MIN).clamp(1, SHARD_COUNT_MAX);
        let shard_count = if shard_count.is_power_of_two() {
            shard_count
        } else {
            shard_count.next_power_of_two() / 2
        };
        let shards = (0..shard_count)
            .map(|shard| LockedShard {
                // The first shards take the remainder, one block each.
                shard: Mutex::new(Shard::new(
                    capacity_blocks / shard_count
                        + usize::from(shard < capacity_blocks % shard_count),
                    written_unread_percent_max,
                )),
                generation: AtomicU64::new(0),
            })
            .collect();
        Self {
            capacity_blocks,
            written_unread_percent_max,
            shards,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            decoded_hits: AtomicU64::new(0),
        }
    }

    fn shard_of(&self, physical_block: u64) -> &LockedShard {
        // A power of two, so the remainder is the low bits.
        &self.shards[to_usize(physical_block % self.shards.len() as u64)]
    }

    fn lock(shard: &LockedShard) -> std::sync::MutexGuard<'_, Shard> {
        shard.shard.lock().expect("memory cache lock poisoned")
    }

    /// Copies the block into `destination` if cached.
    pub fn get(&self, physical_block: u64, destination: &mut [u8]) -> bool {
        if self.capacity_blocks == 0 {
            return false;
        }
        let found = {
            let mut shard = Self::lock(self.shard_of(physical_block));
            match shard.index_of.get(physical_block) {
                Some(index) => {
                    shard.mark_read(index);
                    destination.copy_from_slice(shard.data.block(index));
                    true
                }
                None => false,
            }
        };
        let counter = if found { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Copies `location`'s decoded block into `destination` if it is cached
    /// for the fragment whose checksum (the map's) is `fragment_checksum`
    /// and the copy passes the block's own checksum (decision 0075).
    pub fn get_decoded(
        &self,
        location: Location,
        fragment_checksum: u32,
        destination: &mut [u8; BLOCK],
    ) -> bool {
        if self.capacity_blocks == 0 {
            return false;
        }
        let key = decoded_key(location);
        let locked = self.shard_of(key);
        let Some(block_checksum) =
            Self::lock(locked).get_decoded(key, fragment_checksum, destination)
        else {
            return false;
        };
        if crc32c::crc32c(destination) != block_checksum {
            tracing::error!(%location, "a decoded block in the memory cache failed its checksum; it is dropped and the fragment read again");
            Self::lock(locked).forget(key);
            return false;
        }
        self.decoded_hits.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Offers `location`'s block, just decoded from packed blocks this
    /// cache held: it is kept decoded if it was decoded from the cache
    /// lately too, unless its shard saw an invalidation since `generation`
    /// was taken; within the share decoded blocks may take.
    pub fn offer_decoded(
        &self,
        location: Location,
        fragment_checksum: u32,
        contents: &[u8; BLOCK],
        generation: CacheGeneration,
    ) {
        if self.capacity_blocks == 0 {
            return;
        }
        let key = decoded_key(location);
        let locked = self.shard_of(key);
        let mut shard = Self::lock(locked);
        if locked.generation.load(Ordering::Acquire) == generation.0
            && shard.decoded.decoded_again(key)
        {
            let checksums = DecodedChecksums {
                fragment: fragment_checksum,
                block: crc32c::crc32c(contents),
            };
            shard.insert_decoded(key, contents, checksums);
        }
    }

    /// Forgets `location`'s decoded block (its fragment died).
    pub fn forget_decoded(&self, location: Location) {
        if self.capacity_blocks == 0 {
            return;
        }
        let key = decoded_key(location);
        Self::lock(self.shard_of(key)).forget(key);
    }

    /// Caches a block just written (replacing any copy), within the share
    /// written-and-unread blocks may take (see the module documentation): it
    /// may not be cached at all.
    pub fn insert(&self, physical_block: u64, contents: &[u8]) {
        assert_eq!(contents.len(), BLOCK);
        if self.capacity_blocks == 0 {
            return;
        }
        Self::lock(self.shard_of(physical_block)).insert_written(physical_block, contents);
    }

    /// The share of the cache written-and-unread blocks may take by evicting
    /// others, in per cent.
    pub fn written_unread_percent_max(&self) -> u64 {
        self.written_unread_percent_max
    }

    /// The generation of `physical_block`'s shard, taken when a device read
    /// of it is planned (see the module documentation).
    pub fn generation(&self, physical_block: u64) -> CacheGeneration {
        CacheGeneration(
            self.shard_of(physical_block)
                .generation
                .load(Ordering::Acquire),
        )
    }

    /// Caches a block read from the device, unless its shard saw an
    /// invalidation since `generation` was taken (the block may have died
    /// meanwhile); returns whether it is cached.
    pub fn insert_read(
        &self,
        physical_block: u64,
        contents: &[u8],
        generation: CacheGeneration,
    ) -> bool {
        assert_eq!(contents.len(), BLOCK);
        if self.capacity_blocks == 0 {
            return false;
        }
        let locked = self.shard_of(physical_block);
        let mut shard = Self::lock(locked);
        // Invalidations move the generation on under this lock.
        if locked.generation.load(Ordering::Acquire) != generation.0 {
            return false;
        }
        shard.insert_read(physical_block, contents);
        true
    }

    /// Caches a block's contents only if the cache has room for it without
    /// evicting anything (or already holds it); returns whether it is cached.
    /// For background loading, which must not push out what clients use.
    pub fn insert_if_room(&self, physical_block: u64, contents: &[u8]) -> bool {
        assert_eq!(contents.len(), BLOCK);
        if self.capacity_blocks == 0 {
            return false;
        }
        let mut shard = Self::lock(self.shard_of(physical_block));
        if !shard.has_room_for(physical_block) {
            return false;
        }
        shard.insert_read(physical_block, contents);
        true
    }

    /// The physical blocks cached, hottest first: those referenced since the
    /// hand last passed them, then the others, each shard from the one its
    /// hand would evict last to the one it would evict next.
    pub fn physical_blocks_hottest_first(&self) -> Vec<u64> {
        let mut referenced = Vec::new();
        let mut unreferenced = Vec::new();
        for locked in &self.shards {
            let shard = Self::lock(locked);
            let slot_count = shard.blocks.len();
            // Walking backwards from just behind the hand visits the slots the
            // hand reaches last first.
            for step in 1..=slot_count {
                let index = (shard.hand + slot_count - step) % slot_count;
                let physical_block = shard.blocks[index];
                if physical_block == EMPTY_SLOT || is_decoded_key(physical_block) {
                    continue;
                }
                if shard.referenced[index] {
                    referenced.push(physical_block);
                } else {
                    unreferenced.push(physical_block);
                }
            }
        }
        referenced.extend(unreferenced);
        referenced
    }

    /// Forgets every block in `first_block..first_block + block_count` (a dead
    /// block, or a segment about to be reused).
    pub fn invalidate_range(&self, first_block: u64, block_count: u64) {
        if self.capacity_blocks == 0 {
            return;
        }
        let shard_count = self.shards.len() as u64;
        let end = first_block + block_count;
        for first_of_shard in first_block..end.min(first_block + shard_count) {
            let locked = self.shard_of(first_of_shard);
            let mut shard = Self::lock(locked);
            locked.generation.fetch_add(1, Ordering::AcqRel);
            for physical_block in (first_of_shard..end).step_by(self.shards.len()) {
                shard.forget(physical_block);
            }
            shard.forget_decoded_in(first_block, end);
        }
    }

    pub fn statistics(&self) -> CacheStatistics {
        let mut cached_blocks = 0;
        let mut decoded_blocks = 0;
        for locked in &self.shards {
            let shard = Self::lock(locked);
            cached_blocks += shard.index_of.len();
            decoded_blocks += shard.decoded.count();
        }
        CacheStatistics {
            capacity_bytes: self.capacity_blocks as u64 * BLOCK_SIZE_BYTES,
            cached_bytes: cached_blocks as u64 * BLOCK_SIZE_BYTES,
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            decoded_bytes: decoded_blocks as u64 * BLOCK_SIZE_BYTES,
            decoded_hits: self.decoded_hits.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::decoded_entries::DECODED_PERCENT_MAX;
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

    fn decoded(value: u8) -> [u8; BLOCK] {
        [value; BLOCK]
    }

    #[test]
    fn decoded_blocks_are_served_for_their_fragment_only_and_within_their_share() {
        // One shard of 1,024 slots: decoded blocks may take 102 of them.
        let cache = MemoryCache::new(SHARD_BLOCKS_MIN as u64 * BLOCK_SIZE_BYTES);
        let share = SHARD_BLOCKS_MIN * to_usize(DECODED_PERCENT_MAX) / 100;
        let mut out = decoded(0);
        for physical_block in 0..SHARD_BLOCKS_MIN as u64 {
            cache.insert(physical_block, &block(1));
        }
        let fragment = |block: u64| Location::fragment(block, 10, 100);
        for block in 0..2 * share as u64 {
            let generation = cache.generation(block);
            cache.offer_decoded(fragment(block), 7, &decoded(2), generation);
            cache.offer_decoded(fragment(block), 7, &decoded(2), generation);
        }
        let statistics = cache.statistics();
        assert_eq!(statistics.decoded_bytes, share as u64 * BLOCK_SIZE_BYTES);
        assert_eq!(
            statistics.cached_bytes,
            SHARD_BLOCKS_MIN as u64 * BLOCK_SIZE_BYTES
        );
        // The newest replaced the oldest decoded blocks, not the packed ones.
        assert!(!cache.get_decoded(fragment(0), 7, &mut out));
        let newest = fragment(2 * share as u64 - 1);
        assert!(cache.get_decoded(newest, 7, &mut out) && out == decoded(2));
        assert!(
            !cache.get_decoded(newest, 8, &mut out),
            "another fragment's checksum"
        );
        assert_eq!(cache.statistics().decoded_hits, 1);
        let packed_left = (0..SHARD_BLOCKS_MIN as u64)
            .filter(|&physical_block| cache.get(physical_block, &mut block(0)))
            .count();
        assert_eq!(packed_left, SHARD_BLOCKS_MIN - share);
        // A segment's invalidation forgets its decoded blocks; a dead
        // fragment's own is forgotten alone.
        let last = 2 * share as u64 - 1;
        cache.invalidate_range(last, 1);
        assert!(!cache.get_decoded(fragment(last), 7, &mut out));
        cache.forget_decoded(fragment(last - 1));
        assert!(!cache.get_decoded(fragment(last - 1), 7, &mut out));
        assert!(cache.get_decoded(fragment(last - 2), 7, &mut out));
        assert_eq!(
            cache.statistics().decoded_bytes,
            (share as u64 - 2) * BLOCK_SIZE_BYTES
        );
        // A decode planned before an invalidation is not kept.
        let planned = cache.generation(5000);
        cache.invalidate_range(5000, 1);
        cache.offer_decoded(fragment(5000), 7, &decoded(3), planned);
        cache.offer_decoded(fragment(5000), 7, &decoded(3), planned);
        assert!(!cache.get_decoded(fragment(5000), 7, &mut out));
        // Decoded blocks are not device blocks to warm after a restart.
        assert!(
            cache
                .physical_blocks_hottest_first()
                .iter()
                .all(|&physical_block| physical_block < SHARD_BLOCKS_MIN as u64)
        );
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

    #[test]
    fn a_read_inserts_only_if_its_shard_saw_no_invalidation_since_planned() {
        let cache = MemoryCache::new(4 * BLOCK_SIZE_BYTES);
        let mut out = block(0);
        let planned = cache.generation(30);
        assert!(cache.insert_read(30, &block(5), planned));
        assert!(cache.get(30, &mut out) && out == block(5));
        // The block dies (overwritten elsewhere) between the plan and the insert.
        let planned = cache.generation(31);
        cache.invalidate_range(31, 1);
        assert!(!cache.insert_read(31, &block(6), planned));
        assert!(!cache.get(31, &mut out));
        assert!(cache.insert_read(31, &block(6), cache.generation(31)));
    }

    #[test]
    fn a_large_cache_is_sharded_and_still_invalidates_whole_ranges() {
        let capacity_blocks = SHARD_COUNT_MAX * SHARD_BLOCKS_MIN;
        let cache = MemoryCache::new(capacity_blocks as u64 * BLOCK_SIZE_BYTES);
        assert_eq!(cache.shards.len(), SHARD_COUNT_MAX);
        let mut out = block(0);
        for physical_block in 0..100 {
            cache.insert(
                physical_block,
                &block(u8::try_from(physical_block).unwrap()),
            );
        }
        assert_eq!(cache.statistics().cached_bytes, 100 * BLOCK_SIZE_BYTES);
        cache.invalidate_range(10, 50);
        for physical_block in 0..100 {
            let cached = cache.get(physical_block, &mut out);
            assert_eq!(
                cached,
                !(10..60).contains(&physical_block),
                "{physical_block}"
            );
        }
        assert_eq!(cache.physical_blocks_hottest_first().len(), 50);
        let statistics = cache.statistics();
        assert_eq!((statistics.hits, statistics.misses), (50, 50));
        // Every block of a shard evicts within that shard when it is full.
        for physical_block in 0..(2 * capacity_blocks) as u64 {
            cache.insert(physical_block, &block(1));
        }
        assert_eq!(
            cache.statistics().cached_bytes,
            capacity_blocks as u64 * BLOCK_SIZE_BYTES
        );
    }

    #[test]
    fn written_blocks_displace_at_most_their_share_of_the_blocks_read() {
        let capacity_blocks = SHARD_BLOCKS_MIN as u64;
        let cache = MemoryCache::new(capacity_blocks * BLOCK_SIZE_BYTES);
        let share_blocks = capacity_blocks * WRITTEN_UNREAD_PERCENT_MAX / 100;
        let mut out = block(0);
        // Every slot read (referenced), then a fill four times the cache.
        for physical_block in 0..capacity_blocks {
            assert!(cache.insert_read(physical_block, &block(1), CacheGeneration::default()));
            assert!(cache.get(physical_block, &mut out));
        }
        let fill_first = 1 << 20;
        for physical_block in fill_first..fill_first + 4 * capacity_blocks {
            cache.insert(physical_block, &block(2));
        }
        let read_left = (0..capacity_blocks)
            .filter(|physical_block| cache.get(*physical_block, &mut out))
            .count() as u64;
        assert_eq!(read_left, capacity_blocks - share_blocks);
        // The newest writes are cached, in about the order they came.
        let newest = fill_first + 4 * capacity_blocks - 1;
        assert!(cache.get(newest, &mut out) && out == block(2));
        // A written block read once counts as read from then on: a second
        // fill leaves the blocks read, that one included, the same share.
        let fill_second = 2 << 20;
        for physical_block in fill_second..fill_second + 4 * capacity_blocks {
            cache.insert(physical_block, &block(3));
        }
        let read_still = (0..capacity_blocks)
            .chain([newest])
            .filter(|physical_block| cache.get(*physical_block, &mut out))
            .count() as u64;
        assert_eq!(read_still, capacity_blocks - share_blocks);
    }

    #[test]
    fn without_a_share_written_blocks_take_only_room() {
        let cache = MemoryCache::with_written_unread_percent_max(2 * BLOCK_SIZE_BYTES, 0);
        let mut out = block(0);
        for physical_block in [1, 2] {
            assert!(cache.insert_read(physical_block, &block(1), cache.generation(physical_block)));
        }
        // Full of blocks read: a written block is not cached.
        cache.insert(3, &block(3));
        assert!(!cache.get(3, &mut out));
        assert!(cache.get(1, &mut out) && cache.get(2, &mut out));
        // It takes room, and then only the slots of other written blocks.
        cache.invalidate_range(1, 1);
        cache.insert(3, &block(3));
        cache.insert(4, &block(4));
        assert!(cache.get(4, &mut out) && out == block(4));
        assert!(!cache.get(3, &mut out));
        assert!(cache.get(2, &mut out) && out == block(1));
        assert_eq!(cache.written_unread_percent_max(), 0);
    }
}
