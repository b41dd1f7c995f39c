//! Reading compressed blocks (issue 44, decision 0070): a fragment's one or
//! two device blocks read in one request, its checksum checked before
//! decoding and the decoded block's after. A fragment that fails its
//! checksum is a move (the map points elsewhere now: read again) or damage:
//! each block it touches is rebuilt from the device's redundancy in turn,
//! keeping a candidate that makes the fragment match, and otherwise the read
//! of that logical block fails. Fragments are not kept in the memory cache
//! (the compressed cache is a later slice).

use std::cell::RefCell;
use std::sync::Arc;

use crate::error::{EngineError, IoError};
use crate::log::fragment::{FragmentDecoder, FragmentError, fragment_units};
use crate::log::location::Location;
use crate::pool::core::Core;
use crate::volume::View;
use crate::{BLOCK_BYTES, BLOCK_SIZE_BYTES};

use super::read::BlockSpan;

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

/// A fragment a read plans to fetch from the device.
#[derive(Clone, Copy, Debug)]
pub(in crate::pool) struct FragmentRead {
    pub logical_block: u64,
    pub location: Location,
    pub checksum: u32,
}

/// How a fragment's read ended.
enum FragmentOutcome {
    Decoded(Box<[u8; BLOCK_BYTES]>),
    Moved,
}

impl Core {
    /// Reads `fragments` (all at once), copying each decoded block's part of
    /// the request into `buffer` (the request starts at byte `offset`);
    /// returns the logical blocks that moved under the read.
    pub(in crate::pool) async fn read_fragments(
        self: &Arc<Self>,
        view: View,
        offset: u64,
        fragments: &[FragmentRead],
        buffer: &mut [u8],
    ) -> Result<Vec<u64>, EngineError> {
        let reads = fragments
            .iter()
            .map(|fragment| self.read_fragment(view, *fragment));
        let outcomes = futures::future::join_all(reads).await;
        let mut moved = Vec::new();
        for (fragment, outcome) in fragments.iter().zip(outcomes) {
            match outcome? {
                FragmentOutcome::Moved => moved.push(fragment.logical_block),
                FragmentOutcome::Decoded(block) => {
                    let span = BlockSpan::of(offset, buffer.len(), fragment.logical_block);
                    buffer[span.request_range()].copy_from_slice(&block[span.block_range()]);
                }
            }
        }
        Ok(moved)
    }

    async fn read_fragment(
        self: &Arc<Self>,
        view: View,
        fragment: FragmentRead,
    ) -> Result<FragmentOutcome, EngineError> {
        let location = fragment.location;
        let mut blocks = self
            .device()
            .read(
                location.block() * BLOCK_SIZE_BYTES,
                location.block_count() as usize * BLOCK_BYTES,
            )
            .await?;
        let mut output = Box::new([0u8; BLOCK_BYTES]);
        let error = match decode(location, &blocks, fragment.checksum, &mut output) {
            Ok(()) => return Ok(FragmentOutcome::Decoded(output)),
            Err(error) => error,
        };
        if self.fragment_moved(view, fragment) {
            return Ok(FragmentOutcome::Moved);
        }
        if matches!(error, FragmentError::ChecksumMismatch { .. })
            && self.recover_fragment(fragment, &mut blocks).await
            && decode(location, &blocks, fragment.checksum, &mut output).is_ok()
        {
            return Ok(FragmentOutcome::Decoded(output));
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

    /// Rebuilds each block the fragment touches from the device's
    /// redundancy in turn (the device rewrites the bad copy), keeping the
    /// first candidate that makes the fragment's units match its checksum;
    /// `blocks` then holds it. False when the device has no redundancy or no
    /// candidate matches.
    async fn recover_fragment(self: &Arc<Self>, fragment: FragmentRead, blocks: &mut [u8]) -> bool {
        let location = fragment.location;
        for index in 0..location.block_count() as usize {
            let block_range = index * BLOCK_BYTES..(index + 1) * BLOCK_BYTES;
            let others = blocks.to_vec();
            let is_valid = move |candidate: &[u8]| {
                let mut trial = others.clone();
                trial[block_range.clone()].copy_from_slice(candidate);
                fragment_units(location, &trial)
                    .is_ok_and(|units| crc32c::crc32c(units) == fragment.checksum)
            };
            let offset = (location.block() + index as u64) * BLOCK_SIZE_BYTES;
            match self.device().recover_block(offset, &is_valid).await {
                Ok(Some(good)) => {
                    blocks[index * BLOCK_BYTES..(index + 1) * BLOCK_BYTES].copy_from_slice(&good);
                    tracing::warn!(%location, "fragment failed its checksum and was repaired from redundancy");
                    self.integrity().checksum_error_repaired();
                    return true;
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::error!(%error, %location, "rebuilding a damaged fragment's block failed");
                }
            }
        }
        false
    }
}
