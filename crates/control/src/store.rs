//! The data directory: which devices hold the pool (`pool.toml`: the flash
//! device, and in a two-tier pool the capacity device, each optionally behind a
//! rotating-disk model), the lock that keeps two processes from using one data
//! directory, and opening or creating the pool. Two data directories may
//! describe the same devices (a copied `pool.toml`); what keeps two processes
//! from opening one pool is the device layer's claim on each device, taken by
//! `FileDevice::open` and held while the pool is open.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use lamina_device::{
    BlockDevice, ConcatenatedDevice, DeviceError, DeviceErrorKind, FileDevice, FileDeviceOptions,
    LockHolder, RotatingDiskDevice, RotatingDiskModel, find_flock_holder,
};
use lamina_engine::{BLOCK_SIZE_BYTES, Pool, PoolLimits, PoolOptions};
use serde::{Deserialize, Serialize};

pub const POOL_DESCRIPTION_FILE: &str = "pool.toml";
pub const LOCK_FILE: &str = "lock";
pub const ADMIN_SOCKET_FILE: &str = "admin.sock";
pub const EMBEDDED_POOL_FILE: &str = "pool.img";

pub use crate::data_files::DATA_FILE_MODE;
pub(crate) use crate::data_files::{create_data_file, restrict_data_files};

/// The device model name meaning "no model": the device's own timing.
pub const NO_DEVICE_MODEL: &str = "none";
/// The built-in rotating-disk model: [`RotatingDiskModel::default`], a 7,200 rpm
/// SATA capacity disk.
pub const HDD_7200_DEVICE_MODEL: &str = "hdd-7200";
/// The model names `lamina pool create` accepts (a config may define more).
pub const BUILT_IN_DEVICE_MODELS: [&str; 2] = [NO_DEVICE_MODEL, HDD_7200_DEVICE_MODEL];

/// A pool with the arrays (or the object tier) it runs on (none for plain
/// devices).
#[derive(Clone)]
pub struct OpenedPool {
    pub pool: Pool,
    pub layout: crate::layout::PoolLayout,
}

/// What `pool.toml` records. Files written before two-tier pools hold only
/// `flash`; every other field is optional so that they still read.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolDescription {
    /// The flash device or file holding the pool (its first tier).
    pub flash: PathBuf,
    /// The latency model the flash device runs behind (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flash_model: Option<String>,
    /// The capacity device of a two-tier pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<PathBuf>,
    /// The latency model the capacity device runs behind (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_model: Option<String>,
    /// An array pool's flash devices, where they were last seen (the array
    /// finds each one's place from its label); empty for one device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flash_devices: Vec<PathBuf>,
    /// An array pool's capacity devices.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capacity_devices: Vec<PathBuf>,
    /// An array pool's redundancy (`none`, `mirror`, `raid5`, `raid6`);
    /// absent for a pool on one device per tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redundancy: Option<String>,
    /// A capacity tier on S3-compatible object storage (in place of a
    /// capacity device): where it is, never the credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_object_store: Option<crate::object_tier::ObjectTierDescription>,
}

/// A device model name that is neither built in nor defined in the config.
#[derive(Debug, thiserror::Error)]
pub enum DeviceModelError {
    #[error(
        "unknown device model {name:?} (known: {known}; more can be defined under [disk_models.NAME] in the daemon's config)"
    )]
    Unknown { name: String, known: String },
    #[error("device model {name:?} is invalid: {reason}")]
    Invalid { name: String, reason: String },
}

/// How each tier's devices open. Which latency model each runs behind: the
/// models named in `pool.toml`, unless the daemon's config overrides them, with
/// the parameters of named models (the built-in `hdd-7200`, replaced or joined
/// by the config's `[disk_models.NAME]` tables); and an object tier's
/// settings from the config.
#[derive(Clone, Debug, Default)]
pub struct DeviceModels {
    /// Replaces the flash model recorded in `pool.toml`.
    pub flash_override: Option<String>,
    /// Replaces the capacity model recorded in `pool.toml`.
    pub capacity_override: Option<String>,
    /// Named rotating-disk models beyond (or replacing) the built-in ones.
    pub definitions: BTreeMap<String, RotatingDiskModel>,
    /// What an object tier needs beyond `pool.toml` (the config's
    /// `[object_store]`: credentials, overrides, limits).
    pub object_store: crate::object_tier::ObjectStoreSection,
}

impl DeviceModels {
    /// The parameters `name` stands for; `None` for `none`.
    pub fn resolve(&self, name: &str) -> Result<Option<RotatingDiskModel>, DeviceModelError> {
        if name == NO_DEVICE_MODEL {
            return Ok(None);
        }
        let model = if let Some(model) = self.definitions.get(name) {
            model.clone()
        } else if name == HDD_7200_DEVICE_MODEL {
            RotatingDiskModel::default()
        } else {
            let mut known: Vec<&str> = BUILT_IN_DEVICE_MODELS.to_vec();
            known.extend(self.definitions.keys().map(String::as_str));
            return Err(DeviceModelError::Unknown {
                name: name.to_string(),
                known: known.join(", "),
            });
        };
        validate_model(name, &model)?;
        Ok(Some(model))
    }
}

/// The checks `RotatingDiskDevice::new` asserts, as an operating error: a
/// config file is input, not code.
fn validate_model(name: &str, model: &RotatingDiskModel) -> Result<(), DeviceModelError> {
    let reason = if model.rotation_rpm == 0 {
        "rotation_rpm must be positive"
    } else if model.transfer_bytes_per_second == 0 {
        "transfer_bytes_per_second must be positive"
    } else if model.queue_depth_max == 0 {
        "queue_depth_max must be positive"
    } else if !(model.seek_track_to_track_ms >= 0.0 && model.seek_full_stroke_ms >= 0.0) {
        "seek times must not be negative"
    } else {
        return Ok(());
    };
    Err(DeviceModelError::Invalid {
        name: name.to_string(),
        reason: reason.to_string(),
    })
}

/// `none` is recorded as no model at all.
pub(crate) fn recorded_model(name: Option<&str>) -> Option<String> {
    name.filter(|name| *name != NO_DEVICE_MODEL)
        .map(str::to_string)
}

/// One tier's device for `pool create`.
#[derive(Clone, Debug)]
pub struct TierDevice {
    pub path: PathBuf,
    /// Create (or extend an empty) file of this size; required when `path`
    /// does not exist.
    pub create_size_bytes: Option<u64>,
    /// A model name (`none`, `hdd-7200`); `None` is `none`.
    pub model: Option<String>,
}

impl TierDevice {
    /// From a `PATH[:SIZE]` argument and an optional model name.
    pub fn from_argument(argument: &str, model: Option<&str>) -> anyhow::Result<Self> {
        let (path, create_size_bytes) = parse_device_argument(argument)?;
        Ok(Self {
            path,
            create_size_bytes,
            model: model.map(str::to_string),
        })
    }
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

/// Another process holds the data directory's lock.
#[derive(Debug, thiserror::Error)]
#[error("{} is in use by {} (a running daemon?)", data_dir.display(), holder_text(holder))]
pub struct DirectoryInUse {
    pub data_dir: PathBuf,
    /// Who holds it, when `/proc/locks` says.
    pub holder: Option<LockHolder>,
}

/// `pool create` refused: the data directory already describes a pool (the
/// CLI adds which flag replaces it).
#[derive(Debug, thiserror::Error)]
#[error(
    "{} already describes a pool on {}; it is replaced only when forced",
    data_dir.display(),
    flash.display()
)]
pub struct PoolAlreadyDescribed {
    pub data_dir: PathBuf,
    /// The flash device of the pool it describes.
    pub flash: PathBuf,
}

/// `pool create` over a data directory that already describes a pool is
/// refused unless forced.
pub(crate) fn refuse_if_described(data_dir: &Path, force: bool) -> anyhow::Result<()> {
    match read_description(data_dir)? {
        Some(existing) if !force => Err(PoolAlreadyDescribed {
            data_dir: data_dir.to_path_buf(),
            flash: existing.flash,
        }
        .into()),
        _ => Ok(()),
    }
}

fn holder_text(holder: &Option<LockHolder>) -> String {
    holder.as_ref().map_or_else(
        || "another lamina process".to_string(),
        LockHolder::to_string,
    )
}

pub fn lock_directory(data_dir: &Path) -> anyhow::Result<DirectoryLock> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create {}", data_dir.display()))?;
    let path = data_dir.join(LOCK_FILE);
    let file =
        create_data_file(&path).with_context(|| format!("cannot create {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(DirectoryLock { _file: file }),
        Err(std::fs::TryLockError::WouldBlock) => Err(DirectoryInUse {
            data_dir: data_dir.to_path_buf(),
            holder: find_flock_holder(&path),
        }
        .into()),
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

pub(crate) fn open_device(
    path: &Path,
    create_size_bytes: Option<u64>,
) -> anyhow::Result<Arc<dyn BlockDevice>> {
    let options = FileDeviceOptions {
        create_size_bytes,
        ..FileDeviceOptions::default()
    };
    match FileDevice::open(path, options) {
        Ok(device) => Ok(Arc::new(device)),
        // The error names the device and its holder already.
        Err(
            error @ DeviceError {
                kind: DeviceErrorKind::InUse { .. },
                ..
            },
        ) => Err(error.into()),
        // The error names the device and says why it did not open; add
        // what to do about it.
        Err(
            error @ DeviceError {
                kind: DeviceErrorKind::Open(_),
                ..
            },
        ) => {
            let advice = match create_size_bytes {
                Some(_) => "create its directory first, or give another path",
                None => {
                    "the pool's description (pool.toml in the data directory) names it: attach it again, or correct the path there"
                }
            };
            Err(anyhow::anyhow!("{error}; {advice}"))
        }
        Err(error) => Err(error).with_context(|| format!("cannot open device {}", path.display())),
    }
}

/// A tier's device, behind its latency model when it has one.
fn open_tier_device(
    path: &Path,
    create_size_bytes: Option<u64>,
    model: Option<RotatingDiskModel>,
) -> anyhow::Result<Arc<dyn BlockDevice>> {
    Ok(behind_model(open_device(path, create_size_bytes)?, model))
}

pub(crate) fn behind_model(
    device: Arc<dyn BlockDevice>,
    model: Option<RotatingDiskModel>,
) -> Arc<dyn BlockDevice> {
    match model {
        Some(model) => Arc::new(RotatingDiskDevice::new(device, model)),
        None => device,
    }
}

/// A pool `create_tiered_pool` made, with its flash device as opened (without
/// a model), so that the pool can be opened again on the same device, whose
/// claim this process keeps.
struct CreatedPool {
    pool: Pool,
    bare_flash: Arc<dyn BlockDevice>,
}

/// `lamina pool create` on one flash device: creates the pool and records it
/// in `data_dir`.
pub async fn create_pool(
    data_dir: &Path,
    flash: &Path,
    size_bytes: Option<u64>,
    options: PoolOptions,
    limits: PoolLimits,
) -> anyhow::Result<Pool> {
    let flash = TierDevice {
        path: flash.to_path_buf(),
        create_size_bytes: size_bytes,
        model: None,
    };
    create_tiered_pool(data_dir, &flash, None, options, limits).await
}

/// The daemon's embedded default pool: a sparse file of `size_bytes` at
/// `flash`, created on the bare file (a model's latencies would only slow
/// creation down), then, when `models` puts flash behind a model, closed and
/// opened again behind it on the same open device: opening the file anew could
/// find the first open's claim not yet released.
pub async fn create_embedded_pool(
    data_dir: &Path,
    flash: &Path,
    size_bytes: u64,
    limits: PoolLimits,
    models: &DeviceModels,
) -> anyhow::Result<Pool> {
    let model = models
        .resolve(models.flash_override.as_deref().unwrap_or(NO_DEVICE_MODEL))
        .context("the flash tier's device model")?;
    let flash = TierDevice {
        path: flash.to_path_buf(),
        create_size_bytes: Some(size_bytes),
        model: None,
    };
    let created = create_described_pool(
        data_dir,
        &flash,
        None,
        PoolOptions::default(),
        limits.clone(),
    )
    .await?;
    let Some(model) = model else {
        return Ok(created.pool);
    };
    created
        .pool
        .close()
        .await
        .context("closing the new embedded pool")?;
    drop(created.pool);
    let device = behind_model(created.bare_flash, Some(model));
    Ok(Pool::open(device, limits).await?)
}

/// `lamina pool create`: creates the pool on `flash` (and `capacity`, for a
/// two-tier pool), each behind its model, and records it in `data_dir`. Model
/// names are the built-in ones. Files this call creates are owner-only, and are
/// removed again when it fails; each device is claimed before anything is
/// written to it, so a device another process has open is refused untouched.
pub async fn create_tiered_pool(
    data_dir: &Path,
    flash: &TierDevice,
    capacity: Option<&TierDevice>,
    options: PoolOptions,
    limits: PoolLimits,
) -> anyhow::Result<Pool> {
    Ok(
        create_described_pool(data_dir, flash, capacity, options, limits)
            .await?
            .pool,
    )
}

async fn create_described_pool(
    data_dir: &Path,
    flash: &TierDevice,
    capacity: Option<&TierDevice>,
    options: PoolOptions,
    limits: PoolLimits,
) -> anyhow::Result<CreatedPool> {
    refuse_if_described(data_dir, options.force)?;
    check_segment_size(options.segment_size_bytes)?;
    let models = DeviceModels::default();
    let tiers: Vec<(&str, &TierDevice)> = std::iter::once(("flash", flash))
        .chain(capacity.map(|capacity| ("capacity", capacity)))
        .collect();
    let mut resolved_models = Vec::new();
    for (tier, device) in &tiers {
        if device.create_size_bytes.is_none() && !device.path.exists() {
            anyhow::bail!(
                "the {tier} device {} does not exist; give its size as PATH:SIZE to create a file",
                device.path.display()
            );
        }
        resolved_models.push(
            models
                .resolve(device.model.as_deref().unwrap_or(NO_DEVICE_MODEL))
                .with_context(|| format!("the {tier} device {}", device.path.display()))?,
        );
    }
    if let Some(capacity) = capacity
        && same_file(&flash.path, &capacity.path)
    {
        anyhow::bail!(
            "the flash and capacity tiers must be different devices (both are {})",
            flash.path.display()
        );
    }
    let created: Vec<PathBuf> = tiers
        .iter()
        .filter(|(_, device)| !device.path.exists())
        .map(|(_, device)| device.path.clone())
        .collect();
    let result = create_on_devices(&tiers, resolved_models, options, limits).await;
    let created_pool = match result {
        Ok(created_pool) => created_pool,
        Err(error) => {
            for path in created {
                let _ = std::fs::remove_file(path);
            }
            return Err(error);
        }
    };
    let canonical =
        |path: &Path| std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let description = PoolDescription {
        flash: canonical(&flash.path),
        flash_model: recorded_model(flash.model.as_deref()),
        capacity: capacity.map(|capacity| canonical(&capacity.path)),
        capacity_model: capacity.and_then(|capacity| recorded_model(capacity.model.as_deref())),
        flash_devices: Vec::new(),
        capacity_devices: Vec::new(),
        redundancy: None,
        capacity_object_store: None,
    };
    write_description(data_dir, &description)?;
    Ok(created_pool)
}

/// `lamina pool create --capacity s3://...`: the pool on `flash` with its
/// capacity tier on object storage. The tier is created first (refused when
/// its prefix already holds one), then the pool; a flash file this call
/// created is removed again when it fails.
pub async fn create_object_tier_pool(
    data_dir: &Path,
    flash: &TierDevice,
    object_tier: &crate::object_tier::ObjectTierDescription,
    object_tier_size_bytes: u64,
    object_store: &crate::object_tier::ObjectStoreSection,
    options: PoolOptions,
    limits: PoolLimits,
) -> anyhow::Result<OpenedPool> {
    refuse_if_described(data_dir, options.force)?;
    check_segment_size(options.segment_size_bytes)?;
    let flash_model = DeviceModels::default()
        .resolve(flash.model.as_deref().unwrap_or(NO_DEVICE_MODEL))
        .with_context(|| format!("the flash device {}", flash.path.display()))?;
    if flash.create_size_bytes.is_none() && !flash.path.exists() {
        anyhow::bail!(
            "the flash device {} does not exist; give its size as PATH:SIZE to create a file",
            flash.path.display()
        );
    }
    let created_flash = !flash.path.exists();
    let tier = ObjectTierCreation {
        data_dir,
        description: object_tier,
        size_bytes: object_tier_size_bytes,
        section: object_store,
    };
    let opened = match create_over_object_tier(flash, flash_model, &tier, options, limits).await {
        Ok(opened) => opened,
        Err(error) => {
            if created_flash {
                let _ = std::fs::remove_file(&flash.path);
            }
            return Err(error);
        }
    };
    let description = object_tier_pool_description(flash, object_tier);
    write_description(data_dir, &description)?;
    Ok(opened)
}

/// `lamina pool restore --from s3://...`: a pool whose flash device is
/// lost, restored onto a new one from its object tier (decision 0038). The
/// new flash device is created at the lost one's size when it does not
/// exist, and must have exactly that size when it does; the data directory
/// must not describe a pool yet. Opening the tier takes a new epoch, so that
/// a process still writing it from the lost flash is fenced.
pub async fn restore_object_tier_pool(
    data_dir: &Path,
    flash: &TierDevice,
    object_tier: &crate::object_tier::ObjectTierDescription,
    object_store: &crate::object_tier::ObjectStoreSection,
    force: bool,
    limits: PoolLimits,
) -> anyhow::Result<(OpenedPool, lamina_engine::RestoredFlash)> {
    refuse_if_described(data_dir, false)?;
    let flash_model = DeviceModels::default()
        .resolve(flash.model.as_deref().unwrap_or(NO_DEVICE_MODEL))
        .with_context(|| format!("the flash device {}", flash.path.display()))?;
    let capacity = crate::object_tier::open_device(data_dir, object_tier, object_store).await?;
    let flash_region_bytes = Pool::lost_flash_region_bytes(&*capacity)
        .await
        .with_context(|| format!("{} holds no lamina pool's capacity tier", object_tier.url))?;
    if let Some(size) = flash
        .create_size_bytes
        .filter(|size| *size != flash_region_bytes)
    {
        anyhow::bail!(
            "the new flash device must have the lost one's size, {flash_region_bytes} bytes, not {size}: give {} alone or with :{flash_region_bytes}",
            flash.path.display()
        );
    }
    let bare_flash = open_device(&flash.path, Some(flash_region_bytes))?;
    let device = Arc::new(ConcatenatedDevice::new(
        behind_model(bare_flash, flash_model),
        capacity.clone(),
    ));
    let restored = Pool::restore_flash(lamina_engine::FlashRestore {
        device: &*device,
        flash_region_bytes: ConcatenatedDevice::first_region_bytes_of(device.first().size_bytes()),
        force,
    })
    .await?;
    let description = object_tier_pool_description(flash, object_tier);
    // Written once the open has marked the lost blocks durably: a restore
    // that stops before is run again (with --force over the new flash).
    let opened = OpenedPool {
        pool: Pool::open_restored(device, limits).await?,
        layout: crate::layout::PoolLayout::with_object_tier(crate::object_tier::ObjectTier::new(
            capacity,
        )),
    };
    write_description(data_dir, &description)?;
    Ok((opened, restored))
}

/// What `pool.toml` says of a pool on `flash` with its capacity tier on
/// object storage (with the endpoint and region the environment gave, when
/// not given otherwise).
fn object_tier_pool_description(
    flash: &TierDevice,
    object_tier: &crate::object_tier::ObjectTierDescription,
) -> PoolDescription {
    PoolDescription {
        flash: std::fs::canonicalize(&flash.path).unwrap_or_else(|_| flash.path.clone()),
        flash_model: recorded_model(flash.model.as_deref()),
        capacity: None,
        capacity_model: None,
        flash_devices: Vec::new(),
        capacity_devices: Vec::new(),
        redundancy: None,
        capacity_object_store: Some(object_tier.with_environment_defaults()),
    }
}

/// The object tier `create_object_tier_pool` makes.
struct ObjectTierCreation<'a> {
    data_dir: &'a Path,
    description: &'a crate::object_tier::ObjectTierDescription,
    size_bytes: u64,
    section: &'a crate::object_tier::ObjectStoreSection,
}

async fn create_over_object_tier(
    flash: &TierDevice,
    flash_model: Option<RotatingDiskModel>,
    tier: &ObjectTierCreation<'_>,
    mut options: PoolOptions,
    limits: PoolLimits,
) -> anyhow::Result<OpenedPool> {
    let bare_flash = open_device(&flash.path, flash.create_size_bytes)?;
    let capacity = crate::object_tier::create_device(
        tier.data_dir,
        tier.description,
        tier.section,
        tier.size_bytes,
        options.segment_size_bytes,
    )
    .await?;
    options.flash_region_bytes = Some(ConcatenatedDevice::first_region_bytes_of(
        bare_flash.size_bytes(),
    ));
    let device = Arc::new(ConcatenatedDevice::new(
        behind_model(bare_flash, flash_model),
        capacity.clone(),
    ));
    Ok(OpenedPool {
        pool: Pool::create(device, options, limits).await?,
        layout: crate::layout::PoolLayout::with_object_tier(crate::object_tier::ObjectTier::new(
            capacity,
        )),
    })
}

/// Serialises every rewrite of a `pool.toml` in this process. The daemon
/// records its devices from more than one task (an admin request, the task
/// that follows a background rebuild): unserialised, two rewrites shared one
/// temporary file, so one of them could rename the other's half-written file
/// into place, or find its own already renamed away and fail.
static DESCRIPTION_REWRITE_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Writes `pool.toml` whole.
pub(crate) fn write_description(
    data_dir: &Path,
    description: &PoolDescription,
) -> anyhow::Result<()> {
    let _serialised = DESCRIPTION_REWRITE_LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    replace_description_file(data_dir, description)
}

/// Reads `pool.toml`, lets `change` edit it and writes it back, with no
/// other rewrite of this process in between.
pub(crate) fn update_description(
    data_dir: &Path,
    change: impl FnOnce(&mut PoolDescription),
) -> anyhow::Result<()> {
    let _serialised = DESCRIPTION_REWRITE_LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut description = existing_description(data_dir)?;
    change(&mut description);
    replace_description_file(data_dir, &description)
}

/// Replaces `pool.toml` atomically: a temporary file written and synced,
/// renamed over it, the directory synced, so that a crash leaves the old
/// description or the new one, never a torn one. The caller holds
/// [`DESCRIPTION_REWRITE_LOCK`].
fn replace_description_file(data_dir: &Path, description: &PoolDescription) -> anyhow::Result<()> {
    use std::io::Write;
    let path = description_path(data_dir);
    let temporary = path.with_extension("toml.new");
    let text = toml::to_string(description).expect("pool description serialises");
    let mut file = create_data_file(&temporary)
        .with_context(|| format!("cannot write {}", temporary.display()))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", temporary.display()))?;
    std::fs::rename(&temporary, &path)
        .with_context(|| format!("cannot replace {}", path.display()))?;
    File::open(data_dir)
        .and_then(|directory| directory.sync_all())
        .with_context(|| format!("cannot sync {}", data_dir.display()))
}

/// A segment size the engine can lay out, refused before anything is created.
pub(crate) fn check_segment_size(segment_size_bytes: u64) -> anyhow::Result<()> {
    if !segment_size_bytes.is_multiple_of(BLOCK_SIZE_BYTES)
        || segment_size_bytes < 16 * BLOCK_SIZE_BYTES
    {
        anyhow::bail!(
            "invalid segment size {segment_size_bytes}: a multiple of 4 KiB, at least 64 KiB"
        );
    }
    Ok(())
}

/// Whether two paths name one file, through symlinks and hard links alike
/// (only decidable when both exist).
pub(crate) fn same_file(first: &Path, second: &Path) -> bool {
    first == second
        || matches!(
            (std::fs::metadata(first), std::fs::metadata(second)),
            (Ok(first), Ok(second)) if (first.dev(), first.ino()) == (second.dev(), second.ino())
        )
}

async fn create_on_devices(
    tiers: &[(&str, &TierDevice)],
    models: Vec<Option<RotatingDiskModel>>,
    mut options: PoolOptions,
    limits: PoolLimits,
) -> anyhow::Result<CreatedPool> {
    let mut bare_devices = Vec::new();
    for (_, tier) in tiers {
        bare_devices.push(open_device(&tier.path, tier.create_size_bytes)?);
    }
    let bare_flash = bare_devices[0].clone();
    let mut devices = bare_devices
        .into_iter()
        .zip(models)
        .map(|(device, model)| behind_model(device, model));
    let flash = devices.next().expect("a flash device");
    let device: Arc<dyn BlockDevice> = match devices.next() {
        None => flash,
        Some(capacity) => {
            options.flash_region_bytes = Some(ConcatenatedDevice::first_region_bytes_of(
                flash.size_bytes(),
            ));
            Arc::new(ConcatenatedDevice::new(flash, capacity))
        }
    };
    Ok(CreatedPool {
        pool: Pool::create(device, options, limits).await?,
        bare_flash,
    })
}

/// Opens the pool on plain devices described in `data_dir` (one per tier),
/// with the daemon config's model overrides and definitions; see
/// `crate::arrays::open_pool_with_models` for every kind of pool.
pub async fn open_plain_pool(
    data_dir: &Path,
    description: &PoolDescription,
    limits: PoolLimits,
    models: [Option<RotatingDiskModel>; 2],
    object_store: &crate::object_tier::ObjectStoreSection,
) -> anyhow::Result<OpenedPool> {
    let [flash_model, capacity_model] = models;
    let flash = open_tier_device(&description.flash, None, flash_model)?;
    let mut layout = crate::layout::PoolLayout::default();
    let device: Arc<dyn BlockDevice> =
        match (&description.capacity, &description.capacity_object_store) {
            (None, None) => flash,
            (Some(path), None) => {
                let capacity = open_tier_device(path, None, capacity_model)?;
                Arc::new(ConcatenatedDevice::new(flash, capacity))
            }
            (None, Some(object_tier)) => {
                let capacity =
                    crate::object_tier::open_device(data_dir, object_tier, object_store).await?;
                layout = crate::layout::PoolLayout::with_object_tier(
                    crate::object_tier::ObjectTier::new(capacity.clone()),
                );
                Arc::new(ConcatenatedDevice::new(flash, capacity))
            }
            (Some(path), Some(object_tier)) => anyhow::bail!(
                "{} names two capacity tiers, the device {} and the object store {}: remove one",
                POOL_DESCRIPTION_FILE,
                path.display(),
                object_tier.url
            ),
        };
    Ok(OpenedPool {
        pool: Pool::open(device, limits).await?,
        layout,
    })
}

/// The pool described in `data_dir`, which must exist.
pub fn existing_description(data_dir: &Path) -> anyhow::Result<PoolDescription> {
    read_description(data_dir)?.ok_or_else(|| {
        anyhow::anyhow!(
            "no pool in {} (create one with `lamina pool create --data {} --flash PATH[:SIZE]`, or run `lamina serve` to create the embedded default)",
            data_dir.display(),
            data_dir.display()
        )
    })
}

/// The models each tier's devices run behind: `pool.toml`'s, unless the
/// daemon's config overrides them.
pub fn tier_models(
    description: &PoolDescription,
    models: &DeviceModels,
) -> anyhow::Result<[Option<RotatingDiskModel>; 2]> {
    let model = |tier: &str, recorded: &Option<String>, overridden: &Option<String>| {
        let name = overridden
            .as_deref()
            .or(recorded.as_deref())
            .unwrap_or(NO_DEVICE_MODEL);
        models
            .resolve(name)
            .with_context(|| format!("the {tier} tier's device model"))
    };
    let flash_model = model("flash", &description.flash_model, &models.flash_override)?;
    let capacity_model = match description.capacity {
        Some(_) => model(
            "capacity",
            &description.capacity_model,
            &models.capacity_override,
        )?,
        None => {
            if models.capacity_override.is_some() {
                tracing::warn!(
                    "the config sets a capacity device model, but the pool has no capacity tier"
                );
            }
            None
        }
    };
    Ok([flash_model, capacity_model])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_descriptions_from_before_two_tiers_still_read() {
        let old: PoolDescription = toml::from_str("flash = \"/srv/pool.img\"\n").unwrap();
        assert_eq!(old.flash, PathBuf::from("/srv/pool.img"));
        assert_eq!(old.capacity, None);
        assert_eq!(old.flash_model, None);
        assert_eq!(old.capacity_model, None);
        // A one-tier description is written as before.
        assert_eq!(
            toml::to_string(&old).unwrap(),
            "flash = \"/srv/pool.img\"\n"
        );
        let two_tier = PoolDescription {
            flash: PathBuf::from("/dev/nvme0n1"),
            flash_model: None,
            capacity: Some(PathBuf::from("/dev/sda")),
            capacity_model: recorded_model(Some(HDD_7200_DEVICE_MODEL)),
            flash_devices: Vec::new(),
            capacity_devices: Vec::new(),
            redundancy: None,
            capacity_object_store: None,
        };
        let text = toml::to_string(&two_tier).unwrap();
        let read: PoolDescription = toml::from_str(&text).unwrap();
        assert_eq!(read.capacity, two_tier.capacity);
        assert_eq!(read.capacity_model.as_deref(), Some("hdd-7200"));
        assert_eq!(recorded_model(Some(NO_DEVICE_MODEL)), None);
        assert!(toml::from_str::<PoolDescription>("flash = \"x\"\ncapacty = \"y\"\n").is_err());
    }

    /// The daemon records its devices from several tasks at once (an admin
    /// request and the task that follows a rebuild): every rewrite must
    /// succeed and leave a whole description, and none may undo another's
    /// edit. With one temporary file and no lock, rewrites failed with "No
    /// such file" (the other's rename took the file) in CI.
    #[test]
    fn concurrent_rewrites_of_the_description_all_land_whole() {
        const THREAD_COUNT: usize = 4;
        const REWRITES_PER_THREAD_COUNT: usize = 50;
        let directory = tempfile::tempdir().unwrap();
        let data_dir = directory.path().to_path_buf();
        let description: PoolDescription = toml::from_str("flash = \"/srv/pool.img\"\n").unwrap();
        write_description(&data_dir, &description).unwrap();
        std::thread::scope(|scope| {
            for thread_index in 0..THREAD_COUNT {
                let data_dir = &data_dir;
                scope.spawn(move || {
                    for rewrite_index in 0..REWRITES_PER_THREAD_COUNT {
                        update_description(data_dir, |description| {
                            description
                                .flash_devices
                                .push(PathBuf::from(format!("/t{thread_index}/{rewrite_index}")));
                        })
                        .expect("every rewrite succeeds");
                    }
                });
            }
        });
        let written = existing_description(&data_dir).unwrap();
        assert_eq!(
            written.flash_devices.len(),
            THREAD_COUNT * REWRITES_PER_THREAD_COUNT,
            "no rewrite undid another's edit"
        );
        assert!(
            !description_path(&data_dir)
                .with_extension("toml.new")
                .exists()
        );
    }
}
