//! Running an [`Operation`] against a pool: [`execute`], which the daemon's
//! handlers and the offline CLI both call (so that the two paths cannot
//! drift apart), and the [`AdminContext`] it runs in. Each operation is
//! answered with the typed document its [`Operation::answer_kind`] names.

use std::sync::Arc;

use lamina_engine::{CachePriority, Codec, EngineError, IoError, Pin, Pool, TierPolicy};
use lamina_nbd::NbdServer;

use super::answer::Answer;
use super::operation::{Operation, OperationError, VOLUME_IN_USE_KIND};
use crate::api;
use crate::export::OpenExports;

/// What operations run against: the pool, and (in the daemon) which volumes
/// NBD clients have open and the NBD server whose counters `/metrics` shows.
#[derive(Clone)]
pub struct AdminContext {
    pub pool: Pool,
    /// The arrays under the pool (empty for plain devices).
    pub layout: crate::layout::PoolLayout,
    pub open_exports: OpenExports,
    pub nbd_server: Option<Arc<NbdServer>>,
    /// Where `pool.toml` is and the device models, for the device commands.
    pub devices: crate::devices::DeviceContext,
    /// Each volume's NBD statistics (in the daemon).
    pub volume_statistics: Option<Arc<crate::volume_statistics::VolumeStatistics>>,
    /// The codec of volumes created without one: the config's `[pool]
    /// compression` in the daemon, `Off` when the CLI opens the pool itself
    /// (it reads no config).
    pub default_compression: Codec,
}

/// Runs `operation`; its answer is the document its kind names.
pub async fn execute(
    context: &AdminContext,
    operation: Operation,
) -> Result<Answer, OperationError> {
    let expected = operation.answer_kind();
    let answer = match operation {
        Operation::VolumeList
        | Operation::VolumeCreate { .. }
        | Operation::VolumeSetPolicy { .. }
        | Operation::VolumeStats { .. }
        | Operation::VolumeIo { .. }
        | Operation::VolumeResize { .. }
        | Operation::VolumeRename { .. }
        | Operation::VolumeDelete { .. } => volume_operation(context, operation).await?,
        Operation::SnapshotCreate { .. }
        | Operation::SnapshotList { .. }
        | Operation::SnapshotDelete { .. }
        | Operation::SnapshotRollback { .. }
        | Operation::VolumeClone { .. } => snapshot_operation(context, operation).await?,
        Operation::PoolStatus => Answer::PoolStatus(Box::new(pool_status(context))),
        Operation::PoolScrub { wait } => Answer::Scrub(scrub(&context.pool, wait).await?),
        Operation::DeviceList
        | Operation::DeviceFail { .. }
        | Operation::DeviceReplace { .. }
        | Operation::DeviceRemove { .. }
        | Operation::DeviceAdd { .. }
        | Operation::DeviceRebuild
        | Operation::DeviceRebalance => device_operation(context, operation).await?,
    };
    assert_eq!(
        answer.kind(),
        expected,
        "an operation answers as its kind says"
    );
    Ok(answer)
}

/// The operations on volumes themselves.
async fn volume_operation(
    context: &AdminContext,
    operation: Operation,
) -> Result<Answer, OperationError> {
    let pool = &context.pool;
    let info = match operation {
        Operation::VolumeList => {
            let volumes = pool.list_volumes().into_iter().map(api::volume_info);
            return Ok(Answer::Volumes(volumes.collect()));
        }
        Operation::VolumeStats { name } => {
            let stats = api::volume_tier_stats(pool.volume_tier_stats(&name)?);
            return Ok(Answer::VolumeTierStats(stats));
        }
        Operation::VolumeIo { name } => return Ok(Answer::VolumeIo(volume_io(context, name)?)),
        Operation::VolumeDelete { name } => {
            pool.delete_volume(&name).await?;
            return Ok(Answer::Deleted(lamina_api::Deleted { deleted: name }));
        }
        Operation::VolumeCreate {
            name,
            size_bytes,
            priority,
            pin,
            compression,
        } => {
            let codec = compression.unwrap_or(context.default_compression);
            let created = pool
                .create_volume_with_compression(&name, size_bytes, codec)
                .await?;
            if priority.is_none() && pin.is_none() {
                created
            } else {
                set_policy(pool, &name, priority, pin).await?
            }
        }
        Operation::VolumeSetPolicy {
            name,
            priority,
            pin,
            compression,
        } => match compression {
            Some(codec) if priority.is_none() && pin.is_none() => {
                pool.set_volume_compression(&name, codec).await?
            }
            Some(codec) => {
                set_policy(pool, &name, priority, pin).await?;
                pool.set_volume_compression(&name, codec).await?
            }
            None => set_policy(pool, &name, priority, pin).await?,
        },
        Operation::VolumeResize {
            name,
            size_bytes,
            force,
        } => pool.resize_volume(&name, size_bytes, force).await?,
        Operation::VolumeRename { name, new_name } => pool.rename_volume(&name, &new_name).await?,
        other => unreachable!("{} is not a volume operation", other.name()),
    };
    Ok(Answer::Volume(api::volume_info(info)))
}

/// The operations on snapshots, and clones of them.
async fn snapshot_operation(
    context: &AdminContext,
    operation: Operation,
) -> Result<Answer, OperationError> {
    let pool = &context.pool;
    Ok(match operation {
        Operation::SnapshotCreate { volume, snapshot } => Answer::Snapshot(api::snapshot_info(
            pool.create_snapshot(&volume, &snapshot).await?,
        )),
        Operation::SnapshotList { volume } => {
            let snapshots = pool.list_snapshots(volume.as_deref())?.into_iter();
            Answer::Snapshots(snapshots.map(api::snapshot_info).collect())
        }
        Operation::SnapshotDelete { volume, snapshot } => {
            pool.delete_snapshot(&volume, &snapshot).await?;
            let deleted = format!("{volume}@{snapshot}");
            Answer::Deleted(lamina_api::Deleted { deleted })
        }
        Operation::SnapshotRollback {
            volume,
            snapshot,
            force,
        } => Answer::Volume(rollback(context, &volume, &snapshot, force).await?),
        Operation::VolumeClone {
            volume,
            snapshot,
            new_name,
        } => {
            let clone = pool.clone_snapshot(&volume, &snapshot, &new_name).await?;
            Answer::Volume(api::volume_info(clone))
        }
        other => unreachable!("{} is not a snapshot operation", other.name()),
    })
}

/// Rolls `volume` back to `snapshot`; refused while NBD clients have it
/// open, unless `force`.
async fn rollback(
    context: &AdminContext,
    volume: &str,
    snapshot: &str,
    force: bool,
) -> Result<lamina_api::VolumeInfo, OperationError> {
    let pool = &context.pool;
    let connected = context.open_exports.count(pool.volume_id(volume)?);
    if connected > 0 && !force {
        return Err(OperationError {
            status: 409,
            error: format!(
                "volume {volume} has {connected} NBD connection(s) open; disconnect them, or force the rollback (clients then read {volume}@{snapshot}'s contents from their next request, and their caches go stale)"
            ),
            kind: VOLUME_IN_USE_KIND.to_string(),
        });
    }
    Ok(api::volume_info(
        pool.rollback_snapshot(volume, snapshot).await?,
    ))
}

/// The operations on the devices of an array pool.
async fn device_operation(
    context: &AdminContext,
    operation: Operation,
) -> Result<Answer, OperationError> {
    let (pool, layout) = (&context.pool, &context.layout);
    let devices = || crate::devices::list(layout).map_err(device_error);
    let rebuild = match operation {
        Operation::DeviceList => return Ok(Answer::Devices(devices()?)),
        Operation::DeviceFail { path } => {
            let failed = crate::devices::fail(pool, layout, &path).await;
            failed.map_err(device_error)?;
            return Ok(Answer::Devices(devices()?));
        }
        Operation::DeviceAdd { path, tier } => {
            let tier = tier_role(tier);
            let added = crate::devices::add(pool, layout, &context.devices, tier, &path).await;
            return Ok(Answer::Devices(added.map_err(device_error)?));
        }
        Operation::DeviceReplace { old, new, wait } => {
            return Ok(Answer::Rebuild(replace(context, &old, &new, wait).await?));
        }
        Operation::DeviceRemove { path } => {
            let data_dir = &context.devices.data_dir;
            crate::devices::remove(pool, layout, data_dir, &path).await
        }
        Operation::DeviceRebuild => crate::devices::rebuild_now(pool, layout).await,
        Operation::DeviceRebalance => crate::devices::rebalance(pool).await,
        other => unreachable!("{} is not a device operation", other.name()),
    };
    Ok(Answer::Rebuild(rebuild.map_err(device_error)?))
}

/// The NBD statistics of volume `name`, or of every volume.
fn volume_io(
    context: &AdminContext,
    name: Option<String>,
) -> Result<Vec<crate::volume_statistics::VolumeIo>, OperationError> {
    let pool = &context.pool;
    let names = match name {
        Some(name) => vec![(pool.volume_id(&name)?, name)],
        None => volume_names(pool),
    };
    let Some(statistics) = &context.volume_statistics else {
        return Ok(Vec::new());
    };
    Ok(names
        .into_iter()
        .map(|(volume_id, name)| statistics.totals(volume_id, &name))
        .collect())
}

/// Every volume's identifier and name; a volume deleted meanwhile is left out.
pub(crate) fn volume_names(pool: &Pool) -> Vec<(u32, String)> {
    pool.list_volumes()
        .into_iter()
        .map(|volume| (volume.volume_id, volume.name))
        .collect()
}

/// Sets the given parts of a volume's policy, keeping the others.
async fn set_policy(
    pool: &Pool,
    name: &str,
    priority: Option<CachePriority>,
    pin: Option<Pin>,
) -> Result<lamina_engine::VolumeInfo, EngineError> {
    let current = pool.volume_info(name)?.policy;
    let policy = TierPolicy {
        priority: priority.unwrap_or(current.priority),
        pin: pin.unwrap_or(current.pin),
    };
    pool.set_volume_policy(name, policy).await
}

/// `pool status`: the engine's figures and, for arrays, the devices.
fn pool_status(context: &AdminContext) -> lamina_api::PoolStatus {
    let mut status = api::pool_status(context.pool.status());
    status.rebuild.blocked = crate::devices::rebuild_blocked(&context.pool, &context.layout);
    status.layout = context.layout.status();
    status.object_tier = context
        .layout
        .object_tier()
        .map(crate::object_tier::ObjectTier::status);
    status
}

/// Replaces a device: the rebuild runs to the end when `wait`, otherwise in
/// the background (progress in `pool status`).
async fn replace(
    context: &AdminContext,
    old: &str,
    new: &str,
    wait: bool,
) -> Result<lamina_api::RebuildStatus, OperationError> {
    let (pool, layout, devices) = (&context.pool, &context.layout, &context.devices);
    crate::devices::begin_replace(layout, devices, old, new)
        .await
        .map_err(device_error)?;
    if wait {
        return crate::devices::rebuild_and_record(pool, layout, &devices.data_dir)
            .await
            .map_err(device_error);
    }
    pool.start_rebuild();
    crate::devices::follow_rebuild(pool.clone(), layout.clone(), devices.data_dir.clone());
    // Let the rebuild start, so that the answer shows it running.
    tokio::task::yield_now().await;
    Ok(api::rebuild_status(pool.rebuild_status()))
}

fn tier_role(tier: lamina_api::TierName) -> lamina_layout::TierRole {
    match tier {
        lamina_api::TierName::Flash => lamina_layout::TierRole::Flash,
        lamina_api::TierName::Capacity => lamina_layout::TierRole::Capacity,
    }
}

/// A refused device command: the user's mistake (400) or the device's (500).
fn device_error(error: impl Into<anyhow::Error>) -> OperationError {
    let error: anyhow::Error = error.into();
    let refused = error.chain().any(|cause| {
        cause.is::<crate::devices::DeviceCommandError>() || cause.is::<lamina_layout::ArrayError>()
    });
    OperationError {
        status: if refused { 400 } else { 500 },
        error: format!("{error:#}"),
        kind: if refused {
            "device_refused"
        } else {
            "device_failed"
        }
        .to_string(),
    }
}

/// Scrubs the pool: to the end when `wait`, otherwise in the background
/// (progress in `pool status`). A scrub already running is refused.
async fn scrub(pool: &Pool, wait: bool) -> Result<lamina_api::ScrubStatus, OperationError> {
    if wait {
        return Ok(api::scrub_status(pool.scrub().await?));
    }
    if pool.scrub_status().state == lamina_engine::ScrubState::Scrubbing {
        return Err(EngineError::Io(IoError::ScrubRunning).into());
    }
    let background = pool.clone();
    let task = tokio::spawn(async move {
        match background.scrub().await {
            Ok(found) => tracing::info!(
                scrubbed = found.blocks_scrubbed,
                repaired = found.blocks_repaired,
                unrepairable = found.blocks_unrepairable,
                parity_repaired = found.parity_repaired,
                "scrub finished"
            ),
            Err(error) => tracing::error!(%error, "scrub failed"),
        }
    });
    // The answer, and the polling of `pool scrub --wait` after it, must see
    // this scrub: wait until it runs or has ended. A single yield raced under
    // load, and the answer showed the previous scrub's state (none, or the
    // last one finished), so `--wait` returned at once.
    while pool.scrub_status().state != lamina_engine::ScrubState::Scrubbing && !task.is_finished() {
        tokio::time::sleep(std::time::Duration::from_millis(
            SCRUB_START_POLL_INTERVAL_MS,
        ))
        .await;
    }
    Ok(api::scrub_status(pool.scrub_status()))
}

/// How often a background scrub's start is checked before the answer.
const SCRUB_START_POLL_INTERVAL_MS: u64 = 1;
