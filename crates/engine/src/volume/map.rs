//! A volume's map from logical 4 KiB blocks to physical device blocks, with each
//! block's checksum beside its address so that every read can be verified without
//! another I/O. The map is a sorted tree of 512-entry chunks (2 MiB of logical
//! space each) held behind `Arc`s: unwritten chunks cost nothing, a fully written
//! volume costs 12 bytes per block, and a copy of the whole map (for a checkpoint,
//! a snapshot or a clone) shares every chunk until one side writes to it. Maps that
//! share a chunk are known to agree on all 512 entries, which lets comparisons
//! between a snapshot and its neighbours skip shared chunks without looking inside.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::convert::to_usize;

/// Entries per chunk.
pub const CHUNK_ENTRY_COUNT: usize = 512;

/// The physical block of a mapping whose data is lost (format version 9): its
/// only copy was on a flash device the pool was restored without
/// (`Pool::restore_flash`). Reading it is an I/O error; it occupies no
/// segment, so the map reports it displaced nowhere and counts it in no
/// segment's usage. Device block 1 lies in the superblock area: never data.
pub const LOST_PHYSICAL_BLOCK: u64 = 1;

/// One mapping: where a logical block lives and the crc32c of its contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub physical_block: u64,
    pub checksum: u32,
}

impl Mapping {
    /// Whether the block's data is lost (see [`LOST_PHYSICAL_BLOCK`]).
    pub fn is_lost(&self) -> bool {
        self.physical_block == LOST_PHYSICAL_BLOCK
    }
}

/// Whether `physical_block` (from a map entry) holds data on the device:
/// neither unmapped nor lost.
fn occupies_device(physical_block: u64) -> bool {
    physical_block != 0 && physical_block != LOST_PHYSICAL_BLOCK
}

#[derive(Clone)]
pub struct Chunk {
    /// 0 means unmapped (device block 0 is the superblock, never data).
    pub physical_blocks: [u64; CHUNK_ENTRY_COUNT],
    pub checksums: [u32; CHUNK_ENTRY_COUNT],
    pub mapped_count: u32,
}

impl Chunk {
    pub fn empty() -> Self {
        Self {
            physical_blocks: [0; CHUNK_ENTRY_COUNT],
            checksums: [0; CHUNK_ENTRY_COUNT],
            mapped_count: 0,
        }
    }
}

/// A map as a checkpoint names it: a volume's live map (no snapshot) or one
/// of its snapshots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MapName {
    pub volume_id: u32,
    pub snapshot_id: Option<u32>,
}

/// What changed in a map since the previous checkpoint, so that an
/// incremental checkpoint writes only that: the map of that checkpoint this
/// one descends from (none: an empty map), and per changed chunk, which of
/// its entries may differ from it. A copy of a map (a snapshot, a clone, a
/// rollback) carries both, so a map made after the checkpoint is described
/// as its origin plus its changes.
#[derive(Clone, Debug, Default)]
pub struct ChangesSinceCheckpoint {
    pub source: Option<MapName>,
    /// Shared, so that copying a map stays O(1).
    pub changed_chunks: Arc<BTreeMap<u64, ChangedEntries>>,
}

/// A bit per entry of a chunk: set where the entry changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChangedEntries([u64; CHUNK_ENTRY_COUNT / 64]);

impl ChangedEntries {
    fn contains(&self, entry: usize) -> bool {
        self.0[entry / 64] & (1 << (entry % 64)) != 0
    }

    fn insert(&mut self, entry: usize) {
        self.0[entry / 64] |= 1 << (entry % 64);
    }

    /// The changed entries, in increasing order.
    pub fn entries(&self) -> impl Iterator<Item = usize> + '_ {
        (0..CHUNK_ENTRY_COUNT).filter(|entry| self.contains(*entry))
    }
}

/// See the module documentation. The chunk index itself is shared too, so that
/// copying a map (a snapshot, a checkpoint, an accounting pass outside the pool
/// lock) is O(1); the first change after a copy copies the index (O(chunks)).
#[derive(Clone, Default)]
pub struct BlockMap {
    chunks: Arc<BTreeMap<u64, Arc<Chunk>>>,
    mapped_count: u64,
    changes: ChangesSinceCheckpoint,
}

fn split(logical_block: u64) -> (u64, usize) {
    (
        logical_block / CHUNK_ENTRY_COUNT as u64,
        to_usize(logical_block % CHUNK_ENTRY_COUNT as u64),
    )
}

impl BlockMap {
    /// Marks entry `entry` of chunk `chunk_index` as changed since the
    /// previous checkpoint. Every method that changes an entry calls it.
    fn mark_changed(&mut self, chunk_index: u64, entry: usize) {
        let marked = self
            .changes
            .changed_chunks
            .get(&chunk_index)
            .is_some_and(|changed| changed.contains(entry));
        if !marked {
            Arc::make_mut(&mut self.changes.changed_chunks)
                .entry(chunk_index)
                .or_default()
                .insert(entry);
        }
    }

    /// What changed since the previous checkpoint (see [`ChangesSinceCheckpoint`]).
    pub fn changes(&self) -> &ChangesSinceCheckpoint {
        &self.changes
    }

    /// A checkpoint copied this map as `name`: from now on changes are
    /// counted from that copy.
    pub fn checkpointed_as(&mut self, name: MapName) {
        self.changes.source = Some(name);
        if !self.changes.changed_chunks.is_empty() {
            self.changes.changed_chunks = Arc::default();
        }
    }

    pub fn get(&self, logical_block: u64) -> Option<Mapping> {
        let (chunk_index, entry) = split(logical_block);
        let chunk = self.chunks.get(&chunk_index)?;
        let physical_block = chunk.physical_blocks[entry];
        (physical_block != 0).then(|| Mapping {
            physical_block,
            checksum: chunk.checksums[entry],
        })
    }

    /// Maps `logical_block`, returning the physical block it displaced (none
    /// for an unmapped or lost entry).
    pub fn set(&mut self, logical_block: u64, mapping: Mapping) -> Option<u64> {
        assert_ne!(mapping.physical_block, 0, "physical block 0 is never data");
        let (chunk_index, entry) = split(logical_block);
        self.mark_changed(chunk_index, entry);
        let chunk = Arc::make_mut(
            Arc::make_mut(&mut self.chunks)
                .entry(chunk_index)
                .or_insert_with(|| Arc::new(Chunk::empty())),
        );
        let old = chunk.physical_blocks[entry];
        chunk.physical_blocks[entry] = mapping.physical_block;
        chunk.checksums[entry] = mapping.checksum;
        if old == 0 {
            chunk.mapped_count += 1;
            self.mapped_count += 1;
        }
        occupies_device(old).then_some(old)
    }

    /// Unmaps `block_count` blocks from `logical_block`, calling `displaced` with
    /// each logical block that was mapped and the physical block it mapped to.
    pub fn unmap_range(
        &mut self,
        logical_block: u64,
        block_count: u64,
        displaced: &mut dyn FnMut(u64, u64),
    ) {
        let Some(end) = logical_block.checked_add(block_count) else {
            return self.unmap_range(logical_block, u64::MAX - logical_block, displaced);
        };
        if block_count == 0 {
            return;
        }
        let first_chunk = logical_block / CHUNK_ENTRY_COUNT as u64;
        let last_chunk = (end - 1) / CHUNK_ENTRY_COUNT as u64;
        let touched: Vec<u64> = self
            .chunks
            .range(first_chunk..=last_chunk)
            .map(|(index, _)| *index)
            .collect();
        if touched.is_empty() {
            return;
        }
        let mut changed = Vec::new();
        let chunks = Arc::make_mut(&mut self.chunks);
        for chunk_index in touched {
            let chunk_start = chunk_index * CHUNK_ENTRY_COUNT as u64;
            let from = logical_block.max(chunk_start) - chunk_start;
            let to = end.min(chunk_start + CHUNK_ENTRY_COUNT as u64) - chunk_start;
            let chunk = Arc::make_mut(chunks.get_mut(&chunk_index).expect("chunk listed above"));
            for entry in to_usize(from)..to_usize(to) {
                let old = chunk.physical_blocks[entry];
                if old != 0 {
                    changed.push((chunk_index, entry));
                    if old != LOST_PHYSICAL_BLOCK {
                        displaced(chunk_start + entry as u64, old);
                    }
                    chunk.physical_blocks[entry] = 0;
                    chunk.mapped_count -= 1;
                    self.mapped_count -= 1;
                }
            }
            if chunk.mapped_count == 0 {
                chunks.remove(&chunk_index);
            }
        }
        for (chunk_index, entry) in changed {
            self.mark_changed(chunk_index, entry);
        }
    }

    pub fn mapped_count(&self) -> u64 {
        self.mapped_count
    }

    /// Every mapped physical block, for recomputing segment usage (lost
    /// entries occupy none).
    pub fn for_each_physical(&self, visit: &mut dyn FnMut(u64)) {
        for chunk in self.chunks.values() {
            for physical_block in chunk.physical_blocks.iter() {
                if occupies_device(*physical_block) {
                    visit(*physical_block);
                }
            }
        }
    }

    /// Marks lost ([`LOST_PHYSICAL_BLOCK`], keeping the checksum) every
    /// entry for which `is_lost(physical_block, changed)` holds, `changed`
    /// saying whether the entry changed since the checkpoint; returns how
    /// many. Chunks shared with other maps are copied (a restore's cost).
    pub fn mark_lost(&mut self, is_lost: &dyn Fn(u64, bool) -> bool) -> u64 {
        let mut marked = Vec::new();
        for (chunk_index, chunk) in self.chunks.iter() {
            let changed = self.changes.changed_chunks.get(chunk_index);
            for (entry, physical_block) in chunk.physical_blocks.iter().enumerate() {
                let entry_changed = changed.is_some_and(|changed| changed.contains(entry));
                if occupies_device(*physical_block) && is_lost(*physical_block, entry_changed) {
                    marked.push((*chunk_index, entry));
                }
            }
        }
        for (chunk_index, entry) in &marked {
            self.mark_changed(*chunk_index, *entry);
            let chunks = Arc::make_mut(&mut self.chunks);
            let chunk = Arc::make_mut(chunks.get_mut(chunk_index).expect("chunk listed above"));
            chunk.physical_blocks[*entry] = LOST_PHYSICAL_BLOCK;
        }
        marked.len() as u64
    }

    pub fn chunks(&self) -> impl Iterator<Item = (u64, &Chunk)> {
        self.chunks
            .iter()
            .map(|(index, chunk)| (*index, chunk.as_ref()))
    }

    /// The shared chunks themselves, so that a checkpoint can store each
    /// distinct chunk once however many snapshots hold it.
    pub fn shared_chunks(&self) -> impl Iterator<Item = (u64, &Arc<Chunk>)> {
        self.chunks.iter().map(|(index, chunk)| (*index, chunk))
    }

    /// The chunk at `chunk_index`, if any entry of it is mapped.
    pub fn shared_chunk(&self, chunk_index: u64) -> Option<&Arc<Chunk>> {
        self.chunks.get(&chunk_index)
    }

    /// Inserts a chunk shared with other maps (rebuilt from a checkpoint;
    /// not a change since it: the first checkpoint after recovery is a base).
    pub fn insert_shared_chunk(&mut self, chunk_index: u64, chunk: Arc<Chunk>) {
        if chunk.mapped_count == 0 {
            return;
        }
        self.mapped_count += u64::from(chunk.mapped_count);
        let previous = Arc::make_mut(&mut self.chunks).insert(chunk_index, chunk);
        assert!(
            previous.is_none(),
            "chunk {chunk_index} appears twice in a map"
        );
    }

    /// Calls `visit(logical_block, physical_block)` for every mapping of this map
    /// that none of `others` holds at the same logical block: the blocks this map
    /// alone references among its neighbours. Chunks shared with a neighbour are
    /// skipped whole.
    pub fn for_each_not_in(&self, others: &[&BlockMap], visit: &mut dyn FnMut(u64, u64)) {
        if others
            .iter()
            .any(|other| Arc::ptr_eq(&other.chunks, &self.chunks))
        {
            return;
        }
        for (chunk_index, chunk) in self.chunks.iter() {
            let neighbours: Vec<&Arc<Chunk>> = others
                .iter()
                .filter_map(|other| other.chunks.get(chunk_index))
                .collect();
            if neighbours.iter().any(|other| Arc::ptr_eq(other, chunk)) {
                continue;
            }
            let chunk_start = chunk_index * CHUNK_ENTRY_COUNT as u64;
            for (entry, physical_block) in chunk.physical_blocks.iter().enumerate() {
                if occupies_device(*physical_block)
                    && !neighbours
                        .iter()
                        .any(|other| other.physical_blocks[entry] == *physical_block)
                {
                    visit(chunk_start + entry as u64, *physical_block);
                }
            }
        }
    }

    /// How many mappings of this map none of `others` holds (see [`Self::for_each_not_in`]).
    pub fn count_not_in(&self, others: &[&BlockMap]) -> u64 {
        let mut count = 0;
        self.for_each_not_in(others, &mut |_, _| count += 1);
        count
    }

    /// Whether `logical_block` maps to `physical_block`.
    pub fn holds(&self, logical_block: u64, physical_block: u64) -> bool {
        let (chunk_index, entry) = split(logical_block);
        self.chunks
            .get(&chunk_index)
            .is_some_and(|chunk| chunk.physical_blocks[entry] == physical_block)
    }
}

/// Moves `logical_block` from physical block `from` to `to` in every map of
/// `maps` that holds `from` there (the cleaner relocating a block that snapshots
/// and clones share). Maps that shared a chunk before share the one new chunk
/// after, so relocation never multiplies memory. Returns how many maps held it.
pub fn relocate_in<'a>(
    maps: impl Iterator<Item = &'a mut BlockMap>,
    logical_block: u64,
    from: u64,
    to: Mapping,
) -> usize {
    assert_ne!(to.physical_block, 0, "physical block 0 is never data");
    let (chunk_index, entry) = split(logical_block);
    // (old chunk, its replacement); the old one is kept alive so that pointer
    // comparisons stay meaningful for the whole call.
    let mut replaced: Vec<(Arc<Chunk>, Arc<Chunk>)> = Vec::new();
    let mut held = 0;
    for map in maps {
        if map
            .chunks
            .get(&chunk_index)
            .is_none_or(|chunk| chunk.physical_blocks[entry] != from)
        {
            continue;
        }
        held += 1;
        map.mark_changed(chunk_index, entry);
        let slot = Arc::make_mut(&mut map.chunks)
            .get_mut(&chunk_index)
            .expect("checked above");
        if let Some((_, new)) = replaced.iter().find(|(old, _)| Arc::ptr_eq(old, slot)) {
            *slot = new.clone();
            continue;
        }
        if let Some(chunk) = Arc::get_mut(slot) {
            chunk.physical_blocks[entry] = to.physical_block;
            chunk.checksums[entry] = to.checksum;
            continue;
        }
        let mut chunk = Chunk::clone(slot);
        chunk.physical_blocks[entry] = to.physical_block;
        chunk.checksums[entry] = to.checksum;
        let new = Arc::new(chunk);
        let old = std::mem::replace(slot, new.clone());
        replaced.push((old, new));
    }
    held
}

impl BlockMap {
    /// Rebuilds a chunk from a checkpoint image.
    pub fn insert_chunk(&mut self, chunk_index: u64, physical_blocks: &[u64], checksums: &[u32]) {
        assert_eq!(physical_blocks.len(), CHUNK_ENTRY_COUNT);
        assert_eq!(checksums.len(), CHUNK_ENTRY_COUNT);
        let mut chunk = Chunk::empty();
        chunk.physical_blocks.copy_from_slice(physical_blocks);
        chunk.checksums.copy_from_slice(checksums);
        let mapped_count = physical_blocks.iter().filter(|block| **block != 0).count();
        chunk.mapped_count =
            u32::try_from(mapped_count).expect("a chunk has CHUNK_ENTRY_COUNT (512) entries");
        if chunk.mapped_count > 0 {
            self.mapped_count += u64::from(chunk.mapped_count);
            let previous = Arc::make_mut(&mut self.chunks).insert(chunk_index, Arc::new(chunk));
            assert!(
                previous.is_none(),
                "chunk {chunk_index} appears twice in a checkpoint"
            );
        }
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // test patterns: small indexes, wrapping bytes
mod tests {
    use super::*;

    fn mapping(physical_block: u64) -> Mapping {
        Mapping {
            physical_block,
            checksum: physical_block as u32,
        }
    }

    #[test]
    fn set_get_unmap_and_copies_share_until_written() {
        let mut map = BlockMap::default();
        assert_eq!(map.set(5, mapping(100)), None);
        assert_eq!(map.set(5, mapping(101)), Some(100));
        assert_eq!(map.set(1000, mapping(102)), None);
        assert_eq!(map.get(5), Some(mapping(101)));
        assert_eq!(map.get(6), None);
        let copy = map.clone();
        let mut displaced = Vec::new();
        map.unmap_range(0, 600, &mut |_, block| displaced.push(block));
        assert_eq!(displaced, vec![101]);
        assert_eq!(map.get(1000), Some(mapping(102)));
        assert_eq!(map.mapped_count(), 1);
        assert_eq!(copy.get(5), Some(mapping(101)), "the copy is unaffected");
        map.unmap_range(0, u64::MAX, &mut |_, _| {});
        assert_eq!(map.mapped_count(), 0);
        assert_eq!(map.chunks().count(), 0);
    }

    #[test]
    fn changes_are_counted_per_entry_from_the_checkpoint_and_travel_with_copies() {
        let name = MapName {
            volume_id: 1,
            snapshot_id: None,
        };
        let changed = |map: &BlockMap| -> Vec<(u64, Vec<usize>)> {
            map.changes()
                .changed_chunks
                .iter()
                .map(|(index, entries)| (*index, entries.entries().collect()))
                .collect()
        };
        let mut map = BlockMap::default();
        map.set(3, mapping(100));
        map.set(CHUNK_ENTRY_COUNT as u64 * 4 + 7, mapping(101));
        assert_eq!(map.changes().source, None);
        assert_eq!(changed(&map), vec![(0, vec![3]), (4, vec![7])]);
        map.checkpointed_as(name);
        assert!(map.changes().changed_chunks.is_empty());
        let mut snapshot = map.clone();
        map.unmap_range(CHUNK_ENTRY_COUNT as u64 * 4, 10, &mut |_, _| {});
        relocate_in([&mut snapshot].into_iter(), 3, 100, mapping(200));
        assert_eq!(snapshot.changes().source, Some(name));
        assert_eq!(changed(&snapshot), vec![(0, vec![3])]);
        assert_eq!(changed(&map), vec![(4, vec![7])]);
    }

    #[test]
    fn relocation_keeps_shared_chunks_shared_and_neighbour_comparison() {
        let mut live = BlockMap::default();
        live.set(1, mapping(100));
        live.set(2, mapping(200));
        let mut first = live.clone();
        let mut second = live.clone();
        live.set(2, mapping(201));
        // `first` and `second` share a chunk; `live` has its own copy.
        let moved = relocate_in(
            [&mut live, &mut first, &mut second].into_iter(),
            1,
            100,
            mapping(300),
        );
        assert_eq!(moved, 3);
        assert!(Arc::ptr_eq(&first.chunks[&0], &second.chunks[&0]));
        assert_eq!(first.get(1), Some(mapping(300)));
        assert_eq!(live.get(1), Some(mapping(300)));
        assert_eq!(live.get(2), Some(mapping(201)));
        assert_eq!(first.get(2), Some(mapping(200)));
        // Not held anywhere: nothing moves.
        assert_eq!(relocate_in([&mut live].into_iter(), 1, 999, mapping(5)), 0);
        // Only block 2 of `live` differs from `first`.
        let mut unique = Vec::new();
        live.for_each_not_in(&[&first], &mut |logical, physical| {
            unique.push((logical, physical))
        });
        assert_eq!(unique, vec![(2, 201)]);
        assert_eq!(first.count_not_in(&[&second]), 0);
        assert_eq!(first.count_not_in(&[]), 2);
    }
}
