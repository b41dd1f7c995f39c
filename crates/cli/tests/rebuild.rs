//! Losing and replacing devices under a running daemon on six file devices
//! (raid6), with real clients: fio writing and verifying while a device is
//! taken out (`device fail`) and replaced (`device replace --wait`); a second
//! replacement started in the background, a second device failing during
//! its rebuild, `kill -9` of the daemon mid-rebuild, the rebuild resumed
//! after the restart; the last failed device replaced; then every byte
//! checked (nbdcopy and fio's verification), `pool.toml` naming the new
//! devices, and the refusals of unfit replacements.

#![allow(clippy::cast_possible_truncation)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{
    ArrayMembers, Daemon, Setup, assert_volume_reads, create_array_pool, lamina_error, lamina_ok,
    run, wait_with_timeout,
};
use rand::{Rng, SeedableRng};

const MEMBER_COUNT: usize = 6;
const MEMBER_SIZE: &str = "64M";
const VOLUME_BYTES: usize = 48 << 20;
/// No TCP; no memory cache, so that reads reach the devices.
const CONFIG: &str =
    "[server]\ntcp_address = \"\"\n[limits]\nmemory_cache_bytes = 0\nflush_interval_ms = 200\n";
/// How long the test waits for a resumed rebuild, at most.
const REBUILD_WAIT_MS_MAX: u64 = 120_000;
/// How long fio may run, at most.
const FIO_TIMEOUT_MS: u64 = 300_000;

fn member(root: &Path, name: &str) -> PathBuf {
    root.join(format!("{name}.img"))
}

/// `count` member files `{prefix}0.img`, `{prefix}1.img`, … in `root`.
fn numbered(root: &Path, prefix: &str, count: usize) -> impl Iterator<Item = PathBuf> {
    (0..count).map(move |index| member(root, &format!("{prefix}{index}")))
}

fn canonical(path: &Path) -> String {
    std::fs::canonicalize(path).unwrap().display().to_string()
}

/// fio's job on the `scratch` volume: random writes, verified by checksum.
fn fio(daemon: &Daemon, verify_only: bool) -> Command {
    let mut command = Command::new("fio");
    command.args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={}", daemon.uri("scratch")),
        "--rw=randwrite",
        "--bs=4k",
        "--size=12M",
        "--iodepth=8",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_state_save=0",
    ]);
    if verify_only {
        command.arg("--verify_only");
    }
    command
}

fn devices(status: &serde_json::Value) -> Vec<serde_json::Value> {
    status["layout"]["tiers"][0]["devices"]
        .as_array()
        .unwrap()
        .clone()
}

/// Polls `pool status` until no rebuild runs and no device is being replaced.
fn wait_for_rebuild(data_dir: &Path) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let status = lamina_ok(data_dir, &["pool", "status"]);
        let replacing = devices(&status)
            .iter()
            .any(|device| device.get("replacement").is_some());
        if status["rebuild"]["state"] != "rebuilding" && !replacing {
            return status;
        }
        assert!(
            started.elapsed() < Duration::from_millis(REBUILD_WAIT_MS_MAX),
            "the rebuild does not end: {status}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A raid6 pool over six file devices f0..f5 with volumes `v` (filled with
/// random bytes from `seed` through nbdcopy) and `scratch`, served by a
/// daemon. Returns the daemon, `v`'s contents and the file they came from.
fn six_device_pool_with_data(
    setup: &Setup,
    seed: u64,
    create_options: &[&str],
) -> (Daemon, Vec<u8>, PathBuf) {
    let (root, data_dir) = (&setup.root, &setup.data_dir);
    let members = ArrayMembers::new(numbered(root, "f", MEMBER_COUNT), MEMBER_SIZE);
    create_array_pool(data_dir, "raid6", &members, create_options);
    lamina_ok(data_dir, &["volume", "create", "v", "48M"]);
    lamina_ok(data_dir, &["volume", "create", "scratch", "16M"]);
    let daemon = Daemon::start_on_pool(data_dir, CONFIG, "v");
    let mut expected = vec![0_u8; VOLUME_BYTES];
    rand::rngs::SmallRng::seed_from_u64(seed).fill(&mut expected[..]);
    let source = root.join("source.img");
    std::fs::write(&source, &expected).unwrap();
    run(Command::new("nbdcopy").arg(&source).arg(daemon.uri("v")));
    (daemon, expected, source)
}

#[test]
fn devices_fail_and_are_replaced_under_load_and_across_a_kill() {
    let setup = Setup::new();
    let (root, data_dir) = (&setup.root, &setup.data_dir);
    let (daemon, expected, _source) = six_device_pool_with_data(&setup, 3, &[]);

    // fio writes and verifies while f0 fails and is replaced.
    let mut load = fio(&daemon, false)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let f0 = member(root, "f0");
    lamina_ok(data_dir, &["device", "fail", &f0.display().to_string()]);
    let new0 = member(root, "new0");
    let replaced = lamina_ok(
        data_dir,
        &[
            "device",
            "replace",
            &f0.display().to_string(),
            &format!("{}:{MEMBER_SIZE}", new0.display()),
            "--wait",
        ],
    );
    assert_eq!(replaced["state"], "finished", "{replaced}");
    assert_eq!(replaced["blocks_unrepairable"], 0, "{replaced}");
    assert!(replaced["bytes_done"].as_u64().unwrap() > 0, "{replaced}");
    let finished = wait_with_timeout(&mut load, FIO_TIMEOUT_MS).expect("fio ends");
    assert!(
        finished.success(),
        "fio failed its verification during the rebuild"
    );
    let status = lamina_ok(data_dir, &["pool", "status"]);
    assert_eq!(status["layout"]["state"], "online", "{status}");
    assert_eq!(devices(&status)[0]["path"], canonical(&new0));

    // A second replacement in the background; f2 fails during it; kill -9.
    let f1 = member(root, "f1");
    let new1 = member(root, "new1");
    let started = lamina_ok(
        data_dir,
        &[
            "device",
            "replace",
            &f1.display().to_string(),
            &format!("{}:{MEMBER_SIZE}", new1.display()),
        ],
    );
    let f2 = member(root, "f2");
    lamina_ok(data_dir, &["device", "fail", &f2.display().to_string()]);
    let at_kill = lamina_ok(data_dir, &["pool", "status"]);
    eprintln!(
        "at the kill: {} (replace answered {started})",
        at_kill["rebuild"]
    );
    daemon.kill_hard();

    // The restart resumes the rebuild (from the new device's label) if the
    // kill cut it; f2 stays out.
    let daemon = Daemon::start_on_pool(data_dir, CONFIG, "v");
    let status = wait_for_rebuild(data_dir);
    assert_ne!(status["rebuild"]["state"], "failed", "{status}");
    let listed = devices(&status);
    assert_eq!(listed[1]["path"], canonical(&new1), "{status}");
    assert_eq!(listed[1]["state"], "online", "{status}");
    assert_ne!(listed[2]["state"], "online", "{status}");
    assert_eq!(status["layout"]["state"], "degraded", "{status}");
    assert_volume_reads(
        &daemon,
        root,
        &expected,
        "after the kill and the resumed rebuild",
    );

    // Unfit replacements are refused, clearly.
    let small = format!("{}:8M", member(root, "small").display());
    let error = lamina_error(
        data_dir,
        &["device", "replace", &f2.display().to_string(), &small],
    );
    assert!(error.contains("too small"), "{error}");
    let error = lamina_error(
        data_dir,
        &["device", "replace", "/nonexistent/device", &small],
    );
    assert!(error.contains("not a device of this pool"), "{error}");

    // The last failed device replaced: online again, every byte intact.
    let new2 = member(root, "new2");
    let replaced = lamina_ok(
        data_dir,
        &[
            "device",
            "replace",
            &f2.display().to_string(),
            &format!("{}:{MEMBER_SIZE}", new2.display()),
            "--wait",
        ],
    );
    assert_eq!(replaced["state"], "finished", "{replaced}");
    let status = wait_for_rebuild(data_dir);
    assert_eq!(status["layout"]["state"], "online", "{status}");
    assert_volume_reads(&daemon, root, &expected, "after three replacements");
    let verified = fio(&daemon, true).output().unwrap();
    assert!(
        verified.status.success(),
        "fio's verification of its data failed: {}",
        String::from_utf8_lossy(&verified.stdout)
    );
    let list = lamina_ok(data_dir, &["device", "list"]);
    assert_eq!(list.as_array().unwrap().len(), MEMBER_COUNT, "{list}");
    assert!(daemon.terminate().success());

    // pool.toml names the new devices, not the old ones.
    let description = std::fs::read_to_string(data_dir.join("pool.toml")).unwrap();
    for new in [&new0, &new1, &new2] {
        assert!(description.contains(&canonical(new)), "{description}");
    }
    for old in [&f0, &f1, &f2] {
        assert!(
            !description.contains(&old.display().to_string()),
            "{description}"
        );
    }
}

/// A capacity array's device replaced with no daemon running (the commands
/// open the pool themselves): data demoted to capacity reads back through the
/// new device with two other capacity devices taken out.
#[test]
fn a_capacity_device_is_replaced_offline_and_carries_the_demoted_data() {
    let setup = Setup::new();
    let (root, data_dir) = (&setup.root, &setup.data_dir);
    let devices = |prefix: &str, count: usize, size: &str| {
        ArrayMembers::new(numbered(root, prefix, count), size).argument()
    };
    lamina_ok(
        data_dir,
        &[
            "pool",
            "create",
            "--flash",
            &devices("flash", 4, "24M"),
            "--capacity",
            &devices("cap", 5, "96M"),
            "--redundancy",
            "raid6",
            "--segment-size",
            "1M",
        ],
    );
    let volume_bytes = 96_usize << 20;
    lamina_ok(
        data_dir,
        &["volume", "create", "v", &volume_bytes.to_string()],
    );
    let daemon = Daemon::start_on_pool(data_dir, CONFIG, "v");
    let mut expected = vec![0_u8; volume_bytes];
    rand::rngs::SmallRng::seed_from_u64(4).fill(&mut expected[..]);
    let source = root.join("source.img");
    std::fs::write(&source, &expected).unwrap();
    run(Command::new("nbdcopy").arg(&source).arg(daemon.uri("v")));
    let started = Instant::now();
    while lamina_ok(data_dir, &["volume", "stats", "v"])["capacity_bytes"]
        .as_u64()
        .unwrap()
        == 0
    {
        assert!(started.elapsed() < Duration::from_millis(REBUILD_WAIT_MS_MAX));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(daemon.terminate().success());

    let cap = |index: usize| member(root, &format!("cap{index}")).display().to_string();
    lamina_ok(data_dir, &["device", "fail", &cap(1)]);
    let new = member(root, "newcap");
    let replaced = lamina_ok(
        data_dir,
        &[
            "device",
            "replace",
            &cap(1),
            &format!("{}:96M", new.display()),
            "--wait",
        ],
    );
    assert_eq!(replaced["state"], "finished", "{replaced}");
    assert!(
        replaced["rows_verified"].as_u64().unwrap() > 0,
        "{replaced}"
    );
    lamina_ok(data_dir, &["device", "fail", &cap(0)]);
    lamina_ok(data_dir, &["device", "fail", &cap(2)]);
    let daemon = Daemon::start_on_pool(data_dir, CONFIG, "v");
    let status = lamina_ok(data_dir, &["pool", "status"]);
    let capacity = &status["layout"]["tiers"][1];
    assert_eq!(capacity["state"], "degraded", "{status}");
    assert_eq!(capacity["devices"][1]["path"], canonical(&new), "{status}");
    assert_volume_reads(&daemon, root, &expected, "through the new capacity device");
    assert!(daemon.terminate().success());
}

/// The rebuild onto distributed spare space under the daemon: with fio
/// writing and verifying, f0 is taken out and the daemon moves the data of
/// every segment it held onto the five others by itself; f1 fails during
/// that rebuild and the daemon is killed with `kill -9`; after the restart
/// the rebuild resumes (onto the four left) and ends; every byte reads back
/// and then two more devices can be lost. Then f3 is removed (its data moved
/// to the others, its slot emptied) and a new device added into a slot.
#[test]
fn a_lost_device_is_rebuilt_onto_the_others_by_itself_across_a_kill() {
    let setup = Setup::new();
    let (root, data_dir) = (&setup.root, &setup.data_dir);
    let (daemon, expected, source) = six_device_pool_with_data(&setup, 5, &[]);

    // fio writes and verifies while f0 is lost and rebuilt onto the others.
    let mut load = fio(&daemon, false)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let path = |name: &str| member(root, name).display().to_string();
    lamina_ok(data_dir, &["device", "fail", &path("f0")]);
    let status = wait_for_rebuild(data_dir);
    assert_eq!(status["rebuild"]["state"], "finished", "{status}");
    assert_eq!(status["rebuild"]["kind"], "distributed-spare", "{status}");
    assert!(
        status["rebuild"]["bytes_done"].as_u64().unwrap() > 0,
        "{status}"
    );
    let finished = wait_with_timeout(&mut load, FIO_TIMEOUT_MS).expect("fio ends");
    assert!(
        finished.success(),
        "fio failed its verification during the rebuild"
    );
    assert_volume_reads(
        &daemon,
        root,
        &expected,
        "after the rebuild onto the others",
    );

    // f1 fails while the data written since is rebuilt; kill -9 at once.
    run(Command::new("nbdcopy").arg(&source).arg(daemon.uri("v")));
    lamina_ok(data_dir, &["device", "fail", &path("f1")]);
    let at_kill = lamina_ok(data_dir, &["pool", "status"]);
    eprintln!("at the kill: {}", at_kill["rebuild"]);
    daemon.kill_hard();

    // The restart rebuilds onto the four left by itself; then two more
    // devices can go with nothing lost.
    let daemon = Daemon::start_on_pool(data_dir, CONFIG, "v");
    let started = Instant::now();
    let status = loop {
        let status = wait_for_rebuild(data_dir);
        if status["rebuild"]["state"] == "finished" {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_millis(REBUILD_WAIT_MS_MAX),
            "no rebuild after the restart: {status}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(status["rebuild"]["kind"], "distributed-spare", "{status}");
    assert_volume_reads(&daemon, root, &expected, "after the kill and the rebuild");
    let verified = fio(&daemon, true).output().unwrap();
    assert!(verified.status.success(), "fio's data after the kill");

    // Four are left, the fewest raid6 stripes over: f3 cannot go.
    let error = lamina_error(data_dir, &["device", "remove", &path("f3")]);
    assert!(error.contains("raid6 needs 4"), "{error}");
    // The lost f0's slot is emptied, a new device goes into it (new
    // segments use it), and then f3 can be removed: its data moves to the
    // others and its slot is emptied.
    lamina_ok(data_dir, &["device", "remove", &path("f0")]);
    let status = lamina_ok(data_dir, &["pool", "status"]);
    assert_eq!(devices(&status)[0]["state"], "removed", "{status}");
    let added = lamina_ok(
        data_dir,
        &[
            "device",
            "add",
            "--tier",
            "flash",
            &format!("{}:{MEMBER_SIZE}", path("new3")),
        ],
    );
    assert!(
        added
            .as_array()
            .unwrap()
            .iter()
            .any(|device| device["path"] == canonical(&member(root, "new3"))),
        "{added}"
    );
    run(Command::new("nbdcopy").arg(&source).arg(daemon.uri("v")));
    let removed = lamina_ok(data_dir, &["device", "remove", &path("f3")]);
    assert_eq!(removed["state"], "finished", "{removed}");
    let status = lamina_ok(data_dir, &["pool", "status"]);
    assert_eq!(devices(&status)[3]["state"], "removed", "{status}");
    assert_volume_reads(
        &daemon,
        root,
        &expected,
        "after the addition and the removal",
    );
    let verified = fio(&daemon, true).output().unwrap();
    assert!(verified.status.success(), "fio's data after the removal");
    assert!(daemon.terminate().success());
    let description = std::fs::read_to_string(data_dir.join("pool.toml")).unwrap();
    assert!(
        description.contains(&canonical(&member(root, "new3"))),
        "{description}"
    );
}

#[test]
fn a_pool_created_with_empty_slots_widens_and_rebalances_under_load() {
    let setup = Setup::new();
    let (root, data_dir) = (&setup.root, &setup.data_dir);
    let (daemon, expected, source) = six_device_pool_with_data(&setup, 8, &["--flash-slots", "8"]);
    let path = |name: &str| member(root, name).display().to_string();
    let capacity = |status: &serde_json::Value| status["capacity_bytes"].as_u64().unwrap();
    let six_wide = capacity(&lamina_ok(data_dir, &["pool", "status"]));

    // fio writes and verifies while a seventh device is added and the data
    // spread over it.
    let mut load = fio(&daemon, false)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let seventh = format!("{}:{MEMBER_SIZE}", path("new6"));
    let rebalanced = lamina_ok(
        data_dir,
        &["device", "add", "--tier", "flash", &seventh, "--rebalance"],
    );
    assert_eq!(rebalanced["state"], "finished", "{rebalanced}");
    assert_eq!(rebalanced["kind"], "rebalance", "{rebalanced}");
    assert!(
        rebalanced["bytes_done"].as_u64().unwrap() >= VOLUME_BYTES as u64 / 2,
        "the stored data moved: {rebalanced}"
    );
    let finished = wait_with_timeout(&mut load, FIO_TIMEOUT_MS).expect("fio ends");
    assert!(
        finished.success(),
        "fio failed its verification during the rebalance"
    );
    let status = lamina_ok(data_dir, &["pool", "status"]);
    // Raid6 rows of four data columns become rows of five.
    let seven_wide = capacity(&status);
    assert!(
        seven_wide * 4 > six_wide * 5 * 99 / 100 && seven_wide * 4 <= six_wide * 5,
        "{six_wide} bytes over six, {seven_wide} over seven"
    );
    assert_eq!(devices(&status)[6]["state"], "online", "{status}");
    assert_volume_reads(&daemon, root, &expected, "after the rebalance");

    // The eighth fills the last slot (rebalanced by hand); a ninth is
    // refused, naming the slots.
    run(Command::new("nbdcopy").arg(&source).arg(daemon.uri("v")));
    let eighth = format!("{}:{MEMBER_SIZE}", path("new7"));
    lamina_ok(data_dir, &["device", "add", "--tier", "flash", &eighth]);
    let rebalanced = lamina_ok(data_dir, &["device", "rebalance"]);
    assert_eq!(rebalanced["state"], "finished", "{rebalanced}");
    let ninth = format!("{}:{MEMBER_SIZE}", path("new8"));
    let error = lamina_error(data_dir, &["device", "add", "--tier", "flash", &ninth]);
    assert!(error.contains("slots are all in use"), "{error}");

    // Any two lost, an added one among them, lose nothing.
    lamina_ok(data_dir, &["device", "fail", &path("new6")]);
    lamina_ok(data_dir, &["device", "fail", &path("f2")]);
    assert_volume_reads(&daemon, root, &expected, "with two of eight lost");
    let verified = fio(&daemon, true).output().unwrap();
    assert!(verified.status.success(), "fio's data with two lost");
    assert!(daemon.terminate().success());
}

#[test]
fn empty_slots_are_refused_where_they_cannot_widen() {
    let setup = Setup::new();
    let (root, data_dir) = (&setup.root, &setup.data_dir);
    let devices = |count: usize| ArrayMembers::new(numbered(root, "s", count), "16M").argument();
    let error = lamina_error(
        data_dir,
        &[
            "pool",
            "create",
            "--flash",
            &devices(6),
            "--redundancy",
            "raid6",
            "--flash-slots",
            "5",
        ],
    );
    assert!(error.contains("5 slots for 6 devices"), "{error}");
    let error = lamina_error(
        data_dir,
        &[
            "pool",
            "create",
            "--flash",
            &devices(3),
            "--redundancy",
            "mirror",
            "--flash-slots",
            "4",
        ],
    );
    assert!(error.contains("only raid5 and raid6 widen"), "{error}");
}

/// Each member of the full pool: small, so that filling it is quick.
const FULL_MEMBER_SIZE: &str = "16M";
/// Share of what clients can fill that the full pool's volume holds (all
/// of it written): more than the five members left hold at their width
/// (three data columns of four).
const FULL_SHARE_PERCENT: u64 = 85;

/// A raid6 pool whose live data fills 85 % of what clients can fill loses
/// f1: the five left cannot hold its data at their narrower width, so no
/// rebuild can run. The pool says so everywhere — `pool status` (text and
/// `rebuild.blocked` in `--json`) with the figures and what to do, the log
/// (at once and again at the next open), `/metrics` — and `device rebuild`
/// fails with the reason (audited as an error) instead of answering
/// success for nothing (issue 42). The data reads back throughout.
#[test]
fn a_rebuild_without_room_is_blocked_and_says_why_everywhere() {
    let setup = Setup::new();
    let (root, data_dir) = (&setup.root, &setup.data_dir);
    let members = ArrayMembers::new(numbered(root, "f", MEMBER_COUNT), FULL_MEMBER_SIZE);
    create_array_pool(data_dir, "raid6", &members, &[]);
    let status = lamina_ok(data_dir, &["pool", "status"]);
    let fillable = status["free_bytes"].as_u64().unwrap() + status["used_bytes"].as_u64().unwrap();
    let volume_bytes = (fillable * FULL_SHARE_PERCENT / 100) >> 20 << 20;
    lamina_ok(
        data_dir,
        &["volume", "create", "v", &volume_bytes.to_string()],
    );
    let daemon = Daemon::start_on_pool(data_dir, CONFIG, "v");
    let mut expected = vec![0_u8; volume_bytes as usize];
    rand::rngs::SmallRng::seed_from_u64(42).fill(&mut expected[..]);
    let source = root.join("source.img");
    std::fs::write(&source, &expected).unwrap();
    run(Command::new("nbdcopy").arg(&source).arg(daemon.uri("v")));

    lamina_ok(
        data_dir,
        &["device", "fail", &member(root, "f1").display().to_string()],
    );
    assert_blocked_for_room(&daemon, data_dir);
    let error = lamina_error(data_dir, &["device", "rebuild"]);
    assert!(
        error.contains(
            "no rebuild can run: not enough free space on the surviving devices to restore raid6"
        ),
        "{error}"
    );
    assert!(
        daemon.metrics().contains(
            "lamina_admin_operations_total{operation=\"device_rebuild\",outcome=\"error\"} 1"
        ),
        "{}",
        daemon.metrics()
    );
    assert_volume_reads(&daemon, root, &expected, "with f1 lost and no room");
    assert!(daemon.terminate().success());

    // The next open says it again, at once.
    let daemon = Daemon::start_on_pool(data_dir, CONFIG, "v");
    assert_blocked_for_room(&daemon, data_dir);
    assert_volume_reads(&daemon, root, &expected, "reopened with f1 lost");
    assert!(daemon.terminate().success());
}

/// `pool status` (JSON and text), `/metrics` and the log say no rebuild
/// can run for want of room, with the figures and what to do.
fn assert_blocked_for_room(daemon: &Daemon, data_dir: &Path) {
    let status = lamina_ok(data_dir, &["pool", "status"]);
    let blocked = &status["rebuild"]["blocked"];
    assert_eq!(blocked["reason"], "no-room", "{status}");
    assert!(
        blocked["bytes_to_move"].as_u64().unwrap() > blocked["bytes_free"].as_u64().unwrap(),
        "{status}"
    );
    let message = blocked["message"].as_str().unwrap();
    assert!(
        message
            .starts_with("not enough free space on the surviving devices to restore raid6 (need ")
            && message.contains("device replace"),
        "{message}"
    );
    let text = common::lamina(data_dir, &["pool", "status"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!("rebuild              blocked: {message}")),
        "{text}"
    );
    assert_eq!(daemon.gauge("lamina_rebuild_blocked"), Some(1.0));
    assert!(
        daemon
            .gauge("lamina_rebuild_blocked_bytes_to_move")
            .unwrap()
            > 0.0
    );
    let log = daemon.log();
    assert!(
        log.contains("redundancy is reduced and no rebuild can restore it")
            && log.contains("not enough free space on the"),
        "{log}"
    );
}
