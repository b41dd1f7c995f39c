//! Every HTTP attempt a tier's client makes, counted per kind of request:
//! the retries object_store makes underneath a request (with backoff, on
//! 5xx, 429, timeouts and dropped connections), the throttling answers
//! (503 Slow Down, 429), other server errors, timeouts and other transport
//! errors. See docs/decisions/0036-object-request-attempts.md.
//!
//! The client is built with [`CountingConnector`], which wraps object_store's
//! default connector (reqwest) in a service that sees each attempt. Which
//! request an attempt belongs to is not in the HTTP request: the request
//! wrapper (`requests.rs`) runs each request inside [`in_request`], which
//! puts a [`RequestAttempts`] (its kind and where to count) in a tokio
//! task-local that the service reads. object_store polls the attempts of a
//! request inside that request's future (its retry loop, a GET's body, a
//! LIST's pages, a bulk DELETE's stream), so every attempt sees its request.
//! An attempt with no request around it (none is made today: credentials are
//! explicit or from the environment) is not counted.
//!
//! An attempt is a retry when it repeats the previous attempt of the same
//! request (same method and URI): object_store's retry loop re-sends the same
//! request, and a GET whose body broke off asks again for the rest of the
//! same URI (only the Range header differs), while a LIST's next page names a
//! continuation token and a bulk DELETE is one POST per request (at most 1000
//! keys).
//!
//! The same service keeps each request's last attempt ([`LastAttempt`]: its
//! method, URL, and the HTTP status or transport failure it met), which
//! [`in_request`] hands back, so that a failed request's error names what was
//! sent where and what came back without reading object_store's error text.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Body;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse,
    HttpResponseBody, HttpService, ReqwestConnector,
};

use crate::request_kind::RequestKind;

/// The kinds of request, in the order of their counters.
const KINDS: usize = 5;

fn kind_slot(kind: RequestKind) -> usize {
    match kind {
        RequestKind::Get => 0,
        RequestKind::Put => 1,
        RequestKind::Delete => 2,
        RequestKind::List => 3,
        RequestKind::LabelPut => 4,
    }
}

/// What the attempts of one kind of request met.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttemptCounts {
    pub retries: u64,
    pub throttled: u64,
    pub server_errors: u64,
    pub timeouts: u64,
    pub transport_errors: u64,
}

/// One kind's counters (atomics: attempts of concurrent requests count at
/// once, outside the request records' lock).
#[derive(Default)]
struct KindCounters {
    retries: AtomicU64,
    throttled: AtomicU64,
    server_errors: AtomicU64,
    timeouts: AtomicU64,
    transport_errors: AtomicU64,
}

/// A tier's attempt counters, per kind of request.
#[derive(Default)]
pub struct AttemptCounters {
    kinds: [KindCounters; KINDS],
}

impl AttemptCounters {
    pub fn counts(&self, kind: RequestKind) -> AttemptCounts {
        let counters = &self.kinds[kind_slot(kind)];
        AttemptCounts {
            retries: counters.retries.load(Ordering::Relaxed),
            throttled: counters.throttled.load(Ordering::Relaxed),
            server_errors: counters.server_errors.load(Ordering::Relaxed),
            timeouts: counters.timeouts.load(Ordering::Relaxed),
            transport_errors: counters.transport_errors.load(Ordering::Relaxed),
        }
    }
}

/// What went wrong with one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AttemptFailure {
    /// 503 (S3's Slow Down) or 429.
    Throttled,
    /// Any other 5xx.
    ServerError,
    /// The attempt or its connection timed out (or the server said 408).
    Timeout,
    /// The connection was refused, reset or cut, or the body broke off.
    Transport,
}

impl AttemptFailure {
    fn of_status(status: u16) -> Option<Self> {
        match status {
            429 | 503 => Some(Self::Throttled),
            408 => Some(Self::Timeout),
            500..=599 => Some(Self::ServerError),
            _ => None,
        }
    }

    fn of_error(error: &HttpError) -> Self {
        match error.kind() {
            HttpErrorKind::Timeout => Self::Timeout,
            _ => Self::Transport,
        }
    }
}

/// An HTTP status as a response carried it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpStatus {
    pub code: u16,
    /// The standard reason phrase (`Not Found`), when the code has one.
    pub reason: Option<&'static str>,
}

impl std::fmt::Display for HttpStatus {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.reason {
            Some(reason) => write!(formatter, "HTTP {} {reason}", self.code),
            None => write!(formatter, "HTTP {}", self.code),
        }
    }
}

/// The last HTTP attempt of one request, for its error message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastAttempt {
    /// `GET`, `PUT`, `HEAD`, `POST` (a bulk DELETE), ...
    pub method: String,
    /// The URL the attempt was sent to (the credentials are in headers).
    pub url: String,
    /// The response's status; `None` when no response came.
    pub status: Option<HttpStatus>,
    /// The transport failure the attempt met (no response, or a response
    /// whose body broke off).
    pub transport_failure: Option<HttpErrorKind>,
    /// Attempts the request made in all, this one included.
    pub attempts: u64,
}

/// A request's output with its last HTTP attempt (`None` when it made none).
pub struct Attempted<T> {
    pub output: T,
    pub last_attempt: Option<LastAttempt>,
}

/// One request (one call of the request wrapper) and where its attempts
/// count.
pub struct RequestAttempts {
    kind: RequestKind,
    counters: Arc<AttemptCounters>,
    /// The request's previous (or current) attempt.
    last_attempt: Mutex<Option<LastAttempt>>,
}

impl RequestAttempts {
    fn counters(&self) -> &KindCounters {
        &self.counters.kinds[kind_slot(self.kind)]
    }

    /// Counts a retry when `request` repeats the previous attempt.
    fn attempt_started(&self, request: &HttpRequest) {
        let method = request.method().to_string();
        let url = request.uri().to_string();
        let mut last = self.last_attempt.lock().expect("attempts lock");
        let attempts = last.as_ref().map_or(0, |previous| previous.attempts) + 1;
        if last
            .as_ref()
            .is_some_and(|previous| previous.method == method && previous.url == url)
        {
            self.counters().retries.fetch_add(1, Ordering::Relaxed);
        }
        *last = Some(LastAttempt {
            method,
            url,
            status: None,
            transport_failure: None,
            attempts,
        });
    }

    /// Notes what the current attempt met: a response's status, or a
    /// transport failure (before the response or while reading its body).
    fn met(&self, status: Option<HttpStatus>, transport_failure: Option<HttpErrorKind>) {
        let mut last = self.last_attempt.lock().expect("attempts lock");
        if let Some(attempt) = last.as_mut() {
            attempt.status = status.or(attempt.status);
            attempt.transport_failure = transport_failure.or(attempt.transport_failure);
        }
    }

    fn failed(&self, failure: AttemptFailure) {
        let counters = self.counters();
        let counter = match failure {
            AttemptFailure::Throttled => &counters.throttled,
            AttemptFailure::ServerError => &counters.server_errors,
            AttemptFailure::Timeout => &counters.timeouts,
            AttemptFailure::Transport => &counters.transport_errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

tokio::task_local! {
    /// The request whose future is being polled (see the module documentation).
    static CURRENT_REQUEST: Arc<RequestAttempts>;
}

/// Runs `request` (one request of `kind`) so that its HTTP attempts count in
/// `counters`; its output comes back with its last attempt.
pub async fn in_request<F: Future>(
    counters: &Arc<AttemptCounters>,
    kind: RequestKind,
    request: F,
) -> Attempted<F::Output> {
    let attempts = Arc::new(RequestAttempts {
        kind,
        counters: Arc::clone(counters),
        last_attempt: Mutex::new(None),
    });
    let output = CURRENT_REQUEST.scope(Arc::clone(&attempts), request).await;
    let last_attempt = attempts.last_attempt.lock().expect("attempts lock").take();
    Attempted {
        output,
        last_attempt,
    }
}

/// object_store's default connector, its clients wrapped in
/// [`CountingService`].
#[derive(Debug, Default)]
pub struct CountingConnector {
    inner: ReqwestConnector,
}

impl HttpConnector for CountingConnector {
    fn connect(&self, options: &object_store::ClientOptions) -> object_store::Result<HttpClient> {
        let inner = self.inner.connect(options)?;
        Ok(HttpClient::new(CountingService { inner }))
    }
}

/// Sends each attempt through the default client and counts what it met.
#[derive(Debug)]
struct CountingService {
    inner: HttpClient,
}

#[async_trait::async_trait]
impl HttpService for CountingService {
    async fn call(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let Ok(attempts) = CURRENT_REQUEST.try_with(Arc::clone) else {
            return self.inner.execute(request).await;
        };
        attempts.attempt_started(&request);
        match self.inner.execute(request).await {
            Ok(response) => {
                let status = response.status();
                attempts.met(
                    Some(HttpStatus {
                        code: status.as_u16(),
                        reason: status.canonical_reason(),
                    }),
                    None,
                );
                if let Some(failure) = AttemptFailure::of_status(status.as_u16()) {
                    attempts.failed(failure);
                }
                let (parts, body) = response.into_parts();
                let body = HttpResponseBody::new(CountingBody {
                    inner: body,
                    attempts,
                });
                Ok(HttpResponse::from_parts(parts, body))
            }
            Err(error) => {
                attempts.met(None, Some(error.kind()));
                attempts.failed(AttemptFailure::of_error(&error));
                Err(error)
            }
        }
    }
}

/// A response body that counts an error while it is read (a timeout or a
/// connection cut in the middle of a GET) against its request.
struct CountingBody {
    inner: HttpResponseBody,
    attempts: Arc<RequestAttempts>,
}

impl Body for CountingBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, HttpError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(context);
        if let Poll::Ready(Some(Err(error))) = &polled {
            self.attempts.met(None, Some(error.kind()));
            self.attempts.failed(AttemptFailure::of_error(error));
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_sorted_into_throttling_server_errors_and_timeouts() {
        assert_eq!(
            AttemptFailure::of_status(503),
            Some(AttemptFailure::Throttled)
        );
        assert_eq!(
            AttemptFailure::of_status(429),
            Some(AttemptFailure::Throttled)
        );
        assert_eq!(
            AttemptFailure::of_status(500),
            Some(AttemptFailure::ServerError)
        );
        assert_eq!(
            AttemptFailure::of_status(502),
            Some(AttemptFailure::ServerError)
        );
        assert_eq!(
            AttemptFailure::of_status(408),
            Some(AttemptFailure::Timeout)
        );
        for status in [200, 204, 206, 304, 404, 409, 412] {
            assert_eq!(AttemptFailure::of_status(status), None, "{status}");
        }
    }
}
