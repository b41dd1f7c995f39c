//! The transmission phase: one task per connection reads requests in order,
//! runs those in flight (at most `in_flight_requests_max` at once, holding at
//! most `in_flight_bytes_max` of buffers) as futures it polls itself, and
//! writes their replies in whatever order they complete (see [`connection`]
//! and decision 0040). This file runs one request and builds its reply. Bad
//! input closes only this connection.

mod connection;
mod in_flight;
mod messages;
mod replies;

use std::ops::Range;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use smallvec::{SmallVec, smallvec};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

use crate::backend::{Export, ExportError, Extent};
use crate::buffer_pool::BufferPool;
use crate::config::ServerConfig;
use crate::error::ConnectionError;
use crate::failure_log;
use crate::negotiated::Negotiated;
use crate::wire::{self, BlockStatusDescriptor, Command, RequestHeader, TransmissionContext};
use connection::{Connection, Settings};
use messages::{
    InlineBytes, Job, Outgoing, Piece, Pieces, Services, buffer_len, error_reply, success_reply,
};

/// Holes shorter than this are sent as data: a hole chunk costs 32 bytes and a
/// split in the client's reassembly, not worth it for a few sectors.
const HOLE_CHUNK_BYTES_MIN: u32 = 4096;

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

/// Runs the transmission phase until the client disconnects, sends bad input, or
/// `shutdown` is cancelled; in-flight requests are always completed and answered.
/// The whole phase is one task: see [`connection`].
pub(crate) async fn run<S>(
    stream: S,
    negotiated: Negotiated,
    config: &ServerConfig,
    shutdown: CancellationToken,
) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let statistics = negotiated.export.statistics();
    let measures_latency = statistics
        .as_ref()
        .is_some_and(|statistics| statistics.measures_latency());
    let settings = Settings {
        services: Arc::new(Services {
            export: negotiated.export,
            context: negotiated.context,
            buffers: BufferPool::default(),
            block_status_descriptors_max: config.block_status_descriptors_max,
        }),
        statistics,
        measures_latency,
        requests_max: config.in_flight_requests_max,
        bytes_max: config.in_flight_bytes_max,
    };
    Connection::new(stream, settings, shutdown, serve, answer_at_once)
        .run()
        .await
}

/// Answers a request at once when it needs no waiting: a write without FUA
/// that the export takes in place ([`Export::write_without_waiting`], the
/// common write). Anything else, and a write the export cannot take at
/// once, goes back to the caller to be [`serve`]d. A panicking export is
/// answered with EIO, as in `serve`.
fn answer_at_once(services: &Services, job: Job) -> Result<Outgoing, Job> {
    let Command::Write {
        offset, fua: false, ..
    } = job.command
    else {
        return Err(job);
    };
    if job.payload.is_empty() {
        return Err(job);
    }
    let export = services.export.as_ref();
    let written = std::panic::catch_unwind(AssertUnwindSafe(|| {
        export.write_without_waiting(offset, &job.payload)
    }));
    let mut outgoing = match written {
        Ok(None) => return Err(job),
        Ok(Some(Ok(()))) => success_reply(&job.header),
        Ok(Some(Err(error))) => backend_error(&services.context, &job.header, &error),
        Err(_) => {
            tracing::error!(command = job.header.command, "request handler panicked");
            Outgoing::bytes(error_reply(
                &services.context,
                &job.header,
                wire::EIO,
                "internal error",
            ))
        }
    };
    services.buffers.give_back(job.payload);
    outgoing.budget_bytes = job.budget_bytes;
    outgoing.counted = job.counted;
    Ok(outgoing)
}

/// Runs one request and builds its reply. A panicking handler is answered
/// with EIO; the connection goes on.
async fn serve(services: Arc<Services>, job: Job) -> Outgoing {
    let Job {
        header,
        command,
        payload,
        counted,
        budget_bytes,
    } = job;
    let request = Request {
        export: services.export.as_ref(),
        context: &services.context,
        header: &header,
        buffers: &services.buffers,
    };
    let execution = execute(
        &request,
        command,
        &payload,
        services.block_status_descriptors_max,
    );
    let mut outgoing = match AssertUnwindSafe(execution).catch_unwind().await {
        Ok(outgoing) => outgoing,
        Err(_) => {
            tracing::error!(command = header.command, "request handler panicked");
            Outgoing::bytes(error_reply(
                &services.context,
                &header,
                wire::EIO,
                "internal error",
            ))
        }
    };
    services.buffers.give_back(payload);
    outgoing.budget_bytes = budget_bytes;
    outgoing.counted = counted;
    outgoing
}

/// What every command of one request runs with.
struct Request<'a> {
    export: &'a dyn Export,
    context: &'a TransmissionContext,
    header: &'a RequestHeader,
    /// Where read buffers come from.
    buffers: &'a BufferPool,
}

async fn execute(
    request: &Request<'_>,
    command: Command,
    payload: &[u8],
    block_status_descriptors_max: u32,
) -> Outgoing {
    let Request {
        export,
        context,
        header,
        ..
    } = *request;
    let result = match command {
        Command::Read {
            offset,
            length,
            dont_fragment,
            ..
        } => return read(request, offset, length, dont_fragment).await,
        Command::BlockStatus {
            offset,
            length,
            only_one,
        } => {
            let request = BlockStatusRequest {
                offset,
                length,
                only_one,
                descriptors_max: block_status_descriptors_max,
            };
            return block_status(export, context, header, request).await;
        }
        Command::Disconnect => unreachable!("disconnect is handled by the reader"),
        update => run_update(export, update, payload).await,
    };
    match result {
        Ok(()) => success_reply(header),
        Err(error) => backend_error(context, header, &error),
    }
}

/// Runs a command whose success reply carries no data: WRITE, FLUSH, TRIM,
/// CACHE and WRITE_ZEROES. Zero-length ranges succeed without the backend.
async fn run_update(
    export: &dyn Export,
    command: Command,
    payload: &[u8],
) -> Result<(), ExportError> {
    match command {
        Command::Write { offset, fua, .. } => {
            if payload.is_empty() {
                Ok(())
            } else {
                export.write(offset, payload, fua).await
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
        Command::Read { .. } | Command::BlockStatus { .. } | Command::Disconnect => {
            unreachable!("commands with reply data are run by execute")
        }
    }
}

fn backend_error(
    context: &TransmissionContext,
    header: &RequestHeader,
    error: &ExportError,
) -> Outgoing {
    failure_log::log_failed_request(header, error);
    Outgoing::bytes(error_reply(
        context,
        header,
        errno_for(error),
        &error.to_string(),
    ))
}

/// A stretch of a structured read reply, in bytes from the start of the
/// request: sent as a hole chunk when `zero`, as a data chunk otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Run {
    range: Range<u32>,
    zero: bool,
}

/// A structured read's runs: a 4 KiB read is one run, a read over a hole
/// and data two; more spill to the heap.
type Runs = SmallVec<[Run; 2]>;

/// Splits `[0, length)` into runs that read as zeros or hold data, from the
/// backend's extents, given in order; whatever they do not cover is data.
struct ZeroRuns {
    runs: Runs,
    position: u32,
    length: u32,
}

impl ZeroRuns {
    fn new(length: u32) -> Self {
        ZeroRuns {
            runs: Runs::new(),
            position: 0,
            length,
        }
    }

    fn add(&mut self, extent: Extent) {
        if self.position >= self.length {
            return;
        }
        // An extent longer than any request is clipped below anyway.
        let extent_bytes = u32::try_from(extent.length).unwrap_or(u32::MAX);
        let end = self.position.saturating_add(extent_bytes).min(self.length);
        if end == self.position {
            return;
        }
        // Holes read as zeros by the backend's contract.
        let zero = (extent.hole || extent.zero) && end - self.position >= HOLE_CHUNK_BYTES_MIN;
        self.extend(end, zero);
    }

    fn extend(&mut self, end: u32, zero: bool) {
        match self.runs.last_mut() {
            Some(last) if last.zero == zero => last.range.end = end,
            _ => self.runs.push(Run {
                range: self.position..end,
                zero,
            }),
        }
        self.position = end;
    }

    fn finish(mut self) -> Runs {
        if self.position < self.length {
            self.extend(self.length, false);
        }
        self.runs
    }
}

#[cfg(test)]
fn zero_runs(extents: &[Extent], length: u32) -> Runs {
    let mut runs = ZeroRuns::new(length);
    for extent in extents {
        runs.add(*extent);
    }
    runs.finish()
}

async fn read(request: &Request<'_>, offset: u64, length: u32, dont_fragment: bool) -> Outgoing {
    let Request {
        export,
        context,
        header,
        buffers,
    } = *request;
    if !context.structured_replies {
        return read_simple(request, offset, length).await;
    }
    if length == 0 {
        return Outgoing::inline(&wire::encode_chunk_header(
            wire::REPLY_FLAG_DONE,
            wire::REPLY_TYPE_NONE,
            header.cookie,
            0,
        ));
    }
    let mut data = buffers.zeroed(buffer_len(length));
    let read = if dont_fragment {
        export
            .read(offset, &mut data)
            .await
            .map(|()| whole_data_run(length))
    } else {
        read_fragmentable(export, offset, &mut data).await
    };
    let runs = match read {
        Ok(runs) => runs,
        Err(error) => {
            buffers.give_back(data);
            return backend_error(context, header, &error);
        }
    };
    if runs.iter().all(|run| run.zero) {
        // Only hole chunks: no data goes out.
        buffers.give_back(std::mem::take(&mut data));
    }
    Outgoing {
        pieces: read_chunks(header.cookie, offset, &runs),
        data,
        budget_bytes: 0,
        counted: None,
    }
}

/// A read answered with a simple reply: the header, then all the data.
async fn read_simple(request: &Request<'_>, offset: u64, length: u32) -> Outgoing {
    let Request {
        export,
        context,
        header,
        buffers,
    } = *request;
    let mut data = buffers.zeroed(buffer_len(length));
    if length > 0
        && let Err(error) = export.read(offset, &mut data).await
    {
        buffers.give_back(data);
        return backend_error(context, header, &error);
    }
    Outgoing {
        pieces: smallvec![
            Piece::Inline(InlineBytes::of(&[&wire::encode_simple_reply(
                0,
                header.cookie,
            )])),
            Piece::Data(0..data.len()),
        ],
        data,
        budget_bytes: 0,
        counted: None,
    }
}

/// One data run over the whole of a read of `length` bytes.
fn whole_data_run(length: u32) -> Runs {
    smallvec![Run {
        range: 0..length,
        zero: false,
    }]
}

/// Reads a fragmentable read into `data` and finds its runs: from the read
/// itself when the backend reports the allocation status it read, else from
/// the status asked first (so that a read of holes only reads nothing).
async fn read_fragmentable(
    export: &dyn Export,
    offset: u64,
    data: &mut [u8],
) -> Result<Runs, ExportError> {
    let length = u32::try_from(data.len()).expect("a read's length fits its header's field");
    let mut runs = ZeroRuns::new(length);
    let mut visit = |extent| runs.add(extent);
    let read_with_extents = match export.read_visiting_extents(offset, data, &mut visit) {
        Some(read) => Some(read.await),
        None => None,
    };
    if let Some(result) = read_with_extents {
        return result.map(|()| runs.finish());
    }
    let runs = read_runs(export, offset, length).await;
    if runs.iter().any(|run| !run.zero) {
        export.read(offset, data).await?;
    }
    Ok(runs)
}

/// The runs of a fragmentable read, from the backend's allocation status
/// (visited in place when the backend can, asked for otherwise).
async fn read_runs(export: &dyn Export, offset: u64, length: u32) -> Runs {
    let mut runs = ZeroRuns::new(length);
    let visited = export.visit_extents(offset, u64::from(length), &mut |extent| runs.add(extent));
    let result = match visited {
        Some(result) => result,
        None => export
            .extents(offset, u64::from(length))
            .await
            .map(|extents| extents.into_iter().for_each(|extent| runs.add(extent))),
    };
    match result {
        Ok(()) => runs.finish(),
        // Allocation status is an optimisation; without it everything is data.
        Err(error) => {
            tracing::debug!(%error, "extents failed; sending the read as data");
            whole_data_run(length)
        }
    }
}

/// The chunks of a structured read reply, one per run. All data is in hand
/// when they are built, so no error can follow: the last chunk is final.
fn read_chunks(cookie: u64, offset: u64, runs: &[Run]) -> Pieces {
    let last = runs.len() - 1;
    let mut pieces = Pieces::new();
    for (index, run) in runs.iter().enumerate() {
        let done = index == last;
        let run_bytes = run.range.end - run.range.start;
        let run_offset = offset + u64::from(run.range.start);
        if run.zero {
            pieces.push(Piece::Inline(InlineBytes::of(&[&wire::encode_hole_chunk(
                cookie, done, run_offset, run_bytes,
            )])));
        } else {
            let chunk_header = wire::encode_chunk_header(
                if done { wire::REPLY_FLAG_DONE } else { 0 },
                wire::REPLY_TYPE_OFFSET_DATA,
                cookie,
                8 + run_bytes,
            );
            pieces.push(Piece::Inline(InlineBytes::of(&[
                &chunk_header,
                &run_offset.to_be_bytes(),
            ])));
            pieces.push(Piece::Data(
                buffer_len(run.range.start)..buffer_len(run.range.end),
            ));
        }
    }
    pieces
}

/// Turns backend extents into `base:allocation` descriptors: merged when the
/// status repeats, clipped to `length`, at most `descriptors_max` of them, and
/// never empty.
pub fn block_status_descriptors(
    extents: &[Extent],
    length: u32,
    only_one: bool,
    descriptors_max: u32,
) -> Vec<BlockStatusDescriptor> {
    let limit = if only_one {
        1
    } else {
        buffer_len(descriptors_max.max(1))
    };
    let mut descriptors: Vec<BlockStatusDescriptor> = Vec::new();
    let mut remaining = length;
    for extent in extents {
        if remaining == 0 {
            break;
        }
        let run = u32::try_from(extent.length).map_or(remaining, |bytes| bytes.min(remaining));
        if run == 0 {
            continue;
        }
        let status = if extent.hole { wire::STATE_HOLE } else { 0 }
            | if extent.zero { wire::STATE_ZERO } else { 0 };
        match descriptors.last_mut() {
            Some(last) if last.status == status => last.length_bytes += run,
            _ => {
                if descriptors.len() == limit {
                    break;
                }
                descriptors.push(BlockStatusDescriptor {
                    length_bytes: run,
                    status,
                });
            }
        }
        remaining -= run;
    }
    if descriptors.is_empty() {
        // Status 0 ("allocated, contents unknown") is always a safe answer.
        descriptors.push(BlockStatusDescriptor {
            length_bytes: length,
            status: 0,
        });
    }
    descriptors
}

/// A validated `NBD_CMD_BLOCK_STATUS` with the server's descriptor limit.
#[derive(Debug, Clone, Copy)]
struct BlockStatusRequest {
    offset: u64,
    length: u32,
    only_one: bool,
    descriptors_max: u32,
}

async fn block_status(
    export: &dyn Export,
    context: &TransmissionContext,
    header: &RequestHeader,
    request: BlockStatusRequest,
) -> Outgoing {
    match export
        .extents(request.offset, u64::from(request.length))
        .await
    {
        Ok(extents) => {
            let descriptors = block_status_descriptors(
                &extents,
                request.length,
                request.only_one,
                request.descriptors_max,
            );
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

    fn run(range: Range<u32>, zero: bool) -> Run {
        Run { range, zero }
    }

    fn descriptor(length_bytes: u32, status: u32) -> BlockStatusDescriptor {
        BlockStatusDescriptor {
            length_bytes,
            status,
        }
    }

    #[test]
    fn zero_runs_merge_and_cover() {
        let runs = zero_runs(
            &[extent(8192, true), extent(4096, false), extent(100, true)],
            20000,
        );
        assert_eq!(
            runs.as_slice(),
            [run(0..8192, true), run(8192..20000, false)]
        );
        let runs = zero_runs(&[], 10);
        assert_eq!(runs.as_slice(), [run(0..10, false)]);
        let runs = zero_runs(&[extent(1 << 40, true)], 65536);
        assert_eq!(runs.as_slice(), [run(0..65536, true)]);
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
            vec![descriptor(8192, 3), descriptor(1808, 0)]
        );
        assert_eq!(
            block_status_descriptors(&extents, 10000, true, 100),
            vec![descriptor(8192, 3)]
        );
        assert_eq!(
            block_status_descriptors(&extents, 20000, false, 2),
            vec![descriptor(8192, 3), descriptor(4096, 0)]
        );
        assert_eq!(
            block_status_descriptors(&[], 512, false, 2),
            vec![descriptor(512, 0)]
        );
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
