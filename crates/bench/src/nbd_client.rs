//! A minimal NBD client for the open-loop load generator: the fixed newstyle handshake
//! with `NBD_OPT_GO`, then `NBD_CMD_READ` and `NBD_CMD_WRITE` with simple replies, over
//! a Unix socket or TCP (the protocol is NetworkBlockDevice/nbd's doc/proto.md).
//!
//! Blocking sockets: a connection is split into a sending half and a receiving half
//! ([`Socket::try_clone`]) so that one thread can issue requests on schedule while
//! another reads replies; the wire constants are the server crate's public ones
//! ([`lamina_nbd::wire`]). No structured replies are negotiated, so every reply is the
//! 16-byte simple reply, followed by the data for a successful read.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use lamina_nbd::wire;

/// Longest option reply payload accepted during the handshake (a description or an
/// error message); anything longer is a broken server.
const OPTION_REPLY_BYTES_MAX: u32 = 64 * 1024;

/// How long a handshake may take before the client gives up.
const HANDSHAKE_TIMEOUT_MS: u64 = 10_000;

/// Errors of the NBD client, each naming what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum NbdClientError {
    #[error("`{uri}` is not an NBD URI this client understands: {reason}")]
    Uri { uri: String, reason: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("{context}: expected magic {expected:#x}, received {received:#x}")]
    BadMagic {
        context: &'static str,
        expected: u64,
        received: u64,
    },
    #[error("the server does not offer the fixed newstyle handshake (flags {flags:#x})")]
    NotFixedNewstyle { flags: u16 },
    #[error("the server refused NBD_OPT_GO for export `{export}` (reply {reply:#x}): {message}")]
    ExportRefused {
        export: String,
        reply: u32,
        message: String,
    },
    #[error("the server sent an option reply of {length} bytes (at most {OPTION_REPLY_BYTES_MAX})")]
    OptionReplyTooLong { length: u32 },
    #[error("the server finished NBD_OPT_GO without NBD_INFO_EXPORT (no export size)")]
    NoExportInfo,
    #[error("the server replied with cookie {cookie}, which no request in flight has")]
    UnknownCookie { cookie: u64 },
}

fn io_error(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> NbdClientError {
    let context = context.into();
    move |source| NbdClientError::Io { context, source }
}

/// Where an NBD server listens and which export to use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub address: Address,
    pub export: String,
}

/// A server's listening address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    Unix(PathBuf),
    /// `host:port`.
    Tcp(String),
}

impl Endpoint {
    /// Parses `nbd+unix:///EXPORT?socket=PATH` or `nbd://HOST[:PORT]/EXPORT`.
    pub fn parse(uri: &str) -> Result<Self, NbdClientError> {
        let refuse = |reason: &str| NbdClientError::Uri {
            uri: uri.to_owned(),
            reason: reason.to_owned(),
        };
        if let Some(rest) = uri.strip_prefix("nbd+unix://") {
            let (path, query) = rest
                .split_once('?')
                .ok_or_else(|| refuse("no ?socket= query"))?;
            let socket = query
                .split('&')
                .find_map(|pair| pair.strip_prefix("socket="))
                .ok_or_else(|| refuse("no socket= in the query"))?;
            return Ok(Self {
                address: Address::Unix(PathBuf::from(socket)),
                export: path.trim_start_matches('/').to_owned(),
            });
        }
        if let Some(rest) = uri.strip_prefix("nbd://") {
            let (host, export) = rest.split_once('/').unwrap_or((rest, ""));
            if host.is_empty() {
                return Err(refuse("no host"));
            }
            let host = if host.contains(':') {
                host.to_owned()
            } else {
                format!("{host}:10809")
            };
            return Ok(Self {
                address: Address::Tcp(host),
                export: export.to_owned(),
            });
        }
        Err(refuse("the scheme is neither nbd+unix:// nor nbd://"))
    }
}

/// A connected socket of either kind.
#[derive(Debug)]
pub enum Socket {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Socket {
    fn connect(address: &Address) -> Result<Self, NbdClientError> {
        match address {
            Address::Unix(path) => UnixStream::connect(path)
                .map(Socket::Unix)
                .map_err(io_error(format!("connecting to {}", path.display()))),
            Address::Tcp(host) => {
                let stream =
                    TcpStream::connect(host).map_err(io_error(format!("connecting to {host}")))?;
                // Requests are small and latency is the measurement: no Nagle delay.
                stream
                    .set_nodelay(true)
                    .map_err(io_error("setting TCP_NODELAY"))?;
                Ok(Socket::Tcp(stream))
            }
        }
    }

    /// A second handle on the same connection (one thread sends, another receives).
    pub fn try_clone(&self) -> Result<Self, NbdClientError> {
        match self {
            Socket::Unix(stream) => stream.try_clone().map(Socket::Unix),
            Socket::Tcp(stream) => stream.try_clone().map(Socket::Tcp),
        }
        .map_err(io_error("duplicating the socket"))
    }

    /// Shuts both directions, so that a thread blocked reading the socket returns.
    pub fn shutdown(&self) {
        let _ = match self {
            Socket::Unix(stream) => stream.shutdown(std::net::Shutdown::Both),
            Socket::Tcp(stream) => stream.shutdown(std::net::Shutdown::Both),
        };
    }

    fn set_read_timeout(&self, timeout: Option<Duration>) -> Result<(), NbdClientError> {
        match self {
            Socket::Unix(stream) => stream.set_read_timeout(timeout),
            Socket::Tcp(stream) => stream.set_read_timeout(timeout),
        }
        .map_err(io_error("setting the read timeout"))
    }
}

impl Read for Socket {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Socket::Unix(stream) => stream.read(buffer),
            Socket::Tcp(stream) => stream.read(buffer),
        }
    }
}

impl Write for Socket {
    fn write(&mut self, buffer: &[u8]) -> std::io::Result<usize> {
        match self {
            Socket::Unix(stream) => stream.write(buffer),
            Socket::Tcp(stream) => stream.write(buffer),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A connection in the transmission phase.
#[derive(Debug)]
pub struct Connection {
    pub socket: Socket,
    pub export_size_bytes: u64,
    pub transmission_flags: u16,
}

fn read_array<const N: usize>(
    socket: &mut Socket,
    context: &'static str,
) -> Result<[u8; N], NbdClientError> {
    let mut bytes = [0u8; N];
    socket.read_exact(&mut bytes).map_err(io_error(context))?;
    Ok(bytes)
}

/// Connects to `endpoint` and negotiates its export with `NBD_OPT_GO`.
pub fn connect(endpoint: &Endpoint) -> Result<Connection, NbdClientError> {
    let mut socket = Socket::connect(&endpoint.address)?;
    socket.set_read_timeout(Some(Duration::from_millis(HANDSHAKE_TIMEOUT_MS)))?;
    let magic = u64::from_be_bytes(read_array(&mut socket, "reading the greeting")?);
    if magic != wire::NBD_MAGIC {
        return Err(NbdClientError::BadMagic {
            context: "greeting",
            expected: wire::NBD_MAGIC,
            received: magic,
        });
    }
    let option_magic = u64::from_be_bytes(read_array(&mut socket, "reading the greeting")?);
    if option_magic != wire::IHAVEOPT_MAGIC {
        return Err(NbdClientError::BadMagic {
            context: "greeting (oldstyle servers are not supported)",
            expected: wire::IHAVEOPT_MAGIC,
            received: option_magic,
        });
    }
    let flags = u16::from_be_bytes(read_array(&mut socket, "reading the handshake flags")?);
    if flags & wire::FLAG_FIXED_NEWSTYLE == 0 {
        return Err(NbdClientError::NotFixedNewstyle { flags });
    }
    let mut client_flags = wire::CLIENT_FLAG_FIXED_NEWSTYLE;
    if flags & wire::FLAG_NO_ZEROES != 0 {
        client_flags |= wire::CLIENT_FLAG_NO_ZEROES;
    }
    let name = endpoint.export.as_bytes();
    let name_length = u32::try_from(name.len()).expect("export names are short");
    let mut request = Vec::with_capacity(32 + name.len());
    request.extend_from_slice(&client_flags.to_be_bytes());
    request.extend_from_slice(&wire::IHAVEOPT_MAGIC.to_be_bytes());
    request.extend_from_slice(&wire::OPT_GO.to_be_bytes());
    // Payload: name length, name, and zero information requests (the server sends
    // NBD_INFO_EXPORT regardless).
    request.extend_from_slice(&(4 + name_length + 2).to_be_bytes());
    request.extend_from_slice(&name_length.to_be_bytes());
    request.extend_from_slice(name);
    request.extend_from_slice(&0u16.to_be_bytes());
    socket
        .write_all(&request)
        .map_err(io_error("sending NBD_OPT_GO"))?;
    let export = read_go_replies(&mut socket, &endpoint.export)?;
    socket.set_read_timeout(None)?;
    Ok(Connection {
        socket,
        export_size_bytes: export.size_bytes,
        transmission_flags: export.transmission_flags,
    })
}

/// What `NBD_INFO_EXPORT` says.
struct ExportInfo {
    size_bytes: u64,
    transmission_flags: u16,
}

fn read_go_replies(socket: &mut Socket, export: &str) -> Result<ExportInfo, NbdClientError> {
    let mut info = None;
    loop {
        let magic = u64::from_be_bytes(read_array(socket, "reading an option reply")?);
        if magic != wire::OPTION_REPLY_MAGIC {
            return Err(NbdClientError::BadMagic {
                context: "option reply",
                expected: wire::OPTION_REPLY_MAGIC,
                received: magic,
            });
        }
        let _option = u32::from_be_bytes(read_array(socket, "reading an option reply")?);
        let reply = u32::from_be_bytes(read_array(socket, "reading an option reply")?);
        let length = u32::from_be_bytes(read_array(socket, "reading an option reply")?);
        if length > OPTION_REPLY_BYTES_MAX {
            return Err(NbdClientError::OptionReplyTooLong { length });
        }
        let mut payload = vec![0u8; usize::try_from(length).expect("bounded above")];
        socket
            .read_exact(&mut payload)
            .map_err(io_error("reading an option reply's payload"))?;
        if reply & (1 << 31) != 0 {
            return Err(NbdClientError::ExportRefused {
                export: export.to_owned(),
                reply,
                message: String::from_utf8_lossy(&payload).into_owned(),
            });
        }
        if reply == wire::REP_ACK {
            return info.ok_or(NbdClientError::NoExportInfo);
        }
        if reply == wire::REP_INFO
            && payload.len() >= 12
            && u16::from_be_bytes([payload[0], payload[1]]) == wire::INFO_EXPORT
        {
            let size: [u8; 8] = payload[2..10].try_into().expect("eight bytes");
            info = Some(ExportInfo {
                size_bytes: u64::from_be_bytes(size),
                transmission_flags: u16::from_be_bytes([payload[10], payload[11]]),
            });
        }
    }
}

/// The 28-byte header of a read or write request.
pub fn request_header(command: u16, cookie: u64, offset: u64, length: u32) -> [u8; 28] {
    let mut header = [0u8; 28];
    header[0..4].copy_from_slice(&wire::REQUEST_MAGIC.to_be_bytes());
    // Bytes 4..6 are the command flags: none (no FUA).
    header[6..8].copy_from_slice(&command.to_be_bytes());
    header[8..16].copy_from_slice(&cookie.to_be_bytes());
    header[16..24].copy_from_slice(&offset.to_be_bytes());
    header[24..28].copy_from_slice(&length.to_be_bytes());
    header
}

/// A simple reply's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyHeader {
    /// 0 on success, an errno value otherwise.
    pub error: u32,
    pub cookie: u64,
}

/// Reads one simple reply header (not its data).
pub fn read_reply_header(socket: &mut Socket) -> Result<ReplyHeader, NbdClientError> {
    let bytes: [u8; 16] = read_array(socket, "reading a reply")?;
    let magic = u32::from_be_bytes(bytes[0..4].try_into().expect("four bytes"));
    if magic != wire::SIMPLE_REPLY_MAGIC {
        return Err(NbdClientError::BadMagic {
            context: "simple reply",
            expected: u64::from(wire::SIMPLE_REPLY_MAGIC),
            received: u64::from(magic),
        });
    }
    Ok(ReplyHeader {
        error: u32::from_be_bytes(bytes[4..8].try_into().expect("four bytes")),
        cookie: u64::from_be_bytes(bytes[8..16].try_into().expect("eight bytes")),
    })
}

/// Sends `NBD_CMD_DISC` (the server closes the connection without a reply).
pub fn disconnect(socket: &mut Socket) {
    let _ = socket.write_all(&request_header(wire::CMD_DISC, 0, 0, 0));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_of_both_kinds_parse() {
        let unix = Endpoint::parse("nbd+unix:///default?socket=/tmp/x/nbd.sock").expect("unix");
        assert_eq!(
            unix.address,
            Address::Unix(PathBuf::from("/tmp/x/nbd.sock"))
        );
        assert_eq!(unix.export, "default");
        let tcp = Endpoint::parse("nbd://127.0.0.1:10900/volume").expect("tcp");
        assert_eq!(tcp.address, Address::Tcp("127.0.0.1:10900".into()));
        assert_eq!(tcp.export, "volume");
        let default_port = Endpoint::parse("nbd://localhost").expect("tcp");
        assert_eq!(default_port.address, Address::Tcp("localhost:10809".into()));
        assert!(Endpoint::parse("http://x").is_err());
        assert!(Endpoint::parse("nbd+unix:///default").is_err());
    }

    #[test]
    fn request_headers_are_big_endian() {
        let header = request_header(wire::CMD_WRITE, 7, 4096, 512);
        assert_eq!(&header[0..4], &[0x25, 0x60, 0x95, 0x13]);
        assert_eq!(&header[6..8], &[0, 1]);
        assert_eq!(header[15], 7);
        assert_eq!(&header[16..24], &4096u64.to_be_bytes());
        assert_eq!(&header[24..28], &512u32.to_be_bytes());
    }
}
