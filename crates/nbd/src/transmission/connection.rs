//! One connection's transmission phase, served by one task: each `poll` drives
//! three parts in turn (reading requests, polling the requests in flight,
//! writing replies) and goes round again while any of them moved, so none of
//! them ever waits for another. A part that cannot move has registered the
//! task's waker with what it waits for (the socket's read or write side, or a
//! request's future), except the reader waiting for room in the in-flight
//! budgets, which only a written reply frees, and writing a reply is a part of
//! the same `poll`. See decision 0040 for why this cannot deadlock.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncBufRead, AsyncRead, AsyncWrite, BufReader, ReadBuf};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::in_flight::InFlight;
use super::messages::{Counted, Job, Outgoing, Services, buffer_len, error_reply};
use super::replies::Replies;
use crate::error::ConnectionError;
use crate::statistics::ExportStatistics;
use crate::wire::{self, Command, RequestHeader};

/// Socket read buffer: enough for many small request headers per system call.
const READ_BUFFER_BYTES: usize = 64 * 1024;
/// Rounds of one `poll` before the task yields to the runtime, so that a
/// client that keeps all three parts busy cannot hold a worker thread.
const ROUNDS_PER_POLL_MAX: usize = 64;

/// The socket: read through a buffer, written with vectored writes straight
/// from the replies (`replies.rs`).
type Stream<S> = BufReader<Pin<Box<S>>>;

/// A valid request read up to its payload.
struct Pending {
    header: RequestHeader,
    command: Command,
    counted: Option<Counted>,
    /// Bytes of the in-flight byte budget it takes.
    budget_bytes: u32,
}

/// What waits for room in the in-flight budgets.
enum Admitting {
    Request(Pending),
    /// The error reply to a refused request.
    Refusal(Outgoing),
}

/// Where the reader is in the request stream.
enum Reading {
    /// Between requests (`filled` 0) or part way through a header.
    Header {
        bytes: [u8; wire::REQUEST_HEADER_BYTES],
        filled: usize,
    },
    /// Dropping the payload of a refused write; its error reply follows.
    Discard { reply: Outgoing, remaining: usize },
    /// Waiting for room in the in-flight budgets.
    Admission(Admitting),
    /// Reading an admitted write's payload.
    Payload {
        pending: Pending,
        payload: Vec<u8>,
        filled: usize,
    },
    /// No more requests: the client left, sent bad input or `shutdown` came.
    Stopped,
}

impl Reading {
    fn next_header() -> Self {
        Reading::Header {
            bytes: [0; wire::REQUEST_HEADER_BYTES],
            filled: 0,
        }
    }
}

/// The connection's budgets for requests in flight (from admission until
/// their reply is on the socket).
struct Budgets {
    requests: usize,
    bytes: u64,
    requests_max: usize,
    bytes_max: u32,
}

impl Budgets {
    /// The bytes a request of `command` takes: its buffer, capped at the
    /// whole budget so that one request alone may always proceed.
    fn bytes_for(&self, command: Command) -> u32 {
        match command {
            Command::Read { length, .. } | Command::Write { length, .. } => {
                length.min(self.bytes_max)
            }
            _ => 0,
        }
    }

    fn try_take(&mut self, bytes: u32) -> bool {
        let fits = self.requests < self.requests_max
            && self.bytes + u64::from(bytes) <= u64::from(self.bytes_max);
        if fits {
            self.requests += 1;
            self.bytes += u64::from(bytes);
        }
        fits
    }

    fn give_back(&mut self, bytes: u32) {
        assert!(self.requests >= 1 && self.bytes >= u64::from(bytes));
        self.requests -= 1;
        self.bytes -= u64::from(bytes);
    }
}

/// What a connection is configured with, besides its socket.
pub(super) struct Settings {
    pub services: Arc<Services>,
    pub statistics: Option<Arc<ExportStatistics>>,
    pub measures_latency: bool,
    pub requests_max: usize,
    pub bytes_max: u32,
}

/// One connection in its transmission phase; `F` is its request future.
pub(super) struct Connection<S, F> {
    stream: Stream<S>,
    reading: Reading,
    shutdown: Pin<Box<WaitForCancellationFutureOwned>>,
    services: Arc<Services>,
    start: fn(Arc<Services>, Job) -> F,
    /// Answers a request at once when it needs no waiting, else hands it back.
    answer_at_once: fn(&Services, Job) -> Result<Outgoing, Job>,
    in_flight: InFlight<F>,
    /// Replies of completed requests, oldest first, not on the socket yet.
    replies: Replies,
    budgets: Budgets,
    statistics: Option<Arc<ExportStatistics>>,
    measures_latency: bool,
    /// Why reading stopped, when it was an error.
    read_error: Option<ConnectionError>,
    /// Why writing stopped; from then on replies are dropped.
    write_error: Option<io::Error>,
}

impl<S, F> Connection<S, F>
where
    S: AsyncRead + AsyncWrite,
    F: Future<Output = Outgoing>,
{
    pub(super) fn new(
        stream: S,
        settings: Settings,
        shutdown: CancellationToken,
        start: fn(Arc<Services>, Job) -> F,
        answer_at_once: fn(&Services, Job) -> Result<Outgoing, Job>,
    ) -> Self {
        Connection {
            stream: BufReader::with_capacity(READ_BUFFER_BYTES, Box::pin(stream)),
            reading: Reading::next_header(),
            shutdown: Box::pin(shutdown.cancelled_owned()),
            services: settings.services,
            start,
            answer_at_once,
            in_flight: InFlight::new(),
            replies: Replies::default(),
            budgets: Budgets {
                requests: 0,
                bytes: 0,
                requests_max: settings.requests_max,
                bytes_max: settings.bytes_max,
            },
            statistics: settings.statistics,
            measures_latency: settings.measures_latency,
            read_error: None,
            write_error: None,
        }
    }

    /// Serves the connection until reading has stopped and every request read
    /// has been answered (or the socket broke).
    pub(super) async fn run(mut self) -> Result<(), ConnectionError> {
        std::future::poll_fn(|context| self.poll(context)).await
    }

    fn poll(&mut self, context: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        for _ in 0..ROUNDS_PER_POLL_MAX {
            let mut moved = self.poll_reading(context);
            moved |= self.poll_in_flight(context);
            moved |= self.poll_writing(context);
            if self.finished() {
                return self.poll_close(context);
            }
            if !moved {
                return Poll::Pending;
            }
        }
        context.waker().wake_by_ref();
        Poll::Pending
    }

    /// Whether nothing is left to do but close the socket.
    fn finished(&self) -> bool {
        matches!(self.reading, Reading::Stopped)
            && self.in_flight.is_empty()
            && (self.replies.is_empty() || self.write_error.is_some())
    }

    /// Shuts the socket's write side down (when it still works) and reports
    /// the connection's outcome: the read error first, then the write error.
    fn poll_close(&mut self, context: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        if self.write_error.is_none()
            && let Err(error) = std::task::ready!(Pin::new(&mut self.stream).poll_shutdown(context))
        {
            self.write_error = Some(error);
        }
        if let Some(error) = self.read_error.take() {
            return Poll::Ready(Err(error));
        }
        Poll::Ready(
            self.write_error
                .take()
                .map_or(Ok(()), |error| Err(error.into())),
        )
    }

    /// Reads and starts requests while it can; true when it moved.
    fn poll_reading(&mut self, context: &mut Context<'_>) -> bool {
        let mut moved = false;
        loop {
            match self.read_step(context) {
                Poll::Ready(Ok(())) => moved = true,
                Poll::Ready(Err(error)) => {
                    self.reading = Reading::Stopped;
                    self.read_error = Some(error);
                    return true;
                }
                Poll::Pending => return moved,
            }
        }
    }

    /// One step of the reader: `Ready(Ok)` when it moved, `Pending` when it
    /// waits (for the socket, with the waker registered, or for the budgets).
    fn read_step(&mut self, context: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        match &mut self.reading {
            Reading::Stopped => Poll::Pending,
            Reading::Header { bytes, filled } => {
                let (bytes, filled) = (*bytes, *filled);
                self.read_header(context, bytes, filled)
            }
            Reading::Discard { remaining, .. } => {
                let remaining = *remaining;
                self.discard(context, remaining)
            }
            Reading::Admission(_) => self.admit(),
            Reading::Payload { .. } => self.read_payload(context),
        }
    }

    fn read_header(
        &mut self,
        context: &mut Context<'_>,
        mut bytes: [u8; wire::REQUEST_HEADER_BYTES],
        filled: usize,
    ) -> Poll<Result<(), ConnectionError>> {
        // Between two requests is the one place where a shutdown may stop
        // reading without losing part of a request.
        if filled == 0 && self.shutdown.as_mut().poll(context).is_ready() {
            tracing::debug!("shutting down: no more requests read");
            self.reading = Reading::Stopped;
            return Poll::Ready(Ok(()));
        }
        let available = std::task::ready!(Pin::new(&mut self.stream).poll_fill_buf(context))?;
        if available.is_empty() {
            if filled > 0 {
                return Poll::Ready(Err(ConnectionError::Truncated("request header")));
            }
            tracing::debug!("client closed the connection");
            self.reading = Reading::Stopped;
            return Poll::Ready(Ok(()));
        }
        let taken = available.len().min(bytes.len() - filled);
        bytes[filled..filled + taken].copy_from_slice(&available[..taken]);
        Pin::new(&mut self.stream).consume(taken);
        let filled = filled + taken;
        if filled < bytes.len() {
            self.reading = Reading::Header { bytes, filled };
            return Poll::Ready(Ok(()));
        }
        // A request arrives when its header has been read.
        let arrived = self.measures_latency.then(Instant::now);
        let header = wire::parse_request_header(&bytes)?;
        self.reading = self.after_header(header, arrived);
        Poll::Ready(Ok(()))
    }

    /// What follows a complete header: admission, or the refusal of an
    /// invalid request (after dropping a refused write's payload).
    fn after_header(&self, header: RequestHeader, arrived: Option<Instant>) -> Reading {
        let context = &self.services.context;
        match wire::validate_request(&header, context) {
            Ok(Command::Disconnect) => {
                tracing::debug!("client sent NBD_CMD_DISC");
                Reading::Stopped
            }
            Ok(command) => Reading::Admission(Admitting::Request(Pending {
                header,
                command,
                counted: self
                    .statistics
                    .as_ref()
                    .and_then(|_| Counted::of(command, arrived)),
                budget_bytes: self.budgets.bytes_for(command),
            })),
            Err(rejection) => {
                tracing::debug!(
                    command = header.command,
                    offset = header.offset,
                    length = header.length,
                    errno = rejection.errno,
                    message = %rejection.message,
                    "request refused"
                );
                let reply = Outgoing::bytes(error_reply(
                    context,
                    &header,
                    rejection.errno,
                    &rejection.message,
                ));
                if header.command == wire::CMD_WRITE {
                    // The payload follows whatever we think of the request.
                    Reading::Discard {
                        reply,
                        remaining: buffer_len(header.length),
                    }
                } else {
                    Reading::Admission(Admitting::Refusal(reply))
                }
            }
        }
    }

    /// Drops a refused write's payload straight out of the read buffer.
    fn discard(
        &mut self,
        context: &mut Context<'_>,
        remaining: usize,
    ) -> Poll<Result<(), ConnectionError>> {
        if remaining > 0 {
            let available = std::task::ready!(Pin::new(&mut self.stream).poll_fill_buf(context))?;
            if available.is_empty() {
                return Poll::Ready(Err(ConnectionError::Truncated("write payload")));
            }
            let taken = available.len().min(remaining);
            Pin::new(&mut self.stream).consume(taken);
            if let Reading::Discard { remaining, .. } = &mut self.reading {
                *remaining -= taken;
            }
            return Poll::Ready(Ok(()));
        }
        let Reading::Discard { reply, .. } = std::mem::replace(&mut self.reading, Reading::Stopped)
        else {
            unreachable!("discard runs in the Discard state");
        };
        self.reading = Reading::Admission(Admitting::Refusal(reply));
        Poll::Ready(Ok(()))
    }

    /// Takes room in the budgets for what waits, then starts a request (or its
    /// payload) or queues a refusal. `Pending` while there is no room: only a
    /// written reply makes room, and the writer is polled in the same round.
    fn admit(&mut self) -> Poll<Result<(), ConnectionError>> {
        let Reading::Admission(admitting) = &self.reading else {
            unreachable!("admit runs in the Admission state");
        };
        let budget_bytes = match admitting {
            Admitting::Request(pending) => pending.budget_bytes,
            Admitting::Refusal(_) => 0,
        };
        if !self.budgets.try_take(budget_bytes) {
            return Poll::Pending;
        }
        let Reading::Admission(admitting) =
            std::mem::replace(&mut self.reading, Reading::next_header())
        else {
            unreachable!("checked above");
        };
        match admitting {
            Admitting::Refusal(reply) => self.replies.push(reply),
            Admitting::Request(pending) => match pending.command {
                Command::Write { length, .. } if length > 0 => {
                    let payload = self.services.buffers.for_overwrite(buffer_len(length));
                    self.reading = Reading::Payload {
                        pending,
                        payload,
                        filled: 0,
                    };
                }
                _ => self.start(pending, Vec::new()),
            },
        }
        Poll::Ready(Ok(()))
    }

    /// Reads an admitted write's payload (large payloads straight from the
    /// socket, past the read buffer); the write starts once it is all here.
    fn read_payload(&mut self, context: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        let Reading::Payload {
            payload, filled, ..
        } = &mut self.reading
        else {
            unreachable!("read_payload runs in the Payload state");
        };
        if *filled < payload.len() {
            let mut buffer = ReadBuf::new(&mut payload[*filled..]);
            std::task::ready!(Pin::new(&mut self.stream).poll_read(context, &mut buffer))?;
            let read = buffer.filled().len();
            if read == 0 {
                return Poll::Ready(Err(ConnectionError::Truncated("write payload")));
            }
            *filled += read;
            return Poll::Ready(Ok(()));
        }
        let Reading::Payload {
            pending, payload, ..
        } = std::mem::replace(&mut self.reading, Reading::next_header())
        else {
            unreachable!("checked above");
        };
        self.start(pending, payload);
        Poll::Ready(Ok(()))
    }

    /// Answers an admitted request at once when it needs no waiting (its
    /// reply is queued), else adds it to those in flight, polled this round.
    fn start(&mut self, pending: Pending, payload: Vec<u8>) {
        let job = Job {
            header: pending.header,
            command: pending.command,
            payload,
            counted: pending.counted,
            budget_bytes: pending.budget_bytes,
        };
        match (self.answer_at_once)(&self.services, job) {
            Ok(outgoing) => self.replies.push(outgoing),
            Err(job) => self
                .in_flight
                .push((self.start)(Arc::clone(&self.services), job)),
        }
    }

    /// Polls the woken requests; true when any completed.
    fn poll_in_flight(&mut self, context: &mut Context<'_>) -> bool {
        let replies = &mut self.replies;
        self.in_flight
            .poll_completed(context, |outgoing| replies.push(outgoing))
    }

    /// Writes the ready replies onto the socket and flushes once none is
    /// left; true when it moved. A write error ends writing for good.
    fn poll_writing(&mut self, context: &mut Context<'_>) -> bool {
        if self.write_error.is_some() {
            // Nobody can receive replies any more: drop them as they come.
            let dropped = self.replies.take_all();
            let moved = !dropped.is_empty();
            for outgoing in dropped {
                self.release(outgoing);
            }
            return moved;
        }
        let Connection {
            stream,
            replies,
            statistics,
            budgets,
            services,
            ..
        } = self;
        let written = replies.poll_write(Pin::new(stream), context, |outgoing| {
            // The reply is on the socket: the request is answered.
            if let (Some(counted), Some(statistics)) = (&outgoing.counted, statistics.as_ref()) {
                counted.record(statistics);
            }
            release(budgets, services, outgoing);
        });
        match written {
            Ok(moved) => moved,
            Err(error) => {
                // Stop reading: nobody can receive the replies any more.
                self.reading = Reading::Stopped;
                self.write_error = Some(error);
                true
            }
        }
    }

    /// Returns what a reply held: its request's budgets and its data buffer.
    fn release(&mut self, outgoing: Outgoing) {
        release(&mut self.budgets, &self.services, outgoing);
    }
}

/// Returns what a reply held: its request's budgets and its data buffer.
fn release(budgets: &mut Budgets, services: &Services, outgoing: Outgoing) {
    budgets.give_back(outgoing.budget_bytes);
    services.buffers.give_back(outgoing.data);
}
