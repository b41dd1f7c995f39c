//! The NBD layer: serves block exports to hosts over the NBD protocol (the NBD
//! project's `doc/proto.md`): fixed-newstyle handshake, options, structured
//! replies, `base:allocation` block status, and transmission with many requests in
//! flight per connection. It knows nothing of lamina's engine: anything that
//! implements [`Export`] and [`ExportCatalog`] can be served.
//!
//! # Protocol notes
//!
//! **Handshake.** Fixed newstyle only: the server offers `NBD_FLAG_FIXED_NEWSTYLE`
//! and `NBD_FLAG_NO_ZEROES`; a client flag the server did not offer closes the
//! connection. Options implemented: `EXPORT_NAME`, `ABORT`, `LIST` (one
//! `NBD_REP_SERVER` per export, with its description), `INFO` and `GO` (always
//! `NBD_INFO_EXPORT` and `NBD_INFO_BLOCK_SIZE` = minimum 1, preferred 4096,
//! maximum [`ServerConfig::max_request_bytes`]; `NBD_INFO_NAME` and
//! `NBD_INFO_DESCRIPTION` when asked), `STRUCTURED_REPLY`, `LIST_META_CONTEXT`
//! and `SET_META_CONTEXT` for `base:allocation` (context id 1). `STARTTLS`,
//! extended headers and every unknown option get `NBD_REP_ERR_UNSUP`; malformed
//! option data gets `NBD_REP_ERR_INVALID`; an unknown export gets
//! `NBD_REP_ERR_UNKNOWN` (or a close, for `EXPORT_NAME`, which has no error
//! reply). Option data over [`ServerConfig::option_bytes_max`] gets
//! `NBD_REP_ERR_TOO_BIG` and a close; more than
//! [`ServerConfig::handshake_options_max`] options, plus
//! [`OPTIONS_PER_LISTED_EXPORT_MAX`] per export the handshake's largest
//! `NBD_OPT_LIST` reply named, get `NBD_REP_ERR_POLICY` and a close; a
//! handshake longer than [`ServerConfig::handshake_timeout_ms`] is closed.
//!
//! **Transmission flags.** `HAS_FLAGS`, `SEND_FLUSH`, `SEND_FUA`, `SEND_CACHE`,
//! `CAN_MULTI_CONN` (the backend's flush covers all connections), `SEND_DF` when
//! structured replies were negotiated, and either `READ_ONLY` or `SEND_TRIM`,
//! `SEND_WRITE_ZEROES`, `SEND_FAST_ZERO`.
//!
//! **Commands.** READ (structured: `OFFSET_DATA` chunks for data and
//! `OFFSET_HOLE` chunks for runs of at least 4 KiB that the backend's `extents()`
//! reports as holes or zeros; with `DF` exactly one data chunk), WRITE, FLUSH,
//! TRIM, WRITE_ZEROES (`NO_HOLE` clears `may_punch_hole`, `FAST_ZERO` sets
//! `fast_only`), CACHE, BLOCK_STATUS (`base:allocation`, `NBD_STATE_HOLE` = 1,
//! `NBD_STATE_ZERO` = 2, merged runs, `REQ_ONE` honoured, at most
//! [`ServerConfig::block_status_descriptors_max`] descriptors) and DISC (in-flight
//! requests are answered first). FUA is passed to the backend. Without structured
//! replies every reply is a simple reply; with them, errors are error chunks that
//! carry a message, and payload-less successes are simple replies.
//!
//! **Concurrency and limits.** One task per connection reads requests in
//! order, runs them, at most [`ServerConfig::in_flight_requests_max`] at once
//! and holding at most [`ServerConfig::in_flight_bytes_max`] of buffers, and
//! writes the replies in completion order (decision 0040). With
//! [`ConnectionThreads`] the accept loops place each connection on the thread
//! of a fixed set that serves the fewest, and it is served there, on that
//! thread's own runtime, to its end (decision 0048); without, on the accept
//! loop's runtime. [`ServerConfig::connections_max`] connections
//! are in transmission at once (a connection takes a slot when its handshake
//! completes); while all are taken, new ones are closed before the greeting.
//! Connections in the handshake have their own limits,
//! [`ServerConfig::handshakes_in_progress_max`] and
//! [`ServerConfig::handshakes_per_peer_max`] (per TCP address or Unix uid); a
//! new connection at a limit closes the oldest handshake of the peer holding
//! the most (see `admission.rs`).
//! Shutdown (a [`CancellationToken`]) stops accepting, stops reading requests,
//! answers those in flight and closes, within
//! [`ServerConfig::shutdown_timeout_ms`].
//!
//! **Errors.** Bad request magic or a connection that ends inside a request
//! closes that connection only. Unknown commands and flags not valid for the
//! command get `EINVAL`; a READ or WRITE longer than `max_request_bytes` gets
//! `EINVAL` (`EOVERFLOW` for a READ with `DF`; a refused WRITE's payload is read
//! and dropped so the connection stays usable); a range past the end of the
//! export gets `EINVAL`, or `ENOSPC` for WRITE and WRITE_ZEROES; WRITE, TRIM and
//! WRITE_ZEROES on a read-only export get `EPERM`; BLOCK_STATUS without a
//! negotiated context gets `EINVAL`. Backend errors map as: `Io` → `EIO` (5),
//! `NoSpace` → `ENOSPC` (28), `ReadOnly` → `EPERM` (1), `Invalid` → `EINVAL`
//! (22), `NotSupported` → `ENOTSUP` (95), `Shutdown` → `ESHUTDOWN` (108); a
//! panicking request handler answers `EIO`.
//!
//! **Parsers.** Everything that interprets client bytes is a pure function in
//! [`wire`] (`parse_client_flags`, `parse_option_header`, `parse_option`,
//! `parse_request_header`, `validate_request`), fuzzed by the targets in the
//! repository's `fuzz/` directory and by a randomized unit test.

mod access;
mod admission;
mod backend;
mod buffer_pool;
mod config;
mod connection_threads;
mod error;
mod failure_log;
mod handshake;
mod loopback_owner;
pub mod memory;
mod negotiated;
mod server;
pub mod statistics;
pub mod tls;
mod transmission;
pub mod wire;

pub use access::{Access, AccessPolicy, ClientIdentity, LoopbackOwner, UnixCredentials};
pub use backend::{
    EXPORT_FUTURE_BYTES, Export, ExportCatalog, ExportError, ExportFuture, ExportSummary, Extent,
};
pub use config::{
    ConfigError, HANDSHAKES_IN_PROGRESS_LIMIT, MAX_REQUEST_BYTES_LIMIT,
    OPTIONS_PER_LISTED_EXPORT_MAX, PREFERRED_BLOCK_BYTES, ServerConfig,
};
pub use connection_threads::{
    CONNECTION_THREADS_MAX, ConnectionThreadOptions, ConnectionThreads, IDLE_SPIN_US_DEFAULT,
    IDLE_SPIN_US_MAX, ReadyCheck,
};
pub use error::ConnectionError;
pub use handshake::transmission_flags;
pub use server::{
    NbdServer, ServerCounters, serve_connection, serve_connection_until, serve_connection_with,
};
pub use statistics::ExportStatistics;
pub use tls::{ServerTls, TlsError, TlsMode};
pub use tokio_util::sync::CancellationToken;
pub use transmission::{block_status_descriptors, errno_for};
