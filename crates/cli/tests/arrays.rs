//! Array pools end to end: `lamina pool create --flash f0,...,f5 --redundancy
//! raid6`, the daemon serving them to real clients (fio with verification,
//! `nbdcopy`), two devices overwritten with random bytes while it runs (reads
//! stay correct: rebuilt from parity and repaired), restarts with two devices
//! missing (degraded), with three (a clear refusal naming them) and with the
//! third back; `pool scrub`, `pool status --json` and `/metrics` per device;
//! and the bad device lists `pool create` refuses.

#![allow(clippy::cast_possible_truncation)]

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

use common::{
    ArrayMembers, Daemon, Setup, assert_volume_reads, create_array_pool, lamina, lamina_error,
    lamina_ok, run,
};
use rand::{Rng, SeedableRng};

const MEMBER_COUNT: usize = 6;
const MEMBER_SIZE: &str = "96M";
const VOLUME_BYTES: usize = 32 << 20;
/// No TCP; no memory cache, so that reads reach the devices.
/// No automatic rebuild onto the devices left: the third loss below must
/// meet segments still striped over all six (`distributed_spare` in
/// rebuild.rs covers the rebuild).
const CONFIG: &str = "[server]\ntcp_address = \"\"\n[limits]\nmemory_cache_bytes = 0\nflush_interval_ms = 200\nrebuild_automatic = false\n";

impl Setup {
    fn member(&self, index: usize) -> PathBuf {
        self.root.join(format!("f{index}.img"))
    }
}

/// Destroys a device's contents under the running daemon.
fn overwrite_with_random_bytes(path: &Path, seed: u64) {
    common::overwrite_with_random_bytes_from(path, 0, seed);
}

fn layout_state(status: &serde_json::Value) -> String {
    status["layout"]["state"].as_str().unwrap().to_string()
}

fn device_states(status: &serde_json::Value) -> Vec<String> {
    status["layout"]["tiers"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|device| device["state"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_raid6_pool_serves_through_two_lost_devices_and_refuses_three() {
    let setup = Setup::new();
    let data_dir = &setup.data_dir;
    let members = ArrayMembers::new(
        (0..MEMBER_COUNT).map(|index| setup.member(index)),
        MEMBER_SIZE,
    );
    let created = create_array_pool(data_dir, "raid6", &members, &[]);
    assert_eq!(layout_state(&created), "online");
    assert_eq!(device_states(&created), vec!["online"; MEMBER_COUNT]);
    lamina_ok(data_dir, &["volume", "create", "v", "32M"]);
    lamina_ok(data_dir, &["volume", "create", "scratch", "32M"]);

    let daemon = Daemon::start_on_pool(data_dir, CONFIG, "v");
    // fio with verification on its own volume, then known data on `v`.
    let fio = run(Command::new("fio").args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={}", daemon.uri("scratch")),
        "--rw=randwrite",
        "--bs=4k",
        "--size=8M",
        "--offset_increment=8M",
        "--numjobs=2",
        "--iodepth=16",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_state_save=0",
    ]));
    assert!(!fio.contains("verify:") || !fio.contains("bad"), "{fio}");
    let mut expected = vec![0_u8; VOLUME_BYTES];
    rand::rngs::SmallRng::seed_from_u64(1).fill(&mut expected[..]);
    let source = setup.root.join("source.img");
    std::fs::write(&source, &expected).unwrap();
    run(Command::new("nbdcopy").arg(&source).arg(daemon.uri("v")));
    let reads_before: u64 = device_reads(&lamina_ok(data_dir, &["pool", "status"]));
    assert_volume_reads(&daemon, &setup.root, &expected, "healthy");

    // Two devices overwritten with random bytes under the running daemon:
    // every block they held fails its checksum and is rebuilt from parity.
    overwrite_with_random_bytes(&setup.member(1), 11);
    overwrite_with_random_bytes(&setup.member(4), 14);
    assert_volume_reads(&daemon, &setup.root, &expected, "two devices overwritten");
    let status = lamina_ok(data_dir, &["pool", "status"]);
    let repaired = status["integrity"]["checksum_errors_repaired"]
        .as_u64()
        .unwrap();
    assert!(repaired > 0, "{status}");
    assert!(device_reads(&status) > reads_before);
    assert!(
        daemon
            .metrics()
            .contains("lamina_device_checksum_errors_repaired_total{tier=\"flash\",index=\"1\"")
    );
    // Scrub repairs the rest of the live blocks (fio's volume among them).
    let scrub = lamina_ok(data_dir, &["pool", "scrub", "--wait"]);
    assert_eq!(scrub["state"], "finished", "{scrub}");
    assert_eq!(scrub["blocks_unrepairable"], 0, "{scrub}");
    assert_eq!(scrub["blocks_scrubbed"], scrub["blocks_total"], "{scrub}");
    assert!(daemon.terminate().success());

    // Restart with the two devices gone: degraded, data intact.
    std::fs::remove_file(setup.member(1)).unwrap();
    std::fs::remove_file(setup.member(4)).unwrap();
    let daemon = Daemon::start_on_pool(data_dir, CONFIG, "v");
    assert_volume_reads(&daemon, &setup.root, &expected, "two devices missing");
    let status = lamina_ok(data_dir, &["pool", "status"]);
    assert_eq!(layout_state(&status), "degraded");
    let states = device_states(&status);
    assert_eq!(states[1], "missing");
    assert_eq!(states[4], "missing");
    // Writes go on, degraded.
    rand::rngs::SmallRng::seed_from_u64(2).fill(&mut expected[..4 << 20]);
    std::fs::write(&source, &expected).unwrap();
    run(Command::new("nbdcopy").arg(&source).arg(daemon.uri("v")));
    assert!(daemon.terminate().success());

    // A third device gone: a clear refusal naming what is missing.
    let hidden = setup.root.join("hidden.img");
    std::fs::rename(setup.member(2), &hidden).unwrap();
    let error = lamina_error(data_dir, &["pool", "status"]);
    assert!(error.contains("3 are missing"), "{error}");
    assert!(
        error.contains(&setup.member(2).display().to_string()),
        "{error}"
    );

    // The third device back: serving again, nothing flushed lost.
    std::fs::rename(&hidden, setup.member(2)).unwrap();
    let daemon = Daemon::start_on_pool(data_dir, CONFIG, "v");
    assert_volume_reads(&daemon, &setup.root, &expected, "third device back");
    assert!(daemon.terminate().success());
}

fn device_reads(status: &serde_json::Value) -> u64 {
    status["layout"]["tiers"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|device| device["bytes_read"].as_u64().unwrap())
        .sum()
}

#[test]
fn bad_device_lists_are_refused_with_clear_errors() {
    let setup = Setup::new();
    let data_dir = &setup.data_dir;
    let member = |index: usize| format!("{}:64M", setup.member(index).display());
    // The same device twice.
    let twice = format!(
        "{},{},{},{}",
        member(0),
        member(1),
        member(2),
        setup.member(0).display()
    );
    let error = lamina_error(
        data_dir,
        &["pool", "create", "--flash", &twice, "--redundancy", "raid6"],
    );
    assert!(error.contains("listed twice"), "{error}");
    // Too few devices for the scheme, and several without a scheme.
    let three = format!("{},{},{}", member(0), member(1), member(2));
    let error = lamina_error(
        data_dir,
        &["pool", "create", "--flash", &three, "--redundancy", "raid6"],
    );
    assert!(
        error.contains("raid6 needs at least 4 devices, 3 given"),
        "{error}"
    );
    let error = lamina_error(data_dir, &["pool", "create", "--flash", &three]);
    assert!(error.contains("--redundancy"), "{error}");
    // A device too small.
    let small = format!(
        "{},{},{},{}:1M",
        member(0),
        member(1),
        member(2),
        setup.member(3).display()
    );
    let error = lamina_error(
        data_dir,
        &["pool", "create", "--flash", &small, "--redundancy", "raid6"],
    );
    assert!(error.contains("too small"), "{error}");
    for index in 0..4 {
        assert!(
            !setup.member(index).exists(),
            "files created by a refused create are removed"
        );
    }
    // Mixed sizes: used up to the smallest (warned), and the pool works.
    let mixed = format!(
        "{},{},{}:80M,{}",
        member(0),
        member(1),
        setup.member(2).display(),
        member(3)
    );
    let created = lamina_ok(
        data_dir,
        &["pool", "create", "--flash", &mixed, "--redundancy", "raid5"],
    );
    assert_eq!(layout_state(&created), "online");
    // A device of another pool joined to this one's list.
    let other_data = setup.root.join("other");
    let other_members = ["g0.img", "g1.img", "g2.img"]
        .map(|name| format!("{}:64M", setup.root.join(name).display()))
        .join(",");
    lamina_ok(
        &other_data,
        &[
            "pool",
            "create",
            "--flash",
            &other_members,
            "--redundancy",
            "raid5",
        ],
    );
    let description = std::fs::read_to_string(data_dir.join("pool.toml")).unwrap();
    let foreign = description.replace(
        &setup.member(3).display().to_string(),
        &setup.root.join("g0.img").display().to_string(),
    );
    std::fs::write(data_dir.join("pool.toml"), foreign).unwrap();
    let output = lamina(data_dir, &["pool", "status"]);
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        error.contains("belongs to another pool") && error.contains("g0.img"),
        "{error}"
    );
}
