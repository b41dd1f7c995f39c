//! The transmission phase: one reader reads requests in order, each valid request
//! runs as its own task (at most `in_flight_requests_max` at once, holding at most
//! `in_flight_bytes_max` of buffers), and one writer task puts the replies on the
//! socket in whatever order they complete. Bad input closes only this connection.

use std::ops::Range;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use tokio::io::{
    AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::backend::{Export, ExportError, Extent};
use crate::config::ServerConfig;
use crate::error::ConnectionError;
use crate::negotiated::Negotiated;
use crate::wire::{self, Command, RequestHeader, TransmissionContext};

/// Socket read buffer: enough for many small request headers per system call.
const READ_BUFFER_BYTES: usize = 64 * 1024;
/// Socket write buffer: coalesces small replies; big read payloads bypass it.
const WRITE_BUFFER_BYTES: usize = 256 * 1024;
/// Holes shorter than this are sent as data: a hole chunk costs 32 bytes and a
/// split in the client's reassembly, not worth it for a few sectors.
const HOLE_CHUNK_BYTES_MIN: u64 = 4096;
/// Size of the scratch buffer used to discard the payload of a refused write.
const DISCARD_BUFFER_BYTES: usize = 64 * 1024;

/// Maps a backend error to the NBD error value sent to the client.
pub fn errno_for(error: &ExportError) -> u32 {
    match error {
        ExportError::Io(_) => wire::EIO,
        ExportError::NoSpace => wire::ENOSPC,
        ExportError::ReadOnly => wire::EPERM,
        ExportError::Invalid(_) => wire::EINVAL,
        ExportError::NotSupported => wire::ENOTSUP,
        ExportError::Shutdown => wire::ESHUTDOWN,
    }
}

/// One piece of an outgoing message: bytes of its own, or a range of the
/// message's data buffer (so read data is never copied on the way out).
enum Piece {
    Bytes(Vec<u8>),
    Data(Range<usize>),
}

/// A complete reply, written to the socket without interleaving.
struct Outgoing {
    pieces: Vec<Piece>,
    data: Vec<u8>,
    /// Released when the reply has been written, which bounds buffered replies.
    _permits: Vec<OwnedSemaphorePermit>,
}

impl Outgoing {
    fn bytes(bytes: Vec<u8>) -> Self {
        Outgoing {
            pieces: vec![Piece::Bytes(bytes)],
            data: Vec::new(),
            _permits: Vec::new(),
        }
    }
}

/// Runs the transmission phase until the client disconnects, sends bad input, or
/// `shutdown` is cancelled; in-flight requests are always completed and answered.
pub(crate) async fn run<S>(
    stream: S,
    negotiated: Negotiated,
    config: &ServerConfig,
    shutdown: CancellationToken,
) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (read_half, write_half) = tokio::io::split(stream);
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, read_half);
    let (sender, receiver) = mpsc::channel::<Outgoing>(config.in_flight_requests_max + 1);
    let broken = CancellationToken::new();
    let writer = tokio::spawn(write_replies(write_half, receiver, broken.clone()));

    let requests = Arc::new(Semaphore::new(config.in_flight_requests_max));
    let bytes = Arc::new(Semaphore::new(config.in_flight_bytes_max as usize));
    let export = negotiated.export;
    let context = negotiated.context;
    let result = read_requests(
        &mut reader,
        &export,
        &context,
        config,
        &sender,
        &requests,
        &bytes,
        &shutdown,
        &broken,
    )
    .await;
    // Every request task holds a sender; the writer ends once the last reply of
    // the last in-flight request has been written.
    drop(sender);
    let write_result = writer.await.unwrap_or_else(|join_error| {
        Err(std::io::Error::other(format!(
            "reply writer failed: {join_error}"
        )))
    });
    result?;
    write_result.map_err(ConnectionError::from)
}

#[allow(clippy::too_many_arguments)]
async fn read_requests<R>(
    reader: &mut BufReader<R>,
    export: &Arc<dyn Export>,
    context: &TransmissionContext,
    config: &ServerConfig,
    sender: &mpsc::Sender<Outgoing>,
    requests: &Arc<Semaphore>,
    bytes: &Arc<Semaphore>,
    shutdown: &CancellationToken,
    broken: &CancellationToken,
) -> Result<(), ConnectionError>
where
    R: AsyncRead + Unpin,
{
    loop {
        // Waiting for the first byte of a request is the one place where a
        // shutdown may interrupt without losing part of a request.
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => {
                tracing::debug!("shutting down: no more requests read");
                return Ok(());
            }
            _ = broken.cancelled() => return Ok(()),
            filled = reader.fill_buf() => {
                if filled?.is_empty() {
                    tracing::debug!("client closed the connection");
                    return Ok(());
                }
            }
        }
        let mut header_bytes = [0u8; wire::REQUEST_HEADER_BYTES];
        read_exact_or_truncated(reader, &mut header_bytes, "request header").await?;
        let header = wire::parse_request_header(&header_bytes)?;
        let command = match wire::validate_request(&header, context) {
            Ok(command) => command,
            Err(rejection) => {
                tracing::debug!(
                    command = header.command,
                    offset = header.offset,
                    length = header.length,
                    errno = rejection.errno,
                    message = %rejection.message,
                    "request refused"
                );
                if header.command == wire::CMD_WRITE {
                    // The payload follows whatever we think of the request.
                    discard(reader, u64::from(header.length)).await?;
                }
                let reply = error_reply(context, &header, rejection.errno, &rejection.message);
                if sender.send(Outgoing::bytes(reply)).await.is_err() {
                    return Ok(());
                }
                continue;
            }
        };
        if command == Command::Disconnect {
            tracing::debug!("client sent NBD_CMD_DISC");
            return Ok(());
        }
        let request_permit = requests
            .clone()
            .acquire_owned()
            .await
            .expect("the request semaphore is never closed");
        let mut permits = vec![request_permit];
        let buffer_bytes = match command {
            Command::Read { length, .. } | Command::Write { length, .. } => length,
            _ => 0,
        };
        if buffer_bytes > 0 {
            // One request alone may always proceed, even if it is larger than the
            // per-connection budget.
            let wanted = buffer_bytes.min(config.in_flight_bytes_max);
            permits.push(
                bytes
                    .clone()
                    .acquire_many_owned(wanted)
                    .await
                    .expect("the byte semaphore is never closed"),
            );
        }
        let payload = if let Command::Write { length, .. } = command {
            let mut payload = vec![0u8; length as usize];
            read_exact_or_truncated(reader, &mut payload, "write payload").await?;
            payload
        } else {
            Vec::new()
        };
        let export = Arc::clone(export);
        let context = *context;
        let sender = sender.clone();
        let block_status_descriptors_max = config.block_status_descriptors_max;
        tokio::spawn(async move {
            let execution = execute(
                export.as_ref(),
                &context,
                &header,
                command,
                payload,
                block_status_descriptors_max,
            );
            let mut outgoing = match AssertUnwindSafe(execution).catch_unwind().await {
                Ok(outgoing) => outgoing,
                Err(_) => {
                    tracing::error!(command = header.command, "request handler panicked");
                    Outgoing::bytes(error_reply(&context, &header, wire::EIO, "internal error"))
                }
            };
            outgoing._permits = permits;
            // The writer is gone only when the connection broke; nobody to tell.
            let _ = sender.send(outgoing).await;
        });
    }
}

async fn read_exact_or_truncated<R>(
    reader: &mut R,
    buffer: &mut [u8],
    what: &'static str,
) -> Result<(), ConnectionError>
where
    R: AsyncRead + Unpin,
{
    match reader.read_exact(buffer).await {
        Ok(_) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => {
            Err(ConnectionError::Truncated(what))
        }
        Err(error) => Err(error.into()),
    }
}

/// Reads and drops `length` bytes without holding them all in memory.
async fn discard<R>(reader: &mut R, mut length: u64) -> Result<(), ConnectionError>
where
    R: AsyncRead + Unpin,
{
    let mut scratch = vec![0u8; DISCARD_BUFFER_BYTES.min(length as usize)];
    while length > 0 {
        let step = (length as usize).min(scratch.len());
        read_exact_or_truncated(reader, &mut scratch[..step], "write payload").await?;
        length -= step as u64;
    }
    Ok(())
}

async fn write_replies<W>(
    write_half: W,
    mut receiver: mpsc::Receiver<Outgoing>,
    broken: CancellationToken,
) -> std::io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    let mut writer = BufWriter::with_capacity(WRITE_BUFFER_BYTES, write_half);
    let result = async {
        while let Some(outgoing) = receiver.recv().await {
            for piece in &outgoing.pieces {
                match piece {
                    Piece::Bytes(bytes) => writer.write_all(bytes).await?,
                    Piece::Data(range) => writer.write_all(&outgoing.data[range.clone()]).await?,
                }
            }
            drop(outgoing);
            // Flush only when nothing else is ready, so bursts of small replies
            // share system calls.
            if receiver.is_empty() {
                writer.flush().await?;
            }
        }
        writer.flush().await?;
        writer.shutdown().await
    }
    .await;
    if result.is_err() {
        // Tell the reader to stop: nobody can receive the replies any more.
        broken.cancel();
        // Keep draining so request tasks can finish and release their buffers.
        while receiver.recv().await.is_some() {}
    }
    result
}

fn error_reply(
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

fn success_reply(header: &RequestHeader) -> Outgoing {
    // A simple reply is allowed for every payload-less success, structured or not.
    Outgoing::bytes(wire::encode_simple_reply(0, header.cookie).to_vec())
}

async fn execute(
    export: &dyn Export,
    context: &TransmissionContext,
    header: &RequestHeader,
    command: Command,
    payload: Vec<u8>,
    block_status_descriptors_max: u32,
) -> Outgoing {
    let result = match command {
        Command::Read {
            offset,
            length,
            dont_fragment,
            ..
        } => return read(export, context, header, offset, length, dont_fragment).await,
        Command::BlockStatus {
            offset,
            length,
            only_one,
        } => {
            return block_status(
                export,
                context,
                header,
                offset,
                length,
                only_one,
                block_status_descriptors_max,
            )
            .await;
        }
        Command::Write { offset, fua, .. } => {
            if payload.is_empty() {
                Ok(())
            } else {
                export.write(offset, &payload, fua).await
            }
        }
        Command::Flush => export.flush().await,
        Command::Trim {
            offset,
            length,
            fua,
        } => {
            if length == 0 {
                Ok(())
            } else {
                export.trim(offset, u64::from(length), fua).await
            }
        }
        Command::Cache { offset, length } => {
            if length == 0 {
                Ok(())
            } else {
                export.cache(offset, u64::from(length)).await
            }
        }
        Command::WriteZeroes {
            offset,
            length,
            fua,
            may_punch_hole,
            fast_only,
        } => {
            if length == 0 {
                Ok(())
            } else {
                export
                    .write_zeroes(offset, u64::from(length), fua, may_punch_hole, fast_only)
                    .await
            }
        }
        Command::Disconnect => unreachable!("disconnect is handled by the reader"),
    };
    match result {
        Ok(()) => success_reply(header),
        Err(error) => backend_error(context, header, &error),
    }
}

fn backend_error(
    context: &TransmissionContext,
    header: &RequestHeader,
    error: &ExportError,
) -> Outgoing {
    tracing::debug!(command = header.command, offset = header.offset, length = header.length, %error, "backend error");
    Outgoing::bytes(error_reply(
        context,
        header,
        errno_for(error),
        &error.to_string(),
    ))
}

/// Splits `[0, length)` into runs that read as zeros (`true`) or hold data,
/// from the backend's extents; whatever the extents do not cover is data.
fn zero_runs(extents: &[Extent], length: u64) -> Vec<(Range<u64>, bool)> {
    let mut runs: Vec<(Range<u64>, bool)> = Vec::new();
    let mut position = 0u64;
    for extent in extents {
        if position >= length {
            break;
        }
        let end = position.saturating_add(extent.length).min(length);
        if end == position {
            continue;
        }
        // Holes read as zeros by the backend's contract.
        let zero = (extent.hole || extent.zero) && end - position >= HOLE_CHUNK_BYTES_MIN;
        match runs.last_mut() {
            Some((range, last_zero)) if *last_zero == zero => range.end = end,
            _ => runs.push((position..end, zero)),
        }
        position = end;
    }
    if position < length {
        match runs.last_mut() {
            Some((range, false)) => range.end = length,
            _ => runs.push((position..length, false)),
        }
    }
    runs
}

async fn read(
    export: &dyn Export,
    context: &TransmissionContext,
    header: &RequestHeader,
    offset: u64,
    length: u32,
    dont_fragment: bool,
) -> Outgoing {
    let cookie = header.cookie;
    if !context.structured_replies {
        let mut data = vec![0u8; length as usize];
        if length > 0
            && let Err(error) = export.read(offset, &mut data).await
        {
            return backend_error(context, header, &error);
        }
        return Outgoing {
            pieces: vec![
                Piece::Bytes(wire::encode_simple_reply(0, cookie).to_vec()),
                Piece::Data(0..data.len()),
            ],
            data,
            _permits: Vec::new(),
        };
    }
    if length == 0 {
        return Outgoing::bytes(
            wire::encode_chunk_header(wire::REPLY_FLAG_DONE, wire::REPLY_TYPE_NONE, cookie, 0)
                .to_vec(),
        );
    }
    let length_bytes = u64::from(length);
    let runs = if dont_fragment {
        vec![(0..length_bytes, false)]
    } else {
        match export.extents(offset, length_bytes).await {
            Ok(extents) => zero_runs(&extents, length_bytes),
            // Allocation status is an optimisation; without it everything is data.
            Err(error) => {
                tracing::debug!(%error, "extents failed; sending the read as data");
                vec![(0..length_bytes, false)]
            }
        }
    };
    let mut data = Vec::new();
    if runs.iter().any(|(_, zero)| !zero) {
        data = vec![0u8; length as usize];
        if let Err(error) = export.read(offset, &mut data).await {
            return backend_error(context, header, &error);
        }
    }
    // All data is in hand, so no error can follow: the last chunk is final.
    let last = runs.len() - 1;
    let mut pieces = Vec::with_capacity(runs.len() * 2);
    for (index, (range, zero)) in runs.into_iter().enumerate() {
        let done = index == last;
        let run_bytes =
            u32::try_from(range.end - range.start).expect("runs lie within one request");
        if zero {
            pieces.push(Piece::Bytes(
                wire::encode_hole_chunk(cookie, done, offset + range.start, run_bytes).to_vec(),
            ));
        } else {
            let mut chunk = Vec::with_capacity(28);
            chunk.extend_from_slice(&wire::encode_chunk_header(
                if done { wire::REPLY_FLAG_DONE } else { 0 },
                wire::REPLY_TYPE_OFFSET_DATA,
                cookie,
                8 + run_bytes,
            ));
            chunk.extend_from_slice(&(offset + range.start).to_be_bytes());
            pieces.push(Piece::Bytes(chunk));
            pieces.push(Piece::Data(range.start as usize..range.end as usize));
        }
    }
    Outgoing {
        pieces,
        data,
        _permits: Vec::new(),
    }
}

/// Turns backend extents into `base:allocation` descriptors: merged when the
/// status repeats, clipped to `length`, at most `descriptors_max` of them, and
/// never empty.
pub fn block_status_descriptors(
    extents: &[Extent],
    length: u32,
    only_one: bool,
    descriptors_max: u32,
) -> Vec<(u32, u32)> {
    let limit = if only_one {
        1
    } else {
        descriptors_max.max(1) as usize
    };
    let mut descriptors: Vec<(u32, u32)> = Vec::new();
    let mut remaining = u64::from(length);
    for extent in extents {
        if remaining == 0 {
            break;
        }
        let run = extent.length.min(remaining);
        if run == 0 {
            continue;
        }
        let status = if extent.hole { wire::STATE_HOLE } else { 0 }
            | if extent.zero { wire::STATE_ZERO } else { 0 };
        let run_u32 = run as u32;
        match descriptors.last_mut() {
            Some((last_length, last_status)) if *last_status == status => *last_length += run_u32,
            _ => {
                if descriptors.len() == limit {
                    break;
                }
                descriptors.push((run_u32, status));
            }
        }
        remaining -= run;
    }
    if descriptors.is_empty() {
        // Status 0 ("allocated, contents unknown") is always a safe answer.
        descriptors.push((length, 0));
    }
    descriptors
}

async fn block_status(
    export: &dyn Export,
    context: &TransmissionContext,
    header: &RequestHeader,
    offset: u64,
    length: u32,
    only_one: bool,
    descriptors_max: u32,
) -> Outgoing {
    match export.extents(offset, u64::from(length)).await {
        Ok(extents) => {
            let descriptors = block_status_descriptors(&extents, length, only_one, descriptors_max);
            Outgoing::bytes(wire::encode_block_status_chunk(
                header.cookie,
                wire::BASE_ALLOCATION_CONTEXT_ID,
                &descriptors,
            ))
        }
        Err(error) => backend_error(context, header, &error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extent(length: u64, hole: bool) -> Extent {
        Extent {
            length,
            hole,
            zero: hole,
        }
    }

    #[test]
    fn zero_runs_merge_and_cover() {
        let runs = zero_runs(
            &[extent(8192, true), extent(4096, false), extent(100, true)],
            20000,
        );
        assert_eq!(runs, vec![(0..8192, true), (8192..20000, false)]);
        let runs = zero_runs(&[], 10);
        assert_eq!(runs, vec![(0..10, false)]);
        let runs = zero_runs(&[extent(1 << 40, true)], 65536);
        assert_eq!(runs, vec![(0..65536, true)]);
    }

    #[test]
    fn descriptors_merge_clip_and_limit() {
        let extents = [
            extent(4096, true),
            extent(4096, true),
            extent(4096, false),
            extent(9999, true),
        ];
        assert_eq!(
            block_status_descriptors(&extents, 10000, false, 100),
            vec![(8192, 3), (1808, 0)]
        );
        assert_eq!(
            block_status_descriptors(&extents, 10000, true, 100),
            vec![(8192, 3)]
        );
        assert_eq!(
            block_status_descriptors(&extents, 20000, false, 2),
            vec![(8192, 3), (4096, 0)]
        );
        assert_eq!(block_status_descriptors(&[], 512, false, 2), vec![(512, 0)]);
    }

    #[test]
    fn errors_map_to_nbd_values() {
        assert_eq!(errno_for(&ExportError::Io("x".into())), 5);
        assert_eq!(errno_for(&ExportError::NoSpace), 28);
        assert_eq!(errno_for(&ExportError::ReadOnly), 1);
        assert_eq!(errno_for(&ExportError::Invalid("x".into())), 22);
        assert_eq!(errno_for(&ExportError::NotSupported), 95);
        assert_eq!(errno_for(&ExportError::Shutdown), 108);
    }
}
