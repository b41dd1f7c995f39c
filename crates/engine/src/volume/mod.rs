//! The volume layer: thin volumes, their snapshots and clones, their names and
//! sizes, and their block maps. It applies log records to the in-memory state (the
//! same code for live writes and for replay during recovery, so that the two
//! cannot disagree) and reports every physical block that stops being referenced,
//! for segment space accounting.
//!
//! Snapshots and clones share blocks. Every map of a pool is a node of a forest:
//! a volume's snapshots, oldest first, then its live map, form a chain, and a
//! clone's chain hangs below the snapshot it was cloned from. A block is only
//! ever copied from a node to a new neighbour (snapshot, clone, rollback), so the
//! maps holding one physical block always form a connected part of that forest.
//! Hence a block a node drops is still referenced elsewhere exactly when one of
//! the node's neighbours holds it at the same logical block: one lookup per
//! overwrite, no reference counts, nothing to do at snapshot time
//! (see docs/decisions/0005-snapshots.md).

mod compression;
pub mod map;
mod operations;
mod policy;
pub mod restore;

use std::collections::{BTreeMap, BTreeSet};

use lamina_reduction::Codec;
use serde::Serialize;

use crate::BLOCK_SIZE_BYTES;
use crate::error::{EngineError, VolumeError};
use crate::log::location::{Location, UNIT_BYTES};
use map::BlockMap;
pub use policy::{CachePriority, Pin, TierPolicy};

/// Longest volume name, in bytes.
pub const VOLUME_NAME_LENGTH_MAX: usize = 64;

/// Bytes of one 16-byte unit, the grain fragments are stored in (a whole
/// block is 256 units).
pub const UNIT_SIZE_BYTES: u64 = UNIT_BYTES as u64;

/// Bytes of the devices `location` takes: 4096 for a whole block, its units
/// for a fragment.
pub fn stored_bytes_of(location: Location) -> u64 {
    u64::from(location.units()) * UNIT_SIZE_BYTES
}

/// `logical_bytes / stored_bytes` as ZFS's `compressratio`: 1.0 when
/// nothing is stored.
pub fn compress_ratio(logical_bytes: u64, stored_bytes: u64) -> f64 {
    if stored_bytes == 0 {
        1.0
    } else {
        logical_bytes as f64 / stored_bytes as f64
    }
}

/// Largest volume size: 2^50 bytes (1 PiB), far beyond any device, small enough
/// that block arithmetic never overflows.
pub const VOLUME_SIZE_BYTES_MAX: u64 = 1 << 50;

/// Volume and snapshot names: 1 to 64 characters from `A-Z a-z 0-9 . _ -`, not
/// starting with `.` or `-`. (`@` separates a volume from its snapshot in
/// `VOL@SNAP`, `/` is reserved for paths.)
pub fn validate_volume_name(name: &str) -> Result<(), EngineError> {
    let invalid = |reason: &str| {
        Err(EngineError::Volume(VolumeError::InvalidName {
            name: name.to_string(),
            reason: reason.to_string(),
        }))
    };
    if name.is_empty() || name.len() > VOLUME_NAME_LENGTH_MAX {
        return invalid("must be 1 to 64 characters");
    }
    if name.starts_with('.') || name.starts_with('-') {
        return invalid("must not start with '.' or '-'");
    }
    if !name
        .chars()
        .all(|character| character.is_ascii_alphanumeric() || "._-".contains(character))
    {
        return invalid("allowed characters are A-Z a-z 0-9 . _ -");
    }
    Ok(())
}

pub fn validate_volume_size(size_bytes: u64) -> Result<(), EngineError> {
    let invalid = |reason: &str| {
        Err(EngineError::Volume(VolumeError::InvalidSize {
            size_bytes,
            reason: reason.to_string(),
        }))
    };
    if size_bytes == 0 {
        return invalid("must be greater than zero");
    }
    if !size_bytes.is_multiple_of(BLOCK_SIZE_BYTES) {
        return invalid("must be a multiple of 4 KiB");
    }
    if size_bytes > VOLUME_SIZE_BYTES_MAX {
        return invalid("must be at most 1 PiB");
    }
    Ok(())
}

/// A readable view of a pool: a volume's live contents or one of its snapshots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum View {
    Volume(u32),
    Snapshot { volume_id: u32, snapshot_id: u32 },
}

/// What a [`View`] refers to, borrowed from the volume table.
pub struct ViewRef<'a> {
    pub volume_name: &'a str,
    pub snapshot_name: Option<&'a str>,
    pub size_bytes: u64,
    pub map: &'a BlockMap,
}

impl View {
    /// The volume the view belongs to (a snapshot's volume).
    pub fn volume_id(self) -> u32 {
        match self {
            View::Volume(volume_id) | View::Snapshot { volume_id, .. } => volume_id,
        }
    }
}

impl ViewRef<'_> {
    /// `VOL` or `VOL@SNAP`, for messages.
    pub fn full_name(&self) -> String {
        match self.snapshot_name {
            Some(snapshot) => format!("{}@{snapshot}", self.volume_name),
            None => self.volume_name.to_string(),
        }
    }
}

/// Splits `VOL@SNAP` into its parts; a plain `VOL` has no snapshot part.
pub fn split_snapshot_name(full_name: &str) -> (&str, Option<&str>) {
    match full_name.split_once('@') {
        Some((volume, snapshot)) => (volume, Some(snapshot)),
        None => (full_name, None),
    }
}

/// What `volume list` shows about a volume.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VolumeInfo {
    pub volume_id: u32,
    pub name: String,
    pub size_bytes: u64,
    /// Logical bytes of its live contents (mapped blocks × 4096, shared or
    /// not): what clients read back.
    pub allocated_bytes: u64,
    /// Device bytes its live contents reference (shared or not): 4096 per
    /// whole block, a fragment's units × 16; lost entries count nothing.
    pub stored_bytes: u64,
    /// `allocated_bytes / stored_bytes` (1.0 when nothing is stored).
    pub compress_ratio: f64,
    /// Logical bytes only the live contents reference: what a rollback
    /// would free.
    pub unique_bytes: u64,
    /// Device bytes of those blocks.
    pub unique_stored_bytes: u64,
    /// Bytes deleting the volume together with its snapshots would free.
    pub used_bytes: u64,
    pub snapshot_count: usize,
    /// `VOL@SNAP` this volume was cloned from.
    pub origin: Option<String>,
    pub created_unix_seconds: u64,
    pub policy: TierPolicy,
    /// The codec its new writes are stored with (`off`, `lz4`, `zstd:N`).
    pub compression: Codec,
}

/// What `snapshot list` shows about a snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SnapshotInfo {
    /// `VOL@SNAP`, also its NBD export name.
    pub full_name: String,
    pub volume: String,
    pub name: String,
    pub snapshot_id: u32,
    pub size_bytes: u64,
    /// Bytes of device space the snapshot references (shared or not).
    pub referenced_bytes: u64,
    /// Bytes only this snapshot references: what deleting it would free.
    pub unique_bytes: u64,
    /// Volumes cloned from this snapshot (deleting it is refused while any exist).
    pub clones: Vec<String>,
    pub created_unix_seconds: u64,
}

/// A volume's information with the maps its space accounting needs, copied
/// under the pool lock (O(1) per map) so that the accounting, which walks the
/// chunks that differ between maps, runs without holding it.
pub struct PendingVolumeInfo {
    info: VolumeInfo,
    origin: Option<BlockMap>,
    /// Oldest first.
    snapshots: Vec<BlockMap>,
    live: BlockMap,
}

impl PendingVolumeInfo {
    pub fn compute(mut self) -> VolumeInfo {
        let parent = self.snapshots.last().or(self.origin.as_ref());
        let unique = MapBytes::not_in(&self.live, parent.as_slice());
        // Without a parent every block is unique: the walk above saw the
        // whole map. With one, it skipped the chunks shared with the parent,
        // so the stored bytes take a walk of their own.
        self.info.stored_bytes = match parent {
            None => unique.stored_bytes,
            Some(_) => MapBytes::not_in(&self.live, &[]).stored_bytes,
        };
        self.info.compress_ratio =
            compress_ratio(self.info.allocated_bytes, self.info.stored_bytes);
        self.info.unique_stored_bytes = unique.stored_bytes;
        let unique_blocks = unique.block_count;
        // Each block of the chain is counted once, at the first map holding it:
        // the maps holding a block are contiguous along the chain.
        let mut used_blocks = unique_blocks;
        let mut before = self.origin.as_ref();
        for snapshot in &self.snapshots {
            used_blocks += snapshot.count_not_in(before.as_slice());
            before = Some(snapshot);
        }
        self.info.unique_bytes = unique_blocks * BLOCK_SIZE_BYTES;
        self.info.used_bytes = used_blocks * BLOCK_SIZE_BYTES;
        self.info
    }
}

/// Mappings of a map that none of some others hold, counted and weighed.
struct MapBytes {
    block_count: u64,
    stored_bytes: u64,
}

impl MapBytes {
    /// See [`BlockMap::for_each_not_in`] (`others` empty: every mapping).
    fn not_in(map: &BlockMap, others: &[&BlockMap]) -> Self {
        let mut bytes = Self {
            block_count: 0,
            stored_bytes: 0,
        };
        map.for_each_not_in(others, &mut |_, location| {
            bytes.block_count += 1;
            bytes.stored_bytes += stored_bytes_of(location);
        });
        bytes
    }
}

/// A snapshot's information with its neighbours' maps (see [`PendingVolumeInfo`]).
pub struct PendingSnapshotInfo {
    info: SnapshotInfo,
    map: BlockMap,
    neighbours: Vec<BlockMap>,
}

impl PendingSnapshotInfo {
    pub fn compute(mut self) -> SnapshotInfo {
        let neighbours: Vec<&BlockMap> = self.neighbours.iter().collect();
        self.info.unique_bytes = self.map.count_not_in(&neighbours) * BLOCK_SIZE_BYTES;
        self.info
    }
}

/// A read-only, point-in-time copy of a volume's map.
pub struct Snapshot {
    /// Unique in the pool and increasing, so a volume's snapshots sorted by
    /// identifier are in creation order.
    pub snapshot_id: u32,
    pub name: String,
    pub size_bytes: u64,
    pub created_unix_seconds: u64,
    pub map: BlockMap,
}

/// The snapshot a clone was made from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Origin {
    pub volume_id: u32,
    pub snapshot_id: u32,
}

pub struct Volume {
    pub volume_id: u32,
    pub name: String,
    pub size_bytes: u64,
    pub created_unix_seconds: u64,
    pub map: BlockMap,
    pub origin: Option<Origin>,
    /// Oldest first.
    pub snapshots: Vec<Snapshot>,
    /// Where its blocks should live in a two-tier pool (its snapshots follow it).
    pub policy: TierPolicy,
    /// The codec its new writes are stored with; what was written before
    /// keeps its form until the cleaner or the demoter moves it.
    pub compression: Codec,
}

impl Volume {
    pub fn block_count(&self) -> u64 {
        self.size_bytes / BLOCK_SIZE_BYTES
    }

    fn snapshot_index(&self, snapshot_id: u32) -> Option<usize> {
        self.snapshots
            .binary_search_by_key(&snapshot_id, |snapshot| snapshot.snapshot_id)
            .ok()
    }

    pub fn snapshot(&self, snapshot_id: u32) -> Option<&Snapshot> {
        self.snapshot_index(snapshot_id)
            .map(|index| &self.snapshots[index])
    }

    pub fn snapshot_named(&self, name: &str) -> Option<&Snapshot> {
        self.snapshots.iter().find(|snapshot| snapshot.name == name)
    }

    /// The live map and every snapshot's map.
    fn maps(&self) -> impl Iterator<Item = &BlockMap> {
        std::iter::once(&self.map).chain(self.snapshots.iter().map(|snapshot| &snapshot.map))
    }

    /// The live map and every snapshot's map, for changing them.
    fn maps_mut(&mut self) -> impl Iterator<Item = &mut BlockMap> {
        std::iter::once(&mut self.map)
            .chain(self.snapshots.iter_mut().map(|snapshot| &mut snapshot.map))
    }
}

/// Every volume of a pool, by identifier and by name.
#[derive(Default)]
pub struct VolumeTable {
    volumes: BTreeMap<u32, Volume>,
    by_name: BTreeMap<String, u32>,
    /// Clone volumes by the snapshot they came from.
    clones: BTreeMap<Origin, BTreeSet<u32>>,
    next_volume_id: u32,
    next_snapshot_id: u32,
}

impl VolumeTable {
    /// The identifier the next new volume gets (identifiers are never reused).
    pub fn next_volume_id(&self) -> u32 {
        self.next_volume_id
    }

    /// The identifier the next new snapshot gets.
    pub fn next_snapshot_id(&self) -> u32 {
        self.next_snapshot_id
    }

    /// An empty table; identifiers start at 1.
    pub fn new() -> Self {
        Self {
            next_volume_id: 1,
            next_snapshot_id: 1,
            ..Self::default()
        }
    }

    pub fn get(&self, volume_id: u32) -> Option<&Volume> {
        self.volumes.get(&volume_id)
    }

    /// The codec new writes to `volume_id` are stored with: the write path
    /// asks under the state lock. A volume deleted meanwhile stores nothing,
    /// so its answer does not matter: `Off`.
    pub fn compression(&self, volume_id: u32) -> Codec {
        self.volumes
            .get(&volume_id)
            .map_or(Codec::Off, |volume| volume.compression)
    }

    pub fn id_of(&self, name: &str) -> Result<u32, EngineError> {
        self.by_name
            .get(name)
            .copied()
            .ok_or_else(|| EngineError::Volume(VolumeError::NoSuchVolume(name.to_string())))
    }

    /// The volume and the position in its snapshot list of `volume@snapshot`.
    pub fn find_snapshot(&self, volume: &str, snapshot: &str) -> Result<(u32, usize), EngineError> {
        let volume_id = self.id_of(volume)?;
        let index = self.volumes[&volume_id]
            .snapshots
            .iter()
            .position(|candidate| candidate.name == snapshot)
            .ok_or_else(|| {
                EngineError::Volume(VolumeError::NoSuchSnapshot {
                    volume: volume.to_string(),
                    snapshot: snapshot.to_string(),
                })
            })?;
        Ok((volume_id, index))
    }

    /// The view a name denotes: `VOL` or `VOL@SNAP`.
    pub fn resolve(&self, full_name: &str) -> Result<View, EngineError> {
        match split_snapshot_name(full_name) {
            (volume, None) => Ok(View::Volume(self.id_of(volume)?)),
            (volume, Some(snapshot)) => {
                let (volume_id, index) = self.find_snapshot(volume, snapshot)?;
                Ok(View::Snapshot {
                    volume_id,
                    snapshot_id: self.volumes[&volume_id].snapshots[index].snapshot_id,
                })
            }
        }
    }

    /// The names, size and map behind a view (None once deleted), borrowed, so
    /// that the data path allocates nothing to look a view up.
    pub fn view(&self, view: View) -> Option<ViewRef<'_>> {
        match view {
            View::Volume(volume_id) => {
                let volume = self.volumes.get(&volume_id)?;
                Some(ViewRef {
                    volume_name: &volume.name,
                    snapshot_name: None,
                    size_bytes: volume.size_bytes,
                    map: &volume.map,
                })
            }
            View::Snapshot {
                volume_id,
                snapshot_id,
            } => {
                let volume = self.volumes.get(&volume_id)?;
                let snapshot = volume.snapshot(snapshot_id)?;
                Some(ViewRef {
                    volume_name: &volume.name,
                    snapshot_name: Some(&snapshot.name),
                    size_bytes: snapshot.size_bytes,
                    map: &snapshot.map,
                })
            }
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Volume> {
        self.volumes.values()
    }

    /// A checkpoint copied every map (in the same hold of the pool lock):
    /// each map counts its changes from its own copy from now on
    /// ([`map::ChangesSinceCheckpoint`]).
    pub fn checkpoint_taken(&mut self) {
        for volume in self.volumes.values_mut() {
            let volume_id = volume.volume_id;
            volume.map.checkpointed_as(map::MapName {
                volume_id,
                snapshot_id: None,
            });
            for snapshot in &mut volume.snapshots {
                snapshot.map.checkpointed_as(map::MapName {
                    volume_id,
                    snapshot_id: Some(snapshot.snapshot_id),
                });
            }
        }
    }

    /// Adds a volume with its snapshots. Its identifier and name must be new,
    /// its snapshots in identifier order, and the snapshot it was cloned from
    /// must exist: the table's invariants, checked in release builds too.
    pub fn insert(&mut self, volume: Volume) {
        assert!(
            !self.by_name.contains_key(&volume.name),
            "duplicate volume name {}",
            volume.name
        );
        assert!(
            volume
                .snapshots
                .windows(2)
                .all(|pair| pair[0].snapshot_id < pair[1].snapshot_id),
            "snapshots of volume {} out of order",
            volume.name
        );
        assert!(
            self.origin_map(volume.origin).is_some() == volume.origin.is_some(),
            "volume {} cloned from a snapshot that does not exist",
            volume.name
        );
        self.next_volume_id = self.next_volume_id.max(volume.volume_id + 1);
        if let Some(last) = volume.snapshots.last() {
            self.next_snapshot_id = self.next_snapshot_id.max(last.snapshot_id + 1);
        }
        if let Some(origin) = volume.origin {
            self.clones
                .entry(origin)
                .or_default()
                .insert(volume.volume_id);
        }
        self.by_name.insert(volume.name.clone(), volume.volume_id);
        let previous = self.volumes.insert(volume.volume_id, volume);
        assert!(previous.is_none(), "duplicate volume identifier");
    }

    /// Calls `visit` with every mapped location of every map, skipping
    /// chunks already visited through another map (a location held by two
    /// different chunks is still visited twice).
    pub fn for_each_distinct_location(&self, visit: &mut dyn FnMut(Location)) {
        let mut seen: std::collections::HashSet<*const map::Chunk> = Default::default();
        for volume in self.volumes.values() {
            for map in volume.maps() {
                for (_, chunk) in map.shared_chunks() {
                    if seen.insert(std::sync::Arc::as_ptr(chunk)) {
                        // Lost entries occupy no block.
                        let occupied = chunk.mappings().filter(|(_, mapping)| !mapping.is_lost());
                        for (_, mapping) in occupied {
                            visit(mapping.location);
                        }
                    }
                }
            }
        }
    }

    /// Marks lost every entry of every map for which `is_lost(location,
    /// changed since the checkpoint)` holds (a restore without the flash
    /// device); returns how many entries, counting a location once per map
    /// that holds it.
    pub fn mark_lost(&mut self, is_lost: &dyn Fn(Location, bool) -> bool) -> u64 {
        self.volumes
            .values_mut()
            .flat_map(Volume::maps_mut)
            .map(|map| map.mark_lost(is_lost))
            .sum()
    }

    /// Calls `visit` with every mapping of every map, skipping chunks already
    /// visited through another map (scrub's list of live blocks).
    pub fn for_each_distinct_mapping(&self, visit: &mut dyn FnMut(map::Mapping)) {
        let mut seen: std::collections::HashSet<*const map::Chunk> = Default::default();
        for volume in self.volumes.values() {
            for map in volume.maps() {
                for (_, chunk) in map.shared_chunks() {
                    if !seen.insert(std::sync::Arc::as_ptr(chunk)) {
                        continue;
                    }
                    // Lost entries occupy no block to check.
                    let occupied = chunk.mappings().filter(|(_, mapping)| !mapping.is_lost());
                    for (_, mapping) in occupied {
                        visit(mapping);
                    }
                }
            }
        }
    }

    /// Names of the volumes cloned from a snapshot.
    pub fn clone_names(&self, origin: Origin) -> Vec<String> {
        self.clones
            .get(&origin)
            .into_iter()
            .flatten()
            .filter_map(|volume_id| self.volumes.get(volume_id))
            .map(|volume| volume.name.clone())
            .collect()
    }

    /// Names of every clone of any snapshot of a volume.
    pub fn clone_names_of_volume(&self, volume_id: u32) -> Vec<String> {
        self.clone_ids_of_volume(volume_id)
            .into_iter()
            .filter_map(|clone_id| self.volumes.get(&clone_id))
            .map(|clone| {
                let origin = self.origin_full_name(clone.origin).unwrap_or_default();
                format!("{} (of {origin})", clone.name)
            })
            .collect()
    }

    /// `VOL@SNAP` of the snapshot a clone came from.
    fn origin_full_name(&self, origin: Option<Origin>) -> Option<String> {
        let origin = origin?;
        let volume = self.volumes.get(&origin.volume_id)?;
        let snapshot = volume.snapshot(origin.snapshot_id)?;
        Some(format!("{}@{}", volume.name, snapshot.name))
    }

    fn origin_map(&self, origin: Option<Origin>) -> Option<&BlockMap> {
        let origin = origin?;
        Some(
            &self
                .volumes
                .get(&origin.volume_id)?
                .snapshot(origin.snapshot_id)?
                .map,
        )
    }

    /// The map before position `index` of a volume's chain (its snapshots oldest
    /// first, then the live map at `snapshots.len()`): the previous snapshot, else
    /// the snapshot the volume was cloned from.
    fn chain_parent<'a>(&'a self, volume: &'a Volume, index: usize) -> Option<&'a BlockMap> {
        match index {
            0 => self.origin_map(volume.origin),
            _ => Some(&volume.snapshots[index - 1].map),
        }
    }

    /// The map before a volume's live map in its chain.
    fn live_parent<'a>(&'a self, volume: &'a Volume) -> Option<&'a BlockMap> {
        self.chain_parent(volume, volume.snapshots.len())
    }

    /// The neighbours of snapshot `index` of `volume`: the map before it, the map
    /// after it, and the first map of each clone made from it.
    fn snapshot_neighbours<'a>(&'a self, volume: &'a Volume, index: usize) -> Vec<&'a BlockMap> {
        let mut neighbours: Vec<&BlockMap> = self.chain_parent(volume, index).into_iter().collect();
        neighbours.push(match volume.snapshots.get(index + 1) {
            Some(next) => &next.map,
            None => &volume.map,
        });
        let origin = Origin {
            volume_id: volume.volume_id,
            snapshot_id: volume.snapshots[index].snapshot_id,
        };
        for clone_id in self.clones.get(&origin).into_iter().flatten() {
            if let Some(clone) = self.volumes.get(clone_id) {
                neighbours.push(match clone.snapshots.first() {
                    Some(first) => &first.map,
                    None => &clone.map,
                });
            }
        }
        neighbours
    }

    /// The volume `volume_id` was cloned from, directly or not, that is not a
    /// clone itself: its family holds every map that can share a block with
    /// `volume_id`'s.
    pub fn root_of(&self, volume_id: u32) -> u32 {
        let mut current = volume_id;
        while let Some(origin) = self.volumes.get(&current).and_then(|volume| volume.origin) {
            current = origin.volume_id;
        }
        current
    }

    /// A volume and every volume cloned, directly or not, from its snapshots: the
    /// only maps that can hold a block the volume wrote.
    pub fn family(&self, volume_id: u32) -> Vec<u32> {
        let mut family = Vec::new();
        let mut pending = vec![volume_id];
        while let Some(member) = pending.pop() {
            if !self.volumes.contains_key(&member) || family.contains(&member) {
                continue;
            }
            family.push(member);
            pending.extend(self.clone_ids_of_volume(member));
        }
        family
    }

    fn clone_ids_of_volume(&self, volume_id: u32) -> Vec<u32> {
        self.clones
            .range(
                Origin {
                    volume_id,
                    snapshot_id: 0,
                }..=Origin {
                    volume_id,
                    snapshot_id: u32::MAX,
                },
            )
            .flat_map(|(_, clones)| clones.iter().copied())
            .collect()
    }

    /// The checksum of `location` if any map of `family` (see
    /// [`Self::family`]) holds it at `logical_block`: whether the cleaner must
    /// move it.
    pub fn holder_checksum(
        &self,
        family: &[u32],
        logical_block: u64,
        location: Location,
    ) -> Option<u32> {
        family
            .iter()
            .filter_map(|volume_id| self.volumes.get(volume_id))
            .flat_map(Volume::maps)
            .filter_map(|map| map.get(logical_block))
            .find(|mapping| mapping.location == location)
            .map(|mapping| mapping.checksum)
    }

    /// Whether `location` is held only by the live map of `volume_id`,
    /// at `logical_block`: `family` is the volume alone (no clones) and it has
    /// no snapshots. Moving such a block needs no conditional relocation
    /// record: a plain `Data` record for the volume says the same.
    pub fn sole_holder(
        &self,
        family: &[u32],
        volume_id: u32,
        logical_block: u64,
        location: Location,
    ) -> bool {
        family == [volume_id]
            && self.volumes.get(&volume_id).is_some_and(|volume| {
                volume.snapshots.is_empty()
                    && volume
                        .map
                        .get(logical_block)
                        .is_some_and(|mapping| mapping.location == location)
            })
    }

    /// A volume's accounting inputs (see [`PendingVolumeInfo`]).
    pub fn volume_info(&self, volume_id: u32) -> Option<PendingVolumeInfo> {
        let volume = self.volumes.get(&volume_id)?;
        Some(PendingVolumeInfo {
            info: VolumeInfo {
                volume_id,
                name: volume.name.clone(),
                size_bytes: volume.size_bytes,
                allocated_bytes: volume.map.mapped_count() * BLOCK_SIZE_BYTES,
                stored_bytes: 0,
                compress_ratio: 1.0,
                unique_bytes: 0,
                unique_stored_bytes: 0,
                used_bytes: 0,
                snapshot_count: volume.snapshots.len(),
                origin: self.origin_full_name(volume.origin),
                created_unix_seconds: volume.created_unix_seconds,
                policy: volume.policy,
                compression: volume.compression,
            },
            origin: self.origin_map(volume.origin).cloned(),
            snapshots: volume
                .snapshots
                .iter()
                .map(|snapshot| snapshot.map.clone())
                .collect(),
            live: volume.map.clone(),
        })
    }

    pub fn snapshot_infos(&self, volume_id: u32) -> Vec<PendingSnapshotInfo> {
        let count = self
            .volumes
            .get(&volume_id)
            .map_or(0, |volume| volume.snapshots.len());
        (0..count)
            .filter_map(|index| self.snapshot_info(volume_id, index))
            .collect()
    }

    /// Snapshot `index` (0 = oldest) of a volume, with its accounting inputs.
    pub fn snapshot_info(&self, volume_id: u32, index: usize) -> Option<PendingSnapshotInfo> {
        let volume = self.volumes.get(&volume_id)?;
        let snapshot = volume.snapshots.get(index)?;
        Some(PendingSnapshotInfo {
            info: SnapshotInfo {
                full_name: format!("{}@{}", volume.name, snapshot.name),
                volume: volume.name.clone(),
                name: snapshot.name.clone(),
                snapshot_id: snapshot.snapshot_id,
                size_bytes: snapshot.size_bytes,
                referenced_bytes: snapshot.map.mapped_count() * BLOCK_SIZE_BYTES,
                unique_bytes: 0,
                clones: self.clone_names(Origin {
                    volume_id,
                    snapshot_id: snapshot.snapshot_id,
                }),
                created_unix_seconds: snapshot.created_unix_seconds,
            },
            map: snapshot.map.clone(),
            neighbours: self
                .snapshot_neighbours(volume, index)
                .into_iter()
                .cloned()
                .collect(),
        })
    }

    /// `VOL@SNAP` of every snapshot, without the accounting (for export lists).
    pub fn snapshot_full_names(&self) -> Vec<String> {
        self.volumes
            .values()
            .flat_map(|volume| {
                volume
                    .snapshots
                    .iter()
                    .map(move |snapshot| format!("{}@{}", volume.name, snapshot.name))
            })
            .collect()
    }
}
