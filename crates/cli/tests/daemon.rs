//! The daemon end to end with real clients: `lamina serve` on a fresh data
//! directory, `nbdinfo`, `qemu-img`, `nbdcopy`, `fio --ioengine=nbd` with
//! verification, the volume commands against the running daemon (and their
//! errors; a volume deleted under its client), clean shutdown on SIGTERM, and
//! process crashes: `kill -9` at random moments while a client writes and
//! flushes, then a check that every write acknowledged before a completed flush
//! is intact; and stalled handshakes against the `[server]` handshake limits,
//! with their `/metrics` counters.

// Test code keeps `as` for small sizes and byte patterns (issue 17 converts
// the library and binaries only).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::process::{Command, Stdio};
use std::time::Duration;

mod common;

use common::{Daemon, POLL_INTERVAL_MS, lamina, run};

#[test]
fn daemon_serves_real_clients_and_volume_commands() {
    let directory = tempfile::tempdir().unwrap();
    let data_dir = directory.path().join("data");
    let daemon = Daemon::start(&data_dir);
    let uri = daemon.uri("default");

    let list = run(Command::new("nbdinfo").arg("--list").arg(&uri));
    assert!(list.contains("export=\"default\""), "{list}");
    let map = run(Command::new("nbdinfo").arg("--map").arg(&uri));
    assert!(
        map.contains("hole,zero") && !map.contains("data"),
        "fresh volume is one hole: {map}"
    );

    // qemu-img convert and compare of 32 MiB of random data.
    let source = directory.path().join("source.img");
    let random: Vec<u8> = (0..32u32 << 20)
        .map(|index| (index.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&source, &random).unwrap();
    run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&source)
        .arg(&uri));
    run(Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&source)
        .arg(&uri));
    let map = run(Command::new("nbdinfo").arg("--map").arg(&uri));
    assert!(map.contains("data"), "written range is allocated: {map}");
    // qemu-io: an unaligned write and read back.
    let io = run(Command::new("qemu-io")
        .args([
            "-f",
            "raw",
            "-c",
            "write -P 0xab 1000 5000",
            "-c",
            "read -P 0xab 1000 5000",
        ])
        .arg(&uri));
    assert!(!io.contains("Pattern verification failed"), "{io}");

    // nbdcopy round trip, checked by content.
    let copy = directory.path().join("copy.img");
    run(Command::new("nbdcopy").arg(&uri).arg(&copy));
    let copied = std::fs::read(&copy).unwrap();
    assert_eq!(copied.len(), 256 << 20);
    let mut expected = random.clone();
    expected[1000..6000].fill(0xab);
    assert!(
        copied[..32 << 20] == expected[..],
        "nbdcopy read back what was written"
    );
    assert!(copied[32 << 20..].iter().all(|byte| *byte == 0));

    // fio with verification on several connections at once, on its own volume.
    let scratch = lamina(&data_dir, &["volume", "create", "scratch", "--size", "64M"]);
    assert!(scratch.status.success(), "{scratch:?}");
    let fio = run(Command::new("fio").args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={}", daemon.uri("scratch")),
        "--rw=randwrite",
        "--bs=4k",
        "--size=16M",
        "--offset_increment=16M",
        "--numjobs=4",
        "--iodepth=16",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_state_save=0",
    ]));
    assert!(!fio.contains("verify:") || !fio.contains("bad"), "{fio}");

    // Volume commands against the running daemon.
    let created = lamina(
        &data_dir,
        &["volume", "create", "db", "--size", "64M", "--json"],
    );
    assert!(created.status.success(), "{created:?}");
    let duplicate = lamina(&data_dir, &["volume", "create", "db", "--size", "64M"]);
    assert!(
        !duplicate.status.success()
            && String::from_utf8_lossy(&duplicate.stderr).contains("already exists")
    );
    let invalid = lamina(
        &data_dir,
        &["volume", "create", "bad/name", "--size", "64M"],
    );
    assert!(
        !invalid.status.success()
            && String::from_utf8_lossy(&invalid.stderr).contains("allowed characters")
    );
    // The daemon's answer carries the refusal's kind; the CLI adds the flag.
    let shrink = lamina(&data_dir, &["volume", "resize", "db", "--size", "32M"]);
    let shrink_error = String::from_utf8_lossy(&shrink.stderr);
    assert!(
        !shrink.status.success()
            && shrink_error.contains("the resize must be forced (pass --force to shrink it)")
            && shrink_error.matches("--force").count() == 1,
        "{shrink_error}"
    );
    assert!(
        lamina(&data_dir, &["volume", "resize", "db", "--size", "128M"])
            .status
            .success()
    );
    assert!(
        lamina(&data_dir, &["volume", "rename", "db", "database"])
            .status
            .success()
    );
    let listed = lamina(&data_dir, &["volume", "list", "--json"]);
    let volumes: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let names: Vec<&str> = volumes
        .as_array()
        .unwrap()
        .iter()
        .map(|volume| volume["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["default", "scratch", "database"]);
    assert_eq!(volumes[2]["size_bytes"], 128 << 20);
    let export_list = run(Command::new("nbdinfo").arg("--list").arg(&uri));
    assert!(export_list.contains("export=\"database\""), "{export_list}");
    assert!(
        lamina(&data_dir, &["volume", "delete", "database"])
            .status
            .success()
    );
    let missing = lamina(&data_dir, &["volume", "delete", "database"]);
    assert!(
        !missing.status.success()
            && String::from_utf8_lossy(&missing.stderr).contains("no such volume")
    );

    // Clean shutdown, then the data is still there after a restart.
    let status = daemon.terminate();
    assert!(status.success(), "SIGTERM exits 0: {status:?}");
    assert!(!data_dir.join("nbd.sock").exists());
    let daemon = Daemon::start(&data_dir);
    run(Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&copy)
        .arg(daemon.uri("default")));
    assert!(daemon.terminate().success());
}

/// The client half of the crash test, run by nbdsh: writes blocks in rounds,
/// flushes after each round, and only then records the round as durable.
const WRITER_SCRIPT: &str = r#"
import os, sys, hashlib
cycle = int(os.environ["CYCLE"]); journal = os.environ["JOURNAL"]
region = cycle * 4 * 1024 * 1024
with open(journal, "a") as log:
    for round in range(1000):
        offsets = []
        for index in range(4):
            slot = round * 4 + index
            if slot >= 1024:
                sys.exit(0)
            offset = region + slot * 4096
            data = hashlib.sha256(b"%d:%d" % (cycle, slot)).digest() * 128
            h.pwrite(data, offset)
            offsets.append(offset)
        h.flush()
        for offset in offsets:
            log.write("%d %d %d\n" % (cycle, (offset - region) // 4096, offset))
        log.flush(); os.fsync(log.fileno())
"#;

const CHECK_SCRIPT: &str = r#"
import os, hashlib
bad = 0; count = 0
for line in open(os.environ["JOURNAL"]):
    cycle, slot, offset = map(int, line.split())
    expected = hashlib.sha256(b"%d:%d" % (cycle, slot)).digest() * 128
    if h.pread(4096, offset) != expected:
        bad += 1
    count += 1
print("checked", count, "bad", bad)
assert bad == 0, "%d flushed writes lost" % bad
"#;

#[test]
fn kill_minus_nine_never_loses_flushed_writes() {
    let cycles: u64 = std::env::var("LAMINA_KILL_CYCLES")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(20);
    let directory = tempfile::tempdir().unwrap();
    let data_dir = directory.path().join("data");
    let journal = directory.path().join("journal");
    std::fs::write(&journal, "").unwrap();
    let writer = directory.path().join("writer.py");
    std::fs::write(&writer, WRITER_SCRIPT).unwrap();
    let checker = directory.path().join("check.py");
    std::fs::write(&checker, CHECK_SCRIPT).unwrap();
    let mut total_checked = 0;
    for cycle in 0..cycles {
        let daemon = Daemon::start(&data_dir);
        let uri = daemon.uri("default");
        let check = run(Command::new("nbdsh")
            .args(["-u", &uri, "-c"])
            .arg(format!("exec(open('{}').read())", checker.display()))
            .env("JOURNAL", &journal));
        total_checked = check
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<usize>()
            .unwrap();
        let mut client = Command::new("/usr/bin/nbdsh")
            .env("PATH", "/usr/bin:/bin")
            .args(["-u", &uri, "-c"])
            .arg(format!("exec(open('{}').read())", writer.display()))
            .env("CYCLE", cycle.to_string())
            .env("JOURNAL", &journal)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // A pseudo-random moment between 50 and 650 ms into the writes.
        std::thread::sleep(Duration::from_millis(50 + (cycle * 7919) % 600));
        daemon.kill_hard();
        let _ = client.wait();
    }
    let daemon = Daemon::start(&data_dir);
    let check = run(Command::new("nbdsh")
        .args(["-u", &daemon.uri("default"), "-c"])
        .arg(format!("exec(open('{}').read())", checker.display()))
        .env("JOURNAL", &journal));
    let final_count: usize = check.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(
        final_count >= total_checked && final_count > 0,
        "some flushed writes were recorded: {check}"
    );
    assert!(daemon.terminate().success());
}

/// One client of the clean-stop test, run by nbdsh: keeps 64 writes of 4 KiB
/// blocks of its own region in flight (so that batches fill and are sealed
/// and written all the time) and records each block once acknowledged. No
/// flush. Every block has its own content.
const UNFLUSHED_WRITER_SCRIPT: &str = r#"
import os, hashlib, nbd
journal = open(os.environ["JOURNAL"], "a"); base = int(os.environ["BASE"])
in_flight = [0]
def acknowledged(offset, error):
    in_flight[0] -= 1
    if error.value == 0:
        journal.write("%d\n" % offset); journal.flush()
    return 1
for slot in range(int(os.environ["COUNT"])):
    while in_flight[0] >= 64:
        h.poll(-1)
    offset = base + slot * 4096
    data = nbd.Buffer.from_bytearray(bytearray(hashlib.sha256(b"%d" % offset).digest() * 128))
    in_flight[0] += 1
    h.aio_pwrite(data, offset, completion=lambda error, offset=offset: acknowledged(offset, error))
while in_flight[0] > 0:
    h.poll(-1)
"#;

const UNFLUSHED_CHECK_SCRIPT: &str = r#"
import os, hashlib
bad = 0; count = 0
for journal in os.environ["JOURNALS"].split(","):
    for line in open(journal):
        offset = int(line)
        if h.pread(4096, offset) != hashlib.sha256(b"%d" % offset).digest() * 128:
            bad += 1
        count += 1
print("checked", count, "bad", bad)
assert bad == 0, "%d acknowledged writes lost by a clean stop" % bad
"#;

/// Clean stops in the clean-stop test; a stop that lands while a batch's write
/// runs on a connection thread is what it looks for, about one in four.
const CLEAN_STOP_CYCLES: u64 = 6;
/// Blocks each client writes per cycle, and acknowledged before the stop.
const CLEAN_STOP_BLOCKS_PER_CYCLE: u64 = 5000;
const CLEAN_STOP_ACKNOWLEDGED_MIN: usize = 1500;

/// Starts one clean-stop client writing `cycle`'s part of `client`'s region.
fn start_unflushed_writer(
    daemon: &Daemon,
    writer: &std::path::Path,
    journal: &std::path::Path,
    client: u64,
    cycle: u64,
) -> std::process::Child {
    let base = client * (128 << 20) + cycle * CLEAN_STOP_BLOCKS_PER_CYCLE * 4096;
    Command::new("/usr/bin/nbdsh")
        .env("PATH", "/usr/bin:/bin")
        .args(["-u", &daemon.uri("default"), "-c"])
        .arg(format!("exec(open('{}').read())", writer.display()))
        .env("JOURNAL", journal)
        .env("BASE", base.to_string())
        .env("COUNT", CLEAN_STOP_BLOCKS_PER_CYCLE.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn a_clean_stop_keeps_every_write_acknowledged_on_every_connection_thread() {
    // Two clients, placed on the daemon's two connection threads, write without
    // flushing, 64 writes in flight each, so that batches are sealed and
    // written on those threads all the time; SIGTERM comes while they write.
    // The daemon must finish the threads' batch writes and flush before it
    // stops them (decision 0048): every acknowledged block reads back after a
    // restart, and every stop ends in time.
    let directory = tempfile::tempdir().unwrap();
    let data_dir = directory.path().join("data");
    let config = "[server]\ntcp_address = \"\"\nconnection_threads = 2\n[pool]\nembedded_size_bytes = 2147483648\ndefault_volume_bytes = 268435456\n[limits]\nflush_interval_ms = 600000\ndirty_bytes_max = 1073741824\n";
    let writer = directory.path().join("writer.py");
    std::fs::write(&writer, UNFLUSHED_WRITER_SCRIPT).unwrap();
    let written = |journal: &std::path::Path| {
        std::fs::read_to_string(journal).map_or(0, |text| text.lines().count())
    };
    let mut journals = Vec::new();
    for cycle in 0..CLEAN_STOP_CYCLES {
        let daemon = Daemon::start_on_pool(&data_dir, config, "default");
        let cycle_journals: Vec<_> = (0..2)
            .map(|client| directory.path().join(format!("journal-{cycle}-{client}")))
            .collect();
        let clients: Vec<_> = (0..2)
            .map(|client| {
                let journal = &cycle_journals[client as usize];
                start_unflushed_writer(&daemon, &writer, journal, client, cycle)
            })
            .collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while cycle_journals
            .iter()
            .any(|journal| written(journal) < CLEAN_STOP_ACKNOWLEDGED_MIN)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "cycle {cycle}: the clients did not write"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            daemon.terminate().success(),
            "cycle {cycle}: SIGTERM exits 0"
        );
        for mut client in clients {
            let _ = client.wait();
        }
        journals.extend(cycle_journals);
    }
    let checker = directory.path().join("check.py");
    std::fs::write(&checker, UNFLUSHED_CHECK_SCRIPT).unwrap();
    let daemon = Daemon::start_on_pool(&data_dir, config, "default");
    let journal_list = journals
        .iter()
        .map(|journal| journal.display().to_string())
        .collect::<Vec<_>>()
        .join(",");
    let check = run(Command::new("nbdsh")
        .args(["-u", &daemon.uri("default"), "-c"])
        .arg(format!("exec(open('{}').read())", checker.display()))
        .env("JOURNALS", journal_list));
    let checked: usize = check.split_whitespace().nth(1).unwrap().parse().unwrap();
    let minimum = CLEAN_STOP_CYCLES as usize * 2 * CLEAN_STOP_ACKNOWLEDGED_MIN;
    assert!(checked >= minimum, "{check}");
    assert!(daemon.terminate().success());
}

/// Fills a thin, over-committed pool through a real client until the daemon
/// answers ENOSPC, and checks that everything written before is intact.
const FILL_SCRIPT: &str = r#"
import errno, hashlib, nbd
chunk = 1024 * 1024
def pattern(index):
    return hashlib.sha256(b"%d" % index).digest() * (chunk // 32)
written = 0
try:
    while written * chunk < h.get_size():
        h.pwrite(pattern(written), written * chunk)
        written += 1
    raise AssertionError("the pool never filled")
except nbd.Error as error:
    assert error.errno == errno.ENOSPC or "ENOSPC" in str(error), "expected ENOSPC, got %s" % error
h.flush()
assert written > 16, written
for index in range(written):
    assert h.pread(chunk, index * chunk) == pattern(index), "chunk %d lost" % index
print("filled", written)
"#;

/// Trims the first half of what `FILL_SCRIPT` wrote (`WRITTEN` chunks), then
/// writes an eighth again and checks both the new and the untouched chunks
/// (about 62% of the space clients can fill is used afterwards).
const TRIM_SCRIPT: &str = r#"
import hashlib, os
chunk = 1024 * 1024
def pattern(index):
    return hashlib.sha256(b"%d" % index).digest() * (chunk // 32)
written = int(os.environ["WRITTEN"])
h.trim((written // 2) * chunk, 0)
h.flush()
for index in range(written // 8):
    h.pwrite(pattern(index + 1000), index * chunk)
h.flush()
for index in range(written // 8):
    assert h.pread(chunk, index * chunk) == pattern(index + 1000)
assert h.pread(chunk, (written - 1) * chunk) == pattern(written - 1)
print("rewritten", written // 8)
"#;

/// How long the daemon's background task gets to notice a change in used
/// space (it looks every `flush_interval_ms`, 200 ms in these tests).
const USAGE_NOTICE_TIMEOUT_MS: u64 = 20_000;

/// Waits until `/metrics` shows `lamina_pool_usage_warning_percent` at `percent`.
fn wait_for_usage_warning(daemon: &Daemon, percent: f64) {
    let deadline = std::time::Instant::now() + Duration::from_millis(USAGE_NOTICE_TIMEOUT_MS);
    while daemon.gauge("lamina_pool_usage_warning_percent") != Some(percent) {
        assert!(
            std::time::Instant::now() < deadline,
            "the usage warning never became {percent}%: {:?}",
            daemon.gauge("lamina_pool_usage_warning_percent")
        );
        std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS * 5));
    }
}

#[test]
fn a_full_pool_answers_enospc_and_recovers_after_trim() {
    let directory = tempfile::tempdir().unwrap();
    let data_dir = directory.path().join("data");
    // A 132 MiB pool behind a 512 MiB volume: thin over-commit. A segment
    // the cleaner relocated from before the trim killed the rest of it is
    // reusable only after a checkpoint records the relocations
    // (`State::dead_segment_reusable`), and checkpoints come every
    // `checkpoint_interval_ms` (30 s by default, beyond the wait below):
    // when the full pool made the cleaner relocate first (a loaded machine),
    // the warning stayed at 80 % past the wait. Checkpoints every 2 s keep
    // the wait above two of them.
    let daemon = Daemon::start_with_config(
        &data_dir,
        132 << 20,
        512 << 20,
        "checkpoint_interval_ms = 2000\n",
    );
    let script = directory.path().join("fill.py");
    std::fs::write(&script, FILL_SCRIPT).unwrap();
    let output = run(Command::new("nbdsh")
        .args(["-u", &daemon.uri("default"), "-c"])
        .arg(format!("exec(open('{}').read())", script.display())));
    let written: u64 = output
        .split_whitespace()
        .skip_while(|word| *word != "filled")
        .nth(1)
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("the fill did not finish: {output}"));
    // Full: status says so, and the highest warning is in the log and metrics.
    let status = lamina(&data_dir, &["pool", "status", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert!(
        status["failed"].is_null(),
        "the pool did not fail: {status}"
    );
    assert_eq!(status["free_bytes"], 0, "{status}");
    assert_eq!(status["used_percent"], 100.0, "{status}");
    assert_eq!(status["usage_warning_percent"], 90, "{status}");
    assert_eq!(status["cleaner_state"], "short", "{status}");
    let text = lamina(&data_dir, &["pool", "status"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("100.0% of what clients can fill (warning: above 90%"),
        "{text}"
    );
    wait_for_usage_warning(&daemon, 90.0);
    // The gauge is computed when read; the log line comes from the background
    // task's next round, so it may follow a moment later.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let log = daemon.log();
        let warned = log.lines().any(|line| {
            line.contains("pool space is running low") && line.contains("threshold_percent=90")
        });
        if warned {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no warning in the log at 90%: {log}"
        );
        std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS * 5));
    }
    // Trimming frees space: the warning is lifted and writes succeed again.
    let script = directory.path().join("trim.py");
    std::fs::write(&script, TRIM_SCRIPT).unwrap();
    let output = run(Command::new("nbdsh")
        .args(["-u", &daemon.uri("default"), "-c"])
        .arg(format!("exec(open('{}').read())", script.display()))
        .env("WRITTEN", written.to_string()));
    assert!(output.contains("rewritten"), "{output}");
    wait_for_usage_warning(&daemon, 0.0);
    let used_percent = daemon.gauge("lamina_pool_used_percent").unwrap();
    assert!(used_percent < 80.0, "{used_percent}% used after the trim");
    assert!(
        daemon.terminate().success(),
        "the daemon stayed up and stops cleanly"
    );
}

/// The value of the `/metrics` series `series` (name and labels as printed).
fn metric_value(daemon: &Daemon, series: &str) -> Option<f64> {
    daemon.metrics().lines().find_map(|line| {
        line.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
    })
}

#[test]
fn stalled_handshakes_are_limited_per_uid_timed_out_and_counted_in_metrics() {
    let directory = tempfile::tempdir().unwrap();
    let data_dir = directory.path().join("data");
    let config = format!(
        "[server]\ntcp_address = \"\"\nconnection_threads = 2\nhandshakes_in_progress_max = 8\nhandshakes_per_peer_max = 2\nhandshake_timeout_ms = 500\n[pool]\nembedded_size_bytes = {}\ndefault_volume_bytes = {}\n",
        2u64 << 30,
        256u64 << 20
    );
    let daemon = Daemon::start_on_pool(&data_dir, &config, "default");
    // Forty connections of this test's uid that never send a byte: the uid
    // keeps two handshakes, each new one closes its oldest.
    let stalled: Vec<std::os::unix::net::UnixStream> = (0..40)
        .map(|_| std::os::unix::net::UnixStream::connect(data_dir.join("nbd.sock")).unwrap())
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while metric_value(
        &daemon,
        "lamina_nbd_handshakes_closed_total{reason=\"peer_limit\"}",
    )
    .unwrap_or(0.0)
        < 38.0
    {
        assert!(std::time::Instant::now() < deadline, "{}", daemon.metrics());
        std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS * 5));
    }
    // The handshakes left are counted on the connection threads that serve
    // them (in one reading of /metrics).
    loop {
        let metrics = daemon.metrics();
        let value = |series: &str| {
            metrics.lines().find_map(|line| {
                line.strip_prefix(series)
                    .and_then(|rest| rest.strip_prefix(' '))
                    .and_then(|value| value.trim().parse::<f64>().ok())
            })
        };
        let on_threads: Vec<f64> = (0..2)
            .filter_map(|thread| {
                value(&format!(
                    "lamina_nbd_thread_connections{{thread=\"{thread}\"}}"
                ))
            })
            .collect();
        let in_progress = value("lamina_nbd_handshakes_in_progress");
        if on_threads.len() == 2 && Some(on_threads.iter().sum()) == in_progress {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{metrics}");
        std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS));
    }
    let size = run(Command::new("nbdinfo")
        .arg("--size")
        .arg(daemon.uri("default")));
    assert_eq!(size.trim(), (256u64 << 20).to_string());
    // The ones left time out, and every slot is free again.
    while metric_value(
        &daemon,
        "lamina_nbd_handshakes_closed_total{reason=\"timeout\"}",
    )
    .unwrap_or(0.0)
        < 1.0
        || metric_value(&daemon, "lamina_nbd_handshakes_in_progress") != Some(0.0)
    {
        assert!(std::time::Instant::now() < deadline, "{}", daemon.metrics());
        std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS * 5));
    }
    assert_eq!(
        metric_value(&daemon, "lamina_nbd_connections_refused_total"),
        Some(0.0)
    );
    for thread in 0..2 {
        let series = format!("lamina_nbd_thread_connections{{thread=\"{thread}\"}}");
        while metric_value(&daemon, &series) != Some(0.0) {
            assert!(std::time::Instant::now() < deadline, "{}", daemon.metrics());
            std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS));
        }
    }
    let log = daemon.log();
    assert!(log.contains("handshake limit reached"), "{log}");
    assert!(log.contains("handshake not finished in time"), "{log}");
    // Rate-limited: one warning of each kind for the whole burst.
    assert_eq!(log.matches("handshake limit reached").count(), 1, "{log}");
    drop(stalled);
    assert!(daemon.terminate().success());
}

/// Run by nbdsh on a volume: writes, deletes the volume through the CLI while
/// still connected, then tries to read, write and flush; prints each outcome
/// as `NAME ok` or `NAME errno=N`.
const DELETED_UNDER_CLIENT_SCRIPT: &str = r#"
import os, subprocess
def attempt(name, operation):
    try:
        operation()
        print(name, "ok")
    except nbd.Error as error:
        print(name, "errno=%s" % error.errno)
h.pwrite(b"\x5a" * 65536, 0)
attempt("flush_before", h.flush)
h.pwrite(b"\xa5" * 65536, 65536)
subprocess.run([os.environ["LAMINA"], "volume", "delete", "doomed", "--data", os.environ["DATA"]], check=True)
attempt("read", lambda: h.pread(4096, 0))
attempt("write", lambda: h.pwrite(b"\x01" * 4096, 0))
attempt("flush", h.flush)
"#;

/// A volume deleted while a client is connected: its reads and writes fail,
/// and so must its FLUSH, since the writes it would confirm are gone.
#[test]
fn flush_of_a_volume_deleted_under_its_client_fails() {
    let directory = tempfile::tempdir().unwrap();
    let data_dir = directory.path().join("data");
    let daemon = Daemon::start(&data_dir);
    let created = lamina(&data_dir, &["volume", "create", "doomed", "--size", "64M"]);
    assert!(created.status.success(), "{created:?}");
    let script = directory.path().join("deleted.py");
    std::fs::write(&script, DELETED_UNDER_CLIENT_SCRIPT).unwrap();
    let output = run(Command::new("nbdsh")
        .args(["-u", &daemon.uri("doomed"), "-c"])
        .arg(format!("exec(open('{}').read())", script.display()))
        .env("LAMINA", common::LAMINA)
        .env("LAMINA_LOG", "warn")
        .env("DATA", &data_dir));
    let outcome = |name: &str| {
        output
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no outcome for {name}: {output}"))
            .to_string()
    };
    assert_eq!(outcome("flush_before"), "ok", "{output}");
    // ESHUTDOWN: the export is gone, as for reads and writes.
    assert_eq!(outcome("read"), "errno=ESHUTDOWN", "{output}");
    assert_eq!(outcome("write"), "errno=ESHUTDOWN", "{output}");
    assert_eq!(outcome("flush"), "errno=ESHUTDOWN", "{output}");
    assert!(daemon.terminate().success());
}

/// A config file with a limit out of range stops `lamina serve` at startup,
/// with the limit, its value and its range, before any pool is created.
#[test]
fn a_config_with_a_limit_out_of_range_is_refused_at_startup() {
    let directory = tempfile::tempdir().unwrap();
    let data_dir = directory.path().join("data");
    let config_path = directory.path().join("lamina.toml");
    std::fs::write(
        &config_path,
        "[server]\ntcp_address = \"\"\n[limits]\nflush_interval_ms = 0\n",
    )
    .unwrap();
    let mut child = Command::new(common::LAMINA)
        .args(["serve", "--data"])
        .arg(&data_dir)
        .arg("--config")
        .arg(&config_path)
        .env("LAMINA_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start lamina serve");
    let status = common::wait_with_timeout(&mut child, common::EXIT_TIMEOUT_MS);
    if status.is_none() {
        child.kill().unwrap();
        child.wait().unwrap();
        panic!("lamina serve started with flush_interval_ms = 0");
    }
    let output = child.wait_with_output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("[limits] flush_interval_ms must be at least 1 (got 0)"),
        "{stderr}"
    );
    assert!(!data_dir.join("pool.toml").exists(), "a pool was created");
}
