//! Array devices that shrink under the daemon, and a replacement rebuild
//! killed again and again (issue 42, items 9 and 8), with real clients:
//! a raid6 (or raid5) pool on file devices filled through nbdcopy, one
//! file truncated while the daemon serves, then a restart: the pool opens
//! degraded with the short device faulted and named with its size, in the
//! daemon's log and in `pool status`, and every byte reads back exact; three
//! short devices of raid6 are refused, each named. And `device replace`
//! under `kill -9` five times: each restart resumes past the row the
//! previous one resumed at, within about a second's work of where the
//! rebuild was killed, the progress total stays the real total, and the
//! rebuild ends with every byte exact.

#![allow(clippy::cast_possible_truncation)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::{
    ArrayMembers, Daemon, Setup, assert_volume_reads, create_array_pool, lamina_error, lamina_ok,
    run,
};
use rand::{Rng, SeedableRng};

const MEMBER_SIZE: &str = "64M";
const VOLUME_BYTES: usize = 40 << 20;
/// What `truncate` leaves of a device.
const SHORT_BYTES: u64 = 16 << 20;
/// No TCP; no memory cache, so that reads reach the devices; no automatic
/// rebuild onto the devices left.
const CONFIG: &str = "[server]\ntcp_address = \"\"\n[limits]\nmemory_cache_bytes = 0\nflush_interval_ms = 200\nrebuild_automatic = false\n";
/// How long a test waits for a rebuild, at most.
const REBUILD_WAIT_MS_MAX: u64 = 120_000;
/// Restarts of the killed rebuild.
const KILLS: usize = 5;

fn member(root: &Path, index: usize) -> PathBuf {
    root.join(format!("f{index}.img"))
}

fn canonical(path: &Path) -> String {
    std::fs::canonicalize(path).unwrap().display().to_string()
}

/// A pool of `count` file devices with `redundancy` and a volume `v` full of
/// random bytes from `seed` (nbdcopy, flushed), served by a daemon.
fn pool_with_data(setup: &Setup, redundancy: &str, count: usize, seed: u64) -> (Daemon, Vec<u8>) {
    let members = ArrayMembers::new(
        (0..count).map(|index| member(&setup.root, index)),
        MEMBER_SIZE,
    );
    create_array_pool(&setup.data_dir, redundancy, &members, &[]);
    lamina_ok(&setup.data_dir, &["volume", "create", "v", "40M"]);
    let daemon = Daemon::start_on_pool(&setup.data_dir, CONFIG, "v");
    let mut expected = vec![0_u8; VOLUME_BYTES];
    rand::rngs::SmallRng::seed_from_u64(seed).fill(&mut expected[..]);
    let source = setup.root.join("source.img");
    std::fs::write(&source, &expected).unwrap();
    run(Command::new("nbdcopy")
        .arg("--flush")
        .arg(&source)
        .arg(daemon.uri("v")));
    (daemon, expected)
}

fn truncate(path: &Path) {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.set_len(SHORT_BYTES).unwrap();
}

fn devices(status: &serde_json::Value) -> Vec<serde_json::Value> {
    status["layout"]["tiers"][0]["devices"]
        .as_array()
        .unwrap()
        .clone()
}

/// The size of a truncated device once the daemon let go of it (writes and
/// repairs past its end after the truncation may have lengthened it again,
/// short of the whole), and the words that name it.
fn short_size(path: &Path) -> String {
    let size = std::fs::metadata(path).unwrap().len();
    assert!(size < 64 << 20, "{} is {size} bytes", path.display());
    format!("too small: {size} bytes, at least")
}

/// One device truncated under the daemon, then a restart: degraded, the
/// short device faulted and named with its size, every byte exact. (Read
/// while short, the device may fail a read past its end and be faulted
/// then, and is left out as stale at the restart: no reads here.)
fn one_short_device(redundancy: &str, count: usize, short: usize) {
    let setup = Setup::new();
    let (daemon, expected) = pool_with_data(&setup, redundancy, count, count as u64);
    let short_path = member(&setup.root, short);
    truncate(&short_path);
    assert!(daemon.terminate().success());
    let sizes = short_size(&short_path);

    let daemon = Daemon::start_on_pool(&setup.data_dir, CONFIG, "v");
    assert_volume_reads(&daemon, &setup.root, &expected, "one device short");
    let status = lamina_ok(&setup.data_dir, &["pool", "status"]);
    assert_eq!(status["layout"]["state"], "degraded", "{status}");
    let device = &devices(&status)[short];
    assert_eq!(device["state"], "faulted", "{status}");
    assert_eq!(device["path"], canonical(&short_path), "{status}");
    let unfit = device["unfit"].as_str().unwrap_or_default();
    assert!(unfit.contains(&sizes), "{status}");
    let log = std::fs::read_to_string(setup.data_dir.with_extension("log")).unwrap();
    assert!(
        log.lines()
            .any(|line| line.contains("left out") && line.contains(&sizes)),
        "the warning names the device with its size: {log}"
    );
    let text = Command::new(common::LAMINA)
        .args(["pool", "status", "--data"])
        .arg(&setup.data_dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains(&sizes), "{text}");
    assert!(daemon.terminate().success());
}

#[test]
fn one_truncated_device_of_raid6_or_raid5_is_faulted_and_the_pool_serves_degraded() {
    one_short_device("raid6", 6, 2);
    one_short_device("raid5", 4, 1);
}

#[test]
fn three_truncated_devices_of_raid6_are_refused_each_named() {
    let setup = Setup::new();
    let (daemon, _expected) = pool_with_data(&setup, "raid6", 6, 7);
    let short = [0, 3, 5];
    for index in short {
        truncate(&member(&setup.root, index));
    }
    assert!(daemon.terminate().success());
    let error = lamina_error(&setup.data_dir, &["pool", "status"]);
    assert!(error.contains("3 are missing"), "{error}");
    for index in short {
        let path = member(&setup.root, index);
        let named = format!("{} is {}", canonical(&path), short_size(&path));
        assert!(error.contains(&named), "{error}");
    }
}

/// The rebuild's pace: slow enough that a kill lands mid-rebuild, every
/// 4 KiB row of it.
const REBUILD_BYTES_PER_SECOND: u64 = 4 << 20;
/// How far each run gets past the previous one's kill before its own.
const RUN_ADVANCE_BYTES: u64 = 6 << 20;
/// The array's record interval (`REBUILD_PERSIST_INTERVAL_MS`, one second)
/// and how long `pool status` polls may lag behind a run.
const PERSIST_INTERVAL_MS: u64 = 1_000;
const POLL_INTERVAL_MS: u64 = 100;
/// Data blocks of a row of six raid6 devices, in bytes; and the flash
/// metadata area rebuilt first (`DATA_START_BLOCK` blocks).
const ROW_DATA_BYTES: u64 = 4 * 4096;
const METADATA_BYTES: u64 = 1024 * 4096;
/// The engine's rebuild step (`REBUILD_STEP_BYTES_MAX`).
const STEP_BYTES: u64 = 1 << 20;

fn slow_rebuild_config() -> String {
    format!(
        "{CONFIG}background_bytes_per_second_min = {}\nbackground_bytes_per_second_max = {REBUILD_BYTES_PER_SECOND}\n",
        1 << 20
    )
}

/// Polls `pool status` until the rebuild has passed `bytes` (or ended);
/// returns the status then.
fn rebuild_past(data_dir: &Path, bytes: u64) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let status = lamina_ok(data_dir, &["pool", "status"]);
        let replacing = devices(&status)
            .iter()
            .any(|device| device.get("replacement").is_some());
        let done = status["rebuild"]["bytes_done"].as_u64().unwrap_or(0);
        let running = status["rebuild"]["state"] == "rebuilding";
        if done >= bytes || (!running && !replacing) {
            return status;
        }
        assert!(
            started.elapsed() < Duration::from_millis(REBUILD_WAIT_MS_MAX),
            "the rebuild does not get past {bytes} bytes: {status}"
        );
        std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS));
    }
}

/// `line` without its terminal colour codes (`ESC [ ... m`).
fn without_colours(line: &str) -> String {
    let mut plain = String::new();
    let mut in_code = false;
    for character in line.chars() {
        match (in_code, character) {
            (false, '\u{1b}') => in_code = true,
            (false, _) => plain.push(character),
            (true, 'm') => in_code = false,
            (true, _) => {}
        }
    }
    plain
}

/// The rows the last "resuming the rebuild" line of the daemon's log names.
fn resumed_rows(data_dir: &Path) -> u64 {
    let log = std::fs::read_to_string(data_dir.with_extension("log")).unwrap();
    let log = without_colours(&log);
    let line = log
        .lines()
        .rev()
        .find(|line| line.contains("resuming the rebuild of a replacement"))
        .unwrap_or_else(|| panic!("no resumed rebuild in the log: {log}"));
    let (_, after) = line
        .split_once("rows_done=")
        .unwrap_or_else(|| panic!("no rows_done in {line}"));
    after
        .split(|character: char| !character.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// `kill -9` of the daemon during `device replace`, five times: each
/// restart resumes from a row later than the last, within a second's work
/// (and a step) of where the rebuild was when killed; the progress total
/// stays the same; at the end, the new device carries its weight.
#[test]
fn a_replacement_killed_five_times_resumes_where_it_was_each_time() {
    let setup = Setup::new();
    let (root, data_dir) = (&setup.root, &setup.data_dir);
    let (daemon, expected) = pool_with_data(&setup, "raid6", 6, 11);
    assert!(daemon.terminate().success());
    let config = slow_rebuild_config();
    let mut daemon = Daemon::start_on_pool(data_dir, &config, "v");
    let old = member(root, 1).display().to_string();
    let new = format!("{}:{MEMBER_SIZE}", root.join("new1.img").display());
    lamina_ok(data_dir, &["device", "replace", &old, &new]);
    // A second's work at the pace, the poll's lag and the step under way,
    // in rows: what a kill may cost.
    let redone_bytes_max =
        REBUILD_BYTES_PER_SECOND * (PERSIST_INTERVAL_MS + POLL_INTERVAL_MS) / 1000 + STEP_BYTES;
    let redone_rows_max = redone_bytes_max / ROW_DATA_BYTES;
    let mut killed_at = 0;
    let mut resumed_before = 0;
    let mut totals = Vec::new();
    for kill in 0..KILLS {
        let status = rebuild_past(data_dir, killed_at + RUN_ADVANCE_BYTES);
        assert_eq!(
            status["rebuild"]["state"], "rebuilding",
            "kill {kill}: {status}"
        );
        killed_at = status["rebuild"]["bytes_done"].as_u64().unwrap();
        totals.push(status["rebuild"]["bytes_total"].as_u64().unwrap());
        daemon.kill_hard();
        daemon = Daemon::start_on_pool(data_dir, &config, "v");
        let resumed = resumed_rows(data_dir);
        // Rows below the kill: the bytes passed, less the metadata (a lower
        // bound: free segments passed over count no bytes, but rows).
        let rows_at_kill = killed_at.saturating_sub(METADATA_BYTES) / ROW_DATA_BYTES;
        eprintln!(
            "kill {kill}: {killed_at} bytes done (row {rows_at_kill} or later), resumed at row {resumed}"
        );
        assert!(
            resumed > resumed_before,
            "kill {kill}: resumed at row {resumed}, the previous restart at {resumed_before}"
        );
        assert!(
            resumed + redone_rows_max >= rows_at_kill,
            "kill {kill}: resumed at row {resumed}, killed at row {rows_at_kill} or later"
        );
        resumed_before = resumed;
    }
    let status = rebuild_past(data_dir, u64::MAX);
    assert_eq!(status["rebuild"]["state"], "finished", "{status}");
    totals.push(status["rebuild"]["bytes_total"].as_u64().unwrap());
    assert!(
        totals.iter().all(|total| *total == totals[0]),
        "the progress total stays the real total: {totals:?}"
    );
    let listed = devices(&lamina_ok(data_dir, &["pool", "status"]));
    assert_eq!(listed[1]["path"], canonical(&root.join("new1.img")));
    assert_eq!(listed[1]["state"], "online");
    for lost in [0, 4] {
        let path = member(root, lost).display().to_string();
        lamina_ok(data_dir, &["device", "fail", &path]);
    }
    assert_volume_reads(&daemon, root, &expected, "two others out after the rebuild");
    assert!(daemon.terminate().success());
}
