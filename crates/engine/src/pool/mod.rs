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

use std::sync::Arc;

use lamina_device::BlockDevice;

pub use self::core::Pool;
pub use self::core::integrity::RestorePoint;
pub use self::core::limits::{
    BackgroundBudgetLimits, BackgroundImpact, LimitsError, PoolLimits, PoolOptions, TestHooks,
};
use self::core::state::State;
use crate::error::{EngineError, VolumeError};
use crate::log::batch::Record;
use crate::volume::{
    Origin, PendingSnapshotInfo, PendingVolumeInfo, SnapshotInfo, View, VolumeInfo,
    validate_volume_name, validate_volume_size,
};
use cache_warmup::{CacheContents, CacheWarmup, CacheWarmupStatus};
use checkpoint::Checkpointer;
use cleaner::Cleaner;
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

impl Pool {
    // ----- creating and opening -----

    /// Creates a pool on `device`. Refuses a device whose first MiB holds any
    /// non-zero byte unless `options.force` is set.
    pub async fn create(
        device: Arc<dyn BlockDevice>,
        options: PoolOptions,
        limits: PoolLimits,
    ) -> Result<Pool, EngineError> {
        open::create(device, options, limits).await
    }

    /// Opens (recovers) the pool on `device`: checks the superblock, loads
    /// the newest checkpoint that verifies, replays the log after it, rebuilds
    /// the segment table, and makes what it replayed durable.
    pub async fn open(
        device: Arc<dyn BlockDevice>,
        limits: PoolLimits,
    ) -> Result<Pool, EngineError> {
        open::open(device, limits).await
    }

    /// Opens a pool whose flash device [`Pool::restore_flash`] has just
    /// rebuilt: as `open`, except that replay applies only the capacity
    /// tier's moves of contents the checkpoint holds, so that every volume
    /// is as of that checkpoint ([`Pool::restored_as_of`]), and after replay
    /// every entry the maps still place on flash is marked lost (its data
    /// went with the lost device; the new flash holds none of it), so that
    /// reading it is an I/O error and it holds no flash space; two
    /// checkpoints then make the marks durable.
    pub async fn open_restored(
        device: Arc<dyn BlockDevice>,
        limits: PoolLimits,
    ) -> Result<Pool, EngineError> {
        open::open_restored(device, limits).await
    }

    /// Writes onto the flash region of `restore.device` the superblock and
    /// the checkpoint slots copied on the capacity tier, then flushes; open
    /// the pool with [`Pool::open_restored`] afterwards ([`Pool::open`] would
    /// leave the lost blocks mapped to the new flash, holding its space).
    /// Refuses a flash region of
    /// another size than the lost one's, a flash device holding data (unless
    /// forced), a capacity device without a label, and one without a usable
    /// slot copy (a pool last written by a build older than format version 9).
    pub async fn restore_flash(restore: FlashRestore<'_>) -> Result<RestoredFlash, EngineError> {
        open::flash_restore::restore_flash(restore).await
    }

    /// The size of the flash device the pool on `capacity` (a capacity
    /// device alone, without the flash before it) was created with: what a
    /// new flash device must measure to restore it.
    pub async fn lost_flash_region_bytes(capacity: &dyn BlockDevice) -> Result<u64, EngineError> {
        open::flash_restore::lost_flash_region_bytes(capacity).await
    }

    /// The point of its history the pool is as of when [`Pool::open_restored`]
    /// opened it (decision 0056): the copied checkpoint it was restored
    /// from; `None` for a pool opened otherwise.
    pub fn restored_as_of(&self) -> Option<RestorePoint> {
        self.core.integrity().restored_as_of()
    }

    // ----- lifetime -----

    /// The handle on a core; `open` starts the background services on it
    /// (`background::start`).
    pub(in crate::pool) fn from_core(core: Arc<core::Core>) -> Self {
        Self { core }
    }

    pub fn device_name(&self) -> &str {
        self.core.device().name()
    }

    pub fn limits(&self) -> &PoolLimits {
        self.core.limits()
    }

    /// Flushes, writes a final checkpoint (so the next open replays nothing) and
    /// stops background work, waiting for each service to end its step.
    /// While the capacity tier's writes are suspended the checkpoint is
    /// skipped with a warning: what clients wrote is durable on flash and the
    /// next open replays it (decision 0032).
    pub async fn close(&self) -> Result<(), EngineError> {
        background::close(&self.core).await
    }

    /// Stops background work without flushing: what a crash leaves behind, for tests.
    pub fn abandon(&self) {
        background::abandon(&self.core);
    }

    // ----- reads and writes -----

    /// Reads `buffer.len()` bytes at byte `offset` of a volume. Unwritten blocks
    /// read as zeros; every block read from the device is checked against its
    /// checksum and a mismatch is an error, never data.
    pub async fn read(
        &self,
        volume_id: u32,
        offset: u64,
        buffer: &mut [u8],
    ) -> Result<(), EngineError> {
        self.read_view(View::Volume(volume_id), offset, buffer)
            .await
    }

    /// Reads from a volume or a snapshot (see [`Pool::read`]). Its latency
    /// goes to the background budget, which yields to slow clients.
    pub async fn read_view(
        &self,
        view: View,
        offset: u64,
        buffer: &mut [u8],
    ) -> Result<(), EngineError> {
        self.read_view_with_extents(view, offset, buffer, &mut ReadExtents::new())
            .await
    }

    /// Reads like [`Pool::read_view`] and leaves in `extents` the allocation
    /// status of the bytes read, from the same walk of the map that planned
    /// the read: the NBD server sends holes as hole chunks without a second
    /// walk under the state lock, and the status is the one the data has.
    pub async fn read_view_with_extents(
        &self,
        view: View,
        offset: u64,
        buffer: &mut [u8],
        extents: &mut ReadExtents,
    ) -> Result<(), EngineError> {
        self.core
            .read_view_with_extents(view, offset, buffer, extents)
            .await
    }

    /// Allocation map of a byte range, as runs of allocated and unallocated bytes.
    pub fn extents(
        &self,
        volume_id: u32,
        offset: u64,
        length: u64,
    ) -> Result<Vec<Extent>, EngineError> {
        self.extents_view(View::Volume(volume_id), offset, length)
    }

    /// Allocation map of a volume or a snapshot (see [`Pool::extents`]).
    pub fn extents_view(
        &self,
        view: View,
        offset: u64,
        length: u64,
    ) -> Result<Vec<Extent>, EngineError> {
        self.core.extents_view(view, offset, length)
    }

    /// The allocation map of [`Pool::extents_view`], handed to `visit` extent
    /// by extent: the NBD server asks it on every read, to find holes, and a
    /// read's few extents are gathered without allocating. `visit` runs after
    /// the state lock is released, so it may call the pool.
    pub fn visit_extents_view(
        &self,
        view: View,
        offset: u64,
        length: u64,
        visit: impl FnMut(Extent),
    ) -> Result<(), EngineError> {
        self.core.visit_extents_view(view, offset, length, visit)
    }

    /// Writes `data` at byte `offset`. Partial blocks at either end are merged
    /// with their current contents under a per-block lock. With `fua`, the write
    /// (and everything before it) is durable when this returns. Its latency
    /// goes to the background budget, which yields to slow clients.
    pub async fn write(
        &self,
        volume_id: u32,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<(), EngineError> {
        self.core.write(volume_id, offset, data, fua).await
    }

    /// A write without FUA appended at once when it can be without waiting
    /// (whole blocks, a batch slot free, room in the pool): `None` when it
    /// cannot, and the caller then runs [`Pool::write`]. It spares a caller
    /// that serves many writes a future per write.
    pub fn write_without_waiting(
        &self,
        volume_id: u32,
        offset: u64,
        data: &[u8],
    ) -> Option<Result<(), EngineError>> {
        self.core.write_without_waiting(volume_id, offset, data)
    }

    /// Makes `length` bytes at `offset` read as zeros. Whole blocks are unmapped
    /// (their space becomes reclaimable) unless `punch_hole` is false, in which
    /// case zero blocks are written; partial blocks at the edges are zeroed in place.
    pub async fn write_zeroes(
        &self,
        volume_id: u32,
        offset: u64,
        length: u64,
        fua: bool,
        punch_hole: bool,
    ) -> Result<(), EngineError> {
        self.core
            .write_zeroes(volume_id, offset, length, fua, punch_hole)
            .await
    }

    /// Discards a range: the same as punching zeros (reads return zeros after).
    pub async fn trim(
        &self,
        volume_id: u32,
        offset: u64,
        length: u64,
        fua: bool,
    ) -> Result<(), EngineError> {
        self.core.trim(volume_id, offset, length, fua).await
    }

    // ----- status -----

    /// What the pool reports (`pool status`, `/metrics`).
    pub fn status(&self) -> PoolStatus {
        self.core.status()
    }

    /// Where a volume's blocks live and where its reads came from. The tier
    /// split walks a copy of the volume's map outside the state lock.
    pub fn volume_tier_stats(&self, name: &str) -> Result<VolumeTierStats, EngineError> {
        self.core.volume_tier_stats(name)
    }

    // ----- scrub -----

    /// Scrubs the whole pool and returns what it found; refused while a
    /// scrub is running. Flushes first, so that every live block is on the
    /// device.
    pub async fn scrub(&self) -> Result<ScrubStatus, EngineError> {
        Scrub::new(&self.core).run().await
    }

    /// Scrub's progress (also in `pool status`).
    pub fn scrub_status(&self) -> ScrubStatus {
        self.core.scrub().status()
    }

    // ----- checkpoints -----

    /// Writes a checkpoint now. Safe to call at any time; concurrent calls queue.
    pub async fn checkpoint(&self) -> Result<(), EngineError> {
        Checkpointer::new(&self.core).checkpoint().await
    }

    /// Writes a base checkpoint now, whatever the chain: two in a row free
    /// every older body (the evacuation moves checkpoint bodies off
    /// degraded or narrow segments so).
    pub async fn checkpoint_base(&self) -> Result<(), EngineError> {
        Checkpointer::new(&self.core).checkpoint_base().await
    }

    // ----- cleaner -----

    /// One cleaning pass over at most `segment_count_max` victims chosen by
    /// cost-benefit. Returns how many victims were emptied (they become free
    /// after the next checkpoints).
    pub async fn clean(&self, segment_count_max: usize) -> Result<usize, EngineError> {
        Cleaner::new(&self.core).clean(segment_count_max).await
    }

    /// Victims cleaned so far and their live blocks, per stream that wrote them.
    pub fn cleaner_victim_counts(&self) -> cleaner::placement::VictimCounts {
        Cleaner::new(&self.core).cleaner_victim_counts()
    }

    /// The placement hints a checkpoint would keep now (tests).
    #[doc(hidden)]
    pub fn placement_image(&self) -> crate::log::checkpoint::PlacementImage {
        Cleaner::new(&self.core).placement_image()
    }

    /// Every segment's state and live count, with the free flash segments
    /// and the clients' reserve (tests and diagnostics).
    #[doc(hidden)]
    pub fn segment_table(&self) -> cleaner::SegmentTable {
        Cleaner::new(&self.core).segment_table()
    }

    /// The device block `logical_block` of `volume_id` is mapped to, if any
    /// (diagnostics).
    #[doc(hidden)]
    pub fn physical_block_of(&self, volume_id: u32, logical_block: u64) -> Option<u64> {
        Cleaner::new(&self.core).physical_block_of(volume_id, logical_block)
    }

    /// Where `logical_block` of `volume_id` is stored, if mapped: a whole
    /// block or a fragment (diagnostics and tests).
    #[doc(hidden)]
    pub fn location_of(&self, volume_id: u32, logical_block: u64) -> Option<crate::Location> {
        let state = self.core.lock();
        Some(
            state
                .volumes()
                .get(volume_id)?
                .map
                .get(logical_block)?
                .location,
        )
    }

    /// The segments the cleaner would take next, best first (tests).
    #[doc(hidden)]
    pub fn victim_order(&self, count: usize) -> Vec<u32> {
        Cleaner::new(&self.core).victim_order(count)
    }

    // ----- memory cache warm-up -----

    /// What the memory cache holds now, by logical identity, hottest first
    /// (blocks no map holds any more are left out). Walks copies of the maps
    /// outside the state lock.
    pub fn cache_contents(&self) -> CacheContents {
        CacheWarmup::contents(&self.core)
    }

    /// Loads the blocks `contents` lists into the memory cache in the
    /// background (see `cache_warmup`); returns at once. Does nothing with
    /// `memory_cache_warm_restart` off, without a memory cache, or when a
    /// warm-up already ran since the pool opened.
    pub fn warm_cache(&self, contents: CacheContents) {
        CacheWarmup::start(&self.core, contents);
    }

    /// The warm-up's progress.
    pub fn cache_warmup_status(&self) -> CacheWarmupStatus {
        self.core.cache_warmup().status()
    }

    // ----- rebuild -----

    /// Whether a device beneath the pool is being rebuilt.
    pub fn rebuild_pending(&self) -> bool {
        Rebuild::new(&self.core).pending()
    }

    /// The rebuild's progress (also in `pool status`).
    pub fn rebuild_status(&self) -> RebuildStatus {
        Rebuild::new(&self.core).status()
    }

    /// Starts a rebuild in the background if none runs: onto a replacement
    /// when one is pending; otherwise, with `rebuild_automatic`, by moving
    /// the data of degraded segments onto the devices left, when they can
    /// hold it (`repair/evacuation.rs`).
    pub fn start_rebuild(&self) -> RebuildStart {
        Rebuild::new(&self.core).start()
    }

    /// Rebuilds every range the pool keeps onto the replacement, then lets
    /// it take its member's place. Refused while a rebuild runs; nothing to
    /// do when none is pending.
    pub async fn rebuild(&self) -> Result<RebuildStatus, EngineError> {
        Rebuild::new(&self.core).run().await
    }

    // ----- evacuation -----

    /// What restoring redundancy by moving data would take now; nothing
    /// while the devices in use are too few to lay segments out without the
    /// lost one.
    pub fn evacuation_need(&self) -> EvacuationNeed {
        Evacuation::new(&self.core).need()
    }

    /// What moving the segments `goal` names would take now.
    pub fn evacuation_need_for(&self, goal: EvacuationGoal) -> EvacuationNeed {
        Evacuation::new(&self.core).need_for(goal)
    }

    /// Why no rebuild restores the pool's redundancy, when segments in use
    /// have less than the pool was made with and none runs, is pending or
    /// will start by itself; `None` otherwise (nothing is degraded, or a
    /// rebuild runs or starts at the next check).
    pub fn rebuild_blocked(&self) -> Option<RebuildBlocked> {
        Evacuation::new(&self.core).blocked()
    }

    /// Moves the data of every degraded segment into segments laid out over
    /// the devices in use. Refused while a rebuild runs.
    pub async fn evacuate(&self) -> Result<RebuildStatus, EngineError> {
        Evacuation::new(&self.core)
            .run(EvacuationGoal::Redundancy)
            .await
    }

    /// Moves the data of every segment not laid out over the devices in
    /// use (after a device was added) into segments opened now, at the
    /// array's new width. Refused while a rebuild or rebalance runs.
    pub async fn rebalance(&self) -> Result<RebuildStatus, EngineError> {
        Evacuation::new(&self.core).run(EvacuationGoal::Width).await
    }

    // ----- volumes -----

    /// Every volume with its space accounting. The accounting compares maps;
    /// it runs after the state lock is released, on copies of the maps.
    pub fn list_volumes(&self) -> Vec<VolumeInfo> {
        let pending: Vec<_> = {
            let state = self.core.lock();
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
            let state = self.core.lock();
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
        self.core.lock().volumes().resolve(full_name)
    }

    /// Size of a volume or snapshot (None once deleted).
    pub fn view_size_bytes(&self, view: View) -> Option<u64> {
        self.core
            .lock()
            .volumes()
            .view(view)
            .map(|found| found.size_bytes)
    }

    // ----- snapshots and clones -----

    /// Snapshots of one volume, or of every volume, oldest first per volume.
    pub fn list_snapshots(&self, volume: Option<&str>) -> Result<Vec<SnapshotInfo>, EngineError> {
        let pending = {
            let state = self.core.lock();
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
        self.core.lock().volumes().snapshot_full_names()
    }

    fn snapshot_info_of(&self, volume: &str, snapshot: &str) -> Result<SnapshotInfo, EngineError> {
        let pending = {
            let state = self.core.lock();
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
        self.core.lock().volumes().id_of(name)
    }

    /// Size of a volume by identifier (None once deleted).
    pub fn volume_size_bytes(&self, volume_id: u32) -> Option<u64> {
        self.core
            .lock()
            .volumes()
            .get(volume_id)
            .map(|volume| volume.size_bytes)
    }

    /// A control operation: appended like any record, and durable on return.
    async fn control(
        &self,
        build: impl Fn(&State) -> Result<Record, EngineError>,
    ) -> Result<(), EngineError> {
        self.core.append_record(build).await?;
        self.flush().await
    }

    /// A volume whose new writes are stored with `codec`: created, then its
    /// codec set (two records, each durable before the next; the first
    /// alone when `codec` is `Off`). A crash between them leaves the volume
    /// storing blocks as they are: the codec decides only the form of new
    /// writes, never what they read back, and the caller, whose call
    /// failed, sets it with [`Self::set_volume_compression`].
    pub async fn create_volume_with_compression(
        &self,
        name: &str,
        size_bytes: u64,
        codec: lamina_reduction::Codec,
    ) -> Result<VolumeInfo, EngineError> {
        let created = self.create_volume(name, size_bytes).await?;
        if codec == lamina_reduction::Codec::Off {
            return Ok(created);
        }
        self.set_volume_compression(name, codec).await
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
        self.core.flush().await
    }

    /// Makes every batch sealed so far durable on both tiers: what frees
    /// dead segments and what a checkpoint covers. In a two-tier pool whose
    /// capacity tier's writes are suspended this makes flash durable and
    /// fails with `IoError::CapacityUnavailable` (the pool goes on).
    pub async fn flush_all(&self) -> Result<(), EngineError> {
        self.core.flush_all().await
    }

    /// Tries the capacity tier's flush now if its writes are suspended;
    /// once it succeeds, demotion and checkpoints resume. `Ok` when the tier
    /// takes writes (a one-tier pool has none to suspend).
    pub async fn resume_capacity_writes(&self) -> Result<(), EngineError> {
        self.core.resume_capacity_writes().await
    }

    /// Waits until the claim of the last completed flush is on the device
    /// (not necessarily flushed): its marker written, or a later batch whose
    /// summary carries it (decision 0069). A process that dies after this
    /// leaves recovery able to tell that flush's batches from a torn tail.
    pub async fn flush_marker_written(&self) {
        self.core.flush_marker().settled().await;
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

    /// Changes the codec of a volume's new writes, durably; what was
    /// written before keeps its form until the cleaner or the demoter
    /// moves it. Its snapshots are unaffected; a clone made later starts
    /// with this codec.
    pub async fn set_volume_compression(
        &self,
        name: &str,
        codec: lamina_reduction::Codec,
    ) -> Result<VolumeInfo, EngineError> {
        self.control(|state| {
            Ok(Record::VolumeCompression {
                volume_id: state.volumes().id_of(name)?,
                codec: codec.into(),
            })
        })
        .await?;
        self.volume_info(name)
    }
}
