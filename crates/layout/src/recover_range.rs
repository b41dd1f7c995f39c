//! Self-healing of a range the engine can judge only as a whole: a
//! compressed fragment continues from one block into the next (issue 44,
//! decision 0070), and its checksum covers both. Recovering one block at a
//! time judges each candidate with the other block as read, so two bad
//! columns under one fragment (which raid6 covers) would never pass. Here
//! every row the range touches is rebuilt with each set of members treated
//! as erased that its parity allows (the lost members in every set), and
//! the combinations of the rows' candidates are tried until the whole range
//! passes; the data blocks that differ from what was read are rewritten,
//! or nothing is ([`Rewrite::Nothing`], `BlockDevice::reconstruct_range`)
//! for a caller whose check covers only part of the range. The rows are
//! independent codewords, so a fragment across a row boundary is judged on
//! the product of both rows' candidates.

use std::ops::Range;

use lamina_device::{AlignedBuffer, BlockCheck, DeviceError};

use crate::array::RedundantArray;
use crate::geometry::{BLOCK_BYTES, BLOCK_SIZE_BYTES, Column};
use crate::recover::lost_in_set;
use crate::row_locks::RowSpan;
use crate::scrub::erasure_sets;
use crate::stripe::ZoneView;

/// Blocks of one range judged as a whole at most: a fragment touches two.
pub const RECOVER_RANGE_BLOCKS_MAX: u64 = 2;

/// What a recovery writes back once a rebuild passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rewrite {
    /// The blocks that differ from what their members returned.
    Differing,
    /// Nothing: the caller only serves what it checked.
    Nothing,
}

/// The blocks of the range in one row: the row and their data columns.
struct RowPart {
    row: u64,
    columns: Vec<usize>,
}

/// One way to rebuild a row part: the contents of its columns.
type Candidate = Vec<Vec<u8>>;

impl RedundantArray {
    /// `BlockDevice::recover_range` over `blocks` of the striped region:
    /// the blocks that differ from what their members returned are
    /// rewritten.
    pub(crate) async fn recover_striped_range(
        &self,
        blocks: Range<u64>,
        is_valid: BlockCheck<'_>,
    ) -> Result<Option<AlignedBuffer>, DeviceError> {
        self.rebuild_striped_range(blocks, is_valid, Rewrite::Differing)
            .await
    }

    /// `BlockDevice::reconstruct_range` over the striped region: nothing is
    /// rewritten.
    pub(crate) async fn reconstruct_striped_range(
        &self,
        blocks: Range<u64>,
        is_valid: BlockCheck<'_>,
    ) -> Result<Option<AlignedBuffer>, DeviceError> {
        self.rebuild_striped_range(blocks, is_valid, Rewrite::Nothing)
            .await
    }

    /// See the module documentation. `None` when the range is not in one
    /// zone's usable blocks, is longer than [`RECOVER_RANGE_BLOCKS_MAX`], or
    /// no combination passes.
    async fn rebuild_striped_range(
        &self,
        blocks: Range<u64>,
        is_valid: BlockCheck<'_>,
        rewrite: Rewrite,
    ) -> Result<Option<AlignedBuffer>, DeviceError> {
        let Range {
            start: first_block,
            end: end_block,
        } = blocks;
        if first_block == end_block || end_block - first_block > RECOVER_RANGE_BLOCKS_MAX {
            return Ok(None);
        }
        let zone = self.zone_of_block(first_block);
        if end_block > zone.usable_end() {
            return Ok(None);
        }
        let parts = row_parts(&zone, first_block, end_block);
        let span = RowSpan {
            first_row: parts[0].row,
            last_row: parts[parts.len() - 1].row,
        };
        let _no_write_meanwhile = self.row_locks.exclusive(span).await;
        // The zone may have been reopened at another set meanwhile.
        let zone = self.zone(zone.index);
        if end_block > zone.usable_end() {
            return Ok(None);
        }
        let mut rows_read = Vec::with_capacity(parts.len());
        for part in &parts {
            rows_read.push(self.read_row(&zone, part.row).await?);
        }
        let candidates: Vec<Vec<Candidate>> = parts
            .iter()
            .zip(&rows_read)
            .map(|(part, rows)| self.row_candidates(&zone, rows, part))
            .collect();
        let Some(chosen) = first_passing(&candidates, is_valid) else {
            return Ok(None);
        };
        if rewrite == Rewrite::Differing {
            for ((part, rows), contents) in parts.iter().zip(&rows_read).zip(&chosen) {
                self.rewrite_differing(&zone, rows, part, contents).await?;
            }
        }
        let joined: Vec<u8> = chosen.into_iter().flatten().flatten().collect();
        Ok(Some(AlignedBuffer::from_slice_padded(&joined)))
    }

    /// Every distinct way to rebuild `part`'s columns from `rows`: the row
    /// as read first, then with each set of members its parity allows
    /// treated as erased.
    fn row_candidates(
        &self,
        zone: &ZoneView,
        rows: &[Option<AlignedBuffer>],
        part: &RowPart,
    ) -> Vec<Candidate> {
        let lost = lost_in_set(zone, rows);
        let parity = zone.stripe.parity_columns();
        let mut candidates: Vec<Candidate> = Vec::new();
        for size in lost.len()..=parity {
            for erased in erasure_sets(zone, &lost, size) {
                let erased = (!erased.is_empty()).then_some(&erased[..]);
                let Ok(data) = self.rebuild_row(zone, rows, part.row, part.row, erased) else {
                    continue;
                };
                let candidate: Candidate = part
                    .columns
                    .iter()
                    .map(|column| data[*column].clone())
                    .collect();
                if !candidates.contains(&candidate) {
                    candidates.push(candidate);
                }
            }
        }
        candidates
    }

    /// Rewrites each block of `part` whose chosen contents differ from what
    /// its member returned (a member that returned nothing is lost: left),
    /// as a single block's recovery does.
    async fn rewrite_differing(
        &self,
        zone: &ZoneView,
        rows: &[Option<AlignedBuffer>],
        part: &RowPart,
        contents: &Candidate,
    ) -> Result<(), DeviceError> {
        let offset = self.geometry.member_block_of_row(part.row) * BLOCK_SIZE_BYTES;
        for (column, good) in part.columns.iter().zip(contents) {
            let member = zone.stripe.member_of(part.row, Column::Data(*column));
            let Some(read) = &rows[member] else {
                continue;
            };
            if read[..BLOCK_BYTES] != good[..] {
                let good = AlignedBuffer::from_slice_padded(good);
                self.rewrite(&[member], offset, &good).await?;
            }
        }
        Ok(())
    }
}

/// The blocks `first_block..end_block` of `zone` grouped by row.
fn row_parts(zone: &ZoneView, first_block: u64, end_block: u64) -> Vec<RowPart> {
    let mut parts: Vec<RowPart> = Vec::new();
    for block in first_block..end_block {
        let (row, column) = zone.locate(block);
        match parts.last_mut() {
            Some(part) if part.row == row => part.columns.push(column),
            _ => parts.push(RowPart {
                row,
                columns: vec![column],
            }),
        }
    }
    parts
}

/// The first combination of one candidate per row whose joined contents
/// pass `is_valid`.
fn first_passing(
    candidates: &[Vec<Candidate>],
    is_valid: BlockCheck<'_>,
) -> Option<Vec<Candidate>> {
    let mut indexes = vec![0_usize; candidates.len()];
    if candidates.iter().any(Vec::is_empty) {
        return None;
    }
    loop {
        let chosen: Vec<Candidate> = indexes
            .iter()
            .zip(candidates)
            .map(|(index, row)| row[*index].clone())
            .collect();
        let joined: Vec<u8> = chosen.iter().flatten().flatten().copied().collect();
        if is_valid(&joined) {
            return Some(chosen);
        }
        // The next combination, the last row's candidate turning fastest.
        let mut position = candidates.len();
        loop {
            if position == 0 {
                return None;
            }
            position -= 1;
            indexes[position] += 1;
            if indexes[position] < candidates[position].len() {
                break;
            }
            indexes[position] = 0;
        }
    }
}
