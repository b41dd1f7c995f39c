//! The object-store tier behind a fault-injecting HTTP proxy in front of a
//! real S3 server (SeaweedFS's `weed mini`): the proxy answers some attempts
//! itself (503 Slow Down with S3's XML error body, a cut connection, or
//! silence past the request timeout) and forwards the rest. Checks that the
//! tier's requests ride over the faults with the data intact, fail with an
//! error (never wrong data) when the faults outlast the retry deadline, and
//! that the tier's attempt counters (retries, throttled, timeouts, transport
//! errors) equal what the proxy injected, per kind of request.

// Sizes in tests are small constants: `as` between them is exact.
#![allow(clippy::cast_possible_truncation)]

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use lamina_device::{AlignedBuffer, BlockDevice};
use lamina_objects::test_support::SeaweedServer;
use lamina_objects::{
    LABEL_OBJECT_NAME, ObjectStoreConfig, ObjectStoreDevice, ObjectStoreLimits,
    ObjectStoreStatistics, RequestStatistics, TierGeometry,
};
use tokio::net::{TcpListener, TcpStream};

const MIB: u64 = 1 << 20;
const BLOCK: usize = 4096;

/// S3's answer to a client that sends too fast.
const SLOW_DOWN_BODY: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message><RequestId>lamina-fault-proxy</RequestId></Error>";

/// What the proxy does to the attempts it picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// 503 with S3's Slow Down body.
    SlowDown,
    /// Closes the connection without an answer.
    CutConnection,
    /// Answers nothing for this long (past the client's request timeout).
    Silence(Duration),
}

/// Which attempts the proxy spoils.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Schedule {
    /// None.
    Pass,
    /// The first attempt of the 1st, (1 + `every`)-th, (1 + 2 × `every`)-th
    /// ... request of each of the given kinds (or of all kinds); the
    /// attempt that repeats a spoiled one passes, so each fault costs
    /// exactly one retry.
    FirstAttemptOfEvery {
        every: u64,
        kinds: Option<&'static [&'static str]>,
    },
    /// Every attempt.
    All,
}

/// The proxy's state, shared by its connections.
struct ProxyState {
    upstream: SocketAddr,
    fault: Fault,
    schedule: Schedule,
    /// Requests seen by the schedule's count, per kind.
    requests_counted: HashMap<&'static str, u64>,
    /// Method, URI and range of attempts spoiled and not yet repeated.
    spoiled_awaiting_retry: HashSet<String>,
    /// Faults injected, per kind of request.
    injected: HashMap<&'static str, u64>,
}

/// The kind of request an attempt is, by the rule the tier's statistics
/// use: a LIST is a GET with `list-type=2`, a bulk DELETE a POST with
/// `?delete`, a label PUT a PUT of the label's key.
fn request_kind(request: &Request<Incoming>) -> &'static str {
    let query = request.uri().query().unwrap_or("");
    let path = request.uri().path();
    match request.method().as_str() {
        "GET" if query.contains("list-type=2") => "list",
        "GET" => "get",
        "PUT" if path.ends_with(&format!("/{LABEL_OBJECT_NAME}")) => "label_put",
        "PUT" => "put",
        "POST"
            if query
                .split('&')
                .any(|item| item == "delete" || item == "delete=") =>
        {
            "delete"
        }
        _ => "other",
    }
}

fn attempt_identity(request: &Request<Incoming>) -> String {
    let range = request
        .headers()
        .get(hyper::header::RANGE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    format!("{} {} {range}", request.method(), request.uri())
}

impl ProxyState {
    /// Whether to spoil this attempt (and count it as injected if so).
    fn spoil(&mut self, kind: &'static str, identity: String) -> bool {
        let spoil = match self.schedule {
            Schedule::Pass => false,
            Schedule::All => true,
            Schedule::FirstAttemptOfEvery { every, kinds } => {
                let retry = self.spoiled_awaiting_retry.remove(&identity);
                let chosen_kind = kinds.is_none_or(|kinds| kinds.contains(&kind));
                if retry || !chosen_kind {
                    false
                } else {
                    let counted = self.requests_counted.entry(kind).or_default();
                    let spoil = counted.is_multiple_of(every);
                    *counted += 1;
                    if spoil {
                        self.spoiled_awaiting_retry.insert(identity);
                    }
                    spoil
                }
            }
        };
        if spoil {
            *self.injected.entry(kind).or_default() += 1;
        }
        spoil
    }
}

/// A fault-injecting HTTP/1.1 proxy on a free loopback port. Aborted on drop.
struct FaultProxy {
    address: SocketAddr,
    state: Arc<Mutex<ProxyState>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultProxy {
    async fn start(upstream_endpoint: &str, fault: Fault) -> Self {
        let upstream: SocketAddr = upstream_endpoint
            .trim_start_matches("http://")
            .parse()
            .expect("the server's endpoint is http://IP:PORT");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(ProxyState {
            upstream,
            fault,
            schedule: Schedule::Pass,
            requests_counted: HashMap::new(),
            spoiled_awaiting_retry: HashSet::new(),
            injected: HashMap::new(),
        }));
        let shared = Arc::clone(&state);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let state = Arc::clone(&shared);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        handle(Arc::clone(&state), request)
                    });
                    // A cut connection ends here with an error: expected.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            address,
            state,
            task,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.address)
    }

    fn set_schedule(&self, schedule: Schedule) {
        let mut state = self.state.lock().unwrap();
        state.schedule = schedule;
        state.requests_counted.clear();
        state.spoiled_awaiting_retry.clear();
    }

    fn injected(&self, kind: &str) -> u64 {
        self.state
            .lock()
            .unwrap()
            .injected
            .get(kind)
            .copied()
            .unwrap_or(0)
    }

    fn injected_total(&self) -> u64 {
        self.state.lock().unwrap().injected.values().sum()
    }
}

/// Why the proxy gave up on an attempt (hyper then closes the connection).
#[derive(Debug, thiserror::Error)]
enum ProxyError {
    #[error("connection cut on purpose")]
    CutOnPurpose,
    #[error("upstream: {0}")]
    Upstream(String),
}

async fn handle(
    state: Arc<Mutex<ProxyState>>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, ProxyError> {
    let kind = request_kind(&request);
    let identity = attempt_identity(&request);
    let (spoil, fault, upstream) = {
        let mut state = state.lock().unwrap();
        (state.spoil(kind, identity), state.fault, state.upstream)
    };
    let (parts, body) = request.into_parts();
    // The whole body first, so that an answer of our own leaves the
    // connection in a state the client can reuse.
    let body = body
        .collect()
        .await
        .map_err(|error| ProxyError::Upstream(error.to_string()))?
        .to_bytes();
    if spoil {
        match fault {
            Fault::SlowDown => {
                let response = Response::builder()
                    .status(StatusCode::SERVICE_UNAVAILABLE)
                    .header(hyper::header::CONTENT_TYPE, "application/xml")
                    .body(Full::new(Bytes::from_static(SLOW_DOWN_BODY.as_bytes())))
                    .unwrap();
                return Ok(response);
            }
            Fault::CutConnection => return Err(ProxyError::CutOnPurpose),
            Fault::Silence(duration) => {
                tokio::time::sleep(duration).await;
                return Err(ProxyError::CutOnPurpose);
            }
        }
    }
    forward(upstream, Request::from_parts(parts, Full::new(body))).await
}

/// Sends `request` to the server on a connection of its own and returns its
/// whole answer.
async fn forward(
    upstream: SocketAddr,
    request: Request<Full<Bytes>>,
) -> Result<Response<Full<Bytes>>, ProxyError> {
    let upstream_error = |error: &dyn std::fmt::Display| ProxyError::Upstream(error.to_string());
    let stream = TcpStream::connect(upstream)
        .await
        .map_err(|error| upstream_error(&error))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|error| upstream_error(&error))?;
    tokio::spawn(connection);
    let response = sender
        .send_request(request)
        .await
        .map_err(|error| upstream_error(&error))?;
    let (parts, body) = response.into_parts();
    let body = body
        .collect()
        .await
        .map_err(|error| upstream_error(&error))?
        .to_bytes();
    Ok(Response::from_parts(parts, Full::new(body)))
}

/// A 64 MiB tier of 4 MiB segments whose grid starts at 1 MiB.
fn geometry() -> TierGeometry {
    TierGeometry::new(64 * MIB, 4 * MIB, MIB)
}

/// Short backoffs (the faults are many), a retry budget no single fault
/// exhausts, and a short request timeout for the silent proxy.
fn limits() -> ObjectStoreLimits {
    ObjectStoreLimits {
        request_timeout_ms: 1_000,
        connect_timeout_ms: 500,
        retries_max: 3,
        retry_timeout_ms: 10_000,
        retry_backoff_initial_ms: 10,
        retry_backoff_max_ms: 40,
        delete_retry_delay_ms: 100,
        ..ObjectStoreLimits::default()
    }
}

/// A server with bucket `tiers`, a proxy in front of it doing `fault`, and
/// a config for `s3://tiers/{prefix}` through the proxy.
async fn server_proxy_and_config(
    prefix: &str,
    fault: Fault,
    limits: ObjectStoreLimits,
) -> Option<(SeaweedServer, FaultProxy, ObjectStoreConfig)> {
    let server = SeaweedServer::start_or_skip()?;
    server.create_bucket("tiers").expect("create the bucket");
    let proxy = FaultProxy::start(&server.endpoint(), fault).await;
    let config = ObjectStoreConfig::from_url(&format!("s3://tiers/{prefix}"))
        .unwrap()
        .with_endpoint(proxy.endpoint())
        .with_region("us-east-1")
        .with_credentials(server.access_key_id(), server.secret_access_key())
        .with_allow_http(true)
        .with_limits(limits);
    Some((server, proxy, config))
}

fn pattern(blocks: usize, seed: u32) -> Arc<AlignedBuffer> {
    let mut buffer = AlignedBuffer::zeroed(blocks * BLOCK);
    for (index, chunk) in buffer.chunks_mut(4).enumerate() {
        let word = seed
            .wrapping_mul(2_654_435_761)
            .wrapping_add(u32::try_from(index).unwrap());
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    Arc::new(buffer)
}

fn by_kind(statistics: &ObjectStoreStatistics) -> [(&'static str, &RequestStatistics); 5] {
    [
        ("get", &statistics.get),
        ("put", &statistics.put),
        ("delete", &statistics.delete),
        ("list", &statistics.list),
        ("label_put", &statistics.label_put),
    ]
}

/// Writes across segments, flushes, reads back, reopens, reads again,
/// rewrites a segment in a new generation (so the deleter deletes the old
/// one) and reads everything back once more.
async fn workload(config: &ObjectStoreConfig) -> ObjectStoreStatistics {
    let device = ObjectStoreDevice::create(config, geometry()).await.unwrap();
    let first = pattern(9 * 256, 1);
    device.write(3 * MIB, first.clone()).await.unwrap();
    let second = pattern(64, 2);
    device.write(21 * MIB, second.clone()).await.unwrap();
    device.flush().await.unwrap();
    for offset in (0..9 * 256).step_by(64) {
        let read = device
            .read(3 * MIB + (offset * BLOCK) as u64, 64 * BLOCK)
            .await
            .unwrap();
        assert_eq!(&read[..], &first[offset * BLOCK..][..64 * BLOCK]);
    }
    let before_reopen = device.statistics();
    drop(device);

    let device = ObjectStoreDevice::open(config).await.unwrap();
    assert_eq!(
        &device.read(3 * MIB, 9 * 256 * BLOCK).await.unwrap()[..],
        &first[..]
    );
    device.open_region(21 * MIB, 4 * MIB).await.unwrap();
    let rewritten = pattern(32, 3);
    device.write(21 * MIB, rewritten.clone()).await.unwrap();
    device.flush().await.unwrap();
    let started = std::time::Instant::now();
    while device.statistics().objects_awaiting_deletion > 0 {
        assert!(started.elapsed() < Duration::from_secs(30), "deletions");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let read = device.read(21 * MIB, 64 * BLOCK).await.unwrap();
    assert_eq!(&read[..32 * BLOCK], &rewritten[..]);
    assert!(read[32 * BLOCK..].iter().all(|byte| *byte == 0));
    // The two opens' requests together.
    let mut statistics = device.statistics();
    for ((_, total), (_, earlier)) in by_kind_mut(&mut statistics)
        .into_iter()
        .zip(by_kind(&before_reopen))
    {
        total.count += earlier.count;
        total.errors += earlier.errors;
        total.retries += earlier.retries;
        total.throttled += earlier.throttled;
        total.server_errors += earlier.server_errors;
        total.timeouts += earlier.timeouts;
        total.transport_errors += earlier.transport_errors;
    }
    statistics
}

fn by_kind_mut(
    statistics: &mut ObjectStoreStatistics,
) -> [(&'static str, &mut RequestStatistics); 5] {
    [
        ("get", &mut statistics.get),
        ("put", &mut statistics.put),
        ("delete", &mut statistics.delete),
        ("list", &mut statistics.list),
        ("label_put", &mut statistics.label_put),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttled_attempts_are_retried_and_counted_per_kind_and_the_data_is_intact() {
    let Some((_server, proxy, config)) =
        server_proxy_and_config("throttled", Fault::SlowDown, limits()).await
    else {
        return;
    };
    proxy.set_schedule(Schedule::FirstAttemptOfEvery {
        every: 3,
        kinds: None,
    });
    let statistics = workload(&config).await;
    for (kind, request) in by_kind(&statistics) {
        let injected = proxy.injected(kind);
        assert!(injected > 0, "no {kind} was throttled: {statistics:?}");
        // The create's GET of the label finds none (404): its one error.
        let errors_expected = u64::from(kind == "get");
        assert_eq!(request.errors, errors_expected, "{kind}: {statistics:?}");
        assert_eq!(
            (request.throttled, request.retries),
            (injected, injected),
            "{kind}: {statistics:?}"
        );
        assert_eq!(
            (
                request.server_errors,
                request.timeouts,
                request.transport_errors
            ),
            (0, 0, 0),
            "{kind}"
        );
    }
    assert_eq!(proxy.injected("other"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_connections_and_timeouts_of_reads_are_retried_and_counted() {
    for (fault, prefix) in [
        (Fault::CutConnection, "cut"),
        (Fault::Silence(Duration::from_millis(1_500)), "silent"),
    ] {
        let Some((_server, proxy, config)) = server_proxy_and_config(prefix, fault, limits()).await
        else {
            return;
        };
        // GETs only: a PUT whose answer never came may have landed, and
        // object_store retries only idempotent requests after a timeout.
        proxy.set_schedule(Schedule::FirstAttemptOfEvery {
            every: 5,
            kinds: Some(&["get"]),
        });
        let statistics = workload(&config).await;
        let injected = proxy.injected("get");
        assert!(injected > 0, "{fault:?}: {statistics:?}");
        let get = &statistics.get;
        // The create's GET of the label finds none (404): its one error.
        assert_eq!(get.errors, 1, "{fault:?}: {statistics:?}");
        assert_eq!(get.retries, injected, "{fault:?}: {statistics:?}");
        let (timeouts, transport_errors) = match fault {
            Fault::Silence(_) => (injected, 0),
            _ => (0, injected),
        };
        assert_eq!(
            (get.timeouts, get.transport_errors, get.throttled),
            (timeouts, transport_errors, 0),
            "{fault:?}: {statistics:?}"
        );
        for (kind, request) in by_kind(&statistics) {
            if kind != "get" {
                assert_eq!(request.retries, 0, "{fault:?} {kind}: {statistics:?}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_past_the_retry_deadline_fails_requests_with_an_error_and_counts_their_retries()
{
    let Some((_server, proxy, config)) =
        server_proxy_and_config("refused", Fault::SlowDown, limits()).await
    else {
        return;
    };
    let device = ObjectStoreDevice::create(&config, geometry())
        .await
        .unwrap();
    let stored = pattern(16, 4);
    device.write(MIB, stored.clone()).await.unwrap();
    device.flush().await.unwrap();

    // Every attempt refused: each request makes its 1 + retries_max attempts.
    let before = device.statistics();
    proxy.set_schedule(Schedule::All);
    let pending = pattern(16, 5);
    device.write(13 * MIB, pending.clone()).await.unwrap();
    device
        .flush()
        .await
        .expect_err("a flush with every attempt throttled");
    let error = device
        .read(MIB, 16 * BLOCK)
        .await
        .expect_err("a read of stored data with every attempt throttled");
    assert!(
        matches!(error.kind, lamina_device::DeviceErrorKind::Io(_)),
        "{error}"
    );
    // Written data still reads back from memory.
    assert_eq!(
        &device.read(13 * MIB, 16 * BLOCK).await.unwrap()[..],
        &pending[..]
    );
    let statistics = device.statistics();
    let retries_max = limits().retries_max as u64;
    for ((kind, request), (_, earlier)) in by_kind(&statistics).into_iter().zip(by_kind(&before)) {
        let injected = proxy.injected(kind);
        let failed = request.errors - earlier.errors;
        assert_eq!(
            (earlier.throttled, earlier.retries),
            (0, 0),
            "{kind}: {before:?}"
        );
        assert_eq!(request.throttled, injected, "{kind}: {statistics:?}");
        // Every throttled attempt but each failed request's last was retried.
        assert_eq!(request.retries, injected - failed, "{kind}: {statistics:?}");
        assert_eq!(injected, failed * (1 + retries_max), "{kind}");
    }
    assert!(statistics.put.errors > before.put.errors);
    assert!(statistics.get.errors > before.get.errors);
    let injected_while_refusing = proxy.injected_total();

    // The store answers again: the same data, the pending write stored.
    proxy.set_schedule(Schedule::Pass);
    assert_eq!(
        &device.read(MIB, 16 * BLOCK).await.unwrap()[..],
        &stored[..]
    );
    device
        .flush()
        .await
        .expect("a flush once the store answers");
    assert_eq!(proxy.injected_total(), injected_while_refusing);
    drop(device);
    let reopened = ObjectStoreDevice::open(&config).await.unwrap();
    assert_eq!(
        &reopened.read(13 * MIB, 16 * BLOCK).await.unwrap()[..],
        &pending[..]
    );
}
