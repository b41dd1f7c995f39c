//! Finding the batches newer than the checkpoint: which segments to probe
//! (those the segment openings record lists, or every segment when no record
//! covers the checkpoint), where in each to start walking its chain of
//! batches, and what the walks found (batches, damaged ranges, summaries
//! read from their copies).

use std::collections::HashSet;

use lamina_device::{AlignedBuffer, BlockDevice};

use super::superblock::read_metadata;
use crate::convert::{segment_index, to_usize};
use crate::error::EngineError;
use crate::log::batch::Summary;
use crate::log::chain;
use crate::log::checkpoint::Body;
use crate::log::geometry::{
    Geometry, SEGMENT_OPENINGS_AREA_BLOCKS, SEGMENT_OPENINGS_AREA_SIZE_BLOCKS,
};
use crate::log::openings::{OPENINGS_MAGIC, Opening, SegmentOpeningsRecord};
use crate::pool::openings::OpeningsList;
use crate::pool::space::segment_shapes::SegmentShapes;
use crate::{BLOCK_BYTES, BLOCK_SIZE_BYTES};

/// Segments whose first blocks are read concurrently while scanning.
pub(super) const SCAN_CONCURRENCY_MAX: usize = 64;

/// A batch found by the scan, with the device block of its summary.
pub(super) struct ScannedBatch {
    pub(super) summary: Summary,
    pub(super) summary_block: u64,
}

/// Blocks of a segment written after the checkpoint whose batch lost both
/// copies of its summary, with the sequence of the batch that follows them in
/// the segment (the lost batch's is lower).
pub(super) struct ScannedDamage {
    pub(super) segment_index: u32,
    pub(super) range: chain::DamagedRange,
    pub(super) next_batch_sequence: u64,
}

/// What the scan found: batches sorted by sequence, damaged ranges, how
/// many summaries were read from their copies, and the incarnation each
/// probed segment starts with.
pub(super) struct ScannedLog {
    pub(super) batches: Vec<ScannedBatch>,
    pub(super) damaged: Vec<ScannedDamage>,
    pub(super) summaries_repaired: u64,
    pub(super) probed: Vec<Opening>,
    pub(super) probed_segment_count: usize,
}

impl ScannedLog {
    /// Adds what a walk of segment `segment_index` (starting at device block
    /// `first_block`) found.
    fn add_walk(&mut self, segment_index: u32, first_block: u64, chain: chain::Chain) {
        for damaged in &chain.damaged {
            let next_batch_sequence = chain
                .batches
                .iter()
                .find(|batch| batch.block_in_segment > damaged.first_block_in_segment)
                .map_or(0, |batch| batch.summary.batch_sequence);
            self.damaged.push(ScannedDamage {
                segment_index,
                range: *damaged,
                next_batch_sequence,
            });
        }
        for batch in chain.batches {
            self.summaries_repaired += u64::from(batch.from_copy);
            self.batches.push(ScannedBatch {
                summary_block: first_block + u64::from(batch.block_in_segment),
                summary: batch.summary,
            });
        }
    }
}

/// A segment on the device, as a chain walk reads it.
pub(super) struct DeviceSegment<'a> {
    device: &'a dyn BlockDevice,
    first_block: u64,
}

impl chain::SegmentBlocks for DeviceSegment<'_> {
    type Error = lamina_device::DeviceError;

    async fn read_blocks(
        &mut self,
        first_block_in_segment: u32,
        block_count: u32,
    ) -> Result<Vec<u8>, Self::Error> {
        let offset = (self.first_block + u64::from(first_block_in_segment)) * BLOCK_SIZE_BYTES;
        let bytes = self
            .device
            .read(offset, block_count as usize * BLOCK_BYTES)
            .await?;
        Ok(bytes.to_vec())
    }
}

/// The segment openings record found at open, whether an area was found
/// damaged, and the number the next record takes.
pub(super) struct OpeningsFound {
    pub(super) newest: Option<SegmentOpeningsRecord>,
    pub(super) damaged: bool,
    pub(super) next_record_sequence: u64,
}

/// The newest segment openings record of this pool (format version 8), if
/// an area holds one that verifies (a damaged area is read from another
/// copy on a device with redundancy). An area that holds neither a record
/// of this pool nor zeros (never written) is damaged: torn by the crash, or
/// rotted, and then it may have been the newest record, so the other one
/// cannot be trusted to list every segment.
pub(super) async fn read_openings_record(
    device: &dyn BlockDevice,
    pool_identifier: u128,
) -> OpeningsFound {
    let mut records = Vec::new();
    let mut damaged = false;
    for area in SEGMENT_OPENINGS_AREA_BLOCKS {
        match read_openings_area(device, area).await {
            Ok(bytes) => match SegmentOpeningsRecord::decode(&bytes) {
                Ok(record) if record.pool_identifier == pool_identifier => records.push(record),
                _ => damaged |= bytes[..BLOCK_BYTES].iter().any(|byte| *byte != 0),
            },
            Err(error) => {
                tracing::warn!(area, %error, "reading the segment openings record failed");
                damaged = true;
            }
        }
    }
    let newest = records
        .into_iter()
        .max_by_key(|record| record.record_sequence);
    let next_record_sequence = newest
        .as_ref()
        .map_or(1, |record| record.record_sequence + 1);
    OpeningsFound {
        newest,
        damaged,
        next_record_sequence,
    }
}

/// One area of the segment openings record: its first block, and the rest
/// of the frame when its header says it is longer.
pub(super) async fn read_openings_area(
    device: &dyn BlockDevice,
    area_block: u64,
) -> Result<AlignedBuffer, EngineError> {
    let offset = area_block * BLOCK_SIZE_BYTES;
    let area_bytes = to_usize(SEGMENT_OPENINGS_AREA_SIZE_BLOCKS * BLOCK_SIZE_BYTES);
    let first = device.read(offset, BLOCK_BYTES).await?;
    let decodes = |bytes: &[u8]| SegmentOpeningsRecord::decode(bytes).is_ok();
    let length = match crate::log::frame::peek_header(OPENINGS_MAGIC, &first) {
        Ok((_, payload_bytes)) => (crate::log::frame::FRAME_HEADER_BYTES + payload_bytes)
            .next_multiple_of(BLOCK_BYTES)
            .min(area_bytes),
        Err(_) => BLOCK_BYTES,
    };
    if length == BLOCK_BYTES && decodes(&first) {
        return Ok(first);
    }
    read_metadata(device, offset, length, &decodes).await
}

/// Which segments the scan probes (block 0 of each, then a walk of those
/// holding batches newer than the checkpoint).
pub(super) enum ScanScope {
    /// The heads the checkpoint recorded and the segments the openings
    /// record lists: it lists every segment opened since the checkpoint.
    Listed { record: SegmentOpeningsRecord },
    /// Every segment not holding a kept body: no record that covers the
    /// checkpoint (a version 7 pool, both areas damaged, an overflowed list).
    Whole,
}

impl ScanScope {
    pub(super) fn choose(
        geometry: &Geometry,
        body: &Body,
        found: &OpeningsFound,
        name: &str,
    ) -> Self {
        if found.damaged {
            tracing::warn!(
                device = %name,
                "an area of the segment openings record is damaged (torn by the crash, or rotted): every segment is scanned"
            );
            return Self::Whole;
        }
        let Some(record) = &found.newest else {
            tracing::info!(device = %name, "no segment openings record: every segment is scanned");
            return Self::Whole;
        };
        let within_pool = record
            .openings
            .iter()
            .all(|opening| u64::from(opening.segment_index) < geometry.segment_count);
        if within_pool && record.covers(body.next_segment_sequence) {
            return Self::Listed {
                record: record.clone(),
            };
        }
        tracing::warn!(
            device = %name,
            overflowed = record.overflowed,
            floor = record.floor_segment_sequence,
            checkpoint_next_segment_sequence = body.next_segment_sequence,
            within_pool,
            "the segment openings record does not cover the checkpoint: every segment is scanned"
        );
        Self::Whole
    }

    pub(super) fn is_whole(&self) -> bool {
        matches!(self, Self::Whole)
    }

    /// The segments to probe, in index order.
    fn candidates(&self, geometry: &Geometry, held: &HashSet<u32>, body: &Body) -> Vec<u32> {
        let mut candidates: Vec<u32> = match self {
            Self::Whole => (0..segment_index(geometry.segment_count)).collect(),
            Self::Listed { record } => body
                .heads
                .iter()
                .map(|head| head.segment_index)
                .chain(record.openings.iter().map(|opening| opening.segment_index))
                .filter(|index| u64::from(*index) < geometry.segment_count)
                .collect(),
        };
        candidates.sort_unstable();
        candidates.dedup();
        candidates.retain(|index| !held.contains(index));
        candidates
    }

    /// At most the older kept checkpoint's `next_segment_sequence`: the
    /// record's floor (it was built while that checkpoint was durable),
    /// else 0.
    pub(super) fn older_floor(&self) -> u64 {
        match self {
            Self::Listed { record } => record.floor_segment_sequence,
            Self::Whole => 0,
        }
    }

    /// The openings this run's records go on listing: those the record
    /// listed and the incarnations the probes met, from `floor` on.
    pub(super) fn openings_to_keep(&self, probed: &[Opening], floor: u64) -> OpeningsList {
        let listed = match self {
            Self::Listed { record } => &record.openings[..],
            Self::Whole => &[],
        };
        let openings = probed
            .iter()
            .chain(listed)
            .filter(|opening| opening.segment_sequence >= floor)
            .copied()
            .collect();
        OpeningsList::starting_with(openings)
    }
}

/// Where the scan walks a segment from.
pub(super) struct WalkStart {
    segment_index: u32,
    first_block: u32,
    segment_sequence: u64,
}

/// Every valid batch that may be newer than the checkpoint.
pub(super) async fn scan_log(
    device: &dyn BlockDevice,
    shapes: &SegmentShapes,
    held: &HashSet<u32>,
    body: &Body,
    scope: &ScanScope,
) -> Result<ScannedLog, EngineError> {
    let candidates = scope.candidates(shapes.geometry(), held, body);
    let probes = walk_starts(device, shapes, &candidates, body).await?;
    let mut scanned = walk_segments(device, shapes, &probes.starts).await?;
    scanned.probed = probes.probed;
    scanned.probed_segment_count = candidates.len();
    scanned
        .batches
        .sort_by_key(|batch| batch.summary.batch_sequence);
    scanned
        .batches
        .dedup_by_key(|batch| batch.summary.batch_sequence);
    Ok(scanned)
}

/// What probing the candidates found: where to walk, and each probed
/// segment's first incarnation.
pub(super) struct Probes {
    starts: Vec<WalkStart>,
    probed: Vec<Opening>,
}

/// Where to walk each candidate segment from, probing the first blocks of
/// [`SCAN_CONCURRENCY_MAX`] segments at a time.
pub(super) async fn walk_starts(
    device: &dyn BlockDevice,
    shapes: &SegmentShapes,
    candidates: &[u32],
    body: &Body,
) -> Result<Probes, EngineError> {
    let geometry = shapes.geometry();
    let mut starts: Vec<WalkStart> = Vec::new();
    let mut probed = Vec::new();
    for group in candidates.chunks(SCAN_CONCURRENCY_MAX) {
        let probes = group.iter().map(|index| async move {
            let mut source = DeviceSegment {
                device,
                first_block: geometry.segment_first_block(*index),
            };
            chain::first_incarnation(&mut source, shapes.shape(*index)).await
        });
        for (index, result) in group.iter().zip(futures::future::join_all(probes).await) {
            let first_incarnation = result?;
            if let Some(segment_sequence) = first_incarnation {
                probed.push(Opening {
                    segment_index: *index,
                    segment_sequence,
                });
            }
            starts.extend(walk_start(*index, first_incarnation, body));
        }
    }
    Ok(Probes { starts, probed })
}

/// Where to walk segment `segment_index` from, given the segment sequence of
/// its first batch (if it has one). A segment whose first batch is of an
/// incarnation newer than the checkpoint is walked from block 0; otherwise, a
/// head the checkpoint recorded is walked from where the checkpoint left it.
/// (A recorded head may have been freed and reused since, when recovery falls
/// back to an older checkpoint: its new incarnation wins.) Other segments
/// hold nothing newer than the checkpoint.
pub(super) fn walk_start(
    segment_index: u32,
    first_incarnation: Option<u64>,
    body: &Body,
) -> Option<WalkStart> {
    match first_incarnation {
        Some(segment_sequence) if segment_sequence >= body.next_segment_sequence => {
            Some(WalkStart {
                segment_index,
                first_block: 0,
                segment_sequence,
            })
        }
        _ => body
            .heads
            .iter()
            .find(|head| head.segment_index == segment_index)
            .map(|head| WalkStart {
                segment_index: head.segment_index,
                first_block: head.next_block_in_segment,
                segment_sequence: head.segment_sequence,
            }),
    }
}

/// Walks every segment from its start, all at once, and gathers what the
/// walks found (batches in no particular order).
pub(super) async fn walk_segments(
    device: &dyn BlockDevice,
    shapes: &SegmentShapes,
    starts: &[WalkStart],
) -> Result<ScannedLog, EngineError> {
    let geometry = shapes.geometry();
    let walks = starts.iter().map(|start| async move {
        let mut source = DeviceSegment {
            device,
            first_block: geometry.segment_first_block(start.segment_index),
        };
        let chain = chain::walk(
            &mut source,
            shapes.shape(start.segment_index),
            start.first_block,
            Some(start.segment_sequence),
        )
        .await;
        (start.segment_index, source.first_block, chain)
    });
    let mut scanned = ScannedLog {
        batches: Vec::new(),
        damaged: Vec::new(),
        summaries_repaired: 0,
        probed: Vec::new(),
        probed_segment_count: 0,
    };
    for (segment_index, first_block, result) in futures::future::join_all(walks).await {
        scanned.add_walk(segment_index, first_block, result?);
    }
    Ok(scanned)
}
