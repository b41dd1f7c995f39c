//! The files lamina keeps in the data directory, owner-only: how one is
//! created (whatever the umask adds) and how the daemon takes the group's and
//! others' access away from those an older version left open. A module of
//! its own so that the pool's description (`store.rs`), the object tier's
//! epoch record (`object_tier.rs`) and the cache's record all create their
//! files alike without naming each other.

use std::fs::{File, OpenOptions, Permissions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use anyhow::Context;

/// The mode of every file lamina creates in the data directory: owner only.
/// `pool.toml` names the devices the pool opens, so whoever may write it
/// chooses what the daemon writes to; the directory may be entered by
/// `socket_group`'s members (0710), who must not read or write its files.
pub const DATA_FILE_MODE: u32 = 0o600;

/// The mode bits that let the group or others at a file.
const GROUP_AND_OTHER_MODE_BITS: u32 = 0o077;
/// The bits of a mode `chmod` sets (the rest name the file's type).
const PERMISSION_MODE_BITS: u32 = 0o7777;

/// Takes the group's and others' access away from every regular file directly
/// in the data directory: files an older version created with the umask's
/// modes (`pool.toml` 0666 under umask 0) are owner-only from the daemon's
/// next start, not only once rewritten. A file that cannot be changed (another
/// user's) is logged and left.
pub(crate) fn restrict_data_files(data_dir: &Path) -> anyhow::Result<()> {
    let entries = std::fs::read_dir(data_dir)
        .with_context(|| format!("cannot list {}", data_dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot list {}", data_dir.display()))?;
        // Not followed: a symlink's target is not the data directory's file.
        let Ok(metadata) = std::fs::symlink_metadata(entry.path()) else {
            continue;
        };
        let mode = metadata.mode();
        if !metadata.is_file() || mode & GROUP_AND_OTHER_MODE_BITS == 0 {
            continue;
        }
        let owner_only =
            Permissions::from_mode(mode & PERMISSION_MODE_BITS & !GROUP_AND_OTHER_MODE_BITS);
        if let Err(error) = std::fs::set_permissions(entry.path(), owner_only) {
            tracing::warn!(path = %entry.path().display(), %error, "cannot make a file of the data directory owner-only");
        }
    }
    Ok(())
}

/// Opens `path` for writing, emptied, created owner-only whatever the umask
/// adds; a file that already exists (left by an older version, or a crash
/// between creating and renaming a temporary) is made owner-only too, since
/// the mode given at creation does not change it.
pub(crate) fn create_data_file(path: &Path) -> std::io::Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(DATA_FILE_MODE)
        .open(path)?;
    file.set_permissions(Permissions::from_mode(DATA_FILE_MODE))?;
    Ok(file)
}
