//! Snapshots and clones through the daemon and real clients: a pattern written
//! with `qemu-img`, a snapshot, an overwrite, then the snapshot export (`VOL@SNAP`,
//! read-only: `nbdinfo` says so and writes get EPERM) and the volume compared
//! with `qemu-img compare` and `nbdcopy`; a clone written through NBD leaving its
//! origin untouched; the snapshot commands' errors; rollback refused while a
//! client is connected and, with --force, seen by that client on its next read;
//! and everything still there after a restart.

// Test code keeps `as` for small sizes and byte patterns (issue 17 converts
// the library and binaries only).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

mod common;

use common::{Daemon, lamina_error, lamina_ok, run, system_path};

const VOLUME_BYTES: u64 = 64 << 20;
const PATTERN_BYTES: usize = 16 << 20;

fn pattern_file(path: &Path, seed: u32) {
    let bytes: Vec<u8> = (0..PATTERN_BYTES as u32)
        .map(|index| (index.wrapping_mul(2654435761).wrapping_add(seed) >> 11) as u8)
        .collect();
    std::fs::write(path, bytes).unwrap();
}

fn write_pattern(daemon: &Daemon, export: &str, file: &Path) {
    run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(file)
        .arg(daemon.uri(export)));
}

/// Whether the first `PATTERN_BYTES` of an export equal `file`.
fn same_as(daemon: &Daemon, export: &str, file: &Path) -> bool {
    let output = Command::new("qemu-img")
        .env("PATH", system_path())
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(file)
        .arg(daemon.uri(export))
        .output()
        .unwrap();
    // qemu-img compare: 0 identical, 1 different; anything else is an error.
    match output.status.code() {
        Some(0) => true,
        Some(1) => false,
        _ => panic!(
            "qemu-img compare failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ),
    }
}

#[test]
fn snapshots_and_clones_through_real_clients() {
    let directory = tempfile::tempdir().unwrap();
    let data_dir = directory.path().join("data");
    let first = directory.path().join("first.img");
    let second = directory.path().join("second.img");
    pattern_file(&first, 1);
    pattern_file(&second, 2);
    let daemon = Daemon::start_with_pool(&data_dir, 1 << 30, VOLUME_BYTES);

    write_pattern(&daemon, "default", &first);
    let created = lamina_ok(&data_dir, &["snapshot", "create", "default@monday"]);
    assert_eq!(created["full_name"], "default@monday", "{created}");
    write_pattern(&daemon, "default", &second);

    // The snapshot is an export of its own, read-only, with the old contents.
    let list = run(Command::new("nbdinfo").arg("--list").arg(daemon.uri("")));
    let snapshot_entry = list
        .split("export=")
        .find(|entry| entry.starts_with("\"default@monday\""))
        .unwrap_or_else(|| panic!("snapshot export not listed: {list}"));
    assert!(
        snapshot_entry.contains("is_read_only: true"),
        "{snapshot_entry}"
    );
    assert!(same_as(&daemon, "default@monday", &first));
    assert!(same_as(&daemon, "default", &second));
    let copy = directory.path().join("copy.img");
    run(Command::new("nbdcopy")
        .arg(daemon.uri("default@monday"))
        .arg(&copy));
    let copied = std::fs::read(&copy).unwrap();
    assert_eq!(copied.len() as u64, VOLUME_BYTES);
    assert!(copied[..PATTERN_BYTES] == std::fs::read(&first).unwrap()[..]);
    assert!(copied[PATTERN_BYTES..].iter().all(|byte| *byte == 0));

    // Writes to a snapshot export: refused by the server with EPERM (libnbd's
    // own check is switched off so that the request reaches the server).
    let refused = Command::new("nbdsh")
        .env("PATH", system_path())
        .arg("-c")
        .arg(format!(
            "h.set_strict_mode(0)\nh.connect_uri({:?})\nh.pwrite(b'x' * 4096, 0)",
            daemon.uri("default@monday")
        ))
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("Operation not permitted"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(same_as(&daemon, "default@monday", &first));

    // Space: every block of the first pattern now belongs to the snapshot alone.
    let snapshots = lamina_ok(&data_dir, &["snapshot", "list", "default"]);
    assert_eq!(
        snapshots[0]["unique_bytes"], PATTERN_BYTES as u64,
        "{snapshots}"
    );
    assert_eq!(snapshots[0]["referenced_bytes"], PATTERN_BYTES as u64);
    let volumes = lamina_ok(&data_dir, &["volume", "list"]);
    assert_eq!(
        volumes[0]["used_bytes"],
        2 * PATTERN_BYTES as u64,
        "{volumes}"
    );

    // A clone, written through NBD: its origin and the volume are untouched.
    let cloned = lamina_ok(&data_dir, &["clone", "default@monday", "scratch"]);
    assert_eq!(cloned["origin"], "default@monday", "{cloned}");
    assert!(same_as(&daemon, "scratch", &first));
    run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x5a 1M 2M"])
        .arg(daemon.uri("scratch")));
    assert!(!same_as(&daemon, "scratch", &first));
    let check = run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "read -P 0x5a 1M 2M"])
        .arg(daemon.uri("scratch")));
    assert!(!check.contains("Pattern verification failed"), "{check}");
    assert!(same_as(&daemon, "default@monday", &first));
    assert!(same_as(&daemon, "default", &second));
    // A clone of the clone.
    lamina_ok(&data_dir, &["snapshot", "create", "scratch@t1"]);
    lamina_ok(&data_dir, &["clone", "scratch@t1", "scratch2"]);
    let check = run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "read -P 0x5a 1M 2M"])
        .arg(daemon.uri("scratch2")));
    assert!(!check.contains("Pattern verification failed"), "{check}");

    // Bad input: clear errors, nothing changed.
    let before_volumes = lamina_ok(&data_dir, &["volume", "list"]);
    let before_snapshots = lamina_ok(&data_dir, &["snapshot", "list"]);
    let error = lamina_error(&data_dir, &["snapshot", "create", "nope@x"]);
    assert!(error.contains("no such volume: nope"), "{error}");
    let error = lamina_error(&data_dir, &["snapshot", "create", "default@monday"]);
    assert!(error.contains("already exists"), "{error}");
    let error = lamina_error(&data_dir, &["snapshot", "create", "default@bad/name"]);
    assert!(error.contains("allowed characters"), "{error}");
    let error = lamina_error(&data_dir, &["snapshot", "create", "default"]);
    assert!(error.contains("expected VOL@SNAP"), "{error}");
    let error = lamina_error(&data_dir, &["snapshot", "delete", "default@nope"]);
    assert!(error.contains("no such snapshot: default@nope"), "{error}");
    let error = lamina_error(&data_dir, &["snapshot", "delete", "default@monday"]);
    assert!(
        error.contains("clones that depend on it") && error.contains("scratch"),
        "{error}"
    );
    let error = lamina_error(&data_dir, &["volume", "delete", "default"]);
    assert!(error.contains("scratch"), "{error}");
    let error = lamina_error(&data_dir, &["clone", "default@monday", "scratch"]);
    assert!(error.contains("already exists"), "{error}");
    assert_eq!(lamina_ok(&data_dir, &["volume", "list"]), before_volumes);
    assert_eq!(
        lamina_ok(&data_dir, &["snapshot", "list"]),
        before_snapshots
    );

    // Rollback: refused while a client has the volume open; with --force the
    // connected client reads the snapshot's contents on its next request.
    let mut client = Command::new("nbdsh")
        .env("PATH", system_path())
        .arg("-u")
        .arg(daemon.uri("default"))
        .arg("-c")
        .arg(
            "import sys\nprint('connected', flush=True)\nsys.stdin.readline()\n\
             print(h.pread(16, 0).hex(), flush=True)",
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut client_output = BufReader::new(client.stdout.take().unwrap());
    let mut line = String::new();
    client_output.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "connected");
    let error = lamina_error(&data_dir, &["snapshot", "rollback", "default@monday"]);
    assert!(error.contains("NBD connection"), "{error}");
    assert!(same_as(&daemon, "default", &second));
    lamina_ok(
        &data_dir,
        &["snapshot", "rollback", "default@monday", "--force"],
    );
    writeln!(client.stdin.as_mut().unwrap()).unwrap();
    line.clear();
    client_output.read_line(&mut line).unwrap();
    let expected: String = std::fs::read(&first).unwrap()[..16]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    assert_eq!(
        line.trim(),
        expected,
        "the connected client sees the rollback"
    );
    assert!(client.wait().unwrap().success());
    assert!(same_as(&daemon, "default", &first));

    // Everything survives a restart.
    assert!(daemon.terminate().success());
    let daemon = Daemon::start_with_pool(&data_dir, 1 << 30, VOLUME_BYTES);
    assert!(same_as(&daemon, "default", &first));
    assert!(same_as(&daemon, "default@monday", &first));
    let check = run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "read -P 0x5a 1M 2M"])
        .arg(daemon.uri("scratch2")));
    assert!(!check.contains("Pattern verification failed"), "{check}");

    // Deleting the clones, then the snapshot, leaves only the volume.
    lamina_ok(&data_dir, &["volume", "delete", "scratch2"]);
    lamina_ok(&data_dir, &["volume", "delete", "scratch"]);
    lamina_ok(&data_dir, &["snapshot", "delete", "default@monday"]);
    let snapshots = lamina_ok(&data_dir, &["snapshot", "list"]);
    assert_eq!(snapshots, serde_json::json!([]));
    let volumes = lamina_ok(&data_dir, &["volume", "list"]);
    assert_eq!(volumes[0]["used_bytes"], PATTERN_BYTES as u64, "{volumes}");
    assert!(daemon.terminate().success());
}
