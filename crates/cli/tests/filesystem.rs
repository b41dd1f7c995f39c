//! A real filesystem on a lamina volume, end to end: `lamina serve` exports a
//! volume, `nbdfuse` turns the export into a file, `losetup` turns the file into
//! a block device, and ext4 lives on it. The test writes files, checks the
//! filesystem with `fsck.ext4`, reads every byte back after a remount, runs
//! postmark on it, stops the daemon with SIGTERM, and proves that the
//! filesystem and its files survived the restart. It needs root, /dev/fuse and
//! loop devices; without them it prints SKIPPED and passes. Everything it
//! creates (mounts, loop devices, nbdfuse, the daemon) is torn down by guards,
//! even when an assertion fails, and only what it created is ever touched.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{Daemon, EXIT_TIMEOUT_MS, LAMINA, POLL_INTERVAL_MS, wait_with_timeout};

/// How long nbdfuse gets to expose the export as a file.
/// Attempts at unmounting a filesystem the kernel reports busy.
const UNMOUNT_ATTEMPTS_MAX: u32 = 50;
/// Pause between two of those attempts.
const UNMOUNT_RETRY_INTERVAL_MS: u64 = 100;
const FUSE_READY_TIMEOUT_MS: u64 = 15_000;
/// How long a helper program (mkfs, fsck, mount, postmark...) may run.
const HELPER_TIMEOUT_MS: u64 = 60_000;
/// How long teardown retries an unmount or detach that reports "busy".
const BUSY_RETRY_TIMEOUT_MS: u64 = 5_000;

unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

/// Runs a helper program to completion with a time limit, feeding it `input`;
/// a helper that hangs is killed (by its PID) so the test fails instead of hanging.
fn run_limited(command: &mut Command, input: Option<&str>) -> Output {
    let description = format!("{command:?}");
    let mut child = command
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("{description} did not start: {error}"));
    if let Some(input) = input {
        let mut stdin = child.stdin.take().expect("stdin was piped");
        stdin
            .write_all(input.as_bytes())
            .expect("write helper input");
    }
    // Pipes are drained on threads so a chatty helper cannot block on a full pipe
    // while this thread waits for it.
    let mut stdout = child.stdout.take().expect("stdout was piped");
    let mut stderr = child.stderr.take().expect("stderr was piped");
    let stdout_reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut bytes).map(|_| bytes)
    });
    let stderr_reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut stderr, &mut bytes).map(|_| bytes)
    });
    let status = match wait_with_timeout(&mut child, HELPER_TIMEOUT_MS) {
        Some(status) => status,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{description} did not finish within {HELPER_TIMEOUT_MS} ms");
        }
    };
    Output {
        status,
        stdout: stdout_reader.join().unwrap().unwrap_or_default(),
        stderr: stderr_reader.join().unwrap().unwrap_or_default(),
    }
}

/// Runs a helper and asserts that it succeeded; returns its stdout.
fn run_ok(command: &mut Command) -> String {
    let description = format!("{command:?}");
    let output = run_limited(command, None);
    assert!(
        output.status.success(),
        "{description} failed ({}): {}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs a cleanup command quietly, retrying while it fails (a device that is
/// still closing reports "busy" for a moment); true when it succeeded.
fn cleanup(program: &str, arguments: &[&str]) -> bool {
    let deadline = Instant::now() + Duration::from_millis(BUSY_RETRY_TIMEOUT_MS);
    loop {
        let succeeded = Command::new(program)
            .args(arguments)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if succeeded {
            return true;
        }
        if Instant::now() > deadline {
            eprintln!(
                "warning: cleanup `{program} {}` failed",
                arguments.join(" ")
            );
            return false;
        }
        std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS * 5));
    }
}

/// `lamina serve` on a data directory with a small embedded pool, Unix socket only.
/// An export as a block device, and optionally a mounted filesystem on it:
/// nbdfuse (a child this test owns), the loop device it attached, the mount
/// point it mounted. Dropping it undoes whatever is still set up, newest first.
struct BlockStack {
    fuse_directory: PathBuf,
    nbdfuse: Option<Child>,
    loop_device: Option<String>,
    mount_point: Option<PathBuf>,
}

impl BlockStack {
    /// Exposes `uri` through nbdfuse under `fuse_directory` and attaches a loop device to it.
    fn attach(uri: &str, fuse_directory: &Path) -> BlockStack {
        std::fs::create_dir_all(fuse_directory).unwrap();
        let nbdfuse = Command::new("nbdfuse")
            .arg(fuse_directory.join("disk"))
            .arg(uri)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start nbdfuse");
        let mut stack = BlockStack {
            fuse_directory: fuse_directory.to_path_buf(),
            nbdfuse: Some(nbdfuse),
            loop_device: None,
            mount_point: None,
        };
        let image = fuse_directory.join("disk");
        let deadline = Instant::now() + Duration::from_millis(FUSE_READY_TIMEOUT_MS);
        // The file appears only once the FUSE mount is live and the export is connected.
        while !std::fs::metadata(&image).is_ok_and(|metadata| metadata.len() > 0) {
            if let Some(status) = stack.nbdfuse.as_mut().unwrap().try_wait().unwrap() {
                panic!("nbdfuse exited ({status}) before exposing {uri}");
            }
            assert!(
                Instant::now() < deadline,
                "nbdfuse did not expose {uri} within {FUSE_READY_TIMEOUT_MS} ms"
            );
            std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS));
        }
        assert_eq!(
            std::fs::metadata(&image).unwrap().len(),
            256 << 20,
            "the file has the size of the volume"
        );
        let device = run_ok(
            Command::new("losetup")
                .args(["--find", "--show", "--direct-io=off"])
                .arg(&image),
        )
        .trim()
        .to_owned();
        assert!(
            device.starts_with("/dev/loop"),
            "losetup printed {device:?}"
        );
        stack.loop_device = Some(device);
        stack
    }

    fn device(&self) -> &str {
        self.loop_device.as_deref().expect("loop device attached")
    }

    fn mount(&mut self, mount_point: &Path, options: &str) {
        assert!(self.mount_point.is_none(), "already mounted");
        std::fs::create_dir_all(mount_point).unwrap();
        run_ok(
            Command::new("mount")
                .args(["-t", "ext4", "-o", options])
                .arg(self.device())
                .arg(mount_point),
        );
        self.mount_point = Some(mount_point.to_path_buf());
    }

    /// Unmounts, retrying while the kernel reports the mount busy: a
    /// process that just exited (postmark, a shell) can hold it for a moment
    /// on a loaded machine. The last attempt must succeed.
    fn unmount(&mut self) {
        let mount_point = self.mount_point.take().expect("mounted");
        for _ in 1..UNMOUNT_ATTEMPTS_MAX {
            let output = run_limited(Command::new("umount").arg(&mount_point), None);
            if output.status.success() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(UNMOUNT_RETRY_INTERVAL_MS));
        }
        run_ok(Command::new("umount").arg(&mount_point));
    }

    /// `fsck.ext4 -n -f` on the (unmounted) device; asserts a clean result.
    fn fsck(&self) -> String {
        assert!(
            self.mount_point.is_none(),
            "fsck runs on an unmounted filesystem"
        );
        let output = run_limited(
            Command::new("fsck.ext4").args(["-n", "-f", self.device()]),
            None,
        );
        let report = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(
            output.status.code(),
            Some(0),
            "fsck.ext4 -n -f found problems: {report}"
        );
        report
    }

    /// Detaches the loop device, unmounts nbdfuse and waits for it to exit,
    /// asserting that each step succeeds.
    fn detach(mut self) {
        assert!(self.mount_point.is_none(), "unmount before detaching");
        let device = self.loop_device.take().expect("loop device attached");
        run_ok(Command::new("losetup").args(["-d", &device]));
        // The loop driver releases its backing file asynchronously after
        // `losetup -d`, so the FUSE unmount may report busy for a moment.
        let fuse_directory = self.fuse_directory.to_string_lossy().into_owned();
        assert!(
            cleanup("fusermount3", &["-u", &fuse_directory]),
            "fusermount3 -u {fuse_directory}"
        );
        let mut nbdfuse = self.nbdfuse.take().expect("nbdfuse running");
        let status = wait_with_timeout(&mut nbdfuse, EXIT_TIMEOUT_MS);
        if status.is_none() {
            let _ = nbdfuse.kill();
            let _ = nbdfuse.wait();
        }
        assert!(
            status.is_some_and(|status| status.success()),
            "nbdfuse exits cleanly after its unmount: {status:?}"
        );
    }
}

impl Drop for BlockStack {
    fn drop(&mut self) {
        if let Some(mount_point) = self.mount_point.take() {
            let mount_point = mount_point.to_string_lossy().into_owned();
            if !cleanup("umount", &[&mount_point]) {
                cleanup("umount", &["-l", &mount_point]);
            }
        }
        if let Some(device) = self.loop_device.take() {
            cleanup("losetup", &["-d", &device]);
        }
        if let Some(mut nbdfuse) = self.nbdfuse.take() {
            let fuse_directory = self.fuse_directory.to_string_lossy().into_owned();
            if !cleanup("fusermount3", &["-u", &fuse_directory]) {
                cleanup("fusermount3", &["-u", "-z", &fuse_directory]);
            }
            if wait_with_timeout(&mut nbdfuse, EXIT_TIMEOUT_MS).is_none() {
                let _ = nbdfuse.kill();
                let _ = nbdfuse.wait();
            }
        }
    }
}

/// Why this machine cannot run the test, if it cannot.
fn missing_prerequisite() -> Option<String> {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    if unsafe { libc_geteuid() } != 0 {
        return Some("not root".to_owned());
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse is missing".to_owned());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("/dev/loop-control is missing".to_owned());
    }
    for program in [
        "nbdinfo",
        "nbdfuse",
        "fusermount3",
        "losetup",
        "mkfs.ext4",
        "fsck.ext4",
        "mount",
        "umount",
        "postmark",
    ] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {program}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if !found {
            return Some(format!("{program} is not installed"));
        }
    }
    None
}

/// Deterministic pseudo-random content (SplitMix64), different for every seed,
/// so that a block landing in the wrong place is detected.
fn content(seed: u64, length: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let mut bytes = Vec::with_capacity(length + 8);
    while bytes.len() < length {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut value = state;
        value = (value ^ (value >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        value = (value ^ (value >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        value ^= value >> 31;
        bytes.extend_from_slice(&value.to_le_bytes());
    }
    bytes.truncate(length);
    bytes
}

/// The files the test writes: relative path and content, about 6 MiB in all,
/// with sizes that are not multiples of a block and one empty file.
fn expected_files() -> Vec<(PathBuf, Vec<u8>)> {
    let sizes = [
        0usize,
        1,
        4095,
        4097,
        65_536 + 123,
        1 << 20,
        (1 << 20) + 777,
        3 * (1 << 20) / 2,
        2 * (1 << 20) + 5,
    ];
    let mut files = Vec::new();
    for (index, size) in sizes.iter().enumerate() {
        let directory = match index % 3 {
            0 => PathBuf::from("alpha"),
            1 => PathBuf::from("beta/nested"),
            _ => PathBuf::from("gamma/deeper/still"),
        };
        files.push((
            directory.join(format!("file-{index}.bin")),
            content(index as u64 + 1, *size),
        ));
    }
    files
}

fn write_files(root: &Path, files: &[(PathBuf, Vec<u8>)]) {
    for (relative, bytes) in files {
        let path = root.join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut file = std::fs::File::create(&path).unwrap();
        file.write_all(bytes).unwrap();
        file.sync_all().unwrap();
    }
}

fn verify_files(root: &Path, files: &[(PathBuf, Vec<u8>)]) {
    for (relative, bytes) in files {
        let read = std::fs::read(root.join(relative))
            .unwrap_or_else(|error| panic!("read {}: {error}", relative.display()));
        assert_eq!(read.len(), bytes.len(), "size of {}", relative.display());
        if let Some(offset) = read.iter().zip(bytes).position(|(a, b)| a != b) {
            panic!(
                "{} differs from what was written at byte {offset}",
                relative.display()
            );
        }
    }
}

fn sync() {
    run_ok(&mut Command::new("sync"));
}

#[test]
fn ext4_on_a_volume_survives_postmark_and_a_daemon_restart() {
    if let Some(reason) = missing_prerequisite() {
        println!("SKIPPED: needs root / /dev/fuse / losetup ({reason})");
        return;
    }
    let directory = tempfile::tempdir().unwrap();
    let data_dir = directory.path().join("data");
    let fuse_directory = directory.path().join("fuse");
    let mount_point = directory.path().join("mnt");
    let files = expected_files();

    let daemon = Daemon::start(&data_dir);
    let uri = daemon.uri("default");
    let mut stack = BlockStack::attach(&uri, &fuse_directory);

    run_ok(Command::new("mkfs.ext4").args(["-F", "-q", stack.device()]));
    stack.mount(&mount_point, "rw");
    write_files(&mount_point, &files);
    sync();
    stack.unmount();
    let report = stack.fsck();
    assert!(
        report.contains("clean") || report.contains("files"),
        "{report}"
    );

    // A fresh nbdfuse and loop device hold none of the written pages in a cache,
    // so every byte read after the remount comes from the daemon over NBD.
    stack.detach();
    let mut stack = BlockStack::attach(&uri, &fuse_directory);
    stack.mount(&mount_point, "rw");
    verify_files(&mount_point, &files);

    // postmark: many small creates, reads, appends and deletes in one directory.
    let postmark_directory = mount_point.join("postmark");
    std::fs::create_dir(&postmark_directory).unwrap();
    let script = format!(
        "set location {}\nset number 500\nset transactions 2000\nrun\nquit\n",
        postmark_directory.display()
    );
    let postmark = run_limited(&mut Command::new("postmark"), Some(&script));
    let postmark_report = String::from_utf8_lossy(&postmark.stdout).into_owned();
    assert!(
        postmark.status.success(),
        "postmark failed ({}): {postmark_report}{}",
        postmark.status,
        String::from_utf8_lossy(&postmark.stderr)
    );
    for summary in [
        "Creating files...Done",
        "Performing transactions",
        "Deleting files...Done",
        "seconds of transactions",
        "created (",
        "deleted (",
        "written (",
    ] {
        assert!(
            postmark_report.contains(summary),
            "postmark summary lacks {summary:?}: {postmark_report}"
        );
    }
    println!("postmark on ext4 on lamina:\n{postmark_report}");
    // postmark deletes its files; the directory must be empty again.
    assert_eq!(std::fs::read_dir(&postmark_directory).unwrap().count(), 0);
    verify_files(&mount_point, &files);
    sync();
    stack.unmount();
    stack.fsck();
    stack.detach();

    let status = daemon.terminate();
    assert!(status.success(), "SIGTERM exits 0: {status:?}");

    // A fresh daemon on the same data directory serves the same filesystem.
    let daemon = Daemon::start(&data_dir);
    let mut stack = BlockStack::attach(&daemon.uri("default"), &fuse_directory);
    stack.fsck();
    stack.mount(&mount_point, "ro");
    verify_files(&mount_point, &files);
    assert_eq!(std::fs::read_dir(&postmark_directory).unwrap().count(), 0);
    stack.unmount();
    stack.detach();
    let status = daemon.terminate();
    assert!(
        status.success(),
        "SIGTERM exits 0 after the restart: {status:?}"
    );
}

/// Allocated bytes of a volume, as `lamina volume list --json` reports them.
fn allocated_bytes(data_dir: &Path, volume: &str) -> u64 {
    let listing = run_ok(
        Command::new(LAMINA)
            .args(["volume", "list", "--json", "--data"])
            .arg(data_dir)
            .env("LAMINA_LOG", "warn"),
    );
    let volumes: serde_json::Value = serde_json::from_str(&listing).unwrap();
    volumes
        .as_array()
        .unwrap()
        .iter()
        .find(|entry| entry["name"] == volume)
        .and_then(|entry| entry["allocated_bytes"].as_u64())
        .expect("volume listed")
}

/// A filesystem's discards reach the engine: fill, delete, `fstrim`, and the
/// volume's allocated space drops accordingly (trim unmaps at once).
#[test]
fn fstrim_gives_a_deleted_file_s_space_back() {
    if let Some(reason) = missing_prerequisite() {
        println!("SKIPPED: needs root / /dev/fuse / losetup ({reason})");
        return;
    }
    let directory = tempfile::tempdir().unwrap();
    let data_dir = directory.path().join("data");
    let mount_point = directory.path().join("mnt");
    // Frequent checkpoints, so that segments emptied by the trim are freed soon.
    let daemon = Daemon::start_with_config(
        &data_dir,
        2 << 30,
        256 << 20,
        "checkpoint_interval_ms = 200\n",
    );
    let mut stack = BlockStack::attach(&daemon.uri("default"), &directory.path().join("fuse"));
    run_ok(Command::new("mkfs.ext4").args(["-F", "-q", stack.device()]));
    stack.mount(&mount_point, "rw");
    let before_fill = allocated_bytes(&data_dir, "default");
    let file = mount_point.join("big");
    std::fs::write(&file, content(7, 128 << 20)).unwrap();
    sync();
    let filled = allocated_bytes(&data_dir, "default");
    let used_filled = pool_used_bytes(&data_dir);
    assert!(
        filled >= before_fill + (120 << 20),
        "writing 128 MiB allocated {} bytes",
        filled - before_fill
    );
    std::fs::remove_file(&file).unwrap();
    sync();
    let trimmed = run_ok(Command::new("fstrim").arg("-v").arg(&mount_point));
    assert!(trimmed.contains("trimmed"), "{trimmed}");
    let after = allocated_bytes(&data_dir, "default");
    assert!(
        after + (100 << 20) <= filled,
        "fstrim freed only {} of 128 MiB ({trimmed})",
        filled.saturating_sub(after)
    );
    // The pool's used space drops too, once checkpoints free the dead segments.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let used = pool_used_bytes(&data_dir);
        if used + (100 << 20) <= used_filled {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "pool used space stayed at {used} bytes after fstrim (was {used_filled})"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    stack.unmount();
    stack.detach();
    assert!(daemon.terminate().success());
}

/// The pool's used bytes, as `lamina pool status --json` reports them.
fn pool_used_bytes(data_dir: &Path) -> u64 {
    let status = run_ok(
        Command::new(LAMINA)
            .args(["pool", "status", "--json", "--data"])
            .arg(data_dir)
            .env("LAMINA_LOG", "warn"),
    );
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    status["used_bytes"].as_u64().expect("used_bytes")
}
