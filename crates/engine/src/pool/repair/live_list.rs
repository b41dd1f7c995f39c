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
use crate::volume::map::Mapping;

use crate::pool::core::Core;

/// See the module documentation.
pub(in crate::pool) struct LiveList {
    /// Every distinct live whole block, in physical order.
    mappings: Vec<Mapping>,
    /// Every distinct live fragment, in location order (decision 0070).
    fragments: Vec<Mapping>,
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

    /// How many listed blocks lie in `first_block..end_block`.
    pub(in crate::pool) fn count_in(&self, first_block: u64, end_block: u64) -> u64 {
        self.mappings_in(first_block, end_block).len() as u64
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
        // Fragments are checked by scrub's own pass (`Scrub::scrub_fragments`):
        // the device checks whole blocks against one checksum each.
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
        fragments.sort_unstable_by_key(|mapping| mapping.location);
        fragments.dedup_by_key(|mapping| mapping.location);
        LiveList {
            mappings,
            fragments,
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
