//! Who a client is and what it may open. The server gathers a
//! [`ClientIdentity`] for each connection (Unix peer credentials from
//! `SO_PEERCRED`, the TCP address, for a loopback TCP client the uid that owns
//! its socket, and after STARTTLS the verified client certificate's DN), asks
//! an [`AccessPolicy`] whether the client may use the server at all (when the
//! handshake starts and again after STARTTLS), and then about each export by
//! name. A client not admitted is refused every export, with the policy's
//! reason.
//! An export the policy refuses is left out of `NBD_OPT_LIST` and answered with
//! `NBD_REP_ERR_POLICY` at `INFO`/`GO`, exactly as an export that does not
//! exist, so a client cannot learn the names of exports it may not open. A
//! read-only grant serves the export through [`ReadOnlyExport`]: the handshake
//! advertises `NBD_FLAG_READ_ONLY` and writes get `EPERM`.

use std::net::IpAddr;
use std::sync::Arc;

use crate::backend::{Export, ExportError, ExportFuture, Extent};
use crate::tls::ServerTls;

/// A Unix-socket peer's credentials (`SO_PEERCRED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnixCredentials {
    pub uid: u32,
    pub gid: u32,
    /// The peer's process id, when the kernel reported one.
    pub pid: Option<i32>,
}

/// Who owns a loopback TCP client's socket, as the kernel's socket
/// diagnostics name it (`loopback_owner.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoopbackOwner {
    /// The uid that created the client's socket.
    Uid(u32),
    /// The kernel could not say; why.
    Unknown(String),
}

/// Everything known about who is on the other end of a connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientIdentity {
    /// Set for Unix-socket clients.
    pub unix: Option<UnixCredentials>,
    /// Set for TCP clients (IPv4-mapped IPv6 addresses as IPv4).
    pub address: Option<IpAddr>,
    /// Set for TCP clients on a loopback address.
    pub loopback_owner: Option<LoopbackOwner>,
    /// Whether the connection is encrypted (STARTTLS succeeded).
    pub tls: bool,
    /// The subject DN of the client certificate, RFC 4514 order
    /// (`CN=alice,O=Example`); only when the listener verifies peers.
    pub certificate_dn: Option<String>,
}

impl std::fmt::Display for ClientIdentity {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(unix) = &self.unix {
            write!(formatter, "unix uid {} gid {}", unix.uid, unix.gid)?;
        }
        if let Some(address) = &self.address {
            write!(formatter, "{address}")?;
        }
        match &self.loopback_owner {
            Some(LoopbackOwner::Uid(uid)) => write!(formatter, " uid {uid}")?,
            Some(LoopbackOwner::Unknown(_)) => write!(formatter, " uid unknown")?,
            None => {}
        }
        if let Some(dn) = &self.certificate_dn {
            write!(formatter, " certificate {dn:?}")?;
        }
        Ok(())
    }
}

/// What a client may do with an export it may open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    ReadOnly,
    ReadWrite,
}

/// Decides which exports a client may open. Without a policy every client
/// that reaches the socket may open every export.
pub trait AccessPolicy: Send + Sync + 'static {
    /// Whether `identity` may use the server at all; asked when the handshake
    /// starts and again after STARTTLS. `Err` says why not: it is sent to the
    /// client with every refusal, so it must not name exports. By default
    /// every client may.
    fn admit(&self, identity: &ClientIdentity) -> Result<(), String> {
        let _ = identity;
        Ok(())
    }

    /// What `identity` may do with the export named `export_name` (its
    /// canonical name, never the empty default name); `None` hides it.
    fn access(&self, identity: &ClientIdentity, export_name: &str) -> Option<Access>;
}

/// What one connection's handshake needs to decide who may do what: the
/// listener's TLS, the server's access policy, and the client's identity
/// (completed by STARTTLS).
#[derive(Default)]
pub(crate) struct ConnectionSecurity {
    pub tls: Option<Arc<ServerTls>>,
    pub access: Option<Arc<dyn AccessPolicy>>,
    pub identity: ClientIdentity,
}

/// An export served read-only whatever the export itself allows.
pub(crate) struct ReadOnlyExport {
    pub inner: Arc<dyn Export>,
}

#[async_trait::async_trait]
impl Export for ReadOnlyExport {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read_only(&self) -> bool {
        true
    }

    fn read<'a>(&'a self, offset: u64, buffer: &'a mut [u8]) -> ExportFuture<'a> {
        self.inner.read(offset, buffer)
    }

    async fn extents(&self, offset: u64, length: u64) -> Result<Vec<Extent>, ExportError> {
        self.inner.extents(offset, length).await
    }

    fn visit_extents(
        &self,
        offset: u64,
        length: u64,
        visit: &mut dyn FnMut(Extent),
    ) -> Option<Result<(), ExportError>> {
        self.inner.visit_extents(offset, length, visit)
    }

    fn write<'a>(&'a self, _offset: u64, _data: &'a [u8], _fua: bool) -> ExportFuture<'a> {
        ExportFuture::from(std::future::ready(Err(ExportError::ReadOnly)))
    }

    async fn flush(&self) -> Result<(), ExportError> {
        self.inner.flush().await
    }

    async fn trim(&self, _offset: u64, _length: u64, _fua: bool) -> Result<(), ExportError> {
        Err(ExportError::ReadOnly)
    }

    async fn write_zeroes(
        &self,
        _offset: u64,
        _length: u64,
        _fua: bool,
        _may_punch_hole: bool,
        _fast_only: bool,
    ) -> Result<(), ExportError> {
        Err(ExportError::ReadOnly)
    }

    async fn cache(&self, offset: u64, length: u64) -> Result<(), ExportError> {
        self.inner.cache(offset, length).await
    }
}
