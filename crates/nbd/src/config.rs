//! The server's configuration: every limit and timeout of an NBD server, with
//! its default and the range each may take. Shared by the accept loops, the
//! handshake and the transmission phase, so it sits below all three.

use tokio::sync::Semaphore;

use crate::wire;

/// The preferred block size advertised with `NBD_INFO_BLOCK_SIZE`: lamina's block.
/// Also the smallest allowed `max_request_bytes`.
pub const PREFERRED_BLOCK_BYTES: u32 = 4096;

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
    /// Connections in the transmission phase at once. A connection takes one of
    /// these slots only when its handshake completes; while every slot is taken,
    /// new connections are closed before the greeting.
    pub connections_max: usize,
    /// Connections still in the handshake at once, over all peers. When a new
    /// connection arrives with this many in progress, the oldest handshake of
    /// the peer holding the most is closed (see `admission.rs` for why).
    pub handshakes_in_progress_max: usize,
    /// Connections still in the handshake at once from one peer (a TCP client's
    /// IP address, a Unix-socket client's uid); a new connection from a peer at
    /// this limit closes that peer's oldest handshake.
    pub handshakes_per_peer_max: usize,
    /// Largest option data accepted during the handshake.
    pub option_bytes_max: u32,
    /// Options accepted in one handshake before the server hangs up, besides
    /// the [`OPTIONS_PER_LISTED_EXPORT_MAX`] per export that the handshake's
    /// largest `NBD_OPT_LIST` reply named (see
    /// [`ServerConfig::handshake_options_allowed`]).
    pub handshake_options_max: u32,
    /// Time a client has to finish the handshake. There is no separate idle
    /// timeout between handshake messages: a stalled handshake is closed as soon
    /// as a new connection needs its slot, so an idle timeout would only free
    /// slots nobody is waiting for.
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
            handshakes_in_progress_max: 64,
            // Room for a multi-connection client (nbdcopy, qemu) handshaking on
            // all its connections at once.
            handshakes_per_peer_max: 16,
            option_bytes_max: 64 * 1024,
            handshake_options_max: 1024,
            // A real client needs a few round trips; a half-open connection
            // should not hold a slot for long.
            handshake_timeout_ms: 10_000,
            block_status_descriptors_max: 16 * 1024,
            shutdown_timeout_ms: 30_000,
        }
    }
}

/// Options a handshake may send about each export its largest `NBD_OPT_LIST`
/// reply named, on top of `handshake_options_max`: a client that lists the
/// exports and then asks about each (`nbdinfo --list` sends two options for
/// every one) needs options in proportion to the exports, which a fixed limit
/// cannot give a server with thousands of volumes. The allowance follows
/// the largest listing, not their sum, so listing again earns nothing.
pub const OPTIONS_PER_LISTED_EXPORT_MAX: u32 = 4;

/// Largest `max_request_bytes` allowed: a read must fit one data chunk, whose
/// length field is 32 bits including an 8-byte offset.
pub const MAX_REQUEST_BYTES_LIMIT: u32 = 1 << 30;

/// Largest `handshakes_in_progress_max` allowed: each handshake in progress is a
/// task and a socket, so more would only help whoever opens them.
pub const HANDSHAKES_IN_PROGRESS_LIMIT: usize = 65536;

/// A configuration value out of its allowed range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("server configuration: {field} = {value} is outside {allowed}")]
pub struct ConfigError {
    pub field: &'static str,
    pub value: u64,
    pub allowed: &'static str,
}

impl ServerConfig {
    /// Options one handshake may send when its largest `NBD_OPT_LIST` reply
    /// named `listed_exports` exports: `handshake_options_max` plus
    /// [`OPTIONS_PER_LISTED_EXPORT_MAX`] per listed export. Still a bound on
    /// a hostile client: what it may send grows only with the exports it may
    /// see, each option costs the server one small reply, and the whole
    /// handshake ends at `handshake_timeout_ms`.
    pub fn handshake_options_allowed(&self, listed_exports: u32) -> u32 {
        listed_exports
            .saturating_mul(OPTIONS_PER_LISTED_EXPORT_MAX)
            .saturating_add(self.handshake_options_max)
    }

    /// Checks every limit is usable.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_transmission_limits()?;
        self.validate_handshake_limits()?;
        check(
            "block_status_descriptors_max",
            u64::from(self.block_status_descriptors_max),
            (1..=1 << 20).contains(&self.block_status_descriptors_max),
            "1..=1048576",
        )
    }

    /// Checks the request size and the limits of connections in transmission.
    fn validate_transmission_limits(&self) -> Result<(), ConfigError> {
        let request = self.max_request_bytes;
        check(
            "max_request_bytes",
            u64::from(request),
            (PREFERRED_BLOCK_BYTES..=MAX_REQUEST_BYTES_LIMIT).contains(&request),
            "4096..=1073741824",
        )?;
        check(
            "in_flight_requests_max",
            reported(self.in_flight_requests_max),
            (1..=65536).contains(&self.in_flight_requests_max),
            "1..=65536",
        )?;
        check(
            "in_flight_bytes_max",
            u64::from(self.in_flight_bytes_max),
            self.in_flight_bytes_max >= 1
                && usize::try_from(self.in_flight_bytes_max)
                    .is_ok_and(|bytes| bytes <= Semaphore::MAX_PERMITS),
            ">= 1",
        )?;
        check(
            "connections_max",
            reported(self.connections_max),
            (1..=Semaphore::MAX_PERMITS).contains(&self.connections_max),
            ">= 1",
        )
    }

    /// Checks the limits of connections still in the handshake.
    fn validate_handshake_limits(&self) -> Result<(), ConfigError> {
        check(
            "handshakes_in_progress_max",
            reported(self.handshakes_in_progress_max),
            (1..=HANDSHAKES_IN_PROGRESS_LIMIT).contains(&self.handshakes_in_progress_max),
            "1..=65536",
        )?;
        check(
            "handshakes_per_peer_max",
            reported(self.handshakes_per_peer_max),
            (1..=self.handshakes_in_progress_max).contains(&self.handshakes_per_peer_max),
            "1..=handshakes_in_progress_max",
        )?;
        check(
            "handshake_timeout_ms",
            self.handshake_timeout_ms,
            self.handshake_timeout_ms >= 1,
            ">= 1",
        )?;
        check(
            "option_bytes_max",
            u64::from(self.option_bytes_max),
            usize::try_from(self.option_bytes_max)
                .is_ok_and(|bytes| bytes >= wire::STRING_BYTES_MAX + 8),
            ">= 4104 (a maximal export name with its framing)",
        )?;
        check(
            "handshake_options_max",
            u64::from(self.handshake_options_max),
            self.handshake_options_max >= 1,
            ">= 1",
        )
    }
}

/// `Ok` when `ok`, otherwise the error naming `field`, its `value` and the
/// range it must lie in.
fn check(
    field: &'static str,
    value: u64,
    ok: bool,
    allowed: &'static str,
) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError {
            field,
            value,
            allowed,
        })
    }
}

/// A `usize` setting as reported in a [`ConfigError`]; no supported target
/// has a `usize` wider than 64 bits, and the report saturates if one did.
fn reported(value: usize) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}
