//! The pool: the engine's front door. It owns the device and the in-memory state
//! ([`state`]), turns client reads and writes of any byte range into block
//! operations (read-modify-write inside the engine for partial blocks), batches
//! writes into the log, makes them durable on flush, checkpoints the maps in the
//! background, and performs the volume operations of the control plane.
//!
//! Durability: a write is acknowledged once it is in the open batch (memory). A
//! flush seals the open batch, waits until every sealed batch has reached the
//! device, then flushes the device: one round of device writes plus one device
//! flush. Unflushed data is bounded by `dirty_bytes_max` and `flush_interval_ms`,
//! enforced by a background task that flushes when either is exceeded.

mod background;
pub mod budget;
pub mod cache_warmup;
mod checkpoint;
pub mod cleaner;
pub(crate) mod core;
pub mod io;
mod open;
mod openings;
pub mod repair;
pub mod space;
mod status;
pub mod tiering;

pub use self::core::Pool;
pub use self::core::integrity::RestorePoint;
pub use self::core::limits::{
    BackgroundBudgetLimits, BackgroundImpact, LimitsError, PoolLimits, PoolOptions, TestHooks,
};
use self::core::state::State;
use crate::error::{EngineError, IoError, VolumeError};
use crate::log::batch::Record;
use crate::volume::{
    Origin, PendingSnapshotInfo, PendingVolumeInfo, SnapshotInfo, View, VolumeInfo,
    validate_volume_name, validate_volume_size,
};
use cache_warmup::{CacheContents, CacheWarmup, CacheWarmupStatus};
use checkpoint::Checkpointer;
pub use io::device_full::DeviceFullStatus;
pub use io::read::{Extent, ReadExtents};
pub use open::flash_restore::{FlashRestore, RestoredFlash};
/// The evacuation's module at its path before the pool was grouped into
/// folders: the control crate names `pool::evacuation::RebuildBlocked`.
pub use repair::evacuation;
use repair::evacuation::{Evacuation, EvacuationGoal, EvacuationNeed, RebuildBlocked};
use repair::rebuild::progress::RebuildStatus;
use repair::rebuild::{Rebuild, RebuildStart};
use repair::scrub::Scrub;
use repair::scrub::progress::ScrubStatus;
pub use status::{PoolStatus, TierSpace, VolumeTierStats};

pub use tiering::flush::CLIENT_FLUSH_CAPACITY_WAIT_MS;
use tiering::flush::marker_claims;

impl Pool {
    // ----- lifetime -----

    /// Flushes, writes a final checkpoint (so the next open replays nothing) and
    /// stops background work, waiting for each service to end its step.
    /// While the capacity tier's writes are suspended the checkpoint is
    /// skipped with a warning: what clients wrote is durable on flash and the
    /// next open replays it (decision 0032).
    pub async fn close(&self) -> Result<(), EngineError> {
        background::close(self).await
    }

    /// Stops background work without flushing: what a crash leaves behind, for tests.
    pub fn abandon(&self) {
        background::abandon(self);
    }

    // ----- scrub -----

    /// Scrubs the whole pool and returns what it found; refused while a
    /// scrub is running. Flushes first, so that every live block is on the
    /// device.
    pub async fn scrub(&self) -> Result<ScrubStatus, EngineError> {
        Scrub::new(self).run().await
    }

    /// Scrub's progress (also in `pool status`).
    pub fn scrub_status(&self) -> ScrubStatus {
        self.inner.scrub.status()
    }

    // ----- checkpoints -----

    /// Writes a checkpoint now. Safe to call at any time; concurrent calls queue.
    pub async fn checkpoint(&self) -> Result<(), EngineError> {
        Checkpointer::new(&self.inner).checkpoint().await
    }

    /// Writes a base checkpoint now, whatever the chain: two in a row free
    /// every older body (the evacuation moves checkpoint bodies off
    /// degraded or narrow segments so).
    pub async fn checkpoint_base(&self) -> Result<(), EngineError> {
        Checkpointer::new(&self.inner).checkpoint_base().await
    }

    // ----- memory cache warm-up -----

    /// What the memory cache holds now, by logical identity, hottest first
    /// (blocks no map holds any more are left out). Walks copies of the maps
    /// outside the state lock.
    pub fn cache_contents(&self) -> CacheContents {
        CacheWarmup::contents(&self.inner)
    }

    /// Loads the blocks `contents` lists into the memory cache in the
    /// background (see `cache_warmup`); returns at once. Does nothing with
    /// `memory_cache_warm_restart` off, without a memory cache, or when a
    /// warm-up already ran since the pool opened.
    pub fn warm_cache(&self, contents: CacheContents) {
        CacheWarmup::start(&self.inner, contents);
    }

    /// The warm-up's progress.
    pub fn cache_warmup_status(&self) -> CacheWarmupStatus {
        self.inner.cache_warmup.status()
    }

    // ----- rebuild -----

    /// Whether a device beneath the pool is being rebuilt.
    pub fn rebuild_pending(&self) -> bool {
        Rebuild::new(self).pending()
    }

    /// The rebuild's progress (also in `pool status`).
    pub fn rebuild_status(&self) -> RebuildStatus {
        Rebuild::new(self).status()
    }

    /// Starts a rebuild in the background if none runs: onto a replacement
    /// when one is pending; otherwise, with `rebuild_automatic`, by moving
    /// the data of degraded segments onto the devices left, when they can
    /// hold it (`repair/evacuation.rs`).
    pub fn start_rebuild(&self) -> RebuildStart {
        Rebuild::new(self).start()
    }

    /// Rebuilds every range the pool keeps onto the replacement, then lets
    /// it take its member's place. Refused while a rebuild runs; nothing to
    /// do when none is pending.
    pub async fn rebuild(&self) -> Result<RebuildStatus, EngineError> {
        Rebuild::new(self).run().await
    }

    // ----- evacuation -----

    /// What restoring redundancy by moving data would take now; nothing
    /// while the devices in use are too few to lay segments out without the
    /// lost one.
    pub fn evacuation_need(&self) -> EvacuationNeed {
        Evacuation::new(self).need()
    }

    /// What moving the segments `goal` names would take now.
    pub fn evacuation_need_for(&self, goal: EvacuationGoal) -> EvacuationNeed {
        Evacuation::new(self).need_for(goal)
    }

    /// Why no rebuild restores the pool's redundancy, when segments in use
    /// have less than the pool was made with and none runs, is pending or
    /// will start by itself; `None` otherwise (nothing is degraded, or a
    /// rebuild runs or starts at the next check).
    pub fn rebuild_blocked(&self) -> Option<RebuildBlocked> {
        Evacuation::new(self).blocked()
    }

    /// Moves the data of every degraded segment into segments laid out over
    /// the devices in use. Refused while a rebuild runs.
    pub async fn evacuate(&self) -> Result<RebuildStatus, EngineError> {
        Evacuation::new(self).run(EvacuationGoal::Redundancy).await
    }

    /// Moves the data of every segment not laid out over the devices in
    /// use (after a device was added) into segments opened now, at the
    /// array's new width. Refused while a rebuild or rebalance runs.
    pub async fn rebalance(&self) -> Result<RebuildStatus, EngineError> {
        Evacuation::new(self).run(EvacuationGoal::Width).await
    }

    // ----- volumes -----

    /// Every volume with its space accounting. The accounting compares maps;
    /// it runs after the state lock is released, on copies of the maps.
    pub fn list_volumes(&self) -> Vec<VolumeInfo> {
        let pending: Vec<_> = {
            let state = self.inner.lock();
            state
                .volumes()
                .iter()
                .filter_map(|volume| state.volumes().volume_info(volume.volume_id))
                .collect()
        };
        pending
            .into_iter()
            .map(PendingVolumeInfo::compute)
            .collect()
    }

    pub fn volume_info(&self, name: &str) -> Result<VolumeInfo, EngineError> {
        let pending = {
            let state = self.inner.lock();
            let volume_id = state.volumes().id_of(name)?;
            state
                .volumes()
                .volume_info(volume_id)
                .expect("id from name")
        };
        Ok(pending.compute())
    }

    /// The view (volume or snapshot) a name denotes: `VOL` or `VOL@SNAP`.
    pub fn resolve_view(&self, full_name: &str) -> Result<View, EngineError> {
        self.inner.lock().volumes().resolve(full_name)
    }

    /// Size of a volume or snapshot (None once deleted).
    pub fn view_size_bytes(&self, view: View) -> Option<u64> {
        self.inner
            .lock()
            .volumes()
            .view(view)
            .map(|found| found.size_bytes)
    }

    // ----- snapshots and clones -----

    /// Snapshots of one volume, or of every volume, oldest first per volume.
    pub fn list_snapshots(&self, volume: Option<&str>) -> Result<Vec<SnapshotInfo>, EngineError> {
        let pending = {
            let state = self.inner.lock();
            match volume {
                Some(name) => state.volumes().snapshot_infos(state.volumes().id_of(name)?),
                None => state
                    .volumes()
                    .iter()
                    .flat_map(|volume| state.volumes().snapshot_infos(volume.volume_id))
                    .collect(),
            }
        };
        Ok(pending
            .into_iter()
            .map(PendingSnapshotInfo::compute)
            .collect())
    }

    /// `VOL@SNAP` of every snapshot (cheap: no space accounting).
    pub fn snapshot_full_names(&self) -> Vec<String> {
        self.inner.lock().volumes().snapshot_full_names()
    }

    fn snapshot_info_of(&self, volume: &str, snapshot: &str) -> Result<SnapshotInfo, EngineError> {
        let pending = {
            let state = self.inner.lock();
            let (volume_id, index) = state.volumes().find_snapshot(volume, snapshot)?;
            state
                .volumes()
                .snapshot_info(volume_id, index)
                .expect("found")
        };
        Ok(pending.compute())
    }

    /// Takes a read-only snapshot of a volume's current contents: atomic, durable
    /// on return, and O(chunks) in memory (the map's chunks are shared, not copied).
    /// Everything written to the volume before the call is in the snapshot.
    pub async fn create_snapshot(
        &self,
        volume: &str,
        snapshot: &str,
    ) -> Result<SnapshotInfo, EngineError> {
        validate_volume_name(snapshot)?;
        self.control(|state| {
            let volume_id = state.volumes().id_of(volume)?;
            if state
                .volumes()
                .get(volume_id)
                .expect("id from name")
                .snapshot_named(snapshot)
                .is_some()
            {
                return Err(EngineError::Volume(VolumeError::SnapshotExists {
                    volume: volume.to_string(),
                    snapshot: snapshot.to_string(),
                }));
            }
            Ok(Record::SnapshotCreate {
                volume_id,
                snapshot_id: state.volumes().next_snapshot_id(),
                name: snapshot.to_string(),
                created_unix_seconds: crate::clock::now_unix_seconds(),
            })
        })
        .await?;
        self.snapshot_info_of(volume, snapshot)
    }

    fn snapshot_ids(
        state: &State,
        volume: &str,
        snapshot: &str,
    ) -> Result<(u32, u32), EngineError> {
        let (volume_id, index) = state.volumes().find_snapshot(volume, snapshot)?;
        let snapshot_id =
            state.volumes().get(volume_id).expect("found").snapshots[index].snapshot_id;
        Ok((volume_id, snapshot_id))
    }

    /// Deletes a snapshot; the blocks only it referenced become reclaimable.
    /// Refused while clones of it exist.
    pub async fn delete_snapshot(&self, volume: &str, snapshot: &str) -> Result<(), EngineError> {
        self.control(|state| {
            let (volume_id, snapshot_id) = Self::snapshot_ids(state, volume, snapshot)?;
            let clones = state.volumes().clone_names(Origin {
                volume_id,
                snapshot_id,
            });
            if !clones.is_empty() {
                return Err(EngineError::Volume(VolumeError::HasClones {
                    what: format!("snapshot {volume}@{snapshot}"),
                    clones: clones.join(", "),
                }));
            }
            Ok(Record::SnapshotDelete {
                volume_id,
                snapshot_id,
            })
        })
        .await
    }

    /// Makes a volume's contents and size those of its newest snapshot. Writes
    /// acknowledged before the call are discarded; reads and writes after it see
    /// the snapshot's contents. Refused for a snapshot that is not the newest.
    pub async fn rollback_snapshot(
        &self,
        volume: &str,
        snapshot: &str,
    ) -> Result<VolumeInfo, EngineError> {
        self.control(|state| {
            let (volume_id, snapshot_id) = Self::snapshot_ids(state, volume, snapshot)?;
            let snapshots = &state
                .volumes()
                .get(volume_id)
                .expect("id from name")
                .snapshots;
            let newer: Vec<&str> = snapshots
                .iter()
                .filter(|candidate| candidate.snapshot_id > snapshot_id)
                .map(|candidate| candidate.name.as_str())
                .collect();
            if !newer.is_empty() {
                return Err(EngineError::Volume(VolumeError::NotNewestSnapshot {
                    volume: volume.to_string(),
                    snapshot: snapshot.to_string(),
                    newer: newer.join(", "),
                }));
            }
            Ok(Record::SnapshotRollback {
                volume_id,
                snapshot_id,
            })
        })
        .await?;
        self.volume_info(volume)
    }

    /// Creates a writable volume whose contents start as those of a snapshot.
    /// Instant and O(chunks); clones of clones work the same way.
    pub async fn clone_snapshot(
        &self,
        volume: &str,
        snapshot: &str,
        new_volume: &str,
    ) -> Result<VolumeInfo, EngineError> {
        validate_volume_name(new_volume)?;
        self.control(|state| {
            let (origin_volume_id, origin_snapshot_id) =
                Self::snapshot_ids(state, volume, snapshot)?;
            if state.volumes().id_of(new_volume).is_ok() {
                return Err(EngineError::Volume(VolumeError::VolumeExists(
                    new_volume.to_string(),
                )));
            }
            Ok(Record::VolumeClone {
                volume_id: state.volumes().next_volume_id(),
                name: new_volume.to_string(),
                origin_volume_id,
                origin_snapshot_id,
                created_unix_seconds: crate::clock::now_unix_seconds(),
            })
        })
        .await?;
        self.volume_info(new_volume)
    }

    /// The identifier to pass to reads and writes.
    pub fn volume_id(&self, name: &str) -> Result<u32, EngineError> {
        self.inner.lock().volumes().id_of(name)
    }

    /// Size of a volume by identifier (None once deleted).
    pub fn volume_size_bytes(&self, volume_id: u32) -> Option<u64> {
        self.inner
            .lock()
            .volumes()
            .get(volume_id)
            .map(|volume| volume.size_bytes)
    }

    /// Appends a control record, applies it, and makes it durable before returning.
    /// Appends a record without data and applies it; when the pool is full,
    /// reclaims space and tries again, rebuilding the record so that it is
    /// checked against the state of that moment.
    async fn append_record(
        &self,
        build: impl Fn(&State) -> Result<Record, EngineError>,
    ) -> Result<(), EngineError> {
        loop {
            let result = {
                let mut state = self.inner.lock();
                let record = build(&state)?;
                state.append_record(record)
            };
            match result {
                Ok(sealed) => {
                    self.spawn_writes(sealed);
                    return Ok(());
                }
                Err(EngineError::Io(IoError::NoSpace)) if self.reclaim().await? => continue,
                Err(error) => return Err(error),
            }
        }
    }

    /// A control operation: appended like any record, and durable on return.
    async fn control(
        &self,
        build: impl Fn(&State) -> Result<Record, EngineError>,
    ) -> Result<(), EngineError> {
        self.append_record(build).await?;
        self.flush().await
    }

    pub async fn create_volume(
        &self,
        name: &str,
        size_bytes: u64,
    ) -> Result<VolumeInfo, EngineError> {
        validate_volume_name(name)?;
        validate_volume_size(size_bytes)?;
        self.control(|state| {
            if state.volumes().id_of(name).is_ok() {
                return Err(EngineError::Volume(VolumeError::VolumeExists(
                    name.to_string(),
                )));
            }
            Ok(Record::VolumeCreate {
                volume_id: state.volumes().next_volume_id(),
                name: name.to_string(),
                size_bytes,
                created_unix_seconds: crate::clock::now_unix_seconds(),
            })
        })
        .await?;
        self.volume_info(name)
    }

    /// Grows online; shrinking discards the tail and needs `force`.
    pub async fn resize_volume(
        &self,
        name: &str,
        size_bytes: u64,
        force: bool,
    ) -> Result<VolumeInfo, EngineError> {
        validate_volume_size(size_bytes)?;
        self.control(|state| {
            let volume_id = state.volumes().id_of(name)?;
            let current = state
                .volumes()
                .get(volume_id)
                .expect("id from name")
                .size_bytes;
            if size_bytes < current && !force {
                return Err(EngineError::Volume(VolumeError::ShrinkNeedsForce {
                    volume: name.to_string(),
                    from_bytes: current,
                    to_bytes: size_bytes,
                }));
            }
            Ok(Record::VolumeResize {
                volume_id,
                size_bytes,
            })
        })
        .await?;
        self.volume_info(name)
    }

    pub async fn rename_volume(
        &self,
        name: &str,
        new_name: &str,
    ) -> Result<VolumeInfo, EngineError> {
        validate_volume_name(new_name)?;
        self.control(|state| {
            let volume_id = state.volumes().id_of(name)?;
            if state.volumes().id_of(new_name).is_ok() {
                return Err(EngineError::Volume(VolumeError::VolumeExists(
                    new_name.to_string(),
                )));
            }
            Ok(Record::VolumeRename {
                volume_id,
                name: new_name.to_string(),
            })
        })
        .await?;
        self.volume_info(new_name)
    }

    /// Deletes a volume with all its snapshots. Refused while any of its
    /// snapshots has clones.
    pub async fn delete_volume(&self, name: &str) -> Result<(), EngineError> {
        self.control(|state| {
            let volume_id = state.volumes().id_of(name)?;
            let clones = state.volumes().clone_names_of_volume(volume_id);
            if !clones.is_empty() {
                return Err(EngineError::Volume(VolumeError::HasClones {
                    what: format!("volume {name}"),
                    clones: clones.join(", "),
                }));
            }
            Ok(Record::VolumeDelete { volume_id })
        })
        .await
    }

    /// Makes every write acknowledged before this call durable. In a
    /// two-tier pool that needs only the flash tier (client data and control
    /// records live there, and what was demoted keeps its flash copy until
    /// its capacity copy is durable, [`Pool::flush_all`]); the capacity tier
    /// is flushed too while it takes writes, so that the log claims the
    /// client's batches as flushed (see `flush_through`).
    pub async fn flush(&self) -> Result<(), EngineError> {
        let target = self.inner.seal_for_flush()?;
        self.inner.flush_through(target).await
    }

    /// Makes the newest flush marker durable when no flush has covered it
    /// yet (the background task's part of `flush_marker`).
    async fn flush_marker_durably(&self) -> Result<(), EngineError> {
        if !self.inner.flush_marker.needs_durability_flush() {
            return Ok(());
        }
        let _guard = self.inner.flush_lock.lock().await;
        self.inner.lock().check_failed()?;
        let marker_covered = self.inner.flush_marker.before_device_flush().await;
        // The marker lives on flash.
        self.inner.flush_flash().await?;
        let claims = marker_claims(self.inner.lock().writer());
        self.inner.write_flush_marker(marker_covered, claims).await;
        Ok(())
    }

    /// Waits until the marker of the last completed flush has been written to
    /// the device (not necessarily flushed): a process that dies after this
    /// leaves recovery able to tell that flush's batches from a torn tail.
    pub async fn flush_marker_written(&self) {
        self.inner.flush_marker.settled().await;
    }

    /// Changes a volume's tier policy, durably; it applies to the volume's
    /// snapshots too, and from the next read or cleaning on.
    pub async fn set_volume_policy(
        &self,
        name: &str,
        policy: crate::volume::TierPolicy,
    ) -> Result<VolumeInfo, EngineError> {
        self.control(|state| {
            Ok(Record::VolumePolicy {
                volume_id: state.volumes().id_of(name)?,
                policy: policy.into(),
            })
        })
        .await?;
        self.volume_info(name)
    }
}
