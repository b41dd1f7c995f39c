//! The server: the accept loops for TCP and Unix sockets with the connection
//! and handshake limits (the limits are in `config.rs`, the handshake registry
//! in `admission.rs`), counters, graceful shutdown, and [`serve_connection`],
//! which runs one connection's handshake and transmission.

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::access::{
    AccessPolicy, ClientIdentity, ConnectionSecurity, LoopbackOwner, UnixCredentials,
};
use crate::admission::{
    Eviction, EvictionReason, HandshakeTicket, Handshakes, PeerKey, RateLimitedWarning,
};
use crate::backend::ExportCatalog;
use crate::config::{ConfigError, ServerConfig};
use crate::connection_threads::{ConnectionThreads, SpinRegistration};
use crate::error::ConnectionError;
use crate::handshake::{self, HandshakeOutcome};
use crate::loopback_owner::{ConnectionEnds, loopback_owner_uid};
use crate::tls::{ServerTls, Transport};
use crate::transmission;

/// Serves one connection (handshake, then transmission) until the client leaves.
/// Used by the accept loops and by tests that bring their own stream.
pub async fn serve_connection<S>(
    stream: S,
    catalog: Arc<dyn ExportCatalog>,
    config: &ServerConfig,
) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    serve_connection_until(stream, catalog, config, CancellationToken::new()).await
}

/// Like [`serve_connection`], but stops reading requests once `shutdown` is
/// cancelled, answers those in flight, and closes.
pub async fn serve_connection_until<S>(
    stream: S,
    catalog: Arc<dyn ExportCatalog>,
    config: &ServerConfig,
    shutdown: CancellationToken,
) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    config.validate()?;
    serve_admitted(
        stream,
        catalog,
        config,
        shutdown,
        None,
        ConnectionSecurity::default(),
    )
    .await
}

/// Like [`serve_connection_until`], with a listener's TLS, an access policy
/// and the client's identity (as the accept loops gather it).
pub async fn serve_connection_with<S>(
    stream: S,
    catalog: Arc<dyn ExportCatalog>,
    config: &ServerConfig,
    tls: Option<Arc<ServerTls>>,
    access: Option<Arc<dyn AccessPolicy>>,
    identity: ClientIdentity,
    shutdown: CancellationToken,
) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    config.validate()?;
    let security = ConnectionSecurity {
        tls,
        access,
        identity,
    };
    serve_admitted(stream, catalog, config, shutdown, None, security).await
}

/// What the accept loop gives a connection: its place among the handshakes in
/// progress, and the transmission slots it must take one of when its handshake
/// completes.
struct Admitted {
    ticket: HandshakeTicket,
    transmission_slots: Arc<Semaphore>,
}

/// Runs the handshake (bounded by the timeout, by shutdown and, for an
/// admitted connection, by eviction), then the transmission phase.
async fn serve_admitted<S>(
    stream: S,
    catalog: Arc<dyn ExportCatalog>,
    config: &ServerConfig,
    shutdown: CancellationToken,
    admitted: Option<Admitted>,
    security: ConnectionSecurity,
) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let mut stream = Transport::Plain(stream);
    let (ticket, transmission_slots) = match admitted {
        Some(admitted) => (Some(admitted.ticket), Some(admitted.transmission_slots)),
        None => (None, None),
    };
    let timeout = Duration::from_millis(config.handshake_timeout_ms);
    let outcome = {
        let evicted = async {
            match &ticket {
                Some(ticket) => ticket.evicted().await,
                None => std::future::pending().await,
            }
        };
        let handshake = handshake::run(
            &mut stream,
            catalog.as_ref(),
            config,
            security,
            transmission_slots,
        );
        tokio::select! {
            _ = shutdown.cancelled() => {
                tracing::debug!("shutdown during handshake");
                return Ok(());
            }
            _ = evicted => return Err(ConnectionError::HandshakeEvicted),
            outcome = tokio::time::timeout(timeout, handshake) => {
                outcome.map_err(|_| ConnectionError::HandshakeTimeout(config.handshake_timeout_ms))??
            }
        }
    };
    // The handshake slot is free as soon as the handshake is over.
    drop(ticket);
    match outcome {
        HandshakeOutcome::Closed => {
            let _ = stream.shutdown().await;
            Ok(())
        }
        HandshakeOutcome::Transmission(mut negotiated) => {
            tracing::debug!(
                export = %negotiated.summary.name,
                size_bytes = negotiated.context.export_size_bytes,
                structured_replies = negotiated.context.structured_replies,
                base_allocation = negotiated.context.base_allocation,
                "transmission phase"
            );
            // Held until the transmission phase ends.
            let _transmission_slot = negotiated.transmission_slot.take();
            transmission::run(stream, negotiated, config, shutdown).await
        }
    }
}

/// What a server has refused and closed, and what it is serving now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerCounters {
    /// Connections in the transmission phase right now.
    pub connections: usize,
    /// Connections in the handshake right now.
    pub handshakes_in_progress: usize,
    /// Connections closed because every `connections_max` slot was taken, at
    /// accept or when their handshake completed.
    pub refused_connections: u64,
    /// Handshakes closed because a new connection came from a peer at
    /// `handshakes_per_peer_max`.
    pub handshakes_closed_for_peer_limit: u64,
    /// Handshakes closed because a new connection came while
    /// `handshakes_in_progress_max` were in progress.
    pub handshakes_closed_for_total_limit: u64,
    /// Handshakes closed by `handshake_timeout_ms`.
    pub handshakes_timed_out: u64,
    /// Connections closed because their TLS handshake failed (bad or missing
    /// client certificate, garbage after STARTTLS, a client that went away).
    pub tls_handshakes_failed: u64,
    /// Connections closed because they chose an export with
    /// `NBD_OPT_EXPORT_NAME` before STARTTLS on a listener requiring TLS.
    pub tls_required_closed: u64,
}

/// Interval between two warnings of one kind about refused or closed
/// connections; the ones in between are counted and summed into the next.
const LIMIT_WARNING_INTERVAL_MS: u64 = 10_000;

/// The server's counters and the rate limits of the warnings that go with them.
struct Counters {
    refused_connections: AtomicU64,
    handshakes_closed_for_peer_limit: AtomicU64,
    handshakes_closed_for_total_limit: AtomicU64,
    handshakes_timed_out: AtomicU64,
    tls_handshakes_failed: AtomicU64,
    tls_required_closed: AtomicU64,
    refused_warning: RateLimitedWarning,
    eviction_warning: RateLimitedWarning,
    timeout_warning: RateLimitedWarning,
    tls_warning: RateLimitedWarning,
}

impl Counters {
    fn new() -> Self {
        let warning = || RateLimitedWarning::new(Duration::from_millis(LIMIT_WARNING_INTERVAL_MS));
        Counters {
            refused_connections: AtomicU64::new(0),
            handshakes_closed_for_peer_limit: AtomicU64::new(0),
            handshakes_closed_for_total_limit: AtomicU64::new(0),
            handshakes_timed_out: AtomicU64::new(0),
            tls_handshakes_failed: AtomicU64::new(0),
            tls_required_closed: AtomicU64::new(0),
            refused_warning: warning(),
            eviction_warning: warning(),
            timeout_warning: warning(),
            tls_warning: warning(),
        }
    }

    fn record_refusal(&self, peer: &str, config: &ServerConfig) {
        self.refused_connections.fetch_add(1, Ordering::Relaxed);
        if let Some(suppressed) = self.refused_warning.allow() {
            tracing::warn!(
                peer,
                connections_max = config.connections_max,
                refused_total = self.refused_connections.load(Ordering::Relaxed),
                suppressed,
                "connection limit reached; closing connection"
            );
        }
    }

    fn record_eviction(&self, eviction: Eviction, config: &ServerConfig) {
        let (counter, limit, reason) = match eviction.reason {
            EvictionReason::PeerLimit => (
                &self.handshakes_closed_for_peer_limit,
                config.handshakes_per_peer_max,
                "handshakes_per_peer_max",
            ),
            EvictionReason::TotalLimit => (
                &self.handshakes_closed_for_total_limit,
                config.handshakes_in_progress_max,
                "handshakes_in_progress_max",
            ),
        };
        let closed_total = counter.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(suppressed) = self.eviction_warning.allow() {
            tracing::warn!(
                peer = %eviction.peer,
                reason,
                limit,
                closed_total,
                suppressed,
                "handshake limit reached; closed the peer's oldest unfinished handshake"
            );
        }
    }

    /// Counts and logs how a connection ended: limits and timeouts at a
    /// rate-limited WARN (a flood must not flood the log), the rest at INFO.
    fn record_end(&self, peer: &str, result: &Result<(), ConnectionError>, config: &ServerConfig) {
        match result {
            Ok(()) => tracing::debug!(peer, "connection closed"),
            Err(ConnectionError::HandshakeTimeout(timeout_ms)) => {
                let timed_out_total = self.handshakes_timed_out.fetch_add(1, Ordering::Relaxed) + 1;
                if let Some(suppressed) = self.timeout_warning.allow() {
                    tracing::warn!(
                        peer,
                        handshake_timeout_ms = timeout_ms,
                        timed_out_total,
                        suppressed,
                        "handshake not finished in time; connection closed"
                    );
                }
            }
            Err(ConnectionError::ConnectionLimit(_)) => self.record_refusal(peer, config),
            Err(error @ (ConnectionError::Tls(_) | ConnectionError::TlsRequired)) => {
                let counter = if matches!(error, ConnectionError::Tls(_)) {
                    &self.tls_handshakes_failed
                } else {
                    &self.tls_required_closed
                };
                let total = counter.fetch_add(1, Ordering::Relaxed) + 1;
                if let Some(suppressed) = self.tls_warning.allow() {
                    tracing::warn!(peer, %error, total, suppressed, "connection closed");
                }
            }
            // Counted and logged when it was chosen.
            Err(error @ ConnectionError::HandshakeEvicted) => {
                tracing::debug!(peer, %error, "connection closed")
            }
            Err(error) => tracing::info!(peer, %error, "connection closed"),
        }
    }
}

/// An NBD server over a catalog of exports. One server may accept on several
/// listeners at once; they share the connection and handshake limits.
pub struct NbdServer {
    catalog: Arc<dyn ExportCatalog>,
    config: Arc<ServerConfig>,
    /// Transmission slots (`connections_max`), taken when a handshake completes.
    connections: Arc<Semaphore>,
    handshakes: Arc<Handshakes>,
    counters: Arc<Counters>,
    /// Who may open which export; `None` lets every client open every one.
    access: Option<Arc<dyn AccessPolicy>>,
    /// Where connections are served; `None`: on the accept loop's runtime.
    threads: Option<Arc<ConnectionThreads>>,
}

impl std::fmt::Debug for NbdServer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("NbdServer")
            .field("config", &self.config)
            .field("counters", &self.counters())
            .finish()
    }
}

/// Who a new connection comes from: the key its limits are counted under, a
/// description for the log, and its identity for the access policy.
struct Peer {
    key: PeerKey,
    description: String,
    identity: ClientIdentity,
}

/// A connection just accepted, with who it comes from.
struct Accepted<S> {
    stream: S,
    peer: Peer,
}

/// A listener the accept loop can take connections from.
trait Accept {
    type Stream: AsyncRead + AsyncWrite + AsRawFd + Send + Unpin + 'static;
    /// The stream as a plain socket, registered with no runtime, so that it can
    /// move to a connection thread.
    type Detached: Send + 'static;
    async fn accept_one(&self) -> std::io::Result<Accepted<Self::Stream>>;
    fn detach(stream: Self::Stream) -> std::io::Result<Self::Detached>;
    /// Registers the socket with the runtime of the calling task.
    fn attach(detached: Self::Detached) -> std::io::Result<Self::Stream>;
}

impl Accept for TcpListener {
    type Stream = tokio::net::TcpStream;
    type Detached = std::net::TcpStream;
    fn detach(stream: Self::Stream) -> std::io::Result<Self::Detached> {
        stream.into_std()
    }
    fn attach(detached: Self::Detached) -> std::io::Result<Self::Stream> {
        tokio::net::TcpStream::from_std(detached)
    }
    async fn accept_one(&self) -> std::io::Result<Accepted<Self::Stream>> {
        let (stream, address) = self.accept().await?;
        // Replies are small and latency matters more than packet count.
        stream.set_nodelay(true)?;
        let loopback_owner = address
            .ip()
            .to_canonical()
            .is_loopback()
            .then(|| find_loopback_owner(address, stream.local_addr()));
        let peer = Peer {
            key: PeerKey::Address(address.ip().to_canonical()),
            description: address.to_string(),
            identity: ClientIdentity {
                address: Some(address.ip().to_canonical()),
                loopback_owner,
                ..ClientIdentity::default()
            },
        };
        Ok(Accepted { stream, peer })
    }
}

/// Who owns the socket of the loopback client at `client` (one netlink round
/// trip, microseconds); the failure, with its reason, otherwise.
fn find_loopback_owner(
    client: std::net::SocketAddr,
    server: std::io::Result<std::net::SocketAddr>,
) -> LoopbackOwner {
    let result = server
        .map_err(|error| format!("cannot read the server's address: {error}"))
        .and_then(|server| {
            loopback_owner_uid(ConnectionEnds { client, server }).map_err(|error| error.to_string())
        });
    match result {
        Ok(uid) => LoopbackOwner::Uid(uid),
        Err(reason) => {
            tracing::debug!(peer = %client, reason, "cannot find who owns a loopback client's socket");
            LoopbackOwner::Unknown(reason)
        }
    }
}

impl Accept for UnixListener {
    type Stream = tokio::net::UnixStream;
    type Detached = std::os::unix::net::UnixStream;
    fn detach(stream: Self::Stream) -> std::io::Result<Self::Detached> {
        stream.into_std()
    }
    fn attach(detached: Self::Detached) -> std::io::Result<Self::Stream> {
        tokio::net::UnixStream::from_std(detached)
    }
    async fn accept_one(&self) -> std::io::Result<Accepted<Self::Stream>> {
        let (stream, _address) = self.accept().await?;
        let (key, unix) = match stream.peer_cred() {
            Ok(credentials) => (
                PeerKey::Uid(credentials.uid()),
                Some(UnixCredentials {
                    uid: credentials.uid(),
                    gid: credentials.gid(),
                    pid: credentials.pid(),
                }),
            ),
            Err(error) => {
                tracing::debug!(%error, "cannot read the Unix peer's credentials");
                (PeerKey::Unknown, None)
            }
        };
        let description = key.to_string();
        let identity = ClientIdentity {
            unix,
            ..ClientIdentity::default()
        };
        Ok(Accepted {
            stream,
            peer: Peer {
                key,
                description,
                identity,
            },
        })
    }
}

/// What a connection's task needs, gathered by the accept loop.
struct ConnectionStart {
    catalog: Arc<dyn ExportCatalog>,
    config: Arc<ServerConfig>,
    counters: Arc<Counters>,
    shutdown: CancellationToken,
    admitted: Admitted,
    security: ConnectionSecurity,
    peer: String,
}

impl ConnectionStart {
    /// Serves the connection to its end and counts how it ended.
    async fn run<S>(self, stream: S)
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        tracing::debug!(peer = self.peer, "connection accepted");
        let result = serve_admitted(
            stream,
            self.catalog,
            &self.config,
            self.shutdown,
            Some(self.admitted),
            self.security,
        )
        .await;
        self.counters.record_end(&self.peer, &result, &self.config);
    }
}

/// Pause after a failed accept (for example too many open files), so the loop
/// does not spin.
const ACCEPT_ERROR_PAUSE_MS: u64 = 100;

impl NbdServer {
    /// A server for `catalog` with `config` (checked here).
    pub fn new(catalog: Arc<dyn ExportCatalog>, config: ServerConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let connections = Arc::new(Semaphore::new(config.connections_max));
        let handshakes = Arc::new(Handshakes::new(
            config.handshakes_in_progress_max,
            config.handshakes_per_peer_max,
        ));
        Ok(NbdServer {
            catalog,
            config: Arc::new(config),
            connections,
            handshakes,
            counters: Arc::new(Counters::new()),
            access: None,
            threads: None,
        })
    }

    /// The server with `policy` deciding which exports each client may open.
    pub fn with_access_policy(mut self, policy: Arc<dyn AccessPolicy>) -> Self {
        self.access = Some(policy);
        self
    }

    /// The server placing each connection on one of `threads`, which serve it
    /// from its handshake to its end (decision 0048).
    pub fn with_connection_threads(mut self, threads: Arc<ConnectionThreads>) -> Self {
        self.threads = Some(threads);
        self
    }

    /// The connection threads, if the server has them.
    pub fn connection_threads(&self) -> Option<&Arc<ConnectionThreads>> {
        self.threads.as_ref()
    }

    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// Connections in the transmission phase right now, over all listeners.
    pub fn active_connection_count(&self) -> usize {
        self.config.connections_max - self.connections.available_permits()
    }

    /// Connections closed because `connections_max` was reached.
    pub fn refused_connection_count(&self) -> u64 {
        self.counters.refused_connections.load(Ordering::Relaxed)
    }

    /// Every counter at once.
    pub fn counters(&self) -> ServerCounters {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ServerCounters {
            connections: self.active_connection_count(),
            handshakes_in_progress: self.handshakes.in_progress(),
            refused_connections: load(&self.counters.refused_connections),
            handshakes_closed_for_peer_limit: load(&self.counters.handshakes_closed_for_peer_limit),
            handshakes_closed_for_total_limit: load(
                &self.counters.handshakes_closed_for_total_limit,
            ),
            handshakes_timed_out: load(&self.counters.handshakes_timed_out),
            tls_handshakes_failed: load(&self.counters.tls_handshakes_failed),
            tls_required_closed: load(&self.counters.tls_required_closed),
        }
    }

    /// Accepts TCP connections until `shutdown` is cancelled, then waits for every
    /// connection to finish its in-flight requests and returns.
    pub async fn serve_tcp(&self, listener: TcpListener, shutdown: CancellationToken) {
        self.serve(listener, None, shutdown).await;
    }

    /// Accepts Unix-socket connections; see [`NbdServer::serve_tcp`].
    pub async fn serve_unix(&self, listener: UnixListener, shutdown: CancellationToken) {
        self.serve(listener, None, shutdown).await;
    }

    /// Like [`NbdServer::serve_tcp`], offering or requiring `tls` (`None`:
    /// STARTTLS is refused).
    pub async fn serve_tcp_with_tls(
        &self,
        listener: TcpListener,
        tls: Option<Arc<ServerTls>>,
        shutdown: CancellationToken,
    ) {
        self.serve(listener, tls, shutdown).await;
    }

    /// Like [`NbdServer::serve_unix`], offering or requiring `tls`.
    pub async fn serve_unix_with_tls(
        &self,
        listener: UnixListener,
        tls: Option<Arc<ServerTls>>,
        shutdown: CancellationToken,
    ) {
        self.serve(listener, tls, shutdown).await;
    }

    /// Admits a new connection and starts serving it, on a connection thread
    /// when the server has them, unless every transmission slot is taken: then
    /// it could not be served even once its handshake completed, so it is
    /// closed before the greeting.
    fn start_connection<L: Accept>(
        &self,
        connections: &mut JoinSet<()>,
        stream: L::Stream,
        peer: Peer,
        tls: Option<Arc<ServerTls>>,
        shutdown: &CancellationToken,
    ) {
        if self.connections.available_permits() == 0 {
            self.counters
                .record_refusal(&peer.description, &self.config);
            drop(stream);
            return;
        }
        let admission = self.handshakes.admit(peer.key);
        if let Some(eviction) = admission.eviction {
            self.counters.record_eviction(eviction, &self.config);
        }
        let admitted = Admitted {
            ticket: admission.ticket,
            transmission_slots: Arc::clone(&self.connections),
        };
        let start = ConnectionStart {
            catalog: Arc::clone(&self.catalog),
            config: Arc::clone(&self.config),
            counters: Arc::clone(&self.counters),
            shutdown: shutdown.child_token(),
            admitted,
            security: ConnectionSecurity {
                tls,
                access: self.access.clone(),
                identity: peer.identity,
            },
            peer: peer.description,
        };
        let Some(threads) = &self.threads else {
            connections.spawn(start.run(stream));
            return;
        };
        let detached = match L::detach(stream) {
            Ok(detached) => detached,
            Err(error) => {
                tracing::warn!(peer = start.peer, %error, "cannot hand the connection to a connection thread");
                return;
            }
        };
        let placement = threads.place();
        connections.spawn_on(
            async move {
                let _placed = placement.guard;
                match L::attach(detached) {
                    Ok(stream) => {
                        let _spin = SpinRegistration::new(stream.as_raw_fd());
                        start.run(stream).await;
                    }
                    Err(error) => {
                        tracing::warn!(peer = start.peer, %error, "cannot serve the connection on its thread");
                    }
                }
            },
            &placement.handle,
        );
    }

    async fn serve<L: Accept>(
        &self,
        listener: L,
        tls: Option<Arc<ServerTls>>,
        shutdown: CancellationToken,
    ) {
        let mut connections = JoinSet::new();
        loop {
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => break,
                accepted = listener.accept_one() => accepted,
                // Reap finished connections so the set does not grow.
                Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            };
            match accepted {
                Ok(Accepted { stream, peer }) => {
                    let tls = tls.clone();
                    self.start_connection::<L>(&mut connections, stream, peer, tls, &shutdown)
                }
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_PAUSE_MS)).await;
                }
            }
        }
        tracing::info!(
            connections = connections.len(),
            "shutting down: waiting for connections to finish in-flight requests"
        );
        let grace = Duration::from_millis(self.config.shutdown_timeout_ms);
        let drained = tokio::time::timeout(grace, async {
            while connections.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                connections = connections.len(),
                shutdown_timeout_ms = self.config.shutdown_timeout_ms,
                "connections did not finish in time; dropping them"
            );
            connections.shutdown().await;
        }
    }
}
