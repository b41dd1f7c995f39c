//! A tier's devices as one [`BlockDevice`]: the engine writes and reads the
//! array like a single device, and the array stripes, mirrors, computes
//! parity, reconstructs what a lost or failing member held, and repairs blocks
//! that fail the engine's checksum (`recover_block`).
//!
//! The contract with the writer (the engine's log): a write into the striped
//! region starts at a row boundary, and no later write touches the rest of
//! its last row until the segment holding it is reused. The array pads that
//! row with zeros and writes whole rows, so parity is never read, modified and
//! written back: a row's parity is computed once, from data in memory.
//!
//! Reading, writing and recovering live in `read.rs`, `write.rs` and
//! `recover.rs`; assembling an array from labelled devices in `assemble.rs`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use lamina_device::{
    AlignedBuffer, BlockCheck, BlockDevice, DeviceError, DeviceErrorKind, PlacedBlockCheck,
    RebuildReport,
};
use serde::Serialize;

use crate::codec::ParityCodec;
use crate::geometry::{ArrayGeometry, BLOCK_SIZE_BYTES, LABEL_BLOCK, LABEL_COPY_BLOCK};
use crate::label::MemberLabel;
use crate::member::{Member, MemberStatus};
use crate::row_locks::RowLocks;
use crate::stripe::ZoneState;
use crate::stripe::{SetMask, Stripe, full_set, members_of};

/// The array's state, named the way zpool names a pool's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ArrayState {
    Online,
    /// Members are lost, but no more than the parity covers.
    Degraded,
    /// More members lost than the parity covers: I/O fails.
    Faulted,
}

impl ArrayState {
    pub fn name(self) -> &'static str {
        match self {
            Self::Online => "online",
            Self::Degraded => "degraded",
            Self::Faulted => "faulted",
        }
    }
}

/// Who holds the mirrored prefix.
#[derive(Clone, Debug)]
pub(crate) struct PrefixCopies {
    /// Members holding a valid copy (the label's `prefix_members`): read.
    pub holders: Vec<usize>,
    /// A member the prefix is being copied to: written, not read.
    pub pending: Option<usize>,
}

/// See the module documentation.
pub struct RedundantArray {
    pub(crate) name: String,
    pub(crate) geometry: ArrayGeometry,
    pub(crate) array_identifier: u128,
    pub(crate) members: Vec<Member>,
    /// The parity code of each width, built once when first needed.
    pub(crate) codecs: Vec<OnceLock<ParityCodec>>,
    /// Each zone's member set (a version 2 array: one zone, the full set).
    pub(crate) zones: std::sync::RwLock<ZoneState>,
    /// The sequence the next table block write carries.
    pub(crate) next_table_sequence: AtomicU64,
    /// Serialises what changes sets, the table and membership
    /// (`open_region`, removal, addition, the prefix's copies).
    pub(crate) open_lock: tokio::sync::Mutex<()>,
    pub(crate) prefix: std::sync::Mutex<PrefixCopies>,
    /// Members being removed: out of the write set, still read.
    pub(crate) removing: std::sync::Mutex<Vec<bool>>,
    /// The label written to members, raised a generation whenever a member
    /// leaves; guarded for the label writes in `flush`.
    pub(crate) label: tokio::sync::Mutex<MemberLabel>,
    /// A member left the array since the labels were last written.
    pub(crate) labels_stale: AtomicBool,
    /// Striped writes hold their rows shared, a repair its rows exclusively:
    /// a repair reads its rows, rebuilds and rewrites blocks, and must not
    /// interleave with a new write of those rows (the segment freed and
    /// reused meanwhile), or it could put back a block the new write
    /// replaced. Writes of other rows go on.
    pub(crate) row_locks: RowLocks,
    /// Prefix writes hold it shared; copying the prefix to a replacement
    /// holds it exclusively, a chunk at a time, so that no write lands
    /// between a chunk's read and its copy (which would undo the write).
    pub(crate) prefix_lock: tokio::sync::RwLock<()>,
    /// Why the last replacement was dropped, for status and the engine.
    pub(crate) rebuild_failure: std::sync::Mutex<Option<String>>,
    /// Rows rebuilt between two records of progress in the replacement's
    /// label ([`crate::member::REBUILD_PERSIST_ROWS`]; tests lower it).
    pub(crate) rebuild_persist_rows: std::sync::atomic::AtomicU64,
}

impl RedundantArray {
    /// The blocks of `offset..offset + length` when it is whole blocks of
    /// the striped region (past the mirrored prefix).
    fn striped_blocks(&self, offset: u64, length: usize) -> Option<std::ops::Range<u64>> {
        let first_block = offset / BLOCK_SIZE_BYTES;
        let whole_blocks = offset.is_multiple_of(BLOCK_SIZE_BYTES)
            && (length as u64).is_multiple_of(BLOCK_SIZE_BYTES);
        (whole_blocks && first_block >= self.geometry.prefix_blocks)
            .then(|| first_block..first_block + length as u64 / BLOCK_SIZE_BYTES)
    }

    pub(crate) fn new(geometry: ArrayGeometry, members: Vec<Member>, label: MemberLabel) -> Self {
        assert_eq!(members.len(), geometry.member_count);
        let name = format!(
            "{} {} array of {} devices",
            label.tier.name(),
            geometry.redundancy,
            geometry.member_count
        );
        // Members out of use that the label does not list yet: the next
        // flush writes every label afresh.
        let labels_stale = members.iter().enumerate().any(|(index, member)| {
            let index = u32::try_from(index).expect("member indexes fit in u32");
            member.is_lost() && !label.faulted_members.contains(&index)
        });
        let to_indexes =
            |list: &[u32]| -> Vec<usize> { list.iter().map(|index| to_index(*index)).collect() };
        let mut removing = vec![false; geometry.member_count];
        for index in to_indexes(&label.removing_members) {
            removing[index] = true;
        }
        let prefix = PrefixCopies {
            holders: to_indexes(&label.prefix_members),
            pending: None,
        };
        let mut array = Self {
            name,
            array_identifier: label.array_identifier,
            codecs: (0..=geometry.member_count)
                .map(|_| OnceLock::new())
                .collect(),
            zones: std::sync::RwLock::new(ZoneState {
                sets: Vec::new(),
                table: vec![0; crate::geometry::to_usize(geometry.zone_count())],
                sequences: vec![0; crate::geometry::to_usize(geometry.table_blocks)],
            }),
            next_table_sequence: AtomicU64::new(1),
            open_lock: tokio::sync::Mutex::new(()),
            prefix: std::sync::Mutex::new(prefix),
            removing: std::sync::Mutex::new(removing),
            geometry,
            members,
            labels_stale: AtomicBool::new(labels_stale),
            row_locks: RowLocks::default(),
            prefix_lock: tokio::sync::RwLock::new(()),
            rebuild_failure: std::sync::Mutex::new(None),
            rebuild_persist_rows: crate::member::REBUILD_PERSIST_ROWS.into(),
            label: tokio::sync::Mutex::new(label.clone()),
        };
        let masks = match &label.zones {
            Some(zones) => zones.member_sets.clone(),
            None => vec![full_set(array.geometry.member_count)],
        };
        let sets = masks
            .into_iter()
            .map(|mask| (mask != 0).then(|| array.stripe_for(mask)))
            .collect();
        array.zones.get_mut().expect("zone state lock").sets = sets;
        array
    }

    /// The layout over member set `mask`, with the code for its width.
    pub(crate) fn stripe_for(&self, mask: SetMask) -> Arc<Stripe> {
        let width = members_of(mask).len();
        let codec = self.codecs[width]
            .get_or_init(|| ParityCodec::new(self.geometry.redundancy, width))
            .clone();
        Arc::new(Stripe::new(self.geometry.redundancy, mask, codec))
    }

    pub fn geometry(&self) -> ArrayGeometry {
        self.geometry
    }

    /// Blocks per row of data: the alignment of every write into the
    /// striped region, which starts at block `prefix_blocks`.
    pub fn row_data_blocks(&self) -> u64 {
        self.geometry.row_data_blocks()
    }

    pub fn member_status(&self) -> Vec<MemberStatus> {
        self.members.iter().map(Member::status).collect()
    }

    /// Members out of use (faulted or missing; an empty slot is neither).
    pub fn lost_member_count(&self) -> usize {
        self.members
            .iter()
            .filter(|member| member.is_lost())
            .count()
    }

    /// Members of `mask` that cannot be read (lost, or an empty slot).
    pub(crate) fn unreadable_in(&self, mask: SetMask) -> usize {
        members_of(mask)
            .into_iter()
            .filter(|index| !self.members[*index].state().is_usable())
            .count()
    }

    /// Online with nothing lost. A version 2 array is faulted when more
    /// members are lost than the parity covers; a zoned one when no copy of
    /// the prefix is left or no zone can be written any more (too few
    /// members for a narrowed set, too many lost for the full one): zones
    /// at sets with too many lost fail their own reads, but may be free.
    pub fn state(&self) -> ArrayState {
        let lost = self.lost_member_count();
        let parity = self.geometry.parity_columns();
        let faulted = if self.geometry.is_zoned() {
            let full = full_set(self.geometry.member_count);
            self.usable_prefix_holders().is_empty()
                || (self.narrowed_write_set().is_none() && self.unreadable_in(full) > parity)
        } else {
            lost > parity
        };
        match (lost, faulted) {
            (_, true) => ArrayState::Faulted,
            (0, false) => ArrayState::Online,
            _ => ArrayState::Degraded,
        }
    }

    /// The usable members holding a copy of the prefix, in order.
    pub(crate) fn usable_prefix_holders(&self) -> Vec<usize> {
        let holders = self.prefix.lock().expect("prefix lock").holders.clone();
        holders
            .into_iter()
            .filter(|index| self.members[*index].state().is_usable())
            .collect()
    }

    /// The members prefix writes go to: the holders and a copy in progress.
    pub(crate) fn prefix_write_targets(&self) -> Vec<usize> {
        let prefix = self.prefix.lock().expect("prefix lock");
        prefix
            .holders
            .iter()
            .copied()
            .chain(prefix.pending)
            .collect()
    }

    /// Has the next flush rewrite every label (assembly found labels of
    /// several generations: a crash while they were rewritten).
    pub(crate) fn labels_out_of_date(&self) {
        self.labels_stale.store(true, Ordering::SeqCst);
    }

    /// Takes a member out by hand (`device fail`), as if it had failed.
    pub fn fail_member(&self, index: usize) {
        if self.members[index].fault("taken out by hand") {
            self.labels_stale.store(true, Ordering::SeqCst);
        }
    }

    /// Records a failed member I/O: the member leaves the array.
    pub(crate) fn member_failed(&self, index: usize, error: &DeviceError) {
        if self.members[index].fault(&error.to_string()) {
            self.labels_stale.store(true, Ordering::SeqCst);
        }
    }

    /// The error for I/O the remaining members cannot serve.
    pub(crate) fn too_many_lost(&self, offset: u64, length: u64) -> DeviceError {
        let lost: Vec<String> = self
            .members
            .iter()
            .filter(|member| member.is_lost())
            .map(|member| format!("{} ({})", member.path(), member.state().name()))
            .collect();
        DeviceError::new(
            DeviceErrorKind::Io(std::io::Error::other(format!(
                "{} members lost, the parity covers {}: {}",
                lost.len(),
                self.geometry.parity_columns(),
                lost.join(", ")
            ))),
            &self.name,
            offset,
            length,
        )
    }

    /// Writes the label, one generation on, to every usable member and
    /// flushes them, when a member left since the last time: a member that
    /// missed writes never comes back as current. A replacement's label is
    /// written too, with the rows it holds durably.
    async fn write_labels_if_stale(&self) -> Result<(), DeviceError> {
        let mut label = self.label.lock().await;
        if !self.labels_stale.swap(false, Ordering::SeqCst) {
            return Ok(());
        }
        label.generation += 1;
        label.faulted_members = self.lost_members_but(usize::MAX);
        let writes = self.members.iter().enumerate().flat_map(|(index, member)| {
            let mut own = label.clone();
            own.member_index = u32::try_from(index).expect("member indexes fit in u32");
            let replacement = member.replacement().map(|replacement| {
                let mut theirs = own.clone();
                theirs.rebuilding_rows_done =
                    Some(replacement.rows_persisted.load(Ordering::SeqCst));
                (index, true, replacement.device.clone(), theirs)
            });
            let device = member
                .usable_device()
                .map(|device| (index, false, device, own));
            device.into_iter().chain(replacement)
        });
        let writes = writes.map(|(index, is_replacement, device, own)| async move {
            (
                index,
                is_replacement,
                write_label(device.as_ref(), &own).await,
            )
        });
        for (index, is_replacement, result) in futures::future::join_all(writes).await {
            match result {
                Err(error) if is_replacement => self.replacement_failed(index, &error),
                Err(error) => self.member_failed(index, &error),
                Ok(()) => {}
            }
        }
        tracing::warn!(
            array = %self.name,
            generation = label.generation,
            faulted = ?label.faulted_members,
            "member labels rewritten"
        );
        self.check_tolerance(0, 0)
    }

    /// Indexes of the members out of use, leaving out `except` (and the
    /// empty slots, which are not members).
    pub(crate) fn lost_members_but(&self, except: usize) -> Vec<u32> {
        self.members
            .iter()
            .enumerate()
            .filter(|(index, member)| *index != except && member.is_lost())
            .map(|(index, _)| u32::try_from(index).expect("member indexes fit in u32"))
            .collect()
    }

    /// Flushes every usable member, then rewrites the labels if a member
    /// left (see `write_labels_if_stale`).
    pub(crate) async fn flush_members_and_labels(&self) -> Result<(), DeviceError> {
        let flushes = self
            .members
            .iter()
            .enumerate()
            .map(|(index, member)| async move {
                let device = member.usable_device()?;
                Some((index, device.flush().await))
            });
        for (index, result) in futures::future::join_all(flushes)
            .await
            .into_iter()
            .flatten()
        {
            if let Err(error) = result {
                self.member_failed(index, &error);
            }
        }
        self.check_tolerance(0, 0)?;
        self.write_labels_if_stale().await
    }

    /// Ok while the array can still serve I/O: for a version 2 array, the
    /// lost members within the parity; for a zoned one, a copy of the
    /// prefix left (each zone's I/O checks its own set: `check_set`).
    pub(crate) fn check_tolerance(&self, offset: u64, length: u64) -> Result<(), DeviceError> {
        let too_many = if self.geometry.is_zoned() {
            self.usable_prefix_holders().is_empty()
        } else {
            self.lost_member_count() > self.geometry.parity_columns()
        };
        if too_many {
            return Err(self.too_many_lost(offset, length));
        }
        Ok(())
    }

    /// Ok while the members of `stripe` that cannot be read are within its
    /// parity.
    pub(crate) fn check_set(
        &self,
        stripe: &Stripe,
        offset: u64,
        length: u64,
    ) -> Result<(), DeviceError> {
        if self.unreadable_in(stripe.mask()) > stripe.parity_columns() {
            return Err(self.too_many_lost(offset, length));
        }
        Ok(())
    }
}

/// A member index from a label.
pub(crate) fn to_index(index: u32) -> usize {
    usize::try_from(index).expect("member indexes fit in usize")
}

/// A member index for a label.
pub(crate) fn to_label_index(index: usize) -> u32 {
    u32::try_from(index).expect("member indexes fit in u32")
}

/// Writes `label` to its two places on `device` and flushes it.
pub(crate) async fn write_label(
    device: &dyn BlockDevice,
    label: &MemberLabel,
) -> Result<(), DeviceError> {
    let block = Arc::new(AlignedBuffer::from_slice_padded(&label.encode()));
    device
        .write(LABEL_BLOCK * BLOCK_SIZE_BYTES, block.clone())
        .await?;
    device
        .write(LABEL_COPY_BLOCK * BLOCK_SIZE_BYTES, block)
        .await?;
    device.flush().await
}

#[async_trait::async_trait]
impl BlockDevice for RedundantArray {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        self.geometry.size_blocks() * BLOCK_SIZE_BYTES
    }

    fn read(&self, offset: u64, length: usize) -> lamina_device::DeviceReadFuture<'_> {
        lamina_device::DeviceReadFuture::from_or_box(async move {
            lamina_device::check_request(&self.name, self.size_bytes(), offset, length as u64)?;
            self.read_range(offset, length).await
        })
    }

    async fn write(&self, offset: u64, data: Arc<AlignedBuffer>) -> Result<(), DeviceError> {
        lamina_device::check_request(&self.name, self.size_bytes(), offset, data.len() as u64)?;
        self.write_range(offset, &data).await
    }

    async fn flush(&self) -> Result<(), DeviceError> {
        // A replacement is flushed too: rows written to it count as rebuilt.
        if let Some((index, replacement)) = self.replacing()
            && let Err(error) = replacement.device.flush().await
        {
            self.replacement_failed(index, &error);
        }
        self.flush_members_and_labels().await
    }

    async fn recover_block(
        &self,
        offset: u64,
        is_valid: BlockCheck<'_>,
    ) -> Result<Option<AlignedBuffer>, DeviceError> {
        lamina_device::check_request(&self.name, self.size_bytes(), offset, BLOCK_SIZE_BYTES)?;
        self.recover(offset / BLOCK_SIZE_BYTES, is_valid).await
    }

    async fn recover_range(
        &self,
        offset: u64,
        length: usize,
        is_valid: BlockCheck<'_>,
    ) -> Result<Option<AlignedBuffer>, DeviceError> {
        lamina_device::check_request(&self.name, self.size_bytes(), offset, length as u64)?;
        let first_block = offset / BLOCK_SIZE_BYTES;
        let end_block = first_block + length as u64 / BLOCK_SIZE_BYTES;
        if end_block <= self.geometry.prefix_blocks {
            let member_offset = self.geometry.prefix_member_block(first_block) * BLOCK_SIZE_BYTES;
            return self.recover_copies(member_offset, length, is_valid).await;
        }
        if length as u64 == BLOCK_SIZE_BYTES {
            return self.recover(first_block, is_valid).await;
        }
        match self.striped_blocks(offset, length) {
            Some(blocks) => self.recover_striped_range(blocks, is_valid).await,
            None => Ok(None),
        }
    }

    async fn reconstruct_range(
        &self,
        offset: u64,
        length: usize,
        is_valid: BlockCheck<'_>,
    ) -> Result<Option<AlignedBuffer>, DeviceError> {
        lamina_device::check_request(&self.name, self.size_bytes(), offset, length as u64)?;
        match self.striped_blocks(offset, length) {
            Some(blocks) => self.reconstruct_striped_range(blocks, is_valid).await,
            None => Ok(None),
        }
    }

    async fn scrub_range(
        &self,
        offset: u64,
        length: u64,
        blocks: &dyn lamina_device::ScrubBlocks,
    ) -> Result<lamina_device::ScrubReport, DeviceError> {
        lamina_device::check_request(&self.name, self.size_bytes(), offset, length)?;
        self.scrub_striped(offset, length, blocks).await
    }

    async fn scrub_copies(
        &self,
        offset: u64,
        length: usize,
        is_valid: BlockCheck<'_>,
    ) -> Result<lamina_device::ScrubReport, DeviceError> {
        lamina_device::check_request(&self.name, self.size_bytes(), offset, length as u64)?;
        let first_block = offset / BLOCK_SIZE_BYTES;
        let end_block = first_block + length as u64 / BLOCK_SIZE_BYTES;
        if end_block > self.geometry.prefix_blocks {
            return Ok(lamina_device::ScrubReport::default());
        }
        let member_offset = self.geometry.prefix_member_block(first_block) * BLOCK_SIZE_BYTES;
        self.scrub_prefix_copies(member_offset, length, is_valid)
            .await
    }

    fn rebuild_pending(&self) -> bool {
        self.replacement_pending()
    }

    async fn rebuild_range(
        &self,
        offset: u64,
        length: u64,
        is_valid: PlacedBlockCheck<'_>,
    ) -> Result<RebuildReport, DeviceError> {
        lamina_device::check_request(&self.name, self.size_bytes(), offset, length)?;
        self.rebuild(offset, length, is_valid).await
    }

    async fn finish_rebuild(&self) -> Result<(), DeviceError> {
        self.finish().await
    }

    fn region_shape(&self, offset: u64, length: u64) -> Option<lamina_device::RegionShape> {
        self.shape_of_region(offset, length)
    }

    async fn open_region(
        &self,
        offset: u64,
        length: u64,
    ) -> Result<Option<lamina_device::RegionShape>, DeviceError> {
        self.open_zone(offset, length).await
    }

    async fn open_regions(
        &self,
        offsets: &[u64],
        length_bytes: u64,
    ) -> Result<Vec<Option<lamina_device::RegionShape>>, DeviceError> {
        self.open_zones(offsets, length_bytes).await
    }

    fn new_regions_redundant(&self) -> bool {
        self.narrowing_restores_redundancy()
    }

    fn has_redundancy(&self) -> bool {
        true
    }

    fn new_region_usable_bytes(&self, offset: u64, length: u64) -> Option<u64> {
        if !self.geometry.is_zoned() {
            return None;
        }
        self.zone_of_region(offset, length);
        Some(self.usable_bytes_of_new_zone())
    }

    async fn restore_metadata_redundancy(&self) -> Result<(), DeviceError> {
        match self.restore_prefix_redundancy().await {
            Ok(added) if !added.is_empty() => {
                tracing::warn!(array = %self.name, members = ?added, "mirrored metadata copied onto members in use");
                Ok(())
            }
            Ok(_) => Ok(()),
            Err(error) => Err(self.as_device_error(error, 0, 0)),
        }
    }
}

impl std::fmt::Debug for RedundantArray {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("RedundantArray")
            .field("name", &self.name)
            .field("geometry", &self.geometry)
            .finish_non_exhaustive()
    }
}
