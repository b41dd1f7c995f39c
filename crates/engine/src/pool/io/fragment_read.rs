//! Reading compressed blocks (issue 44, decision 0070): a fragment's one or
//! two device blocks read in one request, its checksum checked before
//! decoding and the decoded block's after. A fragment that fails its
//! checksum is a move (the map points elsewhere now: read again) or damage:
//! each block it touches is rebuilt from the device's redundancy in turn,
//! keeping a candidate that makes the fragment match, and otherwise the read
//! of that logical block fails.
//!
//! The memory cache holds the device blocks fragments are packed in, as
//! they are (batches enter it when written, blocks read for a fragment
//! after the read): a 4 KiB slot holds every fragment packed in that block,
//! so the cache holds compressed data and a hit costs a decode. A packed
//! block never changes while its segment lives, and the cache forgets a
//! segment's blocks when the segment is freed. A fragment decoded from a
//! cache hit is also kept decoded, within a share of the cache, so that
//! its next hits cost no decode (decision 0075): the read path
//! (`read.rs`) takes those before it comes here.
//!
//! In a two-tier pool a fragment heat says to promote comes back with its
//! units as they are (decision 0074): the read path moves them to flash as
//! a fragment, without decoding or encoding again.

use std::cell::RefCell;
use std::sync::Arc;

use lamina_device::{AlignedBuffer, BlockDevice, DeviceError};

use crate::error::{EngineError, IoError};
use crate::log::fragment::{FragmentDecoder, FragmentError, fragment_units};
use crate::log::location::{FRAGMENT_BLOCKS_MAX, Location};
use crate::pool::core::Core;
use crate::tier::memory_cache::CacheGeneration;
use crate::volume::View;
use crate::{BLOCK_BYTES, BLOCK_SIZE_BYTES};

thread_local! {
    /// This thread's decoder, made at its first fragment.
    static DECODER: RefCell<Option<FragmentDecoder>> = const { RefCell::new(None) };
}

/// Decodes the fragment at `location` from `blocks` (the blocks it touches)
/// into `output`, with this thread's decoder.
pub(in crate::pool) fn decode(
    location: Location,
    blocks: &[u8],
    checksum: u32,
    output: &mut [u8; BLOCK_BYTES],
) -> Result<(), FragmentError> {
    DECODER.with_borrow_mut(|decoder| {
        let decoder = match decoder {
            Some(decoder) => decoder,
            None => decoder.insert(FragmentDecoder::new().expect("a zstd decompression context")),
        };
        decoder.decode(location, blocks, checksum, output)
    })
}

/// A fragment a read plans to fetch from the memory cache or the device.
#[derive(Clone, Copy, Debug)]
pub(in crate::pool) struct FragmentRead {
    pub logical_block: u64,
    pub location: Location,
    pub checksum: u32,
    /// The cache generations of the blocks it touches when the read was
    /// planned (a block read afterwards is cached only if its shard saw no
    /// invalidation since).
    pub generations: [CacheGeneration; FRAGMENT_BLOCKS_MAX as usize],
    /// Whether heat says to move it to flash (a capacity fragment read
    /// recently before): its units are then handed back to be promoted.
    pub promote: bool,
}

/// A fragment read from capacity that heat says to move to flash: its
/// units as they are, checked against the map's checksum.
pub(in crate::pool) struct PromotedFragment {
    pub logical_block: u64,
    pub location: Location,
    pub units: Box<[u8]>,
}

/// What reading a request's fragments found besides the decoded blocks.
#[derive(Default)]
pub(in crate::pool) struct FragmentsRead {
    /// The logical blocks that moved under the read (read them again).
    pub moved: Vec<u64>,
    /// The fragments to promote.
    pub promoted: Vec<PromotedFragment>,
}

/// How a fragment's read ended.
enum FragmentOutcome {
    Decoded {
        block: Box<[u8; BLOCK_BYTES]>,
        /// The fragment's units, when it is to be promoted.
        units: Option<Box<[u8]>>,
    },
    Moved,
}

/// The units of `fragment` within `blocks` (the blocks it touches, checked
/// already), kept when it is to be promoted.
fn units_to_promote(fragment: FragmentRead, blocks: &[u8]) -> Option<Box<[u8]>> {
    if !fragment.promote {
        return None;
    }
    fragment_units(fragment.location, blocks)
        .ok()
        .map(Box::from)
}

impl Core {
    /// Reads `fragments` (all at once), giving each decoded block to
    /// `decoded` with its logical block; returns the logical blocks that
    /// moved under the read and the fragments to promote.
    pub(in crate::pool) async fn read_fragments(
        self: &Arc<Self>,
        view: View,
        fragments: &[FragmentRead],
        decoded: &mut (dyn FnMut(u64, &[u8; BLOCK_BYTES]) + Send),
    ) -> Result<FragmentsRead, EngineError> {
        let reads = fragments
            .iter()
            .map(|fragment| self.read_fragment(view, *fragment));
        let outcomes = futures::future::join_all(reads).await;
        let mut read = FragmentsRead::default();
        for (fragment, outcome) in fragments.iter().zip(outcomes) {
            match outcome? {
                FragmentOutcome::Moved => read.moved.push(fragment.logical_block),
                FragmentOutcome::Decoded { block, units } => {
                    decoded(fragment.logical_block, &block);
                    if let Some(units) = units {
                        read.promoted.push(PromotedFragment {
                            logical_block: fragment.logical_block,
                            location: fragment.location,
                            units,
                        });
                    }
                }
            }
        }
        Ok(read)
    }

    async fn read_fragment(
        self: &Arc<Self>,
        view: View,
        fragment: FragmentRead,
    ) -> Result<FragmentOutcome, EngineError> {
        let location = fragment.location;
        let mut output = Box::new([0u8; BLOCK_BYTES]);
        if let Some(units) = self.decode_from_cache(fragment, &mut output) {
            // Read again from the cache: perhaps kept decoded for the next reads.
            self.cache().offer_decoded(
                location,
                fragment.checksum,
                &output,
                fragment.generations[0],
            );
            return Ok(FragmentOutcome::Decoded {
                block: output,
                units,
            });
        }
        let mut blocks = self
            .device()
            .read(
                location.block() * BLOCK_SIZE_BYTES,
                location.block_count() as usize * BLOCK_BYTES,
            )
            .await?;
        let error = match decode(location, &blocks, fragment.checksum, &mut output) {
            Ok(()) => {
                let cached_blocks = blocks.chunks_exact(BLOCK_BYTES).zip(location.block()..);
                for ((contents, block), generation) in cached_blocks.zip(fragment.generations) {
                    self.cache().insert_read(block, contents, generation);
                }
                return Ok(FragmentOutcome::Decoded {
                    block: output,
                    units: units_to_promote(fragment, &blocks),
                });
            }
            Err(error) => error,
        };
        if self.fragment_moved(view, fragment) {
            return Ok(FragmentOutcome::Moved);
        }
        if matches!(error, FragmentError::ChecksumMismatch { .. })
            && self.recover_fragment(fragment, &mut blocks).await
            && decode(location, &blocks, fragment.checksum, &mut output).is_ok()
        {
            // Repaired: promoting the repaired units is left to a later read.
            return Ok(FragmentOutcome::Decoded {
                block: output,
                units: None,
            });
        }
        let volume = self.view_name(view);
        tracing::error!(%volume, logical_block = fragment.logical_block, %error, "fragment damaged");
        self.integrity().read_checksum_error();
        Err(EngineError::Io(IoError::FragmentDamaged {
            volume,
            logical_block: fragment.logical_block,
            source: error,
        }))
    }

    /// Decodes `fragment` from the memory cache if every block it touches
    /// is there and the fragment checks out (a stale or damaged copy is a
    /// miss: the device is read); then `Some`, with its units when it is to
    /// be promoted.
    fn decode_from_cache(
        &self,
        fragment: FragmentRead,
        output: &mut [u8; BLOCK_BYTES],
    ) -> Option<Option<Box<[u8]>>> {
        let location = fragment.location;
        let mut blocks = [0u8; FRAGMENT_BLOCKS_MAX as usize * BLOCK_BYTES];
        let touched = &mut blocks[..location.block_count() as usize * BLOCK_BYTES];
        let cache = self.cache();
        let hit = touched
            .chunks_exact_mut(BLOCK_BYTES)
            .zip(location.block()..)
            .all(|(contents, block)| cache.get(block, contents))
            && decode(location, touched, fragment.checksum, output).is_ok();
        hit.then(|| units_to_promote(fragment, touched))
    }

    /// Whether the view's map no longer holds `fragment` at its logical block.
    fn fragment_moved(&self, view: View, fragment: FragmentRead) -> bool {
        let state = self.lock();
        state
            .volumes()
            .view(view)
            .and_then(|found| found.map.get(fragment.logical_block))
            .is_none_or(|now| {
                now.location != fragment.location || now.checksum != fragment.checksum
            })
    }

    /// Rebuilds the damaged fragment's blocks from the device's redundancy
    /// ([`recover_fragment_blocks`]) and counts a repair; false when
    /// nothing passes.
    async fn recover_fragment(self: &Arc<Self>, fragment: FragmentRead, blocks: &mut [u8]) -> bool {
        let location = fragment.location;
        match recover_fragment_blocks(&**self.device(), location, fragment.checksum, blocks).await {
            FragmentRecovery::Repaired => {
                tracing::warn!(%location, "fragment failed its checksum and was repaired from redundancy");
                self.integrity().checksum_error_repaired();
                true
            }
            FragmentRecovery::Reconstructed => {
                tracing::warn!(%location, "fragment failed its checksum and was rebuilt from redundancy; its block is left for scrub to repair");
                true
            }
            FragmentRecovery::Failed => false,
        }
    }
}

/// How rebuilding a damaged fragment from redundancy ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::pool) enum FragmentRecovery {
    /// Rebuilt, and the bad copy rewritten: the rebuild differed from what
    /// was read only inside the fragment, which its checksum vouches for.
    Repaired,
    /// Rebuilt for this read, the copy left as it is: the rebuild also
    /// changed bytes outside the fragment (other fragments of the block,
    /// which this check cannot vouch for), so writing it could damage them.
    /// Scrub, which checks whole rows, repairs it.
    Reconstructed,
    Failed,
}

/// Rebuilds the one or two blocks the fragment at `location` touches from
/// `device`'s redundancy, judged by the fragment's checksum; `blocks` (as
/// read) then holds the rebuild. A block a fragment shares with others
/// makes a rebuild that passes right only inside the fragment (another
/// column may be bad where the fragment is not), so the bad copy is
/// rewritten only when the rebuild differs from what was read nowhere else
/// ([`FragmentRecovery::Repaired`]); otherwise the rebuild is served and
/// nothing written ([`FragmentRecovery::Reconstructed`]). An array tries
/// the rows' rebuilds together (`BlockDevice::recover_range`), so that two
/// bad columns under one fragment, which raid6 covers, pass too. Shared by
/// reads, scrub's check of fragments and the cleaner.
pub(in crate::pool) async fn recover_fragment_blocks(
    device: &dyn BlockDevice,
    location: Location,
    checksum: u32,
    blocks: &mut [u8],
) -> FragmentRecovery {
    assert_eq!(
        blocks.len(),
        location.block_count() as usize * BLOCK_BYTES,
        "the blocks a fragment touches"
    );
    let offset = location.block() * BLOCK_SIZE_BYTES;
    let units = location.byte_range();
    let passes = |candidate: &[u8]| crc32c::crc32c(&candidate[units.clone()]) == checksum;
    let as_read = blocks.to_vec();
    let changes_only_the_fragment = |candidate: &[u8]| {
        passes(candidate)
            && candidate[..units.start] == as_read[..units.start]
            && candidate[units.end..] == as_read[units.end..]
    };
    let repaired = device
        .recover_range(offset, blocks.len(), &changes_only_the_fragment)
        .await;
    if let Some(good) = recovered(repaired, location) {
        blocks.copy_from_slice(&good[..blocks.len()]);
        return FragmentRecovery::Repaired;
    }
    let rebuilt = device
        .reconstruct_range(offset, blocks.len(), &passes)
        .await;
    match recovered(rebuilt, location) {
        Some(good) => {
            blocks.copy_from_slice(&good[..blocks.len()]);
            FragmentRecovery::Reconstructed
        }
        None => FragmentRecovery::Failed,
    }
}

/// The rebuild a recovery returned, its error logged.
fn recovered(
    result: Result<Option<AlignedBuffer>, DeviceError>,
    location: Location,
) -> Option<AlignedBuffer> {
    result
        .inspect_err(|error| {
            tracing::error!(%error, %location, "rebuilding a damaged fragment's blocks failed");
        })
        .ok()
        .flatten()
}
