//! Half-open connections against the handshake limits: hundreds of connections
//! that send nothing, two bytes of client flags or half an option header, kept
//! open and reopened, while real clients (nbdinfo, nbdsh, the raw test client)
//! connect and work; the per-peer limit by TCP address and by Unix uid; a
//! transmission slot taken only when a handshake completes; and the handshake
//! timeout with its counter.

// Test code keeps `as` for small sizes and byte patterns (issue 17 converts
// the library and binaries only).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod common;

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::raw::*;
use common::{TestServer, catalog_with, command_with_python, python_with_nbd, run_ok, tool};
use lamina_nbd::wire::*;
use lamina_nbd::{CancellationToken, ServerConfig};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream, UnixStream};
use tokio::process::Command;
use tokio::task::JoinSet;

const MIB: u64 = 1024 * 1024;
/// Half-open connections an attack keeps open (more than `connections_max`'s
/// default of 256).
const ATTACK_CONNECTION_COUNT: usize = 300;
/// Distinct loopback addresses a TCP attack comes from.
const ATTACK_ADDRESS_COUNT: usize = 30;
/// Pause before an attacker reopens a connection the server closed.
const ATTACK_REOPEN_PAUSE_MS: u64 = 200;

/// Where a half-open connection goes, and from where.
#[derive(Clone)]
enum Target {
    Tcp { port: u16, source: Ipv4Addr },
    Unix(PathBuf),
}

/// How far into the handshake a half-open connection gets before it stalls.
#[derive(Clone, Copy, Debug)]
enum Stall {
    /// Sends nothing.
    Silent,
    /// Sends two of the four bytes of client flags.
    HalfClientFlags,
    /// Sends the client flags and eight of the sixteen bytes of an option header.
    HalfOptionHeader,
}

const STALLS: [Stall; 3] = [
    Stall::Silent,
    Stall::HalfClientFlags,
    Stall::HalfOptionHeader,
];

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<S: AsyncRead + AsyncWrite + Unpin + Send> Stream for S {}

async fn connect_tcp_from(source: Ipv4Addr, port: u16) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind((source, 0).into())?;
    socket.connect((Ipv4Addr::LOCALHOST, port).into()).await
}

async fn connect(target: &Target) -> std::io::Result<Box<dyn Stream>> {
    Ok(match target {
        Target::Tcp { port, source } => Box::new(connect_tcp_from(*source, *port).await?),
        Target::Unix(path) => Box::new(UnixStream::connect(path).await?),
    })
}

/// Opens a connection and sends what `stall` says, then nothing more.
async fn open_stalled(target: &Target, stall: Stall) -> std::io::Result<Box<dyn Stream>> {
    let mut stream = connect(target).await?;
    let flags = (CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES).to_be_bytes();
    match stall {
        Stall::Silent => {}
        Stall::HalfClientFlags => stream.write_all(&flags[..2]).await?,
        Stall::HalfOptionHeader => {
            stream.write_all(&flags).await?;
            stream.write_all(&IHAVEOPT_MAGIC.to_be_bytes()).await?;
        }
    }
    Ok(stream)
}

/// Waits until the server closes `stream` (the greeting is read and ignored).
async fn until_closed(stream: &mut Box<dyn Stream>) {
    let mut buffer = [0u8; 64];
    while let Ok(count) = stream.read(&mut buffer).await {
        if count == 0 {
            return;
        }
    }
}

/// Asserts the server closes a stalled connection (after its greeting) in time.
async fn expect_closed_after_greeting(stream: &mut Box<dyn Stream>) {
    within(until_closed(stream)).await;
}

/// Keeps `count` half-open connections open until `stop`, reopening each one
/// the server closes after [`ATTACK_REOPEN_PAUSE_MS`] when `reopen` is set;
/// `opened` counts every connection opened.
struct Attack {
    tasks: JoinSet<()>,
    stop: CancellationToken,
    opened: Arc<AtomicU64>,
}

impl Attack {
    fn start(targets: Vec<Target>, count: usize, reopen: bool) -> Attack {
        let stop = CancellationToken::new();
        let opened = Arc::new(AtomicU64::new(0));
        let mut tasks = JoinSet::new();
        for index in 0..count {
            let target = targets[index % targets.len()].clone();
            let stall = STALLS[index % STALLS.len()];
            let (stop, opened) = (stop.clone(), Arc::clone(&opened));
            tasks.spawn(async move {
                loop {
                    if let Ok(mut stream) = open_stalled(&target, stall).await {
                        opened.fetch_add(1, Ordering::Relaxed);
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = until_closed(&mut stream) => {}
                        }
                        if !reopen {
                            stop.cancelled().await;
                            return;
                        }
                    }
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_millis(ATTACK_REOPEN_PAUSE_MS)) => {}
                    }
                }
            });
        }
        Attack {
            tasks,
            stop,
            opened,
        }
    }

    /// Waits until at least `count` connections were opened.
    async fn wait_for_opened(&self, count: u64) {
        wait_until("the attack opened its connections", || {
            self.opened.load(Ordering::Relaxed) >= count
        })
        .await;
    }

    async fn stop(mut self) {
        self.stop.cancel();
        while self.tasks.join_next().await.is_some() {}
    }
}

async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_millis(WAIT_MS);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Asserts `stream` is still open: after the greeting, nothing to read and no
/// close within a while.
async fn expect_open<S: AsyncRead + Unpin>(stream: &mut S) {
    let mut buffer = [0u8; 64];
    loop {
        match tokio::time::timeout(Duration::from_millis(200), stream.read(&mut buffer)).await {
            Err(_) => return,
            Ok(Ok(0)) | Ok(Err(_)) => panic!("expected the connection to stay open"),
            Ok(Ok(_greeting)) => {}
        }
    }
}

fn loopback(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, last)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_clients_work_while_hundreds_of_half_open_tcp_connections_keep_reopening() {
    let Some(nbdinfo) = tool("nbdinfo") else {
        return;
    };
    let (catalog, _exports) = catalog_with(&[("disk", 4 * MIB)]);
    let server = TestServer::tcp(catalog, ServerConfig::default()).await;
    let port = server.tcp_port.expect("tcp server");
    let targets = (0..ATTACK_ADDRESS_COUNT)
        .map(|index| Target::Tcp {
            port,
            source: loopback(2 + index as u8),
        })
        .collect();
    let attack = Attack::start(targets, ATTACK_CONNECTION_COUNT, true);
    attack.wait_for_opened(ATTACK_CONNECTION_COUNT as u64).await;
    for _ in 0..3 {
        let size = run_ok(Command::new(&nbdinfo).arg("--size").arg(server.uri("disk"))).await;
        assert_eq!(size.trim(), (4 * MIB).to_string());
    }
    let mut client = connect_tcp_from(loopback(1), port).await.unwrap();
    go(&mut client, "disk").await;
    round_trip(&mut client, 10).await;
    let counters = server.server.counters();
    assert!(
        counters.handshakes_in_progress <= ServerConfig::default().handshakes_in_progress_max,
        "{counters:?}"
    );
    assert!(
        counters.handshakes_closed_for_total_limit > 0,
        "{counters:?}"
    );
    assert_eq!(counters.refused_connections, 0, "{counters:?}");
    attack.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbdsh_works_while_hundreds_of_half_open_connections_of_its_own_uid_wait() {
    let (Some(nbdsh), Some(python)) = (tool("nbdsh"), python_with_nbd()) else {
        return;
    };
    let (catalog, exports) = catalog_with(&[("disk", 4 * MIB)]);
    let server = TestServer::unix(catalog, ServerConfig::default()).await;
    let attack = Attack::start(
        vec![Target::Unix(server.socket.clone())],
        ATTACK_CONNECTION_COUNT,
        false,
    );
    attack.wait_for_opened(ATTACK_CONNECTION_COUNT as u64).await;
    let script = "data = bytes(range(256)) * 16\n\
                  h.pwrite(data, 8192)\n\
                  h.flush()\n\
                  assert h.pread(4096, 8192) == data\n\
                  print('nbdsh passed')";
    let output = run_ok(
        command_with_python(&nbdsh, &python)
            .arg("-u")
            .arg(server.uri("disk"))
            .arg("-c")
            .arg(script),
    )
    .await;
    assert!(output.contains("nbdsh passed"), "{output}");
    assert!(exports[0].allocated_block_count() > 0);
    let counters = server.server.counters();
    // The uid held its limit of stalled handshakes; nbdsh's connection closed
    // the oldest and then finished its own.
    assert_eq!(
        counters.handshakes_in_progress,
        ServerConfig::default().handshakes_per_peer_max - 1,
        "{counters:?}"
    );
    assert!(
        counters.handshakes_closed_for_peer_limit > 0,
        "{counters:?}"
    );
    attack.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_takes_a_transmission_slot_only_when_its_handshake_completes() {
    let (catalog, _exports) = catalog_with(&[("disk", MIB)]);
    let config = ServerConfig {
        connections_max: 1,
        ..ServerConfig::default()
    };
    let server = TestServer::unix(catalog, config).await;
    let target = Target::Unix(server.socket.clone());
    let mut stalled = Vec::new();
    for stall in STALLS.iter().cycle().take(10) {
        stalled.push(open_stalled(&target, *stall).await.unwrap());
    }
    wait_until("the stalled connections are in the handshake", || {
        server.server.counters().handshakes_in_progress == 10
    })
    .await;
    // Two real clients start their handshakes; the first to finish is served,
    // the second is told why and closed.
    let mut first = UnixStream::connect(&server.socket).await.unwrap();
    let mut second = UnixStream::connect(&server.socket).await.unwrap();
    greet(
        &mut second,
        CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES,
    )
    .await;
    go(&mut first, "disk").await;
    round_trip(&mut first, 20).await;
    send_option(&mut second, OPT_GO, &go_data("disk")).await;
    let (option, reply_type, _message) = option_reply(&mut second).await;
    assert_eq!((option, reply_type), (OPT_GO, REP_ERR_POLICY));
    expect_closed(&mut second).await;
    // With the slot taken, a new connection is closed before the greeting.
    let mut third = UnixStream::connect(&server.socket).await.unwrap();
    expect_closed(&mut third).await;
    // The server counts a refusal after closing the socket: on a loaded
    // machine the client can see the close first.
    wait_until("both refusals are counted", || {
        server.server.refused_connection_count() == 2
    })
    .await;
    assert_eq!(server.server.refused_connection_count(), 2);
    round_trip(&mut first, 30).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_at_its_limit_loses_its_oldest_handshake_and_other_peers_keep_theirs() {
    let (catalog, _exports) = catalog_with(&[("disk", MIB)]);
    let config = ServerConfig {
        handshakes_per_peer_max: 4,
        ..ServerConfig::default()
    };
    let server = TestServer::tcp(catalog, config).await;
    let port = server.tcp_port.expect("tcp server");
    let greedy = Target::Tcp {
        port,
        source: loopback(2),
    };
    let other = Target::Tcp {
        port,
        source: loopback(3),
    };
    let mut greedy_streams = Vec::new();
    let mut other_streams = Vec::new();
    for stall in STALLS.iter().cycle().take(4) {
        greedy_streams.push(open_stalled(&greedy, *stall).await.unwrap());
        other_streams.push(open_stalled(&other, *stall).await.unwrap());
    }
    wait_until("eight handshakes are in progress", || {
        server.server.counters().handshakes_in_progress == 8
    })
    .await;
    // A fifth connection from the greedy address closes that address's oldest.
    greedy_streams.push(open_stalled(&greedy, Stall::Silent).await.unwrap());
    expect_closed_after_greeting(&mut greedy_streams[0]).await;
    for stream in greedy_streams[1..]
        .iter_mut()
        .chain(other_streams.iter_mut())
    {
        expect_open(stream).await;
    }
    let counters = server.server.counters();
    assert_eq!(counters.handshakes_closed_for_peer_limit, 1, "{counters:?}");
    assert_eq!(counters.handshakes_in_progress, 8, "{counters:?}");
    // Another peer is served as usual.
    let mut client = connect_tcp_from(loopback(1), port).await.unwrap();
    go(&mut client, "disk").await;
    round_trip(&mut client, 40).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_peer_limit_counts_a_unix_uid_as_one_peer() {
    let (catalog, _exports) = catalog_with(&[("disk", MIB)]);
    let config = ServerConfig {
        handshakes_per_peer_max: 3,
        ..ServerConfig::default()
    };
    let server = TestServer::unix(catalog, config).await;
    let target = Target::Unix(server.socket.clone());
    let mut streams = Vec::new();
    for stall in STALLS {
        streams.push(open_stalled(&target, stall).await.unwrap());
    }
    wait_until("three handshakes are in progress", || {
        server.server.counters().handshakes_in_progress == 3
    })
    .await;
    // The real client closes the oldest stalled connection of its uid.
    let mut client = UnixStream::connect(&server.socket).await.unwrap();
    go(&mut client, "disk").await;
    round_trip(&mut client, 50).await;
    expect_closed_after_greeting(&mut streams[0]).await;
    expect_open(&mut streams[1]).await;
    let counters = server.server.counters();
    assert_eq!(counters.handshakes_closed_for_peer_limit, 1, "{counters:?}");
    assert_eq!(counters.handshakes_in_progress, 2, "{counters:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_handshake_timeout_closes_every_kind_of_stalled_connection() {
    assert!(
        ServerConfig::default().handshake_timeout_ms <= 10_000,
        "a half-open connection holds a handshake slot for at most 10 s by default"
    );
    let (catalog, _exports) = catalog_with(&[("disk", MIB)]);
    let timeout_ms = 300;
    let config = ServerConfig {
        handshake_timeout_ms: timeout_ms,
        ..ServerConfig::default()
    };
    let server = TestServer::unix(catalog, config).await;
    let target = Target::Unix(server.socket.clone());
    let started = Instant::now();
    let mut streams = Vec::new();
    for stall in STALLS {
        streams.push(open_stalled(&target, stall).await.unwrap());
    }
    // A client that keeps sending, one byte at a time, is closed all the same:
    // the timeout covers the whole handshake, not the gap between bytes.
    let mut dripping = connect(&target).await.unwrap();
    let drip = async {
        for byte in CLIENT_FLAG_FIXED_NEWSTYLE.to_be_bytes() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if dripping.write_all(&[byte]).await.is_err() {
                break;
            }
        }
        let option_header = IHAVEOPT_MAGIC.to_be_bytes();
        for byte in option_header {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if dripping.write_all(&[byte]).await.is_err() {
                break;
            }
        }
    };
    drip.await;
    for stream in &mut streams {
        expect_closed_after_greeting(stream).await;
    }
    expect_closed_after_greeting(&mut dripping).await;
    assert!(
        started.elapsed() >= Duration::from_millis(timeout_ms - 50),
        "closed before the timeout"
    );
    wait_until("every timed-out handshake is counted and freed", || {
        let counters = server.server.counters();
        counters.handshakes_timed_out == 4 && counters.handshakes_in_progress == 0
    })
    .await;
    let mut client = UnixStream::connect(&server.socket).await.unwrap();
    go(&mut client, "disk").await;
    round_trip(&mut client, 60).await;
    server.stop().await;
}
