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

use common::{Daemon, LAMINA, Setup, assert_same, lamina_ok, pattern_file, write_file};

const MIB: u64 = 1 << 20;
const BUCKET: &str = "lamina-tests";
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
        let flash = setup.device("flash.img:64M");
        let capacity = format!("s3://{BUCKET}/{prefix}:1G");
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
            "[server]\ntcp_address = \"\"\n[limits]\nmemory_cache_bytes = 0\nflush_interval_ms = 200\n[object_store]\naccess_key_id = {:?}\nsecret_access_key = {:?}\n",
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
