//! Why a connection ended: the one error type of the handshake, the
//! transmission phase and the accept loops, so it sits below all three.

use crate::config::ConfigError;
use crate::wire::WireError;

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
    #[error("handshake closed to make room for a newer connection")]
    HandshakeEvicted,
    #[error("every one of the {0} connection slots was taken when the handshake finished")]
    ConnectionLimit(usize),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("NBD_OPT_EXPORT_NAME before STARTTLS on a listener that requires TLS")]
    TlsRequired,
    #[error("TLS handshake failed: {0}")]
    Tls(std::io::Error),
}
