//! The device commands on an array pool (`lamina device list|fail|replace`):
//! finding a device by path among the tiers' arrays, taking one out by hand,
//! and replacing one: the new device is opened (created when a size is
//! given) behind its tier's model, labelled as the replacement, recorded in
//! `pool.toml`, and rebuilt by the engine in the background; once it has
//! taken its member's place, `pool.toml` lists it instead of the old one.
//! Also why no rebuild restores a pool's redundancy when none can
//! ([`rebuild_blocked`]), for `pool status`, `/metrics` and `device rebuild`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use lamina_api as api;
use lamina_engine::{EvacuationGoal, Pool, RebuildState};
use lamina_layout::TierRole;

use crate::layout::{PoolLayout, TierArray};
use crate::store::{DeviceModels, parse_device_argument};

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
    #[error(
        "cannot remove {path}: the other devices lack the room for its data ({live_bytes} bytes to move, {free_bytes} bytes free); free space or add a device first"
    )]
    NoRoom {
        path: String,
        live_bytes: u64,
        free_bytes: u64,
    },
    #[error("no rebuild can run: {message}")]
    RebuildBlocked { message: String },
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
    let index = member_index(tier, &member_path);
    tier.array.fail_member(index);
    tracing::warn!(path = %member_path, "device taken out by hand");
    // The labels record it before the answer (the array's flush rewrites
    // them even when the pool has nothing to flush): it stays out after a
    // restart, and cannot come back stale.
    pool.flush().await?;
    lamina_device::BlockDevice::flush(tier.array.as_ref()).await?;
    // With `rebuild_automatic`, the data it held moves onto the others
    // when they have room (distributed spare space); otherwise the log
    // says why not now (the engine repeats it while it lasts).
    let started = pool.start_rebuild();
    match rebuild_blocked(pool, layout) {
        Some(blocked) => tracing::warn!(
            reason = %blocked.message,
            "redundancy is reduced and no rebuild can restore it"
        ),
        None => tracing::info!(?started, "rebuild after a device was taken out"),
    }
    Ok(())
}

/// How many times `device remove` lets the flush and checkpoints free the
/// segments the evacuation emptied before it gives up on dropping the
/// member (each round frees what the previous ones emptied).
pub const REMOVAL_ROUNDS_MAX: usize = 8;

/// The index of the device at `path` in its tier's array.
fn member_index(tier: &TierArray, member_path: &str) -> usize {
    tier.array
        .member_status()
        .iter()
        .position(|member| member.path == member_path)
        .expect("found by tier_of")
}

/// `device remove PATH`: the member leaves the write set, the data of every
/// segment with a column on it moves to the others (refused, and the
/// member kept, when they cannot hold it), and its slot is emptied.
pub async fn remove(
    pool: &Pool,
    layout: &PoolLayout,
    data_dir: &Path,
    path: &str,
) -> anyhow::Result<api::RebuildStatus> {
    let (tier, member_path) = tier_of(layout, path)?;
    let index = member_index(tier, &member_path);
    // A lost member is out of the write set already: its slot is emptied
    // once its data is rebuilt onto the others.
    let in_use = tier.array.member_status()[index].state.is_usable();
    if in_use {
        tier.array
            .begin_removal(index)
            .await
            .with_context(|| format!("cannot remove {member_path}"))?;
    }
    let need = pool.evacuation_need();
    if need.live_bytes > need.free_bytes {
        if in_use {
            tier.array.cancel_removal(index).await?;
        }
        return Err(DeviceCommandError::NoRoom {
            path: member_path,
            live_bytes: need.live_bytes,
            free_bytes: need.free_bytes,
        }
        .into());
    }
    let status = evacuate_waiting(pool, EvacuationGoal::Redundancy).await?;
    for _ in 0..REMOVAL_ROUNDS_MAX {
        match tier.array.finish_removal(index).await {
            Ok(()) => {
                tracing::warn!(path = %member_path, "device removed");
                record_devices(data_dir, layout)?;
                return Ok(crate::api::rebuild_status(status));
            }
            Err(lamina_layout::ArrayError::MemberStillInZones { .. }) => {
                // Segments emptied but not yet free: the flush and two
                // checkpoints free them, and the next pass lays them out.
                pool.flush().await?;
                pool.checkpoint_base().await?;
                pool.checkpoint_base().await?;
                evacuate_waiting(pool, EvacuationGoal::Redundancy).await?;
            }
            Err(error) => return Err(error.into()),
        }
    }
    tier.array
        .finish_removal(index)
        .await
        .with_context(|| format!("the data moved off {member_path}, but segments still name it"))?;
    record_devices(data_dir, layout)?;
    Ok(crate::api::rebuild_status(status))
}

/// `device rebuild`: starts the rebuild onto distributed spare space (or
/// onto a pending replacement) now, whatever `rebuild_automatic` says.
/// Refused with the reason and what to do when no rebuild can restore the
/// pool's redundancy (the others lack the room, they are too few, or the
/// array cannot narrow), so that it never answers success for nothing.
pub async fn rebuild_now(pool: &Pool, layout: &PoolLayout) -> anyhow::Result<api::RebuildStatus> {
    if pool.rebuild_pending() {
        pool.start_rebuild();
    } else {
        let blocked = rebuild_blocked(pool, layout)
            .filter(|blocked| blocked.reason != api::RebuildBlockedReason::AutomaticOff);
        if let Some(blocked) = blocked {
            return Err(DeviceCommandError::RebuildBlocked {
                message: blocked.message,
            }
            .into());
        }
        let need = pool.evacuation_need();
        if !need.is_empty() && pool.rebuild_status().state != RebuildState::Rebuilding {
            let pool = pool.clone();
            tokio::spawn(async move {
                if let Err(error) = pool.evacuate().await {
                    tracing::error!(%error, "rebuild onto distributed spare space failed");
                }
            });
        }
    }
    tokio::task::yield_now().await;
    Ok(crate::api::rebuild_status(pool.rebuild_status()))
}

/// Why no rebuild restores the pool's redundancy now, with what to do;
/// `None` while nothing is degraded or a rebuild runs or will start.
pub fn rebuild_blocked(pool: &Pool, layout: &PoolLayout) -> Option<api::RebuildBlocked> {
    use lamina_engine::pool::evacuation::RebuildBlocked;
    let redundancy = degraded_redundancy_name(layout);
    let lost = "the lost device";
    let Some(blocked) = pool.rebuild_blocked() else {
        return not_zoned_blocked(pool, layout);
    };
    let (reason, need) = match blocked {
        RebuildBlocked::NoRoom(need) => (api::RebuildBlockedReason::NoRoom, need),
        RebuildBlocked::TooFewDevices { .. } => {
            (api::RebuildBlockedReason::TooFewDevices, Default::default())
        }
        RebuildBlocked::AutomaticOff(need) => (api::RebuildBlockedReason::AutomaticOff, need),
    };
    let message = match reason {
        api::RebuildBlockedReason::NoRoom => format!(
            "not enough free space on the surviving devices to restore {redundancy} \
             (need {}, have {}); free space (delete volumes or snapshots, trim) \
             or `lamina device replace` {lost}",
            api::size::format_size(need.live_bytes),
            api::size::format_size(need.free_bytes)
        ),
        api::RebuildBlockedReason::AutomaticOff => format!(
            "rebuild_automatic is off ({} to move to restore {redundancy}); \
             run `lamina device rebuild` or `lamina device replace` {lost}",
            api::size::format_size(need.live_bytes)
        ),
        _ => format!(
            "too few devices left to restore {redundancy} over them alone; \
             `lamina device replace` {lost}"
        ),
    };
    Some(api::RebuildBlocked {
        reason,
        message,
        bytes_to_move: need.live_bytes,
        bytes_free: need.free_bytes,
    })
}

/// A tier array made before zones (it cannot narrow, so the engine sees no
/// degraded segment) with a lost member and no replacement being rebuilt.
fn not_zoned_blocked(pool: &Pool, layout: &PoolLayout) -> Option<api::RebuildBlocked> {
    if pool.rebuild_pending() || pool.rebuild_status().state == RebuildState::Rebuilding {
        return None;
    }
    let tier = layout
        .tiers()
        .iter()
        .find(|tier| !tier.array.geometry().is_zoned() && tier.array.lost_member_count() > 0)?;
    let redundancy = tier.array.geometry().redundancy.name();
    Some(api::RebuildBlocked {
        reason: api::RebuildBlockedReason::NotZoned,
        message: format!(
            "the {} tier's array was made before zones (label version 2) and cannot be \
             rebuilt onto the devices left; `lamina device replace` the lost device to \
             restore {redundancy}",
            tier.tier.name()
        ),
        bytes_to_move: 0,
        bytes_free: 0,
    })
}

/// The redundancy of the first tier with a lost member ("full redundancy"
/// when none has: a device being removed).
fn degraded_redundancy_name(layout: &PoolLayout) -> &'static str {
    layout
        .tiers()
        .iter()
        .find(|tier| tier.array.lost_member_count() > 0)
        .map_or("full redundancy", |tier| {
            tier.array.geometry().redundancy.name()
        })
}

/// `/metrics`: whether the pool runs with less redundancy than it was made
/// with and no rebuild can restore it, and the data that would move.
pub fn rebuild_metrics(
    pool: &Pool,
    layout: &PoolLayout,
    exposition: &mut crate::exposition::Exposition,
) {
    let blocked = rebuild_blocked(pool, layout);
    exposition
        .gauge(
            "lamina_rebuild_blocked",
            "1 while the pool has less redundancy than it was made with and no rebuild can restore it (see pool status: rebuild.blocked).",
        )
        .sample(&[], blocked.is_some());
    exposition
        .gauge(
            "lamina_rebuild_blocked_bytes_to_move",
            "Live bytes with less redundancy that no rebuild moves while it is blocked.",
        )
        .sample(&[], blocked.map_or(0, |blocked| blocked.bytes_to_move));
}

/// `device rebalance` (and `device add --rebalance`): moves the data of
/// segments narrower than the arrays now are onto every device in use, to
/// its end, after a rebuild running meanwhile.
pub async fn rebalance(pool: &Pool) -> anyhow::Result<api::RebuildStatus> {
    let status = evacuate_waiting(pool, EvacuationGoal::Width).await?;
    Ok(crate::api::rebuild_status(status))
}

/// Runs an evacuation to its end, after the one running (an automatic
/// rebuild) if any.
async fn evacuate_waiting(
    pool: &Pool,
    goal: EvacuationGoal,
) -> anyhow::Result<lamina_engine::RebuildStatus> {
    loop {
        let result = match goal {
            EvacuationGoal::Redundancy => pool.evacuate().await,
            EvacuationGoal::Width => pool.rebalance().await,
        };
        match result {
            Err(lamina_engine::EngineError::Io(lamina_engine::IoError::RebuildRunning)) => {
                tokio::time::sleep(Duration::from_millis(REBUILD_FOLLOW_INTERVAL_MS)).await;
            }
            result => return Ok(result?),
        }
    }
}

/// `device add --tier TIER NEW[:SIZE]`: NEW joins the tier's array in an
/// empty slot (a removed member's, or a lost one's whose data moved away);
/// segments opened from then on use it.
pub async fn add(
    pool: &Pool,
    layout: &PoolLayout,
    context: &DeviceContext,
    tier_role: TierRole,
    new: &str,
) -> anyhow::Result<Vec<api::DeviceStatus>> {
    let tier = layout
        .tiers()
        .iter()
        .find(|tier| tier.tier == tier_role)
        .ok_or(DeviceCommandError::NoArrays)?;
    let (new_path, create_size_bytes) = parse_device_argument(new)?;
    if create_size_bytes.is_none() && !new_path.exists() {
        anyhow::bail!(
            "the new device {} does not exist; give its size as PATH:SIZE to create a file",
            new_path.display()
        );
    }
    let member = new_member(context, tier_role, &new_path, create_size_bytes)?;
    let index = tier.array.add_member(member).await.with_context(|| {
        format!(
            "cannot add {} to the {} tier",
            new_path.display(),
            tier_role.name()
        )
    })?;
    tracing::warn!(path = %new_path.display(), index, "device added");
    record_devices(&context.data_dir, layout)?;
    // Free segments are laid out again to use it.
    let started = pool.start_rebuild();
    tracing::info!(?started, "free segments laid out over the added device");
    list(layout).map_err(Into::into)
}

/// A new device behind its tier's model.
fn new_member(
    context: &DeviceContext,
    tier: TierRole,
    path: &Path,
    create_size_bytes: Option<u64>,
) -> anyhow::Result<lamina_layout::MemberDevice> {
    let description = crate::store::existing_description(&context.data_dir)?;
    let [flash_model, capacity_model] = crate::store::tier_models(&description, &context.models)?;
    let model = match tier {
        TierRole::Flash => flash_model,
        TierRole::Capacity => capacity_model,
    };
    crate::arrays::member(path, create_size_bytes, model)
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
    let member = new_member(context, tier.tier, &new_path, create_size_bytes)?;
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
    crate::store::update_description(data_dir, |description| {
        for tier in layout.tiers() {
            let paths = tier_device_paths(tier);
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
    })
}

/// A tier's devices as `pool.toml` lists them: each member at its current
/// or last-seen path, followed by its replacement if it has one.
fn tier_device_paths(tier: &TierArray) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = Vec::new();
    for member in tier.array.member_status() {
        // An empty slot (a removed member) has no device to list.
        if member.state == lamina_layout::MemberState::Removed {
            continue;
        }
        paths.push(PathBuf::from(member.path));
        if let Some(replacement) = member.replacement {
            paths.push(PathBuf::from(replacement.path));
        }
    }
    paths
}
