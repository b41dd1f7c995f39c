//! The replies of one connection that are ready but not yet on the socket,
//! oldest first, written by vectored writes straight from their pieces: a
//! read's data goes from its buffer to the socket with no copy in between
//! (decision 0044). Every write gathers the pieces of as many ready replies as
//! fit in [`WRITE_SLICES_MAX`] slices, so a burst of small replies still
//! shares one system call, as it did through a write buffer.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;

use super::messages::Outgoing;

/// Slices gathered into one vectored write: a 4 KiB read's reply is two
/// pieces, so one write carries up to 32 such replies (128 KiB).
pub(super) const WRITE_SLICES_MAX: usize = 64;

/// Linux's `IOV_MAX`: a longer slice list would be refused by `writev`.
const IOV_MAX: usize = 1024;
const _: () = assert!(WRITE_SLICES_MAX <= IOV_MAX);

/// Ready replies and how far the oldest has been written.
#[derive(Default)]
pub(super) struct Replies {
    ready: VecDeque<Outgoing>,
    /// The piece of the oldest reply being written.
    piece_index: usize,
    /// Bytes of that piece already written.
    piece_written_bytes: usize,
    /// Bytes were written since the last successful flush (which matters for
    /// a TLS stream, which may hold written bytes back until flushed).
    unflushed: bool,
}

impl Replies {
    pub(super) fn push(&mut self, outgoing: Outgoing) {
        self.ready.push_back(outgoing);
    }

    /// No reply waits and everything written was flushed.
    pub(super) fn is_empty(&self) -> bool {
        self.ready.is_empty() && !self.unflushed
    }

    /// Takes every reply out, written in part or not at all (once writing
    /// failed for good and nobody can receive them).
    pub(super) fn take_all(&mut self) -> VecDeque<Outgoing> {
        self.piece_index = 0;
        self.piece_written_bytes = 0;
        self.unflushed = false;
        std::mem::take(&mut self.ready)
    }

    /// Writes ready replies until none is left or the socket is full, hands
    /// each reply to `written` once all of it is on the socket, then flushes.
    /// True when it moved.
    pub(super) fn poll_write<W: AsyncWrite + ?Sized>(
        &mut self,
        mut writer: Pin<&mut W>,
        context: &mut Context<'_>,
        mut written: impl FnMut(Outgoing),
    ) -> io::Result<bool> {
        let mut moved = false;
        while !self.ready.is_empty() {
            let written_bytes = {
                let mut slices = [IoSlice::new(&[]); WRITE_SLICES_MAX];
                let slice_count = self.gather(&mut slices);
                if slice_count == 0 {
                    0
                } else {
                    match writer
                        .as_mut()
                        .poll_write_vectored(context, &slices[..slice_count])
                    {
                        Poll::Pending => return Ok(moved),
                        Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                        Poll::Ready(result) => result?,
                    }
                }
            };
            self.advance(written_bytes, &mut written);
            self.unflushed |= written_bytes > 0;
            moved = true;
        }
        if self.unflushed {
            match writer.poll_flush(context) {
                Poll::Pending => {}
                Poll::Ready(result) => {
                    result?;
                    self.unflushed = false;
                }
            }
        }
        Ok(moved)
    }

    /// Fills `slices` with the unwritten pieces of the ready replies, oldest
    /// first, skipping empty ones; returns how many it filled.
    fn gather<'a>(&'a self, slices: &mut [IoSlice<'a>; WRITE_SLICES_MAX]) -> usize {
        let mut slice_count = 0;
        for (reply_index, outgoing) in self.ready.iter().enumerate() {
            let first_piece = if reply_index == 0 {
                self.piece_index
            } else {
                0
            };
            for piece in first_piece..outgoing.pieces.len() {
                let mut bytes = outgoing.piece_bytes(piece);
                if reply_index == 0 && piece == self.piece_index {
                    bytes = &bytes[self.piece_written_bytes..];
                }
                if bytes.is_empty() {
                    continue;
                }
                if slice_count == WRITE_SLICES_MAX {
                    return slice_count;
                }
                slices[slice_count] = IoSlice::new(bytes);
                slice_count += 1;
            }
        }
        slice_count
    }

    /// Moves past `bytes` written bytes; every reply they complete goes to
    /// `written`, in order.
    fn advance(&mut self, mut bytes: usize, written: &mut impl FnMut(Outgoing)) {
        while let Some(oldest) = self.ready.front() {
            while self.piece_index < oldest.pieces.len() {
                let remaining =
                    oldest.piece_bytes(self.piece_index).len() - self.piece_written_bytes;
                if bytes < remaining {
                    self.piece_written_bytes += bytes;
                    return;
                }
                bytes -= remaining;
                self.piece_index += 1;
                self.piece_written_bytes = 0;
            }
            self.piece_index = 0;
            let finished = self.ready.pop_front().expect("the oldest reply is there");
            written(finished);
        }
        assert_eq!(bytes, 0, "a writer reported more bytes than it was given");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::messages::{InlineBytes, Piece};

    fn reply(header: &[u8], data: &[u8]) -> Outgoing {
        Outgoing {
            pieces: smallvec::smallvec![
                Piece::Inline(InlineBytes::of(&[header])),
                Piece::Data(0..data.len()),
            ],
            data: data.to_vec(),
            budget_bytes: 0,
            counted: None,
        }
    }

    /// A writer that takes at most `bytes_per_write` bytes per call.
    struct Trickle {
        taken: Vec<u8>,
        bytes_per_write: usize,
        write_count: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            self: Pin<&mut Self>,
            context: &mut Context<'_>,
            buffer: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.poll_write_vectored(context, &[IoSlice::new(buffer)])
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _context: &mut Context<'_>,
            slices: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            self.write_count += 1;
            let mut budget = self.bytes_per_write;
            let mut taken = 0;
            for slice in slices {
                let part = slice.len().min(budget);
                self.taken.extend_from_slice(&slice[..part]);
                budget -= part;
                taken += part;
            }
            Poll::Ready(Ok(taken))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _context: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _context: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn write_all(replies: &mut Replies, bytes_per_write: usize) -> (Vec<u8>, usize, Vec<u8>) {
        let mut writer = Trickle {
            taken: Vec::new(),
            bytes_per_write,
            write_count: 0,
        };
        let mut finished = Vec::new();
        let waker = std::task::Waker::noop();
        let mut context = Context::from_waker(waker);
        let moved = replies
            .poll_write(Pin::new(&mut writer), &mut context, |outgoing| {
                finished.push(outgoing.data.first().copied().unwrap_or(u8::MAX));
            })
            .unwrap();
        assert!(moved);
        assert!(replies.is_empty());
        (writer.taken, writer.write_count, finished)
    }

    #[test]
    fn replies_go_out_whole_and_in_order_however_the_writer_splits_them() {
        for bytes_per_write in [1, 3, 7, 4096, 1 << 20] {
            let mut replies = Replies::default();
            let mut expected = Vec::new();
            for index in 0..40u8 {
                let header = [index; 16];
                let data = vec![index; 100 + usize::from(index)];
                expected.extend_from_slice(&header);
                expected.extend_from_slice(&data);
                replies.push(reply(&header, &data));
            }
            let (taken, write_count, finished) = write_all(&mut replies, bytes_per_write);
            assert_eq!(taken, expected, "{bytes_per_write} bytes per write");
            assert_eq!(finished, (0..40).collect::<Vec<u8>>());
            if bytes_per_write == 1 << 20 {
                // 80 pieces at 64 slices per write: two writes.
                assert_eq!(write_count, 2);
            }
        }
    }

    #[test]
    fn a_reply_of_empty_pieces_is_finished_without_a_write() {
        let mut replies = Replies::default();
        replies.push(reply(&[], &[]));
        let (taken, write_count, finished) = write_all(&mut replies, 10);
        assert!(taken.is_empty());
        assert_eq!(write_count, 0);
        assert_eq!(finished, vec![u8::MAX], "the reply was finished");
    }
}
