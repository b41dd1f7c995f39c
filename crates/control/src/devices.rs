//! The device commands on an array pool (`lamina device list|fail|replace`):
//! finding a device by path among the tiers' arrays, taking one out by hand,
//! and replacing one: the new device is opened (created when a size is
//! given) behind its tier's model, labelled as the replacement, recorded in
//! `pool.toml`, and rebuilt by the engine in the background; once it has
//! taken its member's place, `pool.toml` lists it instead of the old one.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use lamina_api as api;
use lamina_engine::{Pool, RebuildState};
use lamina_layout::TierRole;

use crate::layout::{PoolLayout, TierArray};
use crate::store::{DeviceModels, description_path, parse_device_argument};

/// How often a follower of a background rebuild looks whether it ended.
pub const REBUILD_FOLLOW_INTERVAL_MS: u64 = 500;

/// What the device commands need beyond the pool: where `pool.toml` is, and
/// the daemon's device models (for the new device's timing).
#[derive(Clone, Debug)]
pub struct DeviceContext {
    pub data_dir: PathBuf,
    pub models: DeviceModels,
}

/// Why a device command was refused.
#[derive(Debug, thiserror::Error)]
pub enum DeviceCommandError {
    #[error(
        "the pool has no arrays: device commands need a pool created with several devices or --redundancy"
    )]
    NoArrays,
    #[error("{path} is not a device of this pool (see `lamina device list`)")]
    UnknownDevice { path: String },
}

/// Every device of every tier (members and replacements being rebuilt).
pub fn list(layout: &PoolLayout) -> Result<Vec<api::DeviceStatus>, DeviceCommandError> {
    let status = layout.status().ok_or(DeviceCommandError::NoArrays)?;
    Ok(status
        .tiers
        .into_iter()
        .flat_map(|tier| tier.devices)
        .collect())
}

/// The tier array holding the device at `path` (as given, or as its
/// canonical path, which is how members are named).
fn tier_of<'a>(
    layout: &'a PoolLayout,
    path: &str,
) -> Result<(&'a TierArray, String), DeviceCommandError> {
    if layout.tiers().is_empty() {
        return Err(DeviceCommandError::NoArrays);
    }
    let canonical = std::fs::canonicalize(path)
        .map(|path| path.display().to_string())
        .unwrap_or_else(|_| path.to_owned());
    for tier in layout.tiers() {
        for member in tier.array.member_status() {
            if member.path == path || member.path == canonical {
                return Ok((tier, member.path));
            }
        }
    }
    Err(DeviceCommandError::UnknownDevice {
        path: path.to_owned(),
    })
}

/// `device fail PATH`: takes a device out as if it had failed.
pub async fn fail(pool: &Pool, layout: &PoolLayout, path: &str) -> anyhow::Result<()> {
    let (tier, member_path) = tier_of(layout, path)?;
    let index = tier
        .array
        .member_status()
        .iter()
        .position(|member| member.path == member_path)
        .expect("found above");
    tier.array.fail_member(index);
    tracing::warn!(path = %member_path, "device taken out by hand");
    // The labels record it before the answer (the array's flush rewrites
    // them even when the pool has nothing to flush): it stays out after a
    // restart, and cannot come back stale.
    pool.flush().await?;
    lamina_device::BlockDevice::flush(tier.array.as_ref()).await?;
    // With `rebuild_automatic`, the data it held moves onto the others
    // when they have room (distributed spare space).
    match pool.start_rebuild() {
        lamina_engine::RebuildStart::LacksSpace(need) => tracing::warn!(
            live_bytes = need.live_bytes,
            free_bytes = need.free_bytes,
            "the other devices lack the free space for its data: replace it"
        ),
        started => tracing::info!(?started, "rebuild after a device was taken out"),
    }
    Ok(())
}

/// `device replace OLD NEW[:SIZE]`: labels NEW as OLD's replacement and
/// starts the rebuild (the caller waits for it or follows it).
pub async fn begin_replace(
    layout: &PoolLayout,
    context: &DeviceContext,
    old: &str,
    new: &str,
) -> anyhow::Result<()> {
    let (tier, old_path) = tier_of(layout, old)?;
    let (new_path, create_size_bytes) = parse_device_argument(new)?;
    if create_size_bytes.is_none() && !new_path.exists() {
        anyhow::bail!(
            "the new device {} does not exist; give its size as PATH:SIZE to create a file",
            new_path.display()
        );
    }
    let description = crate::store::existing_description(&context.data_dir)?;
    let [flash_model, capacity_model] = crate::store::tier_models(&description, &context.models)?;
    let model = match tier.tier {
        TierRole::Flash => flash_model,
        TierRole::Capacity => capacity_model,
    };
    let member = crate::arrays::member(&new_path, create_size_bytes, model)?;
    tier.array
        .begin_replacement(&old_path, member)
        .await
        .with_context(|| format!("cannot replace {old_path} with {}", new_path.display()))?;
    record_devices(&context.data_dir, layout)?;
    Ok(())
}

/// Waits for the rebuild to end (in this task), then records the devices.
pub async fn rebuild_and_record(
    pool: &Pool,
    layout: &PoolLayout,
    data_dir: &Path,
) -> anyhow::Result<api::RebuildStatus> {
    let status = pool.rebuild().await?;
    record_devices(data_dir, layout)?;
    Ok(crate::api::rebuild_status(status))
}

/// Follows a background rebuild (resumed at open, or started by `device
/// replace` without waiting) and records the devices when it ends.
pub fn follow_rebuild(pool: Pool, layout: PoolLayout, data_dir: PathBuf) {
    if !pool.rebuild_pending() {
        return;
    }
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(REBUILD_FOLLOW_INTERVAL_MS)).await;
            let running = pool.rebuild_status().state == RebuildState::Rebuilding;
            if !running && !pool.rebuild_pending() {
                break;
            }
            if !running && pool.rebuild_status().state == RebuildState::Failed {
                break;
            }
        }
        if let Err(error) = record_devices(&data_dir, &layout) {
            tracing::error!(%error, "cannot record the pool's devices after the rebuild");
        }
    });
}

/// Writes each tier's devices (members at their current or last-seen paths,
/// and replacements) to `pool.toml`, replacing the lists there.
pub fn record_devices(data_dir: &Path, layout: &PoolLayout) -> anyhow::Result<()> {
    let mut description = crate::store::existing_description(data_dir)?;
    for tier in layout.tiers() {
        let mut paths: Vec<PathBuf> = Vec::new();
        for member in tier.array.member_status() {
            paths.push(PathBuf::from(member.path));
            if let Some(replacement) = member.replacement {
                paths.push(PathBuf::from(replacement.path));
            }
        }
        // The single-device fields name an array's first device.
        match tier.tier {
            TierRole::Flash => {
                description.flash = paths[0].clone();
                description.flash_devices = paths;
            }
            TierRole::Capacity => {
                description.capacity = Some(paths[0].clone());
                description.capacity_devices = paths;
            }
        }
    }
    let path = description_path(data_dir);
    let temporary = path.with_extension("toml.new");
    std::fs::write(
        &temporary,
        toml::to_string(&description).expect("pool description serialises"),
    )
    .with_context(|| format!("cannot write {}", temporary.display()))?;
    std::fs::rename(&temporary, &path).with_context(|| format!("cannot replace {}", path.display()))
}
