//! Replacing a member (`device replace OLD NEW`): the new device is labelled
//! as the member's replacement, receives every write to the member from then
//! on, and the rebuild writes to it what the member held of the ranges the
//! engine keeps (live data only: the engine passes its metadata and its
//! segments in use, in ascending order). Rows are rebuilt from the old
//! member while it still works (copy first: redundancy never drops), or
//! reconstructed from the others; every rebuilt row is checked against the
//! engine's checksums before it is written. The new device is never read
//! until it takes the member's place (`finish_rebuild`), so a half-rebuilt
//! device can never serve stale rows.
//!
//! Progress survives a crash: every [`REBUILD_PERSIST_ROWS`] rows, and at
//! least every [`crate::member::REBUILD_PERSIST_INTERVAL_MS`] while rows are
//! rebuilt, the new device is flushed and its label records the rows done;
//! after a restart the rebuild resumes from there (rows written since the
//! rebuild began were written to the new device too), and a crash costs at
//! most that much work again.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use lamina_device::{
    AlignedBuffer, BlockDevice, DeviceError, DeviceErrorKind, PlacedBlockCheck, RebuildReport,
};

use crate::array::{RedundantArray, write_label};
use crate::assemble::{ArrayError, MemberDevice, read_label};
use crate::geometry::to_usize;
use crate::geometry::{BLOCK_BYTES, BLOCK_SIZE_BYTES, Column};
use crate::member::{REBUILD_PERSIST_ROWS, Replacement};
use crate::recover::{erasures_from, lost_in_set};
use crate::row_locks::RowSpan;
use crate::stripe::ZoneView;

/// Rows rebuilt under one exclusive hold of their row locks (client writes
/// of those rows wait meanwhile, others go on): 64 rows of a 4+2 array are
/// 1 MiB of data.
pub const REBUILD_ROWS_PER_STEP: u64 = 64;
/// Blocks of the mirrored prefix copied under one hold of the prefix lock.
pub const PREFIX_COPY_BLOCKS_MAX: u64 = 256;

const _: () = assert!(REBUILD_PERSIST_ROWS.is_multiple_of(REBUILD_ROWS_PER_STEP));

/// Where a rebuilt row is: its zone, the row, and the first row read.
#[derive(Clone, Copy)]
struct RowPlace<'a> {
    zone: &'a ZoneView,
    row: u64,
    first_row: u64,
}

impl RedundantArray {
    /// Labels `new` as the replacement of the member at `path` (its path in
    /// the array) and starts writing to it; the rebuild is then driven by
    /// the engine (`rebuild_range`, `finish_rebuild`).
    pub async fn begin_replacement(&self, path: &str, new: MemberDevice) -> Result<(), ArrayError> {
        let index = self.member_index_of(path)?;
        self.check_replacement(&new).await?;
        let label = self.label.lock().await;
        let mut own = label.clone();
        own.member_index = u32::try_from(index).expect("member indexes fit in u32");
        own.rebuilding_rows_done = Some(0);
        write_label(new.device.as_ref(), &own).await?;
        let replacement = Arc::new(Replacement::new(new.device, new.path, 0));
        if !self.members[index].set_replacement(replacement) {
            return Err(ArrayError::ReplacementInProgress {
                tier: label.tier.name(),
            });
        }
        *self.rebuild_failure.lock().expect("rebuild failure lock") = None;
        tracing::warn!(array = %self.name, member = index, old = %path, new = %own.member_paths.get(index).cloned().unwrap_or_default(), "replacement started");
        Ok(())
    }

    /// Attaches a replacement found when the array was assembled, to resume
    /// its rebuild from `rows_done`.
    pub(crate) fn resume_replacement(&self, index: usize, new: MemberDevice, rows_done: u64) {
        let replacement = Arc::new(Replacement::new(new.device, new.path, rows_done));
        assert!(self.members[index].set_replacement(replacement));
    }

    fn member_index_of(&self, path: &str) -> Result<usize, ArrayError> {
        self.members
            .iter()
            .position(|member| member.path() == path)
            .ok_or_else(|| ArrayError::NotAMember {
                path: path.to_owned(),
                array: self.name.clone(),
            })
    }

    /// Refuses a second replacement while one is rebuilt, and a device
    /// `check_new_device` refuses.
    async fn check_replacement(&self, new: &MemberDevice) -> Result<(), ArrayError> {
        if self
            .members
            .iter()
            .any(|member| member.replacement().is_some())
        {
            return Err(ArrayError::ReplacementInProgress {
                tier: self.label.lock().await.tier.name(),
            });
        }
        self.check_new_device(new).await
    }

    /// Refuses a device too small, one already in the array, or one
    /// carrying a label.
    pub(crate) async fn check_new_device(&self, new: &MemberDevice) -> Result<(), ArrayError> {
        if self.members.iter().any(|member| member.path() == new.path) {
            return Err(ArrayError::AlreadyAMember {
                path: new.path.clone(),
            });
        }
        let needed_bytes = self.geometry.member_size_blocks() * BLOCK_SIZE_BYTES;
        if new.device.size_bytes() < needed_bytes {
            return Err(ArrayError::TooSmall {
                path: new.path.clone(),
                size_bytes: new.device.size_bytes(),
                needed_bytes,
            });
        }
        if let Ok(label) = read_label(new.device.as_ref()).await {
            return Err(ArrayError::LabelledDevice {
                path: new.path.clone(),
                array_identifier: label.array_identifier,
            });
        }
        Ok(())
    }

    /// The member being replaced and its replacement, if any.
    pub(crate) fn replacing(&self) -> Option<(usize, Arc<Replacement>)> {
        self.members
            .iter()
            .enumerate()
            .find_map(|(index, member)| Some((index, member.replacement()?)))
    }

    /// Records rebuild progress every `rows` rows instead of every
    /// [`REBUILD_PERSIST_ROWS`] (tests: to cut the power between records).
    pub fn set_rebuild_persist_rows(&self, rows: u64) {
        assert!(rows > 0);
        self.rebuild_persist_rows.store(rows, Ordering::Relaxed);
    }

    /// Whether a replacement is being rebuilt.
    pub fn replacement_pending(&self) -> bool {
        self.replacing().is_some()
    }

    /// Why the last replacement failed, if it did.
    pub fn rebuild_failure(&self) -> Option<String> {
        self.rebuild_failure
            .lock()
            .expect("rebuild failure lock")
            .clone()
    }

    /// A write to the replacement failed: it is dropped, loudly.
    pub(crate) fn replacement_failed(&self, index: usize, error: &DeviceError) {
        if self.members[index].drop_replacement(&error.to_string()) {
            *self.rebuild_failure.lock().expect("rebuild failure lock") =
                Some(format!("the replacement device failed: {error}"));
        }
    }

    pub(crate) async fn rebuild(
        &self,
        offset: u64,
        length: u64,
        is_valid: PlacedBlockCheck<'_>,
    ) -> Result<RebuildReport, DeviceError> {
        let mut report = RebuildReport::default();
        let Some((index, replacement)) = self.replacing() else {
            return Ok(report);
        };
        let first_block = offset / BLOCK_SIZE_BYTES;
        let end_block = first_block + length / BLOCK_SIZE_BYTES;
        let prefix_end = self.geometry.prefix_blocks;
        let holds_prefix = self.prefix_write_targets().contains(&index);
        if first_block < prefix_end && holds_prefix {
            let copied = self
                .copy_prefix(index, &replacement, first_block, end_block.min(prefix_end))
                .await?;
            report.blocks_rebuilt += copied;
        }
        if end_block <= prefix_end {
            return Ok(report);
        }
        let row_of = |block: u64| self.zone_of_block(block).row_of_clamped(block);
        let first_row = row_of(first_block.max(prefix_end));
        let last_row = row_of(end_block - 1);
        let mut row = first_row.max(replacement.rows_done.load(Ordering::SeqCst));
        while row <= last_row {
            let current = self.members[index].replacement();
            if !current.is_some_and(|current| Arc::ptr_eq(&current, &replacement)) {
                return Err(replacement_gone(&self.name));
            }
            let zone = self.zone_of_row(row);
            let span = RowSpan {
                first_row: row,
                last_row: (row + REBUILD_ROWS_PER_STEP - 1)
                    .min(last_row)
                    .min(zone.last_row()),
            };
            // A zone whose set leaves the member out holds nothing of it.
            if zone.stripe.contains(index) {
                report.add(
                    self.rebuild_rows(index, &replacement, span, is_valid)
                        .await?,
                );
            }
            row = span.last_row + 1;
            replacement.rows_done.fetch_max(row, Ordering::SeqCst);
            if replacement.progress_due(self.rebuild_persist_rows.load(Ordering::Relaxed)) {
                self.persist_rebuild_progress(index, &replacement).await?;
            }
        }
        Ok(report)
    }

    /// Copies prefix blocks `first..end` from a good copy to the replacement,
    /// a chunk at a time, holding the prefix lock so that no prefix write
    /// lands between the read and the write of a chunk.
    async fn copy_prefix(
        &self,
        index: usize,
        replacement: &Replacement,
        first: u64,
        end: u64,
    ) -> Result<u64, DeviceError> {
        let mut block = first;
        while block < end {
            let count = (end - block).min(PREFIX_COPY_BLOCKS_MAX);
            let member_offset = self.geometry.prefix_member_block(block) * BLOCK_SIZE_BYTES;
            let length = to_usize(count) * BLOCK_BYTES;
            let _no_prefix_write_meanwhile = self.prefix_lock.write().await;
            let source = self
                .usable_prefix_holders()
                .into_iter()
                .filter_map(|member| self.members[member].usable_device())
                .next()
                .ok_or_else(|| self.too_many_lost(block * BLOCK_SIZE_BYTES, length as u64))?;
            let data = source.read(member_offset, length).await?;
            self.write_replacement(index, replacement, member_offset, data)
                .await?;
            block += count;
        }
        Ok(end - first)
    }

    /// Rebuilds `span`'s rows of member `index` onto its replacement.
    async fn rebuild_rows(
        &self,
        index: usize,
        replacement: &Replacement,
        span: RowSpan,
        is_valid: PlacedBlockCheck<'_>,
    ) -> Result<RebuildReport, DeviceError> {
        let _no_write_meanwhile = self.row_locks.exclusive(span).await;
        // Read under the lock: the zone may have been reopened meanwhile.
        let zone = self.zone_of_row(span.first_row);
        if !zone.stripe.contains(index) {
            return Ok(RebuildReport::default());
        }
        let rows = self.read_rows(&zone, span.first_row, span.last_row).await?;
        let row_count = to_usize(span.last_row - span.first_row + 1);
        let mut buffer = AlignedBuffer::zeroed(row_count * BLOCK_BYTES);
        let mut report = RebuildReport::default();
        for (position, row) in (span.first_row..=span.last_row).enumerate() {
            let place = RowPlace {
                zone: &zone,
                row,
                first_row: span.first_row,
            };
            let contents = self.rebuilt_column(&rows, place, index, is_valid, &mut report);
            let contents = contents
                .map_err(|error| self.codec_failed(zone.block_of(row, 0), BLOCK_BYTES, &error))?;
            buffer[position * BLOCK_BYTES..(position + 1) * BLOCK_BYTES].copy_from_slice(&contents);
        }
        let offset = self.geometry.member_block_of_row(span.first_row) * BLOCK_SIZE_BYTES;
        self.write_replacement(index, replacement, offset, buffer)
            .await?;
        report.blocks_rebuilt += row_count as u64;
        Ok(report)
    }

    /// What member `index` must hold in `row`: every data column of the row
    /// is reconstructed (treating the lost members, then each other member
    /// in turn, as erased) until all of them pass `is_valid`; the member's
    /// column is then a data column, or parity encoded from them. With no
    /// passing reconstruction the first one is used and its failing blocks
    /// counted as unrepairable.
    fn rebuilt_column(
        &self,
        rows: &[Option<AlignedBuffer>],
        place: RowPlace<'_>,
        index: usize,
        is_valid: PlacedBlockCheck<'_>,
        report: &mut RebuildReport,
    ) -> Result<Vec<u8>, crate::codec::CodecError> {
        let RowPlace {
            zone,
            row,
            first_row,
        } = place;
        let lost = lost_in_set(zone, rows);
        let candidates = erasures_from(zone, lost.clone());
        let failing = |data: &[Vec<u8>]| {
            data.iter()
                .enumerate()
                .filter(|(column, contents)| !is_valid(zone.block_of(row, *column), contents))
                .count() as u64
        };
        let mut fallback = None;
        let mut chosen = None;
        for erased in &candidates {
            let Ok(data) = self.rebuild_row(zone, rows, row, first_row, Some(erased)) else {
                continue;
            };
            let failed = failing(&data);
            if failed == 0 {
                chosen = Some(data);
                break;
            }
            fallback.get_or_insert((data, failed));
        }
        let data = match (chosen, fallback) {
            (Some(data), _) => {
                report.rows_verified += 1;
                data
            }
            (None, Some((data, failed))) => {
                tracing::error!(array = %self.name, row, "rebuild: no reconstruction of the row passes the engine's checksums");
                report.blocks_unrepairable += failed;
                data
            }
            (None, None) => self.rebuild_row(zone, rows, row, first_row, Some(&lost))?,
        };
        let column = zone
            .stripe
            .column_of(row, index)
            .expect("the caller rebuilds members of the zone's set only");
        Ok(match column {
            Column::Data(column) => data[column].clone(),
            Column::Parity(column) => {
                let columns: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
                zone.stripe.codec().encode(&columns)?[column].clone()
            }
        })
    }

    /// Rows `first..=last` from every usable member (retrying while members
    /// fail, each failure faulting one).
    async fn read_rows(
        &self,
        zone: &ZoneView,
        first_row: u64,
        last_row: u64,
    ) -> Result<Vec<Option<AlignedBuffer>>, DeviceError> {
        loop {
            if let Some(rows) = self.read_all_rows(zone, first_row, last_row).await? {
                return Ok(rows);
            }
        }
    }

    async fn write_replacement(
        &self,
        index: usize,
        replacement: &Replacement,
        offset: u64,
        data: AlignedBuffer,
    ) -> Result<(), DeviceError> {
        let length = data.len() as u64;
        match replacement.device.write(offset, Arc::new(data)).await {
            Ok(()) => {
                replacement
                    .bytes_written
                    .fetch_add(length, Ordering::Relaxed);
                Ok(())
            }
            Err(error) => {
                self.replacement_failed(index, &error);
                Err(error)
            }
        }
    }

    /// Makes the rows done durable on the replacement, then records them in
    /// its label.
    async fn persist_rebuild_progress(
        &self,
        index: usize,
        replacement: &Replacement,
    ) -> Result<(), DeviceError> {
        let rows_done = replacement.rows_done.load(Ordering::SeqCst);
        let label = self.label.lock().await;
        let mut own = label.clone();
        own.member_index = u32::try_from(index).expect("member indexes fit in u32");
        own.rebuilding_rows_done = Some(rows_done);
        let result = async {
            replacement.device.flush().await?;
            write_label(replacement.device.as_ref(), &own).await
        }
        .await;
        if let Err(error) = result {
            self.replacement_failed(index, &error);
            return Err(error);
        }
        replacement.persisted(rows_done);
        Ok(())
    }

    /// The replacement takes its member's place: made durable, labelled as
    /// the member one generation on (before any other label, so that a
    /// crash leaves either the rebuild to resume or the new member current),
    /// then every label rewritten and the old device's label wiped.
    pub(crate) async fn finish(&self) -> Result<(), DeviceError> {
        let Some((index, replacement)) = self.replacing() else {
            return match self.rebuild_failure() {
                Some(_) => Err(replacement_gone(&self.name)),
                None => Ok(()),
            };
        };
        let old_device = self.members[index].any_device();
        {
            let mut label = self.label.lock().await;
            label.generation += 1;
            label.member_paths[index] = replacement.path.clone();
            label.faulted_members = self.lost_members_but(index);
            let mut own = label.clone();
            own.member_index = u32::try_from(index).expect("member indexes fit in u32");
            // The zone table first: a member without it could not serve
            // its zones' layout at the next assembly.
            let result = async {
                self.write_whole_table(replacement.device.as_ref()).await?;
                replacement.device.flush().await?;
                write_label(replacement.device.as_ref(), &own).await
            }
            .await;
            if let Err(error) = result {
                self.replacement_failed(index, &error);
                return Err(error);
            }
            self.members[index].promote_replacement();
        }
        self.labels_out_of_date();
        self.flush_members_and_labels().await?;
        if let Some(old) = old_device {
            wipe_label(old.as_ref()).await;
        }
        Ok(())
    }
}

/// Best effort: an old member's label is wiped so that it is not offered
/// to the array again (a leftover label loses anyway: an older generation).
pub(crate) async fn wipe_label(device: &dyn BlockDevice) {
    let zeros = Arc::new(AlignedBuffer::zeroed(BLOCK_BYTES));
    for block in [
        crate::geometry::LABEL_BLOCK,
        crate::geometry::LABEL_COPY_BLOCK,
    ] {
        if device
            .write(block * BLOCK_SIZE_BYTES, zeros.clone())
            .await
            .is_err()
        {
            return;
        }
    }
    let _ = device.flush().await;
}

/// A failed rebuild step as a device error (for the engine).
pub(crate) fn replacement_gone(name: &str) -> DeviceError {
    DeviceError::new(
        DeviceErrorKind::Io(std::io::Error::other("the replacement device was dropped")),
        name,
        0,
        0,
    )
}
