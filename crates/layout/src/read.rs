//! Reading an array: the mirrored prefix from the first usable member
//! holding it; the striped region zone by zone, from the members of the
//! zone's set that hold the blocks asked for, one read per member. When a
//! member is lost or a read fails, the rows asked for are read whole from
//! usable members of the set and the missing columns rebuilt from parity (a
//! degraded read). Blocks of a zone past its usable ones read as zeros.

use std::collections::BTreeMap;

use lamina_device::{AlignedBuffer, DeviceError};

use crate::array::RedundantArray;
use crate::geometry::{BLOCK_BYTES, BLOCK_SIZE_BYTES, Column, to_usize};
use crate::stripe::ZoneView;

/// The rows of one zone a striped read covers, and which of their blocks
/// it asks for.
#[derive(Clone, Debug)]
pub(crate) struct RowRange {
    pub zone: ZoneView,
    pub first_block: u64,
    pub block_count: u64,
    pub first_row: u64,
    pub last_row: u64,
}

impl RowRange {
    fn of(zone: &ZoneView, first_block: u64, length: usize) -> Self {
        let block_count = (length / BLOCK_BYTES) as u64;
        Self {
            zone: zone.clone(),
            first_block,
            block_count,
            first_row: zone.locate(first_block).0,
            last_row: zone.locate(first_block + block_count - 1).0,
        }
    }

    /// Whole rows `first_row..=last_row` of `zone`.
    pub fn rows(zone: &ZoneView, first_row: u64, last_row: u64) -> Self {
        Self {
            zone: zone.clone(),
            first_block: zone.block_of(first_row, 0),
            block_count: (last_row - first_row + 1) * zone.row_data_blocks(),
            first_row,
            last_row,
        }
    }

    /// The data columns of `row` the request asks for.
    fn wanted_columns(&self, row: u64) -> Vec<usize> {
        let range = self.first_block..self.first_block + self.block_count;
        (0..self.zone.stripe.data_columns())
            .filter(|column| range.contains(&self.zone.block_of(row, *column)))
            .collect()
    }
}

/// The member blocks one member must read for a request (inclusive rows).
#[derive(Clone, Copy, Debug)]
struct MemberSpan {
    first_row: u64,
    last_row: u64,
}

impl RedundantArray {
    pub(crate) async fn read_range(
        &self,
        offset: u64,
        length: usize,
    ) -> Result<AlignedBuffer, DeviceError> {
        let first_block = offset / BLOCK_SIZE_BYTES;
        let block_count = length as u64 / BLOCK_SIZE_BYTES;
        let prefix_end = self.geometry.prefix_blocks;
        let mut buffer = AlignedBuffer::zeroed(length);
        let prefix_blocks = prefix_end.saturating_sub(first_block).min(block_count);
        if prefix_blocks > 0 {
            let data = self.read_prefix(first_block, prefix_blocks).await?;
            buffer[..data.len()].copy_from_slice(&data);
        }
        if prefix_blocks < block_count {
            let start = to_usize(prefix_blocks) * BLOCK_BYTES;
            self.read_striped(first_block + prefix_blocks, &mut buffer[start..])
                .await?;
        }
        Ok(buffer)
    }

    /// `block_count` blocks of the mirrored prefix, from the first member
    /// that serves them.
    async fn read_prefix(
        &self,
        first_block: u64,
        block_count: u64,
    ) -> Result<AlignedBuffer, DeviceError> {
        let offset = self.geometry.prefix_member_block(first_block) * BLOCK_SIZE_BYTES;
        let length = to_usize(block_count) * BLOCK_BYTES;
        for index in self.usable_prefix_holders() {
            let member = &self.members[index];
            let Some(device) = member.usable_device() else {
                continue;
            };
            match device.read(offset, length).await {
                Ok(data) => {
                    member.counted_read(length);
                    return Ok(data);
                }
                Err(error) => self.member_failed(index, &error),
            }
        }
        Err(self.too_many_lost(first_block * BLOCK_SIZE_BYTES, length as u64))
    }

    /// Fills `destination` from the striped region, from `first_block` on,
    /// zone by zone.
    async fn read_striped(
        &self,
        first_block: u64,
        destination: &mut [u8],
    ) -> Result<(), DeviceError> {
        let mut block = first_block;
        let mut rest = destination;
        while !rest.is_empty() {
            let zone = self.zone_of_block(block);
            let zone_end = zone.first_block + self.geometry.zone_address_blocks();
            let blocks_here = (zone_end - block).min((rest.len() / BLOCK_BYTES) as u64);
            let (here, after) = rest.split_at_mut(to_usize(blocks_here) * BLOCK_BYTES);
            // Past the zone's usable blocks nothing is stored: zeros.
            let usable = zone.usable_end().saturating_sub(block).min(blocks_here);
            let (stored, unstored) = here.split_at_mut(to_usize(usable) * BLOCK_BYTES);
            unstored.fill(0);
            if !stored.is_empty() {
                self.read_in_zone(&zone, block, stored).await?;
            }
            block += blocks_here;
            rest = after;
        }
        Ok(())
    }

    /// Fills `destination` from usable blocks of `zone` from `first_block`.
    async fn read_in_zone(
        &self,
        zone: &ZoneView,
        first_block: u64,
        destination: &mut [u8],
    ) -> Result<(), DeviceError> {
        let block_count = (destination.len() / BLOCK_BYTES) as u64;
        let spans = member_spans(zone, first_block, block_count);
        let all_usable = spans
            .keys()
            .all(|member| self.members[*member].usable_device().is_some());
        if all_usable
            && self
                .read_direct(zone, first_block, &spans, destination)
                .await
        {
            return Ok(());
        }
        self.read_degraded(zone, first_block, destination).await
    }

    /// One read per member; false (members faulted) if any failed.
    async fn read_direct(
        &self,
        zone: &ZoneView,
        first_block: u64,
        spans: &BTreeMap<usize, MemberSpan>,
        destination: &mut [u8],
    ) -> bool {
        let reads = spans.iter().map(|(member, span)| async move {
            let device = self.members[*member]
                .usable_device()
                .expect("checked usable by the caller");
            let rows = to_usize(span.last_row - span.first_row + 1);
            let offset = self.geometry.member_block_of_row(span.first_row) * BLOCK_SIZE_BYTES;
            (*member, device.read(offset, rows * BLOCK_BYTES).await)
        });
        let mut results = BTreeMap::new();
        let mut all_read = true;
        for (member, result) in futures::future::join_all(reads).await {
            match result {
                Ok(data) => {
                    self.members[member].counted_read(data.len());
                    results.insert(member, data);
                }
                Err(error) => {
                    self.member_failed(member, &error);
                    all_read = false;
                }
            }
        }
        if !all_read {
            return false;
        }
        for (index, target) in destination.chunks_exact_mut(BLOCK_BYTES).enumerate() {
            let (row, column) = zone.locate(first_block + index as u64);
            let member = zone.stripe.member_of(row, Column::Data(column));
            let start = to_usize(row - spans[&member].first_row) * BLOCK_BYTES;
            target.copy_from_slice(&results[&member][start..start + BLOCK_BYTES]);
        }
        true
    }

    /// Reads the rows of the request from the members it needs and rebuilds
    /// the columns of lost members: in each row, the blocks asked for, and
    /// where one of them is lost, as many other members as the row has data
    /// columns (not every survivor: on 4+2 with one lost, four reads, not
    /// five). A member failing meanwhile is faulted and the choice made again.
    async fn read_degraded(
        &self,
        zone: &ZoneView,
        first_block: u64,
        destination: &mut [u8],
    ) -> Result<(), DeviceError> {
        let request = RowRange::of(zone, first_block, destination.len());
        for _ in 0..=self.members.len() {
            let chosen = self.members_for(&request);
            let Some(rows) = self.read_rows_from(&request, &chosen).await? else {
                continue;
            };
            for row in request.first_row..=request.last_row {
                self.copy_row(&request, &rows, row, destination)?;
            }
            return Ok(());
        }
        Err(self.too_many_lost(first_block * BLOCK_SIZE_BYTES, destination.len() as u64))
    }

    /// The members a degraded read of `request` reads (see `read_degraded`).
    fn members_for(&self, request: &RowRange) -> Vec<bool> {
        let usable = |member: usize| self.members[member].usable_device().is_some();
        let stripe = &request.zone.stripe;
        let data_columns = stripe.data_columns();
        let mut chosen = vec![false; self.members.len()];
        for row in request.first_row..=request.last_row {
            let wanted = request.wanted_columns(row);
            let mut picked: Vec<usize> = wanted
                .iter()
                .map(|column| stripe.member_of(row, Column::Data(*column)))
                .filter(|member| usable(*member))
                .collect();
            if picked.len() < wanted.len() {
                let others = stripe
                    .codec_order(row)
                    .filter(|member| usable(*member) && !picked.contains(member))
                    .collect::<Vec<_>>();
                for member in others {
                    if picked.len() >= data_columns {
                        break;
                    }
                    picked.push(member);
                }
            }
            for member in picked {
                chosen[member] = true;
            }
        }
        chosen
    }

    /// Copies the blocks of `row` that `request` asks for into `destination`:
    /// as read when all of them were read, otherwise rebuilt.
    fn copy_row(
        &self,
        request: &RowRange,
        rows: &[Option<AlignedBuffer>],
        row: u64,
        destination: &mut [u8],
    ) -> Result<(), DeviceError> {
        let start = to_usize(row - request.first_row) * BLOCK_BYTES;
        let wanted = request.wanted_columns(row);
        let stripe = &request.zone.stripe;
        let read: Option<Vec<&[u8]>> = wanted
            .iter()
            .map(|column| {
                let member = stripe.member_of(row, Column::Data(*column));
                rows[member]
                    .as_ref()
                    .map(|data| &data[start..start + BLOCK_BYTES])
            })
            .collect();
        let rebuilt;
        let contents: Vec<&[u8]> = match read {
            Some(read) => read,
            None => {
                rebuilt = self
                    .rebuild_row(&request.zone, rows, row, request.first_row, None)
                    .map_err(|error| self.codec_failed(request.first_block, BLOCK_BYTES, &error))?;
                wanted
                    .iter()
                    .map(|column| rebuilt[*column].as_slice())
                    .collect()
            }
        };
        for (column, block) in wanted.iter().zip(contents) {
            let at =
                to_usize(request.zone.block_of(row, *column) - request.first_block) * BLOCK_BYTES;
            destination[at..at + BLOCK_BYTES].copy_from_slice(block);
        }
        Ok(())
    }

    /// `row` from every usable member of its set (`None` for a member lost
    /// or failing now, or outside the set): what a repair tries its
    /// candidates on.
    pub(crate) async fn read_row(
        &self,
        zone: &ZoneView,
        row: u64,
    ) -> Result<Vec<Option<AlignedBuffer>>, DeviceError> {
        let request = RowRange::rows(zone, row, row);
        let every_member = self.set_members(zone);
        loop {
            // A member that fails is faulted, so each retry reads fewer.
            if let Some(rows) = self.read_rows_from(&request, &every_member).await? {
                return Ok(rows);
            }
        }
    }

    /// Rows `first_row..=last_row` of `zone` from every usable member of
    /// its set; `None` when one failed (it is faulted: read again).
    pub(crate) async fn read_all_rows(
        &self,
        zone: &ZoneView,
        first_row: u64,
        last_row: u64,
    ) -> Result<Option<Vec<Option<AlignedBuffer>>>, DeviceError> {
        let request = RowRange::rows(zone, first_row, last_row);
        self.read_rows_from(&request, &self.set_members(zone)).await
    }

    /// Which members, by index, are in `zone`'s set.
    fn set_members(&self, zone: &ZoneView) -> Vec<bool> {
        (0..self.members.len())
            .map(|index| zone.stripe.contains(index))
            .collect()
    }

    /// The rows of `request` from the `chosen` members; `None` when one of
    /// them failed (it is faulted: choose again).
    async fn read_rows_from(
        &self,
        request: &RowRange,
        chosen: &[bool],
    ) -> Result<Option<Vec<Option<AlignedBuffer>>>, DeviceError> {
        let row_count = request.last_row - request.first_row + 1;
        let offset = self.geometry.member_block_of_row(request.first_row) * BLOCK_SIZE_BYTES;
        let length = to_usize(row_count) * BLOCK_BYTES;
        let reads = self
            .members
            .iter()
            .enumerate()
            .map(|(index, member)| async move {
                let device = member.usable_device().filter(|_| chosen[index])?;
                Some((index, device.read(offset, length).await))
            });
        let mut rows: Vec<Option<AlignedBuffer>> = vec![None; self.members.len()];
        let mut all_read = true;
        for (index, result) in futures::future::join_all(reads).await.into_iter().flatten() {
            match result {
                Ok(data) => {
                    self.members[index].counted_read(length);
                    rows[index] = Some(data);
                }
                Err(error) => {
                    self.member_failed(index, &error);
                    all_read = false;
                }
            }
        }
        self.check_set(&request.zone.stripe, offset, length as u64)?;
        Ok(all_read.then_some(rows))
    }

    /// The data columns of `row` from `rows` (read from `first_row` on), with
    /// the members in `erased` treated as lost too.
    pub(crate) fn rebuild_row(
        &self,
        zone: &ZoneView,
        rows: &[Option<AlignedBuffer>],
        row: u64,
        first_row: u64,
        erased: Option<&[usize]>,
    ) -> Result<Vec<Vec<u8>>, crate::codec::CodecError> {
        let start = to_usize(row - first_row) * BLOCK_BYTES;
        let columns: Vec<Option<&[u8]>> = zone
            .stripe
            .codec_order(row)
            .map(|member| {
                if erased.is_some_and(|erased| erased.contains(&member)) {
                    return None;
                }
                rows[member]
                    .as_ref()
                    .map(|data| &data[start..start + BLOCK_BYTES])
            })
            .collect();
        zone.stripe.codec().reconstruct(&columns)
    }

    pub(crate) fn codec_failed(
        &self,
        first_block: u64,
        length: usize,
        error: &crate::codec::CodecError,
    ) -> DeviceError {
        DeviceError::new(
            lamina_device::DeviceErrorKind::Io(std::io::Error::other(error.to_string())),
            &self.name,
            first_block * BLOCK_SIZE_BYTES,
            length as u64,
        )
    }
}

/// Which rows each member holds of the blocks asked for.
fn member_spans(
    zone: &ZoneView,
    first_block: u64,
    block_count: u64,
) -> BTreeMap<usize, MemberSpan> {
    let mut spans: BTreeMap<usize, MemberSpan> = BTreeMap::new();
    for block in first_block..first_block + block_count {
        let (row, column) = zone.locate(block);
        let member = zone.stripe.member_of(row, Column::Data(column));
        spans
            .entry(member)
            .and_modify(|span| span.last_row = row)
            .or_insert(MemberSpan {
                first_row: row,
                last_row: row,
            });
    }
    spans
}
