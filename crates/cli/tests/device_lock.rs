//! One process at a time per pool device, end to end: a daemon serves a pool
//! created by `lamina pool create`; a second data directory with a copy of its
//! `pool.toml` (or one naming the device through a symlink or a hard link)
//! must not open the device, neither as a second daemon nor by a CLI command
//! opening the pool directly, and `pool create --force` must not overwrite it.
//! Each refusal names the device and the daemon's PID; the first daemon keeps
//! serving, and its flushed data survives a restart. Pool image files are
//! created owner-only.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod common;

use common::{Daemon, EXIT_TIMEOUT_MS, LAMINA, lamina_error, lamina_ok, run, wait_with_timeout};
use lamina_engine::BLOCK_SIZE_BYTES;
use lamina_engine::log::geometry::FLUSH_MARKER_BLOCKS;

/// The daemon's config: no TCP, frequent background flushes.
const CONFIG: &str = "[server]\ntcp_address = \"\"\n[limits]\nflush_interval_ms = 200\n";

/// Writes `pattern` over the first MiB of `uri` and flushes (qemu-io).
fn write_pattern(uri: &str, pattern: u8, offset_mib: u64) {
    let output = run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        &format!("write -P {pattern:#x} {}M 1M", offset_mib),
        "-c",
        "flush",
        uri,
    ]));
    assert!(output.contains("wrote 1048576"), "{output}");
}

/// Checks that the MiB at `offset_mib` of `uri` holds `pattern` (qemu-io).
fn check_pattern(uri: &str, pattern: u8, offset_mib: u64) {
    let output = run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        &format!("read -P {pattern:#x} {}M 1M", offset_mib),
        uri,
    ]));
    assert!(
        output.contains("read 1048576") && !output.contains("verification failed"),
        "{output}"
    );
}

/// Runs `lamina serve` on `data_dir`, which must refuse to start; its error output.
fn refused_daemon(data_dir: &Path) -> String {
    std::fs::create_dir_all(data_dir).unwrap();
    let config_path = data_dir.with_extension("toml");
    std::fs::write(&config_path, CONFIG).unwrap();
    let log_path = data_dir.with_extension("log");
    let mut child = Command::new(LAMINA)
        .args(["serve", "--data"])
        .arg(data_dir)
        .arg("--config")
        .arg(&config_path)
        .env("LAMINA_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .expect("start the second lamina serve");
    let status = wait_with_timeout(&mut child, EXIT_TIMEOUT_MS);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        status.is_some_and(|status| !status.success()),
        "a second daemon served a device in use ({status:?}): {log}"
    );
    log
}

/// A data directory whose `pool.toml` names `flash` as its flash device.
fn data_dir_naming(data_dir: &Path, flash: &Path) {
    std::fs::create_dir_all(data_dir).unwrap();
    std::fs::write(
        data_dir.join("pool.toml"),
        format!("flash = \"{}\"\n", flash.display()),
    )
    .unwrap();
}

/// Asserts that `error` names `device` and the daemon `pid`.
fn assert_names_device_and_daemon(error: &str, device: &Path, pid: u32) {
    assert!(error.contains(&device.display().to_string()), "{error}");
    assert!(
        error.contains(&format!("in use by process {pid} (")),
        "{error}"
    );
    assert!(error.contains("serve --data"), "{error}");
}

/// A pool created by `lamina pool create` on a 512 MiB file, with a 64 MiB
/// volume `default` holding a flushed pattern, served by a daemon.
struct ServedPool {
    directory: tempfile::TempDir,
    first_dir: PathBuf,
    image: PathBuf,
    daemon: Daemon,
}

impl ServedPool {
    fn start() -> ServedPool {
        let directory = tempfile::tempdir().unwrap();
        let first_dir = directory.path().join("a");
        let image = directory.path().join("pool.img");
        lamina_ok(
            &first_dir,
            &[
                "pool",
                "create",
                "--flash",
                &format!("{}:512M", image.display()),
            ],
        );
        lamina_ok(&first_dir, &["volume", "create", "default", "64M"]);
        let daemon = Daemon::start_on_pool(&first_dir, CONFIG, "default");
        write_pattern(&daemon.uri("default"), 0x11, 0);
        ServedPool {
            directory,
            first_dir,
            image,
            daemon,
        }
    }

    fn root(&self) -> &Path {
        self.directory.path()
    }

    fn pid(&self) -> u32 {
        self.daemon.child.id()
    }

    /// A second data directory with a copy of the first's `pool.toml`.
    fn copied_data_dir(&self) -> PathBuf {
        let second_dir = self.root().join("b");
        std::fs::create_dir_all(&second_dir).unwrap();
        std::fs::copy(
            self.first_dir.join("pool.toml"),
            second_dir.join("pool.toml"),
        )
        .unwrap();
        second_dir
    }

    /// The daemon still serves the flushed pattern, takes another, and both
    /// survive a restart; the temporary directory, for what the test does next.
    fn check_data_survives(self) -> tempfile::TempDir {
        let uri = self.daemon.uri("default");
        check_pattern(&uri, 0x11, 0);
        write_pattern(&uri, 0x22, 1);
        assert!(self.daemon.terminate().success());
        let daemon = Daemon::start_on_pool(&self.first_dir, CONFIG, "default");
        check_pattern(&daemon.uri("default"), 0x11, 0);
        check_pattern(&daemon.uri("default"), 0x22, 1);
        assert!(daemon.terminate().success());
        self.directory
    }
}

#[test]
fn a_second_daemon_on_a_served_device_is_refused_and_the_first_keeps_its_data() {
    let served = ServedPool::start();
    let second_dir = served.copied_data_dir();
    let error = refused_daemon(&second_dir);
    assert_names_device_and_daemon(&error, &served.image, served.pid());
    let _directory = served.check_data_survives();
    // With the daemon gone, the copy opens the pool directly.
    let listed = lamina_ok(&second_dir, &["volume", "list"]);
    assert_eq!(listed[0]["name"], "default", "{listed}");
}

#[test]
fn a_cli_command_on_a_served_device_is_refused_and_pointed_at_the_daemon() {
    let served = ServedPool::start();
    let second_dir = served.copied_data_dir();
    let error = lamina_error(&second_dir, &["volume", "list"]);
    assert_names_device_and_daemon(&error, &served.image, served.pid());
    assert!(
        error.contains(&format!(
            "the pool is in use by the daemon (pid {}); use the daemon",
            served.pid()
        )),
        "{error}"
    );
    // Through the daemon's own data directory the command works.
    let listed = lamina_ok(&served.first_dir, &["volume", "list"]);
    assert_eq!(listed[0]["name"], "default", "{listed}");
    served.check_data_survives();
}

#[test]
fn a_served_device_is_refused_through_a_symlink_and_a_hard_link() {
    let served = ServedPool::start();
    let symlink = served.root().join("symlink.img");
    std::os::unix::fs::symlink(&served.image, &symlink).unwrap();
    let hard_link = served.root().join("hard-link.img");
    std::fs::hard_link(&served.image, &hard_link).unwrap();
    for (name, alias) in [("c", &symlink), ("d", &hard_link)] {
        let alias_dir = served.root().join(name);
        data_dir_naming(&alias_dir, alias);
        let error = lamina_error(&alias_dir, &["pool", "status"]);
        assert_names_device_and_daemon(&error, alias, served.pid());
        let error = refused_daemon(&alias_dir);
        assert_names_device_and_daemon(&error, alias, served.pid());
    }
    served.check_data_survives();
}

#[test]
fn pool_create_over_a_served_device_is_refused_before_it_writes() {
    let served = ServedPool::start();
    let before = std::fs::read(&served.image).unwrap();
    let error = lamina_error(
        &served.root().join("e"),
        &[
            "pool",
            "create",
            "--force",
            "--flash",
            &served.image.display().to_string(),
        ],
    );
    assert_names_device_and_daemon(&error, &served.image, served.pid());
    let changed = changed_blocks(&before, &std::fs::read(&served.image).unwrap());
    assert!(
        changed.is_empty(),
        "a refused pool create changed the device's blocks {changed:?}"
    );
    served.check_data_survives();
}

/// The blocks that differ between two images of the device, but for the
/// flush markers: the serving daemon writes its last flush's marker up to
/// `FLUSH_MARKER_DELAY_US` after that flush (decision 0069), so it may land
/// between the two reads; nothing else of the daemon's writes while it is
/// idle.
fn changed_blocks(before: &[u8], after: &[u8]) -> Vec<u64> {
    assert_eq!(before.len(), after.len(), "the device changed size");
    let block_bytes = usize::try_from(BLOCK_SIZE_BYTES).unwrap();
    before
        .chunks(block_bytes)
        .zip(after.chunks(block_bytes))
        .enumerate()
        .map(|(index, (old, new))| (index as u64, old == new))
        .filter(|(block, same)| !same && !FLUSH_MARKER_BLOCKS.contains(block))
        .map(|(block, _)| block)
        .collect()
}

#[test]
fn pool_images_are_created_owner_only() {
    let directory = tempfile::tempdir().unwrap();
    let root = directory.path();
    let flash = root.join("flash.img");
    let capacity = root.join("capacity.img");
    lamina_ok(
        &root.join("tiers"),
        &[
            "pool",
            "create",
            "--segment-size",
            "1M",
            "--flash",
            &format!("{}:64M", flash.display()),
            "--capacity",
            &format!("{}:256M", capacity.display()),
        ],
    );
    let embedded_dir = root.join("embedded");
    let daemon = Daemon::start_with_pool(&embedded_dir, 256 << 20, 16 << 20);
    assert!(daemon.terminate().success());
    for image in [flash, capacity, embedded_dir.join("pool.img")] {
        let mode = std::fs::metadata(&image).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{image:?} has mode {mode:o}");
    }
}
