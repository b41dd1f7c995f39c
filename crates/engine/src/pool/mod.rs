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
mod checkpoint;
pub mod cleaner;
mod counters;
mod device_full;
mod flush_marker;
mod inner;
pub mod integrity;
mod limits;
mod recovery;
pub mod space;
mod state;
pub mod stream;
mod tiering;
mod writer;

use serde::Serialize;

use crate::BLOCK_SIZE_BYTES;
use crate::error::EngineError;
use crate::log::batch::{BATCH_DATA_BLOCKS_MAX, Record, block_checksum};
use crate::log::geometry::Tier;
use crate::tier::heat::VolumeTierCounters;
use crate::volume::{
    Origin, PendingSnapshotInfo, PendingVolumeInfo, SnapshotInfo, View, ViewRef, VolumeInfo,
    validate_volume_name, validate_volume_size,
};
pub use device_full::DeviceFullStatus;
pub use inner::Pool;
use inner::RMW_LOCK_COUNT;
pub use limits::{LimitsError, PoolLimits, PoolOptions, TestHooks};
use state::State;

/// One run of [`Pool::extents`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub length: u64,
    pub allocated: bool,
}

/// What `pool status` shows.
#[derive(Clone, Debug, Serialize)]
pub struct PoolStatus {
    pub device: String,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    pub reserved_bytes: u64,
    /// Used share of the space clients can fill (used plus free, which
    /// leaves out the reserves), in percent: 100 when writes fail with ENOSPC.
    pub used_percent: f64,
    /// The highest of `usage_warning_percents` that `used_percent` has
    /// reached, 0 for none: the warning in force (also logged when crossed).
    pub usage_warning_percent: u8,
    pub segment_size_bytes: u64,
    pub segment_count: u64,
    pub free_segment_count: u64,
    pub volume_count: usize,
    /// Bytes clients have written over the pool's life. This and the two
    /// counters below are kept in checkpoints, so a crash loses what was
    /// written after the newest one from them.
    pub client_bytes_written: u64,
    /// Log and checkpoint bytes written to the devices over the pool's life.
    pub device_bytes_written: u64,
    /// `device_bytes_written / client_bytes_written`; none before clients write.
    pub write_amplification: Option<f64>,
    /// Blocks the cleaner has moved out of victim segments over the pool's life.
    pub cleaner_relocated_blocks: u64,
    /// Segments with no live blocks, waiting for checkpoints to be freed.
    pub dead_segment_count: u64,
    /// What the paced background cleaner is doing.
    pub cleaner_state: cleaner::CleanerState,
    /// Free-space pressure on the cleaner: 0 with the cleaner's headroom (or
    /// more) free beyond the reserves, 1 with nothing free beyond them; the
    /// paced cleaner relocates this times
    /// `cleaner_relocation_blocks_per_client_block_max` per client block.
    pub cleaner_pressure: f64,
    pub durable_batch_sequence: u64,
    pub checkpoint_sequence: u64,
    pub failed: Option<String>,
    /// Set while the device under the pool is out of space and batch writes
    /// wait for it (see `device_full_retry_interval_ms`).
    pub device_full: Option<DeviceFullStatus>,
    /// Batch writes retried after finding the device full, since the pool opened.
    pub device_full_retries: u64,
    pub memory_cache: crate::tier::memory_cache::CacheStatistics,
    /// Space of the flash tier (all of a one-tier pool).
    pub flash: TierSpace,
    /// Space of the capacity tier, in a two-tier pool.
    pub capacity: Option<TierSpace>,
    /// Blocks moved from capacity to flash on access, and from flash to
    /// capacity by the cleaner, since the pool opened.
    pub promoted_blocks: u64,
    pub demoted_blocks: u64,
    /// Damage found (checksum errors, repaired summaries, lost batches,
    /// segments set aside) since the pool opened.
    pub integrity: integrity::IntegrityStatus,
}

/// One tier's space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct TierSpace {
    pub size_bytes: u64,
    /// Bytes of segments in use (live data, dead data waiting to be cleaned,
    /// checkpoints and open log heads).
    pub used_bytes: u64,
    /// Bytes of free segments (including the reserves).
    pub free_bytes: u64,
}

/// What `volume stats` shows: where a volume's blocks live and where its
/// reads were served from since the pool opened.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VolumeTierStats {
    pub volume: String,
    pub policy: crate::volume::TierPolicy,
    /// Bytes of the volume's live contents on each tier.
    pub flash_bytes: u64,
    pub capacity_bytes: u64,
    pub counters: VolumeTierCounters,
    /// Shares of block reads served from memory, flash and capacity (0 when
    /// nothing was read; unwritten blocks are not counted).
    pub memory_hit_ratio: f64,
    pub flash_hit_ratio: f64,
    pub capacity_read_ratio: f64,
}

/// Times a read starts again because a block it was reading moved and its old
/// place was rewritten meanwhile (each retry reads the block's new home).
const READ_MOVED_RETRY_COUNT_MAX: usize = 4;

/// How one read attempt ended.
enum ReadOutcome {
    Done,
    /// A block failed its checksum and the map no longer points there: the
    /// error to return if retries run out.
    Moved(EngineError),
}

/// A capacity block a read decided to promote: (logical block, physical block,
/// its contents once read).
type Promotion = (u64, u64, Option<Box<[u8]>>);

/// Blocks after a promoted capacity block that are promoted with it when they
/// follow it both in the volume and on capacity (a 64 KiB window in all).
const PROMOTION_NEIGHBOUR_BLOCKS_MAX: u64 = 15;

/// Free flash segments beyond the clients' reserve that promotions leave to
/// client writes: a promotion never pushes a writer into reclaiming.
const PROMOTION_HEADROOM_SEGMENT_COUNT: usize = 2;

impl Pool {
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
                return Err(EngineError::SnapshotExists {
                    volume: volume.to_string(),
                    snapshot: snapshot.to_string(),
                });
            }
            Ok(Record::SnapshotCreate {
                volume_id,
                snapshot_id: state.volumes().next_snapshot_id,
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
                return Err(EngineError::HasClones {
                    what: format!("snapshot {volume}@{snapshot}"),
                    clones: clones.join(", "),
                });
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
                return Err(EngineError::NotNewestSnapshot {
                    volume: volume.to_string(),
                    snapshot: snapshot.to_string(),
                    newer: newer.join(", "),
                });
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
                return Err(EngineError::VolumeExists(new_volume.to_string()));
            }
            Ok(Record::VolumeClone {
                volume_id: state.volumes().next_volume_id,
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
                Err(EngineError::NoSpace) if self.reclaim().await? => continue,
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
                return Err(EngineError::VolumeExists(name.to_string()));
            }
            Ok(Record::VolumeCreate {
                volume_id: state.volumes().next_volume_id,
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
                return Err(EngineError::ShrinkNeedsForce {
                    volume: name.to_string(),
                    from_bytes: current,
                    to_bytes: size_bytes,
                });
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
                return Err(EngineError::VolumeExists(new_name.to_string()));
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
                return Err(EngineError::HasClones {
                    what: format!("volume {name}"),
                    clones: clones.join(", "),
                });
            }
            Ok(Record::VolumeDelete { volume_id })
        })
        .await
    }

    // ----- data path -----

    /// The view, if `length` bytes at `offset` lie inside it.
    fn check_range<'a>(
        &self,
        state: &'a State,
        view: View,
        offset: u64,
        length: u64,
    ) -> Result<ViewRef<'a>, EngineError> {
        let found = state
            .volumes()
            .view(view)
            .ok_or_else(|| EngineError::NoSuchVolume(format!("{view:?}")))?;
        if offset
            .checked_add(length)
            .is_none_or(|end| end > found.size_bytes)
        {
            return Err(EngineError::OutOfRange {
                volume: found.full_name(),
                offset,
                length,
                size_bytes: found.size_bytes,
            });
        }
        Ok(found)
    }

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

    /// Reads from a volume or a snapshot (see [`Pool::read`]).
    pub async fn read_view(
        &self,
        view: View,
        offset: u64,
        buffer: &mut [u8],
    ) -> Result<(), EngineError> {
        let mut attempt = 0;
        loop {
            match self.read_view_once(view, offset, buffer).await? {
                ReadOutcome::Done => return Ok(()),
                // A block moved (cleaned, demoted, promoted, overwritten) and
                // its old segment was rewritten while the read was in flight:
                // the map has its new home, so read again.
                ReadOutcome::Moved(mismatch) => {
                    attempt += 1;
                    if attempt > READ_MOVED_RETRY_COUNT_MAX {
                        return Err(mismatch);
                    }
                }
            }
        }
    }

    /// One attempt of [`Pool::read_view`].
    async fn read_view_once(
        &self,
        view: View,
        offset: u64,
        buffer: &mut [u8],
    ) -> Result<ReadOutcome, EngineError> {
        if buffer.is_empty() {
            return Ok(ReadOutcome::Done);
        }
        let block = BLOCK_SIZE_BYTES;
        let geometry = self.inner.geometry;
        let volume_id = view.volume_id();
        // Blocks that must come from the device: (logical, physical, checksum).
        let mut from_device: Vec<(u64, u64, u32)> = Vec::new();
        // Capacity blocks heat says to promote, with their data once known:
        // (logical, physical, data).
        let mut promotions: Vec<Promotion> = Vec::new();
        // Capacity blocks promoted along with a neighbour, beyond the request:
        // (logical, physical, checksum).
        let mut neighbours: Vec<(u64, u64, u32)> = Vec::new();
        let volume_name;
        {
            let mut guard = self.inner.lock();
            let state = &mut *guard;
            // Out of the state while the map is borrowed from it; put back below.
            let mut heat = state.take_heat();
            let found = match self.check_range(state, view, offset, buffer.len() as u64) {
                Ok(found) => found,
                Err(error) => {
                    state.restore_heat(heat);
                    return Err(error);
                }
            };
            let first_block = offset / block;
            let last_block = (offset + buffer.len() as u64 - 1) / block;
            let map = found.map;
            volume_name = found.full_name();
            let policy = state
                .volumes()
                .get(volume_id)
                .map(|volume| volume.policy)
                .unwrap_or_default();
            let mut counters = VolumeTierCounters::default();
            let view_block_count = found.size_bytes / block;
            // Whether promotions will find room (see `promote`).
            let promotion_room = state.space().free_flash_segment_count()
                > state.space().reserve_for(space::Allocation::Client)
                    + PROMOTION_HEADROOM_SEGMENT_COUNT;
            let mut scratch = [0u8; BLOCK_SIZE_BYTES as usize];
            for logical_block in first_block..=last_block {
                let (within_block, within_buffer, length) =
                    span(offset, buffer.len(), logical_block);
                match map.get(logical_block) {
                    None => buffer[within_buffer..within_buffer + length].fill(0),
                    Some(mapping) => {
                        let tier = geometry.tier_of_block(mapping.physical_block);
                        let promote = match (&mut heat, tier) {
                            (None, _) => false,
                            (Some(heat), Tier::Flash) => {
                                let index = geometry
                                    .flash_data_index(mapping.physical_block)
                                    .expect("a flash block");
                                heat.flash_accessed(index, policy);
                                false
                            }
                            (Some(heat), Tier::Capacity) => {
                                heat.admit_from_capacity(mapping.physical_block, policy)
                            }
                        };
                        let in_memory = state
                            .copy_unwritten_block(mapping.physical_block, &mut scratch)
                            || (self.inner.cache.get(mapping.physical_block, &mut scratch)
                                && block_checksum(&scratch) == mapping.checksum);
                        if promote {
                            promotions.push((
                                logical_block,
                                mapping.physical_block,
                                in_memory.then(|| Box::from(&scratch[..])),
                            ));
                        }
                        // Blocks after a promoted one that were demoted with it
                        // (next in the volume and next on capacity) come along:
                        // on a disk they cost only transfer time, and a working
                        // set returns to flash in a fraction of the reads.
                        if promote && tier == Tier::Capacity && promotion_room {
                            let mut previous = mapping.physical_block;
                            for step in 1..=PROMOTION_NEIGHBOUR_BLOCKS_MAX {
                                let neighbour = logical_block + step;
                                if neighbour <= last_block || neighbour >= view_block_count {
                                    break;
                                }
                                // Next on capacity, or after one batch summary (or segment
                                // boundary: capacity segments are adjacent).
                                match map.get(neighbour) {
                                    Some(next)
                                        if (previous + 1..=previous + 2)
                                            .contains(&next.physical_block)
                                            && geometry.tier_of_block(next.physical_block)
                                                == Tier::Capacity =>
                                    {
                                        neighbours.push((
                                            neighbour,
                                            next.physical_block,
                                            next.checksum,
                                        ));
                                        previous = next.physical_block;
                                    }
                                    _ => break,
                                }
                            }
                        }
                        if in_memory {
                            counters.memory_read_blocks += 1;
                            buffer[within_buffer..within_buffer + length]
                                .copy_from_slice(&scratch[within_block..within_block + length]);
                        } else {
                            match tier {
                                Tier::Flash => counters.flash_read_blocks += 1,
                                Tier::Capacity => counters.capacity_read_blocks += 1,
                            }
                            from_device.push((
                                logical_block,
                                mapping.physical_block,
                                mapping.checksum,
                            ));
                        }
                    }
                }
            }
            state.restore_heat(heat);
            if state.heat().is_some() {
                let total = state.tier_counters_of(volume_id);
                total.memory_read_blocks += counters.memory_read_blocks;
                total.flash_read_blocks += counters.flash_read_blocks;
                total.capacity_read_blocks += counters.capacity_read_blocks;
            }
        }
        // Coalesce physically contiguous blocks into runs, read runs concurrently.
        let mut runs: Vec<&[(u64, u64, u32)]> = Vec::new();
        let mut start = 0;
        for index in 1..=from_device.len() {
            let breaks = index == from_device.len()
                || from_device[index].1 != from_device[index - 1].1 + 1
                || (index - start) as u64 >= self.inner.limits.read_run_blocks_max;
            if breaks {
                runs.push(&from_device[start..index]);
                start = index;
            }
        }
        let device = &self.inner.device;
        let reads = runs
            .iter()
            .map(|run| device.read(run[0].1 * block, run.len() * block as usize));
        // Neighbours of promoted blocks are read in the same go, issued right
        // after the blocks they follow, so that a disk serves them in sequence
        // instead of after every request queued meanwhile.
        neighbours.sort_unstable();
        neighbours.dedup();
        let (results, neighbour_promotions) = tokio::join!(
            futures::future::join_all(reads),
            self.read_neighbours(&neighbours)
        );
        promotions.extend(neighbour_promotions);
        for (run, result) in runs.iter().zip(results) {
            let data = result?;
            for (index, (logical_block, physical_block, checksum)) in run.iter().enumerate() {
                let contents = &data[index * block as usize..(index + 1) * block as usize];
                if block_checksum(contents) != *checksum {
                    let mismatch = EngineError::ChecksumMismatch {
                        volume: volume_name.clone(),
                        logical_block: *logical_block,
                        physical_block: *physical_block,
                    };
                    let moved = {
                        let state = self.inner.lock();
                        state
                            .volumes()
                            .view(view)
                            .and_then(|found| found.map.get(*logical_block))
                            .is_none_or(|now| {
                                now.physical_block != *physical_block || now.checksum != *checksum
                            })
                    };
                    if moved {
                        return Ok(ReadOutcome::Moved(mismatch));
                    }
                    tracing::error!(volume = %volume_name, logical_block, physical_block, "checksum mismatch");
                    self.inner.integrity.read_checksum_error();
                    return Err(mismatch);
                }
                let (within_block, within_buffer, length) =
                    span(offset, buffer.len(), *logical_block);
                buffer[within_buffer..within_buffer + length]
                    .copy_from_slice(&contents[within_block..within_block + length]);
                if let Some(promotion) = promotions
                    .iter_mut()
                    .find(|promotion| promotion.1 == *physical_block && promotion.2.is_none())
                {
                    promotion.2 = Some(Box::from(contents));
                }
            }
        }
        if !promotions.is_empty() {
            self.promote(volume_id, promotions);
        }
        Ok(ReadOutcome::Done)
    }

    /// Reads the neighbours of promoted blocks (spans with gaps of at most one
    /// block, one device read each, all at once) and returns those that pass
    /// their checksum, as promotions. A failed read or a mismatch only skips
    /// the block: the client did not ask for it.
    async fn read_neighbours(&self, neighbours: &[(u64, u64, u32)]) -> Vec<Promotion> {
        let block = BLOCK_SIZE_BYTES as usize;
        let mut spans: Vec<&[(u64, u64, u32)]> = Vec::new();
        let mut start = 0;
        for index in 1..=neighbours.len() {
            let span_ends = index == neighbours.len()
                || !(neighbours[index - 1].1 + 1..=neighbours[index - 1].1 + 2)
                    .contains(&neighbours[index].1);
            if span_ends {
                spans.push(&neighbours[start..index]);
                start = index;
            }
        }
        let reads = spans.iter().map(|span| {
            let first = span[0].1;
            let span_blocks = (span[span.len() - 1].1 - first + 1) as usize;
            self.inner
                .device
                .read(first * BLOCK_SIZE_BYTES, span_blocks * block)
        });
        let mut promotions = Vec::new();
        for (span, result) in spans.iter().zip(futures::future::join_all(reads).await) {
            let Ok(data) = result else { continue };
            let first = span[0].1;
            for (logical_block, physical_block, checksum) in span.iter() {
                let position = (physical_block - first) as usize;
                let contents = &data[position * block..(position + 1) * block];
                if block_checksum(contents) == *checksum {
                    promotions.push((*logical_block, *physical_block, Some(Box::from(contents))));
                }
            }
        }
        promotions
    }

    /// Moves blocks just read from capacity to flash (the read has checked
    /// their checksums), unless flash has no room for them now: promotion
    /// never makes a client wait for space. Each move is a relocation record,
    /// so a crash keeps either the old or the new home, never neither.
    fn promote(&self, volume_id: u32, promotions: Vec<Promotion>) {
        let in_flight_limit = self.inner.limits.in_flight_batches_max;
        let mut sealed = Vec::new();
        {
            let mut state = self.inner.lock();
            let flash_short = state.space().free_flash_segment_count()
                <= state.space().reserve_for(space::Allocation::Client)
                    + PROMOTION_HEADROOM_SEGMENT_COUNT;
            if state.writer().failed().is_some()
                || state.writer().in_flight_count() >= in_flight_limit
                || flash_short
            {
                return;
            }
            // The family of the volume that wrote the block: its origin's
            // root, whose family holds every map that can share it.
            let root = state.volumes().root_of(volume_id);
            let family = state.volumes().family(root);
            for (logical_block, physical_block, data) in promotions {
                let Some(data) = data else { continue };
                let relocation = state::Relocation {
                    family: &family,
                    volume_id: root,
                    logical_block,
                    from_physical_block: physical_block,
                    data: &data,
                    stream: stream::Stream::Client,
                };
                match state.append_relocation(relocation, &mut sealed) {
                    Ok(true) => state.tier_counters_of(volume_id).promoted_blocks += 1,
                    Ok(false) => {}
                    Err(_) => break,
                }
            }
        }
        self.spawn_writes(sealed);
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
        let state = self.inner.lock();
        let map = self.check_range(&state, view, offset, length)?.map;
        let mut extents: Vec<Extent> = Vec::new();
        let end = offset + length;
        let mut position = offset;
        while position < end {
            let logical_block = position / BLOCK_SIZE_BYTES;
            let next = ((logical_block + 1) * BLOCK_SIZE_BYTES).min(end);
            let allocated = map.get(logical_block).is_some();
            match extents.last_mut() {
                Some(last) if last.allocated == allocated => last.length += next - position,
                _ => extents.push(Extent {
                    length: next - position,
                    allocated,
                }),
            }
            position = next;
        }
        Ok(extents)
    }

    fn rmw_lock_index(volume_id: u32, logical_block: u64) -> usize {
        let mixed =
            (u64::from(volume_id) << 48) ^ logical_block.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (mixed % RMW_LOCK_COUNT as u64) as usize
    }

    /// Writes `data` at byte `offset`. Partial blocks at either end are merged
    /// with their current contents under a per-block lock. With `fua`, the write
    /// (and everything before it) is durable when this returns.
    pub async fn write(
        &self,
        volume_id: u32,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<(), EngineError> {
        if data.is_empty() {
            return if fua { self.flush().await } else { Ok(()) };
        }
        {
            let state = self.inner.lock();
            self.check_range(&state, View::Volume(volume_id), offset, data.len() as u64)?;
            state.check_failed()?;
        }
        let block = BLOCK_SIZE_BYTES;
        let first_block = offset / block;
        let last_block = (offset + data.len() as u64 - 1) / block;
        let head_partial = !offset.is_multiple_of(block) || (data.len() as u64) < block;
        let tail_partial = !(offset + data.len() as u64).is_multiple_of(block);
        let mut partial_blocks: Vec<u64> = Vec::new();
        if head_partial {
            partial_blocks.push(first_block);
        }
        if tail_partial && !partial_blocks.contains(&last_block) {
            partial_blocks.push(last_block);
        }
        let mut lock_indexes: Vec<usize> = partial_blocks
            .iter()
            .map(|logical_block| Self::rmw_lock_index(volume_id, *logical_block))
            .collect();
        lock_indexes.sort_unstable();
        lock_indexes.dedup();
        let mut guards = Vec::with_capacity(lock_indexes.len());
        for index in lock_indexes {
            guards.push(self.inner.rmw_locks[index].lock().await);
        }
        let mut merged: Vec<(u64, Vec<u8>)> = Vec::with_capacity(partial_blocks.len());
        for logical_block in &partial_blocks {
            let mut contents = vec![0u8; block as usize];
            self.read(volume_id, logical_block * block, &mut contents)
                .await?;
            let (within_block, within_data, length) = span(offset, data.len(), *logical_block);
            contents[within_block..within_block + length]
                .copy_from_slice(&data[within_data..within_data + length]);
            merged.push((*logical_block, contents));
        }
        let mut logical_block = first_block;
        while logical_block <= last_block {
            let in_flight_limit = self.inner.limits.in_flight_batches_max;
            self.wait_unless_device_full(|state| {
                state.writer().in_flight_count() < in_flight_limit
                    || state.writer().failed().is_some()
            })
            .await?;
            let mut sealed = Vec::new();
            let result = {
                let mut state = self.inner.lock();
                let mut result = Ok(());
                // Append up to one batch worth of blocks per lock hold.
                let stop = (logical_block + BATCH_DATA_BLOCKS_MAX as u64).min(last_block + 1);
                while logical_block < stop {
                    let contents: &[u8] = match merged
                        .iter()
                        .find(|(block_index, _)| *block_index == logical_block)
                    {
                        Some((_, contents)) => contents,
                        None => {
                            let start = (logical_block * block - offset) as usize;
                            &data[start..start + block as usize]
                        }
                    };
                    if let Err(error) =
                        state.append_data(volume_id, logical_block, contents, &mut sealed)
                    {
                        result = Err(error);
                        break;
                    }
                    logical_block += 1;
                }
                result
            };
            self.spawn_writes(sealed);
            if let Err(error) = result {
                if matches!(error, EngineError::NoSpace) && self.reclaim().await? {
                    continue;
                }
                return Err(error);
            }
        }
        drop(guards);
        self.maybe_flush_in_background();
        if fua { self.flush().await } else { Ok(()) }
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
        {
            let state = self.inner.lock();
            self.check_range(&state, View::Volume(volume_id), offset, length)?;
        }
        if length == 0 {
            return if fua { self.flush().await } else { Ok(()) };
        }
        let block = BLOCK_SIZE_BYTES;
        let end = offset + length;
        let first_whole = offset.next_multiple_of(block);
        let end_whole = end - end % block;
        if first_whole >= end_whole {
            let zeros = vec![0u8; length as usize];
            return self.write(volume_id, offset, &zeros, fua).await;
        }
        if offset < first_whole {
            let zeros = vec![0u8; (first_whole - offset) as usize];
            self.write(volume_id, offset, &zeros, false).await?;
        }
        if end_whole < end {
            let zeros = vec![0u8; (end - end_whole) as usize];
            self.write(volume_id, end_whole, &zeros, false).await?;
        }
        if punch_hole {
            let record = Record::Unmap {
                volume_id,
                logical_block: first_whole / block,
                block_count: (end_whole - first_whole) / block,
            };
            self.append_record(|_| Ok(record.clone())).await?;
        } else {
            let zeros = vec![0u8; BATCH_DATA_BLOCKS_MAX * block as usize];
            let mut position = first_whole;
            while position < end_whole {
                let step = (end_whole - position).min(BATCH_DATA_BLOCKS_MAX as u64 * block);
                self.write(volume_id, position, &zeros[..step as usize], false)
                    .await?;
                position += step;
            }
        }
        if fua { self.flush().await } else { Ok(()) }
    }

    /// Discards a range: the same as punching zeros (reads return zeros after).
    pub async fn trim(
        &self,
        volume_id: u32,
        offset: u64,
        length: u64,
        fua: bool,
    ) -> Result<(), EngineError> {
        self.write_zeroes(volume_id, offset, length, fua, true)
            .await
    }

    /// Makes every write acknowledged before this call durable.
    pub async fn flush(&self) -> Result<(), EngineError> {
        let target = {
            let mut state = self.inner.lock();
            state.check_failed()?;
            let sealed = state.seal_open_batch();
            let target = state.writer().sealed_through();
            drop(state);
            self.spawn_writes(sealed);
            target
        };
        self.flush_through(target).await
    }

    /// Makes every batch up to `target` durable.
    async fn flush_through(&self, target: u64) -> Result<(), EngineError> {
        if self.inner.lock().writer().durable_through() >= target {
            return Ok(());
        }
        self.wait_unless_device_full(|state| {
            state.writer().written_through() >= target || state.writer().failed().is_some()
        })
        .await?;
        let _guard = self.inner.flush_lock.lock().await;
        let (covered, sealed_bytes) = {
            let state = self.inner.lock();
            state.check_failed()?;
            if state.writer().durable_through() >= target {
                return Ok(());
            }
            (
                state.writer().written_through(),
                state.counters().sealed_bytes(),
            )
        };
        let marker_covered = self.inner.flush_marker.before_device_flush().await;
        if let Err(error) = self.inner.device.flush().await {
            let mut state = self.inner.lock();
            state.writer_mut().fail(error.to_string());
            return Err(error.into());
        }
        let durable_through = {
            let mut state = self.inner.lock();
            state.writer_mut().durable_through_advanced(covered);
            state.counters_mut().flushed(sealed_bytes);
            // Deaths just made durable free their segments (decision 0006).
            state.free_reusable_dead_segments();
            state.writer().durable_through()
        };
        self.write_flush_marker(marker_covered, durable_through)
            .await;
        Ok(())
    }

    /// After a device flush: starts the flush marker's write (see
    /// `flush_marker`) and counts its bytes.
    async fn write_flush_marker(&self, marker_covered: u64, durable_through: u64) {
        let marker_bytes = self
            .inner
            .flush_marker
            .after_device_flush(&self.inner.device, marker_covered, durable_through)
            .await;
        self.inner
            .lock()
            .counters_mut()
            .marker_written(marker_bytes);
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
        self.inner.device.flush().await?;
        let durable_through = self.inner.lock().writer().durable_through();
        self.write_flush_marker(marker_covered, durable_through)
            .await;
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
                policy,
            })
        })
        .await?;
        self.volume_info(name)
    }

    /// Where a volume's blocks live and where its reads came from. The tier
    /// split walks the volume's map outside the state lock.
    pub fn volume_tier_stats(&self, name: &str) -> Result<VolumeTierStats, EngineError> {
        let geometry = self.inner.geometry;
        let (volume, policy, map, counters) = {
            let state = self.inner.lock();
            let volume_id = state.volumes().id_of(name)?;
            let volume = state.volumes().get(volume_id).expect("id from name");
            (
                volume.name.clone(),
                volume.policy,
                volume.map.clone(),
                state.tier_counters(volume_id),
            )
        };
        let mut capacity_blocks = 0u64;
        map.for_each_physical(&mut |physical_block| {
            if geometry.tier_of_block(physical_block) == Tier::Capacity {
                capacity_blocks += 1;
            }
        });
        let flash_blocks = map.mapped_count() - capacity_blocks;
        let reads = counters.memory_read_blocks
            + counters.flash_read_blocks
            + counters.capacity_read_blocks;
        let ratio = |part: u64| {
            if reads == 0 {
                0.0
            } else {
                part as f64 / reads as f64
            }
        };
        Ok(VolumeTierStats {
            volume,
            policy,
            flash_bytes: flash_blocks * BLOCK_SIZE_BYTES,
            capacity_bytes: capacity_blocks * BLOCK_SIZE_BYTES,
            memory_hit_ratio: ratio(counters.memory_read_blocks),
            flash_hit_ratio: ratio(counters.flash_read_blocks),
            capacity_read_ratio: ratio(counters.capacity_read_blocks),
            counters,
        })
    }

    pub fn status(&self) -> PoolStatus {
        let state = self.inner.lock();
        let geometry = self.inner.geometry;
        let tier_space = |tier: Tier, free_segments: usize| {
            let size_bytes = geometry.tier_data_bytes(tier);
            let free_bytes = free_segments as u64 * geometry.segment_size_bytes();
            TierSpace {
                size_bytes,
                used_bytes: size_bytes - free_bytes,
                free_bytes,
            }
        };
        let (promoted_blocks, demoted_blocks) =
            state
                .all_tier_counters()
                .fold((0, 0), |(promoted, demoted), counters| {
                    (
                        promoted + counters.promoted_blocks,
                        demoted + counters.demoted_blocks,
                    )
                });
        let segment_bytes = self.inner.geometry.segment_size_bytes();
        let free_segment_count = (state.space().free_flash_segment_count()
            + state.space().free_capacity_segment_count()) as u64;
        let reserved = state.space().reserve_for(space::Allocation::Client) as u64;
        let counters = state.counters().lifetime();
        let used_segment_count = state.space().used_segment_count() as u64;
        let fillable_segment_count =
            used_segment_count + free_segment_count.saturating_sub(reserved);
        let used_percent = if fillable_segment_count == 0 {
            0.0
        } else {
            100.0 * used_segment_count as f64 / fillable_segment_count as f64
        };
        let usage_warning_percent = self
            .inner
            .limits
            .usage_warning_percents
            .iter()
            .copied()
            .filter(|threshold| used_percent >= f64::from(*threshold))
            .max()
            .unwrap_or(0);
        let (cleaner_state, cleaner_pressure) = cleaner::cleaner_state(&state, &self.inner.limits);
        PoolStatus {
            device: self.inner.device.name().to_string(),
            capacity_bytes: self.inner.geometry.data_capacity_bytes(),
            used_bytes: used_segment_count * segment_bytes,
            free_bytes: free_segment_count.saturating_sub(reserved) * segment_bytes,
            reserved_bytes: reserved * segment_bytes,
            used_percent,
            usage_warning_percent,
            segment_size_bytes: segment_bytes,
            segment_count: self.inner.geometry.segment_count,
            free_segment_count,
            volume_count: state.volumes().iter().count(),
            client_bytes_written: counters.client_bytes_written,
            device_bytes_written: counters.device_bytes_written,
            write_amplification: (counters.client_bytes_written > 0).then(|| {
                counters.device_bytes_written as f64 / counters.client_bytes_written as f64
            }),
            cleaner_relocated_blocks: counters.cleaner_relocated_blocks,
            dead_segment_count: (state.space().dead_segment_count(Tier::Flash)
                + state.space().dead_segment_count(Tier::Capacity))
                as u64,
            cleaner_state,
            cleaner_pressure,
            durable_batch_sequence: state.writer().durable_through(),
            checkpoint_sequence: state.checkpoint_schedule().next_sequence() - 1,
            failed: state.writer().failed().map(str::to_string),
            device_full: self.inner.device_full.status(),
            device_full_retries: self.inner.device_full.retries_total(),
            memory_cache: self.inner.cache.statistics(),
            flash: tier_space(Tier::Flash, state.space().free_flash_segment_count()),
            capacity: geometry
                .has_capacity_tier()
                .then(|| tier_space(Tier::Capacity, state.space().free_capacity_segment_count())),
            promoted_blocks,
            demoted_blocks,
            integrity: self.inner.integrity.status(
                state
                    .space()
                    .segments()
                    .iter()
                    .filter(|segment| segment.set_aside)
                    .count() as u64,
            ),
        }
    }
}

/// For a request of `length` bytes at byte `offset`, the part that falls in
/// `logical_block`: (offset within the block, offset within the request, length).
fn span(offset: u64, length: usize, logical_block: u64) -> (usize, usize, usize) {
    let block_start = logical_block * BLOCK_SIZE_BYTES;
    let start = offset.max(block_start);
    let end = (offset + length as u64).min(block_start + BLOCK_SIZE_BYTES);
    (
        (start - block_start) as usize,
        (start - offset) as usize,
        (end - start) as usize,
    )
}
