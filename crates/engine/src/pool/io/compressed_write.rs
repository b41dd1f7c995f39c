//! A client block of a volume that compresses (issue 44, decision 0070):
//! encoded as a fragment and appended as a `Packed` record, or appended
//! whole when the codec saves less than 1/8. One encoder per thread and
//! codec, so that encoding reuses the codec's context and buffer.
//!
//! The block is encoded under the state lock, where the volume's codec is
//! read: simple and correct, at the cost of the codec's CPU inside the
//! lock's hold for compressing volumes (measured in BENCHMARKS.md,
//! "Compression in the write path"); volumes that do not compress pay
//! nothing.

use std::cell::RefCell;
use std::sync::Arc;

use lamina_reduction::Codec;

use crate::BLOCK_BYTES;
use crate::error::EngineError;
use crate::log::fragment::{EncodedBlock, FragmentEncoder};
use crate::pool::core::state::State;
use crate::pool::io::writer::InFlightBatch;

thread_local! {
    /// The encoders this thread made, one per codec it met.
    static ENCODERS: RefCell<Vec<FragmentEncoder>> = const { RefCell::new(Vec::new()) };
}

/// One client block to append.
pub(in crate::pool) struct ClientBlock<'a> {
    pub volume_id: u32,
    pub logical_block: u64,
    pub contents: &'a [u8],
    /// The crc32c of `contents`, computed before the lock was taken.
    pub checksum: u32,
}

/// Appends `block` to `state` with `codec`: a fragment if it compresses,
/// whole otherwise (and whole if the codec's library fails, which loses
/// nothing but the saving).
pub(in crate::pool) fn append_block(
    state: &mut State,
    codec: Codec,
    block: ClientBlock<'_>,
    sealed: &mut Vec<Arc<InFlightBatch>>,
) -> Result<(), EngineError> {
    if codec == Codec::Off {
        return append_whole(state, block, sealed);
    }
    let contents: &[u8; BLOCK_BYTES] = block.contents.try_into().expect("a client block is 4 KiB");
    ENCODERS.with_borrow_mut(|encoders| {
        let index = match encoders.iter().position(|encoder| encoder.codec() == codec) {
            Some(index) => index,
            None => match FragmentEncoder::new(codec) {
                Ok(encoder) => {
                    encoders.push(encoder);
                    encoders.len() - 1
                }
                Err(error) => {
                    tracing::warn!(%codec, %error, "no encoder: the block is stored whole");
                    return append_whole(state, block, sealed);
                }
            },
        };
        match encoders[index].encode(contents) {
            Ok(EncodedBlock::Fragment(fragment)) => state.append_packed(
                block.volume_id,
                block.logical_block,
                fragment.bytes(),
                fragment.checksum(),
                sealed,
            ),
            Ok(EncodedBlock::AsIs) => append_whole(state, block, sealed),
            Err(error) => {
                tracing::warn!(%codec, %error, "compression failed: the block is stored whole");
                append_whole(state, block, sealed)
            }
        }
    })
}

fn append_whole(
    state: &mut State,
    block: ClientBlock<'_>,
    sealed: &mut Vec<Arc<InFlightBatch>>,
) -> Result<(), EngineError> {
    state.append_data(
        block.volume_id,
        block.logical_block,
        block.contents,
        block.checksum,
        sealed,
    )
}
