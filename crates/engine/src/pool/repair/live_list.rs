//! A list of the pool's live blocks taken at one moment, for the long
//! passes that read them back and check them (scrub, rebuild). While such a
//! pass runs, clients and the cleaner go on, and blocks the list names die
//! and their segments are reused: what the pass then reads there is
//! another block, no damage. The list remembers the allocator's count of
//! freed segments when it was taken, so that such a block is recognised
//! from its segment alone (O(1)); only a mismatch in a segment not freed
//! since — damage, or a block not yet on the device — searches the maps.
//! (Searching the maps for every such block held the state lock for a whole
//! map walk each time, and a rebuild late in a busy pool's cleaning stalled
//! every client for seconds: BENCHMARKS.md "Rebuild under load in the
//! cleaning steady state".)

use crate::log::batch::block_checksum;
use crate::log::fragment::fragment_units;
use crate::log::location::Location;
use crate::volume::map::Mapping;

use crate::pool::core::Core;

/// See the module documentation.
pub(in crate::pool) struct LiveList {
    /// Every distinct live whole block, in physical order.
    mappings: Vec<Mapping>,
    /// Every distinct live fragment, by block and unit offset (decision 0070).
    fragments: Vec<Mapping>,
    /// Every block a live fragment touches, ascending: held by the pool
    /// though no whole block lives there.
    packed_blocks: Vec<u64>,
    /// The allocator's `free_events` when the list was taken.
    free_events: u64,
}

impl LiveList {
    pub(in crate::pool) fn mappings(&self) -> &[Mapping] {
        &self.mappings
    }

    /// The live fragments, which scrub checks on its own.
    pub(in crate::pool) fn fragments(&self) -> &[Mapping] {
        &self.fragments
    }

    /// The listed blocks in `first_block..end_block`.
    pub(in crate::pool) fn mappings_in(&self, first_block: u64, end_block: u64) -> &[Mapping] {
        let start = self
            .mappings
            .partition_point(|mapping| mapping.physical_block() < first_block);
        let end = self
            .mappings
            .partition_point(|mapping| mapping.physical_block() < end_block);
        &self.mappings[start..end.max(start)]
    }

    /// How many listed blocks lie in `first_block..end_block`: whole blocks
    /// and blocks fragments are packed in.
    pub(in crate::pool) fn count_in(&self, first_block: u64, end_block: u64) -> u64 {
        let packed_start = self
            .packed_blocks
            .partition_point(|block| *block < first_block);
        let packed_end = self
            .packed_blocks
            .partition_point(|block| *block < end_block);
        (self.mappings_in(first_block, end_block).len() + packed_end.saturating_sub(packed_start))
            as u64
    }

    /// The live fragments touching a block of `first_block..end_block`.
    pub(in crate::pool) fn fragments_touching(
        &self,
        first_block: u64,
        end_block: u64,
    ) -> &[Mapping] {
        touching(
            &self.fragments,
            |mapping| mapping.location,
            first_block..end_block,
        )
    }

    /// Whether the segment holding `physical_block` was freed since the
    /// list was taken (what it held then died).
    pub(in crate::pool) fn segment_freed_since(&self, core: &Core, physical_block: u64) -> bool {
        let segment_index = core.geometry().segment_of(physical_block);
        core.lock()
            .space()
            .freed_since(segment_index, self.free_events)
    }

    /// Whether a live fragment touches `physical_block`.
    pub(in crate::pool) fn is_packed(&self, physical_block: u64) -> bool {
        self.packed_blocks.binary_search(&physical_block).is_ok()
    }

    /// Whether `contents`, read or rebuilt at packed block `physical_block`,
    /// holds every live fragment that lies wholly in it as written: the
    /// check a block of fragments allows by itself (a fragment continuing
    /// into the next block needs both, and is caught by its checksum at the
    /// next read or scrub). A block holding no such fragment passes.
    pub(in crate::pool) fn packed_block_passes(
        &self,
        physical_block: u64,
        contents: &[u8],
    ) -> bool {
        self.fragments_touching(physical_block, physical_block + 1)
            .iter()
            .filter(|mapping| {
                mapping.location.block() == physical_block && mapping.location.block_count() == 1
            })
            .all(|mapping| {
                fragment_units(mapping.location, contents)
                    .is_ok_and(|units| crc32c::crc32c(units) == mapping.checksum)
            })
    }

    /// Whether two rebuilds of packed block `physical_block` hold the same
    /// bytes wherever a live fragment lies (the part in this block of one
    /// continuing from the block before or into the next one too); the rest
    /// of the block is never read.
    pub(in crate::pool) fn same_live_fragments(
        &self,
        physical_block: u64,
        first: &[u8],
        second: &[u8],
    ) -> bool {
        self.fragments_touching(physical_block, physical_block + 1)
            .iter()
            .filter_map(|mapping| mapping.location.part_in_block(physical_block))
            .all(|range| first[range.clone()] == second[range])
    }

    /// Whether `contents` read or rebuilt at `physical_block` is no damage
    /// for a long pass (rebuild): a listed whole block matches its checksum
    /// or died since, a packed block holds its fragments
    /// ([`LiveList::packed_block_passes`]) or one that fails died since, and
    /// any other block is not the pool's.
    pub(in crate::pool) fn contents_pass(
        &self,
        core: &Core,
        physical_block: u64,
        contents: &[u8],
    ) -> bool {
        if let Some(mapping) = self.find(physical_block) {
            return self.block_passes(core, mapping, contents);
        }
        !self.is_packed(physical_block)
            || self.packed_block_passes(physical_block, contents)
            || self.segment_freed_since(core, physical_block)
    }

    /// The listed block at `physical_block`, if any.
    pub(in crate::pool) fn find(&self, physical_block: u64) -> Option<&Mapping> {
        self.mappings
            .binary_search_by_key(&physical_block, |mapping| mapping.physical_block())
            .ok()
            .map(|position| &self.mappings[position])
    }
}

impl LiveList {
    /// Every distinct live block of `core` (physical order), with its
    /// checksum, and the moment the list stands for.
    pub(in crate::pool) fn take(core: &Core) -> LiveList {
        let state = core.lock();
        let (mut mappings, mut fragments) = (Vec::new(), Vec::new());
        // Fragments are listed apart: a block of them has no checksum of its
        // own (scrub judges it by its fragments' bytes, `scrub/fragments.rs`).
        state.volumes().for_each_distinct_mapping(&mut |mapping| {
            if mapping.location.is_fragment() {
                fragments.push(mapping);
            } else {
                mappings.push(mapping);
            }
        });
        let free_events = state.space().free_events();
        drop(state);
        mappings.sort_unstable_by_key(|mapping| mapping.physical_block());
        mappings.dedup_by_key(|mapping| mapping.physical_block());
        let order = |mapping: &Mapping| (mapping.location.block(), mapping.location.unit_offset());
        fragments.sort_unstable_by_key(order);
        fragments.dedup_by_key(|mapping| mapping.location);
        let mut packed_blocks: Vec<u64> = fragments
            .iter()
            .flat_map(|mapping| {
                let first = mapping.location.block();
                first..first + u64::from(mapping.location.block_count())
            })
            .collect();
        packed_blocks.sort_unstable();
        packed_blocks.dedup();
        LiveList {
            mappings,
            fragments,
            packed_blocks,
            free_events,
        }
    }

    /// Whether `contents`, read from the place of the listed `mapping`, is
    /// no damage: it matches the checksum, or the block has died since the
    /// list was taken (its segment freed since, or no map holds it now).
    pub(in crate::pool) fn block_passes(
        &self,
        core: &Core,
        mapping: &Mapping,
        contents: &[u8],
    ) -> bool {
        block_checksum(contents) == mapping.checksum || self.block_died(core, mapping)
    }

    /// Whether the listed `mapping` died since the list was taken: its
    /// segment was freed since, or no map holds it now.
    pub(in crate::pool) fn block_died(&self, core: &Core, mapping: &Mapping) -> bool {
        let segment_index = core.geometry().segment_of(mapping.location.block());
        if core
            .lock()
            .space()
            .freed_since(segment_index, self.free_events)
        {
            return true;
        }
        !still_live(core, mapping)
    }
}

/// The items of `sorted` (in the order of their locations' block, then unit
/// offset) whose location, given by `location_of`, touches a block of
/// `blocks`: a fragment continues into one block at most, so those from the
/// block before `blocks` that do not reach it are skipped.
pub(in crate::pool) fn touching<T>(
    sorted: &[T],
    location_of: impl Fn(&T) -> Location,
    blocks: std::ops::Range<u64>,
) -> &[T] {
    let start = sorted.partition_point(|item| location_of(item).block() + 1 < blocks.start);
    let end = sorted
        .partition_point(|item| location_of(item).block() < blocks.end)
        .max(start);
    let skipped = sorted[start..end]
        .iter()
        .take_while(|item| {
            let location = location_of(item);
            location.block() + u64::from(location.block_count()) <= blocks.start
        })
        .count();
    &sorted[start + skipped..end]
}

/// Whether some map of `core` still holds `mapping`: a walk of every map
/// under the state lock, so only for a mismatch the segment does not explain.
fn still_live(core: &Core, mapping: &Mapping) -> bool {
    let state = core.lock();
    let mut live = false;
    state.volumes().for_each_distinct_mapping(&mut |held| {
        live |= held == *mapping;
    });
    live
}
