//! Raw-socket tests of how one connection's transmission phase moves: replies
//! written while a client is still sending (no deadlock between reading and
//! writing on the one task that serves a connection), the in-flight budgets
//! that bound it, and a panicking request handler answered with EIO.

// Test code keeps `as` for small sizes and byte patterns (as the other
// crates' tests do).
#![allow(clippy::cast_possible_truncation)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::hooked::{HookedExport, ReadHook};
use common::raw::*;
use common::{TestServer, pattern};
use lamina_nbd::ServerConfig;
use lamina_nbd::memory::{MemoryCatalog, MemoryExport};
use lamina_nbd::wire::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const MIB: usize = 1024 * 1024;
/// The big read, far beyond any socket buffer.
const READ_BYTES: usize = 16 * MIB;
/// The writes sent behind it, all before the client reads anything.
const WRITE_BYTES: usize = 4 * MIB;
const WRITE_COUNT: usize = 4;
/// Where the writes go: past the data the read reads.
const WRITE_OFFSET: usize = 32 * MIB;
/// Long enough for tens of MiB through a socket on a loaded machine; a
/// deadlock never ends.
const TRANSFER_WAIT_MS: u64 = 30_000;

/// A request header with no flags, offsets and lengths as `usize`.
fn header(command: u16, cookie: u64, offset: usize, length: usize) -> Vec<u8> {
    request_bytes(0, command, cookie, offset as u64, length as u32)
}

/// A client that sends a 16 MiB read and then 16 MiB of writes without reading
/// anything: the server must read the writes' payloads while the read's reply
/// waits for room in the socket, or neither side ever moves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_sent_without_reading_behind_a_large_read_are_all_answered() {
    let contents = pattern(READ_BYTES, 3);
    let export = Arc::new(MemoryExport::new(64 * MIB as u64).with_contents(&contents));
    let catalog = Arc::new(MemoryCatalog::new());
    catalog.insert("disk", "", export.clone());
    let server = TestServer::unix(catalog, ServerConfig::default()).await;
    let mut stream = UnixStream::connect(&server.socket).await.unwrap();
    go(&mut stream, "disk").await;

    let mut sent = header(CMD_READ, 1, 0, READ_BYTES);
    let payloads: Vec<Vec<u8>> = (0..WRITE_COUNT)
        .map(|index| pattern(WRITE_BYTES, 10 + index as u8))
        .collect();
    for (index, payload) in payloads.iter().enumerate() {
        let offset = WRITE_OFFSET + index * WRITE_BYTES;
        sent.extend_from_slice(&header(CMD_WRITE, 2 + index as u64, offset, WRITE_BYTES));
        sent.extend_from_slice(payload);
    }
    within_ms(TRANSFER_WAIT_MS, stream.write_all(&sent))
        .await
        .expect("the server reads every write while its read reply waits");

    let mut answered = Vec::new();
    let mut data = vec![0u8; READ_BYTES];
    for _ in 0..=WRITE_COUNT {
        let (errno, cookie) = simple_reply_within(&mut stream, TRANSFER_WAIT_MS).await;
        assert_eq!(errno, 0, "request {cookie} failed");
        if cookie == 1 {
            within_ms(TRANSFER_WAIT_MS, stream.read_exact(&mut data))
                .await
                .expect("read data");
            assert!(data == contents, "the read returns the export's data");
        }
        answered.push(cookie);
    }
    answered.sort_unstable();
    assert_eq!(answered, (1..=1 + WRITE_COUNT as u64).collect::<Vec<_>>());
    let stored = export.contents();
    for (index, payload) in payloads.iter().enumerate() {
        let offset = WRITE_OFFSET + index * WRITE_BYTES;
        assert!(
            &stored[offset..offset + WRITE_BYTES] == payload.as_slice(),
            "write {index} stored"
        );
    }
    round_trip(&mut stream, 100).await;
    server.stop().await;
}

/// Counts the reads running at once (each takes a while), and panics on a
/// read at `PANIC_OFFSET`.
struct CountingReads {
    running: AtomicUsize,
    running_max: AtomicUsize,
}

const PANIC_OFFSET: u64 = 65536;
const READ_DELAY_MS: u64 = 30;

#[async_trait::async_trait]
impl ReadHook for CountingReads {
    async fn before_read(&self, offset: u64) {
        assert!(offset != PANIC_OFFSET, "a handler that panics");
        let running = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.running_max.fetch_max(running, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(READ_DELAY_MS)).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
    }
}

type CountingExport = HookedExport<CountingReads>;

async fn counting_server(config: ServerConfig) -> (TestServer, Arc<CountingExport>) {
    let export = Arc::new(HookedExport {
        inner: MemoryExport::new(MIB as u64),
        hook: CountingReads {
            running: AtomicUsize::new(0),
            running_max: AtomicUsize::new(0),
        },
    });
    let catalog = Arc::new(MemoryCatalog::new());
    catalog.insert("disk", "", export.clone());
    (TestServer::unix(catalog, config).await, export)
}

/// Sends `count` pipelined reads of `length` bytes and reads every answer.
async fn pipelined_reads(stream: &mut UnixStream, count: u64, length: usize) {
    let mut sent = Vec::new();
    for cookie in 0..count {
        sent.extend_from_slice(&header(CMD_READ, cookie, 0, length));
    }
    stream.write_all(&sent).await.unwrap();
    let mut data = vec![0u8; length];
    for _ in 0..count {
        assert_eq!(simple_reply(stream).await.0, 0);
        stream.read_exact(&mut data).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_budgets_bound_requests_and_bytes() {
    // At most two requests at once.
    let config = ServerConfig {
        in_flight_requests_max: 2,
        ..ServerConfig::default()
    };
    let (server, export) = counting_server(config).await;
    let mut stream = UnixStream::connect(&server.socket).await.unwrap();
    go(&mut stream, "disk").await;
    pipelined_reads(&mut stream, 12, 4096).await;
    assert_eq!(export.hook.running_max.load(Ordering::SeqCst), 2);
    server.stop().await;

    // At most 8 KiB of buffers: two 4 KiB reads at once, and one read larger
    // than the whole budget still runs, alone.
    let config = ServerConfig {
        in_flight_bytes_max: 8192,
        ..ServerConfig::default()
    };
    let (server, export) = counting_server(config).await;
    let mut stream = UnixStream::connect(&server.socket).await.unwrap();
    go(&mut stream, "disk").await;
    pipelined_reads(&mut stream, 12, 4096).await;
    assert_eq!(export.hook.running_max.load(Ordering::SeqCst), 2);
    pipelined_reads(&mut stream, 3, 65536).await;
    assert_eq!(export.hook.running_max.load(Ordering::SeqCst), 2);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_request_handler_is_answered_with_eio() {
    let (server, _export) = counting_server(ServerConfig::default()).await;
    let mut stream = UnixStream::connect(&server.socket).await.unwrap();
    go(&mut stream, "disk").await;
    send_request(&mut stream, 0, CMD_READ, 7, PANIC_OFFSET, 512, &[]).await;
    assert_eq!(simple_reply(&mut stream).await, (EIO, 7));
    round_trip(&mut stream, 20).await;
    server.stop().await;
}
