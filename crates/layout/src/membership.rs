//! Which members new zones use, and changing the members: `open_region`
//! (a zone about to be written from its start gets the current write set,
//! durably), removing a member (`begin_removal`: out of the write set, so
//! the engine moving data out of the zones that hold it leaves it empty;
//! `finish_removal`: its label wiped, the slot empty), adding a device into
//! an empty slot (`add_member`), and copying the mirrored prefix to another
//! member after a holder is lost (`restore_prefix_redundancy`).
//!
//! The write set is every member in use and not being removed, plus a
//! member whose replacement is being rebuilt (its writes go to the
//! replacement). A zone is only laid out over it when it is at least as
//! wide as the redundancy needs; otherwise zones keep the full set of slots,
//! degraded, as arrays without zones always are.

use std::sync::Arc;

use lamina_device::{DeviceError, DeviceErrorKind, RegionShape};

use crate::array::{RedundantArray, to_label_index, write_label};
use crate::assemble::{ArrayError, MemberDevice};
use crate::geometry::BLOCK_SIZE_BYTES;
use crate::geometry::to_usize;
use crate::member::MemberState;
use crate::stripe::{SetMask, full_set, members_of};
use crate::zones::MEMBER_SETS_MAX;

/// What [`RedundantArray::write_set`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteSet {
    /// Members a zone opened now is striped over, ascending.
    pub members: Vec<usize>,
    /// Whether that set is as wide as the redundancy needs (otherwise new
    /// zones get the full set of slots, degraded).
    pub redundant: bool,
}

impl RedundantArray {
    /// The members in use and not being removed, plus one whose
    /// replacement is being rebuilt.
    fn write_set_mask(&self) -> SetMask {
        let removing = self.removing.lock().expect("removing lock").clone();
        self.members
            .iter()
            .enumerate()
            .filter(|(index, member)| {
                // One snapshot, so that a replacement promoted meanwhile
                // still counts (see `Member::write_targets`).
                let targets = member.write_targets();
                (targets.device.is_some() && !removing[*index]) || targets.replacement.is_some()
            })
            .fold(0, |mask, (index, _)| mask | (1 << index))
    }

    /// The write set when it is wide enough for the redundancy.
    pub(crate) fn narrowed_write_set(&self) -> Option<SetMask> {
        let mask = self.write_set_mask();
        let wide_enough = members_of(mask).len() >= self.geometry.redundancy.member_count_min();
        wide_enough.then_some(mask)
    }

    /// The set a zone opened now gets.
    fn set_for_new_zone(&self) -> SetMask {
        self.narrowed_write_set()
            .unwrap_or_else(|| full_set(self.geometry.member_count))
    }

    /// The current write set (for the engine and the control layer).
    pub fn write_set(&self) -> WriteSet {
        let narrowed = self.narrowed_write_set();
        WriteSet {
            members: members_of(self.set_for_new_zone()),
            redundant: narrowed.is_some() && self.geometry.is_zoned()
                || (!self.geometry.is_zoned() && self.lost_member_count() == 0),
        }
    }

    /// See [`BlockDevice::new_regions_redundant`]: an array without zones
    /// cannot narrow, so only a whole one is.
    pub(crate) fn narrowing_restores_redundancy(&self) -> bool {
        self.write_set().redundant
    }

    /// The zone of the region `offset..offset + length`, which must be one
    /// whole zone (one engine segment).
    pub(crate) fn zone_of_region(&self, offset: u64, length: u64) -> u64 {
        let zone_bytes = self.geometry.zone_address_blocks() * BLOCK_SIZE_BYTES;
        let prefix_bytes = self.geometry.prefix_blocks * BLOCK_SIZE_BYTES;
        assert!(
            offset >= prefix_bytes
                && (offset - prefix_bytes).is_multiple_of(zone_bytes)
                && length == zone_bytes,
            "a region is one whole zone of {zone_bytes} bytes from {prefix_bytes} (offset {offset}, length {length})"
        );
        let zone = (offset - prefix_bytes) / zone_bytes;
        assert!(
            zone < self.geometry.zone_count(),
            "zone {zone} beyond the array"
        );
        zone
    }

    /// The shape of zone `zone` now.
    fn shape_of_zone(&self, zone: u64) -> RegionShape {
        let view = self.zone(zone);
        let degraded = {
            let removing = self.removing.lock().expect("removing lock");
            view.stripe
                .members()
                .iter()
                .any(|index| !self.members[*index].state().is_usable() || removing[*index])
        };
        let mask = view.stripe.mask();
        RegionShape {
            usable_bytes: view.usable_blocks() * BLOCK_SIZE_BYTES,
            row_bytes: view.row_data_blocks() * BLOCK_SIZE_BYTES,
            degraded,
            current: mask == self.set_for_new_zone(),
            readable: self.unreadable_in(mask) <= view.stripe.parity_columns(),
        }
    }

    /// Bytes a zone opened now holds: its rows times the data columns of
    /// the set it would get.
    pub(crate) fn usable_bytes_of_new_zone(&self) -> u64 {
        let width = members_of(self.set_for_new_zone()).len();
        let parity = self.geometry.parity_columns();
        self.geometry.zone_rows * (width - parity) as u64 * BLOCK_SIZE_BYTES
    }

    pub(crate) fn shape_of_region(&self, offset: u64, length: u64) -> Option<RegionShape> {
        if !self.geometry.is_zoned() {
            return None;
        }
        Some(self.shape_of_zone(self.zone_of_region(offset, length)))
    }

    /// See [`BlockDevice::open_region`]: the zone gets the write set,
    /// durably on every usable member before this returns.
    pub(crate) async fn open_zone(
        &self,
        offset: u64,
        length: u64,
    ) -> Result<Option<RegionShape>, DeviceError> {
        let shapes = self.open_zones(&[offset], length).await?;
        Ok(shapes.into_iter().next().flatten())
    }

    /// See [`BlockDevice::open_regions`]: every zone of the batch gets the
    /// write set in one table update (`persist_zone_sets`: two copies, a
    /// flush after each), not one per zone.
    pub(crate) async fn open_zones(
        &self,
        offsets: &[u64],
        length: u64,
    ) -> Result<Vec<Option<RegionShape>>, DeviceError> {
        if !self.geometry.is_zoned() {
            return Ok(vec![None; offsets.len()]);
        }
        let zones: Vec<u64> = offsets
            .iter()
            .map(|offset| self.zone_of_region(*offset, length))
            .collect();
        let _one_change_at_a_time = self.open_lock.lock().await;
        let mask = self.set_for_new_zone();
        let first_offset = offsets.first().copied().unwrap_or_default();
        let set = self
            .set_index_for(mask)
            .await
            .map_err(|error| self.as_device_error(error, first_offset, length))?;
        let changed: Vec<u64> = {
            let state = self.zones.read().expect("zone state lock");
            zones
                .iter()
                .copied()
                .filter(|zone| state.table[to_usize(*zone)] != set)
                .collect()
        };
        if !changed.is_empty() {
            self.persist_zone_sets(&changed, set).await?;
            tracing::info!(array = %self.name, zones = changed.len(), first = changed[0], members = ?members_of(mask), "zones opened over a new member set");
        }
        Ok(zones
            .into_iter()
            .map(|zone| Some(self.shape_of_zone(zone)))
            .collect())
    }

    pub(crate) fn as_device_error(
        &self,
        error: ArrayError,
        offset: u64,
        length: u64,
    ) -> DeviceError {
        match error {
            ArrayError::Device(error) => error,
            other => DeviceError::new(
                DeviceErrorKind::Io(std::io::Error::other(other)),
                &self.name,
                offset,
                length,
            ),
        }
    }

    /// The index of set `mask` in the label's list, adding it (reusing an
    /// index no zone names) and making the labels durable first when it is
    /// new. Called under `open_lock`.
    async fn set_index_for(&self, mask: SetMask) -> Result<u8, ArrayError> {
        let existing = {
            let state = self.zones.read().expect("zone state lock");
            state
                .sets
                .iter()
                .position(|set| set.as_ref().is_some_and(|set| set.mask() == mask))
        };
        if let Some(index) = existing {
            return Ok(u8::try_from(index).expect("at most MEMBER_SETS_MAX sets"));
        }
        let index = self.free_set_index()?;
        {
            let mut label = self.label.lock().await;
            let zones = label
                .zones
                .as_mut()
                .expect("a zoned array's label has zones");
            if index == zones.member_sets.len() {
                zones.member_sets.push(mask);
            } else {
                zones.member_sets[index] = mask;
            }
        }
        let stripe = self.stripe_for(mask);
        {
            let mut state = self.zones.write().expect("zone state lock");
            if index == state.sets.len() {
                state.sets.push(Some(stripe));
            } else {
                state.sets[index] = Some(stripe);
            }
        }
        // The labels listing the set are durable before any table entry
        // names it.
        self.labels_out_of_date();
        self.flush_members_and_labels().await?;
        Ok(u8::try_from(index).expect("at most MEMBER_SETS_MAX sets"))
    }

    /// An index for a new set: one no zone names, or a new one.
    fn free_set_index(&self) -> Result<usize, ArrayError> {
        let state = self.zones.read().expect("zone state lock");
        let unused = (0..state.sets.len()).find(|index| !state.set_in_use(*index));
        match unused {
            Some(index) => Ok(index),
            None if state.sets.len() < MEMBER_SETS_MAX => Ok(state.sets.len()),
            None => Err(ArrayError::TooManyMemberSets {
                array: self.name.clone(),
                limit: MEMBER_SETS_MAX,
            }),
        }
    }

    /// How many zones are striped over a set that includes member `index`
    /// (what moving data out must bring to zero before `finish_removal`).
    pub fn zones_containing(&self, index: usize) -> u64 {
        let state = self.zones.read().expect("zone state lock");
        state
            .table
            .iter()
            .filter(|set| {
                state.sets[usize::from(**set)]
                    .as_ref()
                    .is_some_and(|stripe| stripe.contains(index))
            })
            .count() as u64
    }

    /// The zones (engine segments, by index within this array) whose set
    /// includes member `index`.
    pub fn zone_indexes_containing(&self, index: usize) -> Vec<u64> {
        let state = self.zones.read().expect("zone state lock");
        (0..state.table.len() as u64)
            .filter(|zone| state.stripe_of(*zone).contains(index))
            .collect()
    }

    fn require_zoned(&self, operation: &'static str) -> Result<(), ArrayError> {
        if !self.geometry.is_zoned() {
            return Err(ArrayError::NotZoned {
                array: self.name.clone(),
                operation,
            });
        }
        Ok(())
    }

    fn check_index(&self, index: usize) -> Result<(), ArrayError> {
        if index >= self.members.len() {
            return Err(ArrayError::NoSuchMember {
                array: self.name.clone(),
                index,
                slots: self.members.len(),
            });
        }
        Ok(())
    }
}

impl RedundantArray {
    /// Starts removing member `index`: it leaves the write set (zones
    /// opened from now on leave it out) and zones holding it report
    /// degraded, so the engine moves their data out. Refused when the
    /// members left would be too few for the redundancy.
    pub async fn begin_removal(&self, index: usize) -> Result<(), ArrayError> {
        self.require_zoned("removing a member")?;
        self.check_index(index)?;
        let _one_change_at_a_time = self.open_lock.lock().await;
        let state = self.members[index].state();
        if !state.is_usable() {
            return Err(self.wrong_state(index, "removing it", "a member in use"));
        }
        let remaining = members_of(self.write_set_mask() & !(1 << index)).len();
        let needed = self.geometry.redundancy.member_count_min();
        if remaining < needed {
            return Err(ArrayError::RemovalTooNarrow {
                array: self.name.clone(),
                index,
                remaining,
                redundancy: self.geometry.redundancy,
                needed,
            });
        }
        self.removing.lock().expect("removing lock")[index] = true;
        self.label
            .lock()
            .await
            .removing_members
            .push(to_label_index(index));
        self.labels_out_of_date();
        self.flush_members_and_labels().await?;
        tracing::warn!(array = %self.name, member = index, "member removal started: its zones are moved to the others");
        Ok(())
    }

    /// Undoes [`RedundantArray::begin_removal`] (the others turned out to
    /// lack the room for its data): the member joins the write set again.
    /// Zones opened meanwhile stay without it until they are opened again.
    pub async fn cancel_removal(&self, index: usize) -> Result<(), ArrayError> {
        self.check_index(index)?;
        let _one_change_at_a_time = self.open_lock.lock().await;
        if !self.removing.lock().expect("removing lock")[index] {
            return Err(self.wrong_state(
                index,
                "cancelling its removal",
                "a member being removed",
            ));
        }
        self.removing.lock().expect("removing lock")[index] = false;
        let label_index = to_label_index(index);
        self.label
            .lock()
            .await
            .removing_members
            .retain(|member| *member != label_index);
        self.labels_out_of_date();
        self.flush_members_and_labels().await?;
        tracing::warn!(array = %self.name, member = index, "member removal cancelled");
        Ok(())
    }

    fn wrong_state(
        &self,
        index: usize,
        operation: &'static str,
        needed: &'static str,
    ) -> ArrayError {
        ArrayError::WrongMemberState {
            array: self.name.clone(),
            index,
            state: self.members[index].state().name().to_owned(),
            operation,
            needed,
        }
    }

    /// Ends the removal of member `index` once no zone's set includes it:
    /// the slot becomes empty (recorded in every label) and the member's
    /// label is wiped. A lost member (faulted or missing) whose zones were
    /// all moved may be removed the same way, without `begin_removal`.
    pub async fn finish_removal(&self, index: usize) -> Result<(), ArrayError> {
        self.require_zoned("removing a member")?;
        self.check_index(index)?;
        let _one_change_at_a_time = self.open_lock.lock().await;
        let removing = self.removing.lock().expect("removing lock")[index];
        if !removing && !self.members[index].is_lost() {
            return Err(self.wrong_state(
                index,
                "finishing its removal",
                "a member being removed or lost",
            ));
        }
        let zones = self.zones_containing(index);
        if zones > 0 {
            return Err(ArrayError::MemberStillInZones {
                array: self.name.clone(),
                index,
                zones,
            });
        }
        let holders = self.usable_prefix_holders();
        if holders.contains(&index) && holders.len() <= 1 {
            return Err(ArrayError::NoMemberForPrefix {
                array: self.name.clone(),
                holders,
            });
        }
        let device = self.members[index].empty_out();
        self.removing.lock().expect("removing lock")[index] = false;
        self.prefix
            .lock()
            .expect("prefix lock")
            .holders
            .retain(|holder| *holder != index);
        {
            let label_index = to_label_index(index);
            let mut label = self.label.lock().await;
            label
                .removing_members
                .retain(|member| *member != label_index);
            label.prefix_members.retain(|member| *member != label_index);
            label
                .faulted_members
                .retain(|member| *member != label_index);
            label.member_paths[index] = String::new();
            if !label.empty_members.contains(&label_index) {
                label.empty_members.push(label_index);
            }
        }
        self.labels_out_of_date();
        self.flush_members_and_labels().await?;
        if let Some(device) = device {
            crate::replace::wipe_label(device.as_ref()).await;
        }
        tracing::warn!(array = %self.name, member = index, "member removed: its slot is empty");
        Ok(())
    }

    /// Adds `new` (a blank device) into an empty slot, the lowest one: it
    /// receives the zone table and a label, then joins the write set (zones
    /// opened from now on include it). Returns the slot's index. The slots
    /// are fixed at creation: widening the array is not supported.
    pub async fn add_member(&self, new: MemberDevice) -> Result<usize, ArrayError> {
        self.require_zoned("adding a member")?;
        let _one_change_at_a_time = self.open_lock.lock().await;
        self.check_new_device(&new).await?;
        let index = self
            .members
            .iter()
            .position(|member| member.state() == MemberState::Removed)
            .ok_or_else(|| ArrayError::NoEmptySlot {
                array: self.name.clone(),
                path: new.path.clone(),
                slots: self.members.len(),
            })?;
        self.write_whole_table(new.device.as_ref()).await?;
        {
            let label_index = to_label_index(index);
            let mut label = self.label.lock().await;
            label.generation += 1;
            label.member_paths[index] = new.path.clone();
            label.empty_members.retain(|member| *member != label_index);
            let mut own = label.clone();
            own.member_index = label_index;
            write_label(new.device.as_ref(), &own).await?;
        }
        self.members[index].fill(new.path.clone(), new.device);
        self.labels_out_of_date();
        self.flush_members_and_labels().await?;
        tracing::warn!(array = %self.name, member = index, path = %new.path, "member added into an empty slot");
        Ok(index)
    }

    /// Copies the mirrored prefix to usable members until it has as many
    /// copies as the full set's parity + 1 (or every usable member holds
    /// one), after holders were lost or removed. Each copy is written to
    /// from the copy's start (prefix writes go to it too), copied a chunk at
    /// a time under the prefix lock, flushed, and only then recorded in the
    /// labels. Returns the members that received a copy.
    pub async fn restore_prefix_redundancy(&self) -> Result<Vec<usize>, ArrayError> {
        let _one_change_at_a_time = self.open_lock.lock().await;
        let mut added = Vec::new();
        loop {
            let holders = self.usable_prefix_holders();
            if holders.len() >= self.geometry.prefix_copies() {
                return Ok(added);
            }
            let removing = self.removing.lock().expect("removing lock").clone();
            let Some(target) = (0..self.members.len()).find(|index| {
                self.members[*index].state().is_usable()
                    && !removing[*index]
                    && !holders.contains(index)
            }) else {
                return Ok(added);
            };
            self.copy_prefix_to(target).await?;
            added.push(target);
        }
    }

    /// Copies the whole prefix to member `target`, then records it as a
    /// holder (labels rewritten), dropping holders that are out of use.
    async fn copy_prefix_to(&self, target: usize) -> Result<(), ArrayError> {
        self.prefix.lock().expect("prefix lock").pending = Some(target);
        let copied = self.copy_prefix_chunks(target).await;
        let device = self.members[target].usable_device();
        let flushed = match (copied, device) {
            (Ok(()), Some(device)) => device.flush().await.map_err(ArrayError::from),
            (Ok(()), None) => Err(self.too_many_lost(0, 0).into()),
            (Err(error), _) => Err(error),
        };
        let holders = {
            let mut prefix = self.prefix.lock().expect("prefix lock");
            prefix.pending = None;
            flushed?;
            prefix
                .holders
                .retain(|holder| self.members[*holder].state().is_usable());
            prefix.holders.push(target);
            prefix.holders.clone()
        };
        self.label.lock().await.prefix_members =
            holders.iter().map(|index| to_label_index(*index)).collect();
        self.labels_out_of_date();
        self.flush_members_and_labels().await?;
        tracing::warn!(array = %self.name, member = target, holders = ?holders, "mirrored prefix copied to another member");
        Ok(())
    }

    /// The prefix, chunk by chunk, from a usable holder to `target`.
    async fn copy_prefix_chunks(&self, target: usize) -> Result<(), ArrayError> {
        let mut block = 0;
        while block < self.geometry.prefix_blocks {
            let count =
                (self.geometry.prefix_blocks - block).min(crate::replace::PREFIX_COPY_BLOCKS_MAX);
            let offset = self.geometry.prefix_member_block(block) * BLOCK_SIZE_BYTES;
            let length = to_usize(count) * crate::geometry::BLOCK_BYTES;
            let _no_prefix_write_meanwhile = self.prefix_lock.write().await;
            let source = self
                .usable_prefix_holders()
                .into_iter()
                .find_map(|member| self.members[member].usable_device())
                .ok_or_else(|| self.too_many_lost(block * BLOCK_SIZE_BYTES, length as u64))?;
            let data = source.read(offset, length).await?;
            self.write_members(std::iter::once((target, offset, Arc::new(data))))
                .await?;
            if !self.members[target].state().is_usable() {
                return Err(self
                    .too_many_lost(block * BLOCK_SIZE_BYTES, length as u64)
                    .into());
            }
            block += count;
        }
        Ok(())
    }

    /// How many zones are striped over sets with more unreadable members
    /// than their parity (their data, if the engine still needs it, is lost).
    pub fn unreadable_zone_count(&self) -> u64 {
        let state = self.zones.read().expect("zone state lock");
        state
            .table
            .iter()
            .filter(|set| {
                state.sets[usize::from(**set)]
                    .as_ref()
                    .is_some_and(|stripe| {
                        self.unreadable_in(stripe.mask()) > stripe.parity_columns()
                    })
            })
            .count() as u64
    }

    /// The member sets the label lists (bitmasks by index; 0 unused).
    pub fn member_sets(&self) -> Vec<Vec<usize>> {
        let state = self.zones.read().expect("zone state lock");
        state
            .sets
            .iter()
            .map(|set| {
                set.as_ref()
                    .map(|stripe| stripe.members().to_vec())
                    .unwrap_or_default()
            })
            .collect()
    }

    /// The members holding a valid copy of the mirrored prefix.
    pub fn prefix_holders(&self) -> Vec<usize> {
        self.prefix.lock().expect("prefix lock").holders.clone()
    }

    /// Members being removed.
    pub fn removing_members(&self) -> Vec<usize> {
        let removing = self.removing.lock().expect("removing lock");
        (0..removing.len())
            .filter(|index| removing[*index])
            .collect()
    }
}
