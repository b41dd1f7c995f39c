//! Scrub proves every column (issue 42): an operator's four steps on array
//! pools served by the real daemon. A volume is filled with random data
//! through NBD and flushed; random bytes are written over devices under the
//! running daemon past their labels (so into the mirrored metadata copies,
//! data columns and parity columns alike); `pool scrub --wait` reports
//! nothing unrepairable; the daemon is stopped and as many *other* devices
//! are taken away as the redundancy covers; the pool opens degraded and
//! `nbdcopy` reads every byte back exact. Before scrub checked parity and
//! the metadata copies, the last step failed: garbage parity reconstructed
//! garbage data (EIO from the checksums), and a garbage metadata copy left
//! the pool without a superblock. A compressed volume (issue 44, decision
//! 0072) holding an ext4 image of this machine's files goes through the
//! same four steps: rows of packed fragments are mended like any other.

#![allow(clippy::cast_possible_truncation)]

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

use common::{ArrayMembers, Daemon, Setup, create_array_pool, lamina_ok, run};
use rand::{Rng, SeedableRng};

const MEMBER_SIZE: &str = "48M";
const VOLUME_BYTES: usize = 24 << 20;
/// Member blocks before the mirrored prefix of these arrays: the label area
/// (64 blocks) and two copies of a one-block zone table (docs/format.md,
/// "Member layout"). The damage starts there, so that the labels and the
/// zone table survive (scrub does not rewrite them) and everything after
/// them, the metadata copies included, does not.
const DAMAGE_FIRST_MEMBER_BLOCK: u64 = 64 + 2;
/// No TCP; no memory cache, so that reads reach the devices; no automatic
/// rebuild, so that the losses after the scrub meet the rows the scrub
/// checked.
const CONFIG: &str = "[server]\ntcp_address = \"\"\n[limits]\nmemory_cache_bytes = 0\nflush_interval_ms = 200\nrebuild_automatic = false\n";

fn member(root: &Path, index: usize) -> PathBuf {
    root.join(format!("m{index}.img"))
}

/// The whole volume `v` read with nbdcopy equals `expected` (or the phase
/// and nbdcopy's complaint are named).
fn assert_reads_exact(daemon: &Daemon, root: &Path, expected: &[u8], phase: &str) {
    let copy = root.join("copy.img");
    let _ = std::fs::remove_file(&copy);
    let output = Command::new("nbdcopy")
        .env("PATH", common::system_path())
        .arg(daemon.uri("v"))
        .arg(&copy)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{phase}: nbdcopy failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let copied = std::fs::read(&copy).unwrap();
    assert!(copied == expected, "{phase}: the volume reads back changed");
}

/// The volume's contents, written to `source`: random bytes for a volume
/// stored whole, and for a compressing one an ext4 image of this machine's
/// Perl modules (`mkfs.ext4 -d`), which compress.
fn volume_contents(source: &Path, compression: &str) -> Vec<u8> {
    if compression == "off" {
        let mut expected = vec![0_u8; VOLUME_BYTES];
        rand::rngs::SmallRng::seed_from_u64(42).fill(&mut expected[..]);
        std::fs::write(source, &expected).unwrap();
        return expected;
    }
    run(Command::new("mkfs.ext4")
        .env("PATH", common::system_path())
        .args(["-q", "-F", "-d", "/usr/share/perl5"])
        .arg(source)
        .arg(format!("{}k", VOLUME_BYTES / 1024)));
    std::fs::read(source).unwrap()
}

struct Scenario {
    redundancy: &'static str,
    member_count: usize,
    /// The volume's codec (`off`: stored whole).
    compression: &'static str,
    /// Devices overwritten under the running daemon.
    damaged: &'static [usize],
    /// Other devices taken away after the scrub.
    lost: &'static [usize],
}

fn run_scenario(scenario: &Scenario) {
    let setup = Setup::new();
    let data_dir = &setup.data_dir;
    let members = ArrayMembers::new(
        (0..scenario.member_count).map(|index| member(&setup.root, index)),
        MEMBER_SIZE,
    );
    create_array_pool(data_dir, scenario.redundancy, &members, &[]);
    let compression = scenario.compression;
    lamina_ok(
        data_dir,
        &["volume", "create", "v", "24M", "--compression", compression],
    );
    let daemon = Daemon::start_on_pool(data_dir, CONFIG, "v");
    let source = setup.root.join("source.img");
    let expected = volume_contents(&source, compression);
    run(Command::new("nbdcopy")
        .arg("--flush")
        .arg(&source)
        .arg(daemon.uri("v")));

    // Step 2: garbage over the damaged devices past their labels; the
    // volume still reads exact (its data columns healed as read).
    for (seed, index) in scenario.damaged.iter().enumerate() {
        common::overwrite_with_random_bytes_from(
            &member(&setup.root, *index),
            DAMAGE_FIRST_MEMBER_BLOCK * 4096,
            seed as u64 + 7,
        );
    }
    assert_reads_exact(&daemon, &setup.root, &expected, "after the damage");

    // Step 3: the scrub finds the parity and the metadata copies the reads
    // never looked at, and repairs all of it.
    let scrub = lamina_ok(data_dir, &["pool", "scrub", "--wait"]);
    let label = scenario.redundancy;
    assert_eq!(scrub["state"], "finished", "{label}: {scrub}");
    assert_eq!(scrub["blocks_unrepairable"], 0, "{label}: {scrub}");
    assert!(
        scrub["parity_repaired"].as_u64().unwrap() > 0,
        "{label}: {scrub}"
    );
    assert!(
        scrub["rows_checked"].as_u64().unwrap() > 0,
        "{label}: {scrub}"
    );
    let status = lamina_ok(data_dir, &["pool", "status"]);
    let devices = status["layout"]["tiers"][0]["devices"].as_array().unwrap();
    for index in scenario.damaged {
        let repaired = devices[*index]["parity_repaired"].as_u64().unwrap();
        assert!(repaired > 0, "{label}: device {index}: {status}");
    }
    assert!(
        daemon
            .metrics()
            .contains("lamina_device_parity_repaired_total{tier=\"flash\",index=\"0\""),
        "{label}"
    );
    // A second scrub finds every column whole.
    let again = lamina_ok(data_dir, &["pool", "scrub", "--wait"]);
    assert_eq!(again["parity_repaired"], 0, "{label}: {again}");
    assert_eq!(again["blocks_repaired"], 0, "{label}: {again}");
    if compression != "off" {
        let volume = lamina_ok(data_dir, &["volume", "stats", "v"]);
        let ratio = volume["compress_ratio"].as_f64().unwrap();
        assert!(ratio > 1.5, "{label}: the image compresses: {volume}");
    }
    assert!(daemon.terminate().success());

    // Step 4: as many other devices lost as the redundancy covers.
    for index in scenario.lost {
        std::fs::remove_file(member(&setup.root, *index)).unwrap();
    }
    let daemon = Daemon::start_on_pool(data_dir, CONFIG, "v");
    let status = lamina_ok(data_dir, &["pool", "status"]);
    assert_eq!(status["layout"]["state"], "degraded", "{label}: {status}");
    assert_reads_exact(&daemon, &setup.root, &expected, "after the losses");
    assert!(daemon.terminate().success());
}

#[test]
fn a_scrubbed_raid6_pool_loses_two_more_devices_and_nothing_else() {
    // Members 0..=2 hold the mirrored metadata: member 0's copies are
    // damaged, and the two other holders are the devices lost after.
    run_scenario(&Scenario {
        redundancy: "raid6",
        member_count: 6,
        compression: "off",
        damaged: &[0, 3],
        lost: &[1, 2],
    });
}

#[test]
fn a_scrubbed_raid6_pool_of_compressed_blocks_loses_two_more_devices_and_nothing_else() {
    run_scenario(&Scenario {
        redundancy: "raid6",
        member_count: 6,
        compression: "lz4",
        damaged: &[0, 3],
        lost: &[1, 2],
    });
}

#[test]
fn a_scrubbed_raid5_pool_and_mirror_lose_one_more_device_and_nothing_else() {
    run_scenario(&Scenario {
        redundancy: "raid5",
        member_count: 4,
        compression: "off",
        damaged: &[0],
        lost: &[1],
    });
    run_scenario(&Scenario {
        redundancy: "mirror",
        member_count: 2,
        compression: "off",
        damaged: &[0],
        lost: &[1],
    });
}
