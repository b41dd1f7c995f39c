//! Scrub: checks every column of every row that holds a live block, and
//! every copy of the metadata frames the device keeps in copies, and
//! rewrites what disagrees (`BlockDevice::scrub_range` and
//! `scrub_copies`: an array checks parity and copies, not only the data the
//! engine reads, so that a scrub that reports nothing unrepairable leaves
//! every row able to lose as many devices as its parity covers; a single
//! device checks each live block against its checksum). It owns its
//! progress counters, takes the state lock only to list the live blocks
//! and the segments in use and, for a block reported unrepairable, to check
//! that it is still live (`repair/live_list.rs`: a block the cleaner moved away
//! since the list was made is no damage), and asks the background budget
//! (`budget`) for each chunk it reads (by the live bytes in it), so that clients keep the device:
//! scrub has the smallest share of it. Checkpoint bodies and batch
//! summaries hold no live block of their own: after a scrub that repaired
//! anything, two base checkpoints are written, so that the bodies a reopen
//! reads are fresh rows with fresh parity.

mod fragments;
pub mod progress;

use fragments::{ChunkFragments, FragmentCheck};

use std::sync::Arc;
use std::sync::atomic::Ordering;

use lamina_device::{ScrubBlocks, ScrubReport};

use crate::error::{EngineError, IoError};
use crate::log::frame;
use crate::log::geometry::{
    CAPACITY_SLOT_COPY_BLOCKS, CAPACITY_SLOT_COPY_SIZE_BLOCKS, CHECKPOINT_SLOT_BLOCKS,
    CHECKPOINT_SLOT_SIZE_BLOCKS, FLUSH_MARKER_BLOCKS, SEGMENT_OPENINGS_AREA_BLOCKS,
    SEGMENT_OPENINGS_AREA_SIZE_BLOCKS, SUPERBLOCK_BLOCK, SUPERBLOCK_COPY_BLOCK,
};
use crate::log::{
    checkpoint::SLOT_MAGIC, marker::MARKER_MAGIC, openings::OPENINGS_MAGIC,
    superblock::SUPERBLOCK_MAGIC,
};
use crate::pool::space::SegmentState;
use crate::{BLOCK_BYTES, BLOCK_SIZE_BYTES};

use super::live_list::LiveList;
use crate::pool::budget::BackgroundWork;
use crate::pool::checkpoint::Checkpointer;
use crate::pool::core::Core;
use crate::pool::repair::scrub::progress::ScrubStatus;

/// Blocks of one scrub chunk at most: what one grant of the background
/// budget covers, cut at a row boundary of its segment.
pub const SCRUB_CHUNK_BLOCKS_MAX: u64 = 256;

/// A metadata frame kept in copies (an array's mirrored prefix): where, how
/// long its area is, and its magic.
#[derive(Clone, Copy, Debug)]
struct MetadataFrame {
    first_block: u64,
    area_blocks: u64,
    magic: u64,
    /// Every copy failing is damage (the superblock); otherwise the area
    /// may simply be unused (a slot or a record never written).
    required: bool,
}

/// One chunk of a segment in use: blocks `first_block..end_block`, of
/// which `live_blocks` are listed live.
#[derive(Clone, Copy, Debug)]
struct ScrubChunk {
    first_block: u64,
    end_block: u64,
    live_blocks: u64,
}

/// The live list as the device's scrub sees it, for one chunk: a listed
/// block is held and must match its checksum; a block fragments are packed
/// in is held too, so that its rows are checked and mended like any other,
/// and must hold what its live fragments hold (`fragments.rs`).
struct LiveBlocks<'a> {
    list: &'a LiveList,
    fragments: &'a ChunkFragments,
}

impl ScrubBlocks for LiveBlocks<'_> {
    fn is_held(&self, block_index: u64) -> bool {
        self.list.find(block_index).is_some() || self.list.is_packed(block_index)
    }

    fn is_valid(&self, block_index: u64, contents: &[u8]) -> bool {
        match self.list.find(block_index) {
            Some(mapping) => crate::log::batch::block_checksum(contents) == mapping.checksum,
            None => self.fragments.block_passes(block_index, contents),
        }
    }

    fn same_for_holder(&self, block_index: u64, first: &[u8], second: &[u8]) -> bool {
        if self.list.find(block_index).is_some() {
            return first == second;
        }
        self.list.same_live_fragments(block_index, first, second)
    }
}

/// One scrub of the pool, built with the pool it checks: the core whose
/// live blocks and metadata it reads (and flushes before it starts), and
/// on which it builds a checkpointer for the base checkpoints after it
/// repaired a body.
pub(in crate::pool) struct Scrub<'a> {
    core: &'a Arc<Core>,
}

impl<'a> Scrub<'a> {
    pub(in crate::pool) fn new(core: &'a Arc<Core>) -> Self {
        Self { core }
    }

    /// Scrubs the whole pool and returns what it found; refused while a
    /// scrub is running. Flushes first, so that every live block is on the
    /// device.
    pub(in crate::pool) async fn run(&self) -> Result<ScrubStatus, EngineError> {
        if !self.core.scrub().start() {
            return Err(EngineError::Io(IoError::ScrubRunning));
        }
        let result = self.scrub_all().await;
        self.core.scrub().finish();
        result.map(|()| self.core.scrub().status())
    }

    async fn scrub_all(&self) -> Result<(), EngineError> {
        self.core.flush().await?;
        self.scrub_metadata().await;
        let list = LiveList::take(self.core);
        let scrubber = self.core.scrub();
        scrubber.blocks_total.store(
            (list.mappings().len() + list.fragments().len()) as u64,
            Ordering::Relaxed,
        );
        for chunk in self.scrub_chunks(&list) {
            // Charged by the live bytes it checks, as reads of them were
            // before parity was checked: the budget paces scrub's progress.
            self.core
                .budget()
                .acquire(BackgroundWork::Scrub, chunk.live_blocks * BLOCK_SIZE_BYTES)
                .await;
            let fragments = FragmentCheck::new(self.core, &list)
                .establish(chunk.first_block, chunk.end_block)
                .await;
            let blocks = LiveBlocks {
                list: &list,
                fragments: &fragments,
            };
            let report = self.scrub_chunk(chunk, &blocks).await;
            self.count_scrubbed(&list, report);
            let whole_blocks = list.mappings_in(chunk.first_block, chunk.end_block).len();
            scrubber
                .blocks_scrubbed
                .fetch_add(whole_blocks as u64, Ordering::Relaxed);
            // A budget with credit and a device that answers at once would
            // not let other tasks run between chunks otherwise.
            tokio::task::yield_now().await;
        }
        self.refresh_checkpoints_after_repairs().await;
        Ok(())
    }

    async fn scrub_chunk(&self, chunk: ScrubChunk, blocks: &LiveBlocks<'_>) -> ScrubReport {
        let offset = chunk.first_block * BLOCK_SIZE_BYTES;
        let length = (chunk.end_block - chunk.first_block) * BLOCK_SIZE_BYTES;
        match self.core.device().scrub_range(offset, length, blocks).await {
            Ok(report) => report,
            Err(error) => {
                tracing::error!(%error, "scrub could not read live blocks");
                let live = blocks.list.mappings_in(chunk.first_block, chunk.end_block);
                ScrubReport {
                    rows_unrepairable: live.len() as u64,
                    unrepairable_blocks: live
                        .iter()
                        .map(|mapping| mapping.physical_block())
                        .collect(),
                    ..ScrubReport::default()
                }
            }
        }
    }

    /// Adds a chunk's findings to scrub's counters; a block reported
    /// unrepairable that died since the list was taken (a block of
    /// fragments: whose segment was freed since) is no damage.
    fn count_scrubbed(&self, list: &LiveList, report: ScrubReport) {
        let scrubber = self.core.scrub();
        scrubber
            .blocks_repaired
            .fetch_add(report.blocks_repaired, Ordering::Relaxed);
        scrubber
            .parity_repaired
            .fetch_add(report.parity_repaired, Ordering::Relaxed);
        scrubber
            .rows_checked
            .fetch_add(report.rows_checked, Ordering::Relaxed);
        for _ in 0..report.blocks_repaired {
            self.core.integrity().checksum_error_repaired();
        }
        for path in &report.members_faulted {
            tracing::error!(device = %path, "scrub faulted a device nearly all of whose columns were bad: its data is rebuilt from the other devices instead of repaired block by block; replace it (`lamina device replace`)");
        }
        scrubber
            .devices_faulted
            .fetch_add(report.members_faulted.len() as u64, Ordering::Relaxed);
        for block in report.unrepairable_blocks {
            let died = match list.find(block) {
                Some(mapping) => list.block_died(self.core, mapping),
                None if list.is_packed(block) => list.segment_freed_since(self.core, block),
                None => true,
            };
            if died {
                continue;
            }
            tracing::error!(
                physical_block = block,
                "scrub found a block that fails its checksum and cannot be rebuilt"
            );
            self.core.integrity().read_checksum_error();
            scrubber.blocks_unrepairable.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Blocks in a row of segment `segment_index` as the device lays it
    /// out (1 on a device without rows).
    fn row_blocks(&self, segment_index: u32) -> u64 {
        let geometry = self.core.geometry();
        let first = geometry.segment_first_block(segment_index);
        self.core
            .device()
            .region_shape(
                first * BLOCK_SIZE_BYTES,
                geometry.segment_size_blocks * BLOCK_SIZE_BYTES,
            )
            .map_or(1, |shape| (shape.row_bytes / BLOCK_SIZE_BYTES).max(1))
    }

    /// Every segment in use, in chunks of at most
    /// [`SCRUB_CHUNK_BLOCKS_MAX`] blocks cut at its row boundaries, that
    /// hold a live block.
    fn scrub_chunks(&self, list: &LiveList) -> Vec<ScrubChunk> {
        let geometry = self.core.geometry();
        let in_use: Vec<u32> = {
            let state = self.core.lock();
            state
                .space()
                .segments()
                .iter()
                .enumerate()
                .filter(|(_, segment)| segment.state != SegmentState::Free)
                .map(|(index, _)| u32::try_from(index).expect("segment indexes fit in u32"))
                .collect()
        };
        let mut chunks = Vec::new();
        for index in in_use {
            let first = geometry.segment_first_block(index);
            let end = first + geometry.segment_size_blocks;
            let row_blocks = self.row_blocks(index);
            let step = (SCRUB_CHUNK_BLOCKS_MAX / row_blocks).max(1) * row_blocks;
            let mut chunk_first = first;
            while chunk_first < end {
                let chunk_end = end.min(chunk_first + step);
                let live_blocks = list.count_in(chunk_first, chunk_end);
                if live_blocks > 0 {
                    chunks.push(ScrubChunk {
                        first_block: chunk_first,
                        end_block: chunk_end,
                        live_blocks,
                    });
                }
                chunk_first = chunk_end;
            }
        }
        chunks
    }

    /// Checks every copy of each metadata frame the device keeps in
    /// copies and rewrites the copies that fail from one that passes.
    async fn scrub_metadata(&self) {
        let scrubber = self.core.scrub();
        for frame in self.metadata_frames() {
            let offset = frame.first_block * BLOCK_SIZE_BYTES;
            let length =
                usize::try_from(frame.area_blocks).expect("an area fits in memory") * BLOCK_BYTES;
            let magic = frame.magic;
            let check = move |contents: &[u8]| frame::is_whole(magic, contents);
            match self
                .core
                .device()
                .scrub_copies(offset, length, &check)
                .await
            {
                Ok(report) => {
                    scrubber
                        .parity_repaired
                        .fetch_add(report.parity_repaired, Ordering::Relaxed);
                    if frame.required && report.rows_unrepairable > 0 {
                        tracing::error!(
                            block = frame.first_block,
                            "scrub: no copy of the superblock passes its checks"
                        );
                        scrubber.blocks_unrepairable.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Err(error) => {
                    tracing::error!(%error, block = frame.first_block, "scrub could not read the metadata's copies");
                }
            }
        }
    }

    /// The frames kept in copies: the flash tier's fixed metadata and, in a
    /// two-tier pool, the capacity label and slot copies.
    fn metadata_frames(&self) -> Vec<MetadataFrame> {
        let frame = |first_block, area_blocks, magic, required| MetadataFrame {
            first_block,
            area_blocks,
            magic,
            required,
        };
        let mut frames = vec![
            frame(SUPERBLOCK_BLOCK, 1, SUPERBLOCK_MAGIC, true),
            frame(SUPERBLOCK_COPY_BLOCK, 1, SUPERBLOCK_MAGIC, true),
        ];
        frames.extend(FLUSH_MARKER_BLOCKS.map(|block| frame(block, 1, MARKER_MAGIC, false)));
        frames.extend(
            CHECKPOINT_SLOT_BLOCKS
                .map(|block| frame(block, CHECKPOINT_SLOT_SIZE_BLOCKS, SLOT_MAGIC, false)),
        );
        frames.extend(SEGMENT_OPENINGS_AREA_BLOCKS.map(|block| {
            frame(
                block,
                SEGMENT_OPENINGS_AREA_SIZE_BLOCKS,
                OPENINGS_MAGIC,
                false,
            )
        }));
        let geometry = self.core.geometry();
        if geometry.has_capacity_tier() {
            let start = geometry.capacity_start_block;
            frames.push(frame(start, 1, SUPERBLOCK_MAGIC, true));
            frames.push(frame(
                start + SUPERBLOCK_COPY_BLOCK,
                1,
                SUPERBLOCK_MAGIC,
                true,
            ));
            frames.extend(CAPACITY_SLOT_COPY_BLOCKS.map(|block| {
                frame(
                    start + block,
                    CAPACITY_SLOT_COPY_SIZE_BLOCKS,
                    SLOT_MAGIC,
                    false,
                )
            }));
        }
        frames
    }

    /// After a scrub that rewrote anything: two base checkpoints, so that
    /// both kept checkpoints' bodies (which hold no live block a row check
    /// could vouch for) are written anew with fresh parity.
    async fn refresh_checkpoints_after_repairs(&self) {
        let status = self.core.scrub().status();
        if status.blocks_repaired == 0 && status.parity_repaired == 0 {
            return;
        }
        for _ in 0..2 {
            if let Err(error) = Checkpointer::new(self.core).checkpoint_base().await {
                tracing::warn!(%error, "scrub: the checkpoints after its repairs could not be written; the next ones will be");
                return;
            }
        }
    }
}
