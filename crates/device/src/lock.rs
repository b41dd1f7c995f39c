//! The exclusive claim a process holds on a device for as long as it has the
//! device open, so that two processes never write one device (each would
//! overwrite the other's log and lose flushed data). The claim is a
//! `flock(LOCK_EX|LOCK_NB)` on a descriptor of its own, plus `O_EXCL` for
//! block devices (Linux gives that exclusive-open semantics, which also refuses
//! a mounted device). flock follows the inode, so the same file reached through
//! a symlink, a hard link or a bind mount is covered. When the claim is refused,
//! the holder is found in `/proc/locks` by the device's inode, so that the error
//! can say which process to look at.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::DeviceErrorKind;

/// Where Linux lists every file lock held on the machine, with the holder's PID
/// and the locked inode.
const PROC_LOCKS_PATH: &str = "/proc/locks";

/// The permissions of a file lamina creates to hold a pool: owner only, since it
/// holds every volume's data.
pub const CREATED_FILE_MODE: u32 = 0o600;

/// The process that holds a device (or any file) locked, as far as `/proc`
/// tells.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockHolder {
    pub pid: u32,
    /// Its arguments, from `/proc/PID/cmdline`; empty when unreadable.
    pub command_line: Vec<String>,
}

impl LockHolder {
    /// Whether the holder is a `lamina serve` daemon, which answers for the
    /// pool on its admin socket.
    pub fn is_lamina_daemon(&self) -> bool {
        let program_is_lamina = self.command_line.first().is_some_and(|program| {
            Path::new(program)
                .file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with("lamina"))
        });
        program_is_lamina && self.command_line.iter().any(|argument| argument == "serve")
    }
}

impl fmt::Display for LockHolder {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.pid == std::process::id() {
            write!(formatter, "this process (pid {})", self.pid)?;
        } else {
            write!(formatter, "process {}", self.pid)?;
        }
        if !self.command_line.is_empty() {
            let quoted: Vec<String> = self.command_line.iter().map(|a| quoted(a)).collect();
            write!(formatter, " ({})", quoted.join(" "))?;
        }
        Ok(())
    }
}

/// An argument as a shell would need it: in single quotes when it is empty or
/// holds anything but the characters of ordinary paths and options.
fn quoted(argument: &str) -> String {
    let plain = !argument.is_empty()
        && argument
            .chars()
            .all(|character| character.is_alphanumeric() || "/._-=:,+@%".contains(character));
    if plain {
        argument.to_string()
    } else {
        format!("'{}'", argument.replace('\'', "'\\''"))
    }
}

/// The message of [`DeviceErrorKind::InUse`].
pub(crate) fn in_use_message(holder: &Option<LockHolder>) -> String {
    let holder = holder
        .as_ref()
        .map_or_else(|| "another process".to_string(), LockHolder::to_string);
    format!("in use by {holder}: a device is opened by one process at a time")
}

/// An open descriptor holding the claim on one device; dropping it releases
/// the claim.
#[derive(Debug)]
pub(crate) struct DeviceLock {
    file: File,
}

impl DeviceLock {
    /// Opens and claims `path`. With `create_size_bytes`, a missing file is
    /// created owner-only and an empty regular file is given that size (sparse),
    /// only once the claim is held, so that nothing is written to a device
    /// another process owns.
    pub(crate) fn acquire(
        path: &Path,
        create_size_bytes: Option<u64>,
    ) -> Result<Self, DeviceErrorKind> {
        let block_device =
            std::fs::metadata(path).is_ok_and(|metadata| metadata.file_type().is_block_device());
        let mut options = OpenOptions::new();
        options.read(true).write(true);
        if create_size_bytes.is_some() {
            options.create(true).mode(CREATED_FILE_MODE);
        }
        if block_device {
            options.custom_flags(libc::O_EXCL);
        }
        let file = match options.open(path) {
            Ok(file) => file,
            Err(error) if block_device && error.raw_os_error() == Some(libc::EBUSY) => {
                return Err(DeviceErrorKind::InUse {
                    holder: find_flock_holder(path),
                });
            }
            Err(error) => return Err(DeviceErrorKind::Open(error)),
        };
        // SAFETY: flock on a descriptor this function owns; it touches no memory.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let error = io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(DeviceErrorKind::Io(error));
            }
            let holder = file
                .metadata()
                .ok()
                .and_then(|metadata| holder_of_inode(&InodeIdentity::of(&metadata)));
            return Err(DeviceErrorKind::InUse { holder });
        }
        if let Some(size_bytes) = create_size_bytes {
            let metadata = file.metadata()?;
            if metadata.file_type().is_file() && metadata.len() == 0 {
                file.set_len(size_bytes)?;
            }
        }
        Ok(Self { file })
    }

    /// Checks that `other` (a descriptor for I/O, opened by path after the
    /// claim) is the claimed file, not one swapped in under the same name.
    pub(crate) fn check_same_file(&self, other: &File) -> io::Result<()> {
        let claimed = InodeIdentity::of(&self.file.metadata()?);
        if InodeIdentity::of(&other.metadata()?) == claimed {
            Ok(())
        } else {
            Err(io::Error::other(
                "the path was replaced by another file while the device was being opened",
            ))
        }
    }
}

/// What `/proc/locks` identifies a locked file by: the major and minor number of
/// the filesystem's device and the inode number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct InodeIdentity {
    major: u32,
    minor: u32,
    inode: u64,
}

impl InodeIdentity {
    fn of(metadata: &std::fs::Metadata) -> Self {
        let device = metadata.dev();
        Self {
            major: libc::major(device),
            minor: libc::minor(device),
            inode: metadata.ino(),
        }
    }
}

/// The process holding an flock on the file at `path` (following symlinks),
/// or `None` when none can be found (no lock, no `/proc`, or a holder in
/// another PID namespace).
pub fn find_flock_holder(path: &Path) -> Option<LockHolder> {
    let metadata = std::fs::metadata(path).ok()?;
    holder_of_inode(&InodeIdentity::of(&metadata))
}

fn holder_of_inode(identity: &InodeIdentity) -> Option<LockHolder> {
    let locks = std::fs::read_to_string(PROC_LOCKS_PATH).ok()?;
    let pid = flock_holder_in(&locks, identity)?;
    Some(LockHolder {
        pid,
        command_line: command_line(pid),
    })
}

/// The PID of the granted FLOCK lock on `identity` in the text of
/// `/proc/locks`, whose lines read `1: FLOCK  ADVISORY  WRITE 1234
/// fe:01:5398560 0 EOF` (major and minor in hex, the inode in decimal); lines
/// of waiters (`1: -> FLOCK ...`) are skipped.
fn flock_holder_in(locks: &str, identity: &InodeIdentity) -> Option<u32> {
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [_, kind, _, _, pid, file, ..] = fields.as_slice() else {
            return None;
        };
        if *kind != "FLOCK" {
            return None;
        }
        let mut parts = file.split(':');
        let major = u32::from_str_radix(parts.next()?, 16).ok()?;
        let minor = u32::from_str_radix(parts.next()?, 16).ok()?;
        let inode: u64 = parts.next()?.parse().ok()?;
        let found = InodeIdentity {
            major,
            minor,
            inode,
        };
        // A holder outside this PID namespace shows as 0 or -1, which names nobody.
        let pid: u32 = pid.parse().ok().filter(|pid| *pid > 0)?;
        (found == *identity).then_some(pid)
    })
}

/// The arguments of process `pid`, or none when `/proc/PID/cmdline` is not
/// readable (another user's process under hidepid) or empty (a zombie).
fn command_line(pid: u32) -> Vec<String> {
    let Ok(bytes) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return Vec::new();
    };
    // Each argument ends with a NUL; an empty argument is an empty piece.
    let Some(arguments) = bytes.strip_suffix(&[0]) else {
        return Vec::new();
    };
    arguments
        .split(|byte| *byte == 0)
        .map(|argument| String::from_utf8_lossy(argument).into_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCKS: &str = "\
1: POSIX  ADVISORY  WRITE 700 fe:01:42 0 EOF
2: FLOCK  ADVISORY  WRITE 15279 fe:01:5398560 0 EOF
2: -> FLOCK  ADVISORY  WRITE 15300 fe:01:5398560 0 EOF
3: FLOCK  ADVISORY  WRITE 901 103:02:42 0 EOF
4: FLOCK  ADVISORY  WRITE -1 fe:01:77 0 EOF
";

    fn identity(major: u32, minor: u32, inode: u64) -> InodeIdentity {
        InodeIdentity {
            major,
            minor,
            inode,
        }
    }

    #[test]
    fn proc_locks_lines_name_the_flock_holder_of_an_inode() {
        assert_eq!(
            flock_holder_in(LOCKS, &identity(0xfe, 1, 5398560)),
            Some(15279)
        );
        // Major and minor are hex; the same inode number on another filesystem is
        // another file.
        assert_eq!(flock_holder_in(LOCKS, &identity(0x103, 2, 42)), Some(901));
        assert_eq!(flock_holder_in(LOCKS, &identity(0xfe, 2, 5398560)), None);
        // POSIX locks do not conflict with flock; a holder in another namespace
        // names nobody.
        assert_eq!(flock_holder_in(LOCKS, &identity(0xfe, 1, 42)), None);
        assert_eq!(flock_holder_in(LOCKS, &identity(0xfe, 1, 77)), None);
    }

    #[test]
    fn a_holder_reads_as_a_process_and_knows_a_daemon() {
        let daemon = LockHolder {
            pid: 1,
            command_line: vec![
                "/usr/local/bin/lamina".to_string(),
                "serve".to_string(),
                "--data".to_string(),
                "/srv/a".to_string(),
            ],
        };
        assert!(daemon.is_lamina_daemon());
        assert_eq!(
            daemon.to_string(),
            "process 1 (/usr/local/bin/lamina serve --data /srv/a)"
        );
        let quoting = LockHolder {
            pid: 1,
            command_line: vec![
                "lamina".to_string(),
                "--tcp-address".to_string(),
                String::new(),
                "it's".to_string(),
            ],
        };
        assert_eq!(
            quoting.to_string(),
            "process 1 (lamina --tcp-address '' 'it'\\''s')"
        );
        let cli = LockHolder {
            pid: 1,
            command_line: vec!["lamina".to_string(), "volume".to_string()],
        };
        assert!(!cli.is_lamina_daemon());
        assert!(
            in_use_message(&None).starts_with("in use by another process"),
            "{}",
            in_use_message(&None)
        );
    }

    #[test]
    fn a_second_claim_on_one_file_is_refused_with_the_holder_until_the_first_is_dropped() {
        let directory = tempfile::tempdir().expect("temp dir");
        let path = directory.path().join("device");
        let first = DeviceLock::acquire(&path, Some(1 << 20)).expect("first claim");
        let symlink = directory.path().join("symlink");
        std::os::unix::fs::symlink(&path, &symlink).expect("symlink");
        let hard_link = directory.path().join("hard-link");
        std::fs::hard_link(&path, &hard_link).expect("hard link");
        for alias in [&path, &symlink, &hard_link] {
            match DeviceLock::acquire(alias, None) {
                Err(DeviceErrorKind::InUse { holder }) => {
                    let holder = holder.expect("the holder is found in /proc/locks");
                    assert_eq!(holder.pid, std::process::id(), "{alias:?}");
                    assert!(!holder.command_line.is_empty());
                }
                other => panic!("a second claim through {alias:?} was not refused: {other:?}"),
            }
        }
        drop(first);
        DeviceLock::acquire(&symlink, None).expect("the claim is free once dropped");
    }
}
