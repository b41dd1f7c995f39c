//! The admin API: the operations of `lamina volume ...` (including tier
//! policies and tier statistics), `lamina snapshot ...`, `lamina clone` and
//! `lamina pool status`,
//! executed against a pool, either by the daemon (HTTP + JSON on the Unix socket
//! `DIR/admin.sock`, `POST /v1/operations` with one [`Operation`] as the body) or
//! directly by the CLI when no daemon runs. One `execute` serves both, so the two
//! paths cannot drift apart. The daemon's socket admits only its owner, root
//! and a configured group ([`AdminListener`], checked with `SO_PEERCRED`), and
//! every operation that changes something is logged with the peer's uid (an
//! audit line, target `lamina::audit`) and counted on `/metrics`.

use axum::extract::{ConnectInfo, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use lamina_engine::{
    CachePriority, CleanerState, EngineError, IoError, Pin, Pool, TierPolicy, VolumeError,
};
use lamina_nbd::NbdServer;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::api;
use crate::export::OpenExports;
use lamina_api::Deleted;
use serde::{Deserialize, Serialize};

/// One administrative operation.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "operation", rename_all = "snake_case", deny_unknown_fields)]
pub enum Operation {
    VolumeList,
    /// A thin volume; a priority or pin given here is set right after it is
    /// created (the rest of the policy is the default).
    VolumeCreate {
        name: String,
        size_bytes: u64,
        #[serde(default)]
        priority: Option<CachePriority>,
        #[serde(default)]
        pin: Option<Pin>,
    },
    /// Changes a volume's tier policy, live and durably; what is absent stays.
    VolumeSetPolicy {
        name: String,
        #[serde(default)]
        priority: Option<CachePriority>,
        #[serde(default)]
        pin: Option<Pin>,
    },
    /// Where a volume's blocks live and where its reads were served from.
    VolumeStats {
        name: String,
    },
    /// NBD reads, writes, bytes and latency histograms since the daemon
    /// started, of one volume or of all (empty without a daemon).
    VolumeIo {
        #[serde(default)]
        name: Option<String>,
    },
    VolumeResize {
        name: String,
        size_bytes: u64,
        force: bool,
    },
    VolumeRename {
        name: String,
        new_name: String,
    },
    VolumeDelete {
        name: String,
    },
    /// A read-only snapshot `volume@snapshot` of a volume's current contents.
    SnapshotCreate {
        volume: String,
        snapshot: String,
    },
    /// Snapshots of one volume, or of all when `volume` is absent.
    SnapshotList {
        #[serde(default)]
        volume: Option<String>,
    },
    SnapshotDelete {
        volume: String,
        snapshot: String,
    },
    /// Reads every live block, checks it, repairs what fails from redundancy.
    PoolScrub {
        /// Scrub to the end before answering (otherwise in the background).
        #[serde(default)]
        wait: bool,
    },
    /// Refused while NBD clients have the volume open, unless `force`.
    SnapshotRollback {
        volume: String,
        snapshot: String,
        #[serde(default)]
        force: bool,
    },
    /// A writable volume `new_name` starting as `volume@snapshot`.
    VolumeClone {
        volume: String,
        snapshot: String,
        new_name: String,
    },
    PoolStatus,
    /// Every device of an array pool.
    DeviceList,
    /// Takes a device out by hand, as if it had failed.
    DeviceFail {
        path: String,
    },
    /// Rebuilds `old`'s contents onto `new` (`PATH[:SIZE]`), which then
    /// takes its place.
    DeviceReplace {
        old: String,
        new: String,
        /// Rebuild to the end before answering (otherwise in the background).
        #[serde(default)]
        wait: bool,
    },
    /// Moves the data of `path` onto the tier's other devices, then empties
    /// its slot (answers when done).
    DeviceRemove {
        path: String,
    },
    /// `path` (`PATH[:SIZE]`) joins `tier`'s array in an empty slot.
    DeviceAdd {
        path: String,
        tier: lamina_api::TierName,
    },
    /// Rebuilds onto distributed spare space now (what `rebuild_automatic`
    /// does by itself): the data of segments on a lost device moves to the
    /// others.
    DeviceRebuild,
    /// Moves the data of segments narrower than the arrays now are (after
    /// `device add`) to segments laid out over every device in use
    /// (answers when done).
    DeviceRebalance,
}

impl Operation {
    /// The operation's name as sent (`volume_create`).
    pub fn name(&self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|value| value["operation"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    /// Whether the operation changes the pool (and is therefore audited).
    pub fn changes_state(&self) -> bool {
        !matches!(
            self,
            Operation::VolumeList
                | Operation::VolumeStats { .. }
                | Operation::VolumeIo { .. }
                | Operation::SnapshotList { .. }
                | Operation::PoolStatus
                | Operation::DeviceList
        )
    }
}

/// Who is on the other end of an admin connection (`SO_PEERCRED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdminPeer {
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<i32>,
}

/// Who may use the admin socket: its owner (the daemon's user), root, and the
/// members of `group`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdminGate {
    pub owner_uid: u32,
    pub group: Option<u32>,
}

impl AdminGate {
    pub fn admits(&self, peer: &AdminPeer) -> bool {
        if peer.uid == self.owner_uid || peer.uid == 0 {
            return true;
        }
        self.group.is_some_and(|group| {
            peer.gid == group || crate::access::supplementary_groups(peer.pid).contains(&group)
        })
    }
}

/// What the admin socket has refused and done: connections from peers the
/// gate does not admit, and changing operations by name and outcome.
#[derive(Debug, Default)]
pub struct AdminAudit {
    refused_connections: AtomicU64,
    /// (operation, succeeded) → count.
    operations: Mutex<BTreeMap<(String, bool), u64>>,
}

impl AdminAudit {
    pub(crate) fn record(
        &self,
        peer: &AdminPeer,
        operation: &Operation,
        outcome: &Result<(), String>,
    ) {
        let name = operation.name();
        let detail = serde_json::to_string(operation).unwrap_or_default();
        match outcome {
            Ok(()) => {
                tracing::info!(target: "lamina::audit", uid = peer.uid, gid = peer.gid, pid = peer.pid, operation = %name, request = %detail, outcome = "ok", "admin operation")
            }
            Err(error) => {
                tracing::info!(target: "lamina::audit", uid = peer.uid, gid = peer.gid, pid = peer.pid, operation = %name, request = %detail, outcome = "error", %error, "admin operation")
            }
        }
        self.count(name, outcome.is_ok());
    }

    /// Logs and counts a changing operation from the web page's TCP listener.
    pub(crate) fn record_from_address(
        &self,
        address: std::net::SocketAddr,
        operation: &Operation,
        outcome: &Result<(), String>,
    ) {
        let name = operation.name();
        let detail = serde_json::to_string(operation).unwrap_or_default();
        match outcome {
            Ok(()) => {
                tracing::info!(target: "lamina::audit", %address, operation = %name, request = %detail, outcome = "ok", "admin operation from the web page")
            }
            Err(error) => {
                tracing::info!(target: "lamina::audit", %address, operation = %name, request = %detail, outcome = "error", %error, "admin operation from the web page")
            }
        }
        self.count(name, outcome.is_ok());
    }

    fn count(&self, name: String, succeeded: bool) {
        let mut operations = self
            .operations
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        *operations.entry((name, succeeded)).or_insert(0) += 1;
    }

    /// Connections refused because the peer is not the owner, root or in the group.
    pub fn refused_connection_count(&self) -> u64 {
        self.refused_connections.load(Ordering::Relaxed)
    }
}

/// The admin socket's listener: accepts like a Unix listener, but closes
/// connections from peers the gate does not admit, before any request is read.
pub struct AdminListener {
    pub listener: tokio::net::UnixListener,
    pub gate: AdminGate,
    pub audit: Arc<AdminAudit>,
}

/// Pause after a failed accept, so the loop does not spin.
const ADMIN_ACCEPT_ERROR_PAUSE_MS: u64 = 100;

impl axum::serve::Listener for AdminListener {
    type Io = tokio::net::UnixStream;
    type Addr = AdminPeer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let stream = match self.listener.accept().await {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "admin socket accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(
                        ADMIN_ACCEPT_ERROR_PAUSE_MS,
                    ))
                    .await;
                    continue;
                }
            };
            let Ok(credentials) = stream.peer_cred() else {
                continue;
            };
            let peer = AdminPeer {
                uid: credentials.uid(),
                gid: credentials.gid(),
                pid: credentials.pid(),
            };
            if self.gate.admits(&peer) {
                return (stream, peer);
            }
            self.audit
                .refused_connections
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(target: "lamina::audit", uid = peer.uid, gid = peer.gid, pid = peer.pid, "admin connection refused: not the owner, root or a member of admin_group");
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(AdminPeer {
            uid: self.gate.owner_uid,
            gid: 0,
            pid: None,
        })
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, AdminListener>>
    for AdminPeer
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, AdminListener>) -> Self {
        *stream.remote_addr()
    }
}

/// What the daemon's admin handlers share: the operations' context and the audit.
#[derive(Clone)]
struct Served {
    context: AdminContext,
    audit: Arc<AdminAudit>,
}

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
}

/// A failed operation: an HTTP status, a message for the user, and what kind
/// of error it is, for clients that act on it (the CLI adds which flag
/// overrides a refusal) without reading the message.
#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
#[error("{error}")]
pub struct OperationError {
    pub status: u16,
    pub error: String,
    /// The engine error's [`EngineError::kind`] (`"shrink_needs_force"`), one
    /// of the control plane's own (`"volume_in_use"`), or empty when unknown
    /// (answers of daemons from before kinds were sent).
    #[serde(default)]
    pub kind: String,
}

/// [`OperationError::kind`] of a rollback refused because NBD clients have the
/// volume open.
pub const VOLUME_IN_USE_KIND: &str = "volume_in_use";

impl From<EngineError> for OperationError {
    fn from(error: EngineError) -> Self {
        let status = match &error {
            EngineError::Volume(error) => match error {
                VolumeError::NoSuchVolume(_) | VolumeError::NoSuchSnapshot { .. } => 404,
                VolumeError::VolumeExists(_)
                | VolumeError::SnapshotExists { .. }
                | VolumeError::HasClones { .. }
                | VolumeError::NotNewestSnapshot { .. } => 409,
                VolumeError::InvalidName { .. }
                | VolumeError::InvalidSize { .. }
                | VolumeError::ShrinkNeedsForce { .. } => 400,
                VolumeError::ReadOnly(_) => 500,
            },
            EngineError::Io(IoError::NoSpace | IoError::DeviceFull { .. }) => 507,
            _ => 500,
        };
        Self {
            status,
            error: error.to_string(),
            kind: error.kind().to_string(),
        }
    }
}

pub async fn execute(
    context: &AdminContext,
    operation: Operation,
) -> Result<serde_json::Value, OperationError> {
    let pool = &context.pool;
    let value = match operation {
        Operation::VolumeList => serde_json::to_value(
            pool.list_volumes()
                .into_iter()
                .map(api::volume_info)
                .collect::<Vec<_>>(),
        ),
        Operation::VolumeCreate {
            name,
            size_bytes,
            priority,
            pin,
        } => {
            let created = pool.create_volume(&name, size_bytes).await?;
            let info = if priority.is_none() && pin.is_none() {
                created
            } else {
                set_policy(pool, &name, priority, pin).await?
            };
            serde_json::to_value(api::volume_info(info))
        }
        Operation::VolumeSetPolicy {
            name,
            priority,
            pin,
        } => serde_json::to_value(api::volume_info(
            set_policy(pool, &name, priority, pin).await?,
        )),
        Operation::VolumeStats { name } => {
            serde_json::to_value(api::volume_tier_stats(pool.volume_tier_stats(&name)?))
        }
        Operation::VolumeIo { name } => serde_json::to_value(volume_io(context, name)?),
        Operation::VolumeResize {
            name,
            size_bytes,
            force,
        } => serde_json::to_value(api::volume_info(
            pool.resize_volume(&name, size_bytes, force).await?,
        )),
        Operation::VolumeRename { name, new_name } => serde_json::to_value(api::volume_info(
            pool.rename_volume(&name, &new_name).await?,
        )),
        Operation::VolumeDelete { name } => {
            pool.delete_volume(&name).await?;
            serde_json::to_value(Deleted { deleted: name })
        }
        Operation::SnapshotCreate { volume, snapshot } => serde_json::to_value(api::snapshot_info(
            pool.create_snapshot(&volume, &snapshot).await?,
        )),
        Operation::SnapshotList { volume } => serde_json::to_value(
            pool.list_snapshots(volume.as_deref())?
                .into_iter()
                .map(api::snapshot_info)
                .collect::<Vec<_>>(),
        ),
        Operation::SnapshotDelete { volume, snapshot } => {
            pool.delete_snapshot(&volume, &snapshot).await?;
            serde_json::to_value(Deleted {
                deleted: format!("{volume}@{snapshot}"),
            })
        }
        Operation::SnapshotRollback {
            volume,
            snapshot,
            force,
        } => {
            let connected = context.open_exports.count(pool.volume_id(&volume)?);
            if connected > 0 && !force {
                return Err(OperationError {
                    status: 409,
                    error: format!(
                        "volume {volume} has {connected} NBD connection(s) open; disconnect them, or force the rollback (clients then read {volume}@{snapshot}'s contents from their next request, and their caches go stale)"
                    ),
                    kind: VOLUME_IN_USE_KIND.to_string(),
                });
            }
            serde_json::to_value(api::volume_info(
                pool.rollback_snapshot(&volume, &snapshot).await?,
            ))
        }
        Operation::VolumeClone {
            volume,
            snapshot,
            new_name,
        } => serde_json::to_value(api::volume_info(
            pool.clone_snapshot(&volume, &snapshot, &new_name).await?,
        )),
        Operation::PoolStatus => serde_json::to_value(pool_status(context)),
        Operation::PoolScrub { wait } => serde_json::to_value(scrub(pool, wait).await?),
        Operation::DeviceList => {
            serde_json::to_value(crate::devices::list(&context.layout).map_err(device_error)?)
        }
        Operation::DeviceFail { path } => {
            crate::devices::fail(pool, &context.layout, &path)
                .await
                .map_err(device_error)?;
            serde_json::to_value(crate::devices::list(&context.layout).map_err(device_error)?)
        }
        Operation::DeviceReplace { old, new, wait } => {
            serde_json::to_value(replace(context, &old, &new, wait).await?)
        }
        Operation::DeviceRemove { path } => serde_json::to_value(
            crate::devices::remove(pool, &context.layout, &context.devices.data_dir, &path)
                .await
                .map_err(device_error)?,
        ),
        Operation::DeviceAdd { path, tier } => serde_json::to_value(
            crate::devices::add(
                pool,
                &context.layout,
                &context.devices,
                tier_role(tier),
                &path,
            )
            .await
            .map_err(device_error)?,
        ),
        Operation::DeviceRebuild => serde_json::to_value(
            crate::devices::rebuild_now(pool, &context.layout)
                .await
                .map_err(device_error)?,
        ),
        Operation::DeviceRebalance => serde_json::to_value(
            crate::devices::rebalance(pool)
                .await
                .map_err(device_error)?,
        ),
    };
    Ok(value.expect("admin results serialise"))
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

async fn operations(
    State(served): State<Served>,
    ConnectInfo(peer): ConnectInfo<AdminPeer>,
    Json(operation): Json<Operation>,
) -> impl IntoResponse {
    let audited = operation.changes_state().then(|| operation.clone());
    let result = execute(&served.context, operation).await;
    if let Some(operation) = audited {
        let outcome = match &result {
            Ok(_) => Ok(()),
            Err(error) => Err(error.error.clone()),
        };
        served.audit.record(&peer, &operation, &outcome);
    }
    match result {
        Ok(value) => (StatusCode::OK, Json(value)).into_response(),
        Err(error) => (
            StatusCode::from_u16(error.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            Json(error),
        )
            .into_response(),
    }
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
        return Err(lamina_engine::EngineError::Io(IoError::ScrubRunning).into());
    }
    let background = pool.clone();
    tokio::spawn(async move {
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
    // Let the scrub start, so that the answer shows it running.
    tokio::task::yield_now().await;
    Ok(api::scrub_status(pool.scrub_status()))
}

async fn health() -> &'static str {
    "ok\n"
}

/// Pool and volume figures in the Prometheus text format.
async fn metrics(State(served): State<Served>) -> impl IntoResponse {
    let context = &served.context;
    let pool = &context.pool;
    let status = pool.status();
    let mut text = String::new();
    let mut gauge = |name: &str, help: &str, value: f64| {
        text.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}\n"
        ));
    };
    gauge(
        "lamina_pool_capacity_bytes",
        "Capacity of the pool's segments.",
        status.capacity_bytes as f64,
    );
    gauge(
        "lamina_pool_used_bytes",
        "Bytes in segments that are not free.",
        status.used_bytes as f64,
    );
    gauge(
        "lamina_pool_free_bytes",
        "Bytes clients can still allocate.",
        status.free_bytes as f64,
    );
    gauge(
        "lamina_pool_reserved_bytes",
        "Bytes kept for the cleaner and checkpoints.",
        status.reserved_bytes as f64,
    );
    gauge(
        "lamina_pool_used_percent",
        "Used share of the space clients can fill (100 when writes fail with ENOSPC).",
        status.used_percent,
    );
    gauge(
        "lamina_pool_usage_warning_percent",
        "The highest usage warning threshold the used share has reached (0 for none).",
        f64::from(status.usage_warning_percent),
    );
    gauge(
        "lamina_client_space_waits_total",
        "Writes that found no free segment and waited for a reclaim (cleaning in the write path).",
        status.space_waits.count as f64,
    );
    gauge(
        "lamina_client_space_wait_seconds_total",
        "Time writes waited for a reclaim, in all.",
        status.space_waits.milliseconds as f64 / 1000.0,
    );
    gauge(
        "lamina_cleaner_pressure",
        "Free-space pressure on the cleaner, 0 (idle) to 1 (nothing free beyond the reserves).",
        status.cleaner_pressure,
    );
    if let Some(amplification) = status.write_amplification {
        gauge(
            "lamina_pool_write_amplification",
            "Device bytes written per client byte over the pool's life.",
            amplification,
        );
    }
    gauge(
        "lamina_cleaner_relocated_blocks",
        "Blocks the cleaner has moved.",
        status.cleaner_relocated_blocks as f64,
    );
    gauge(
        "lamina_segments_set_aside",
        "Segments the cleaner set aside because their summaries do not describe every block.",
        status.integrity.segments_set_aside as f64,
    );
    gauge(
        "lamina_lost_block_reads",
        "Reads of blocks lost with a flash device the pool was restored without.",
        status.integrity.lost_block_reads as f64,
    );
    gauge(
        "lamina_pool_failed",
        "1 when the pool refuses writes after an I/O error.",
        f64::from(u8::from(status.failed.is_some())),
    );
    gauge(
        "lamina_pool_device_full",
        "1 while the device under the pool is out of space (ENOSPC, EDQUOT): writes wait for space, flushes fail with ENOSPC.",
        f64::from(u8::from(status.device_full.is_some())),
    );
    gauge(
        "lamina_pool_device_full_retries",
        "Batch writes retried after finding the device under the pool full, since the pool opened.",
        status.device_full_retries as f64,
    );
    text.push_str("# HELP lamina_cleaner_state 1 for what the paced cleaner is doing: off, idle, paced or short.\n# TYPE lamina_cleaner_state gauge\n");
    for state in [
        CleanerState::Off,
        CleanerState::Idle,
        CleanerState::Paced,
        CleanerState::Short,
    ] {
        let name = serde_json::to_value(state)
            .ok()
            .and_then(|value| value.as_str().map(str::to_owned))
            .unwrap_or_default();
        text.push_str(&format!(
            "lamina_cleaner_state{{state=\"{name}\"}} {}\n",
            u8::from(state == status.cleaner_state)
        ));
    }
    let integrity = &status.integrity;
    for (name, help, value) in [
        (
            "lamina_read_checksum_errors_total",
            "Blocks that failed their checksum when read (each an I/O error, never data).",
            integrity.read_checksum_errors,
        ),
        (
            "lamina_summaries_repaired_total",
            "Damaged batch summaries read from their copies (recovery and cleaning).",
            integrity.summaries_repaired,
        ),
        (
            "lamina_lost_batches_total",
            "Flushed batches whose summary and copy were both unreadable at recovery (data loss).",
            integrity.lost_batches,
        ),
        (
            "lamina_torn_blocks_dropped_total",
            "Unflushed blocks torn by a crash and dropped at recovery.",
            integrity.torn_blocks_dropped,
        ),
        (
            "lamina_damaged_flushed_blocks_total",
            "Flushed blocks found damaged at recovery (reads of them fail).",
            integrity.damaged_flushed_blocks,
        ),
    ] {
        metric_header(&mut text, name, "counter", help);
        text.push_str(&format!("{name} {value}\n"));
    }
    // One listing serves every per-volume gauge: its space accounting walks the maps.
    let volumes = pool.list_volumes();
    text.push_str("# HELP lamina_volume_allocated_bytes Device space used by a volume's mapped blocks.\n# TYPE lamina_volume_allocated_bytes gauge\n");
    for volume in &volumes {
        text.push_str(&format!(
            "lamina_volume_allocated_bytes{{volume=\"{}\"}} {}\n",
            volume.name, volume.allocated_bytes
        ));
    }
    text.push_str("# HELP lamina_volume_used_bytes Device space deleting a volume and its snapshots would free.\n# TYPE lamina_volume_used_bytes gauge\n");
    for volume in &volumes {
        text.push_str(&format!(
            "lamina_volume_used_bytes{{volume=\"{}\"}} {}\n",
            volume.name, volume.used_bytes
        ));
    }
    text.push_str("# HELP lamina_volume_snapshots Snapshots a volume has.\n# TYPE lamina_volume_snapshots gauge\n");
    for volume in &volumes {
        text.push_str(&format!(
            "lamina_volume_snapshots{{volume=\"{}\"}} {}\n",
            volume.name, volume.snapshot_count
        ));
    }
    tier_metrics(pool, &status, &volumes, &mut text);
    scrub_metrics(
        &status.scrub,
        status.integrity.checksum_errors_repaired,
        &mut text,
    );
    background_metrics(&status.background, &mut text);
    if let Some(statistics) = &context.volume_statistics {
        let names: Vec<(u32, String)> = volumes
            .iter()
            .map(|volume| (volume.volume_id, volume.name.clone()))
            .collect();
        crate::volume_statistics::metrics(statistics, &names, &mut text);
    }
    context.layout.metrics(&mut text);
    crate::devices::rebuild_metrics(pool, &context.layout, &mut text);
    if let Some(server) = &context.nbd_server {
        nbd_metrics(server, &mut text);
    }
    admin_metrics(&served.audit, &mut text);
    ([("content-type", "text/plain; version=0.0.4")], text)
}

/// Scrub's progress and the blocks repaired from redundancy.
fn scrub_metrics(scrub: &lamina_engine::ScrubStatus, repaired: u64, text: &mut String) {
    let series = [
        (
            "lamina_scrub_blocks_total",
            "gauge",
            "Live blocks the latest scrub checks.",
            scrub.blocks_total,
        ),
        (
            "lamina_scrub_blocks_scrubbed",
            "gauge",
            "Live blocks the latest scrub has checked.",
            scrub.blocks_scrubbed,
        ),
        (
            "lamina_scrub_blocks_repaired",
            "gauge",
            "Blocks the latest scrub rebuilt from redundancy.",
            scrub.blocks_repaired,
        ),
        (
            "lamina_scrub_blocks_unrepairable",
            "gauge",
            "Blocks the latest scrub found damaged beyond repair.",
            scrub.blocks_unrepairable,
        ),
        (
            "lamina_scrub_parity_repaired",
            "gauge",
            "Parity columns and metadata copies the latest scrub found disagreeing with their row and rewrote.",
            scrub.parity_repaired,
        ),
        (
            "lamina_scrub_rows_checked",
            "gauge",
            "Rows (and metadata copies) whose every column the latest scrub checked.",
            scrub.rows_checked,
        ),
        (
            "lamina_checksum_errors_repaired_total",
            "counter",
            "Blocks that failed their checksum and were rebuilt from redundancy since the pool opened.",
            repaired,
        ),
    ];
    for (name, kind, help, value) in series {
        metric_header(text, name, kind, help);
        text.push_str(&format!("{name} {value}\n"));
    }
}

/// The background budget: the rate it allows, the client latency it
/// follows (no sample while no client request came in the latest window),
/// and the bytes it granted each kind of work.
fn background_metrics(budget: &lamina_engine::BackgroundBudgetStatus, text: &mut String) {
    let gauges = [
        (
            "lamina_background_bytes_per_second",
            "Bytes per second background work (rebuild, cleaner, demoter, scrub) may issue now.",
            Some(budget.bytes_per_second),
        ),
        (
            "lamina_background_bytes_per_second_min",
            "The background budget's floor (background_bytes_per_second_min).",
            Some(budget.bytes_per_second_min),
        ),
        (
            "lamina_background_bytes_per_second_max",
            "The background budget's ceiling (background_bytes_per_second_max).",
            Some(budget.bytes_per_second_max),
        ),
        (
            "lamina_client_latency_target_us",
            "Client latency above which background work backs off now (client_latency_target_ratio times the baseline, or client_latency_target_us if lower).",
            budget.client_latency_target_us,
        ),
        (
            "lamina_client_latency_baseline_us",
            "Client latency learned while background work was idle or at its floor, in microseconds.",
            budget.client_latency_baseline_us,
        ),
        (
            "lamina_client_latency_us",
            "The 99th percentile of client reads and writes over the latest window, in microseconds.",
            budget.client_latency_us,
        ),
    ];
    for (name, help, value) in gauges {
        metric_header(text, name, "gauge", help);
        if let Some(value) = value {
            text.push_str(&format!("{name} {value}\n"));
        }
    }
    metric_header(
        text,
        "lamina_background_granted_bytes_total",
        "counter",
        "Bytes the background budget granted, by kind of work, since the pool opened.",
    );
    for work in lamina_engine::BackgroundWork::ALL {
        let name = serde_json::to_value(work)
            .ok()
            .and_then(|value| value.as_str().map(str::to_owned))
            .unwrap_or_default();
        text.push_str(&format!(
            "lamina_background_granted_bytes_total{{work=\"{name}\"}} {}\n",
            budget.granted_bytes.of(work)
        ));
    }
    metric_header(
        text,
        "lamina_background_urgent_bytes_total",
        "counter",
        "Of those, bytes the cleaner issued without waiting because free space was short.",
    );
    text.push_str(&format!(
        "lamina_background_urgent_bytes_total {}\n",
        budget.urgent_bytes
    ));
}

/// The NBD server's connections, handshakes in progress, and the connections
/// and handshakes its limits refused or closed.
fn nbd_metrics(server: &NbdServer, text: &mut String) {
    let counters = server.counters();
    metric_header(
        text,
        "lamina_nbd_connections",
        "gauge",
        "NBD connections in the transmission phase.",
    );
    text.push_str(&format!(
        "lamina_nbd_connections {}\n",
        counters.connections
    ));
    metric_header(
        text,
        "lamina_nbd_handshakes_in_progress",
        "gauge",
        "NBD connections still in the handshake.",
    );
    text.push_str(&format!(
        "lamina_nbd_handshakes_in_progress {}\n",
        counters.handshakes_in_progress
    ));
    metric_header(
        text,
        "lamina_nbd_connections_refused_total",
        "counter",
        "NBD connections closed because connections_max were being served.",
    );
    text.push_str(&format!(
        "lamina_nbd_connections_refused_total {}\n",
        counters.refused_connections
    ));
    metric_header(
        text,
        "lamina_nbd_handshakes_closed_total",
        "counter",
        "Unfinished NBD handshakes closed, by reason: peer_limit (handshakes_per_peer_max), total_limit (handshakes_in_progress_max), timeout (handshake_timeout_ms), tls_failed (the TLS handshake failed), tls_required (NBD_OPT_EXPORT_NAME before STARTTLS where TLS is required).",
    );
    for (reason, count) in [
        ("peer_limit", counters.handshakes_closed_for_peer_limit),
        ("total_limit", counters.handshakes_closed_for_total_limit),
        ("timeout", counters.handshakes_timed_out),
        ("tls_failed", counters.tls_handshakes_failed),
        ("tls_required", counters.tls_required_closed),
    ] {
        text.push_str(&format!(
            "lamina_nbd_handshakes_closed_total{{reason=\"{reason}\"}} {count}\n"
        ));
    }
    let Some(threads) = server.connection_threads() else {
        return;
    };
    metric_header(
        text,
        "lamina_nbd_thread_connections",
        "gauge",
        "NBD connections (in the handshake or the transmission phase) each connection thread serves.",
    );
    for (thread, count) in threads.connection_counts().into_iter().enumerate() {
        text.push_str(&format!(
            "lamina_nbd_thread_connections{{thread=\"{thread}\"}} {count}\n"
        ));
    }
}

/// The admin socket's refusals and its changing operations.
fn admin_metrics(audit: &AdminAudit, text: &mut String) {
    metric_header(
        text,
        "lamina_admin_connections_refused_total",
        "counter",
        "Admin socket connections closed because the peer is not the owner, root or in admin_group.",
    );
    text.push_str(&format!(
        "lamina_admin_connections_refused_total {}\n",
        audit.refused_connection_count()
    ));
    metric_header(
        text,
        "lamina_admin_operations_total",
        "counter",
        "Changing admin operations (each also an audit log line), by operation and outcome.",
    );
    let operations = audit
        .operations
        .lock()
        .unwrap_or_else(|poison| poison.into_inner());
    for ((operation, succeeded), count) in operations.iter() {
        let outcome = if *succeeded { "ok" } else { "error" };
        text.push_str(&format!(
            "lamina_admin_operations_total{{operation=\"{operation}\",outcome=\"{outcome}\"}} {count}\n"
        ));
    }
}

/// One metric's HELP and TYPE lines.
fn metric_header(text: &mut String, name: &str, kind: &str, help: &str) {
    text.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
}

/// Tier space, promotions, demotions, and per volume its bytes per tier and
/// its block reads by the tier that served them. Capacity series appear only
/// for a pool with a capacity tier.
fn tier_metrics(
    pool: &Pool,
    status: &lamina_engine::PoolStatus,
    volumes: &[lamina_engine::VolumeInfo],
    text: &mut String,
) {
    let tiers: Vec<(&str, lamina_engine::TierSpace)> = std::iter::once(("flash", status.flash))
        .chain(status.capacity.map(|capacity| ("capacity", capacity)))
        .collect();
    for (name, help, value) in [
        (
            "lamina_tier_size_bytes",
            "Bytes of a tier's data segments.",
            (|space: &lamina_engine::TierSpace| space.size_bytes) as fn(&_) -> u64,
        ),
        (
            "lamina_tier_used_bytes",
            "Bytes of a tier's segments in use.",
            |space| space.used_bytes,
        ),
        (
            "lamina_tier_free_bytes",
            "Bytes of a tier's free segments.",
            |space| space.free_bytes,
        ),
    ] {
        metric_header(text, name, "gauge", help);
        for (tier, space) in &tiers {
            text.push_str(&format!("{name}{{tier=\"{tier}\"}} {}\n", value(space)));
        }
    }
    if let Some(flash_only_bytes) = status.flash_only_bytes {
        metric_header(
            text,
            "lamina_flash_only_bytes",
            "gauge",
            "Live bytes whose only copy is on the flash tier (lost with the flash device).",
        );
        text.push_str(&format!("lamina_flash_only_bytes {flash_only_bytes}\n"));
    }
    metric_header(
        text,
        "lamina_tier_promoted_blocks_total",
        "counter",
        "Blocks moved from capacity to flash on access since the pool opened.",
    );
    text.push_str(&format!(
        "lamina_tier_promoted_blocks_total {}\n",
        status.promoted_blocks
    ));
    metric_header(
        text,
        "lamina_tier_demoted_blocks_total",
        "counter",
        "Blocks moved from flash to capacity by the cleaner since the pool opened.",
    );
    text.push_str(&format!(
        "lamina_tier_demoted_blocks_total {}\n",
        status.demoted_blocks
    ));
    // One tier walk per volume; a volume deleted since the listing is skipped.
    let stats: Vec<lamina_engine::VolumeTierStats> = volumes
        .iter()
        .filter_map(|volume| pool.volume_tier_stats(&volume.name).ok())
        .collect();
    metric_header(
        text,
        "lamina_volume_tier_bytes",
        "gauge",
        "Bytes of a volume's live contents on a tier.",
    );
    for volume in &stats {
        text.push_str(&format!(
            "lamina_volume_tier_bytes{{volume=\"{}\",tier=\"flash\"}} {}\n",
            volume.volume, volume.flash_bytes
        ));
        if status.capacity.is_some() {
            text.push_str(&format!(
                "lamina_volume_tier_bytes{{volume=\"{}\",tier=\"capacity\"}} {}\n",
                volume.volume, volume.capacity_bytes
            ));
        }
    }
    metric_header(
        text,
        "lamina_volume_read_blocks_total",
        "counter",
        "Blocks of a volume read, by the tier that served them (memory cache, flash, capacity), since the pool opened.",
    );
    for volume in &stats {
        let counters = &volume.counters;
        let tiers = [
            ("memory", counters.memory_read_blocks),
            ("flash", counters.flash_read_blocks),
            ("capacity", counters.capacity_read_blocks),
        ];
        let tier_count = if status.capacity.is_some() { 3 } else { 2 };
        for (tier, blocks) in &tiers[..tier_count] {
            text.push_str(&format!(
                "lamina_volume_read_blocks_total{{volume=\"{}\",tier=\"{tier}\"}} {blocks}\n",
                volume.volume
            ));
        }
    }
    for (name, help, value) in [
        (
            "lamina_volume_promoted_blocks_total",
            "Blocks of a volume promoted to flash since the pool opened.",
            (|counters: &lamina_engine::VolumeTierCounters| counters.promoted_blocks)
                as fn(&_) -> u64,
        ),
        (
            "lamina_volume_demoted_blocks_total",
            "Blocks of a volume demoted to capacity since the pool opened.",
            |counters| counters.demoted_blocks,
        ),
    ] {
        metric_header(text, name, "counter", help);
        for volume in &stats {
            text.push_str(&format!(
                "{name}{{volume=\"{}\"}} {}\n",
                volume.volume,
                value(&volume.counters)
            ));
        }
    }
}

/// The admin API; serve it on an [`AdminListener`] with
/// `into_make_service_with_connect_info::<AdminPeer>()` (operations need the peer).
pub fn router(context: AdminContext, audit: Arc<AdminAudit>) -> Router {
    Router::new()
        .route("/v1/operations", post(operations))
        .route("/v1/health", get(health))
        .route("/metrics", get(metrics))
        .with_state(Served { context, audit })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_refusal_carries_its_kind_and_an_old_answer_without_one_reads() {
        let refused = OperationError::from(EngineError::Volume(VolumeError::ShrinkNeedsForce {
            volume: "db".into(),
            from_bytes: 2,
            to_bytes: 1,
        }));
        assert_eq!(
            (refused.status, refused.kind.as_str()),
            (400, "shrink_needs_force")
        );
        let answer = serde_json::to_value(&refused).expect("serialises");
        assert_eq!(answer["kind"], "shrink_needs_force");
        let old: OperationError =
            serde_json::from_str(r#"{"status": 404, "error": "no such volume: db"}"#)
                .expect("an answer without a kind reads");
        assert_eq!((old.status, old.kind.as_str()), (404, ""));
        assert_eq!(old.to_string(), "no such volume: db");
    }
}
