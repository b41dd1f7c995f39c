//! The messages between a connection and its requests: an admitted request
//! ([`Job`]) with what every request runs with ([`Services`]), and its reply
//! ([`Outgoing`], pieces written without interleaving, read data never
//! copied on the way out), with what to count of it once written
//! ([`Counted`]). Shared by the request handlers (`transmission.rs`) and the
//! connection task (`connection.rs`), which is why it is a module of its own.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use smallvec::{SmallVec, smallvec};

use crate::backend::Export;
use crate::buffer_pool::BufferPool;
use crate::statistics::{ExportStatistics, Operation};
use crate::wire::{self, Command, RequestHeader, TransmissionContext};

/// The longest reply header kept inline in a [`Piece`]: a hole chunk (32
/// bytes) or a data chunk's header with its offset (28).
pub(super) const INLINE_PIECE_BYTES_MAX: usize = 32;

/// A short reply header held in place, so that answering a request does not
/// allocate for it.
pub(super) struct InlineBytes {
    pub(super) bytes: [u8; INLINE_PIECE_BYTES_MAX],
    pub(super) length: usize,
}

impl InlineBytes {
    pub(super) fn of(parts: &[&[u8]]) -> Self {
        let mut inline = InlineBytes {
            bytes: [0; INLINE_PIECE_BYTES_MAX],
            length: 0,
        };
        for part in parts {
            let end = inline.length + part.len();
            assert!(
                end <= INLINE_PIECE_BYTES_MAX,
                "an inline piece is a reply header"
            );
            inline.bytes[inline.length..end].copy_from_slice(part);
            inline.length = end;
        }
        inline
    }

    pub(super) fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.length]
    }
}

/// One piece of an outgoing message: bytes of its own (a short header held
/// inline, or longer bytes), or a range of the message's data buffer (so
/// read data is never copied on the way out).
pub(super) enum Piece {
    Inline(InlineBytes),
    Bytes(Vec<u8>),
    Data(Range<usize>),
}

/// Pieces held in an [`Outgoing`] itself: a read's reply is a chunk header and
/// its data, any other reply one piece; longer replies (a read with holes)
/// spill to the heap.
pub(super) const INLINE_PIECE_COUNT: usize = 2;

/// The pieces of one reply.
pub(super) type Pieces = SmallVec<[Piece; INLINE_PIECE_COUNT]>;

/// A complete reply, written to the socket without interleaving.
pub(super) struct Outgoing {
    pub(super) pieces: Pieces,
    /// Read data (from the connection's [`BufferPool`], returned to it once
    /// written).
    pub(super) data: Vec<u8>,
    /// Bytes of the in-flight budget its request holds (besides one request
    /// of the request budget) until it is written, which bounds buffered
    /// replies.
    pub(super) budget_bytes: u32,
    /// A read or write to count in the export's statistics once written.
    pub(super) counted: Option<Counted>,
}

/// A read or write request as the export's statistics count it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Counted {
    pub(super) operation: Operation,
    pub(super) bytes: u32,
    /// When its header arrived; none when latency is not measured.
    pub(super) arrived: Option<Instant>,
}

impl Counted {
    /// What to count of `command`, which arrived at `arrived`: reads and
    /// writes only.
    pub(super) fn of(command: Command, arrived: Option<Instant>) -> Option<Counted> {
        let (operation, bytes) = match command {
            Command::Read { length, .. } => (Operation::Read, length),
            Command::Write { length, .. } => (Operation::Write, length),
            _ => return None,
        };
        Some(Counted {
            operation,
            bytes,
            arrived,
        })
    }

    pub(super) fn record(&self, statistics: &ExportStatistics) {
        let latency_ns = self
            .arrived
            .map(|arrived| u64::try_from(arrived.elapsed().as_nanos()).unwrap_or(u64::MAX));
        statistics.record(self.operation, u64::from(self.bytes), latency_ns);
    }
}

impl Outgoing {
    /// The bytes of piece `index`.
    pub(super) fn piece_bytes(&self, index: usize) -> &[u8] {
        match &self.pieces[index] {
            Piece::Inline(inline) => inline.as_slice(),
            Piece::Bytes(bytes) => bytes,
            Piece::Data(range) => &self.data[range.clone()],
        }
    }

    pub(super) fn bytes(bytes: Vec<u8>) -> Self {
        Outgoing {
            pieces: smallvec![Piece::Bytes(bytes)],
            data: Vec::new(),
            budget_bytes: 0,
            counted: None,
        }
    }

    pub(super) fn inline(bytes: &[u8]) -> Self {
        Outgoing {
            pieces: smallvec![Piece::Inline(InlineBytes::of(&[bytes]))],
            data: Vec::new(),
            budget_bytes: 0,
            counted: None,
        }
    }
}

/// What every request of one connection runs with.
pub(super) struct Services {
    pub(super) export: Arc<dyn Export>,
    pub(super) context: TransmissionContext,
    /// Payload buffers, taken by the reader and by reads, returned once a
    /// reply is written.
    pub(super) buffers: BufferPool,
    pub(super) block_status_descriptors_max: u32,
}

/// An admitted request, its write payload read.
pub(super) struct Job {
    pub(super) header: RequestHeader,
    pub(super) command: Command,
    pub(super) payload: Vec<u8>,
    pub(super) counted: Option<Counted>,
    /// Bytes of the in-flight budget it holds until its reply is written.
    pub(super) budget_bytes: u32,
}

/// The size of a buffer for a request of `length` bytes. Every supported
/// target has a usize of at least 32 bits.
pub(super) fn buffer_len(length: u32) -> usize {
    usize::try_from(length).expect("a usize holds any u32 on supported targets")
}

pub(super) fn error_reply(
    context: &TransmissionContext,
    header: &RequestHeader,
    errno: u32,
    message: &str,
) -> Vec<u8> {
    if context.structured_replies {
        wire::encode_error_chunk(header.cookie, errno, message)
    } else {
        wire::encode_simple_reply(errno, header.cookie).to_vec()
    }
}

pub(super) fn success_reply(header: &RequestHeader) -> Outgoing {
    // A simple reply is allowed for every payload-less success, structured or not.
    Outgoing::inline(&wire::encode_simple_reply(0, header.cookie))
}
