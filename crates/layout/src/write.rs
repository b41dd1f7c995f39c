//! Writing an array: the mirrored prefix to every usable member; the striped
//! region as whole rows, parity computed from the data in memory (never read
//! back, never modified later). A write that ends inside a row pads the row
//! with zeros: the writer never writes into the rest of that row (see
//! `array.rs`). A member that fails the write is faulted; the write succeeds
//! while the members lost stay within the parity.

use std::sync::Arc;

use lamina_device::{AlignedBuffer, DeviceError};

use crate::array::RedundantArray;
use crate::geometry::to_usize;
use crate::geometry::{BLOCK_BYTES, BLOCK_SIZE_BYTES, Column};
use crate::row_locks::RowSpan;
use crate::stripe::ZoneView;

impl RedundantArray {
    pub(crate) async fn write_range(
        &self,
        offset: u64,
        data: &Arc<AlignedBuffer>,
    ) -> Result<(), DeviceError> {
        let first_block = offset / BLOCK_SIZE_BYTES;
        let block_count = data.len() as u64 / BLOCK_SIZE_BYTES;
        let prefix_blocks = self
            .geometry
            .prefix_blocks
            .saturating_sub(first_block)
            .min(block_count);
        if prefix_blocks == block_count {
            return self.write_prefix(first_block, data.clone()).await;
        }
        let split = to_usize(prefix_blocks) * BLOCK_BYTES;
        if prefix_blocks > 0 {
            let prefix = Arc::new(AlignedBuffer::from_slice_padded(&data[..split]));
            self.write_prefix(first_block, prefix).await?;
        }
        self.write_striped(first_block + prefix_blocks, &data[split..])
            .await
    }

    /// Writes prefix blocks to every usable member that keeps a copy (and
    /// to one the prefix is being copied to).
    async fn write_prefix(
        &self,
        first_block: u64,
        data: Arc<AlignedBuffer>,
    ) -> Result<(), DeviceError> {
        let offset = self.geometry.prefix_member_block(first_block) * BLOCK_SIZE_BYTES;
        let _no_prefix_copy_meanwhile = self.prefix_lock.read().await;
        let writes = self
            .prefix_write_targets()
            .into_iter()
            .map(|index| (index, offset, data.clone()));
        self.write_members(writes).await?;
        if self.usable_prefix_holders().is_empty() {
            return Err(self.too_many_lost(first_block * BLOCK_SIZE_BYTES, data.len() as u64));
        }
        self.check_tolerance(first_block * BLOCK_SIZE_BYTES, data.len() as u64)
    }

    /// Writes `data` from `first_block` on, zone by zone.
    async fn write_striped(&self, first_block: u64, data: &[u8]) -> Result<(), DeviceError> {
        let mut block = first_block;
        let mut rest = data;
        while !rest.is_empty() {
            let zone = self.zone_of_block(block);
            let zone_end = zone.first_block + self.geometry.zone_address_blocks();
            let blocks_here = (zone_end - block).min((rest.len() / BLOCK_BYTES) as u64);
            let (here, after) = rest.split_at(to_usize(blocks_here) * BLOCK_BYTES);
            self.write_in_zone(&zone, block, here).await?;
            block += blocks_here;
            rest = after;
        }
        Ok(())
    }

    /// Writes whole rows of `zone` from `first_block` (a row's first block).
    async fn write_in_zone(
        &self,
        zone: &ZoneView,
        first_block: u64,
        data: &[u8],
    ) -> Result<(), DeviceError> {
        let block_count = (data.len() / BLOCK_BYTES) as u64;
        assert!(
            first_block + block_count <= zone.usable_end(),
            "a write past zone {}'s usable blocks (block {first_block}, {block_count} blocks, \
             the zone's usable blocks end at {}): the writer must follow the region's shape",
            zone.index,
            zone.usable_end()
        );
        let (first_row, column) = zone.locate(first_block);
        assert_eq!(
            column, 0,
            "a write into the striped region starts at a row boundary (block {first_block})"
        );
        let row_bytes = to_usize(zone.row_data_blocks()) * BLOCK_BYTES;
        let row_count = data.len().div_ceil(row_bytes);
        let mut member_buffers: Vec<Option<AlignedBuffer>> = (0..self.members.len())
            .map(|index| {
                zone.stripe
                    .contains(index)
                    .then(|| AlignedBuffer::zeroed(row_count * BLOCK_BYTES))
            })
            .collect();
        for (index, row_data) in data.chunks(row_bytes).enumerate() {
            let row = first_row + index as u64;
            self.lay_out_row(zone, row, row_data, index, &mut member_buffers)
                .map_err(|error| self.codec_failed(first_block, data.len(), &error))?;
        }
        let offset = self.geometry.member_block_of_row(first_row) * BLOCK_SIZE_BYTES;
        let _no_repair_meanwhile = self
            .row_locks
            .shared(RowSpan {
                first_row,
                last_row: first_row + row_count as u64 - 1,
            })
            .await;
        let writes = member_buffers
            .into_iter()
            .enumerate()
            .filter_map(|(index, buffer)| Some((index, offset, Arc::new(buffer?))));
        self.write_members(writes).await?;
        self.check_set(
            &zone.stripe,
            first_block * BLOCK_SIZE_BYTES,
            data.len() as u64,
        )
    }

    /// Puts one row's data (zero-padded to the whole row) and its parity
    /// into the members' buffers at position `index`.
    fn lay_out_row(
        &self,
        zone: &ZoneView,
        row: u64,
        row_data: &[u8],
        index: usize,
        member_buffers: &mut [Option<AlignedBuffer>],
    ) -> Result<(), crate::codec::CodecError> {
        let data_columns = zone.stripe.data_columns();
        let padded;
        let whole_row = if row_data.len() == data_columns * BLOCK_BYTES {
            row_data
        } else {
            let mut row = vec![0_u8; data_columns * BLOCK_BYTES];
            row[..row_data.len()].copy_from_slice(row_data);
            padded = row;
            &padded
        };
        let columns: Vec<&[u8]> = whole_row.chunks_exact(BLOCK_BYTES).collect();
        let parity = zone.stripe.codec().encode(&columns)?;
        let at = index * BLOCK_BYTES..(index + 1) * BLOCK_BYTES;
        let data = columns
            .iter()
            .enumerate()
            .map(|(column, contents)| (Column::Data(column), *contents));
        let parity = parity
            .iter()
            .enumerate()
            .map(|(column, contents)| (Column::Parity(column), contents.as_slice()));
        for (column, contents) in data.chain(parity) {
            let member = zone.stripe.member_of(row, column);
            let buffer = member_buffers[member]
                .as_mut()
                .expect("a buffer for every member of the set");
            buffer[at.clone()].copy_from_slice(contents);
        }
        Ok(())
    }

    /// Issues member writes at once to every usable member named; a failure
    /// faults its member. Errors only when no member is left to write.
    pub(crate) async fn write_members(
        &self,
        writes: impl Iterator<Item = (usize, u64, Arc<AlignedBuffer>)>,
    ) -> Result<(), DeviceError> {
        // Each member's targets in one snapshot (see `Member::write_targets`).
        let writes: Vec<MemberWrite> = writes
            .map(|(index, offset, buffer)| MemberWrite {
                index,
                offset,
                buffer,
                targets: self.members[index].write_targets(),
            })
            .collect();
        let replacements = writes.iter().filter_map(|write| {
            let replacement = write.targets.replacement.clone()?;
            let buffer = write.buffer.clone();
            Some(async move {
                let result = replacement.device.write(write.offset, buffer.clone()).await;
                (write.index, replacement, buffer.len(), result)
            })
        });
        let writes = writes.iter().filter_map(|write| {
            let device = write.targets.device.clone()?;
            let buffer = write.buffer.clone();
            Some(async move {
                let length = buffer.len();
                (
                    write.index,
                    length,
                    device.write(write.offset, buffer).await,
                )
            })
        });
        let (results, replacement_results) = futures::future::join(
            futures::future::join_all(writes),
            futures::future::join_all(replacements),
        )
        .await;
        for (index, replacement, length, result) in replacement_results {
            match result {
                Ok(()) => {
                    replacement
                        .bytes_written
                        .fetch_add(length as u64, std::sync::atomic::Ordering::Relaxed);
                }
                Err(error) => self.replacement_failed(index, &error),
            }
        }
        for (index, length, result) in results {
            match result {
                Ok(()) => self.members[index].counted_write(length),
                Err(error) if matches!(error.kind, lamina_device::DeviceErrorKind::NoSpace(_)) => {
                    // The store under a member is full: not a failed device,
                    // and the engine waits for space (a sparse file filling).
                    return Err(error);
                }
                Err(error) => self.member_failed(index, &error),
            }
        }
        Ok(())
    }
}

/// One member's part of [`RedundantArray::write_members`].
struct MemberWrite {
    index: usize,
    offset: u64,
    buffer: Arc<AlignedBuffer>,
    targets: crate::member::WriteTargets,
}
