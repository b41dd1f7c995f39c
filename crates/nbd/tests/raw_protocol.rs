//! Raw-socket tests for what real clients never send: bad magic, truncated
//! requests, malformed and unknown options, oversized option data, unknown flags
//! and commands, the connection limit, out-of-order replies, disconnect and
//! graceful shutdown with requests in flight.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::hooked::{HookedExport, ReadHook};
use common::raw::*;
use common::{TestServer, catalog_with};
use lamina_nbd::memory::{MemoryCatalog, MemoryExport};
use lamina_nbd::wire::*;
use lamina_nbd::{ServerConfig, serve_connection};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const MIB: u64 = 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_magic_closes_only_that_connection() {
    let (catalog, _exports) = catalog_with(&[("disk", MIB)]);
    let server = TestServer::unix(catalog, ServerConfig::default()).await;
    let mut good = UnixStream::connect(&server.socket).await.unwrap();
    let mut bad = UnixStream::connect(&server.socket).await.unwrap();
    go(&mut good, "disk").await;
    go(&mut bad, "disk").await;
    round_trip(&mut bad, 10).await;
    bad.write_all(&[0xde; REQUEST_HEADER_BYTES]).await.unwrap();
    expect_closed(&mut bad).await;
    round_trip(&mut good, 20).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_requests_close_only_that_connection() {
    let (catalog, exports) = catalog_with(&[("disk", MIB)]);
    let server = TestServer::unix(catalog, ServerConfig::default()).await;
    let mut good = UnixStream::connect(&server.socket).await.unwrap();
    go(&mut good, "disk").await;
    // A header cut short.
    let mut short = UnixStream::connect(&server.socket).await.unwrap();
    go(&mut short, "disk").await;
    short.write_all(&REQUEST_MAGIC.to_be_bytes()).await.unwrap();
    short.write_all(&[0u8; 6]).await.unwrap();
    short.shutdown().await.unwrap();
    expect_closed(&mut short).await;
    // A write whose payload is cut short is never applied.
    let mut cut = UnixStream::connect(&server.socket).await.unwrap();
    go(&mut cut, "disk").await;
    send_request(&mut cut, 0, CMD_WRITE, 1, 0, 4096, &[0xaa; 100]).await;
    cut.shutdown().await.unwrap();
    expect_closed(&mut cut).await;
    assert_eq!(exports[0].operation_counts().writes, 0);
    round_trip(&mut good, 30).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_unknown_and_oversized_options() {
    let (catalog, _exports) = catalog_with(&[("disk", MIB)]);
    let config = ServerConfig {
        option_bytes_max: 8192,
        ..ServerConfig::default()
    };
    let server = TestServer::unix(catalog, config).await;
    let mut stream = UnixStream::connect(&server.socket).await.unwrap();
    greet(&mut stream, CLIENT_FLAG_FIXED_NEWSTYLE).await;
    // GO whose name length runs past the data.
    let mut bad_go = go_data("disk");
    bad_go[3] = 200;
    send_option(&mut stream, OPT_GO, &bad_go).await;
    assert_eq!(option_reply(&mut stream).await.1, REP_ERR_INVALID);
    // LIST must carry no data.
    send_option(&mut stream, OPT_LIST, b"junk").await;
    assert_eq!(option_reply(&mut stream).await.1, REP_ERR_INVALID);
    // Export names must be UTF-8.
    let mut not_utf8 = go_data("disk");
    not_utf8[4] = 0xff;
    send_option(&mut stream, OPT_INFO, &not_utf8).await;
    assert_eq!(option_reply(&mut stream).await.1, REP_ERR_INVALID);
    // Unknown options, TLS and extended headers are not supported.
    for option in [999, OPT_STARTTLS, OPT_EXTENDED_HEADERS, 4] {
        send_option(&mut stream, option, &[]).await;
        let (echoed, reply_type, _) = option_reply(&mut stream).await;
        assert_eq!(
            (echoed, reply_type),
            (option, REP_ERR_UNSUP),
            "option {option}"
        );
    }
    // Unknown export.
    send_option(&mut stream, OPT_INFO, &go_data("missing")).await;
    assert_eq!(option_reply(&mut stream).await.1, REP_ERR_UNKNOWN);
    // Meta contexts before structured replies are refused.
    let mut meta = Vec::new();
    meta.extend_from_slice(&4u32.to_be_bytes());
    meta.extend_from_slice(b"disk");
    meta.extend_from_slice(&0u32.to_be_bytes());
    send_option(&mut stream, OPT_LIST_META_CONTEXT, &meta).await;
    assert_eq!(option_reply(&mut stream).await.1, REP_ERR_INVALID);
    // After all that, the handshake still works.
    send_option(&mut stream, OPT_GO, &go_data("disk")).await;
    loop {
        let (_, reply_type, _) = option_reply(&mut stream).await;
        if reply_type == REP_ACK {
            break;
        }
        assert_eq!(reply_type, REP_INFO);
    }
    round_trip(&mut stream, 40).await;

    // Option data over the limit: an error reply, then the server hangs up.
    let mut big = UnixStream::connect(&server.socket).await.unwrap();
    greet(&mut big, CLIENT_FLAG_FIXED_NEWSTYLE).await;
    let mut header = Vec::new();
    header.extend_from_slice(&IHAVEOPT_MAGIC.to_be_bytes());
    header.extend_from_slice(&OPT_GO.to_be_bytes());
    header.extend_from_slice(&(1u32 << 30).to_be_bytes());
    big.write_all(&header).await.unwrap();
    assert_eq!(option_reply(&mut big).await.1, REP_ERR_TOO_BIG);
    expect_closed(&mut big).await;

    // Bad option magic closes.
    let mut bad_magic = UnixStream::connect(&server.socket).await.unwrap();
    greet(&mut bad_magic, CLIENT_FLAG_FIXED_NEWSTYLE).await;
    bad_magic.write_all(&[0x11; 16]).await.unwrap();
    expect_closed(&mut bad_magic).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_flags_export_name_and_abort() {
    let (catalog, _exports) = catalog_with(&[("disk", MIB)]);
    let server = TestServer::unix(catalog, ServerConfig::default()).await;
    // A client flag the server never offered closes the connection.
    let mut stream = UnixStream::connect(&server.socket).await.unwrap();
    greet(&mut stream, 1 << 7).await;
    expect_closed(&mut stream).await;
    // EXPORT_NAME of an unknown export closes (it has no error reply).
    let mut stream = UnixStream::connect(&server.socket).await.unwrap();
    greet(&mut stream, CLIENT_FLAG_FIXED_NEWSTYLE).await;
    send_option(&mut stream, OPT_EXPORT_NAME, b"missing").await;
    expect_closed(&mut stream).await;
    // EXPORT_NAME without NO_ZEROES: size, flags and 124 zero bytes.
    let mut stream = UnixStream::connect(&server.socket).await.unwrap();
    greet(&mut stream, CLIENT_FLAG_FIXED_NEWSTYLE).await;
    send_option(&mut stream, OPT_EXPORT_NAME, b"disk").await;
    let mut reply = [0xffu8; 134];
    within(stream.read_exact(&mut reply)).await.unwrap();
    assert_eq!(u64::from_be_bytes(reply[0..8].try_into().unwrap()), MIB);
    let flags = u16::from_be_bytes([reply[8], reply[9]]);
    assert_ne!(flags & TRANSMISSION_FLAG_HAS_FLAGS, 0);
    assert_ne!(flags & TRANSMISSION_FLAG_CAN_MULTI_CONN, 0);
    assert_eq!(
        flags & TRANSMISSION_FLAG_SEND_DF,
        0,
        "no DF without structured replies"
    );
    assert!(reply[10..].iter().all(|&byte| byte == 0));
    round_trip(&mut stream, 50).await;
    // ABORT is acknowledged, then the connection ends.
    let mut stream = UnixStream::connect(&server.socket).await.unwrap();
    greet(&mut stream, CLIENT_FLAG_FIXED_NEWSTYLE).await;
    send_option(&mut stream, OPT_ABORT, &[]).await;
    assert_eq!(option_reply(&mut stream).await.1, REP_ACK);
    expect_closed(&mut stream).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_commands_and_flags_get_einval() {
    let (catalog, _exports) = catalog_with(&[("disk", MIB)]);
    let server = TestServer::unix(catalog, ServerConfig::default()).await;
    let mut stream = UnixStream::connect(&server.socket).await.unwrap();
    go(&mut stream, "disk").await;
    send_request(&mut stream, 0, 99, 1, 0, 0, &[]).await;
    assert_eq!(simple_reply(&mut stream).await, (EINVAL, 1));
    send_request(&mut stream, 1 << 9, CMD_FLUSH, 2, 0, 0, &[]).await;
    assert_eq!(simple_reply(&mut stream).await, (EINVAL, 2));
    // Block status needs a negotiated context.
    send_request(&mut stream, 0, CMD_BLOCK_STATUS, 3, 0, 4096, &[]).await;
    assert_eq!(simple_reply(&mut stream).await, (EINVAL, 3));
    // A refused write's payload is skipped so the stream stays in step.
    send_request(
        &mut stream,
        CMD_FLAG_DF,
        CMD_WRITE,
        4,
        0,
        4096,
        &[0xab; 4096],
    )
    .await;
    assert_eq!(simple_reply(&mut stream).await, (EINVAL, 4));
    round_trip(&mut stream, 60).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_limit_refuses_extra_connections() {
    let (catalog, _exports) = catalog_with(&[("disk", MIB)]);
    let config = ServerConfig {
        connections_max: 2,
        ..ServerConfig::default()
    };
    let server = TestServer::unix(catalog, config).await;
    let mut first = UnixStream::connect(&server.socket).await.unwrap();
    go(&mut first, "disk").await;
    let mut second = UnixStream::connect(&server.socket).await.unwrap();
    go(&mut second, "disk").await;
    let mut third = UnixStream::connect(&server.socket).await.unwrap();
    expect_closed(&mut third).await;
    assert_eq!(server.server.refused_connection_count(), 1);
    round_trip(&mut first, 70).await;
    // Once a connection leaves, a new one is accepted.
    send_request(&mut second, 0, CMD_DISC, 0, 0, 0, &[]).await;
    expect_closed(&mut second).await;
    let deadline = Instant::now() + Duration::from_millis(WAIT_MS);
    while server.server.active_connection_count() > 1 {
        assert!(Instant::now() < deadline, "connection slot released");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut fourth = UnixStream::connect(&server.socket).await.unwrap();
    go(&mut fourth, "disk").await;
    round_trip(&mut fourth, 80).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_timeout_closes_idle_clients() {
    let (catalog, _exports) = catalog_with(&[("disk", MIB)]);
    let config = ServerConfig {
        handshake_timeout_ms: 200,
        ..ServerConfig::default()
    };
    let server = TestServer::unix(catalog, config).await;
    let mut stream = UnixStream::connect(&server.socket).await.unwrap();
    let mut greeting = [0u8; 18];
    stream.read_exact(&mut greeting).await.unwrap();
    expect_closed(&mut stream).await;
    server.stop().await;
}

/// Makes reads at offset 0 take `delay` (to force reordering and to keep a
/// request in flight across shutdown).
struct SlowFirstBlock {
    delay: Duration,
}

#[async_trait::async_trait]
impl ReadHook for SlowFirstBlock {
    async fn before_read(&self, offset: u64) {
        if offset == 0 {
            tokio::time::sleep(self.delay).await;
        }
    }
}

fn slow_catalog(delay_ms: u64) -> Arc<MemoryCatalog> {
    let catalog = Arc::new(MemoryCatalog::new());
    let slow = HookedExport {
        inner: MemoryExport::new(MIB).with_contents(&[9u8; 8192]),
        hook: SlowFirstBlock {
            delay: Duration::from_millis(delay_ms),
        },
    };
    catalog.insert("slow", "", Arc::new(slow));
    catalog
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_come_back_out_of_order() {
    let server = TestServer::unix(slow_catalog(300), ServerConfig::default()).await;
    let mut stream = UnixStream::connect(&server.socket).await.unwrap();
    go(&mut stream, "slow").await;
    send_request(&mut stream, 0, CMD_READ, 1, 0, 512, &[]).await;
    send_request(&mut stream, 0, CMD_READ, 2, 4096, 512, &[]).await;
    let mut data = [0u8; 512];
    assert_eq!(
        simple_reply(&mut stream).await,
        (0, 2),
        "the fast read overtakes"
    );
    stream.read_exact(&mut data).await.unwrap();
    assert_eq!(simple_reply(&mut stream).await, (0, 1));
    stream.read_exact(&mut data).await.unwrap();
    assert!(data.iter().all(|&byte| byte == 9));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_and_shutdown_answer_requests_in_flight() {
    let server = TestServer::unix(slow_catalog(300), ServerConfig::default()).await;
    // NBD_CMD_DISC right behind a slow read: the read is still answered.
    let mut stream = UnixStream::connect(&server.socket).await.unwrap();
    go(&mut stream, "slow").await;
    send_request(&mut stream, 0, CMD_READ, 5, 0, 4096, &[]).await;
    send_request(&mut stream, 0, CMD_DISC, 6, 0, 0, &[]).await;
    assert_eq!(simple_reply(&mut stream).await, (0, 5));
    let mut data = vec![0u8; 4096];
    stream.read_exact(&mut data).await.unwrap();
    expect_closed(&mut stream).await;

    // Shutdown while a slow read is in flight: it is answered, then the
    // connection closes and the server returns.
    let mut stream = UnixStream::connect(&server.socket).await.unwrap();
    go(&mut stream, "slow").await;
    send_request(&mut stream, 0, CMD_READ, 7, 0, 4096, &[]).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stopping = tokio::spawn(server.stop());
    assert_eq!(simple_reply(&mut stream).await, (0, 7));
    stream.read_exact(&mut data).await.unwrap();
    assert!(data.iter().all(|&byte| byte == 9));
    expect_closed(&mut stream).await;
    within(stopping).await.expect("server stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_connection_over_an_in_memory_stream() {
    let (catalog, exports) = catalog_with(&[("disk", MIB)]);
    let (mut client, server_side) = tokio::io::duplex(1 << 20);
    let config = ServerConfig::default();
    let serving =
        tokio::spawn(async move { serve_connection(server_side, catalog, &config).await });
    let (size, flags) = go(&mut client, "disk").await;
    assert_eq!(size, MIB);
    assert_eq!(flags & TRANSMISSION_FLAG_READ_ONLY, 0);
    round_trip(&mut client, 90).await;
    send_request(&mut client, 0, CMD_DISC, 0, 0, 0, &[]).await;
    within(serving).await.expect("no panic").expect("clean end");
    assert_eq!(exports[0].operation_counts().writes, 1);
}
