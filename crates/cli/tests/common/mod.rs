//! What the daemon's end-to-end tests share: starting `lamina serve` on a
//! temporary data directory with a small embedded pool, waiting until it serves,
//! its NBD URIs, and stopping it by the PID of the child the test owns (SIGTERM
//! for a clean stop, SIGKILL for a crash), and its log (printed when a test
//! fails); array pools on member files ([`array_pool`]). Each test binary
//! uses a part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub mod array_pool;
pub mod promtool;

#[allow(unused_imports)] // Each test binary uses a part of it.
pub use array_pool::{ArrayMembers, create_array_pool};

pub const LAMINA: &str = env!("CARGO_BIN_EXE_lamina");

/// How long the daemon gets to answer `nbdinfo --size` after it starts.
pub const DAEMON_READY_TIMEOUT_MS: u64 = 30_000;
/// How long a process gets to exit after it was asked to.
pub const EXIT_TIMEOUT_MS: u64 = 10_000;
/// How often the polling loops look again.
pub const POLL_INTERVAL_MS: u64 = 20;

const SIGTERM: i32 = 15;

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, signal: i32) -> i32;
}

/// Waits for `child` to exit for at most `timeout_ms`; `None` if it is still running.
pub fn wait_with_timeout(child: &mut Child, timeout_ms: u64) -> Option<ExitStatus> {
    let deadline = Instant::now() + Duration::from_millis(timeout_ms);
    loop {
        if let Some(status) = child.try_wait().expect("try_wait on a child") {
            return Some(status);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS));
    }
}

/// A `lamina serve` child process; killed when dropped.
pub struct Daemon {
    pub child: Child,
    pub data_dir: PathBuf,
}

impl Daemon {
    /// A 2 GiB embedded pool with a 256 MiB volume `default`, no TCP.
    pub fn start(data_dir: &Path) -> Daemon {
        Self::start_with_pool(data_dir, 2 << 30, 256 << 20)
    }

    pub fn start_with_pool(data_dir: &Path, pool_bytes: u64, volume_bytes: u64) -> Daemon {
        Self::start_with_config(data_dir, pool_bytes, volume_bytes, "")
    }

    /// `extra_limits` are more `[limits]` lines of the daemon's TOML config.
    pub fn start_with_config(
        data_dir: &Path,
        pool_bytes: u64,
        volume_bytes: u64,
        extra_limits: &str,
    ) -> Daemon {
        let config = format!(
            "[server]\ntcp_address = \"\"\n[pool]\nembedded_size_bytes = {pool_bytes}\ndefault_volume_bytes = {volume_bytes}\n[limits]\nflush_interval_ms = 200\n{extra_limits}"
        );
        Self::start_on_pool(data_dir, &config, "default")
    }

    pub fn uri(&self, export: &str) -> String {
        format!(
            "nbd+unix:///{export}?socket={}",
            self.data_dir.join("nbd.sock").display()
        )
    }

    /// Sends SIGTERM and waits for the exit status (bounded).
    pub fn terminate(mut self) -> ExitStatus {
        // SAFETY: kill(2) on the PID of a child this test started and has not reaped.
        unsafe { libc_kill(self.child.id() as i32, SIGTERM) };
        let status = wait_with_timeout(&mut self.child, EXIT_TIMEOUT_MS)
            .expect("lamina serve exits within the time limit after SIGTERM");
        std::mem::forget(self);
        status
    }

    /// SIGKILL: a process crash.
    pub fn kill_hard(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        std::mem::forget(self);
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("lamina serve's log:\n{}", self.log());
        }
    }
}

/// PATH with the system's own directories first: nbdsh needs the system Python
/// with libnbd's bindings, not another Python on PATH.
pub fn system_path() -> String {
    format!(
        "/usr/bin:/bin:{}",
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Runs a client program and returns its standard output; fails the test if it fails.
pub fn run(command: &mut Command) -> String {
    let output = command
        .env("PATH", system_path())
        .output()
        .expect("run client");
    assert!(
        output.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Runs `lamina ARGUMENTS --data DATA_DIR`.
pub fn lamina(data_dir: &Path, arguments: &[&str]) -> std::process::Output {
    Command::new(LAMINA)
        .args(arguments)
        .arg("--data")
        .arg(data_dir)
        .env("LAMINA_LOG", "warn")
        .output()
        .unwrap()
}

/// `lamina ARGUMENTS --json`, which must succeed; its JSON output.
pub fn lamina_ok(data_dir: &Path, arguments: &[&str]) -> serde_json::Value {
    let mut with_json = arguments.to_vec();
    with_json.push("--json");
    let output = lamina(data_dir, &with_json);
    assert!(
        output.status.success(),
        "lamina {arguments:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// `lamina ARGUMENTS`, which must fail; its error output.
pub fn lamina_error(data_dir: &Path, arguments: &[&str]) -> String {
    let output = lamina(data_dir, arguments);
    assert!(
        !output.status.success(),
        "lamina {arguments:?} should have failed"
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

impl Daemon {
    /// `lamina serve` on `data_dir` (a pool created there by `lamina pool
    /// create`, or the embedded default pool the config describes), with
    /// `config` as its whole TOML config; ready once `nbdinfo` reaches the
    /// export `ready_export`.
    pub fn start_on_pool(data_dir: &Path, config: &str, ready_export: &str) -> Daemon {
        Self::start_on_pool_with_environment(data_dir, config, ready_export, &[])
    }

    /// [`Daemon::start_on_pool`] with `environment` (name, value) added to
    /// the daemon's environment.
    pub fn start_on_pool_with_environment(
        data_dir: &Path,
        config: &str,
        ready_export: &str,
        environment: &[(&str, &str)],
    ) -> Daemon {
        let config_path = data_dir.with_extension("toml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(data_dir.with_extension("log")).unwrap();
        let child = Command::new(LAMINA)
            .args(["serve", "--data"])
            .arg(data_dir)
            .arg("--config")
            .arg(&config_path)
            .env("LAMINA_LOG", "warn")
            .envs(environment.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start lamina serve");
        let mut daemon = Daemon {
            child,
            data_dir: data_dir.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_millis(DAEMON_READY_TIMEOUT_MS);
        while !Command::new("nbdinfo")
            .arg("--size")
            .arg(daemon.uri(ready_export))
            .env("PATH", system_path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
        {
            if let Some(status) = daemon.child.try_wait().unwrap() {
                panic!("lamina serve exited before serving: {status}");
            }
            assert!(Instant::now() < deadline, "daemon did not come up");
            std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS * 2));
        }
        daemon
    }

    /// What the daemon has logged so far (warnings and errors: tests run it
    /// with `LAMINA_LOG=warn`), without terminal colour codes.
    pub fn log(&self) -> String {
        let raw = std::fs::read_to_string(self.data_dir.with_extension("log")).unwrap_or_default();
        let mut text = String::with_capacity(raw.len());
        let mut characters = raw.chars();
        while let Some(character) = characters.next() {
            if character == '\u{1b}' {
                // An SGR sequence: ESC [ parameters m.
                for inner in characters.by_ref() {
                    if inner == 'm' {
                        break;
                    }
                }
            } else {
                text.push(character);
            }
        }
        text
    }

    /// The value of an unlabelled gauge on `/metrics`.
    pub fn gauge(&self, name: &str) -> Option<f64> {
        self.metrics().lines().find_map(|line| {
            line.strip_prefix(name)
                .and_then(|rest| rest.strip_prefix(' '))
                .and_then(|value| value.trim().parse().ok())
        })
    }

    /// The admin socket's `/metrics` page (Prometheus text), fetched with a
    /// plain HTTP/1.1 request so that the tests need no HTTP client program.
    pub fn metrics(&self) -> String {
        use std::io::{Read, Write};
        let mut stream =
            std::os::unix::net::UnixStream::connect(self.data_dir.join("admin.sock")).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(EXIT_TIMEOUT_MS)))
            .unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: lamina\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let (head, body) = response
            .split_once("\r\n\r\n")
            .expect("an HTTP response with a body");
        assert!(head.starts_with("HTTP/1.1 200"), "metrics answered {head}");
        body.to_string()
    }
}

/// A temporary directory for a test's devices, with the data directory in it.
pub struct Setup {
    _directory: tempfile::TempDir,
    pub root: PathBuf,
    pub data_dir: PathBuf,
}

impl Setup {
    pub fn new() -> Setup {
        let directory = tempfile::tempdir().unwrap();
        let root = directory.path().to_path_buf();
        let data_dir = root.join("data");
        Setup {
            _directory: directory,
            root,
            data_dir,
        }
    }

    /// `ARGUMENT` with a relative `PATH:SIZE` made absolute in the temporary directory.
    pub fn device(&self, argument: &str) -> String {
        self.root.join(argument).display().to_string()
    }
}

/// The volume `v` read whole with nbdcopy (into `root/copy.img`) equals
/// `expected`.
pub fn assert_volume_reads(daemon: &Daemon, root: &Path, expected: &[u8], phase: &str) {
    let copy = root.join("copy.img");
    let _ = std::fs::remove_file(&copy);
    run(Command::new("nbdcopy").arg(daemon.uri("v")).arg(&copy));
    let copied = std::fs::read(&copy).unwrap();
    assert!(copied == expected, "{phase}: the volume reads back changed");
}

/// A file of `bytes` whose every 4 KiB block is distinct and non-zero (zero
/// blocks could be sent as holes, which would not exercise the tiers).
#[allow(clippy::cast_possible_truncation)]
pub fn pattern_file(path: &Path, bytes: u64, seed: u32) {
    let contents: Vec<u8> = (0..bytes as u32)
        .map(|index| {
            let mixed = index.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13;
            (mixed as u8) | 1
        })
        .collect();
    std::fs::write(path, contents).unwrap();
}

pub fn write_file(daemon: &Daemon, export: &str, file: &Path) {
    run(Command::new("nbdcopy")
        .arg("--flush")
        .arg(file)
        .arg(daemon.uri(export)));
}

/// `qemu-img compare`: whether the export holds `file` (the export is as
/// large as the file in these tests).
pub fn assert_same(daemon: &Daemon, export: &str, file: &Path) {
    let output = Command::new("qemu-img")
        .env("PATH", system_path())
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(file)
        .arg(daemon.uri(export))
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "export {export} differs from {}: {}{}",
        file.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Random bytes over the device file `path` from byte `first_byte` (a
/// multiple of 4 KiB) to its end, under a running daemon. The writes bypass
/// the page cache (O_DIRECT), as the daemon's do: buffered writes racing its
/// direct ones leave stale cached pages, for which Linux fails the next fsync
/// of the file with EIO, the test's and the daemon's.
pub fn overwrite_with_random_bytes_from(path: &Path, first_byte: u64, seed: u64) {
    use rand::{Rng, SeedableRng};
    use std::io::{Seek, SeekFrom, Write};
    use std::os::unix::fs::OpenOptionsExt;
    const ALIGNMENT: usize = 4096;
    const CHUNK_BYTES: usize = 1 << 20;
    let length = std::fs::metadata(path).unwrap().len();
    assert_eq!(
        length % ALIGNMENT as u64,
        0,
        "a device is whole 4 KiB blocks"
    );
    assert_eq!(
        first_byte % ALIGNMENT as u64,
        0,
        "whole blocks are overwritten"
    );
    let mut random = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap();
    file.seek(SeekFrom::Start(first_byte)).unwrap();
    let mut memory = vec![0_u8; CHUNK_BYTES + ALIGNMENT];
    let start = memory.as_ptr().align_offset(ALIGNMENT);
    let chunk = &mut memory[start..start + CHUNK_BYTES];
    let mut written = first_byte;
    while written < length {
        random.fill(&mut chunk[..]);
        let take =
            usize::try_from(length - written).map_or(chunk.len(), |rest| rest.min(chunk.len()));
        file.write_all(&chunk[..take]).unwrap();
        written += take as u64;
    }
    file.sync_all().unwrap();
}
