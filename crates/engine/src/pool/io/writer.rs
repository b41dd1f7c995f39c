//! The log writer: the log heads (one segment per stream being appended
//! to), the open batches being filled, the sealed batches in flight to the
//! device, and the sequences that say what is sealed, written and durable.
//! It turns an open batch into bytes (summary first and last, format version
//! 5) and serves reads of blocks that have not reached the device. It never
//! waits on I/O and knows nothing of volumes; the space allocator gives it
//! segments.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use lamina_device::{AlignedBuffer, LARGE_RECYCLED_BUFFER_BYTES_MAX};

use crate::convert::to_usize;
use crate::error::{EngineError, IoError};
use crate::log::batch::{
    BATCH_DATA_BLOCKS_MAX, BATCH_OVERHEAD_BLOCKS, Record, SUMMARY_RECORD_BYTES_MAX, Summary,
};
use crate::log::chain::{BATCH_TAIL_BLOCKS_MAX, SegmentShape};
use crate::log::data_layout::{DataLayout, Placement};
use crate::log::geometry::{DEFAULT_SEGMENT_SIZE_BYTES, SEGMENT_SIZE_BLOCKS_MIN};
use crate::log::location::{Location, UNIT_BYTES};
use crate::{BLOCK_BYTES, BLOCK_SIZE_BYTES};

use super::stream::{OPEN_BATCH_COUNT, RELOCATION_STREAMS, STREAM_COUNT, Stream, lane_of};
use crate::pool::space::LogProgress;
use crate::pool::space::segment_shapes::SegmentShapes;

// The longest batch recovery's walk expects after a summary (its data and the
// summary's copy) is the longest batch the writer lays out.
const _: () = assert!(
    BATCH_TAIL_BLOCKS_MAX as usize + 1 == BATCH_DATA_BLOCKS_MAX + BATCH_OVERHEAD_BLOCKS as usize
);
// An empty segment of the smallest size has room for a batch of one data
// block, so that a new log head can always take the write it was opened for.
const _: () = assert!(SEGMENT_SIZE_BLOCKS_MIN > BATCH_OVERHEAD_BLOCKS as u64);
// A full batch fits in a segment of the default size, so that batches reach
// their full size there.
const _: () = assert!(
    DEFAULT_SEGMENT_SIZE_BYTES / BLOCK_SIZE_BYTES
        >= (BATCH_DATA_BLOCKS_MAX + BATCH_OVERHEAD_BLOCKS as usize) as u64
);
// A full batch's buffer is of a size the device layer recycles, so that
// opening a batch reuses one written earlier instead of clearing a new one.
const _: () = assert!(
    (BATCH_DATA_BLOCKS_MAX + BATCH_OVERHEAD_BLOCKS as usize) * BLOCK_BYTES
        <= LARGE_RECYCLED_BUFFER_BYTES_MAX
);

#[derive(Clone, Copy, Debug)]
pub struct Head {
    pub segment_index: u32,
    pub segment_sequence: u64,
    pub next_block_in_segment: u32,
    /// The segment's size and row as laid out when it was opened (a
    /// segment on an array narrowed after a loss holds fewer blocks).
    pub shape: SegmentShape,
}

impl Head {
    /// Whether the segment still has room for a batch of one data block (its
    /// summary, the block and the summary's copy).
    pub fn has_room_for_a_data_block(&self) -> bool {
        self.next_block_in_segment + BATCH_OVERHEAD_BLOCKS < self.shape.size_blocks
    }
}

/// A batch being filled. Its sequence is given when it is sealed: with
/// several batches open at once, sealing order is replay order.
pub struct OpenBatch {
    stream: Stream,
    segment_index: u32,
    segment_sequence: u64,
    block_in_segment: u32,
    /// Device block of the summary; data block `k` is at `summary_block + 1 + k`.
    summary_block: u64,
    records: Vec<Record>,
    record_bytes: usize,
    /// Block 0 is reserved for the summary, then the data region, then room
    /// for the summary's copy.
    buffer: AlignedBuffer,
    /// Where the data region's whole blocks and fragments go (decision 0070).
    layout: DataLayout,
    data_capacity: usize,
    /// The (volume, logical block) pairs its `Data` records write.
    data_blocks: HashSet<(u32, u64)>,
    /// Whether it holds a record without data (trim, snapshot, volume change).
    has_records_without_data: bool,
}

impl OpenBatch {
    /// The stream whose head it is appended to.
    pub fn stream(&self) -> Stream {
        self.stream
    }

    /// The segment it is written into.
    pub fn segment_index(&self) -> u32 {
        self.segment_index
    }

    /// Whether `record`, appended to another open batch, may not commute
    /// with what this one holds, so that this one must be sealed (and
    /// replayed) first. `Data` records for different blocks commute, and a
    /// relocation commutes with anything (it only renames a block wherever it
    /// is still held, and the block it moves cannot be in an open batch);
    /// records without data are taken to conflict with everything.
    pub fn conflicts_with(&self, record: &Record) -> bool {
        if self.records.is_empty() {
            return false;
        }
        match record {
            Record::Data {
                volume_id,
                logical_block,
                ..
            }
            | Record::Packed {
                volume_id,
                logical_block,
                ..
            } => {
                self.has_records_without_data
                    || self.data_blocks.contains(&(*volume_id, *logical_block))
            }
            Record::Relocate { .. } | Record::RelocatePacked { .. } => false,
            _ => true,
        }
    }

    /// Whether `record` (and its data block or fragment, if it carries one) fits.
    pub fn has_room_for(&self, record: &Record) -> bool {
        self.record_bytes + record.encoded_bytes_max() <= SUMMARY_RECORD_BYTES_MAX
            && self.layout.block_count_after(record.data_kind()) as usize <= self.data_capacity
    }

    /// Adds a record without data, or with its data block through
    /// [`OpenBatch::append_block`].
    pub fn push(&mut self, record: Record) {
        self.record_bytes += record.encoded_bytes_max();
        match &record {
            Record::Data {
                volume_id,
                logical_block,
                ..
            }
            | Record::Packed {
                volume_id,
                logical_block,
                ..
            } => {
                self.data_blocks.insert((*volume_id, *logical_block));
            }
            Record::Relocate { .. } | Record::RelocatePacked { .. } => {}
            _ => self.has_records_without_data = true,
        }
        self.records.push(record);
    }
}

/// A sealed batch on its way to the device; reads of its blocks are served from
/// its buffer until the write completes.
pub struct InFlightBatch {
    pub sequence: u64,
    pub summary_block: u64,
    pub buffer: Arc<AlignedBuffer>,
    /// The segment sequence of the segment this batch is the first of:
    /// its write completes only once the segment openings record lists it
    /// (`pool::openings`). `None` for later batches of a segment.
    pub opens_segment: Option<u64>,
}

impl InFlightBatch {
    pub fn block_count(&self) -> u64 {
        self.buffer.len() as u64 / BLOCK_SIZE_BYTES
    }

    /// Paired check before the write (the walk checks after reading): the
    /// summary decodes, names this batch, and its copy in the last block is
    /// the same bytes. Called by the batch's write task, outside the state
    /// lock: one decode of one block per batch.
    pub fn check_summary(&self) {
        let block = BLOCK_BYTES;
        let summary = Summary::decode(&self.buffer[..block]).unwrap_or_else(|error| {
            panic!(
                "batch {}: its summary does not decode: {error}",
                self.sequence
            )
        });
        assert_eq!(
            summary.batch_sequence, self.sequence,
            "a summary names its own batch"
        );
        assert!(
            self.buffer[self.buffer.len() - block..] == self.buffer[..block],
            "batch {}: the summary's copy differs from the summary",
            self.sequence
        );
    }
}

impl OpenBatch {
    /// Appends `record` with its 4 KiB data block; returns the block's address.
    pub fn append_block(&mut self, record: Record, data: &[u8]) -> u64 {
        assert_eq!(data.len(), BLOCK_BYTES);
        assert!(record.carries_data() && self.has_room_for(&record));
        let Placement::WholeBlock { data_index } = self.layout.place_whole_block() else {
            unreachable!("a whole block is placed as one");
        };
        let block = BLOCK_BYTES;
        let start = (1 + data_index as usize) * block;
        self.buffer[start..start + block].copy_from_slice(data);
        self.push(record);
        self.summary_block + 1 + u64::from(data_index)
    }

    /// Appends `record` (a `Packed` or `RelocatePacked` record) with its
    /// fragment (whole units, zero-padded, as `log::fragment` encodes it);
    /// returns the fragment's location.
    pub fn append_fragment(&mut self, record: Record, fragment: &[u8]) -> Location {
        let unit_count = u32::from(record.fragment_unit_count().expect("a fragment's record"));
        assert_eq!(fragment.len(), unit_count as usize * UNIT_BYTES);
        assert!(self.has_room_for(&record));
        let blocks_before = self.layout.block_count();
        let Placement::Fragment {
            data_index,
            unit_offset,
            ..
        } = self.layout.place_fragment(unit_count)
        else {
            unreachable!("a fragment is placed as one");
        };
        // Blocks the region just took start as zeros: unused units are zero
        // (the format), and a recycled buffer holds an earlier batch's bytes.
        let block = BLOCK_BYTES;
        let new_blocks =
            (1 + blocks_before as usize) * block..(1 + self.layout.block_count() as usize) * block;
        self.buffer[new_blocks].fill(0);
        let start = (1 + data_index as usize) * block + unit_offset as usize * UNIT_BYTES;
        self.buffer[start..start + fragment.len()].copy_from_slice(fragment);
        self.push(record);
        Location::fragment(
            self.summary_block + 1 + u64::from(data_index),
            unit_offset,
            unit_count,
        )
    }
}

/// A batch just sealed: what the segment table, the placement and the
/// counters must learn of it.
pub struct SealedBatch {
    pub in_flight: Arc<InFlightBatch>,
    pub stream: Stream,
    pub segment_index: u32,
    pub block_count: u32,
    /// Whether its head segment has no room for another batch.
    pub head_full: bool,
}

/// Heads, open batches, batches in flight and the log's sequences.
pub struct LogWriter {
    /// How each segment is laid out (its size and row).
    shapes: SegmentShapes,
    /// Log heads, indexed by [`Stream`].
    heads: [Option<Head>; STREAM_COUNT],
    /// Per lane ([`lane_of`]): the main batch (any stream but the two below),
    /// the cold client batch and the warm client batch.
    open_batches: [Option<OpenBatch>; OPEN_BATCH_COUNT],
    /// Sealed batches not yet written, by summary block.
    in_flight: BTreeMap<u64, Arc<InFlightBatch>>,
    in_flight_sequences: BTreeSet<u64>,
    next_batch_sequence: u64,
    next_segment_sequence: u64,
    sealed_through: u64,
    /// Every batch through here is durable, on either tier: what the log's
    /// claims (summaries, flush markers) and the reuse of dead segments
    /// follow. The lower of the two below.
    durable_through: u64,
    /// Every batch through here that lies on the flash tier (all of a
    /// one-tier pool) is durable: client data and control records, which
    /// only flash holds, so what a client's flush waits for.
    flash_durable_through: u64,
    /// Batches sealed on the capacity tier (`Stream::Capacity`: demotions
    /// and moves within capacity) that no capacity flush has covered yet.
    capacity_unflushed: BTreeSet<u64>,
    /// Why the pool refuses writes, once a batch write failed.
    failed: Option<String>,
    /// The `flushed_through_sequence` each sealed batch's summary says, kept
    /// until every batch through it has been written.
    unwritten_claims: BTreeMap<u64, u64>,
    /// The highest flush claim in a summary that is on the device along with
    /// every batch sealed before it (decision 0069): what the log itself
    /// vouches for, so that a flush marker saying no more need not be
    /// written.
    claims_written: u64,
}

impl LogWriter {
    pub fn new(shapes: SegmentShapes) -> Self {
        Self {
            shapes,
            heads: [None; STREAM_COUNT],
            open_batches: Default::default(),
            in_flight: BTreeMap::new(),
            in_flight_sequences: BTreeSet::new(),
            next_batch_sequence: 1,
            next_segment_sequence: 1,
            sealed_through: 0,
            durable_through: 0,
            flash_durable_through: 0,
            capacity_unflushed: BTreeSet::new(),
            failed: None,
            unwritten_claims: BTreeMap::new(),
            claims_written: 0,
        }
    }

    /// Continues the log after recovery: the next batch is `next_batch_sequence`
    /// and everything before it counts as sealed and durable.
    pub fn resume(&mut self, next_batch_sequence: u64, next_segment_sequence: u64) {
        assert!(self.in_flight.is_empty() && self.heads.iter().all(Option::is_none));
        assert!(next_batch_sequence >= 1 && next_segment_sequence >= 1);
        self.next_batch_sequence = next_batch_sequence;
        self.next_segment_sequence = next_segment_sequence;
        self.sealed_through = next_batch_sequence - 1;
        self.durable_through = self.sealed_through;
        self.flash_durable_through = self.sealed_through;
    }

    pub fn sealed_through(&self) -> u64 {
        self.sealed_through
    }

    pub fn durable_through(&self) -> u64 {
        self.durable_through
    }

    /// The sequence the next sealed batch takes.
    pub fn next_batch_sequence(&self) -> u64 {
        self.next_batch_sequence
    }

    pub fn next_segment_sequence(&self) -> u64 {
        self.next_segment_sequence
    }

    /// Every batch on flash through `sequence` is durable: what a client's
    /// flush needs (client data is never written to capacity).
    pub fn flash_durable_through(&self) -> u64 {
        self.flash_durable_through
    }

    /// A flush of the whole device made every batch through `sequence` durable.
    pub fn durable_through_advanced(&mut self, sequence: u64) {
        self.flash_flushed(sequence);
        self.capacity_flushed(sequence);
    }

    /// A flush of the flash tier made its batches through `sequence` durable.
    pub fn flash_flushed(&mut self, sequence: u64) {
        assert!(sequence <= self.written_through(), "durable before written");
        self.flash_durable_through = self.flash_durable_through.max(sequence);
        self.advance_durable_through();
    }

    /// A flush of the capacity tier made its batches through `sequence`
    /// durable.
    pub fn capacity_flushed(&mut self, sequence: u64) {
        assert!(sequence <= self.written_through(), "durable before written");
        self.capacity_unflushed = self.capacity_unflushed.split_off(&(sequence + 1));
        self.advance_durable_through();
    }

    /// Whether a batch on the capacity tier waits for a capacity flush.
    pub fn capacity_has_unflushed_batches(&self) -> bool {
        !self.capacity_unflushed.is_empty()
    }

    /// The log is durable through the flash tier's durable point, or to just
    /// before the oldest capacity batch no capacity flush has covered.
    fn advance_durable_through(&mut self) {
        let capacity_durable_through = self
            .capacity_unflushed
            .first()
            .map_or(u64::MAX, |oldest| oldest - 1);
        self.durable_through = self
            .durable_through
            .max(self.flash_durable_through.min(capacity_durable_through));
    }

    /// Batches up to this sequence have completed their device writes.
    pub fn written_through(&self) -> u64 {
        match self.in_flight_sequences.first() {
            Some(oldest) => oldest - 1,
            None => self.sealed_through,
        }
    }

    pub fn check_failed(&self) -> Result<(), EngineError> {
        match &self.failed {
            Some(reason) => Err(EngineError::Io(IoError::Failed(reason.clone()))),
            None => Ok(()),
        }
    }

    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// Refuses further writes (the first reason is kept).
    pub fn fail(&mut self, reason: String) {
        self.failed.get_or_insert(reason);
    }

    /// Whether records wait in an open batch.
    pub fn has_unsealed_records(&self) -> bool {
        self.open_batches
            .iter()
            .flatten()
            .any(|batch| !batch.records.is_empty())
    }

    /// The log's position as the space allocator needs it.
    pub fn progress(&self) -> LogProgress {
        LogProgress {
            sealed_through: self.sealed_through,
            durable_through: self.durable_through,
            open_lanes: self.open_batches.each_ref().map(Option::is_some),
        }
    }

    pub fn head(&self, stream: Stream) -> Option<Head> {
        self.heads[stream as usize]
    }

    /// The heads, indexed by stream number (for the checkpoint's image).
    pub fn heads(&self) -> &[Option<Head>; STREAM_COUNT] {
        &self.heads
    }

    /// Whether a data block appended to `stream` fits in its head segment
    /// without a new batch being opened in a new segment.
    pub fn head_has_room(&self, stream: Stream) -> bool {
        self.heads[stream as usize].is_some_and(|head| head.has_room_for_a_data_block())
    }

    /// Whether some relocation head has room for a data block.
    pub fn relocation_head_has_room(&self) -> bool {
        RELOCATION_STREAMS
            .iter()
            .any(|stream| self.head_has_room(*stream))
    }

    /// Whether a data block appended to `stream` now fits in its head
    /// segment.
    pub fn has_room_without_a_new_segment(&self, stream: Stream) -> bool {
        if let Some(batch) = &self.open_batches[lane_of(stream)]
            && batch.stream == stream
        {
            return (batch.layout.block_count() as usize) < batch.data_capacity;
        }
        self.head_has_room(stream)
    }

    /// Removes the head of `stream` (its segment is full or being closed).
    pub fn take_head(&mut self, stream: Stream) -> Option<Head> {
        self.heads[stream as usize].take()
    }

    /// Makes `segment_index` the head of `stream`, with a new segment
    /// sequence, at the shape the device lays it out at now.
    pub fn open_head(&mut self, stream: Stream, segment_index: u32) {
        assert!(self.heads[stream as usize].is_none());
        let segment_sequence = self.next_segment_sequence;
        self.next_segment_sequence += 1;
        self.heads[stream as usize] = Some(Head {
            segment_index,
            segment_sequence,
            next_block_in_segment: 0,
            shape: self.shapes.shape(segment_index),
        });
    }

    pub fn open_batch(&self, lane: usize) -> Option<&OpenBatch> {
        self.open_batches[lane].as_ref()
    }

    pub fn open_batch_mut(&mut self, lane: usize) -> Option<&mut OpenBatch> {
        self.open_batches[lane].as_mut()
    }

    pub fn take_open_batch(&mut self, lane: usize) -> Option<OpenBatch> {
        self.open_batches[lane].take()
    }
}

impl LogWriter {
    /// A new, empty batch of `stream` at its head (opened by the caller),
    /// whose segment starts at device block `segment_first_block`.
    pub fn open_batch_at_head(
        &mut self,
        stream: Stream,
        segment_first_block: u64,
    ) -> &mut OpenBatch {
        let lane = lane_of(stream);
        assert!(
            self.open_batches[lane].is_none(),
            "lane {lane} has a batch open"
        );
        let head = self.heads[stream as usize].expect("a batch opens at a head");
        assert!(head.has_room_for_a_data_block());
        let remaining = (head.shape.size_blocks - head.next_block_in_segment) as usize;
        let data_capacity = BATCH_DATA_BLOCKS_MAX.min(remaining - BATCH_OVERHEAD_BLOCKS as usize);
        self.open_batches[lane].insert(OpenBatch {
            stream,
            segment_index: head.segment_index,
            segment_sequence: head.segment_sequence,
            block_in_segment: head.next_block_in_segment,
            summary_block: segment_first_block + u64::from(head.next_block_in_segment),
            records: Vec::new(),
            record_bytes: 0,
            // Not cleared: a recycled buffer holds an earlier batch's bytes,
            // but nothing reads or writes a block of it before this batch
            // writes it (a data block as it is appended, the summary and its
            // copy at the seal, which cuts the buffer to what was written).
            buffer: AlignedBuffer::for_overwrite(
                (BATCH_OVERHEAD_BLOCKS as usize + data_capacity) * BLOCK_BYTES,
            ),
            layout: DataLayout::new(),
            data_capacity,
            data_blocks: HashSet::new(),
            has_records_without_data: false,
        })
    }

    /// Seals `batch`: gives it the next sequence, writes its summary into its
    /// first and last block, moves its head on, and puts it in flight. An
    /// empty batch takes no sequence and yields nothing.
    pub fn seal(&mut self, mut batch: OpenBatch) -> Option<SealedBatch> {
        if batch.records.is_empty() {
            return None;
        }
        let sequence = self.next_batch_sequence;
        self.next_batch_sequence += 1;
        let summary = Summary {
            segment_sequence: batch.segment_sequence,
            block_in_segment: batch.block_in_segment,
            batch_sequence: sequence,
            flushed_through_sequence: self.durable_through,
            records: std::mem::take(&mut batch.records),
        };
        // The summary goes first and again last (format version 5), so that
        // one damaged sector never loses the batch's records (`log::chain`).
        let encoded = summary.encode();
        let block = BLOCK_BYTES;
        let block_count = BATCH_OVERHEAD_BLOCKS as usize + batch.layout.block_count() as usize;
        batch.buffer[..block].copy_from_slice(&encoded);
        batch.buffer[(block_count - 1) * block..block_count * block].copy_from_slice(&encoded);
        batch.buffer.truncate(block_count * block);
        let block_count = u32::try_from(block_count).expect("a batch fits in a segment");
        let head = self.heads[batch.stream as usize]
            .as_mut()
            .expect("an open batch has a head");
        assert_eq!(head.segment_index, batch.segment_index);
        assert_eq!(head.next_block_in_segment, batch.block_in_segment);
        // The next batch starts at the next row: a striped tier's array
        // writes whole rows only, so the rest of this batch's last row stays
        // padding (format version 6, `log::chain::SegmentShape`).
        head.next_block_in_segment = head
            .shape
            .next_batch_start(head.next_block_in_segment + block_count);
        assert!(head.next_block_in_segment <= head.shape.size_blocks);
        let head_full = !head.has_room_for_a_data_block();
        let in_flight = Arc::new(InFlightBatch {
            sequence,
            summary_block: batch.summary_block,
            buffer: Arc::new(batch.buffer),
            opens_segment: (batch.block_in_segment == 0).then_some(batch.segment_sequence),
        });
        self.in_flight
            .insert(in_flight.summary_block, in_flight.clone());
        self.in_flight_sequences.insert(sequence);
        if batch.stream == Stream::Capacity {
            self.capacity_unflushed.insert(sequence);
        }
        self.unwritten_claims.insert(sequence, self.durable_through);
        self.sealed_through = sequence;
        Some(SealedBatch {
            in_flight,
            stream: batch.stream,
            segment_index: batch.segment_index,
            block_count,
            head_full,
        })
    }

    /// A batch's device write completed (or failed, and the pool failed).
    pub fn batch_written(&mut self, batch: &InFlightBatch) {
        let removed = self.in_flight.remove(&batch.summary_block);
        assert!(removed.is_some(), "batch {} was in flight", batch.sequence);
        assert!(self.in_flight_sequences.remove(&batch.sequence));
        let still_unwritten = self
            .unwritten_claims
            .split_off(&(self.written_through() + 1));
        let written = std::mem::replace(&mut self.unwritten_claims, still_unwritten);
        // After a failed write the log's tail is not what was sealed: its
        // claims no longer count (the flush marker is written instead).
        if self.failed.is_none()
            && let Some(claim) = written.values().max()
        {
            self.claims_written = self.claims_written.max(*claim);
        }
    }

    /// The highest flush claim the log has on the device, with every batch
    /// sealed before the batch that makes it (see `claims_written`).
    pub fn claims_written(&self) -> u64 {
        self.claims_written
    }

    /// Whether batch `sequence` is sealed and not yet written.
    pub fn is_in_flight(&self, sequence: u64) -> bool {
        self.in_flight_sequences.contains(&sequence)
    }

    /// Batches sealed and not yet written.
    pub fn in_flight_count(&self) -> usize {
        self.in_flight.len()
    }

    /// Copies block `physical_block` from memory if it has not reached the device
    /// yet (open batch or in flight). Returns false when it must be read from disk.
    pub fn copy_unwritten_block(&self, physical_block: u64, destination: &mut [u8]) -> bool {
        let block = BLOCK_BYTES;
        for batch in self.open_batches.iter().flatten() {
            if physical_block > batch.summary_block
                && physical_block <= batch.summary_block + u64::from(batch.layout.block_count())
            {
                let start = to_usize(physical_block - batch.summary_block) * block;
                destination.copy_from_slice(&batch.buffer[start..start + block]);
                return true;
            }
        }
        if let Some((_, batch)) = self.in_flight.range(..=physical_block).next_back()
            && physical_block < batch.summary_block + batch.block_count()
        {
            let start = to_usize(physical_block - batch.summary_block) * block;
            destination.copy_from_slice(&batch.buffer[start..start + block]);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::geometry::Geometry;

    /// A batch of one zero data block whose summary and copy are intact.
    fn in_flight(sequence: u64) -> InFlightBatch {
        let encoded = Summary {
            segment_sequence: 1,
            block_in_segment: 0,
            batch_sequence: sequence,
            flushed_through_sequence: 0,
            records: Vec::new(),
        }
        .encode();
        let mut buffer = AlignedBuffer::zeroed(3 * BLOCK_BYTES);
        buffer[..BLOCK_BYTES].copy_from_slice(&encoded);
        buffer[2 * BLOCK_BYTES..].copy_from_slice(&encoded);
        InFlightBatch {
            sequence,
            summary_block: 0,
            buffer: Arc::new(buffer),
            opens_segment: None,
        }
    }

    /// Opens a batch at a fresh head of the client stream, appends one
    /// block of `fill` for each of `logical_blocks` and seals it.
    fn sealed_batch(
        writer: &mut LogWriter,
        logical_blocks: std::ops::Range<u64>,
        fill: u8,
    ) -> SealedBatch {
        let geometry = *writer.shapes.geometry();
        if writer.head(Stream::Client).is_none() {
            writer.open_head(Stream::Client, 0);
        }
        let first_block = geometry.segment_first_block(0);
        let batch = writer.open_batch_at_head(Stream::Client, first_block);
        for logical_block in logical_blocks {
            let data = [fill; BLOCK_BYTES];
            batch.append_block(
                Record::Data {
                    volume_id: 1,
                    logical_block,
                    checksum: crate::log::batch::block_checksum(&data),
                },
                &data,
            );
        }
        let batch = writer
            .take_open_batch(lane_of(Stream::Client))
            .expect("the batch just opened");
        writer.seal(batch).expect("a batch with records seals")
    }

    /// The log vouches for a flush (decision 0069) only once the summary
    /// claiming it is written along with every batch sealed before it, and
    /// never from batches written after a failed write.
    #[test]
    fn a_flush_claim_counts_once_written_with_every_batch_before_it() {
        let geometry = Geometry::for_device(64 << 20, DEFAULT_SEGMENT_SIZE_BYTES).unwrap();
        let mut writer = LogWriter::new(SegmentShapes::uniform(geometry));
        let first = sealed_batch(&mut writer, 0..2, 1);
        writer.batch_written(&first.in_flight);
        writer.flash_flushed(first.in_flight.sequence);
        assert_eq!(writer.claims_written(), 0, "the first batch claims nothing");
        // Two batches sealed after the flush: both claim it.
        let second = sealed_batch(&mut writer, 2..4, 2);
        let third = sealed_batch(&mut writer, 4..6, 3);
        writer.batch_written(&third.in_flight);
        assert_eq!(
            writer.claims_written(),
            0,
            "a claim behind an unwritten batch is not on the device in order"
        );
        writer.batch_written(&second.in_flight);
        assert_eq!(writer.claims_written(), first.in_flight.sequence);
        writer.flash_flushed(third.in_flight.sequence);
        let fourth = sealed_batch(&mut writer, 6..8, 4);
        writer.fail("injected".to_string());
        writer.batch_written(&fourth.in_flight);
        assert_eq!(
            writer.claims_written(),
            first.in_flight.sequence,
            "a failed write's claim does not count"
        );
    }

    /// A batch's buffer is recycled uncleared (decision 0045): a batch that
    /// follows a fuller one gets a buffer back with an earlier batch's
    /// blocks in it, and must write exactly its own summary, data and
    /// summary copy, nothing of the old batch's.
    #[test]
    fn a_batch_in_a_recycled_buffer_holds_only_its_own_blocks() {
        // The free list is shared by every thread, so a test running beside
        // this one may take the full batch's buffer, or give back one of its
        // own first: each attempt checks the short batch's bytes, and one of
        // them must have had the full batch's very buffer.
        const ATTEMPT_COUNT: usize = 20;
        let recycled_attempts = (0..ATTEMPT_COUNT)
            .filter(|_| short_batch_after_a_full_one_is_its_own())
            .count();
        assert!(
            recycled_attempts > 0,
            "no short batch reused the full batch's buffer (this test proved nothing)"
        );
    }

    /// Seals a full batch, then a short one of three blocks in a new writer
    /// on a fresh head, checks the short one holds only its own blocks, and
    /// tells whether it was sealed in the full one's buffer.
    fn short_batch_after_a_full_one_is_its_own() -> bool {
        let geometry = Geometry::for_device(64 << 20, DEFAULT_SEGMENT_SIZE_BYTES).unwrap();
        let mut writer = LogWriter::new(SegmentShapes::uniform(geometry));
        let full = sealed_batch(&mut writer, 0..BATCH_DATA_BLOCKS_MAX as u64, 0xa5);
        let full_address = full.in_flight.buffer.as_ptr() as usize;
        writer.batch_written(&full.in_flight);
        drop(full);
        let short = sealed_batch(&mut writer, 1000..1003, 0x5a);
        let buffer = &short.in_flight.buffer;
        assert_eq!(
            buffer.len(),
            (3 + BATCH_OVERHEAD_BLOCKS as usize) * BLOCK_BYTES
        );
        short.in_flight.check_summary();
        let summary = Summary::decode(&buffer[..BLOCK_BYTES]).unwrap();
        assert_eq!(summary.data_block_count(), 3);
        for block in buffer.chunks(BLOCK_BYTES).skip(1).take(3) {
            assert!(
                block.iter().all(|byte| *byte == 0x5a),
                "a data block is the batch's own"
            );
        }
        buffer.as_ptr() as usize == full_address
    }

    #[test]
    fn an_intact_batch_passes_its_check_before_write() {
        in_flight(7).check_summary();
    }

    #[test]
    #[should_panic(expected = "the summary's copy differs")]
    fn a_batch_whose_copy_differs_is_stopped_before_write() {
        let batch = in_flight(7);
        let mut buffer = AlignedBuffer::zeroed(3 * BLOCK_BYTES);
        buffer.copy_from_slice(&batch.buffer);
        buffer[2 * BLOCK_BYTES + 100] ^= 1;
        InFlightBatch {
            buffer: Arc::new(buffer),
            ..batch
        }
        .check_summary();
    }

    #[test]
    #[should_panic(expected = "a summary names its own batch")]
    fn a_batch_under_another_sequence_is_stopped_before_write() {
        let batch = in_flight(7);
        InFlightBatch {
            sequence: 8,
            ..batch
        }
        .check_summary();
    }
}
