//! Scrub of an array: every column of every row that holds a block the
//! engine keeps is checked, not only the data the engine reads. A row is
//! whole when its columns form one codeword (data and parity agree, or the
//! copies are equal) and every held data block passes the engine's check;
//! otherwise the fewest columns that make it whole are rebuilt from the
//! others and rewritten, data, parity and columns the engine no longer
//! holds alike, so that losing as many more members as the parity covers
//! later reconstructs every held block exactly (a column of garbage parity
//! is harmless until the day it is needed, which is why reads alone never
//! find it).
//!
//! Which columns to rebuild: the sets of members treated as erased are
//! tried smallest first (members lost now are in every set). A set passes
//! when a codeword agrees with every column read outside it and every held
//! block in it passes its check. With `p` parity columns of which `l` are
//! lost now, a passing set that adds `e` columns to the lost ones is the
//! only one of its size when `2·e ≤ p − l` (two codewords that agree on
//! the columns left differ in at least `p − l + 1` of them), so a whole
//! raid6 row locates one bad column, and a mirror of three copies outvotes
//! one bad copy, by the code alone.
//! Past that the checks decide: two passing sets that disagree on a held
//! block are a row the checks cannot tell, reported unrepairable and left
//! as it is rather than guessed; where they disagree only on columns the
//! engine does not hold (dead blocks, parity), either makes the row whole
//! for every held block, and the first is taken.
//!
//! A member whose columns fail in nearly every row is not repaired block by
//! block: once [`SCRUB_FAULT_WINDOW_ROWS`] rows scrubbed in a row had more
//! than [`SCRUB_FAULT_FAILED_PERCENT`] % of its columns bad, it is faulted,
//! so that its data is rebuilt from the others (onto spare space or a
//! replacement) instead of rewritten a block at a time onto a device that
//! no longer holds what was written to it (a wiped, swapped or failing
//! disk: rot of scattered blocks stays far below that share). Only while
//! the array keeps a column of redundancy without it: with no more to
//! spare, the member is repaired like any other.

use std::sync::Arc;

use lamina_device::{AlignedBuffer, DeviceError, ScrubBlocks, ScrubReport};

use crate::array::RedundantArray;
use crate::geometry::{BLOCK_BYTES, BLOCK_SIZE_BYTES, to_usize};
use crate::row_locks::RowSpan;
use crate::stripe::ZoneView;

/// Rows checked under one exclusive hold of their row locks (client writes
/// of those rows wait meanwhile, others go on): 64 rows of a 4+2 array are
/// 1 MiB of data, read in one request per member and rewritten in at most
/// one per member.
pub const SCRUB_ROWS_PER_STEP: u64 = 64;
/// Rows of a member's columns a scrub looks at before it judges the member
/// mostly bad: 4096 rows of a 4+2 array are 64 MiB of data, far more than a
/// burst of rot spans.
pub const SCRUB_FAULT_WINDOW_ROWS: u64 = 4096;
/// Share of a member's columns, in percent, that must be bad within one
/// window for the scrub to fault it rather than repair it.
pub const SCRUB_FAULT_FAILED_PERCENT: u64 = 90;

const _: () = assert!(SCRUB_FAULT_WINDOW_ROWS.is_multiple_of(SCRUB_ROWS_PER_STEP));
const _: () = assert!(SCRUB_FAULT_FAILED_PERCENT > 50 && SCRUB_FAULT_FAILED_PERCENT <= 100);

/// One row of a step, as read and as it must be.
struct RowFinding {
    /// The codeword the row is made into (data columns, then parity, in
    /// the codec's order); `None` when the row is whole as read or cannot
    /// be made whole.
    repaired: Option<Vec<Vec<u8>>>,
    unrepairable: bool,
}

/// Where a row of a step is, for the per-row helpers.
#[derive(Clone, Copy)]
struct RowPlace<'a> {
    zone: &'a ZoneView,
    row: u64,
    first_row: u64,
}

impl RedundantArray {
    /// See [`lamina_device::BlockDevice::scrub_range`]. The mirrored prefix
    /// is left to [`RedundantArray::scrub_prefix_copies`]: its frames are
    /// checked by the engine one frame at a time.
    pub(crate) async fn scrub_striped(
        &self,
        offset: u64,
        length: u64,
        blocks: &dyn ScrubBlocks,
    ) -> Result<ScrubReport, DeviceError> {
        let end = (offset + length) / BLOCK_SIZE_BYTES;
        let mut block = (offset / BLOCK_SIZE_BYTES).max(self.geometry.prefix_blocks);
        let mut report = ScrubReport::default();
        while block < end {
            let zone = self.zone_of_block(block);
            let piece_end = end.min(zone.first_block + self.geometry.zone_address_blocks());
            let usable_end = piece_end.min(zone.usable_end());
            if block < usable_end {
                let first_row = zone.locate(block).0;
                let last_row = zone.locate(usable_end - 1).0;
                let mut row = first_row;
                while row <= last_row {
                    let step_last = last_row.min(row + SCRUB_ROWS_PER_STEP - 1);
                    let span = RowSpan {
                        first_row: row,
                        last_row: step_last,
                    };
                    report.add(self.scrub_step(zone.index, span, blocks).await?);
                    row = step_last + 1;
                }
            }
            block = piece_end;
        }
        Ok(report)
    }

    /// Checks and repairs `span`'s rows of zone `zone_index` under their
    /// exclusive row locks.
    async fn scrub_step(
        &self,
        zone_index: u64,
        span: RowSpan,
        blocks: &dyn ScrubBlocks,
    ) -> Result<ScrubReport, DeviceError> {
        let _no_write_meanwhile = self.row_locks.exclusive(span).await;
        // Read under the lock: the zone may have been reopened meanwhile.
        let zone = self.zone(zone_index);
        let held_rows: Vec<HeldRow> = (span.first_row..=span.last_row)
            .map(|row| HeldRow {
                row,
                held_columns: held_data_columns(&zone, row, blocks),
            })
            .filter(|held| held.held_columns > 0)
            .collect();
        let mut report = ScrubReport::default();
        let (Some(first_held), Some(last_held)) = (
            held_rows.first().map(|held| held.row),
            held_rows.last().map(|held| held.row),
        ) else {
            return Ok(report);
        };
        let rows = loop {
            if let Some(rows) = self.read_all_rows(&zone, first_held, last_held).await? {
                break rows;
            }
        };
        let mut rewrites = MemberRewrites::new(self.members.len());
        for held in held_rows {
            let place = RowPlace {
                zone: &zone,
                row: held.row,
                first_row: first_held,
            };
            let finding = self.scrub_row(&rows, place, blocks);
            report.rows_checked += 1;
            report.blocks_checked += held.held_columns as u64;
            if finding.unrepairable {
                self.report_unrepairable(&rows, place, blocks, &mut report);
            }
            if let Some(codeword) = finding.repaired {
                self.note_rewrites(&rows, place, &codeword, blocks, &mut rewrites, &mut report);
            }
        }
        report.members_faulted =
            self.fault_mostly_bad(&zone, &rows, &rewrites, report.rows_checked);
        self.write_rewrites(&rows, &zone, first_held, rewrites)
            .await?;
        Ok(report)
    }

    /// What `place`'s row needs: nothing, a codeword to rewrite it with, or
    /// nothing the checks can vouch for.
    fn scrub_row(
        &self,
        rows: &[Option<AlignedBuffer>],
        place: RowPlace<'_>,
        blocks: &dyn ScrubBlocks,
    ) -> RowFinding {
        let zone = place.zone;
        let parity_columns = zone.stripe.parity_columns();
        let lost: Vec<usize> = crate::recover::lost_in_set(zone, rows);
        if lost.len() > parity_columns {
            return RowFinding {
                repaired: None,
                unrepairable: true,
            };
        }
        for size in lost.len()..=parity_columns {
            let mut passing: Option<Vec<Vec<u8>>> = None;
            for erased in erasure_sets(zone, &lost, size) {
                let Some(codeword) = self.passing_codeword(rows, place, &erased, blocks) else {
                    continue;
                };
                match &passing {
                    None if 2 * (size - lost.len()) <= parity_columns - lost.len() => {
                        return whole_or_repaired(rows, place, codeword);
                    }
                    None => passing = Some(codeword),
                    Some(first) if disagree_on_held(zone, place.row, first, &codeword, blocks) => {
                        tracing::error!(array = %self.name, row = place.row, "scrub: two reconstructions of the row disagree on a held block and the checks cannot tell which is right");
                        return RowFinding {
                            repaired: None,
                            unrepairable: true,
                        };
                    }
                    Some(_) => {}
                }
            }
            if let Some(codeword) = passing {
                return whole_or_repaired(rows, place, codeword);
            }
        }
        RowFinding {
            repaired: None,
            unrepairable: true,
        }
    }

    /// The codeword that agrees with every column of the row read outside
    /// `erased` and whose held data blocks pass their checks, if any.
    fn passing_codeword(
        &self,
        rows: &[Option<AlignedBuffer>],
        place: RowPlace<'_>,
        erased: &[usize],
        blocks: &dyn ScrubBlocks,
    ) -> Option<Vec<Vec<u8>>> {
        let RowPlace {
            zone,
            row,
            first_row,
        } = place;
        let data = self
            .rebuild_row(zone, rows, row, first_row, Some(erased))
            .ok()?;
        // `is_valid` passes a block the caller does not hold.
        let held_pass = data
            .iter()
            .enumerate()
            .all(|(column, contents)| blocks.is_valid(zone.block_of(row, column), contents));
        if !held_pass {
            return None;
        }
        let columns: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let parity = zone.stripe.codec().encode(&columns).ok()?;
        let codeword: Vec<Vec<u8>> = data.into_iter().chain(parity).collect();
        let agrees = zone
            .stripe
            .codec_order(row)
            .enumerate()
            .all(|(position, member)| {
                erased.contains(&member)
                    || column_read(rows, member, row, first_row)
                        .is_none_or(|read| read == codeword[position].as_slice())
            });
        agrees.then_some(codeword)
    }

    fn report_unrepairable(
        &self,
        rows: &[Option<AlignedBuffer>],
        place: RowPlace<'_>,
        blocks: &dyn ScrubBlocks,
        report: &mut ScrubReport,
    ) {
        report.rows_unrepairable += 1;
        let RowPlace {
            zone,
            row,
            first_row,
        } = place;
        for column in 0..zone.stripe.data_columns() {
            let block = zone.block_of(row, column);
            if !blocks.is_held(block) {
                continue;
            }
            let member = zone
                .stripe
                .member_of(row, crate::geometry::Column::Data(column));
            let passes = column_read(rows, member, row, first_row)
                .is_some_and(|contents| blocks.is_valid(block, contents));
            if !passes {
                report.unrepairable_blocks.push(block);
            }
        }
    }

    /// Notes the columns of `place`'s row that differ from `codeword` as
    /// rewrites of their members, counting each as a repaired block (a
    /// held data block that failed its check) or a repaired parity column.
    fn note_rewrites(
        &self,
        rows: &[Option<AlignedBuffer>],
        place: RowPlace<'_>,
        codeword: &[Vec<u8>],
        blocks: &dyn ScrubBlocks,
        rewrites: &mut MemberRewrites,
        report: &mut ScrubReport,
    ) {
        let RowPlace {
            zone,
            row,
            first_row,
        } = place;
        let data_columns = zone.stripe.data_columns();
        for (position, member) in zone.stripe.codec_order(row).enumerate() {
            let Some(read) = column_read(rows, member, row, first_row) else {
                continue;
            };
            if read == codeword[position].as_slice() {
                continue;
            }
            let held_data = position < data_columns && blocks.is_held(zone.block_of(row, position));
            if held_data {
                report.blocks_repaired += 1;
                self.members[member].repaired();
            } else {
                report.parity_repaired += 1;
                self.members[member].parity_repaired();
            }
            rewrites.note(member, row - first_row, codeword[position].clone());
        }
    }

    /// Writes each member's rewritten rows back in one request per member:
    /// from its first to its last rewritten row, the rows between as read
    /// (the exclusive row locks keep them as they are).
    async fn write_rewrites(
        &self,
        rows: &[Option<AlignedBuffer>],
        zone: &ZoneView,
        first_row: u64,
        rewrites: MemberRewrites,
    ) -> Result<(), DeviceError> {
        let mut writes = Vec::new();
        for (member, changed) in rewrites.by_member.into_iter().enumerate() {
            let (Some(first), Some(last)) = (
                changed.iter().map(|change| change.row_offset).min(),
                changed.iter().map(|change| change.row_offset).max(),
            ) else {
                continue;
            };
            let Some(read) = rows[member].as_ref() else {
                continue;
            };
            let start = to_usize(first) * BLOCK_BYTES;
            let end = (to_usize(last) + 1) * BLOCK_BYTES;
            let mut buffer = AlignedBuffer::from_slice_padded(&read[start..end]);
            for change in changed {
                let at = to_usize(change.row_offset - first) * BLOCK_BYTES;
                buffer[at..at + BLOCK_BYTES].copy_from_slice(&change.contents);
            }
            let offset = self.geometry.member_block_of_row(first_row + first) * BLOCK_SIZE_BYTES;
            writes.push((member, offset, Arc::new(buffer)));
        }
        debug_assert!(
            writes
                .iter()
                .all(|(member, _, _)| zone.stripe.contains(*member))
        );
        if writes.is_empty() {
            return Ok(());
        }
        self.write_members(writes.into_iter()).await
    }
}

/// Rewrites of one step, by member.
struct MemberRewrites {
    by_member: Vec<Vec<ColumnRewrite>>,
}

struct ColumnRewrite {
    /// The row, counted from the step's first row read.
    row_offset: u64,
    contents: Vec<u8>,
}

impl MemberRewrites {
    fn new(member_count: usize) -> Self {
        Self {
            by_member: (0..member_count).map(|_| Vec::new()).collect(),
        }
    }

    fn note(&mut self, member: usize, row_offset: u64, contents: Vec<u8>) {
        self.by_member[member].push(ColumnRewrite {
            row_offset,
            contents,
        });
    }
}

impl RedundantArray {
    /// Adds a step's checked and rewritten columns to each member's window
    /// and faults the members whose window was mostly bad while the array
    /// keeps a column of redundancy without them; their paths. Their
    /// rewrites are then not written (a faulted member takes no writes).
    fn fault_mostly_bad(
        &self,
        zone: &ZoneView,
        rows: &[Option<AlignedBuffer>],
        rewrites: &MemberRewrites,
        rows_checked: u64,
    ) -> Vec<String> {
        let mut faulted = Vec::new();
        for (index, member) in self.members.iter().enumerate() {
            if rows[index].is_none() || !zone.stripe.contains(index) {
                continue;
            }
            let bad = rewrites.by_member[index].len() as u64;
            if !member.scrub_tally(
                rows_checked,
                bad,
                SCRUB_FAULT_WINDOW_ROWS,
                SCRUB_FAULT_FAILED_PERCENT,
            ) {
                continue;
            }
            if self.lost_member_count() + 1 >= zone.stripe.parity_columns() {
                tracing::warn!(array = %self.name, member = index, path = %member.path(), "scrub: nearly every column of the member is bad, but the array has no redundancy to spare without it: repairing it block by block");
                continue;
            }
            let reason = format!(
                "scrub found more than {SCRUB_FAULT_FAILED_PERCENT} % of its columns bad over {SCRUB_FAULT_WINDOW_ROWS} rows: its data is rebuilt from the other members instead of repaired block by block; replace the device (`lamina device replace`)"
            );
            if member.fault(&reason) {
                self.labels_out_of_date();
                faulted.push(member.path());
            }
        }
        faulted
    }
}

/// A row of a step that holds blocks the caller holds, and how many.
struct HeldRow {
    row: u64,
    held_columns: usize,
}

fn held_data_columns(zone: &ZoneView, row: u64, blocks: &dyn ScrubBlocks) -> usize {
    (0..zone.stripe.data_columns())
        .filter(|column| blocks.is_held(zone.block_of(row, *column)))
        .count()
}

/// `member`'s column of `row` as read (rows read from `first_row` on).
fn column_read(
    rows: &[Option<AlignedBuffer>],
    member: usize,
    row: u64,
    first_row: u64,
) -> Option<&[u8]> {
    let start = to_usize(row - first_row) * BLOCK_BYTES;
    rows[member]
        .as_ref()
        .map(|data| &data[start..start + BLOCK_BYTES])
}

/// The row needs no rewrite when `codeword` is what was read.
fn whole_or_repaired(
    rows: &[Option<AlignedBuffer>],
    place: RowPlace<'_>,
    codeword: Vec<Vec<u8>>,
) -> RowFinding {
    let whole = place
        .zone
        .stripe
        .codec_order(place.row)
        .enumerate()
        .all(|(position, member)| {
            column_read(rows, member, place.row, place.first_row)
                .is_none_or(|read| read == codeword[position].as_slice())
        });
    RowFinding {
        repaired: (!whole).then_some(codeword),
        unrepairable: false,
    }
}

/// Whether two codewords of `row` differ in a data column the caller holds.
fn disagree_on_held(
    zone: &ZoneView,
    row: u64,
    first: &[Vec<u8>],
    second: &[Vec<u8>],
    blocks: &dyn ScrubBlocks,
) -> bool {
    (0..zone.stripe.data_columns()).any(|column| {
        let block = zone.block_of(row, column);
        blocks.is_held(block) && !blocks.same_for_holder(block, &first[column], &second[column])
    })
}

/// Every set of `size` members of `zone`'s set that contains `lost`.
pub(crate) fn erasure_sets(zone: &ZoneView, lost: &[usize], size: usize) -> Vec<Vec<usize>> {
    let others: Vec<usize> = zone
        .stripe
        .members()
        .iter()
        .copied()
        .filter(|member| !lost.contains(member))
        .collect();
    let mut sets = Vec::new();
    let extra = size - lost.len();
    let mut chosen = Vec::with_capacity(extra);
    combinations(&others, extra, 0, &mut chosen, &mut |combination| {
        let mut set = lost.to_vec();
        set.extend_from_slice(combination);
        sets.push(set);
    });
    sets
}

fn combinations(
    items: &[usize],
    count: usize,
    start: usize,
    chosen: &mut Vec<usize>,
    visit: &mut dyn FnMut(&[usize]),
) {
    if chosen.len() == count {
        visit(chosen);
        return;
    }
    for index in start..items.len() {
        chosen.push(items[index]);
        combinations(items, count, index + 1, chosen, visit);
        chosen.pop();
    }
}

impl RedundantArray {
    /// See [`lamina_device::BlockDevice::scrub_copies`]: the mirrored
    /// prefix's copies of one frame at member `offset`, each that fails
    /// `is_valid` rewritten from the first that passes; a frame no copy of
    /// which passes is reported unrepairable.
    pub(crate) async fn scrub_prefix_copies(
        &self,
        offset: u64,
        length: usize,
        is_valid: lamina_device::BlockCheck<'_>,
    ) -> Result<ScrubReport, DeviceError> {
        let _no_prefix_write_meanwhile = self.prefix_lock.write().await;
        let copies = self.read_prefix_copies(offset, length).await;
        let mut report = ScrubReport {
            rows_checked: 1,
            ..ScrubReport::default()
        };
        let Some(good) = copies
            .iter()
            .find(|(_, data)| is_valid(data))
            .map(|(_, data)| data.clone())
        else {
            report.rows_unrepairable = 1;
            return Ok(report);
        };
        let good = Arc::new(good);
        let bad: Vec<usize> = copies
            .iter()
            .filter(|(_, data)| !is_valid(data))
            .map(|(index, _)| *index)
            .collect();
        if bad.is_empty() {
            return Ok(report);
        }
        self.write_members(bad.iter().map(|index| (*index, offset, good.clone())))
            .await?;
        for index in &bad {
            tracing::warn!(array = %self.name, member = index, path = %self.members[*index].path(), offset, "scrub: a copy of the mirrored metadata failed its check and was rewritten from another");
            self.members[*index].parity_repaired();
        }
        report.parity_repaired = bad.len() as u64;
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combinations_are_every_subset_of_the_size_once() {
        let mut seen = Vec::new();
        combinations(&[1, 2, 3, 4], 2, 0, &mut Vec::new(), &mut |set| {
            seen.push(set.to_vec());
        });
        assert_eq!(seen.len(), 6);
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 6);
        let mut none = 0;
        combinations(&[1, 2], 0, 0, &mut Vec::new(), &mut |set| {
            assert!(set.is_empty());
            none += 1;
        });
        assert_eq!(none, 1);
    }
}
