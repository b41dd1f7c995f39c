//! The pool's in-memory state and the synchronous half of the write path: the
//! open batch being filled, batches in flight to the device, segment usage, and
//! the sequences that say what is written and what is durable. Everything here
//! runs under one mutex and never waits on I/O; the async half lives in `mod.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use lamina_device::AlignedBuffer;

use crate::BLOCK_SIZE_BYTES;
use crate::error::EngineError;
use crate::log::batch::{
    BATCH_DATA_BLOCKS_MAX, Record, SUMMARY_RECORD_BYTES_MAX, Summary, block_checksum,
};
use crate::log::geometry::{Geometry, Tier};
use crate::tier::heat::{Heat, VolumeTierCounters};
use crate::volume::VolumeTable;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentState {
    Free,
    /// The log head: batches are being appended to it.
    Open,
    Sealed,
    /// No live blocks since batch `died_at`; reusable once the older of the two
    /// durable checkpoints covers every batch written into the segment and the
    /// batches that killed its blocks are durable (see
    /// [`State::dead_segment_reusable`] and docs/decisions/0006-segment-reuse.md).
    Dead {
        died_at: u64,
    },
    /// Holds the body of a checkpoint that one of the two slots may name.
    Checkpoint {
        checkpoint_sequence: u64,
    },
}

#[derive(Clone, Copy, Debug)]
pub struct SegmentInfo {
    pub state: SegmentState,
    pub live_blocks: u32,
    /// The newest batch written into this segment (0 if none).
    pub last_batch_sequence: u64,
}

/// The log heads. Client writes and cleaner relocations go to different
/// segments, so that data the cleaner found cold is not mixed with fresh, hot
/// writes and stops being recleaned; relocations are further split by how many
/// cleanings their data has survived (see `cleaner::placement`). Only one batch
/// is open at a time, whichever stream it belongs to, so that append order and
/// sequence order are the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Client = 0,
    /// Relocations. Appending to it means "the cleaner's stream for the current
    /// victim": `make_room` resolves it to this stream (data that survived one
    /// cleaning) or a colder one through `State::placement`.
    Cleaner = 1,
    /// Data that survived two or more cleanings.
    Cold = 2,
    /// The capacity tier of a two-tier pool: blocks the cleaner demotes from
    /// flash, and blocks it moves out of capacity victims.
    Capacity = 3,
}

/// Number of log heads (one per [`Stream`]).
pub const STREAM_COUNT: usize = 4;

/// Free capacity segments that demotions leave to the cleaning of capacity
/// segments, so that capacity space can always be reclaimed.
pub const CAPACITY_RESERVE_SEGMENT_COUNT: usize = 2;

impl Stream {
    /// The stream for data that survives one more cleaning.
    pub fn colder(self) -> Stream {
        match self {
            Stream::Client => Stream::Cleaner,
            Stream::Cleaner | Stream::Cold => Stream::Cold,
            Stream::Capacity => Stream::Capacity,
        }
    }
}

/// Test hook, for every pool of the process: when set, a freed segment goes to
/// the front of the free list instead of the back, so that it is the next one
/// taken. Crash tests use it to rewrite a segment as soon as the reuse rule
/// allows (with the back, a segment freed too early is seldom reached before
/// the checkpoints that would have made its reuse safe anyway).
#[doc(hidden)]
pub static REUSE_FREED_SEGMENTS_FIRST: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Free segments each kind of allocation must leave behind.
/// Free segments kept for records without data (one segment holds thousands).
pub const RECORD_RESERVE_SEGMENT_COUNT: usize = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocation {
    /// Clients leave the cleaner's and the checkpoints' reserves.
    Client,
    /// The cleaner leaves the records' and the checkpoints' reserves.
    Cleaner,
    /// Records without data (trims, deletes, volume changes) leave the
    /// checkpoints' reserve: they are how a user frees a full pool.
    Record,
    /// Checkpoints may take the last free segment.
    Checkpoint,
}

#[derive(Clone, Copy, Debug)]
pub struct Head {
    pub segment_index: u32,
    pub segment_sequence: u64,
    pub next_block_in_segment: u32,
}

pub struct OpenBatch {
    pub stream: Stream,
    pub sequence: u64,
    pub segment_index: u32,
    pub segment_sequence: u64,
    pub block_in_segment: u32,
    /// Device block of the summary; data block `k` is at `summary_block + 1 + k`.
    pub summary_block: u64,
    pub records: Vec<Record>,
    pub record_bytes: usize,
    /// Block 0 is reserved for the summary, then the data blocks.
    pub buffer: AlignedBuffer,
    pub data_count: usize,
    pub data_capacity: usize,
}

/// A sealed batch on its way to the device; reads of its blocks are served from
/// its buffer until the write completes.
pub struct InFlightBatch {
    pub sequence: u64,
    pub summary_block: u64,
    pub buffer: Arc<AlignedBuffer>,
}

impl InFlightBatch {
    pub fn block_count(&self) -> u64 {
        self.buffer.len() as u64 / BLOCK_SIZE_BYTES
    }
}

/// A checkpoint known to be durable, with the segments its body occupies.
#[derive(Clone, Debug)]
pub struct DurableCheckpoint {
    pub slot_index: usize,
    pub checkpoint_sequence: u64,
    pub covered_batch_sequence: u64,
    pub body_segments: Vec<u32>,
}

pub struct State {
    pub geometry: Geometry,
    pub volumes: VolumeTable,
    pub segments: Vec<SegmentInfo>,
    /// Free flash segments (all free segments of a one-tier pool).
    pub free_segments: VecDeque<u32>,
    /// Free capacity segments.
    pub free_capacity_segments: VecDeque<u32>,
    /// The tier of the victim the cleaner is moving blocks out of.
    pub cleaning_tier: Tier,
    /// Free flash segments that only checkpoints may take, so that space can
    /// always be reclaimed even when clients have filled the pool (0 in a
    /// two-tier pool, whose checkpoints live on capacity).
    pub checkpoint_reserve_segment_count: usize,
    /// Free capacity segments that only checkpoints may take (two-tier pools).
    pub capacity_checkpoint_reserve_segment_count: usize,
    /// Free segments that clients leave to the cleaner, so that it can always
    /// relocate live blocks out of a victim before the victim is freed.
    pub cleaner_reserve_segment_count: usize,
    /// Log heads, indexed by [`Stream`].
    pub heads: [Option<Head>; STREAM_COUNT],
    /// Which stream each segment's data belongs to, and where relocations go.
    pub placement: super::cleaner::placement::Placement,
    pub open_batch: Option<OpenBatch>,
    pub in_flight: BTreeMap<u64, Arc<InFlightBatch>>,
    pub in_flight_sequences: BTreeSet<u64>,
    pub next_batch_sequence: u64,
    pub next_segment_sequence: u64,
    pub sealed_through: u64,
    pub durable_through: u64,
    pub failed: Option<String>,
    /// Oldest first, at most two.
    pub durable_checkpoints: Vec<DurableCheckpoint>,
    pub next_checkpoint_sequence: u64,
    pub sealed_bytes_total: u64,
    pub flushed_bytes_total: u64,
    pub bytes_at_last_checkpoint: u64,
    pub client_bytes_written: u64,
    /// Bytes of checkpoint bodies and slots written.
    pub checkpoint_bytes_written: u64,
    /// Blocks the cleaner has relocated.
    pub relocated_blocks: u64,
    /// The memory cache, told when a segment is freed so that none of its old
    /// blocks can be served once the segment is rewritten.
    pub cache: Option<Arc<crate::tier::memory_cache::MemoryCache>>,
    /// Heat of flash blocks and the promotion ghost (two-tier pools only).
    pub heat: Option<Heat>,
    /// Per volume: reads per tier, promotions and demotions since the pool opened.
    pub tier_counters: HashMap<u32, VolumeTierCounters>,
}

impl State {
    /// Batches up to this sequence have completed their device writes.
    pub fn written_through(&self) -> u64 {
        match self.in_flight_sequences.first() {
            Some(oldest) => oldest - 1,
            None => self.sealed_through,
        }
    }

    pub fn check_failed(&self) -> Result<(), EngineError> {
        match &self.failed {
            Some(reason) => Err(EngineError::Failed(reason.clone())),
            None => Ok(()),
        }
    }

    /// The batch sequence the next appended record will belong to.
    fn current_sequence(&self) -> u64 {
        self.open_batch
            .as_ref()
            .map_or(self.next_batch_sequence, |batch| batch.sequence)
    }

    /// Accounts for a physical block that no map references any more.
    pub fn release_block(&mut self, physical_block: u64) {
        // A dead block's cached copy can never be read again: free its slot for
        // live data (otherwise overwrites fill the cache with garbage).
        if let Some(cache) = &self.cache {
            cache.invalidate_range(physical_block, 1);
        }
        let died_at = self.current_sequence();
        let segment = &mut self.segments[self.geometry.segment_of(physical_block) as usize];
        assert!(
            segment.live_blocks > 0,
            "segment live count underflow at block {physical_block}"
        );
        segment.live_blocks -= 1;
        if segment.live_blocks == 0 && segment.state == SegmentState::Sealed {
            segment.state = SegmentState::Dead { died_at };
        }
    }

    /// Free segments that `allocation` must leave untouched.
    pub fn reserve_for(&self, allocation: Allocation) -> usize {
        match allocation {
            Allocation::Client => {
                self.checkpoint_reserve_segment_count
                    + RECORD_RESERVE_SEGMENT_COUNT
                    + self.cleaner_reserve_segment_count
            }
            Allocation::Cleaner => {
                self.checkpoint_reserve_segment_count + RECORD_RESERVE_SEGMENT_COUNT
            }
            Allocation::Record => self.checkpoint_reserve_segment_count,
            Allocation::Checkpoint => 0,
        }
    }

    /// Takes a free segment, leaving the reserves that `allocation` may not touch.
    pub fn take_free_segment(&mut self, allocation: Allocation) -> Option<u32> {
        if self.free_segments.len() <= self.reserve_for(allocation) {
            return None;
        }
        let index = self.free_segments.pop_front()?;
        assert_eq!(self.segments[index as usize].state, SegmentState::Free);
        Some(index)
    }

    /// Takes a free capacity segment. Demotions leave
    /// [`CAPACITY_RESERVE_SEGMENT_COUNT`] to the cleaning of capacity victims.
    pub fn take_free_capacity_segment(&mut self) -> Option<u32> {
        let reserve = self.capacity_checkpoint_reserve_segment_count
            + if self.cleaning_tier == Tier::Capacity {
                0
            } else {
                CAPACITY_RESERVE_SEGMENT_COUNT
            };
        if self.free_capacity_segments.len() <= reserve {
            return None;
        }
        let index = self.free_capacity_segments.pop_front()?;
        assert_eq!(self.segments[index as usize].state, SegmentState::Free);
        assert_eq!(self.geometry.tier_of_segment(index), Tier::Capacity);
        Some(index)
    }

    /// Whether a demotion appended now would find room on capacity.
    pub fn can_demote(&self) -> bool {
        if !self.geometry.has_capacity_tier() {
            return false;
        }
        let segment_size_blocks = self.geometry.segment_size_blocks as u32;
        let head_has_room = self.heads[Stream::Capacity as usize]
            .is_some_and(|head| head.next_block_in_segment + 2 <= segment_size_blocks);
        head_has_room
            || self.free_capacity_segments.len()
                > CAPACITY_RESERVE_SEGMENT_COUNT + self.capacity_checkpoint_reserve_segment_count
    }

    /// Takes a free segment for a checkpoint body: any free flash segment in a
    /// one-tier pool, any free capacity segment in a two-tier pool.
    pub fn take_free_checkpoint_segment(&mut self) -> Option<u32> {
        if !self.geometry.has_capacity_tier() {
            return self.take_free_segment(Allocation::Checkpoint);
        }
        let index = self.free_capacity_segments.pop_front()?;
        assert_eq!(self.segments[index as usize].state, SegmentState::Free);
        Some(index)
    }

    /// Gives back a free segment taken but not used, first in line again.
    pub fn return_free_segment(&mut self, segment_index: u32) {
        assert_eq!(
            self.segments[segment_index as usize].state,
            SegmentState::Free
        );
        match self.geometry.tier_of_segment(segment_index) {
            Tier::Flash => self.free_segments.push_front(segment_index),
            Tier::Capacity => self.free_capacity_segments.push_front(segment_index),
        }
    }

    fn seal_head_segment(&mut self, stream: Stream) {
        if let Some(head) = self.heads[stream as usize].take() {
            // Blocks are released only while a batch is open, so with none open
            // every release happened in a sealed batch, and any checkpoint that
            // covers `sealed_through` was taken after it. (The next sequence,
            // which `current_sequence` gives, may not be sealed for a long
            // time: a blocked writer's reclaim would wait for it forever.)
            let died_at = if self.open_batch.is_some() {
                self.current_sequence()
            } else {
                self.sealed_through
            };
            let segment = &mut self.segments[head.segment_index as usize];
            segment.state = if segment.live_blocks == 0 {
                SegmentState::Dead { died_at }
            } else {
                SegmentState::Sealed
            };
        }
    }

    /// Makes sure the open batch can take a record of `record_bytes` (and a data
    /// block when `with_data`), sealing the current batch and opening a new one (in
    /// a new segment if needed). Sealed batches are pushed to `sealed`.
    fn make_room(
        &mut self,
        stream: Stream,
        record_bytes: usize,
        with_data: bool,
        sealed: &mut Vec<Arc<InFlightBatch>>,
    ) -> Result<(), EngineError> {
        let stream = match stream {
            Stream::Client => Stream::Client,
            Stream::Cleaner | Stream::Cold => self.placement.relocation_stream(),
            Stream::Capacity => Stream::Capacity,
        };
        if let Some(batch) = &self.open_batch {
            let fits_records = batch.record_bytes + record_bytes <= SUMMARY_RECORD_BYTES_MAX;
            let fits_data = !with_data || batch.data_count < batch.data_capacity;
            if batch.stream == stream && fits_records && fits_data {
                return Ok(());
            }
            sealed.extend(self.seal_open_batch());
        }
        let segment_size_blocks = self.geometry.segment_size_blocks as u32;
        if self.heads[stream as usize]
            .is_some_and(|head| head.next_block_in_segment + 2 > segment_size_blocks)
        {
            self.seal_head_segment(stream);
        }
        if self.heads[stream as usize].is_none() {
            // Records without data (trims, deletes) may use the cleaner's reserve:
            // they are tiny, and they are how a user frees a full pool.
            let allocation = match (stream, with_data) {
                (Stream::Client, true) => Allocation::Client,
                (Stream::Client, false) => Allocation::Record,
                (Stream::Cleaner | Stream::Cold | Stream::Capacity, _) => Allocation::Cleaner,
            };
            let segment_index = if stream == Stream::Capacity {
                assert!(with_data, "records without data go to the client stream");
                self.take_free_capacity_segment()
            } else {
                self.take_free_segment(allocation)
            }
            .ok_or(EngineError::NoSpace)?;
            let segment_sequence = self.next_segment_sequence;
            self.next_segment_sequence += 1;
            self.segments[segment_index as usize].state = SegmentState::Open;
            self.placement.segment_opened(segment_index, stream);
            self.heads[stream as usize] = Some(Head {
                segment_index,
                segment_sequence,
                next_block_in_segment: 0,
            });
        }
        let head = self.heads[stream as usize].expect("head opened above");
        let remaining = (segment_size_blocks - head.next_block_in_segment) as usize;
        let data_capacity = BATCH_DATA_BLOCKS_MAX.min(remaining - 1);
        let sequence = self.next_batch_sequence;
        self.next_batch_sequence += 1;
        self.open_batch = Some(OpenBatch {
            stream,
            sequence,
            segment_index: head.segment_index,
            segment_sequence: head.segment_sequence,
            block_in_segment: head.next_block_in_segment,
            summary_block: self.geometry.segment_first_block(head.segment_index)
                + u64::from(head.next_block_in_segment),
            records: Vec::new(),
            record_bytes: 0,
            buffer: AlignedBuffer::zeroed((1 + data_capacity) * BLOCK_SIZE_BYTES as usize),
            data_count: 0,
            data_capacity,
        });
        Ok(())
    }

    /// Appends a non-data record and applies it to the volumes.
    pub fn append_record(
        &mut self,
        record: Record,
    ) -> Result<Vec<Arc<InFlightBatch>>, EngineError> {
        assert!(!record.carries_data());
        self.check_failed()?;
        let mut sealed = Vec::new();
        self.make_room(
            Stream::Client,
            record.encoded_bytes_max(),
            false,
            &mut sealed,
        )?;
        let batch = self.open_batch.as_mut().expect("room made");
        batch.record_bytes += record.encoded_bytes_max();
        batch.records.push(record.clone());
        let mut displaced = Vec::new();
        self.volumes
            .apply(&record, None, &mut |block| displaced.push(block));
        for block in displaced {
            self.release_block(block);
        }
        Ok(sealed)
    }

    /// Appends one 4 KiB data block for `logical_block` of `volume_id`.
    pub fn append_data(
        &mut self,
        volume_id: u32,
        logical_block: u64,
        data: &[u8],
        sealed: &mut Vec<Arc<InFlightBatch>>,
    ) -> Result<(), EngineError> {
        self.check_failed()?;
        let record = Record::Data {
            volume_id,
            logical_block,
            checksum: block_checksum(data),
        };
        // A rewrite is an access: the new block starts with the heat of the
        // flash block it replaces.
        let replaced_counter = self.heat.as_ref().and_then(|heat| {
            let volume = self.volumes.get(volume_id)?;
            let replaced = volume.map.get(logical_block)?.physical_block;
            Some(heat.counter(self.geometry.flash_data_index(replaced)?))
        });
        let physical_block = self.append_block(Stream::Client, record, data, sealed)?;
        self.client_bytes_written += BLOCK_SIZE_BYTES;
        self.set_heat(
            volume_id,
            physical_block,
            Heat::after_rewrite(replaced_counter),
        );
        Ok(())
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

    /// Per-volume tier counters, created on first use.
    pub fn tier_counters_of(&mut self, volume_id: u32) -> &mut VolumeTierCounters {
        self.tier_counters.entry(volume_id).or_default()
    }

    /// Moves a block read from `from_physical_block` to the head of `stream`,
    /// if some map of `family` (the writing volume, its snapshots and clones;
    /// see `VolumeTable::family`) still holds it. Every map holding it is
    /// repointed. Returns whether it moved. `Stream::Cleaner` is the cleaner's
    /// stream for its current victim, `Stream::Capacity` a demotion (or a move
    /// within capacity) and `Stream::Client` a promotion to flash.
    #[allow(clippy::too_many_arguments)]
    pub fn append_relocation(
        &mut self,
        family: &[u32],
        volume_id: u32,
        logical_block: u64,
        from_physical_block: u64,
        data: &[u8],
        stream: Stream,
        sealed: &mut Vec<Arc<InFlightBatch>>,
    ) -> Result<bool, EngineError> {
        self.check_failed()?;
        let Some(checksum) =
            self.volumes
                .holder_checksum(family, logical_block, from_physical_block)
        else {
            return Ok(false);
        };
        let record = Record::Relocate {
            volume_id,
            logical_block,
            from_physical_block,
            checksum,
        };
        // Within flash the block keeps its heat (the cleaner has already
        // decremented it); a promoted block starts cold, as S3-FIFO's ghost
        // hits enter its main queue (measured +0.5 to +0.7 points of hit ratio
        // over starting at 1, with fewer relocations: docs/decisions/0004).
        let counter = match self.geometry.flash_data_index(from_physical_block) {
            Some(index) => self.heat.as_ref().map_or(0, |heat| heat.counter(index)),
            None => 0,
        };
        let physical_block = self.append_block(stream, record, data, sealed)?;
        if stream != Stream::Client {
            self.relocated_blocks += 1;
        }
        self.set_heat(volume_id, physical_block, counter);
        Ok(true)
    }

    /// Appends a record with its data block; returns the block's address.
    fn append_block(
        &mut self,
        stream: Stream,
        record: Record,
        data: &[u8],
        sealed: &mut Vec<Arc<InFlightBatch>>,
    ) -> Result<u64, EngineError> {
        assert_eq!(data.len(), BLOCK_SIZE_BYTES as usize);
        assert!(record.carries_data());
        self.make_room(stream, record.encoded_bytes_max(), true, sealed)?;
        let batch = self.open_batch.as_mut().expect("room made");
        let start = (1 + batch.data_count) * BLOCK_SIZE_BYTES as usize;
        batch.buffer[start..start + BLOCK_SIZE_BYTES as usize].copy_from_slice(data);
        let physical_block = batch.summary_block + 1 + batch.data_count as u64;
        batch.data_count += 1;
        batch.record_bytes += record.encoded_bytes_max();
        batch.records.push(record.clone());
        self.segments[self.geometry.segment_of(physical_block) as usize].live_blocks += 1;
        let mut displaced = None;
        self.volumes
            .apply(&record, Some(physical_block), &mut |block| {
                displaced = Some(block)
            });
        if let Some(block) = displaced {
            self.release_block(block);
        }
        Ok(physical_block)
    }

    /// Closes the open batch: writes its summary into block 0 of its buffer and
    /// moves it to the in-flight table. The caller must write it to the device.
    pub fn seal_open_batch(&mut self) -> Option<Arc<InFlightBatch>> {
        let mut batch = self.open_batch.take()?;
        if batch.records.is_empty() {
            // Nothing to write: give the sequence back so sequences stay dense.
            assert_eq!(batch.sequence + 1, self.next_batch_sequence);
            self.next_batch_sequence -= 1;
            return None;
        }
        let summary = Summary {
            segment_sequence: batch.segment_sequence,
            block_in_segment: batch.block_in_segment,
            batch_sequence: batch.sequence,
            flushed_through_sequence: self.durable_through,
            records: std::mem::take(&mut batch.records),
        };
        let encoded = summary.encode();
        batch.buffer[..BLOCK_SIZE_BYTES as usize].copy_from_slice(&encoded);
        let block_count = 1 + batch.data_count;
        batch
            .buffer
            .truncate(block_count * BLOCK_SIZE_BYTES as usize);
        let head = self.heads[batch.stream as usize]
            .as_mut()
            .expect("an open batch has a head");
        assert_eq!(head.segment_index, batch.segment_index);
        head.next_block_in_segment += block_count as u32;
        self.segments[batch.segment_index as usize].last_batch_sequence = batch.sequence;
        let in_flight = Arc::new(InFlightBatch {
            sequence: batch.sequence,
            summary_block: batch.summary_block,
            buffer: Arc::new(batch.buffer),
        });
        self.in_flight
            .insert(batch.summary_block, in_flight.clone());
        self.in_flight_sequences.insert(batch.sequence);
        self.sealed_through = batch.sequence;
        self.sealed_bytes_total += block_count as u64 * BLOCK_SIZE_BYTES;
        Some(in_flight)
    }

    /// Copies block `physical_block` from memory if it has not reached the device
    /// yet (open batch or in flight). Returns false when it must be read from disk.
    pub fn copy_unwritten_block(&self, physical_block: u64, destination: &mut [u8]) -> bool {
        let block = BLOCK_SIZE_BYTES as usize;
        if let Some(batch) = &self.open_batch
            && physical_block > batch.summary_block
            && physical_block <= batch.summary_block + batch.data_count as u64
        {
            let start = (physical_block - batch.summary_block) as usize * block;
            destination.copy_from_slice(&batch.buffer[start..start + block]);
            return true;
        }
        if let Some((_, batch)) = self.in_flight.range(..=physical_block).next_back()
            && physical_block < batch.summary_block + batch.block_count()
        {
            let start = (physical_block - batch.summary_block) as usize * block;
            destination.copy_from_slice(&batch.buffer[start..start + block]);
            return true;
        }
        false
    }

    /// Records a durable checkpoint and frees what it makes reclaimable: the body
    /// segments of the checkpoint it displaced, and the dead segments that may
    /// now be reused (see [`State::free_reusable_dead_segments`]).
    pub fn checkpoint_became_durable(&mut self, checkpoint: DurableCheckpoint) {
        self.durable_checkpoints.push(checkpoint);
        while self.durable_checkpoints.len() > 2 {
            let displaced = self.durable_checkpoints.remove(0);
            for segment_index in displaced.body_segments {
                self.free_segment(segment_index);
            }
        }
        self.free_reusable_dead_segments();
    }

    /// The batch sequence that every checkpoint recovery may start from covers:
    /// the older of the two kept durable checkpoints' (the only one's when just
    /// one is kept, since recovery then has no other to fall back to).
    pub fn covered_by_every_checkpoint(&self) -> u64 {
        self.durable_checkpoints
            .first()
            .map_or(0, |oldest| oldest.covered_batch_sequence)
    }

    /// Whether a dead segment may be rewritten. Recovery, from either kept
    /// checkpoint, reads summaries only of batches newer than that checkpoint,
    /// and never reads a data block of a batch it does not replay; so a segment
    /// is not needed once (a) every batch written into it is covered by both
    /// checkpoints, and (b) the batches whose records took its last blocks out
    /// of every map are durable, so that replay finds them and no recovered map
    /// points into the segment. A checkpoint taken after the death is not
    /// needed. docs/decisions/0006-segment-reuse.md gives the whole argument.
    pub fn dead_segment_reusable(&self, segment: &SegmentInfo) -> bool {
        match segment.state {
            SegmentState::Dead { died_at } => {
                segment.last_batch_sequence <= self.covered_by_every_checkpoint()
                    && died_at <= self.durable_through
            }
            _ => false,
        }
    }

    /// Frees every dead segment that [`State::dead_segment_reusable`] allows.
    /// Called when a checkpoint becomes durable, and by the cleaner after the
    /// flushes that make its relocations durable. Returns how many were freed.
    pub fn free_reusable_dead_segments(&mut self) -> usize {
        let mut freed = 0;
        for index in 0..self.segments.len() {
            if self.dead_segment_reusable(&self.segments[index]) {
                self.free_segment(index as u32);
                freed += 1;
            }
        }
        freed
    }

    pub fn free_segment(&mut self, segment_index: u32) {
        let segment = &mut self.segments[segment_index as usize];
        assert_eq!(
            segment.live_blocks, 0,
            "freeing segment {segment_index} with live blocks"
        );
        segment.state = SegmentState::Free;
        // Oldest freed first: a freed segment is rewritten as late as possible.
        // Tests that must see a segment rewritten soon after it is freed turn
        // the order around.
        let first = REUSE_FREED_SEGMENTS_FIRST.load(std::sync::atomic::Ordering::Relaxed);
        let free_list = match self.geometry.tier_of_segment(segment_index) {
            Tier::Flash => &mut self.free_segments,
            Tier::Capacity => &mut self.free_capacity_segments,
        };
        if first {
            free_list.push_front(segment_index);
        } else {
            free_list.push_back(segment_index);
        }
        if let Some(cache) = &self.cache {
            cache.invalidate_range(
                self.geometry.segment_first_block(segment_index),
                self.geometry.segment_size_blocks,
            );
        }
    }

    /// Dead flash segments whose death a sealed batch covers: a flush or
    /// checkpoints free them (one that died in the open batch waits for that
    /// batch to be sealed).
    pub fn sealed_dead_flash_segment_count(&self) -> usize {
        self.segments[..self.geometry.flash_segment_count as usize]
            .iter()
            .filter(|segment| {
                matches!(segment.state, SegmentState::Dead { died_at }
                    if died_at <= self.sealed_through)
            })
            .count()
    }

    pub fn used_segment_count(&self) -> usize {
        self.segments.len() - self.free_segments.len() - self.free_capacity_segments.len()
    }
}
