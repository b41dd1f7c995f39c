//! The domain operations on a volume table, one method each, and `apply`,
//! which decodes a log record into a call of one of them. The pool calls
//! `apply` both for live writes and for replay during recovery, so that the two
//! cannot disagree.
//!
//! Every operation tolerates a volume or snapshot that does not exist (possible
//! only when replaying after an unflushed deletion was lost with its
//! successors) by doing nothing, and reports through `displaced` each physical
//! block that no map references any more, for segment space accounting.

use lamina_reduction::Codec;

use super::map::{BlockMap, Mapping, relocate_in};
use super::{Origin, Snapshot, TierPolicy, Volume, VolumeTable};
use crate::BLOCK_SIZE_BYTES;
use crate::log::batch::Record;
use crate::log::location::Location;

impl VolumeTable {
    /// Applies one record. A record carrying data needs the physical block its
    /// data went to. `displaced` receives each physical block that no map
    /// references any more.
    pub fn apply(
        &mut self,
        record: &Record,
        location: Option<Location>,
        displaced: &mut dyn FnMut(Location),
    ) {
        self.apply_with_level(record, location, None, displaced);
    }

    /// [`Self::apply`] for a record just appended: a client write's data
    /// record may bring the interval level its placement chose, set in the
    /// same walk of the map as the new mapping.
    pub fn apply_with_level(
        &mut self,
        record: &Record,
        location: Option<Location>,
        interval_level: Option<u8>,
        displaced: &mut dyn FnMut(Location),
    ) {
        assert!(
            interval_level.is_none()
                || matches!(record, Record::Data { .. } | Record::Packed { .. }),
            "only a client write's data record carries an interval level"
        );
        match record {
            Record::Data {
                volume_id,
                logical_block,
                checksum,
            }
            | Record::Packed {
                volume_id,
                logical_block,
                checksum,
                ..
            } => {
                let location = location.expect("data record applied without its block");
                let mapping = Mapping {
                    location,
                    checksum: *checksum,
                };
                self.map_written_block(
                    *volume_id,
                    *logical_block,
                    mapping,
                    interval_level,
                    displaced,
                );
            }
            Record::Relocate {
                volume_id,
                logical_block,
                from_physical_block: from,
                checksum,
            }
            | Record::RelocatePacked {
                volume_id,
                logical_block,
                from,
                checksum,
                ..
            } => {
                let location = location.expect("relocation record applied without its block");
                let to = Mapping {
                    location,
                    checksum: *checksum,
                };
                let from =
                    Location::from_raw(*from).expect("summaries are decoded with valid locations");
                self.relocate_block(*volume_id, *logical_block, from, to, displaced);
            }
            Record::Unmap {
                volume_id,
                logical_block,
                block_count,
            } => self.unmap_range(*volume_id, *logical_block, *block_count, displaced),
            _ => self.apply_catalog_record(record, displaced),
        }
    }

    /// Whether `record`, a block the cleaner or the demoter moved (a `Data`
    /// or `Relocate` record, or their packed forms), moves contents the maps
    /// hold now: some map holds the block it replaces (see
    /// [`Self::moved_mappings`]), every such map with the record's checksum.
    /// Anything else moved a version the maps do not hold, or the held one
    /// in a new form (decision 0074): a restore without the flash device,
    /// whose maps are as of the copied checkpoint, must not apply it on
    /// this evidence (`pool::open`, decisions 0056 and 0074).
    pub fn moves_held_contents(&self, record: &Record) -> bool {
        let Some(checksum) = record.data_checksum() else {
            return false;
        };
        let held = self.moved_mappings(record);
        !held.is_empty() && held.iter().all(|held| held.checksum == checksum)
    }

    /// The mappings a move of a block (`record`) replaces where the maps
    /// hold them now: for a `Data` or `Packed` record (a block only the live
    /// map held) the volume's live entry at its block; for a `Relocate` or
    /// `RelocatePacked` record the entry at its block of every map of the
    /// volume's family that holds its source. Empty for any other record,
    /// or when no map holds what it moved.
    pub fn moved_mappings(&self, record: &Record) -> Vec<Mapping> {
        match record {
            Record::Data {
                volume_id,
                logical_block,
                ..
            }
            | Record::Packed {
                volume_id,
                logical_block,
                ..
            } => self
                .volumes
                .get(volume_id)
                .and_then(|volume| volume.map.get(*logical_block))
                .into_iter()
                .collect(),
            Record::Relocate {
                volume_id,
                logical_block,
                from_physical_block: from,
                ..
            }
            | Record::RelocatePacked {
                volume_id,
                logical_block,
                from,
                ..
            } => self
                .family(*volume_id)
                .into_iter()
                .filter_map(|member| self.volumes.get(&member))
                .flat_map(Volume::maps)
                .filter_map(|map| map.get(*logical_block))
                .filter(|held| held.location.raw() == *from)
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Applies a record that changes volumes or snapshots rather than blocks.
    fn apply_catalog_record(&mut self, record: &Record, displaced: &mut dyn FnMut(Location)) {
        match record {
            Record::VolumeCreate {
                volume_id,
                name,
                size_bytes,
                created_unix_seconds,
            } => self.create_volume(*volume_id, name, *size_bytes, *created_unix_seconds),
            Record::VolumeResize {
                volume_id,
                size_bytes,
            } => self.resize_volume(*volume_id, *size_bytes, displaced),
            Record::VolumeRename { volume_id, name } => self.rename_volume(*volume_id, name),
            Record::VolumeDelete { volume_id } => self.delete_volume(*volume_id, displaced),
            Record::VolumePolicy { volume_id, policy } => {
                self.set_policy(*volume_id, TierPolicy::from(*policy))
            }
            Record::VolumeCompression { volume_id, codec } => match Codec::try_from(*codec) {
                Ok(codec) => self.set_compression(*volume_id, codec),
                // No build writes one: the volume keeps its codec, which
                // changes only the form of its new writes.
                Err(error) => {
                    tracing::error!(volume_id, %error, "compression record with an invalid codec; ignored")
                }
            },
            Record::SnapshotCreate {
                volume_id,
                snapshot_id,
                name,
                created_unix_seconds,
            } => self.create_snapshot(*volume_id, *snapshot_id, name, *created_unix_seconds),
            Record::SnapshotDelete {
                volume_id,
                snapshot_id,
            } => self.delete_snapshot(*volume_id, *snapshot_id, displaced),
            Record::SnapshotRollback {
                volume_id,
                snapshot_id,
            } => self.rollback_to_snapshot(*volume_id, *snapshot_id, displaced),
            Record::VolumeClone {
                volume_id,
                name,
                origin_volume_id,
                origin_snapshot_id,
                created_unix_seconds,
            } => {
                let origin = Origin {
                    volume_id: *origin_volume_id,
                    snapshot_id: *origin_snapshot_id,
                };
                self.clone_snapshot(*volume_id, name, origin, *created_unix_seconds)
            }
            Record::Data { .. }
            | Record::Relocate { .. }
            | Record::Unmap { .. }
            | Record::Packed { .. }
            | Record::RelocatePacked { .. } => {
                unreachable!("block records are applied by VolumeTable::apply")
            }
        }
    }

    /// Maps `logical_block` of a volume to a block a client just wrote. A
    /// block for no volume, or past its end, is garbage at once.
    pub fn map_written_block(
        &mut self,
        volume_id: u32,
        logical_block: u64,
        mapping: Mapping,
        interval_level: Option<u8>,
        displaced: &mut dyn FnMut(Location),
    ) {
        let Some(volume) = self
            .volumes
            .get_mut(&volume_id)
            .filter(|volume| logical_block < volume.block_count())
        else {
            displaced(mapping.location);
            return;
        };
        // One walk sets the entry and reports what it held (none for an
        // unmapped or lost entry: a lost entry occupies no block).
        let old = volume
            .map
            .set_with_level(logical_block, mapping, interval_level);
        // The parent is another map (a snapshot's or the origin's), which
        // the set did not touch: it still holds the old block if it shares it.
        let shared = old.is_some_and(|old| {
            self.live_parent(&self.volumes[&volume_id])
                .is_some_and(|parent| parent.holds(logical_block, old))
        });
        if let Some(old) = old
            && !shared
        {
            displaced(old);
        }
    }

    /// The cleaner moved a block: every map of the volume's family holding
    /// `from` at `logical_block` now holds `to`. If none held it
    /// any more, the copy itself is garbage.
    pub fn relocate_block(
        &mut self,
        volume_id: u32,
        logical_block: u64,
        from: Location,
        to: Mapping,
        displaced: &mut dyn FnMut(Location),
    ) {
        // Take the family's volumes out for the move: cost proportional to
        // the family, not to every volume of the pool.
        let mut members: Vec<Volume> = self
            .family(volume_id)
            .into_iter()
            .filter_map(|member| self.volumes.remove(&member))
            .collect();
        let maps = members.iter_mut().flat_map(Volume::maps_mut);
        let held = relocate_in(maps, logical_block, from, to);
        for member in members {
            self.volumes.insert(member.volume_id, member);
        }
        if held > 0 {
            displaced(from);
        } else {
            displaced(to.location);
        }
    }

    /// Unmaps a range of a volume's live map (trim, zeroes, shrinking);
    /// blocks its parent still holds stay.
    pub fn unmap_range(
        &mut self,
        volume_id: u32,
        logical_block: u64,
        block_count: u64,
        displaced: &mut dyn FnMut(Location),
    ) {
        let Some(volume) = self.volumes.get_mut(&volume_id) else {
            return;
        };
        let mut dropped: Vec<Mapped> = Vec::new();
        volume
            .map
            .unmap_range(logical_block, block_count, &mut |logical, physical| {
                dropped.push(Mapped { logical, physical })
            });
        let volume = &self.volumes[&volume_id];
        let parent = self.live_parent(volume);
        for Mapped { logical, physical } in dropped {
            if !parent.is_some_and(|parent| parent.holds(logical, physical)) {
                displaced(physical);
            }
        }
    }

    /// A new, empty volume with the default tier policy, storing blocks as
    /// they are (a `VolumeCompression` record sets its codec). An identifier
    /// or name already taken leaves the table as it is.
    pub fn create_volume(
        &mut self,
        volume_id: u32,
        name: &str,
        size_bytes: u64,
        created_unix_seconds: u64,
    ) {
        if self.volumes.contains_key(&volume_id) || self.by_name.contains_key(name) {
            return;
        }
        self.insert(Volume {
            volume_id,
            name: name.to_string(),
            size_bytes,
            created_unix_seconds,
            map: BlockMap::default(),
            origin: None,
            snapshots: Vec::new(),
            policy: TierPolicy::default(),
            compression: Codec::Off,
        });
    }

    /// Changes a volume's size; shrinking unmaps every block at or past the
    /// new end.
    pub fn resize_volume(
        &mut self,
        volume_id: u32,
        size_bytes: u64,
        displaced: &mut dyn FnMut(Location),
    ) {
        let Some(volume) = self.volumes.get(&volume_id) else {
            return;
        };
        let new_block_count = size_bytes / BLOCK_SIZE_BYTES;
        if new_block_count < volume.block_count() {
            let beyond_count = u64::MAX - new_block_count;
            self.unmap_range(volume_id, new_block_count, beyond_count, displaced);
        }
        self.volumes
            .get_mut(&volume_id)
            .expect("found above")
            .size_bytes = size_bytes;
    }

    /// Renames a volume, unless the name is taken.
    pub fn rename_volume(&mut self, volume_id: u32, name: &str) {
        if self.by_name.contains_key(name) {
            return;
        }
        if let Some(volume) = self.volumes.get_mut(&volume_id) {
            let previous = self.by_name.remove(&volume.name);
            assert_eq!(previous, Some(volume_id), "name index out of step");
            volume.name = name.to_string();
            self.by_name.insert(name.to_string(), volume_id);
        }
    }

    /// Deletes a volume and its snapshots, newest map first, so that each map
    /// removed is at the end of its chain and only its parent can share its
    /// blocks. Refused while any of its snapshots has clones.
    pub fn delete_volume(&mut self, volume_id: u32, displaced: &mut dyn FnMut(Location)) {
        let Some(volume) = self.volumes.get(&volume_id) else {
            return;
        };
        if !self.clone_ids_of_volume(volume_id).is_empty() {
            tracing::error!(
                volume_id,
                "deleting a volume whose snapshots have clones; ignored"
            );
            return;
        }
        let parent = self.live_parent(volume);
        volume
            .map
            .for_each_not_in(parent.as_slice(), &mut |_, physical| displaced(physical));
        for index in (0..volume.snapshots.len()).rev() {
            let parent = self.chain_parent(volume, index);
            volume.snapshots[index]
                .map
                .for_each_not_in(parent.as_slice(), &mut |_, physical| displaced(physical));
        }
        let volume = self.volumes.remove(&volume_id).expect("found above");
        self.by_name.remove(&volume.name);
        if let Some(origin) = volume.origin
            && let Some(clones) = self.clones.get_mut(&origin)
        {
            clones.remove(&volume_id);
            if clones.is_empty() {
                self.clones.remove(&origin);
            }
        }
        assert_eq!(
            self.by_name.len(),
            self.volumes.len(),
            "name index out of step"
        );
    }

    /// Changes a volume's tier policy (its snapshots follow it).
    pub fn set_policy(&mut self, volume_id: u32, policy: TierPolicy) {
        if let Some(volume) = self.volumes.get_mut(&volume_id) {
            volume.policy = policy;
        }
    }

    /// Changes the codec of a volume's new writes (its snapshots hold only
    /// what was written, and follow no setting).
    pub fn set_compression(&mut self, volume_id: u32, codec: Codec) {
        if let Some(volume) = self.volumes.get_mut(&volume_id) {
            volume.compression = codec;
        }
    }

    /// A read-only snapshot of a volume's current contents: a copy of its map,
    /// O(1) per chunk. Refused unless newer than the volume's newest snapshot
    /// and named differently from all of them.
    pub fn create_snapshot(
        &mut self,
        volume_id: u32,
        snapshot_id: u32,
        name: &str,
        created_unix_seconds: u64,
    ) {
        let Some(volume) = self.volumes.get_mut(&volume_id) else {
            return;
        };
        let in_order = volume
            .snapshots
            .last()
            .is_none_or(|last| last.snapshot_id < snapshot_id);
        if !in_order || volume.snapshot_named(name).is_some() {
            tracing::error!(
                volume_id,
                snapshot_id,
                %name,
                "snapshot record conflicts with an existing snapshot; ignored"
            );
            return;
        }
        volume.snapshots.push(Snapshot {
            snapshot_id,
            name: name.to_string(),
            size_bytes: volume.size_bytes,
            created_unix_seconds,
            map: volume.map.clone(),
        });
        self.next_snapshot_id = self.next_snapshot_id.max(snapshot_id + 1);
    }

    /// Deletes a snapshot; refused while clones of it exist.
    pub fn delete_snapshot(
        &mut self,
        volume_id: u32,
        snapshot_id: u32,
        displaced: &mut dyn FnMut(Location),
    ) {
        let Some(volume) = self.volumes.get(&volume_id) else {
            return;
        };
        let Some(index) = volume.snapshot_index(snapshot_id) else {
            return;
        };
        let origin = Origin {
            volume_id,
            snapshot_id,
        };
        if self
            .clones
            .get(&origin)
            .is_some_and(|clones| !clones.is_empty())
        {
            tracing::error!(
                volume_id,
                snapshot_id,
                "deleting a snapshot that has clones; ignored"
            );
            return;
        }
        let neighbours = self.snapshot_neighbours(volume, index);
        volume.snapshots[index]
            .map
            .for_each_not_in(&neighbours, &mut |_, physical| displaced(physical));
        self.volumes
            .get_mut(&volume_id)
            .expect("found above")
            .snapshots
            .remove(index);
        self.clones.remove(&origin);
    }

    /// The volume's contents and size become those of its newest snapshot;
    /// refused for any other snapshot. Its tier policy and codec stay as
    /// they are now (settings, not contents).
    pub fn rollback_to_snapshot(
        &mut self,
        volume_id: u32,
        snapshot_id: u32,
        displaced: &mut dyn FnMut(Location),
    ) {
        let Some(volume) = self.volumes.get(&volume_id) else {
            return;
        };
        let Some(newest) = volume
            .snapshots
            .last()
            .filter(|newest| newest.snapshot_id == snapshot_id)
        else {
            tracing::error!(
                volume_id,
                snapshot_id,
                "rollback to a snapshot that is not the newest; ignored"
            );
            return;
        };
        volume
            .map
            .for_each_not_in(&[&newest.map], &mut |_, physical| displaced(physical));
        let map = newest.map.clone();
        let size_bytes = newest.size_bytes;
        let volume = self.volumes.get_mut(&volume_id).expect("found above");
        volume.map = map;
        volume.size_bytes = size_bytes;
    }

    /// A new writable volume whose contents, size, tier policy and codec
    /// start as those of a snapshot (and its volume: the policy and codec it
    /// has at clone time). An identifier or name already taken, or an origin
    /// that does not exist, leaves the table as it is.
    pub fn clone_snapshot(
        &mut self,
        volume_id: u32,
        name: &str,
        origin: Origin,
        created_unix_seconds: u64,
    ) {
        if self.volumes.contains_key(&volume_id) || self.by_name.contains_key(name) {
            return;
        }
        let Some(origin_volume) = self.volumes.get(&origin.volume_id) else {
            return;
        };
        let Some(snapshot) = origin_volume.snapshot(origin.snapshot_id) else {
            return;
        };
        let volume = Volume {
            volume_id,
            name: name.to_string(),
            size_bytes: snapshot.size_bytes,
            created_unix_seconds,
            map: snapshot.map.clone(),
            origin: Some(origin),
            snapshots: Vec::new(),
            policy: origin_volume.policy,
            compression: origin_volume.compression,
        };
        self.insert(volume);
    }
}

/// A mapping dropped from a live map, kept until the parent can be asked
/// whether it still holds the block.
struct Mapped {
    logical: u64,
    physical: Location,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(logical_block: u64) -> Record {
        Record::Data {
            volume_id: 1,
            logical_block,
            checksum: 7,
        }
    }

    /// Applies a data record written at `physical_block`; returns what it
    /// displaced.
    fn write(
        table: &mut VolumeTable,
        logical_block: u64,
        physical_block: u64,
        level: Option<u8>,
    ) -> Vec<u64> {
        let mut displaced = Vec::new();
        table.apply_with_level(
            &data(logical_block),
            Some(Location::whole_block(physical_block)),
            level,
            &mut |location| displaced.push(location.whole_block_number()),
        );
        displaced
    }

    fn level_of(table: &VolumeTable, logical_block: u64) -> u8 {
        let entry = table.get(1).unwrap().map.entry(logical_block).unwrap();
        entry.interval_level
    }

    #[test]
    fn a_write_sets_its_level_in_the_same_walk_and_displaces_only_unshared_blocks() {
        let mut table = VolumeTable::new();
        let mut nothing = |block| panic!("a catalog record displaced {block}");
        table.apply(
            &Record::VolumeCreate {
                volume_id: 1,
                name: "v".to_string(),
                size_bytes: 1 << 20,
                created_unix_seconds: 1,
            },
            None,
            &mut nothing,
        );
        assert_eq!(write(&mut table, 3, 100, Some(9)), Vec::<u64>::new());
        assert_eq!(level_of(&table, 3), 9);
        // A write without a level keeps the entry's level.
        assert_eq!(write(&mut table, 3, 101, None), vec![100]);
        assert_eq!(level_of(&table, 3), 9);
        assert_eq!(write(&mut table, 3, 102, Some(4)), vec![101]);
        assert_eq!(level_of(&table, 3), 4);
        table.apply(
            &Record::SnapshotCreate {
                volume_id: 1,
                snapshot_id: 5,
                name: "s".to_string(),
                created_unix_seconds: 2,
            },
            None,
            &mut nothing,
        );
        // The snapshot still holds 102: nothing is displaced.
        assert_eq!(write(&mut table, 3, 103, Some(6)), Vec::<u64>::new());
        assert_eq!(level_of(&table, 3), 6);
        let snapshot = &table.get(1).unwrap().snapshots[0].map;
        assert!(
            snapshot.holds(3, Location::whole_block(102)),
            "the snapshot's copy of the chunk is its own"
        );
        assert_eq!(write(&mut table, 3, 104, None), vec![103]);
        // Beyond the volume's end the new block itself is garbage.
        assert_eq!(write(&mut table, 1 << 20, 105, Some(1)), vec![105]);
    }
}
