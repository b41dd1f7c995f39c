//! Scrub's check of compressed blocks (issue 44, decisions 0070 and 0072).
//! A block of fragments has no checksum of its own: each fragment's covers
//! its units, and a fragment may continue into the next block. So before a
//! chunk's rows are checked, every live fragment touching the chunk is read
//! and decoded, and one that fails is rebuilt from redundancy, judged by its
//! own checksum (rewritten only where the rebuild changed nothing but the
//! fragment: `fragment_read::recover_fragment_blocks`). The chunk's row
//! checks then know what every live fragment holds, byte for byte, and judge
//! a block of fragments (or a rebuild of it) by those bytes
//! ([`ChunkFragments::block_passes`]): a rebuild from the wrong columns
//! differs somewhere a live fragment lies, so the row check finds the right
//! columns and rewrites the row, parity included, as it does for whole
//! blocks. Where no live fragment lies, nothing is read, and two rebuilds
//! that differ only there are the same to the pool.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::BLOCK_BYTES;
use crate::BLOCK_SIZE_BYTES;
use crate::log::location::Location;
use crate::pool::core::Core;
use crate::pool::io::fragment_read::{self, FragmentRecovery};
use crate::pool::repair::live_list::{self, LiveList};
use crate::volume::map::Mapping;

/// A live fragment touching a chunk and what it holds: its units as the
/// fragment's checksum vouches for them, or `None` when neither the device
/// nor its redundancy has them.
struct KnownFragment {
    location: Location,
    units: Option<Vec<u8>>,
}

/// The live fragments touching one scrub chunk's blocks, by location.
#[derive(Default)]
pub(super) struct ChunkFragments {
    fragments: Vec<KnownFragment>,
}

impl ChunkFragments {
    /// Whether `contents` (read or rebuilt at `physical_block`) holds, where
    /// each live fragment lies, the bytes the fragment's checksum vouches
    /// for. A fragment whose bytes are unknown checks nothing.
    pub(super) fn block_passes(&self, physical_block: u64, contents: &[u8]) -> bool {
        self.touching(physical_block).iter().all(|fragment| {
            let (Some(units), Some(part)) = (
                &fragment.units,
                fragment.location.part_in_block(physical_block),
            ) else {
                return true;
            };
            // The fragment's bytes before this block's part: those in the
            // block before, when it continues from there.
            let units_before = if fragment.location.block() < physical_block {
                BLOCK_BYTES - fragment.location.byte_range().start
            } else {
                0
            };
            contents[part.clone()] == units[units_before..units_before + part.len()]
        })
    }

    fn touching(&self, physical_block: u64) -> &[KnownFragment] {
        live_list::touching(
            &self.fragments,
            |fragment| fragment.location,
            physical_block..physical_block + 1,
        )
    }
}

/// What reading one fragment found.
enum Outcome {
    Passes,
    /// It failed, and its blocks were rebuilt and rewritten.
    Repaired,
    /// It failed, and a rebuild passes: the row check rewrites it.
    Rebuilt,
    Fails,
}

/// Establishes what the live fragments touching one scrub chunk hold.
pub(super) struct FragmentCheck<'a> {
    core: &'a Arc<Core>,
    list: &'a LiveList,
}

impl<'a> FragmentCheck<'a> {
    pub(super) fn new(core: &'a Arc<Core>, list: &'a LiveList) -> Self {
        Self { core, list }
    }

    /// Reads every live fragment touching the chunk of blocks
    /// `first_block..end_block` and establishes its bytes (see the module
    /// documentation). A fragment is counted (scrubbed, repaired or
    /// unrepairable) with the chunk that holds its first block.
    pub(super) async fn establish(&self, first_block: u64, end_block: u64) -> ChunkFragments {
        let mut known = ChunkFragments::default();
        for mapping in self.list.fragments_touching(first_block, end_block) {
            let location = mapping.location;
            let (outcome, units) = self.check(mapping).await;
            known.fragments.push(KnownFragment { location, units });
            if location.block() >= first_block {
                self.count(mapping, outcome);
            }
        }
        known
    }

    fn count(&self, mapping: &Mapping, outcome: Outcome) {
        let location = mapping.location;
        let scrubber = self.core.scrub();
        scrubber.blocks_scrubbed.fetch_add(1, Ordering::Relaxed);
        match outcome {
            Outcome::Passes | Outcome::Rebuilt => {}
            Outcome::Repaired => {
                tracing::warn!(%location, "scrub rebuilt a fragment that failed its checks");
                self.core.integrity().checksum_error_repaired();
                scrubber.blocks_repaired.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Fails if self.list.block_died(self.core, mapping) => {}
            Outcome::Fails => {
                tracing::error!(%location, "scrub found a fragment that fails its checks and cannot be rebuilt");
                self.core.integrity().read_checksum_error();
                scrubber.blocks_unrepairable.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Reads one live fragment and checks it, rebuilding its blocks from
    /// redundancy when its checksum fails; its units when they are known.
    async fn check(&self, mapping: &Mapping) -> (Outcome, Option<Vec<u8>>) {
        let location = mapping.location;
        let read = self
            .core
            .device()
            .read(
                location.block() * BLOCK_SIZE_BYTES,
                location.block_count() as usize * BLOCK_BYTES,
            )
            .await;
        let Ok(mut blocks) = read else {
            return (Outcome::Fails, None);
        };
        let units = |blocks: &[u8]| blocks[location.byte_range()].to_vec();
        let mut decoded = [0u8; BLOCK_BYTES];
        if fragment_read::decode(location, &blocks, mapping.checksum, &mut decoded).is_ok() {
            return (Outcome::Passes, Some(units(&blocks)));
        }
        let device = &**self.core.device();
        let recovery =
            fragment_read::recover_fragment_blocks(device, location, mapping.checksum, &mut blocks)
                .await;
        let decodes =
            fragment_read::decode(location, &blocks, mapping.checksum, &mut decoded).is_ok();
        match recovery {
            FragmentRecovery::Repaired if decodes => (Outcome::Repaired, Some(units(&blocks))),
            FragmentRecovery::Reconstructed if decodes => (Outcome::Rebuilt, Some(units(&blocks))),
            _ => (Outcome::Fails, None),
        }
    }
}
