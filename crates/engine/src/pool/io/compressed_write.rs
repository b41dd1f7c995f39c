//! A client block of a volume that compresses (issue 44, decision 0070):
//! encoded as a fragment and appended as a `Packed` record, or appended
//! whole when the codec saves less than 1/8. One encoder per thread and
//! codec, so that encoding reuses the codec's context and buffer.
//!
//! The block is encoded **before** the state lock is taken, with the codec
//! this thread last saw the volume use ([`prepare`]: a hint kept per
//! thread, [`remember_codec`]), so that the codec's CPU stays out of the
//! lock's hold and two writers encode at once. Under the lock the volume's
//! codec is read as before; a block prepared with another codec (the codec
//! changed since, or the thread has not seen the volume yet) is encoded
//! there, as it always was. A block's codec is a preference for new writes,
//! and either codec stores the block exactly, so a write that races a
//! change of codec may take either.

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
    /// The codec of the volumes this thread wrote last, newest last.
    static CODEC_HINTS: RefCell<Vec<CodecHint>> = const { RefCell::new(Vec::new()) };
}

/// Volumes whose codec a thread remembers at most: a hint missing costs
/// only the encoding under the lock.
pub(in crate::pool) const CODEC_HINTS_PER_THREAD_MAX: usize = 64;

/// The codec a thread saw a volume use.
#[derive(Clone, Copy, Debug)]
struct CodecHint {
    volume_id: u32,
    codec: Codec,
}

/// A client block encoded before the lock, with the codec it was encoded
/// with.
pub(in crate::pool) struct PreparedBlock {
    codec: Codec,
    form: PreparedForm,
}

enum PreparedForm {
    /// The fragment's bytes (whole units) and their crc32c.
    Fragment { bytes: Vec<u8>, checksum: u32 },
    /// The codec saves too little (or failed): stored whole.
    Whole,
}

/// Remembers, for this thread, that `volume_id` compresses with `codec`
/// (read under the lock by the write that calls this).
pub(in crate::pool) fn remember_codec(volume_id: u32, codec: Codec) {
    CODEC_HINTS.with_borrow_mut(|hints| {
        if let Some(position) = hints.iter().position(|hint| hint.volume_id == volume_id) {
            hints.remove(position);
        } else if hints.len() == CODEC_HINTS_PER_THREAD_MAX {
            hints.remove(0);
        }
        hints.push(CodecHint { volume_id, codec });
    });
}

/// The codec this thread last saw `volume_id` use, if it compresses: the
/// codec to [`prepare`] its blocks with before the lock.
pub(in crate::pool) fn hinted_codec(volume_id: u32) -> Option<Codec> {
    CODEC_HINTS
        .with_borrow(|hints| {
            hints
                .iter()
                .rev()
                .find(|hint| hint.volume_id == volume_id)
                .map(|hint| hint.codec)
        })
        .filter(|codec| *codec != Codec::Off)
}

/// `contents` encoded with `codec`, before the lock.
pub(in crate::pool) fn prepare(codec: Codec, contents: &[u8]) -> PreparedBlock {
    let contents: &[u8; BLOCK_BYTES] = contents.try_into().expect("a client block is 4 KiB");
    let form = with_encoder(codec, |encoder| {
        match encoder.map(|encoder| encoder.encode(contents)) {
            Some(Ok(EncodedBlock::Fragment(fragment))) => PreparedForm::Fragment {
                bytes: fragment.bytes().to_vec(),
                checksum: fragment.checksum(),
            },
            Some(Ok(EncodedBlock::AsIs)) | None => PreparedForm::Whole,
            Some(Err(error)) => {
                tracing::warn!(%codec, %error, "compression failed: the block is stored whole");
                PreparedForm::Whole
            }
        }
    });
    PreparedBlock { codec, form }
}

/// Runs `work` with this thread's encoder for `codec` (`None` when the
/// codec's library could not make one).
fn with_encoder<T>(codec: Codec, work: impl FnOnce(Option<&mut FragmentEncoder>) -> T) -> T {
    ENCODERS.with_borrow_mut(|encoders| {
        let index = match encoders.iter().position(|encoder| encoder.codec() == codec) {
            Some(index) => Some(index),
            None => match FragmentEncoder::new(codec) {
                Ok(encoder) => {
                    encoders.push(encoder);
                    Some(encoders.len() - 1)
                }
                Err(error) => {
                    tracing::warn!(%codec, %error, "no encoder: the block is stored whole");
                    None
                }
            },
        };
        work(index.map(|index| &mut encoders[index]))
    })
}

/// One client block to append.
pub(in crate::pool) struct ClientBlock<'a> {
    pub volume_id: u32,
    pub logical_block: u64,
    pub contents: &'a [u8],
    /// The crc32c of `contents`, computed before the lock was taken.
    pub checksum: u32,
}

/// Appends `block` to `state` with `codec` (the volume's, read under the
/// lock): a fragment if it compresses, whole otherwise (and whole if the
/// codec's library fails, which loses nothing but the saving). A block
/// `prepared` with that codec is appended as prepared; otherwise it is
/// encoded here.
pub(in crate::pool) fn append_block(
    state: &mut State,
    codec: Codec,
    block: ClientBlock<'_>,
    prepared: Option<PreparedBlock>,
    sealed: &mut Vec<Arc<InFlightBatch>>,
) -> Result<(), EngineError> {
    if codec == Codec::Off {
        return append_whole(state, block, sealed);
    }
    // Prepared with another codec, or not at all: encoded here, under the
    // lock (the thread's first write to the volume, or a change of codec).
    let prepared = match prepared {
        Some(prepared) if prepared.codec == codec => prepared,
        _ => prepare(codec, block.contents),
    };
    match prepared.form {
        PreparedForm::Fragment { bytes, checksum } => state.append_packed(
            block.volume_id,
            block.logical_block,
            &bytes,
            checksum,
            sealed,
        ),
        PreparedForm::Whole => append_whole(state, block, sealed),
    }
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
