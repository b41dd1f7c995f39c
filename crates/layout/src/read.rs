//! Reading an array: the mirrored prefix from the first usable member; the
//! striped region from the members that hold the blocks asked for, one read
//! per member. When a member is lost or a read fails, the rows asked for are
//! read whole from every usable member and the missing columns rebuilt from
//! parity (a degraded read).

use std::collections::BTreeMap;

use lamina_device::{AlignedBuffer, DeviceError};

use crate::array::RedundantArray;
use crate::geometry::{
    ArrayGeometry, BLOCK_BYTES, BLOCK_SIZE_BYTES, Column, LABEL_AREA_BLOCKS, Location,
};

/// The rows a striped read covers, and which of their blocks it asks for.
#[derive(Clone, Copy, Debug)]
struct RowRange {
    first_block: u64,
    block_count: u64,
    first_row: u64,
    last_row: u64,
}

impl RowRange {
    fn of(geometry: &ArrayGeometry, first_block: u64, length: usize) -> Self {
        let block_count = (length / BLOCK_BYTES) as u64;
        let row_of = |block: u64| (block - geometry.prefix_blocks) / geometry.row_data_blocks();
        Self {
            first_block,
            block_count,
            first_row: row_of(first_block),
            last_row: row_of(first_block + block_count - 1),
        }
    }

    /// The data columns of `row` the request asks for.
    fn wanted_columns(&self, geometry: &ArrayGeometry, row: u64) -> Vec<usize> {
        let range = self.first_block..self.first_block + self.block_count;
        (0..geometry.data_columns())
            .filter(|column| range.contains(&geometry.block_of(row, *column)))
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
        let offset = (LABEL_AREA_BLOCKS + first_block) * BLOCK_SIZE_BYTES;
        let length = to_usize(block_count) * BLOCK_BYTES;
        for index in self.geometry.prefix_members() {
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

    /// Fills `destination` from the striped region, from `first_block` on.
    async fn read_striped(
        &self,
        first_block: u64,
        destination: &mut [u8],
    ) -> Result<(), DeviceError> {
        let block_count = (destination.len() / BLOCK_BYTES) as u64;
        let spans = self.member_spans(first_block, block_count);
        let all_usable = spans
            .keys()
            .all(|member| self.members[*member].usable_device().is_some());
        if all_usable && self.read_direct(first_block, &spans, destination).await {
            return Ok(());
        }
        self.read_degraded(first_block, destination).await
    }

    /// Which rows each member holds of the blocks asked for.
    fn member_spans(&self, first_block: u64, block_count: u64) -> BTreeMap<usize, MemberSpan> {
        let mut spans: BTreeMap<usize, MemberSpan> = BTreeMap::new();
        for block in first_block..first_block + block_count {
            let Location::Striped { row, column } = self.geometry.locate(block) else {
                unreachable!("the caller passes striped blocks only");
            };
            let member = self.geometry.member_of(row, Column::Data(column));
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

    /// One read per member; false (members faulted) if any failed.
    async fn read_direct(
        &self,
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
            let Location::Striped { row, column } =
                self.geometry.locate(first_block + index as u64)
            else {
                unreachable!("striped blocks only");
            };
            let member = self.geometry.member_of(row, Column::Data(column));
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
        first_block: u64,
        destination: &mut [u8],
    ) -> Result<(), DeviceError> {
        let request = RowRange::of(&self.geometry, first_block, destination.len());
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
        let data_columns = self.geometry.data_columns();
        let mut chosen = vec![false; self.members.len()];
        for row in request.first_row..=request.last_row {
            let wanted = request.wanted_columns(&self.geometry, row);
            let mut picked: Vec<usize> = wanted
                .iter()
                .map(|column| self.geometry.member_of(row, Column::Data(*column)))
                .filter(|member| usable(*member))
                .collect();
            if picked.len() < wanted.len() {
                let others = (0..data_columns)
                    .map(Column::Data)
                    .chain((0..self.geometry.parity_columns()).map(Column::Parity))
                    .map(|column| self.geometry.member_of(row, column))
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
        let wanted = request.wanted_columns(&self.geometry, row);
        let read: Option<Vec<&[u8]>> = wanted
            .iter()
            .map(|column| {
                let member = self.geometry.member_of(row, Column::Data(*column));
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
                    .rebuild_row(rows, row, request.first_row, None)
                    .map_err(|error| self.codec_failed(request.first_block, BLOCK_BYTES, &error))?;
                wanted
                    .iter()
                    .map(|column| rebuilt[*column].as_slice())
                    .collect()
            }
        };
        for (column, block) in wanted.iter().zip(contents) {
            let at =
                to_usize(self.geometry.block_of(row, *column) - request.first_block) * BLOCK_BYTES;
            destination[at..at + BLOCK_BYTES].copy_from_slice(block);
        }
        Ok(())
    }

    /// `row` from every usable member (`None` for a member lost or failing
    /// now): what a repair tries its candidates on.
    pub(crate) async fn read_row(
        &self,
        row: u64,
    ) -> Result<Vec<Option<AlignedBuffer>>, DeviceError> {
        let request = RowRange {
            first_block: self.geometry.block_of(row, 0),
            block_count: self.geometry.row_data_blocks(),
            first_row: row,
            last_row: row,
        };
        let every_member = vec![true; self.members.len()];
        loop {
            // A member that fails is faulted, so each retry reads fewer.
            if let Some(rows) = self.read_rows_from(&request, &every_member).await? {
                return Ok(rows);
            }
        }
    }

    /// Rows `first_row..=last_row` from every usable member; `None` when
    /// one failed (it is faulted: read again).
    pub(crate) async fn read_all_rows(
        &self,
        first_row: u64,
        last_row: u64,
    ) -> Result<Option<Vec<Option<AlignedBuffer>>>, DeviceError> {
        let request = RowRange {
            first_block: self.geometry.block_of(first_row, 0),
            block_count: (last_row - first_row + 1) * self.geometry.row_data_blocks(),
            first_row,
            last_row,
        };
        self.read_rows_from(&request, &vec![true; self.members.len()])
            .await
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
        self.check_tolerance(offset, length as u64)?;
        Ok(all_read.then_some(rows))
    }

    /// The data columns of `row` from `rows` (read from `first_row` on), with
    /// the members in `erased` treated as lost too.
    pub(crate) fn rebuild_row(
        &self,
        rows: &[Option<AlignedBuffer>],
        row: u64,
        first_row: u64,
        erased: Option<&[usize]>,
    ) -> Result<Vec<Vec<u8>>, crate::codec::CodecError> {
        let start = to_usize(row - first_row) * BLOCK_BYTES;
        let data_columns = self.geometry.data_columns();
        let columns: Vec<Option<&[u8]>> = (0..self.geometry.member_count)
            .map(|position| {
                let column = if position < data_columns {
                    Column::Data(position)
                } else {
                    Column::Parity(position - data_columns)
                };
                let member = self.geometry.member_of(row, column);
                if erased.is_some_and(|erased| erased.contains(&member)) {
                    return None;
                }
                rows[member]
                    .as_ref()
                    .map(|data| &data[start..start + BLOCK_BYTES])
            })
            .collect();
        self.codec.reconstruct(&columns)
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

pub(crate) fn to_usize(value: u64) -> usize {
    usize::try_from(value).expect("a block count within a request fits in a usize")
}
