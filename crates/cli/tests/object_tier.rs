//! A capacity tier on S3-compatible object storage end to end (issue 22): a
//! real S3 server (SeaweedFS's `weed mini` on loopback, started and stopped
//! by the test), `lamina pool create --capacity s3://...`, the daemon
//! serving a volume larger than flash to real NBD clients (`nbdcopy`,
//! `qemu-img compare`), demotion into objects, `kill -9` while demoting and a
//! restart, and the object tier in `pool status` and `/metrics`. The tests
//! assert where data is and that it is intact, never how fast.

// Test code keeps `as` for small sizes and byte patterns.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use lamina_objects::test_support::SeaweedServer;

mod common;

use common::{Daemon, LAMINA, Setup, assert_same, lamina, lamina_ok, pattern_file, write_file};

const MIB: u64 = 1 << 20;
const BUCKET: &str = "lamina-tests";
/// The daemon's request limits toward the store in these tests, so that a
/// store that is down turns into errors within seconds.
const REQUEST_TIMEOUT_MS: u64 = 2_000;
const RETRIES_MAX: usize = 2;
/// How long a read of data held only in a store that is down may take to
/// fail: the retries' backoff and timeouts, with room for a loaded machine.
const STORE_DOWN_ERROR_MS: u64 = 30_000;
/// Background demotion gets this long to show its effect.
const DEMOTION_DEADLINE_MS: u64 = 180_000;

/// The object store the tests create their pools on.
struct Store {
    server: SeaweedServer,
}

impl Store {
    /// `None` only when `LAMINA_SKIP_S3_TESTS=1` and `weed` is missing
    /// (otherwise a missing `weed` fails the test).
    fn start() -> Option<Store> {
        let server = SeaweedServer::start_or_skip()?;
        server.create_bucket(BUCKET).expect("create the bucket");
        Some(Store { server })
    }

    /// `lamina pool create` with the capacity tier at `s3://BUCKET/prefix`:
    /// 64 MiB of flash, 1 MiB segments, credentials from the environment as
    /// a user would give them.
    fn create_pool(&self, setup: &Setup, prefix: &str) -> std::process::Output {
        self.create_pool_of(setup, &format!("{prefix}:1G"))
    }

    /// As `create_pool`, with the tier's `prefix:SIZE` given.
    fn create_pool_of(&self, setup: &Setup, prefix_and_size: &str) -> std::process::Output {
        let flash = setup.device("flash.img:64M");
        let capacity = format!("s3://{BUCKET}/{prefix_and_size}");
        let endpoint = self.server.endpoint();
        self.lamina(
            &setup.data_dir,
            &[
                "pool",
                "create",
                "--flash",
                &flash,
                "--capacity",
                &capacity,
                "--s3-endpoint",
                &endpoint,
                "--segment-size",
                "1M",
                "--json",
            ],
        )
    }

    /// `lamina ARGUMENTS --data DATA_DIR` with the store's credentials in
    /// the environment, as a user would give them to commands that open the
    /// pool without the daemon.
    fn lamina(&self, data_dir: &Path, arguments: &[&str]) -> std::process::Output {
        Command::new(LAMINA)
            .args(arguments)
            .arg("--data")
            .arg(data_dir)
            .env("AWS_ACCESS_KEY_ID", self.server.access_key_id())
            .env("AWS_SECRET_ACCESS_KEY", self.server.secret_access_key())
            .env("LAMINA_LOG", "warn")
            .output()
            .unwrap()
    }

    /// The daemon's config: no TCP, no memory cache (reads reach the tiers),
    /// frequent flushes, and the store's credentials.
    fn config(&self) -> String {
        format!(
            "[server]\ntcp_address = \"\"\n[limits]\nmemory_cache_bytes = 0\nflush_interval_ms = 200\n[object_store]\naccess_key_id = {:?}\nsecret_access_key = {:?}\nrequest_timeout_ms = {REQUEST_TIMEOUT_MS}\nretries_max = {RETRIES_MAX}\n",
            self.server.access_key_id(),
            self.server.secret_access_key()
        )
    }
}

fn created(output: &std::process::Output) -> serde_json::Value {
    assert!(
        output.status.success(),
        "pool create failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Polls `condition` until it holds or the deadline passes.
fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_millis(DEMOTION_DEADLINE_MS);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn capacity_bytes(data_dir: &Path, volume: &str) -> u64 {
    let stats = lamina_ok(data_dir, &["volume", "stats", volume]);
    stats["capacity_bytes"].as_u64().unwrap()
}

/// A volume 2.5 times the size of flash is written through NBD, demoted in
/// part into objects, and reads back bit for bit, before and after the daemon
/// is killed with SIGKILL while it demotes; `pool status` and `/metrics` show
/// the objects and the requests.
#[test]
fn a_volume_larger_than_flash_is_demoted_into_objects_and_survives_kill_9() {
    let Some(store) = Store::start() else {
        return;
    };
    let setup = Setup::new();
    let status = created(&store.create_pool(&setup, "pool-one"));
    assert_eq!(status["object_tier"]["url"], "s3://lamina-tests/pool-one");
    let volume_bytes = 160 * MIB;
    let size = volume_bytes.to_string();
    let output = store.lamina(&setup.data_dir, &["volume", "create", "big", &size]);
    assert!(output.status.success(), "{output:?}");
    // Without credentials, a command that opens the pool says what is missing.
    let output = Command::new(LAMINA)
        .args(["volume", "list", "--data"])
        .arg(&setup.data_dir)
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .output()
        .unwrap();
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains("AWS_ACCESS_KEY_ID"), "{error}");
    let daemon = Daemon::start_on_pool(&setup.data_dir, &store.config(), "big");
    let file = setup.root.join("big.pattern");
    pattern_file(&file, volume_bytes, 7);
    write_file(&daemon, "big", &file);
    // Killed while the demoter still moves data into objects.
    wait_until("some data is demoted", || {
        capacity_bytes(&setup.data_dir, "big") > 0
    });
    daemon.kill_hard();

    let daemon = Daemon::start_on_pool(&setup.data_dir, &store.config(), "big");
    assert_same(&daemon, "big", &file);
    wait_until("flash has overflowed into objects", || {
        capacity_bytes(&setup.data_dir, "big") >= volume_bytes - 60 * MIB
    });
    assert_same(&daemon, "big", &file);

    let status = lamina_ok(&daemon.data_dir, &["pool", "status"]);
    let object_tier = &status["object_tier"];
    eprintln!("object tier after the demotion: {object_tier}");
    assert!(
        object_tier["object_count"].as_u64().unwrap() > 0,
        "{status}"
    );
    assert!(
        object_tier["stored_bytes"].as_u64().unwrap() >= volume_bytes - 60 * MIB,
        "{status}"
    );
    let text = daemon.metrics();
    assert!(
        text.contains("lamina_object_requests_total{kind=\"put\"}"),
        "{text}"
    );
    assert!(text.contains("lamina_object_tier_stored_bytes "), "{text}");
    assert!(daemon.terminate().success());

    // Stopped cleanly and opened again: the same bytes.
    let daemon = Daemon::start_on_pool(&setup.data_dir, &store.config(), "big");
    assert_same(&daemon, "big", &file);
    assert!(daemon.terminate().success());
}

/// A second pool on a prefix that already holds a tier is refused, naming
/// it; plain HTTP to a host that is not loopback is refused unless allowed.
#[test]
fn a_prefix_in_use_and_plain_http_off_the_machine_are_refused() {
    let Some(store) = Store::start() else {
        return;
    };
    let first = Setup::new();
    created(&store.create_pool(&first, "shared"));
    let second = Setup::new();
    let output = store.create_pool(&second, "shared");
    assert!(!output.status.success());
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains("s3://lamina-tests/shared"), "{error}");
    assert!(
        !second.data_dir.join("pool.toml").exists(),
        "nothing is recorded for a refused pool"
    );

    let output = Command::new(LAMINA)
        .args(["pool", "create", "--flash"])
        .arg(second.device("other.img:64M"))
        .args(["--capacity", "s3://lamina-tests/elsewhere"])
        .args(["--s3-endpoint", "http://192.0.2.1:8333", "--data"])
        .arg(&second.data_dir)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains("refusing plain HTTP"), "{error}");
    assert!(error.contains("192.0.2.1"), "{error}");
}

/// Reads `length` bytes at `offset` of an export with `nbdsh` and compares
/// them with the same range of `file`; `Err` with the client's message when
/// the read fails.
fn read_range(
    daemon: &Daemon,
    export: &str,
    file: &Path,
    offset: u64,
    length: u64,
) -> Result<(), String> {
    let script = format!(
        "source = open({file:?}, 'rb')\nsource.seek({offset})\nexpected = source.read({length})\nassert h.pread({length}, {offset}) == expected, 'the export differs from the file'\n",
        file = file.display().to_string(),
    );
    let output = Command::new("nbdsh")
        .arg("-u")
        .arg(daemon.uri(export))
        .arg("-c")
        .arg(script)
        .env("PATH", common::system_path())
        .output()
        .unwrap();
    match output.status.success() {
        true => Ok(()),
        false => Err(String::from_utf8_lossy(&output.stderr).into_owned()),
    }
}

/// The store stopped under a running daemon: reads of data held only there
/// fail with an error within a bounded time (never zeros or older data),
/// data on flash still reads, the daemon stays up and answers `pool status`;
/// new data written and flushed meanwhile lands on flash and reads back, the
/// tier's writes show as suspended and the pool never fails (decision 0032);
/// once the store is back the same reads succeed, the tier's writes resume,
/// and after a `kill -9` and a restart every byte is intact.
#[test]
fn the_store_down_gives_errors_never_wrong_data_and_its_return_heals() {
    let Some(mut store) = Store::start() else {
        return;
    };
    let setup = Setup::new();
    created(&store.create_pool(&setup, "outage"));
    let volume_bytes = 160 * MIB;
    let size = volume_bytes.to_string();
    let output = store.lamina(&setup.data_dir, &["volume", "create", "big", &size]);
    assert!(output.status.success(), "{output:?}");
    let daemon = Daemon::start_on_pool(&setup.data_dir, &store.config(), "big");
    let file = setup.root.join("big.pattern");
    pattern_file(&file, volume_bytes, 23);
    write_file(&daemon, "big", &file);
    wait_until("flash has overflowed into objects", || {
        capacity_bytes(&setup.data_dir, "big") >= volume_bytes - 60 * MIB
    });
    // Written first, demoted first: the first MiB is in the store only. The
    // last MiB, written again now, is on flash (new writes land there, and
    // flash has room: nothing more is demoted).
    read_range(&daemon, "big", &file, 0, MIB).expect("a demoted range reads");
    rewrite_range(&daemon, "big", &file, volume_bytes - MIB, MIB);

    store.server.stop();
    let started = Instant::now();
    let error = read_range(&daemon, "big", &file, 0, MIB)
        .expect_err("a read of data held only in a stopped store must fail");
    assert!(
        started.elapsed() < Duration::from_millis(STORE_DOWN_ERROR_MS),
        "the read failed only after {:?}",
        started.elapsed()
    );
    assert!(
        !error.contains("differs"),
        "wrong data instead of an error: {error}"
    );
    read_range(&daemon, "big", &file, volume_bytes - MIB, MIB)
        .expect("data on flash reads while the store is down");
    let status = lamina_ok(&daemon.data_dir, &["pool", "status"]);
    let gets = &status["object_tier"]["requests"][0];
    assert_eq!(gets["kind"], "get");
    assert!(gets["errors"].as_u64().unwrap() > 0, "{status}");
    // Each failed GET was retried with backoff, its attempts refused.
    assert!(
        gets["retries"].as_u64().unwrap() >= gets["errors"].as_u64().unwrap()
            && gets["transport_errors"].as_u64().unwrap() > gets["errors"].as_u64().unwrap(),
        "{status}"
    );
    assert!(
        daemon
            .gauge("lamina_object_request_retries_total{kind=\"get\"}")
            .is_some_and(|retries| retries > 0.0),
        "{}",
        daemon.metrics()
    );
    assert!(
        daemon
            .gauge("lamina_object_request_latency_p99_seconds{kind=\"get\"}")
            .is_some_and(|latency| latency > 0.0),
        "{}",
        daemon.metrics()
    );
    common::promtool::assert_lints_clean(&daemon.metrics());
    let human = lamina(&daemon.data_dir, &["pool", "status"]);
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(
        human.contains("retries:") && human.contains("transport errors"),
        "{human}"
    );
    // New data written and flushed lands on flash (decision 0032): it takes
    // flash below the demoter's target, the demoter's upload fails, and the
    // tier's writes are suspended instead of the pool failing; later writes
    // and flushes still succeed and read back.
    let new_data_offset = 40 * MIB;
    overwrite_range(&daemon, "big", &file, new_data_offset, 2 * MIB, 71);
    wait_until("the capacity tier's writes are suspended", || {
        let status = lamina_ok(&daemon.data_dir, &["pool", "status"]);
        assert!(status["failed"].is_null(), "the pool failed: {status}");
        !status["capacity_writes"]["suspended"].is_null()
    });
    overwrite_range(&daemon, "big", &file, new_data_offset + 2 * MIB, MIB, 72);
    read_range(&daemon, "big", &file, new_data_offset, 3 * MIB)
        .expect("data written while the store is down reads back");
    let status = lamina_ok(&daemon.data_dir, &["pool", "status"]);
    assert!(status["failed"].is_null(), "the pool failed: {status}");
    let suspended = &status["capacity_writes"]["suspended"];
    assert!(
        suspended["last_error"]
            .as_str()
            .is_some_and(|error| !error.is_empty())
            && suspended["since_unix_seconds"].as_u64().unwrap() > 0,
        "{status}"
    );

    store.server.restart().expect("restart weed mini");
    read_range(&daemon, "big", &file, 0, MIB).expect("the demoted range reads again");
    // The demoter's retries find the store back and resume the tier's writes.
    wait_until("the capacity tier's writes resume", || {
        let status = lamina_ok(&daemon.data_dir, &["pool", "status"]);
        status["capacity_writes"]["suspended"].is_null()
    });
    assert_same(&daemon, "big", &file);
    daemon.kill_hard();
    let daemon = Daemon::start_on_pool(&setup.data_dir, &store.config(), "big");
    assert_same(&daemon, "big", &file);
    assert!(daemon.terminate().success());
}

/// Overwritten again and again, a volume larger than flash makes the object
/// tier's segments die and be cleaned and written again (their old parts
/// deleted); killed with SIGKILL while that goes on, the pool opens again
/// and holds the last data written and flushed.
#[test]
fn overwrites_clean_the_object_tier_and_survive_kill_9() {
    let Some(store) = Store::start() else {
        return;
    };
    let setup = Setup::new();
    created(&store.create_pool_of(&setup, "cleaning:160M"));
    let volume_bytes = 120 * MIB;
    let size = volume_bytes.to_string();
    let output = store.lamina(&setup.data_dir, &["volume", "create", "v", &size]);
    assert!(output.status.success(), "{output:?}");
    let mut daemon = Daemon::start_on_pool(&setup.data_dir, &store.config(), "v");
    let file = setup.root.join("v.pattern");
    for pass in 0..4 {
        pattern_file(&file, volume_bytes, 100 + pass);
        write_file(&daemon, "v", &file);
        if pass == 2 {
            // Killed while the demoter and the cleaner still work on the
            // last pass (nbdcopy flushed it).
            daemon.kill_hard();
            daemon = Daemon::start_on_pool(&setup.data_dir, &store.config(), "v");
            assert_same(&daemon, "v", &file);
        }
    }
    assert_same(&daemon, "v", &file);
    let status = lamina_ok(&daemon.data_dir, &["pool", "status"]);
    eprintln!(
        "object tier after the overwrites: {}",
        status["object_tier"]
    );
    // 480 MiB written through a 160 MiB tier: its segments were used again.
    assert!(status["demoted_blocks"].as_u64().unwrap() > 0, "{status}");
    let deletes = &status["object_tier"]["requests"][2];
    assert_eq!(deletes["kind"], "delete");
    assert!(deletes["count"].as_u64().unwrap() > 0, "{status}");
    assert!(daemon.terminate().success());
    let daemon = Daemon::start_on_pool(&setup.data_dir, &store.config(), "v");
    assert_same(&daemon, "v", &file);
    assert!(daemon.terminate().success());
}

/// Replaces `length` bytes at `offset` of `file` with a new pattern (from
/// `seed`), then writes them to the same range of the export and flushes:
/// `file` stays what the export must hold.
fn overwrite_range(daemon: &Daemon, export: &str, file: &Path, offset: u64, length: u64, seed: u8) {
    use std::os::unix::fs::FileExt;
    let bytes: Vec<u8> = (0..length)
        .map(|index| (index / 4096) as u8 ^ seed ^ (index % 251) as u8)
        .collect();
    std::fs::OpenOptions::new()
        .write(true)
        .open(file)
        .expect("open the pattern file")
        .write_all_at(&bytes, offset)
        .expect("write the pattern file");
    rewrite_range(daemon, export, file, offset, length);
}

/// Writes `length` bytes at `offset` of `file` to the same range of an
/// export with `nbdsh`, then flushes.
fn rewrite_range(daemon: &Daemon, export: &str, file: &Path, offset: u64, length: u64) {
    let script = format!(
        "source = open({file:?}, 'rb')\nsource.seek({offset})\nh.pwrite(source.read({length}), {offset})\nh.flush()\n",
        file = file.display().to_string(),
    );
    common::run(
        Command::new("nbdsh")
            .arg("-u")
            .arg(daemon.uri(export))
            .arg("-c")
            .arg(script),
    );
}

/// Another process opens the tier while the daemon demotes into it (as a
/// copy of the pool started by mistake would): the daemon is fenced — its
/// next commit is refused, `pool status` and `/metrics` say so and it
/// stores nothing more in the tier. Opening the pool again is refused (the
/// tier moved on without it) until the operator removes the pool's epoch
/// record; then the pool takes the tier back and every byte reads back.
#[test]
fn another_process_opening_the_tier_fences_the_daemon_and_loses_nothing() {
    let Some(store) = Store::start() else {
        return;
    };
    let setup = Setup::new();
    created(&store.create_pool(&setup, "fenced"));
    let volume_bytes = 160 * MIB;
    let output = store.lamina(
        &setup.data_dir,
        &["volume", "create", "big", &volume_bytes.to_string()],
    );
    assert!(output.status.success(), "{output:?}");
    let daemon = Daemon::start_on_pool(&setup.data_dir, &store.config(), "big");
    let file = setup.root.join("big.pattern");
    pattern_file(&file, volume_bytes, 11);
    write_file(&daemon, "big", &file);
    wait_until("some data is demoted", || {
        capacity_bytes(&setup.data_dir, "big") > 0
    });
    let status = lamina_ok(&daemon.data_dir, &["pool", "status"]);
    let epoch = status["object_tier"]["epoch"].as_u64().unwrap();
    assert!(epoch >= 2, "{status}");
    assert!(
        status["object_tier"]["fenced_by_epoch"].is_null(),
        "{status}"
    );

    let config = store.server.config(
        &format!("s3://{BUCKET}/fenced"),
        lamina_objects::ObjectStoreLimits::default(),
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let intruder = runtime
        .block_on(lamina_objects::ObjectStoreDevice::open(&config))
        .expect("a second process opens the tier");
    assert_eq!(intruder.statistics().epoch, epoch + 1);
    // Reading everything promotes cold blocks, which makes the daemon
    // demote others: its next commit finds the tier taken.
    wait_until("the daemon finds itself fenced", || {
        assert_same(&daemon, "big", &file);
        let status = lamina_ok(&daemon.data_dir, &["pool", "status"]);
        status["object_tier"]["fenced_by_epoch"].as_u64() == Some(epoch + 1)
    });
    assert!(
        daemon.gauge("lamina_object_tier_fenced") == Some(1.0),
        "{}",
        daemon.metrics()
    );
    assert!(
        daemon.log().contains("opened again by another process"),
        "{}",
        daemon.log()
    );
    drop(intruder);
    drop(runtime);
    daemon.kill_hard();

    // The tier moved on without this pool: opening it again is refused,
    // with the way to take it back on purpose.
    let output = store.lamina(&setup.data_dir, &["volume", "list"]);
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{error}");
    assert!(
        error.contains("opened by another process since this pool last used it")
            && error.contains("object-tier-epoch"),
        "{error}"
    );
    // The other process wrote nothing: taking the tier back loses nothing.
    std::fs::remove_file(setup.data_dir.join("object-tier-epoch")).unwrap();
    let daemon = Daemon::start_on_pool(&setup.data_dir, &store.config(), "big");
    assert_same(&daemon, "big", &file);
    let status = lamina_ok(&daemon.data_dir, &["pool", "status"]);
    assert_eq!(
        status["object_tier"]["epoch"].as_u64(),
        Some(epoch + 2),
        "{status}"
    );
    assert!(daemon.terminate().success());
    // Restarted by the same pool: no refusal.
    let daemon = Daemon::start_on_pool(&setup.data_dir, &store.config(), "big");
    assert_same(&daemon, "big", &file);
    assert!(daemon.terminate().success());
}

/// Reads every 4 KiB block of an export with `nbdsh` and compares it with the
/// same block of `file`: each block must be the file's or an I/O error.
/// Returns how many were errors; a block that reads back different fails.
fn count_unreadable_blocks(daemon: &Daemon, export: &str, file: &Path) -> u64 {
    let script = format!(
        "import nbd\nsource = open({file:?}, 'rb').read()\nunreadable = 0\nfor offset in range(0, len(source), 4096):\n    try:\n        block = h.pread(4096, offset)\n    except nbd.Error:\n        unreadable += 1\n        continue\n    assert block == source[offset:offset + 4096], f'block at {{offset}} differs from the file'\nprint(unreadable)\n",
        file = file.display().to_string(),
    );
    let output = Command::new("nbdsh")
        .arg("-u")
        .arg(daemon.uri(export))
        .arg("-c")
        .arg(script)
        .env("PATH", common::system_path())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "nbdsh: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap()
}

/// The flash device and the data directory are lost; `lamina pool restore
/// --from s3://...` onto a new flash file in a new data directory brings the
/// pool back from the bucket alone (decision 0038): every block reads back
/// as written or, where its only copy was on the lost flash, as an I/O error
/// (exactly the `flash_only_bytes` the restore reports); the restored pool
/// takes a whole overwrite and keeps it through `kill -9`. A data directory
/// that already holds a pool is refused.
#[test]
fn a_lost_flash_device_is_restored_from_the_bucket_alone() {
    let Some(store) = Store::start() else {
        return;
    };
    let setup = Setup::new();
    created(&store.create_pool(&setup, "pool-restore"));
    let volume_bytes = 160 * MIB;
    let output = store.lamina(
        &setup.data_dir,
        &["volume", "create", "big", &volume_bytes.to_string()],
    );
    assert!(output.status.success(), "{output:?}");
    let daemon = Daemon::start_on_pool(&setup.data_dir, &store.config(), "big");
    let file = setup.root.join("big.pattern");
    pattern_file(&file, volume_bytes, 11);
    write_file(&daemon, "big", &file);
    wait_until("flash has overflowed into objects", || {
        capacity_bytes(&setup.data_dir, "big") >= volume_bytes - 60 * MIB
    });
    let before = lamina_ok(&daemon.data_dir, &["pool", "status"]);
    let flash_only_before = before["flash_only_bytes"].as_u64().unwrap();
    assert!(flash_only_before > 0, "{before}");
    assert!(daemon.terminate().success());
    std::fs::remove_file(setup.root.join("flash.img")).unwrap();

    // A new machine: a new data directory and a new flash file.
    let new_setup = Setup::new();
    let endpoint = store.server.endpoint();
    let flash = new_setup.device("flash.img");
    let restore = |data_dir: &Path| {
        store.lamina(
            data_dir,
            &[
                "pool",
                "restore",
                "--from",
                &format!("s3://{BUCKET}/pool-restore"),
                "--flash",
                &flash,
                "--s3-endpoint",
                &endpoint,
                "--json",
            ],
        )
    };
    let output = restore(&new_setup.data_dir);
    assert!(
        output.status.success(),
        "pool restore failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let restored: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let lost_blocks = restored["pool"]["integrity"]["blocks_marked_lost"]
        .as_u64()
        .unwrap();
    assert!(lost_blocks * 4096 <= flash_only_before, "{restored}");
    assert_eq!(restored["pool"]["flash_only_bytes"].as_u64(), Some(0));
    assert!(restored["checkpoint_sequence"].as_u64().unwrap() > 0);
    // The point every volume is as of (decision 0056).
    assert!(restored["covered_batch_sequence"].as_u64().unwrap() > 0);

    let daemon = Daemon::start_on_pool(&new_setup.data_dir, &store.config(), "big");
    let unreadable = count_unreadable_blocks(&daemon, "big", &file);
    eprintln!(
        "restored: {unreadable} blocks unreadable, {lost_blocks} marked lost, {flash_only_before} bytes on flash only before"
    );
    assert_eq!(unreadable, lost_blocks);
    let status = lamina_ok(&daemon.data_dir, &["pool", "status"]);
    assert_eq!(
        status["integrity"]["lost_block_reads"].as_u64(),
        Some(unreadable),
        "{status}"
    );
    assert_eq!(
        status["integrity"]["read_checksum_errors"].as_u64(),
        Some(0),
        "{status}"
    );

    // The restored pool takes a whole overwrite and keeps it.
    let second = new_setup.root.join("big.second");
    pattern_file(&second, volume_bytes, 12);
    write_file(&daemon, "big", &second);
    assert_same(&daemon, "big", &second);
    daemon.kill_hard();
    let daemon = Daemon::start_on_pool(&new_setup.data_dir, &store.config(), "big");
    assert_same(&daemon, "big", &second);
    assert!(daemon.terminate().success());

    // Restoring into a data directory that holds a pool is refused.
    let output = restore(&new_setup.data_dir);
    assert!(!output.status.success());
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains("already"), "{error}");
}
