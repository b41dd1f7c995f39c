//! `lamina bench fs`: a filesystem on an NBD export, measured with postmark, for lamina
//! and its peers side by side.
//!
//! The export becomes a file through `nbdfuse`, the file a block device through
//! `losetup`, then `mkfs` and `mount` make a filesystem on which postmark runs its
//! small-file workload (create, read, append, delete). This needs root (loop devices
//! and mount) and /dev/fuse; without them the command says so and does nothing.
//! Every step is undone in reverse order, also on error or Ctrl-C.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::process::{ManagedChild, check_interrupted, find_program, run_helper};

/// How long nbdfuse gets to expose the export.
const FUSE_READY_TIMEOUT_MS: u64 = 15_000;

/// The filesystems `fs` can build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Filesystem {
    Ext4,
    Xfs,
}

impl Filesystem {
    fn mkfs(self, device: &str) -> Command {
        let mut command = match self {
            Filesystem::Ext4 => {
                let mut command = Command::new("mkfs.ext4");
                command.args(["-F", "-q"]);
                command
            }
            Filesystem::Xfs => {
                let mut command = Command::new("mkfs.xfs");
                command.args(["-f", "-q"]);
                command
            }
        };
        command.arg(device);
        command
    }

    fn mkfs_program(self) -> &'static str {
        match self {
            Filesystem::Ext4 => "mkfs.ext4",
            Filesystem::Xfs => "mkfs.xfs",
        }
    }
}

/// The filesystem workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum FsWorkload {
    Postmark,
}

/// Errors specific to the filesystem benchmark.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error(
        "lamina bench fs needs root (it attaches loop devices and mounts filesystems); run it as root"
    )]
    NotRoot,
    #[error("lamina bench fs needs `{0}`, which is not installed")]
    MissingProgram(String),
    #[error("/dev/fuse is missing: nbdfuse cannot run here")]
    NoFuse,
    #[error("postmark output has no `{0}` line")]
    PostmarkOutput(String),
}

/// postmark's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PostmarkResult {
    pub transactions_per_second: f64,
    pub created_per_second: f64,
    pub read_per_second: f64,
    pub appended_per_second: f64,
    pub deleted_per_second: f64,
    pub read_megabytes_per_second: f64,
    pub write_megabytes_per_second: f64,
}

/// Checks every precondition of `fs` before anything is started.
pub fn check_preconditions(filesystem: Filesystem) -> Result<(), FsError> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(FsError::NotRoot);
    }
    for program in [
        "nbdfuse",
        "fusermount3",
        "losetup",
        "mount",
        "umount",
        "postmark",
        filesystem.mkfs_program(),
    ] {
        if find_program(program).is_none() {
            return Err(FsError::MissingProgram(program.to_owned()));
        }
    }
    if !Path::new("/dev/fuse").exists() {
        return Err(FsError::NoFuse);
    }
    Ok(())
}

/// The stack built on one export; dropping it unmounts and detaches in reverse order.
struct FsStack {
    fuse_directory: PathBuf,
    mount_directory: PathBuf,
    nbdfuse: Option<ManagedChild>,
    loop_device: Option<String>,
    mounted: bool,
}

impl Drop for FsStack {
    fn drop(&mut self) {
        if self.mounted {
            let mut command = Command::new("umount");
            command.arg(&self.mount_directory);
            if let Err(error) = quiet(command) {
                eprintln!("warning: {error}");
            }
        }
        if let Some(device) = self.loop_device.take() {
            let mut command = Command::new("losetup");
            command.args(["-d", &device]);
            if let Err(error) = quiet(command) {
                eprintln!("warning: {error}");
            }
        }
        if let Some(mut nbdfuse) = self.nbdfuse.take() {
            let mut command = Command::new("fusermount3");
            command.arg("-u").arg(&self.fuse_directory);
            let _ = quiet(command);
            nbdfuse.stop();
        }
    }
}

/// Runs a cleanup command even after an interrupt (run_helper refuses then).
fn quiet(mut command: Command) -> anyhow::Result<()> {
    let description = format!("{command:?}");
    let status = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if !status.success() {
        anyhow::bail!("{description} failed ({status})");
    }
    Ok(())
}

/// Builds `filesystem` on the export at `uri` and runs postmark on it.
pub fn run_postmark_on(
    uri: &str,
    filesystem: Filesystem,
    work_directory: &Path,
    file_count: u32,
    transaction_count: u32,
) -> anyhow::Result<PostmarkResult> {
    let fuse_directory = work_directory.join("fuse");
    let mount_directory = work_directory.join("mnt");
    std::fs::create_dir_all(&fuse_directory)?;
    std::fs::create_dir_all(&mount_directory)?;
    let mut stack = FsStack {
        fuse_directory: fuse_directory.clone(),
        mount_directory: mount_directory.clone(),
        nbdfuse: None,
        loop_device: None,
        mounted: false,
    };
    let pid_file = work_directory.join("nbdfuse.pid");
    let mut command = Command::new("nbdfuse");
    command
        .arg("-P")
        .arg(&pid_file)
        .arg(&fuse_directory)
        .arg(uri)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    stack.nbdfuse = Some(ManagedChild::spawn(command)?);
    let image = fuse_directory.join("nbd");
    let deadline = Instant::now() + Duration::from_millis(FUSE_READY_TIMEOUT_MS);
    while !(pid_file.exists() && image.exists()) {
        check_interrupted()?;
        if let Some(nbdfuse) = stack.nbdfuse.as_mut()
            && let Some(status) = nbdfuse.try_wait()?
        {
            anyhow::bail!("nbdfuse exited ({status}) before exposing {uri}");
        }
        if Instant::now() > deadline {
            anyhow::bail!("nbdfuse did not expose {uri} within {FUSE_READY_TIMEOUT_MS} ms");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut command = Command::new("losetup");
    command.args(["--find", "--show"]).arg(&image);
    let output = run_helper(command)?;
    let device = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    assert!(device.starts_with("/dev/"), "losetup printed {device:?}");
    stack.loop_device = Some(device.clone());
    run_helper(filesystem.mkfs(&device))?;
    let mut command = Command::new("mount");
    command.arg(&device).arg(&mount_directory);
    run_helper(command)?;
    stack.mounted = true;

    let script = format!(
        "set location {}\nset number {file_count}\nset transactions {transaction_count}\nrun\nquit\n",
        mount_directory.display()
    );
    let mut command = Command::new("postmark");
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut postmark = ManagedChild::spawn(command)?;
    {
        use std::io::Write as _;
        let mut stdin = postmark.child_mut().stdin.take().expect("stdin was piped");
        stdin.write_all(script.as_bytes())?;
    }
    let output = postmark.wait()?;
    check_interrupted()?;
    if !output.status.success() {
        anyhow::bail!(
            "postmark failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    drop(stack);
    Ok(parse_postmark(&String::from_utf8_lossy(&output.stdout))?)
}

/// Parses postmark's report (v1.51 layout).
pub fn parse_postmark(output: &str) -> Result<PostmarkResult, FsError> {
    // "N seconds of transactions (R per second)" and "N created (R per second)":
    // the rate is the number after the last "(".
    let rate_of = |needle: &str| -> Result<f64, FsError> {
        output
            .lines()
            .find(|line| line.contains(needle) && line.contains("per second"))
            .and_then(|line| line.rsplit_once('(').map(|(_, rate)| rate.to_owned()))
            .and_then(|rate| rate.split_whitespace().next().map(str::to_owned))
            .and_then(|rate| rate.parse().ok())
            .ok_or_else(|| FsError::PostmarkOutput(needle.trim().to_owned()))
    };
    // "608.66 kilobytes read (608.66 kilobytes per second)".
    let data_rate = |direction: &str| -> Result<f64, FsError> {
        let line = output
            .lines()
            .find(|line| {
                line.contains("bytes") && line.contains(direction) && line.contains("per second")
            })
            .ok_or_else(|| FsError::PostmarkOutput(format!("bytes {direction}")))?;
        let inner = line
            .rsplit_once('(')
            .map(|(_, inner)| inner)
            .ok_or_else(|| FsError::PostmarkOutput(format!("bytes {direction}")))?;
        let mut words = inner.split_whitespace();
        let value: f64 = words
            .next()
            .and_then(|value| value.parse().ok())
            .ok_or_else(|| FsError::PostmarkOutput(format!("bytes {direction}")))?;
        let multiplier = match words.next().unwrap_or("") {
            "bytes" => 1e-6,
            "kilobytes" => 1024.0 / 1e6,
            "megabytes" => 1024.0 * 1024.0 / 1e6,
            "gigabytes" => 1024.0 * 1024.0 * 1024.0 / 1e6,
            _ => return Err(FsError::PostmarkOutput(format!("bytes {direction}"))),
        };
        Ok(value * multiplier)
    };
    Ok(PostmarkResult {
        transactions_per_second: rate_of("seconds of transactions")?,
        created_per_second: rate_of(" created (")?,
        read_per_second: rate_of(" read (")?,
        appended_per_second: rate_of(" appended (")?,
        deleted_per_second: rate_of(" deleted (")?,
        read_megabytes_per_second: data_rate("read")?,
        write_megabytes_per_second: data_rate("written")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUTPUT: &str = include_str!("../tests/data/postmark.txt");

    #[test]
    fn parses_postmark_figures() {
        let result = parse_postmark(OUTPUT).expect("parses");
        assert_eq!(result.transactions_per_second, 200.0);
        assert_eq!(result.created_per_second, 199.0);
        assert_eq!(result.read_per_second, 96.0);
        assert_eq!(result.appended_per_second, 104.0);
        assert_eq!(result.deleted_per_second, 199.0);
        assert!((result.read_megabytes_per_second - 0.62326).abs() < 1e-3);
        assert!((result.write_megabytes_per_second - 1.27926).abs() < 1e-3);
    }

    #[test]
    fn truncated_output_is_an_error() {
        let truncated: String = OUTPUT.lines().take(8).collect::<Vec<_>>().join("\n");
        assert!(matches!(
            parse_postmark(&truncated),
            Err(FsError::PostmarkOutput(_))
        ));
    }
}
