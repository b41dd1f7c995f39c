//! The memory cache warmed after a daemon restart (issue 20, decision 0025),
//! end to end: nbdsh writes a volume and reads a hot set, the daemon stops
//! cleanly (SIGTERM) and records the cache's contents in the data directory,
//! starts again, loads them in the background (`pool status --json` shows
//! the warm-up), and nbdsh's reads of the hot set are then cache hits that
//! return the data written.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Daemon, POLL_INTERVAL_MS, lamina_ok, run};

const BLOCK_BYTES: u64 = 4096;
/// Written through NBD.
const WRITTEN_BLOCKS: u64 = 4096;
/// Holds every block written: batches complete in any order, so a smaller
/// cache would keep a varying part of the last blocks written.
const CACHE_BYTES: u64 = 32 << 20;
/// The hot set: the last blocks written, read again before the restart.
const HOT_BLOCKS: u64 = 1024;
const WARMUP_WAIT_MS_MAX: u64 = 30_000;

/// Writes `WRITTEN_BLOCKS` blocks, each filled with its index, and flushes.
const WRITER_SCRIPT: &str = r#"
import os, struct
count = int(os.environ["BLOCKS"])
for index in range(count):
    h.pwrite(struct.pack("<Q", index) * 512, index * 4096)
h.flush()
"#;

/// Reads blocks `FIRST..FIRST + COUNT` and checks each holds its index.
const READER_SCRIPT: &str = r#"
import os, struct
first = int(os.environ["FIRST"]); count = int(os.environ["COUNT"])
for index in range(first, first + count):
    data = h.pread(4096, index * 4096)
    assert data == struct.pack("<Q", index) * 512, "block %d is wrong" % index
print("checked", count)
"#;

fn nbdsh(daemon: &Daemon, script: &str, environment: &[(&str, String)]) -> String {
    let mut command = Command::new("nbdsh");
    command
        .args(["-u", &daemon.uri("default"), "-c", script])
        .envs(
            environment
                .iter()
                .map(|(name, value)| (*name, value.as_str())),
        );
    run(&mut command)
}

fn read_hot_set(daemon: &Daemon) {
    let output = nbdsh(
        daemon,
        READER_SCRIPT,
        &[
            ("FIRST", (WRITTEN_BLOCKS - HOT_BLOCKS).to_string()),
            ("COUNT", HOT_BLOCKS.to_string()),
        ],
    );
    assert_eq!(output.trim(), format!("checked {HOT_BLOCKS}"));
}

fn status(daemon: &Daemon) -> serde_json::Value {
    lamina_ok(&daemon.data_dir, &["pool", "status"])
}

fn start(data_dir: &std::path::Path, warm_restart: bool) -> Daemon {
    Daemon::start_with_config(
        data_dir,
        256 << 20,
        WRITTEN_BLOCKS * BLOCK_BYTES,
        &format!(
            "memory_cache_bytes = {CACHE_BYTES}\nmemory_cache_warm_restart = {warm_restart}\n"
        ),
    )
}

#[test]
fn a_restarted_daemon_serves_the_hot_set_from_its_warmed_cache() {
    let directory = tempfile::tempdir().unwrap();
    let data_dir = directory.path().join("data");
    let daemon = start(&data_dir, true);
    nbdsh(
        &daemon,
        WRITER_SCRIPT,
        &[("BLOCKS", WRITTEN_BLOCKS.to_string())],
    );
    read_hot_set(&daemon);
    assert!(daemon.terminate().success());
    let record = data_dir.join("cache-contents");
    assert!(
        std::fs::metadata(&record).is_ok_and(|metadata| metadata.len() > 0),
        "a clean stop records the cache's contents"
    );

    // With the setting off, the record is not loaded: the hot set misses.
    let cold = start(&data_dir, false);
    read_hot_set(&cold);
    let cold_status = status(&cold);
    assert_eq!(cold_status["cache_warmup"]["state"], "none");
    assert_eq!(cold_status["memory_cache"]["hits"], 0);
    // SIGKILL: a stop that leaves the record as it was.
    cold.kill_hard();

    let daemon = start(&data_dir, true);
    let started = Instant::now();
    let warmed = loop {
        let current = status(&daemon);
        if current["cache_warmup"]["state"] == "finished" {
            break current;
        }
        assert!(
            started.elapsed() < Duration::from_millis(WARMUP_WAIT_MS_MAX),
            "warm-up did not finish: {}",
            current["cache_warmup"]
        );
        std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS));
    };
    let warmup = &warmed["cache_warmup"];
    let loaded = warmup["blocks_loaded"].as_u64().unwrap();
    assert!(loaded >= HOT_BLOCKS, "the hot set was loaded: {warmup}");
    assert_eq!(
        warmup["blocks_loaded"].as_u64().unwrap() + warmup["blocks_skipped"].as_u64().unwrap(),
        warmup["blocks_to_load"].as_u64().unwrap()
    );
    let hits_before = warmed["memory_cache"]["hits"].as_u64().unwrap();
    read_hot_set(&daemon);
    let hits = status(&daemon)["memory_cache"]["hits"].as_u64().unwrap() - hits_before;
    assert!(
        hits >= HOT_BLOCKS,
        "{hits} of the hot set's {HOT_BLOCKS} reads were cache hits"
    );
    let text = common::lamina(&data_dir, &["pool", "status"]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("cache warm-up        finished"),
        "{}",
        String::from_utf8_lossy(&text.stdout)
    );
    assert!(daemon.terminate().success());
}
