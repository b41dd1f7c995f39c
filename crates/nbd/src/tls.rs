//! TLS for NBD (`NBD_OPT_STARTTLS`, the NBD project's `doc/proto.md`, "TLS
//! support"): the server's credentials loaded from a directory laid out as
//! nbdkit's `--tls-certificates` (`ca-cert.pem`, `server-cert.pem`,
//! `server-key.pem`), the rustls acceptor built from them, and [`Transport`],
//! the connection's stream that starts plain and is upgraded in place when the
//! client sends STARTTLS. TLS 1.3 and 1.2 are offered (rustls' safe defaults,
//! the `ring` provider); with `verify_peer`, a client must present a
//! certificate signed by `ca-cert.pem`, and its subject DN becomes part of the
//! client's identity for the access rules.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// The CA that client certificates are checked against (nbdkit's name).
pub const CA_CERTIFICATE_FILE: &str = "ca-cert.pem";
/// The server's certificate chain, leaf first (nbdkit's name).
pub const SERVER_CERTIFICATE_FILE: &str = "server-cert.pem";
/// The server's private key, PKCS#1, PKCS#8 or SEC1 PEM (nbdkit's name).
pub const SERVER_KEY_FILE: &str = "server-key.pem";

/// Whether a listener offers or demands TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// STARTTLS gets `NBD_REP_ERR_UNSUP`, as before TLS existed.
    Off,
    /// STARTTLS is accepted; plain clients are served too.
    On,
    /// Every option other than STARTTLS and ABORT gets `NBD_REP_ERR_TLS_REQD`
    /// until TLS is up; `NBD_OPT_EXPORT_NAME` before it closes the connection.
    Require,
}

impl std::fmt::Display for TlsMode {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            TlsMode::Off => "off",
            TlsMode::On => "on",
            TlsMode::Require => "require",
        })
    }
}

/// Credentials that cannot be loaded, with the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read TLS file {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("TLS file {path} holds no certificate")]
    NoCertificate { path: PathBuf },
    #[error("TLS credentials in {directory} are not usable: {message}")]
    Unusable { directory: PathBuf, message: String },
}

/// A listener's TLS: the acceptor, and whether plain clients are refused.
pub struct ServerTls {
    acceptor: TlsAcceptor,
    required: bool,
    verify_peer: bool,
    directory: PathBuf,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ServerTls")
            .field("required", &self.required)
            .field("verify_peer", &self.verify_peer)
            .field("directory", &self.directory)
            .finish()
    }
}

impl ServerTls {
    /// Loads the server's certificate and key from `directory` (and, with
    /// `verify_peer`, the CA client certificates must be signed by). `mode`
    /// must not be [`TlsMode::Off`].
    pub fn load(directory: &Path, mode: TlsMode, verify_peer: bool) -> Result<Self, TlsError> {
        assert!(
            mode != TlsMode::Off,
            "ServerTls::load needs TLS on or required"
        );
        let certificates = read_certificates(&directory.join(SERVER_CERTIFICATE_FILE))?;
        let key_path = directory.join(SERVER_KEY_FILE);
        let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|error| TlsError::Read {
            path: key_path.clone(),
            message: error.to_string(),
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let unusable = |message: String| TlsError::Unusable {
            directory: directory.to_path_buf(),
            message,
        };
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|error| unusable(error.to_string()))?;
        let builder = if verify_peer {
            let mut roots = rustls::RootCertStore::empty();
            for certificate in read_certificates(&directory.join(CA_CERTIFICATE_FILE))? {
                roots
                    .add(certificate)
                    .map_err(|error| unusable(format!("{CA_CERTIFICATE_FILE}: {error}")))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|error| unusable(error.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let config = builder
            .with_single_cert(certificates, key)
            .map_err(|error| unusable(error.to_string()))?;
        Ok(ServerTls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            required: mode == TlsMode::Require,
            verify_peer,
            directory: directory.to_path_buf(),
        })
    }

    /// Whether plain clients are refused.
    pub fn required(&self) -> bool {
        self.required
    }

    /// Whether clients must present a certificate signed by `ca-cert.pem`.
    pub fn verify_peer(&self) -> bool {
        self.verify_peer
    }

    /// The directory the credentials were loaded from.
    pub fn directory(&self) -> &Path {
        &self.directory
    }
}

/// Every certificate in a PEM file; none is an error.
fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read_error = |message: String| TlsError::Read {
        path: path.to_path_buf(),
        message,
    };
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|error| read_error(error.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| read_error(error.to_string()))?;
    if certificates.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certificates)
}

/// A connection's stream: plain until STARTTLS, then TLS over the same socket.
pub(crate) enum Transport<S> {
    Plain(S),
    Tls(Box<TlsStream<S>>),
    /// Only while the TLS handshake runs (it owns the socket); a failed
    /// handshake leaves it here and the connection is closed.
    Upgrading,
}

impl<S> Transport<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    pub(crate) fn is_tls(&self) -> bool {
        matches!(self, Transport::Tls(_))
    }

    /// Runs the server side of the TLS handshake on the plain socket. Nothing
    /// may be buffered from the plain stream: the handshake reads with exact
    /// lengths, so the client's first TLS byte is still in the socket.
    pub(crate) async fn start_tls(&mut self, tls: &ServerTls) -> io::Result<()> {
        let Transport::Plain(plain) = std::mem::replace(self, Transport::Upgrading) else {
            panic!("start_tls on a stream that is not plain");
        };
        let stream = tls.acceptor.accept(plain).await?;
        *self = Transport::Tls(Box::new(stream));
        Ok(())
    }

    /// The subject DN of the client's verified certificate, in RFC 4514 order
    /// (most specific first, `CN=alice,O=Example`), as GnuTLS prints it.
    pub(crate) fn peer_certificate_dn(&self) -> Option<String> {
        let Transport::Tls(stream) = self else {
            return None;
        };
        let certificate = stream.get_ref().1.peer_certificates()?.first()?;
        subject_dn(certificate.as_ref())
    }
}

/// The subject DN of a DER certificate in RFC 4514 order; `None` when it does
/// not parse (rustls has already verified it, so that is not expected).
pub fn subject_dn(der: &[u8]) -> Option<String> {
    let (_, certificate) = x509_parser::parse_x509_certificate(der).ok()?;
    let mut parts = Vec::new();
    for relative in certificate.subject().iter_rdn() {
        let attributes: Vec<String> = relative
            .iter()
            .map(|attribute| {
                let oid = attribute.attr_type().to_id_string();
                let value = attribute.as_str().map(escape_dn_value).unwrap_or_default();
                format!("{}={value}", attribute_short_name(&oid).unwrap_or(&oid))
            })
            .collect();
        parts.push(attributes.join("+"));
    }
    parts.reverse();
    Some(parts.join(","))
}

/// The short names RFC 4514 gives the usual attributes.
fn attribute_short_name(oid: &str) -> Option<&'static str> {
    Some(match oid {
        "2.5.4.3" => "CN",
        "2.5.4.6" => "C",
        "2.5.4.7" => "L",
        "2.5.4.8" => "ST",
        "2.5.4.10" => "O",
        "2.5.4.11" => "OU",
        "2.5.4.9" => "STREET",
        "0.9.2342.19200300.100.1.25" => "DC",
        "0.9.2342.19200300.100.1.1" => "UID",
        _ => return None,
    })
}

/// RFC 4514 escaping of the characters that would change a DN's structure.
fn escape_dn_value(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for character in value.chars() {
        if matches!(character, ',' | '+' | '"' | '\\' | '<' | '>' | ';' | '=') {
            escaped.push('\\');
        }
        escaped.push(character);
    }
    escaped
}

fn upgrading_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        "the connection's TLS handshake failed",
    )
}

impl<S> AsyncRead for Transport<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    fn poll_read(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(stream) => Pin::new(stream).poll_read(context, buffer),
            Transport::Tls(stream) => Pin::new(stream.as_mut()).poll_read(context, buffer),
            Transport::Upgrading => Poll::Ready(Err(upgrading_error())),
        }
    }
}

impl<S> AsyncWrite for Transport<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    fn poll_write(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(stream) => Pin::new(stream).poll_write(context, buffer),
            Transport::Tls(stream) => Pin::new(stream.as_mut()).poll_write(context, buffer),
            Transport::Upgrading => Poll::Ready(Err(upgrading_error())),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffers: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(stream) => Pin::new(stream).poll_write_vectored(context, buffers),
            Transport::Tls(stream) => {
                Pin::new(stream.as_mut()).poll_write_vectored(context, buffers)
            }
            Transport::Upgrading => Poll::Ready(Err(upgrading_error())),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Transport::Plain(stream) => stream.is_write_vectored(),
            Transport::Tls(stream) => stream.is_write_vectored(),
            Transport::Upgrading => false,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(stream) => Pin::new(stream).poll_flush(context),
            Transport::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(context),
            Transport::Upgrading => Poll::Ready(Err(upgrading_error())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(stream) => Pin::new(stream).poll_shutdown(context),
            Transport::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(context),
            Transport::Upgrading => Poll::Ready(Ok(())),
        }
    }
}
