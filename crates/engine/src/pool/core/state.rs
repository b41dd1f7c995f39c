//! What the pool's one mutex guards: its components, and the operations that
//! must change several of them at once, atomically: appending a record or a
//! block (the log writer places it, the space allocator counts it, the
//! volumes map it, the placement and the heat learn of it), and sealing
//! batches. Everything here runs under the mutex and never waits on I/O; the
//! async halves of the read and write paths live in `io/read.rs` and `io/write.rs`
//! (a read borrows the components it needs apart, as [`ReadParts`]).
//!
//! The components, each owning its data behind narrow methods:
//! - [`SpaceAllocator`] (`space/mod.rs`): segments, free lists, reserves, deaths;
//! - [`LogWriter`] (`io/writer.rs`): heads, open batches, in-flight batches,
//!   sequences;
//! - [`VolumeTable`] (`volume/`): volumes, snapshots and their maps;
//! - [`Placement`] (`cleaner/placement.rs`): which stream data goes to;
//! - [`WriteCounters`] and [`CheckpointSchedule`] (`counters.rs`);
//! - the heat of flash blocks and the per-volume tier counters (`tier/heat.rs`);
//! - the memory cache, told when blocks die and segments are freed.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{EngineError, IoError};
use crate::log::batch::{Record, block_checksum};
use crate::log::checkpoint::Body;
use crate::log::geometry::{Geometry, Tier};
use crate::log::location::{Location, UNIT_BYTES};
use crate::tier::heat::{Heat, VolumeTierCounters};
use crate::tier::memory_cache::MemoryCache;
use crate::volume::VolumeTable;
use crate::volume::map::MapEntry;

use super::counters::{CheckpointSchedule, WriteCounters};
use super::limits::PoolLimits;
use crate::log::openings::SegmentOpeningsRecord;
use crate::pool::cleaner::placement::{Placement, ReplacedBlock};
use crate::pool::io::stream::{
    ALL_STREAMS, CLIENT_STREAMS, OPEN_BATCH_COUNT, RELOCATION_STREAMS, Stream, lane_of,
};
use crate::pool::io::writer::{InFlightBatch, LogWriter, OpenBatch};
use crate::pool::openings::OpeningsList;
use crate::pool::space::segment_shapes::SegmentShapes;
use crate::pool::space::{Allocation, DurableCheckpoint, RecoveredSegments, SpaceAllocator};
use crate::pool::tiering::capacity_writes::CapacityWrites;

/// The pool's in-memory state.
pub struct State {
    geometry: Geometry,
    volumes: VolumeTable,
    space: SpaceAllocator,
    writer: LogWriter,
    /// Which stream each segment's data belongs to, and where relocations go.
    placement: Placement,
    counters: WriteCounters,
    checkpoint_schedule: CheckpointSchedule,
    /// Whether client writes are split between the client streams by how
    /// often their blocks are rewritten (one-tier pools; a two-tier pool's
    /// flash is a FIFO, where separation saves no cleaning).
    separate_client_writes: bool,
    /// Told when a block dies or a segment is freed, so that none of its old
    /// blocks can be served once the segment is rewritten.
    cache: Arc<MemoryCache>,
    /// Heat of flash blocks and the promotion ghost (two-tier pools only).
    heat: Option<Heat>,
    /// Per volume: reads per tier, promotions and demotions since the pool opened.
    tier_counters: HashMap<u32, VolumeTierCounters>,
    /// Each segment's size and row on the device.
    shapes: SegmentShapes,
    /// Segments opened as heads that recovery may need to walk (the
    /// segment openings record's contents).
    openings: OpeningsList,
    /// Whether the capacity tier takes writes (decision 0032).
    capacity_writes: CapacityWrites,
}

impl State {
    /// The state of an empty pool on `geometry`.
    pub fn new(geometry: Geometry, shapes: SegmentShapes, limits: &PoolLimits) -> Self {
        let one_tier = !geometry.has_capacity_tier();
        Self {
            geometry,
            volumes: VolumeTable::new(),
            space: SpaceAllocator::new(geometry, limits.test_hooks.reuse_freed_segments_first),
            writer: LogWriter::new(shapes.clone()),
            placement: Placement::new(
                limits.separate_client_writes_by_lifespan
                    && one_tier
                    && geometry.segment_count >= limits.relocation_streams_by_age_segment_count_min,
            ),
            counters: WriteCounters::default(),
            checkpoint_schedule: CheckpointSchedule::starting_at(1),
            separate_client_writes: limits.separate_client_writes_by_lifespan && one_tier,
            cache: Arc::new(MemoryCache::new(limits.memory_cache_bytes)),
            heat: (!one_tier).then(|| {
                Heat::new(
                    geometry.flash_data_block_count(),
                    limits.tier_ghost_entries_max,
                )
            }),
            tier_counters: HashMap::new(),
            shapes,
            openings: OpeningsList::default(),
            capacity_writes: CapacityWrites::default(),
        }
    }

    /// The segment openings record listing every opening a durable
    /// checkpoint may need, and the highest segment sequence it accounts
    /// for (`openings/mod.rs`).
    pub fn openings_record(
        &mut self,
        pool_identifier: u128,
        record_sequence: u64,
    ) -> (SegmentOpeningsRecord, u64) {
        let floor_segment_sequence = self.space.openings_floor_segment_sequence();
        let openings = self.openings.retained_from(floor_segment_sequence);
        let through = self.writer.next_segment_sequence() - 1;
        let record = SegmentOpeningsRecord {
            pool_identifier,
            record_sequence,
            floor_segment_sequence,
            overflowed: false,
            openings,
        };
        (record, through)
    }

    pub fn shapes(&self) -> &SegmentShapes {
        &self.shapes
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    pub fn volumes(&self) -> &VolumeTable {
        &self.volumes
    }

    pub fn space(&self) -> &SpaceAllocator {
        &self.space
    }

    pub fn writer(&self) -> &LogWriter {
        &self.writer
    }

    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    pub fn counters(&self) -> &WriteCounters {
        &self.counters
    }

    pub fn checkpoint_schedule(&self) -> &CheckpointSchedule {
        &self.checkpoint_schedule
    }

    pub fn cache(&self) -> &Arc<MemoryCache> {
        &self.cache
    }

    pub fn heat(&self) -> Option<&Heat> {
        self.heat.as_ref()
    }

    /// Per-volume tier counters, created on first use.
    pub fn tier_counters_of(&mut self, volume_id: u32) -> &mut VolumeTierCounters {
        self.tier_counters.entry(volume_id).or_default()
    }

    pub fn tier_counters(&self, volume_id: u32) -> VolumeTierCounters {
        self.tier_counters
            .get(&volume_id)
            .copied()
            .unwrap_or_default()
    }

    pub fn check_failed(&self) -> Result<(), EngineError> {
        self.writer.check_failed()
    }

    /// Client blocks written over the pool's life: the clock of lifespans.
    pub fn client_blocks_written(&self) -> u64 {
        self.counters.client_blocks_written()
    }

    /// Whether the cleaner cannot start without a new segment (see
    /// [`SpaceAllocator::cleaner_must_restart`]).
    pub fn cleaner_must_restart(&self) -> bool {
        self.space
            .cleaner_must_restart(self.writer.relocation_head_has_room())
    }

    /// Dead flash segments whose death a sealed batch covers, by what frees them.
    pub fn sealed_dead_flash_segment_counts(&self) -> crate::pool::space::DeadSegmentCounts {
        self.space
            .sealed_dead_flash_segment_counts(self.writer.sealed_through())
    }

    /// Whether the capacity tier takes writes (see `capacity_writes`).
    pub fn capacity_writes(&self) -> &CapacityWrites {
        &self.capacity_writes
    }

    /// Whether a demotion appended now would find room on capacity (and the
    /// capacity tier takes writes).
    pub fn can_demote(&self) -> bool {
        self.geometry.has_capacity_tier()
            && !self.capacity_writes.is_suspended()
            && (self.writer.head_has_room(Stream::Capacity)
                || self.space.capacity_segment_available_for_demotion())
    }

    /// Accounts for a location that no map references any more.
    pub fn release_block(&mut self, location: Location) {
        // A dead block's cached copy can never be read again: free its slot for
        // live data (otherwise overwrites fill the cache with garbage). A
        // fragment's packed block may hold live fragments too; its decoded
        // copy (decision 0075) is its alone.
        if location.is_fragment() {
            self.cache.forget_decoded(location);
        } else {
            self.cache.invalidate_range(location.block(), 1);
        }
        self.space.release(location, self.writer.progress());
    }

    /// Forgets cached blocks of segments just freed: they will be rewritten.
    fn segments_freed(&mut self, freed: &[u32]) {
        for segment_index in freed {
            self.cache.invalidate_range(
                self.geometry.segment_first_block(*segment_index),
                self.geometry.segment_size_blocks,
            );
        }
    }

    /// Frees a segment (a victim the cleaner emptied, or a dead one).
    pub fn free_segment(&mut self, segment_index: u32) {
        self.space.free_segment(segment_index);
        self.segments_freed(&[segment_index]);
    }

    /// Frees every dead segment that may be rewritten; returns how many.
    pub fn free_reusable_dead_segments(&mut self) -> usize {
        let freed = self
            .space
            .free_reusable_dead_segments(self.writer.durable_through());
        self.segments_freed(&freed);
        freed.len()
    }

    /// A flush of the flash tier (of the whole device in a one-tier pool)
    /// made every batch through `covered` durable there: advances the
    /// log's durable points, counts the flush at `sealed_bytes` of log and
    /// frees the dead segments whose deaths it made durable (decision 0006).
    pub fn flash_flush_completed(&mut self, covered: u64, sealed_bytes: u64) {
        if self.geometry.has_capacity_tier() {
            self.writer.flash_flushed(covered);
        } else {
            self.writer.durable_through_advanced(covered);
        }
        self.counters.flushed(sealed_bytes);
        self.free_reusable_dead_segments();
    }

    /// A flush of the capacity tier on `device` made every batch through
    /// `covered` durable there: the tier takes writes again, and the dead
    /// segments whose deaths it made durable are freed (decision 0006).
    pub fn capacity_flush_succeeded(&mut self, device: &str, covered: u64) {
        self.capacity_writes.flush_succeeded(device);
        self.writer.capacity_flushed(covered);
        self.free_reusable_dead_segments();
    }

    /// The next checkpoint's sequence, taken at the log's sealed bytes now
    /// (the schedule counts the log written since).
    pub fn take_checkpoint_sequence(&mut self) -> u64 {
        let sealed_bytes = self.counters.sealed_bytes();
        self.checkpoint_schedule.take_sequence(sealed_bytes)
    }

    /// Records a durable checkpoint and frees what it makes reclaimable.
    pub fn checkpoint_became_durable(&mut self, checkpoint: DurableCheckpoint) {
        let freed = self
            .space
            .checkpoint_became_durable(checkpoint, self.writer.durable_through());
        self.segments_freed(&freed);
    }
}

/// The changes the cleaner, the flushes, the checkpointer and evacuation
/// make, each one named operation (callers outside the core reach the
/// components only to read them).
impl State {
    /// Starts cleaning `victim`, a segment of `tier`: the placement learns
    /// how many live blocks it had and when, and relocations take segments
    /// of its tier.
    pub fn start_cleaning(&mut self, victim: u32, tier: Tier) {
        let live_blocks = self.space.segment(victim).live_blocks();
        let now_blocks = self.client_blocks_written();
        self.placement.start_victim(victim, live_blocks, now_blocks);
        self.space.set_cleaning_tier(tier);
    }

    /// The cleaner is done with its victim: relocations take flash
    /// segments again.
    pub fn finish_cleaning(&mut self) {
        self.space.set_cleaning_tier(Tier::Flash);
    }

    /// Takes a segment whose summaries do not describe every live block out
    /// of the victims (see `SpaceAllocator::set_aside`).
    pub fn set_segment_aside(&mut self, segment_index: u32) {
        self.space.set_aside(segment_index);
    }

    /// A write the log counted on failed: the pool refuses further writes.
    pub fn fail_writes(&mut self, reason: String) {
        self.writer.fail(reason);
    }

    /// A batch handed to the device was written (or failed, see
    /// [`State::fail_writes`]): it leaves the in-flight batches.
    pub fn batch_written(&mut self, batch: &InFlightBatch) {
        self.writer.batch_written(batch);
    }

    /// A flush of the capacity tier on `device` failed: its writes are
    /// suspended (decision 0032).
    pub fn capacity_flush_failed(&mut self, device: &str, error: &str) {
        self.capacity_writes.flush_failed(device, error);
    }

    /// A flush marker of `bytes` was written to the device.
    pub fn flush_marker_written(&mut self, bytes: u64) {
        self.counters.marker_written(bytes);
    }

    /// The maps were copied for a checkpoint: every later change is the
    /// next checkpoint's.
    pub fn checkpoint_copied(&mut self) {
        self.volumes.checkpoint_taken();
    }

    /// Takes free segments enough for a checkpoint body of `body_bytes`
    /// (see `SpaceAllocator::take_checkpoint_body_segments`).
    pub fn take_checkpoint_body_segments(
        &mut self,
        body_bytes: u64,
        size_bytes: impl Fn(u32) -> u64,
        checkpoint_sequence: u64,
    ) -> Option<Vec<u32>> {
        self.space
            .take_checkpoint_body_segments(body_bytes, size_bytes, checkpoint_sequence)
    }

    /// Gives back the segments of a body no slot names.
    pub fn return_checkpoint_body_segments(&mut self, body_segments: &[u32]) {
        self.space.return_checkpoint_body_segments(body_segments);
    }

    /// A checkpoint of `device_bytes` (body and slot) became durable:
    /// counts the bytes, records it and frees what it makes reclaimable.
    pub fn checkpoint_written(&mut self, checkpoint: DurableCheckpoint, device_bytes: u64) {
        self.counters.checkpoint_written(device_bytes);
        self.checkpoint_became_durable(checkpoint);
    }

    /// Takes a free segment out of the free lists to lay it out again
    /// (evacuation); whether it was free and needed it.
    pub fn take_free_segment_to_lay_out(&mut self, segment_index: u32) -> bool {
        self.space.take_free_segment_to_lay_out(segment_index)
    }

    /// Gives back a segment taken to be laid out again.
    pub fn return_free_segment(&mut self, segment_index: u32) {
        self.space.return_free_segment(segment_index);
    }
}

/// Recovery's changes: the state is built from the checkpoint, the
/// replayed batches and what the scan found, one named step at a time.
impl State {
    /// Loads what the checkpoint holds into an empty state: `volumes`, the
    /// write counters, placement hints and each segment's newest batch.
    pub fn restore_checkpoint(&mut self, volumes: VolumeTable, body: &Body) {
        self.volumes = volumes;
        self.counters = WriteCounters::continuing(body.counters);
        let segment_count = self.space.segments().len();
        self.placement.restore(&body.placement, segment_count);
        self.space
            .restore_last_batch_sequences(&body.segment_last_batch_sequences);
    }

    /// Applies a replayed record, its data at `location`.
    pub fn replay_record(&mut self, record: &Record, location: Option<Location>) {
        self.volumes.apply(record, location, &mut |_| {});
    }

    /// A batch of `segment_index` was replayed: its hints in the
    /// checkpoint are of an earlier use, and it is the segment's newest.
    pub fn batch_replayed(&mut self, segment_index: u32, batch_sequence: u64) {
        let now_blocks = self.client_blocks_written();
        self.placement.forget_segment(segment_index, now_blocks);
        self.space.batch_replayed(segment_index, batch_sequence);
    }

    /// Marks lost the map entries `is_lost` names (a restored flash
    /// device); returns how many.
    pub fn mark_lost(&mut self, is_lost: &dyn Fn(Location, bool) -> bool) -> u64 {
        self.volumes.mark_lost(is_lost)
    }

    /// The kept checkpoints recovery found durable.
    pub fn restore_durable_checkpoints(&mut self, checkpoints: Vec<DurableCheckpoint>) {
        self.space.restore_durable_checkpoints(checkpoints);
    }

    /// Where the log goes on after replay: the openings its records go on
    /// listing, the next checkpoint's sequence and the next batch and
    /// segment sequences.
    pub fn resume_log(&mut self, resume: LogResume) {
        self.openings = resume.openings;
        self.checkpoint_schedule = CheckpointSchedule::starting_at(resume.next_checkpoint_sequence);
        self.writer
            .resume(resume.next_batch_sequence, resume.next_segment_sequence);
    }

    /// Every segment's state from what recovery found.
    pub fn rebuild_segment_table(&mut self, found: RecoveredSegments) {
        self.space.rebuild_after_recovery(found);
    }
}

/// Where the log goes on after replay ([`State::resume_log`]).
pub struct LogResume {
    pub openings: OpeningsList,
    pub next_checkpoint_sequence: u64,
    pub next_batch_sequence: u64,
    pub next_segment_sequence: u64,
}

/// The append path: records and blocks into open batches.
impl State {
    /// Makes sure the open batch of `stream`'s lane can take `record` (and
    /// its data block, if it carries one): first seals each other lane's
    /// batch that `record` conflicts with, then seals this lane's batch if it
    /// is of another stream or full, and opens a new one (in a new segment if
    /// needed). Sealed batches are pushed to `sealed`. Returns the lane.
    fn make_room(
        &mut self,
        stream: Stream,
        record: &Record,
        sealed: &mut Vec<Arc<InFlightBatch>>,
    ) -> Result<usize, EngineError> {
        let stream = if stream.is_relocation() {
            self.relocation_stream_with_room(self.placement.relocation_stream())
        } else {
            stream
        };
        let lane = lane_of(stream);
        assert!(
            lane == 0 || record.carries_data() || record.carries_fragment(),
            "records without data go to the main batch"
        );
        for other in (0..OPEN_BATCH_COUNT).filter(|other| *other != lane) {
            if self
                .writer
                .open_batch(other)
                .is_some_and(|batch| batch.conflicts_with(record))
            {
                sealed.extend(self.seal_lane(other));
            }
        }
        if let Some(batch) = self.writer.open_batch(lane) {
            if batch.stream() == stream && batch.has_room_for(record) {
                return Ok(lane);
            }
            sealed.extend(self.seal_lane(lane));
        }
        self.open_batch(stream, record.carries_data() || record.carries_fragment())?;
        Ok(lane)
    }

    /// Opens a new, empty batch at the head of `stream` (`stream`'s lane has
    /// none open), opening a new head segment when the current one has no room.
    fn open_batch(&mut self, stream: Stream, with_data: bool) -> Result<(), EngineError> {
        if self.writer.head(stream).is_some() && !self.writer.head_has_room(stream) {
            self.close_head_segment(stream);
        }
        if self.writer.head(stream).is_none() {
            let taken = self.take_head_segment(stream, with_data)?;
            let shapes = &self.shapes;
            let segment_index = self
                .space
                .prefer_free_segment(taken, |index| !shapes.needs_layout(index));
            self.space.open_head_segment(segment_index);
            self.writer.open_head(stream, segment_index);
            let head = self.writer.head(stream).expect("head opened above");
            self.openings.opened(segment_index, head.segment_sequence);
            let now = self.client_blocks_written();
            self.placement.segment_opened(segment_index, stream, now);
        }
        let head = self.writer.head(stream).expect("head opened above");
        let first_block = self.geometry.segment_first_block(head.segment_index);
        self.writer.open_batch_at_head(stream, first_block);
        Ok(())
    }

    /// A free segment for a new head of `stream`.
    fn take_head_segment(&mut self, stream: Stream, with_data: bool) -> Result<u32, EngineError> {
        if stream == Stream::Capacity {
            assert!(with_data, "records without data go to the client stream");
            return self
                .space
                .take_free_capacity_segment()
                .ok_or(EngineError::Io(IoError::NoSpace));
        }
        // Records without data (trims, deletes) may use the cleaner's reserve:
        // they are tiny, and they are how a user frees a full pool.
        let allocation = match (CLIENT_STREAMS.contains(&stream), with_data) {
            (true, true) => Allocation::Client,
            (true, false) => Allocation::Record,
            (false, _) => {
                assert!(stream.is_relocation());
                Allocation::Cleaner
            }
        };
        let relocation_head_has_room = self.writer.relocation_head_has_room();
        self.space
            .take_free_segment(allocation, relocation_head_has_room)
            .ok_or(EngineError::Io(IoError::NoSpace))
    }

    /// Closes the head segment of `stream`: sealed, or dead if nothing in it lives.
    fn close_head_segment(&mut self, stream: Stream) {
        if let Some(head) = self.writer.take_head(stream) {
            let progress = self.writer.progress();
            self.space
                .close_head_segment(head.segment_index, head.next_block_in_segment, progress);
        }
    }

    /// Seals the open batches and closes every head whose segment's layout
    /// `closes` names (degraded: laid out over a device since lost; or
    /// narrower than the devices in use), so that nothing more is written
    /// there and the evacuation can move it. Returns the sealed batches, to
    /// be written.
    pub fn close_heads_where(
        &mut self,
        closes: impl Fn(&crate::pool::space::segment_shapes::SegmentLayout) -> bool,
    ) -> Vec<Arc<InFlightBatch>> {
        let degraded: Vec<Stream> = ALL_STREAMS
            .into_iter()
            .filter(|stream| {
                self.writer
                    .head(*stream)
                    .is_some_and(|head| closes(&self.shapes.layout(head.segment_index)))
            })
            .collect();
        if degraded.is_empty() {
            return Vec::new();
        }
        let sealed = self.seal_open_batch();
        for stream in degraded {
            self.close_head_segment(stream);
        }
        sealed
    }

    /// Appends a non-data record and applies it to the volumes.
    pub fn append_record(
        &mut self,
        record: Record,
    ) -> Result<Vec<Arc<InFlightBatch>>, EngineError> {
        assert!(!record.carries_data());
        self.check_failed()?;
        let mut sealed = Vec::new();
        let lane = self.make_room(Stream::Client, &record, &mut sealed)?;
        let batch = self.writer.open_batch_mut(lane).expect("room made");
        batch.push(record.clone());
        let segment_index = batch.segment_index();
        self.space.needed_by_replay(segment_index);
        let mut displaced = Vec::new();
        self.volumes
            .apply(&record, None, &mut |block| displaced.push(block));
        for block in displaced {
            self.release_block(block);
        }
        Ok(sealed)
    }

    /// Appends a record with the data it carries (a `Data` or `Relocate`
    /// record's 4 KiB block, a `Packed` or `RelocatePacked` record's
    /// fragment); returns where the data went.
    fn append_with_data(
        &mut self,
        stream: Stream,
        record: Record,
        interval_level: Option<u8>,
        data: &[u8],
        sealed: &mut Vec<Arc<InFlightBatch>>,
    ) -> Result<Location, EngineError> {
        let lane = self.make_room(stream, &record, sealed)?;
        let batch = self.writer.open_batch_mut(lane).expect("room made");
        let location = if record.carries_fragment() {
            batch.append_fragment(record.clone(), data)
        } else {
            Location::whole_block(batch.append_block(record.clone(), data))
        };
        self.space
            .units_appended(self.geometry.segment_of(location.block()), location.units());
        let mut displaced = None;
        self.volumes
            .apply_with_level(&record, Some(location), interval_level, &mut |old| {
                displaced = Some(old)
            });
        if let Some(old) = displaced {
            self.release_block(old);
        }
        Ok(location)
    }
}

/// Where a client write goes: its stream, and the rewrite interval class
/// the placement gave it (when client writes are split).
struct ClientDestination {
    stream: Stream,
    interval_level: Option<u8>,
}

/// Client writes and moves of blocks.
impl State {
    /// Appends one 4 KiB data block for `logical_block` of `volume_id`, whose
    /// crc32c `checksum` the caller computed before taking the lock.
    pub fn append_data(
        &mut self,
        volume_id: u32,
        logical_block: u64,
        data: &[u8],
        checksum: u32,
        sealed: &mut Vec<Arc<InFlightBatch>>,
    ) -> Result<(), EngineError> {
        self.check_failed()?;
        debug_assert_eq!(checksum, block_checksum(data), "the data's own checksum");
        let record = Record::Data {
            volume_id,
            logical_block,
            checksum,
        };
        // The block this write replaces steers the split and carries heat;
        // without either, its lookup is skipped (a write is the hot path).
        let replaced = if self.separate_client_writes || self.heat.is_some() {
            self.volumes
                .get(volume_id)
                .and_then(|volume| volume.map.entry(logical_block))
                // A lost entry occupies no block: nothing to steer by.
                .filter(|entry| !entry.mapping.is_lost())
        } else {
            None
        };
        // A rewrite is an access: the new block starts with the heat of the
        // flash block it replaces.
        let replaced_counter = self.heat.as_ref().and_then(|heat| {
            let index = self
                .geometry
                .flash_data_index(replaced?.mapping.location.block())?;
            Some(heat.counter(index))
        });
        let destination = self.client_destination(replaced);
        // The level belongs to the map entry, which the append sets.
        let physical_block = self
            .append_with_data(
                destination.stream,
                record,
                destination.interval_level,
                data,
                sealed,
            )?
            .whole_block_number();
        self.counters.client_block_written();
        self.set_heat(
            volume_id,
            physical_block,
            Heat::after_rewrite(replaced_counter),
        );
        Ok(())
    }

    /// Appends one compressed block for `logical_block` of `volume_id` as a
    /// fragment (`log::fragment`, encoded before the lock was taken) of
    /// `unit_count` units whose crc32c is `checksum`. The placement and the
    /// heat are a whole block's (the block it replaces steers both); in a
    /// two-tier pool the fragments packed in a flash block share its heat
    /// (decision 0074).
    pub fn append_packed(
        &mut self,
        volume_id: u32,
        logical_block: u64,
        fragment: &[u8],
        checksum: u32,
        sealed: &mut Vec<Arc<InFlightBatch>>,
    ) -> Result<(), EngineError> {
        self.check_failed()?;
        debug_assert_eq!(
            checksum,
            crc32c::crc32c(fragment),
            "the fragment's own checksum"
        );
        let unit_count = fragment.len() / UNIT_BYTES;
        let record = Record::Packed {
            volume_id,
            logical_block,
            unit_count: u8::try_from(unit_count).expect("a fragment is at most 225 units"),
            checksum,
        };
        let replaced = if self.separate_client_writes || self.heat.is_some() {
            self.volumes
                .get(volume_id)
                .and_then(|volume| volume.map.entry(logical_block))
                .filter(|entry| !entry.mapping.is_lost())
        } else {
            None
        };
        let replaced_counter = self.heat.as_ref().and_then(|heat| {
            let index = self
                .geometry
                .flash_data_index(replaced?.mapping.location.block())?;
            Some(heat.counter(index))
        });
        let destination = self.client_destination(replaced);
        let location = self.append_with_data(
            destination.stream,
            record,
            destination.interval_level,
            fragment,
            sealed,
        )?;
        self.counters.client_block_written();
        self.set_fragment_heat(volume_id, location, Heat::after_rewrite(replaced_counter));
        Ok(())
    }

    /// The stream a client write that replaces `replaced` goes to.
    fn client_destination(&self, replaced: Option<MapEntry>) -> ClientDestination {
        if !self.separate_client_writes {
            return ClientDestination {
                stream: Stream::Client,
                interval_level: None,
            };
        }
        let now = self.client_blocks_written();
        let placement = self.placement.client_placement(
            replaced.map(|entry| ReplacedBlock {
                segment_index: self.geometry.segment_of(entry.mapping.location.block()),
                interval_level: entry.interval_level,
            }),
            now,
        );
        ClientDestination {
            stream: self.client_stream_with_room(placement.stream),
            interval_level: Some(placement.interval_level),
        }
    }

    /// The client stream a write predicted for `predicted` goes to. When
    /// clients may not take another free segment, a write goes where there is
    /// room without one, preferring the predicted stream, so that it need not
    /// wait for reclaim while another client head has room (partly filled
    /// client heads are space the cleaner cannot use); only then does it go
    /// to the `Client` head. (Stepping aside earlier, at 2 free segments
    /// beyond the reserve, mixed the streams in steady state: Zipf(0.99) WA
    /// 2.29 against 2.20 on a 2 GiB pool.)
    fn client_stream_with_room(&self, predicted: Stream) -> Stream {
        let short =
            self.space.free_flash_segment_count() <= self.space.reserve_for(Allocation::Client);
        if !short {
            return predicted;
        }
        self.first_with_room(predicted, CLIENT_STREAMS)
            .unwrap_or(Stream::Client)
    }

    /// The relocation stream a block placed in `predicted` goes to. When the
    /// cleaner has used most of its reserve (fewer free segments beyond the
    /// reserve it leaves than there are relocation streams), the block goes to
    /// a relocation head with room if `predicted`'s has none: opening a head
    /// per age class there could spend the space reclaim frees on half-filled
    /// heads (a 64-segment pool at 85% live failed writes with ENOSPC that
    /// way). Not sooner: the paced cleaner keeps free space near the clients'
    /// reserve, and falling back there mixed the classes in steady state
    /// (Zipf(0.99) WA 2.61 against 2.47 on a 1 GiB pool).
    fn relocation_stream_with_room(&self, predicted: Stream) -> Stream {
        let short = self.space.free_flash_segment_count()
            <= self.space.reserve_for(Allocation::Cleaner) + RELOCATION_STREAMS.len();
        if !short {
            return predicted;
        }
        self.first_with_room(predicted, RELOCATION_STREAMS)
            .unwrap_or(predicted)
    }

    /// `predicted` if a data block appended to it now fits in its head
    /// segment, else the first of `others` where one fits.
    fn first_with_room<const COUNT: usize>(
        &self,
        predicted: Stream,
        others: [Stream; COUNT],
    ) -> Option<Stream> {
        std::iter::once(predicted)
            .chain(others)
            .find(|stream| self.writer.has_room_without_a_new_segment(*stream))
    }

    /// Sets the heat of a block just appended to flash (nothing on capacity or
    /// in a one-tier pool).
    fn set_heat(&mut self, volume_id: u32, physical_block: u64, counter: u8) {
        // Checked first: a one-tier pool (no heat) pays nothing per write.
        let Some(heat) = &mut self.heat else { return };
        let Some(index) = self.geometry.flash_data_index(physical_block) else {
            return;
        };
        let policy = self
            .volumes
            .get(volume_id)
            .map(|volume| volume.policy)
            .unwrap_or_default();
        heat.flash_written(index, counter, policy);
    }

    /// Sets the heat of the flash blocks a fragment just appended at
    /// `location` touches (nothing on capacity or in a one-tier pool). The
    /// fragments packed in a block share its counter: the first content of a
    /// block sets it, and each fragment packed after it raises it to its own
    /// if higher, so that a block is as hot as its hottest fragment.
    fn set_fragment_heat(&mut self, volume_id: u32, location: Location, counter: u8) {
        if self.heat.is_none() {
            return;
        }
        let policy = self
            .volumes
            .get(volume_id)
            .map(|volume| volume.policy)
            .unwrap_or_default();
        let heat = self.heat.as_mut().expect("checked above");
        let blocks = location.block()..location.block() + u64::from(location.block_count());
        for (position, block) in blocks.enumerate() {
            let Some(index) = self.geometry.flash_data_index(block) else {
                return;
            };
            let starts_block = position > 0 || location.unit_offset() == 0;
            let counter = if starts_block {
                counter
            } else {
                counter.max(heat.counter(index))
            };
            heat.flash_written(index, counter, policy);
        }
    }
}

/// Tiering decisions.
impl State {
    /// Where the cleaner sends a live block of a flash victim: kept on flash
    /// (`Stream::Cleaner`) when heat says so or the pool has one tier, else
    /// demoted (`Stream::Capacity`). Pins are a preference: when writers are
    /// about to find flash full (`flash_critical`), pinned blocks leave too
    /// rather than fail the writes.
    pub fn flash_victim_destination(
        &mut self,
        volume_id: u32,
        physical_block: u64,
        flash_critical: bool,
    ) -> Stream {
        let Some(heat) = &mut self.heat else {
            return Stream::Cleaner;
        };
        let mut policy = self
            .volumes
            .get(volume_id)
            .map(|volume| volume.policy)
            .unwrap_or_default();
        if flash_critical && policy.pin == crate::volume::Pin::Flash {
            policy.pin = crate::volume::Pin::Auto;
        }
        let index = self
            .geometry
            .flash_data_index(physical_block)
            .expect("a flash victim's blocks are on flash");
        if heat.keep_on_flash(index, policy) {
            Stream::Cleaner
        } else {
            Stream::Capacity
        }
    }
}

/// A block to move ([`State::append_relocation`]).
pub struct Relocation<'a> {
    /// The writing volume, its snapshots and clones (`VolumeTable::family`).
    pub family: &'a [u32],
    pub volume_id: u32,
    pub logical_block: u64,
    /// Where the data is now: a whole block (`data` is its 4 KiB) or a
    /// fragment (`data` is its units, moved as they are).
    pub from: Location,
    pub data: &'a [u8],
    /// `Stream::Cleaner` is the cleaner's stream for its current victim,
    /// `Stream::Capacity` a demotion (or a move within capacity) and
    /// `Stream::Client` a promotion to flash.
    pub stream: Stream,
}

/// A block [`State::append_relocation`] moves, once the family was found
/// to hold it.
struct PlacedMove<'a> {
    volume_id: u32,
    logical_block: u64,
    from: Location,
    /// Its 4 KiB, or a fragment's units.
    data: &'a [u8],
    stream: Stream,
    /// Whether only the writing volume's live map holds it.
    sole_holder: bool,
    /// The heat it takes on flash.
    counter: u8,
}

impl State {
    /// Moves a block read from `from_physical_block` to the head of its
    /// stream, if some map of the family still holds it. Every map holding it
    /// is repointed. Returns whether it moved.
    pub fn append_relocation(
        &mut self,
        relocation: Relocation,
        sealed: &mut Vec<Arc<InFlightBatch>>,
    ) -> Result<bool, EngineError> {
        self.append_relocation_as(relocation, None, sealed)
    }

    /// Moves a block as [`State::append_relocation`] does, in a new form:
    /// `relocation.data` is a fragment's units, the block encoded again
    /// (`tiering::cold_compression`) from contents that matched the map's
    /// checksum, and `checksum` their crc32c, which the maps then carry.
    pub fn append_recompressed_relocation(
        &mut self,
        relocation: Relocation,
        checksum: u32,
        sealed: &mut Vec<Arc<InFlightBatch>>,
    ) -> Result<bool, EngineError> {
        debug_assert_eq!(checksum, crc32c::crc32c(relocation.data));
        self.append_relocation_as(relocation, Some(checksum), sealed)
    }

    /// A relocation as it is (`recompressed` none) or as a new fragment
    /// whose units' crc32c is `recompressed`.
    fn append_relocation_as(
        &mut self,
        relocation: Relocation,
        recompressed: Option<u32>,
        sealed: &mut Vec<Arc<InFlightBatch>>,
    ) -> Result<bool, EngineError> {
        self.check_failed()?;
        let Relocation {
            family,
            volume_id,
            logical_block,
            from,
            data,
            stream,
        } = relocation;
        let Some(held_checksum) = self.volumes.holder_checksum(family, logical_block, from) else {
            return Ok(false);
        };
        // A block only the writing volume's live map holds moves by a plain
        // `Data` record, which replay applies whatever it found before: the
        // record does not depend on the batch that put the block at its old
        // home, so the old segment needs no checkpoint before it is rewritten
        // (no later client write can come before it in sequence order: it
        // would have displaced the block, and this move would not be made).
        // Otherwise the conditional `Relocate` moves it in every map that
        // holds it, which replay can only do after the old home's batches.
        let sole_holder = self
            .volumes
            .sole_holder(family, volume_id, logical_block, from);
        // Within flash a block keeps its heat (the cleaner has already
        // decremented it); a promoted or demoted one starts cold, as
        // S3-FIFO's ghost hits enter its main queue (measured +0.5 to +0.7
        // points of hit ratio over starting at 1, with fewer relocations:
        // docs/decisions/0004).
        let counter = match self.geometry.flash_data_index(from.block()) {
            Some(index) => self.heat.as_ref().map_or(0, |heat| heat.counter(index)),
            None => 0,
        };
        let placed = PlacedMove {
            volume_id,
            logical_block,
            from,
            data,
            stream,
            sole_holder,
            counter,
        };
        match recompressed.or(from.is_fragment().then_some(held_checksum)) {
            Some(checksum) => self.append_packed_move(placed, checksum, sealed)?,
            None => self.append_whole_move(placed, held_checksum, sealed)?,
        }
        Ok(true)
    }

    /// Appends a whole block's move: a `Data` record for a sole holder, a
    /// `Relocate` otherwise.
    fn append_whole_move(
        &mut self,
        placed: PlacedMove,
        checksum: u32,
        sealed: &mut Vec<Arc<InFlightBatch>>,
    ) -> Result<(), EngineError> {
        let PlacedMove {
            volume_id,
            logical_block,
            from,
            ..
        } = placed;
        let from_physical_block = from.whole_block_number();
        let record = if placed.sole_holder {
            Record::Data {
                volume_id,
                logical_block,
                checksum,
            }
        } else {
            Record::Relocate {
                volume_id,
                logical_block,
                from_physical_block,
                checksum,
            }
        };
        let physical_block = self
            .append_with_data(placed.stream, record, None, placed.data, sealed)?
            .whole_block_number();
        self.moved(
            from_physical_block,
            physical_block,
            placed.stream,
            placed.sole_holder,
        );
        self.set_heat(volume_id, physical_block, placed.counter);
        Ok(())
    }

    /// Appends a fragment's move (its units as they are, or a whole block or
    /// fragment encoded again): a `Packed` record for a sole holder, a
    /// `RelocatePacked` otherwise, carrying `checksum`, the units' crc32c.
    fn append_packed_move(
        &mut self,
        placed: PlacedMove,
        checksum: u32,
        sealed: &mut Vec<Arc<InFlightBatch>>,
    ) -> Result<(), EngineError> {
        let PlacedMove {
            volume_id,
            logical_block,
            from,
            ..
        } = placed;
        let unit_count =
            u8::try_from(placed.data.len() / UNIT_BYTES).expect("a fragment's units fit a byte");
        let record = if placed.sole_holder {
            Record::Packed {
                volume_id,
                logical_block,
                unit_count,
                checksum,
            }
        } else {
            Record::RelocatePacked {
                volume_id,
                logical_block,
                from: from.raw(),
                unit_count,
                checksum,
            }
        };
        let to = self.append_with_data(placed.stream, record, None, placed.data, sealed)?;
        self.moved(from.block(), to.block(), placed.stream, placed.sole_holder);
        self.set_fragment_heat(volume_id, to, placed.counter);
        Ok(())
    }

    /// Tells the placement, the segment table and the counters of a block moved.
    fn moved(
        &mut self,
        from_physical_block: u64,
        to_physical_block: u64,
        stream: Stream,
        sole_holder: bool,
    ) {
        if stream.is_relocation() {
            self.placement
                .relocated_into(self.geometry.segment_of(to_physical_block));
        }
        if !sole_holder {
            let from_segment_index = self.geometry.segment_of(from_physical_block);
            self.space.needed_by_replay(from_segment_index);
        }
        if stream != Stream::Client {
            self.counters.block_relocated();
        }
    }
}

/// Sealing.
impl State {
    /// Seals every open batch (for a flush or a checkpoint), in lane order.
    /// The caller must write them to the device.
    pub fn seal_open_batch(&mut self) -> Vec<Arc<InFlightBatch>> {
        (0..OPEN_BATCH_COUNT)
            .filter_map(|lane| self.seal_lane(lane))
            .collect()
    }

    /// Seals the open batch of `lane`, if any. Deaths that waited for it
    /// take its sequence (`sealed_through`, unless it was empty and took
    /// none).
    fn seal_lane(&mut self, lane: usize) -> Option<Arc<InFlightBatch>> {
        let batch = self.writer.take_open_batch(lane)?;
        let sealed = self.seal(batch);
        self.space.lane_sealed(lane, self.writer.sealed_through());
        sealed
    }

    fn seal(&mut self, batch: OpenBatch) -> Option<Arc<InFlightBatch>> {
        let sealed = self.writer.seal(batch)?;
        self.space
            .batch_sealed_into(sealed.segment_index, sealed.in_flight.sequence);
        let now_blocks = self.client_blocks_written();
        self.placement
            .segment_written(sealed.segment_index, now_blocks);
        self.counters.batch_sealed(sealed.block_count);
        // A full head is sealed now rather than when its stream next appends:
        // a stream that seldom appends (the cold one, a cleaner stream) would
        // otherwise keep a segment open whose blocks may all have died. (After
        // `sealed_through` moved: this batch may have released its blocks.)
        if sealed.head_full {
            self.close_head_segment(sealed.stream);
        }
        Some(sealed.in_flight)
    }
}

/// The components a read uses at once, borrowed apart so that the heat can
/// learn of each access while a map borrowed from the volumes is walked.
pub struct ReadParts<'a> {
    pub geometry: &'a Geometry,
    pub volumes: &'a VolumeTable,
    /// Holds the blocks that have not reached the device yet.
    pub writer: &'a LogWriter,
    pub space: &'a SpaceAllocator,
    /// Heat of flash blocks and the promotion ghost (two-tier pools only).
    pub heat: Option<&'a mut Heat>,
}

impl State {
    /// The components a read uses, borrowed apart (see [`ReadParts`]).
    pub fn read_parts(&mut self) -> ReadParts<'_> {
        ReadParts {
            geometry: &self.geometry,
            volumes: &self.volumes,
            writer: &self.writer,
            space: &self.space,
            heat: self.heat.as_mut(),
        }
    }
}

impl State {
    /// Every volume's tier counters.
    pub fn all_tier_counters(&self) -> impl Iterator<Item = &VolumeTierCounters> {
        self.tier_counters.values()
    }
}
