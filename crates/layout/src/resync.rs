//! Resync after a crash: a row write torn by a power cut may have reached
//! some members and not others, leaving parity that disagrees with the data.
//! Recovery asks for the rows of the log's unflushed tail to be resynced:
//! parity is recomputed from the data columns as they are stored now and
//! rewritten where it differs, so that a member lost later is rebuilt right.
//! (md calls this a resync after an unclean shutdown; the tail is a few
//! batches, so it costs a few row reads at open.) Rows whose data columns
//! are not all readable are left as they are: their lost columns can only
//! come from that parity.

use std::sync::Arc;

use lamina_device::{AlignedBuffer, DeviceError};

use crate::array::RedundantArray;
use crate::geometry::{BLOCK_BYTES, BLOCK_SIZE_BYTES, Column, Location};

impl RedundantArray {
    pub(crate) async fn resync_range(&self, offset: u64, length: u64) -> Result<(), DeviceError> {
        let first_block = (offset / BLOCK_SIZE_BYTES).max(self.geometry.prefix_blocks);
        let end_block = (offset + length).div_ceil(BLOCK_SIZE_BYTES);
        if first_block >= end_block {
            return Ok(());
        }
        let row_of = |block: u64| match self.geometry.locate(block) {
            Location::Striped { row, .. } => row,
            Location::Prefix { .. } => unreachable!("prefix blocks are skipped above"),
        };
        let (first_row, last_row) = (row_of(first_block), row_of(end_block - 1));
        let _no_write_meanwhile = self.repair_lock.write().await;
        let rows = self.read_rows(first_row, last_row - first_row + 1).await?;
        for row in first_row..=last_row {
            self.resync_row(&rows, row, first_row).await?;
        }
        Ok(())
    }

    async fn resync_row(
        &self,
        rows: &[Option<AlignedBuffer>],
        row: u64,
        first_row: u64,
    ) -> Result<(), DeviceError> {
        let start = crate::read::to_usize(row - first_row) * BLOCK_BYTES;
        let column_of = |column: Column| {
            rows[self.geometry.member_of(row, column)]
                .as_ref()
                .map(|data| &data[start..start + BLOCK_BYTES])
        };
        let data: Option<Vec<&[u8]>> = (0..self.geometry.data_columns())
            .map(|index| column_of(Column::Data(index)))
            .collect();
        let Some(data) = data else {
            return Ok(());
        };
        let parity = self.codec.encode(&data).map_err(|error| {
            self.codec_failed(self.geometry.block_of(row, 0), BLOCK_BYTES, &error)
        })?;
        let offset = self.geometry.member_block_of_row(row) * BLOCK_SIZE_BYTES;
        let stale: Vec<(usize, u64, Arc<AlignedBuffer>)> = parity
            .iter()
            .enumerate()
            .filter_map(|(index, computed)| {
                let member = self.geometry.member_of(row, Column::Parity(index));
                let stored = column_of(Column::Parity(index))?;
                (stored != computed.as_slice()).then(|| {
                    (
                        member,
                        offset,
                        Arc::new(AlignedBuffer::from_slice_padded(computed)),
                    )
                })
            })
            .collect();
        if !stale.is_empty() {
            tracing::warn!(array = %self.name, row, columns = stale.len(), "parity resynced after a crash");
            self.write_members(stale.into_iter()).await?;
        }
        Ok(())
    }
}
