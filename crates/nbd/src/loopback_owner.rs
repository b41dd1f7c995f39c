//! Who owns a loopback TCP client's socket. A TCP connection carries no
//! credentials, but when the client is on this host the kernel knows the uid
//! that created its socket: the socket diagnostics interface
//! (`NETLINK_SOCK_DIAG`, what `ss -e` shows) answers an exact query by the
//! connection's addresses and ports with that socket's `idiag_uid`. The accept
//! loop asks for every loopback client so that the access policy can treat it
//! as it treats a Unix-socket client (issue 42, decision 0057).
//!
//! The query names the client's end: source = the client's address and port
//! (the server's peer), destination = the server's. The kernel looks the
//! socket up in its established table (an address mapped into IPv6 is looked
//! up as IPv4), so the answer is the client's socket, not the server's.

use std::net::SocketAddr;
use std::time::Duration;

use netlink_packet_core::{NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_sock_diag::SockDiagMessage;
use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_TCP, TCP_ESTABLISHED};
use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
use netlink_sys::protocols::NETLINK_SOCK_DIAG;
use netlink_sys::{Socket, SocketAddr as NetlinkAddress};

/// How long the kernel gets to answer. It answers while the request is being
/// sent, so this only bounds a kernel that never does.
const REPLY_TIMEOUT_MS: u64 = 1_000;

/// Room for the reply: one `inet_diag_msg` (72 bytes) and the few attributes
/// the kernel adds unasked.
const REPLY_BUFFER_BYTES: usize = 8 * 1024;

/// `INET_DIAG_NOCOOKIE`: match the socket whatever its cookie.
const ANY_COOKIE: [u8; 8] = [0xff; 8];

/// Why the owner of a loopback client's socket could not be found.
#[derive(Debug, thiserror::Error)]
pub enum LoopbackOwnerError {
    #[error("cannot open a socket diagnostics (NETLINK_SOCK_DIAG) socket: {0}")]
    Open(#[source] std::io::Error),
    #[error("cannot send the socket diagnostics query: {0}")]
    Send(#[source] std::io::Error),
    #[error("no socket diagnostics reply: {0}")]
    Receive(#[source] std::io::Error),
    #[error("the kernel answered the socket diagnostics query with an error: {0}")]
    Kernel(#[source] std::io::Error),
    #[error("the socket diagnostics reply cannot be read: {0}")]
    Malformed(String),
    #[error("the client's socket is in TCP state {state}, not established")]
    NotEstablished { state: u8 },
    #[error("the socket diagnostics reply is about another socket ({reply})")]
    OtherSocket { reply: String },
}

/// The two ends of a TCP connection as the server sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionEnds {
    /// The client's address and port (the server's peer).
    pub client: SocketAddr,
    /// The server's own address and port for this connection.
    pub server: SocketAddr,
}

/// The uid that owns the client's socket of the TCP connection `ends`, which
/// must be a connection on this host. Blocks for one netlink round trip.
pub fn loopback_owner_uid(ends: ConnectionEnds) -> Result<u32, LoopbackOwnerError> {
    parse_reply(&query(ends)?, ends)
}

/// Sends the query for `ends` and returns the kernel's reply as it came.
fn query(ends: ConnectionEnds) -> Result<Vec<u8>, LoopbackOwnerError> {
    let mut socket = Socket::new(NETLINK_SOCK_DIAG).map_err(LoopbackOwnerError::Open)?;
    socket.bind_auto().map_err(LoopbackOwnerError::Open)?;
    socket2::SockRef::from(&socket)
        .set_read_timeout(Some(Duration::from_millis(REPLY_TIMEOUT_MS)))
        .map_err(LoopbackOwnerError::Open)?;
    socket
        .send_to(&encode_query(ends), &NetlinkAddress::new(0, 0), 0)
        .map_err(LoopbackOwnerError::Send)?;
    let mut reply = Vec::with_capacity(REPLY_BUFFER_BYTES);
    socket
        .recv(&mut reply, 0)
        .map_err(LoopbackOwnerError::Receive)?;
    Ok(reply)
}

/// The exact-match query (no `NLM_F_DUMP`) for the client's socket.
fn encode_query(ends: ConnectionEnds) -> Vec<u8> {
    let family = if ends.server.is_ipv4() {
        AF_INET
    } else {
        AF_INET6
    };
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST;
    let mut message = NetlinkMessage::new(
        header,
        SockDiagMessage::InetRequest(InetRequest {
            family,
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::empty(),
            states: StateFlags::all(),
            socket_id: SocketId {
                source_port: ends.client.port(),
                destination_port: ends.server.port(),
                source_address: ends.client.ip(),
                destination_address: ends.server.ip(),
                interface_id: 0,
                cookie: ANY_COOKIE,
            },
        })
        .into(),
    );
    message.finalize();
    let mut bytes = vec![0u8; message.buffer_len()];
    message.serialize(&mut bytes);
    bytes
}

/// The uid in the kernel's reply, once the reply is known to be about the
/// client's established socket. A socket in TIME_WAIT is reported with uid 0,
/// so any state but ESTABLISHED is refused rather than read as root.
fn parse_reply(bytes: &[u8], ends: ConnectionEnds) -> Result<u32, LoopbackOwnerError> {
    let message = NetlinkMessage::<SockDiagMessage>::deserialize(bytes)
        .map_err(|error| LoopbackOwnerError::Malformed(error.to_string()))?;
    let response = match message.payload {
        NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(response)) => response,
        NetlinkPayload::Error(error) => return Err(LoopbackOwnerError::Kernel(error.to_io())),
        other => {
            return Err(LoopbackOwnerError::Malformed(format!(
                "unexpected message type {}",
                other.message_type()
            )));
        }
    };
    let header = &response.header;
    let id = &header.socket_id;
    let same_socket = id.source_address.to_canonical() == ends.client.ip().to_canonical()
        && id.source_port == ends.client.port()
        && id.destination_address.to_canonical() == ends.server.ip().to_canonical()
        && id.destination_port == ends.server.port();
    if !same_socket {
        return Err(LoopbackOwnerError::OtherSocket {
            reply: format!(
                "{}:{} -> {}:{}",
                id.source_address, id.source_port, id.destination_address, id.destination_port
            ),
        });
    }
    if header.state != TCP_ESTABLISHED {
        return Err(LoopbackOwnerError::NotEstablished {
            state: header.state,
        });
    }
    Ok(header.uid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    /// A connection on loopback (`address`), as the server's end sees it.
    fn connection(address: &str) -> Option<(TcpStream, TcpStream, ConnectionEnds)> {
        let listener = TcpListener::bind(address).ok()?;
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, peer) = listener.accept().unwrap();
        let ends = ConnectionEnds {
            client: peer,
            server: server.local_addr().unwrap(),
        };
        Some((client, server, ends))
    }

    #[test]
    fn the_owner_of_a_loopback_client_socket_is_this_process_uid() {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        let (_client, _server, ends) = connection("127.0.0.1:0").unwrap();
        assert_eq!(loopback_owner_uid(ends).unwrap(), uid);
        // IPv6 loopback, where the host has it.
        if let Some((_client, _server, ends)) = connection("[::1]:0") {
            assert_eq!(loopback_owner_uid(ends).unwrap(), uid);
        }
    }

    /// A uid that is not the test's (nobody's).
    const OTHER_UID: u32 = 65534;

    #[test]
    fn a_socket_made_by_another_uid_is_owned_by_that_uid() {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            println!("SKIPPED: making a socket as another uid needs root");
            return;
        }
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        // A socket belongs to the filesystem uid of the thread that makes it;
        // setfsuid changes only this thread's, and it is set back at once.
        let client = std::thread::spawn(move || {
            // SAFETY: setfsuid has no memory effects; it only changes this
            // thread's filesystem uid, which the thread ends with anyway.
            unsafe { libc::setfsuid(OTHER_UID) };
            let client = TcpStream::connect(address).unwrap();
            // SAFETY: as above.
            unsafe { libc::setfsuid(0) };
            client
        })
        .join()
        .unwrap();
        let (server, peer) = listener.accept().unwrap();
        let ends = ConnectionEnds {
            client: peer,
            server: server.local_addr().unwrap(),
        };
        assert_eq!(loopback_owner_uid(ends).unwrap(), OTHER_UID);
        // The server's own end of the same connection is root's.
        let server_end = ConnectionEnds {
            client: ends.server,
            server: ends.client,
        };
        assert_eq!(loopback_owner_uid(server_end).unwrap(), 0);
        drop(client);
    }

    #[test]
    fn a_socket_that_does_not_exist_or_is_closing_is_an_error_not_a_uid() {
        let (client, server, ends) = connection("127.0.0.1:0").unwrap();
        let wrong = ConnectionEnds {
            client: SocketAddr::new(ends.client.ip(), ends.client.port().wrapping_add(1)),
            server: ends.server,
        };
        let error = loopback_owner_uid(wrong).unwrap_err();
        assert!(matches!(error, LoopbackOwnerError::Kernel(_)), "{error:?}");
        // Closed on both sides, the client's end lingers in TIME_WAIT, which
        // the kernel reports as uid 0: refused, not taken for root.
        drop(client);
        drop(server);
        std::thread::sleep(Duration::from_millis(50));
        let error = loopback_owner_uid(ends).unwrap_err();
        println!("closed: {error}");
        assert!(
            matches!(
                error,
                LoopbackOwnerError::NotEstablished { .. } | LoopbackOwnerError::Kernel(_)
            ),
            "{error:?}"
        );
    }

    #[test]
    fn a_reply_about_another_socket_or_cut_short_is_refused() {
        let (_client, _server, ends) = connection("127.0.0.1:0").unwrap();
        // The kernel's answer about the server's end of the same connection.
        let swapped = ConnectionEnds {
            client: ends.server,
            server: ends.client,
        };
        let reply = query(swapped).unwrap();
        let error = parse_reply(&reply, ends).unwrap_err();
        assert!(
            matches!(error, LoopbackOwnerError::OtherSocket { .. }),
            "{error:?}"
        );
        for length in [0, 8, 16, 40, reply.len() - 1] {
            let error = parse_reply(&reply[..length], swapped).unwrap_err();
            assert!(
                matches!(error, LoopbackOwnerError::Malformed(_)),
                "{length} bytes: {error:?}"
            );
        }
    }
}
