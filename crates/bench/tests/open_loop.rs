//! The open-loop generator against a real NBD server (nbdkit's memory plugin on a Unix
//! socket in a private directory, started and stopped by each test): requests complete
//! with the data written, and latency counts from the intended arrival, so a schedule
//! the server cannot keep shows up in the p99 even though few requests are in flight.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lamina_bench::nbd_client::{self, Endpoint};
use lamina_bench::open_loop::generator::{DataMode, LoadSpec, Schedule, prefill_pattern, run_load};
use lamina_bench::process::{ManagedChild, find_program};

const REGION_BYTES: u64 = 16 << 20;

/// How long nbdkit gets to accept its first handshake.
const READY_TIMEOUT_MS: u64 = 10_000;

/// Starts `nbdkit ARGUMENTS` on a socket in `directory` and waits until it negotiates.
fn start_nbdkit(directory: &Path, arguments: &[&str]) -> (ManagedChild, Endpoint) {
    assert!(
        find_program("nbdkit").is_some(),
        "nbdkit must be installed for the open-loop generator's tests"
    );
    let socket = directory.join("nbd.sock");
    let mut command = Command::new("nbdkit");
    command
        .arg("--unix")
        .arg(&socket)
        .args(["--foreground", "--exit-with-parent"])
        .args(arguments)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let child = ManagedChild::spawn(command).expect("nbdkit starts");
    let endpoint =
        Endpoint::parse(&format!("nbd+unix:///?socket={}", socket.display())).expect("uri");
    let deadline = Instant::now() + Duration::from_millis(READY_TIMEOUT_MS);
    loop {
        if let Ok(mut connection) = nbd_client::connect(&endpoint) {
            assert_eq!(connection.export_size_bytes, REGION_BYTES);
            nbd_client::disconnect(&mut connection.socket);
            return (child, endpoint);
        }
        assert!(Instant::now() < deadline, "nbdkit did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn spec(offered_per_second: f64, read_percent: u8, data: DataMode) -> LoadSpec {
    LoadSpec {
        offered_per_second,
        connections: 2,
        warmup: Duration::from_millis(200),
        measured: Duration::from_secs(1),
        schedule: Schedule::Poisson,
        read_percent,
        block_bytes: 4096,
        region_bytes: REGION_BYTES,
        in_flight_per_connection_max: 64,
        drain_timeout: Duration::from_secs(20),
        data,
        seed: 11,
    }
}

#[test]
fn requests_complete_with_the_data_written() {
    let directory = tempfile::tempdir().expect("tempdir");
    let (mut server, endpoint) = start_nbdkit(directory.path(), &["memory", "size=16M"]);
    prefill_pattern(&endpoint, REGION_BYTES, 4096, 7).expect("prefill");

    // 70/30 with every write rewriting the pattern and every read checked against it.
    let mixed = run_load(
        &endpoint,
        &spec(3000.0, 70, DataMode::Verified { seed: 7 }),
        None,
    )
    .expect("mixed run");
    assert!(mixed.completed > 1500, "completed {}", mixed.completed);
    assert_eq!(mixed.errors, 0);
    assert_eq!(
        mixed.mismatches, 0,
        "every read returned the pattern written"
    );
    assert_eq!(mixed.unissued, 0);
    assert!(mixed.latency.p50_us > 0.0);

    // The check is real: against another seed's pattern every read differs.
    let wrong = run_load(
        &endpoint,
        &spec(2000.0, 100, DataMode::Verified { seed: 8 }),
        None,
    )
    .expect("read run");
    assert!(wrong.completed > 1000);
    assert!(
        wrong.mismatches >= wrong.completed,
        "{} mismatches for {} reads (warm-up reads are checked too)",
        wrong.mismatches,
        wrong.completed
    );
    server.stop();
}

#[test]
fn latency_counts_from_intended_arrival_when_the_server_falls_behind() {
    let directory = tempfile::tempdir().expect("tempdir");
    // One thread and 2 ms per read: the server completes at most 500 reads a second.
    let (mut server, endpoint) = start_nbdkit(
        directory.path(),
        &[
            "--threads=1",
            "--filter=delay",
            "memory",
            "size=16M",
            "rdelay=2ms",
        ],
    );
    let within = LoadSpec {
        connections: 1,
        ..spec(100.0, 100, DataMode::Unchecked)
    };
    let kept = run_load(&endpoint, &within, None).expect("run within capacity");
    assert!(kept.completed > 50);
    assert!(
        kept.latency.p99_us < 50_000.0,
        "a schedule the server keeps has a p99 near its 2 ms service time, got {} us",
        kept.latency.p99_us
    );

    // Four times what it can do, with at most 4 requests in flight: from sending, a
    // request waits for at most ~4 service times; from its intended arrival, it waits
    // for the whole backlog, which grows through the run.
    let beyond = LoadSpec {
        connections: 1,
        in_flight_per_connection_max: 4,
        warmup: Duration::ZERO,
        ..spec(2000.0, 100, DataMode::Unchecked)
    };
    let behind = run_load(&endpoint, &beyond, None).expect("run beyond capacity");
    server.stop();
    assert_eq!(
        behind.unissued, 0,
        "the drain timeout let every arrival be sent"
    );
    assert!(behind.achieved_per_second < 0.8 * behind.offered_per_second);
    assert!(
        behind.latency.p99_us > 500_000.0,
        "queueing behind the schedule is counted: p99 {} us",
        behind.latency.p99_us
    );
    assert!(
        behind.service.p99_us * 10.0 < behind.latency.p99_us,
        "from sending ({} us) the queueing is hidden; from intended arrival ({} us) it is not",
        behind.service.p99_us,
        behind.latency.p99_us
    );
}
