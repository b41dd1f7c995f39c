//! The server: configuration with its named limits, the accept loops for TCP and
//! Unix sockets with a connection limit and graceful shutdown, and
//! [`serve_connection`], which runs one connection's handshake and transmission.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::backend::ExportCatalog;
use crate::handshake::{self, HandshakeOutcome};
use crate::transmission;
use crate::wire::{self, WireError};

/// Limits and timeouts of an NBD server. Every field is a named limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Largest READ or WRITE accepted, advertised as the maximum block size.
    pub max_request_bytes: u32,
    /// Requests of one connection being executed or waiting to be written at once.
    pub in_flight_requests_max: usize,
    /// Read and write buffers one connection may hold at once (one request larger
    /// than this may still run, alone).
    pub in_flight_bytes_max: u32,
    /// Connections served at once; further connections are closed at once.
    pub connections_max: usize,
    /// Largest option data accepted during the handshake.
    pub option_bytes_max: u32,
    /// Options accepted in one handshake before the server hangs up.
    pub handshake_options_max: u32,
    /// Time a client has to finish the handshake.
    pub handshake_timeout_ms: u64,
    /// Descriptors sent in one block-status reply at most.
    pub block_status_descriptors_max: u32,
    /// Time connections get to finish in-flight requests after shutdown is
    /// requested, before they are dropped.
    pub shutdown_timeout_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_request_bytes: 32 * 1024 * 1024,
            in_flight_requests_max: 64,
            in_flight_bytes_max: 128 * 1024 * 1024,
            connections_max: 256,
            option_bytes_max: 64 * 1024,
            handshake_options_max: 1024,
            handshake_timeout_ms: 30_000,
            block_status_descriptors_max: 16 * 1024,
            shutdown_timeout_ms: 30_000,
        }
    }
}

/// Largest `max_request_bytes` allowed: a read must fit one data chunk, whose
/// length field is 32 bits including an 8-byte offset.
pub const MAX_REQUEST_BYTES_LIMIT: u32 = 1 << 30;

/// A configuration value out of its allowed range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("server configuration: {field} = {value} is outside {allowed}")]
pub struct ConfigError {
    pub field: &'static str,
    pub value: u64,
    pub allowed: &'static str,
}

impl ServerConfig {
    /// Checks every limit is usable.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let check = |field, value: u64, ok: bool, allowed| {
            if ok {
                Ok(())
            } else {
                Err(ConfigError {
                    field,
                    value,
                    allowed,
                })
            }
        };
        let request = self.max_request_bytes;
        check(
            "max_request_bytes",
            u64::from(request),
            (handshake::PREFERRED_BLOCK_BYTES..=MAX_REQUEST_BYTES_LIMIT).contains(&request),
            "4096..=1073741824",
        )?;
        check(
            "in_flight_requests_max",
            self.in_flight_requests_max as u64,
            (1..=65536).contains(&self.in_flight_requests_max),
            "1..=65536",
        )?;
        check(
            "in_flight_bytes_max",
            u64::from(self.in_flight_bytes_max),
            self.in_flight_bytes_max >= 1
                && (self.in_flight_bytes_max as usize) <= Semaphore::MAX_PERMITS,
            ">= 1",
        )?;
        check(
            "connections_max",
            self.connections_max as u64,
            (1..=Semaphore::MAX_PERMITS).contains(&self.connections_max),
            ">= 1",
        )?;
        check(
            "option_bytes_max",
            u64::from(self.option_bytes_max),
            self.option_bytes_max as usize >= wire::STRING_BYTES_MAX + 8,
            ">= 4104 (a maximal export name with its framing)",
        )?;
        check(
            "handshake_options_max",
            u64::from(self.handshake_options_max),
            self.handshake_options_max >= 1,
            ">= 1",
        )?;
        check(
            "block_status_descriptors_max",
            u64::from(self.block_status_descriptors_max),
            (1..=1 << 20).contains(&self.block_status_descriptors_max),
            "1..=1048576",
        )?;
        Ok(())
    }
}

/// Why one connection ended other than by the client's clean goodbye.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("socket error: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol violation: {0}")]
    Wire(#[from] WireError),
    #[error("connection closed in the middle of a {0}")]
    Truncated(&'static str),
    #[error("option {option} carries {data_bytes} bytes, over the {limit_bytes}-byte limit")]
    OptionTooBig {
        option: u32,
        data_bytes: u32,
        limit_bytes: u32,
    },
    #[error("more than {0} options in one handshake")]
    TooManyOptions(u32),
    #[error("NBD_OPT_EXPORT_NAME asked for unknown export {0:?}")]
    UnknownExport(String),
    #[error("handshake not finished within {0} ms")]
    HandshakeTimeout(u64),
    #[error(transparent)]
    Config(#[from] ConfigError),
}

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
    mut stream: S,
    catalog: Arc<dyn ExportCatalog>,
    config: &ServerConfig,
    shutdown: CancellationToken,
) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    config.validate()?;
    let timeout = Duration::from_millis(config.handshake_timeout_ms);
    let outcome = tokio::select! {
        _ = shutdown.cancelled() => {
            tracing::debug!("shutdown during handshake");
            return Ok(());
        }
        outcome = tokio::time::timeout(timeout, handshake::run(&mut stream, catalog.as_ref(), config)) => {
            outcome.map_err(|_| ConnectionError::HandshakeTimeout(config.handshake_timeout_ms))??
        }
    };
    match outcome {
        HandshakeOutcome::Closed => {
            let _ = stream.shutdown().await;
            Ok(())
        }
        HandshakeOutcome::Transmission(negotiated) => {
            tracing::debug!(
                export = %negotiated.summary.name,
                size_bytes = negotiated.context.export_size_bytes,
                structured_replies = negotiated.context.structured_replies,
                base_allocation = negotiated.context.base_allocation,
                "transmission phase"
            );
            transmission::run(stream, negotiated, config, shutdown).await
        }
    }
}

/// An NBD server over a catalog of exports. One server may accept on several
/// listeners at once; they share the connection limit.
pub struct NbdServer {
    catalog: Arc<dyn ExportCatalog>,
    config: Arc<ServerConfig>,
    connections: Arc<Semaphore>,
    refused_connection_count: AtomicU64,
}

impl std::fmt::Debug for NbdServer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("NbdServer")
            .field("config", &self.config)
            .field("active_connections", &self.active_connection_count())
            .finish()
    }
}

/// A listener the accept loop can take connections from.
trait Accept {
    type Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static;
    async fn accept_one(&self) -> std::io::Result<(Self::Stream, String)>;
}

impl Accept for TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn accept_one(&self) -> std::io::Result<(Self::Stream, String)> {
        let (stream, peer) = self.accept().await?;
        // Replies are small and latency matters more than packet count.
        stream.set_nodelay(true)?;
        Ok((stream, peer.to_string()))
    }
}

impl Accept for UnixListener {
    type Stream = tokio::net::UnixStream;
    async fn accept_one(&self) -> std::io::Result<(Self::Stream, String)> {
        let (stream, _peer) = self.accept().await?;
        Ok((stream, "unix".to_string()))
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
        Ok(NbdServer {
            catalog,
            config: Arc::new(config),
            connections,
            refused_connection_count: AtomicU64::new(0),
        })
    }

    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// Connections being served right now, over all listeners.
    pub fn active_connection_count(&self) -> usize {
        self.config.connections_max - self.connections.available_permits()
    }

    /// Connections closed at once because `connections_max` was reached.
    pub fn refused_connection_count(&self) -> u64 {
        self.refused_connection_count.load(Ordering::Relaxed)
    }

    /// Accepts TCP connections until `shutdown` is cancelled, then waits for every
    /// connection to finish its in-flight requests and returns.
    pub async fn serve_tcp(&self, listener: TcpListener, shutdown: CancellationToken) {
        self.serve(listener, shutdown).await;
    }

    /// Accepts Unix-socket connections; see [`NbdServer::serve_tcp`].
    pub async fn serve_unix(&self, listener: UnixListener, shutdown: CancellationToken) {
        self.serve(listener, shutdown).await;
    }

    async fn serve<L: Accept>(&self, listener: L, shutdown: CancellationToken) {
        let mut connections = JoinSet::new();
        loop {
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => break,
                accepted = listener.accept_one() => accepted,
                // Reap finished connections so the set does not grow.
                Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_PAUSE_MS)).await;
                    continue;
                }
            };
            let Ok(permit) = self.connections.clone().try_acquire_owned() else {
                self.refused_connection_count
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    peer,
                    connections_max = self.config.connections_max,
                    "connection limit reached; closing new connection"
                );
                drop(stream);
                continue;
            };
            let catalog = Arc::clone(&self.catalog);
            let config = Arc::clone(&self.config);
            let connection_shutdown = shutdown.child_token();
            connections.spawn(async move {
                tracing::debug!(peer, "connection accepted");
                match serve_connection_until(stream, catalog, &config, connection_shutdown).await {
                    Ok(()) => tracing::debug!(peer, "connection closed"),
                    Err(error) => tracing::info!(peer, %error, "connection closed"),
                }
                drop(permit);
            });
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
