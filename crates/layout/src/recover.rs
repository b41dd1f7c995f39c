//! Self-healing: a block that failed the engine's checksum is rebuilt from the
//! other copies (prefix) or from parity (striped region), checked with the
//! engine's own check, and the bad copy is rewritten in place with the good
//! contents. Rewriting a data block with the contents its row's parity was
//! computed from changes no parity. With two parity columns a silently bad
//! second column is found by trying each one as lost in turn.

use std::sync::Arc;

use lamina_device::{AlignedBuffer, BlockCheck, DeviceError};

use crate::array::RedundantArray;
use crate::geometry::{BLOCK_BYTES, BLOCK_SIZE_BYTES, Column};
use crate::row_locks::RowSpan;
use crate::stripe::ZoneView;

impl RedundantArray {
    pub(crate) async fn recover(
        &self,
        block: u64,
        is_valid: BlockCheck<'_>,
    ) -> Result<Option<AlignedBuffer>, DeviceError> {
        if block < self.geometry.prefix_blocks {
            let member_block = self.geometry.prefix_member_block(block);
            return self
                .recover_copies(member_block * BLOCK_SIZE_BYTES, BLOCK_BYTES, is_valid)
                .await;
        }
        let zone = self.zone_of_block(block);
        if block >= zone.usable_end() {
            // Nothing is stored past a zone's usable blocks.
            return Ok(None);
        }
        let (row, column) = zone.locate(block);
        self.recover_striped(&zone, row, column, is_valid).await
    }

    /// The mirrored prefix at member `offset`: the first member's copy that
    /// passes `is_valid`, written over the copies that do not.
    pub(crate) async fn recover_copies(
        &self,
        offset: u64,
        length: usize,
        is_valid: BlockCheck<'_>,
    ) -> Result<Option<AlignedBuffer>, DeviceError> {
        let copies = self.read_prefix_copies(offset, length).await;
        let Some(good) = copies
            .iter()
            .find(|(_, data)| is_valid(data))
            .map(|(_, data)| data.clone())
        else {
            return Ok(None);
        };
        let bad: Vec<usize> = copies
            .iter()
            .filter(|(_, data)| !is_valid(data))
            .map(|(index, _)| *index)
            .collect();
        self.rewrite(&bad, offset, &good).await?;
        Ok(Some(good))
    }

    /// Every usable holder's copy of the mirrored prefix at member
    /// `offset`, by member index; a holder whose read fails is faulted.
    pub(crate) async fn read_prefix_copies(
        &self,
        offset: u64,
        length: usize,
    ) -> Vec<(usize, AlignedBuffer)> {
        let reads = self
            .usable_prefix_holders()
            .into_iter()
            .map(|index| async move {
                let device = self.members[index].usable_device()?;
                Some((index, device.read(offset, length).await))
            });
        let mut copies = Vec::new();
        for (index, result) in futures::future::join_all(reads).await.into_iter().flatten() {
            match result {
                Ok(data) => copies.push((index, data)),
                Err(error) => self.member_failed(index, &error),
            }
        }
        copies
    }

    async fn recover_striped(
        &self,
        zone: &ZoneView,
        row: u64,
        column: usize,
        is_valid: BlockCheck<'_>,
    ) -> Result<Option<AlignedBuffer>, DeviceError> {
        let _no_write_meanwhile = self
            .row_locks
            .exclusive(RowSpan {
                first_row: row,
                last_row: row,
            })
            .await;
        // The zone may have been reopened at another set meanwhile.
        let zone = &self.zone(zone.index);
        if zone.block_of(row, 0) >= zone.usable_end() || column >= zone.stripe.data_columns() {
            return Ok(None);
        }
        let rows = self.read_row(zone, row).await?;
        let target = zone.stripe.member_of(row, Column::Data(column));
        for erased in self.erasure_candidates(zone, &rows, target) {
            let Ok(data) = self.rebuild_row(zone, &rows, row, row, Some(&erased)) else {
                continue;
            };
            if !is_valid(&data[column]) {
                continue;
            }
            let good = AlignedBuffer::from_slice_padded(&data[column]);
            if rows[target].is_some() {
                let offset = self.geometry.member_block_of_row(row) * BLOCK_SIZE_BYTES;
                self.rewrite(&[target], offset, &good).await?;
            }
            return Ok(Some(good));
        }
        Ok(None)
    }

    /// Sets of members to treat as lost, most likely first: the target
    /// alone, then the target with each other member (while the parity
    /// allows).
    fn erasure_candidates(
        &self,
        zone: &ZoneView,
        rows: &[Option<AlignedBuffer>],
        target: usize,
    ) -> Vec<Vec<usize>> {
        let mut base = lost_in_set(zone, rows);
        if !base.contains(&target) {
            base.push(target);
        }
        if base.len() > zone.stripe.parity_columns() {
            return Vec::new();
        }
        erasures_from(zone, base)
    }
}

/// The members of `zone`'s set that `rows` has nothing from.
pub(crate) fn lost_in_set(zone: &ZoneView, rows: &[Option<AlignedBuffer>]) -> Vec<usize> {
    zone.stripe
        .members()
        .iter()
        .copied()
        .filter(|index| rows[*index].is_none())
        .collect()
}

/// `base` (members known lost), then, while the zone's parity allows one
/// more, `base` with each other member of its set: the sets a repair or a
/// rebuild tries as erased, most likely first.
pub(crate) fn erasures_from(zone: &ZoneView, base: Vec<usize>) -> Vec<Vec<usize>> {
    let mut candidates = Vec::new();
    if base.len() < zone.stripe.parity_columns() {
        for other in zone
            .stripe
            .members()
            .iter()
            .copied()
            .filter(|index| !base.contains(index))
        {
            let mut with_other = base.clone();
            with_other.push(other);
            candidates.push(with_other);
        }
    }
    candidates.insert(0, base);
    candidates
}

impl RedundantArray {
    /// Rewrites member `offset` of each of `members` with `good`, counting a
    /// repair against each.
    pub(crate) async fn rewrite(
        &self,
        members: &[usize],
        offset: u64,
        good: &AlignedBuffer,
    ) -> Result<(), DeviceError> {
        let good = Arc::new(good.clone());
        let writes = members.iter().map(|index| (*index, offset, good.clone()));
        self.write_members(writes).await?;
        for index in members {
            if self.members[*index].state().is_usable() {
                tracing::warn!(
                    array = %self.name,
                    member = index,
                    path = %self.members[*index].path(),
                    offset,
                    "block failed its checksum and was repaired from redundancy"
                );
                self.members[*index].repaired();
            }
        }
        Ok(())
    }
}
