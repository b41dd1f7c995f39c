//! The data directory: which device holds the pool (`pool.toml`), the lock that
//! keeps two processes from opening one pool, and opening or creating the pool.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use lamina_device::{BlockDevice, FileDevice, FileDeviceOptions};
use lamina_engine::{Pool, PoolLimits, PoolOptions};
use serde::{Deserialize, Serialize};

pub const POOL_DESCRIPTION_FILE: &str = "pool.toml";
pub const LOCK_FILE: &str = "lock";
pub const ADMIN_SOCKET_FILE: &str = "admin.sock";
pub const EMBEDDED_POOL_FILE: &str = "pool.img";

/// What `pool.toml` records.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolDescription {
    /// The flash device or file holding the pool.
    pub flash: PathBuf,
}

pub fn description_path(data_dir: &Path) -> PathBuf {
    data_dir.join(POOL_DESCRIPTION_FILE)
}

pub fn read_description(data_dir: &Path) -> anyhow::Result<Option<PoolDescription>> {
    let path = description_path(data_dir);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some(toml::from_str(&text).with_context(|| {
            format!("invalid pool description {}", path.display())
        })?)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// An exclusive lock on the data directory, held for the life of the value.
pub struct DirectoryLock {
    _file: File,
}

pub fn lock_directory(data_dir: &Path) -> anyhow::Result<DirectoryLock> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create {}", data_dir.display()))?;
    let path = data_dir.join(LOCK_FILE);
    let file = File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(DirectoryLock { _file: file }),
        Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
            "{} is in use by another lamina process (a running daemon?)",
            data_dir.display()
        ),
        Err(std::fs::TryLockError::Error(error)) => {
            Err(error).with_context(|| format!("cannot lock {}", path.display()))
        }
    }
}

/// Splits `PATH[:SIZE]`.
pub fn parse_device_argument(argument: &str) -> anyhow::Result<(PathBuf, Option<u64>)> {
    match argument.rsplit_once(':') {
        Some((path, size))
            if !size.is_empty() && size.chars().next().is_some_and(|c| c.is_ascii_digit()) =>
        {
            let size = crate::size::parse_size(size).map_err(anyhow::Error::msg)?;
            Ok((PathBuf::from(path), Some(size)))
        }
        _ => Ok((PathBuf::from(argument), None)),
    }
}

fn open_device(
    path: &Path,
    create_size_bytes: Option<u64>,
) -> anyhow::Result<Arc<dyn BlockDevice>> {
    let device = FileDevice::open(
        path,
        FileDeviceOptions {
            create_size_bytes,
            ..FileDeviceOptions::default()
        },
    )
    .with_context(|| format!("cannot open device {}", path.display()))?;
    Ok(Arc::new(device))
}

/// `lamina pool create`: creates the pool on `flash` and records it in `data_dir`.
pub async fn create_pool(
    data_dir: &Path,
    flash: &Path,
    size_bytes: Option<u64>,
    options: PoolOptions,
    limits: PoolLimits,
) -> anyhow::Result<Pool> {
    if let Some(existing) = read_description(data_dir)?
        && !options.force
    {
        anyhow::bail!(
            "{} already describes a pool on {}; use --force to replace it",
            data_dir.display(),
            existing.flash.display()
        );
    }
    let exists = flash.exists();
    if size_bytes.is_none() && !exists {
        anyhow::bail!(
            "{} does not exist; give its size as PATH:SIZE to create a file",
            flash.display()
        );
    }
    let device = open_device(flash, size_bytes)?;
    let pool = Pool::create(device, options, limits).await?;
    let flash = std::fs::canonicalize(flash).unwrap_or_else(|_| flash.to_path_buf());
    let description = PoolDescription { flash };
    std::fs::write(
        description_path(data_dir),
        toml::to_string(&description).expect("pool description serialises"),
    )
    .with_context(|| format!("cannot write {}", description_path(data_dir).display()))?;
    Ok(pool)
}

/// Opens the pool described in `data_dir`.
pub async fn open_pool(data_dir: &Path, limits: PoolLimits) -> anyhow::Result<Pool> {
    let description = read_description(data_dir)?.ok_or_else(|| {
        anyhow::anyhow!(
            "no pool in {} (create one with `lamina pool create --data {} --flash PATH[:SIZE]`, or run `lamina serve` to create the embedded default)",
            data_dir.display(),
            data_dir.display()
        )
    })?;
    let device = open_device(&description.flash, None)?;
    Ok(Pool::open(device, limits).await?)
}
