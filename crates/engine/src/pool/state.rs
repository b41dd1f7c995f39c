//! The pool's in-memory state and the synchronous half of the write path: the
//! open batch being filled, batches in flight to the device, segment usage, and
//! the sequences that say what is written and what is durable. Everything here
//! runs under one mutex and never waits on I/O; the async half lives in `mod.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use lamina_device::AlignedBuffer;

use crate::BLOCK_SIZE_BYTES;
use crate::error::EngineError;
use crate::log::batch::{
    BATCH_DATA_BLOCKS_MAX, Record, SUMMARY_RECORD_BYTES_MAX, Summary, block_checksum,
};
use crate::log::checkpoint::CountersImage;
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
    /// While the batches that killed it are still open, `died_at` is
    /// [`DEATH_PENDING`]: their sequences are given when they are sealed.
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
    /// Whether replay from a checkpoint that does not cover this incarnation
    /// needs its batches to rebuild the maps: a block was moved out of it (a
    /// relocation record names it as the block's old home), or its batches
    /// hold records without data. Otherwise every record in it only wrote
    /// data that later, durable records replaced, and it may be rewritten as
    /// soon as those are durable (see [`State::dead_segment_reusable`]).
    /// True when unknown (after recovery).
    pub needed_by_replay: bool,
    /// Whether the cleaner set it aside: its summaries do not describe every
    /// block (both copies of one are damaged), so it cannot be cleaned; its
    /// live blocks are still served, and it is freed if they all die.
    pub set_aside: bool,
}

/// Dead segments by what frees them ([`State::sealed_dead_flash_segment_counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeadSegmentCounts {
    pub awaiting_flush: usize,
    pub awaiting_checkpoints: usize,
    /// Of those awaiting checkpoints, the ones written since the newest
    /// durable checkpoint: two more checkpoints free them (the others, one).
    pub awaiting_two_checkpoints: usize,
}

impl DeadSegmentCounts {
    pub fn total(&self) -> usize {
        self.awaiting_flush + self.awaiting_checkpoints
    }
}

/// `died_at` of a segment whose death waits for the open batches to be sealed.
pub const DEATH_PENDING: u64 = u64::MAX;

/// Blocks a batch takes besides its data: the summary and its copy.
pub const BATCH_OVERHEAD_BLOCKS: u32 = 2;

/// The log heads. Client writes and cleaner relocations go to different
/// segments, so that data the cleaner found cold is not mixed with fresh, hot
/// writes and stops being recleaned; relocations are further split by the age
/// of their data or the cleanings it survived (see `cleaner::placement`), and
/// client writes by how often the block is rewritten (`Client`, `ClientWarm`
/// and `ClientCold`). One batch of any other stream is open at a time (the
/// main batch, lane 0), plus one of `ClientCold` (lane 1) and one of
/// `ClientWarm` (lane 2; see [`lane_of`]). Sequences are given when batches
/// are sealed, and replay goes in sequence order, so before a record is
/// appended to one of them, the others are sealed if they hold a record that
/// does not commute with it (see [`OpenBatch::conflicts_with`]): replay then
/// meets conflicting records in the order they were appended in memory
/// (docs/decisions/0008).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// Client writes of blocks rewritten more often than recently cleaned
    /// client segments lived, records without data, and promotions.
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
    /// Client writes predicted long-lived: first writes of a block, and
    /// rewrites of blocks rewritten seldom.
    ClientCold = 4,
    /// Relocations of data older still than `Cold`'s (see
    /// `cleaner::placement`; one-tier pools only).
    Colder = 5,
    /// Relocations of the oldest data.
    Coldest = 6,
    /// Client writes of blocks rewritten less often than `Client`'s and more
    /// often than `ClientCold`'s.
    ClientWarm = 7,
}

/// Number of log heads (one per [`Stream`]).
pub const STREAM_COUNT: usize = 8;

/// The client streams of a one-tier pool, most often rewritten first.
pub const CLIENT_STREAMS: [Stream; 3] = [Stream::Client, Stream::ClientWarm, Stream::ClientCold];

/// The relocation streams of a one-tier pool, youngest data first: the
/// cleaner sends a victim's live blocks to one of them by the age of the data
/// (`cleaner::placement`).
pub const RELOCATION_STREAMS: [Stream; 4] = [
    Stream::Cleaner,
    Stream::Cold,
    Stream::Colder,
    Stream::Coldest,
];

/// Batches open at once: the main one, the cold client one and the warm
/// client one.
pub const OPEN_BATCH_COUNT: usize = 3;

/// The open batch (lane) a stream's appends go to: 1 for `ClientCold`, 2 for
/// `ClientWarm`, 0 (the main batch) for every other stream.
pub fn lane_of(stream: Stream) -> usize {
    match stream {
        Stream::ClientCold => 1,
        Stream::ClientWarm => 2,
        _ => 0,
    }
}

/// Free capacity segments that demotions leave to the cleaning of capacity
/// segments, so that capacity space can always be reclaimed.
pub const CAPACITY_RESERVE_SEGMENT_COUNT: usize = 2;

impl Stream {
    /// The stream for data that survives one more cleaning, when streams are
    /// not chosen by the age of the data (a two-tier pool's flash, or the
    /// client split turned off).
    pub fn colder(self) -> Stream {
        match self {
            Stream::Client | Stream::ClientWarm | Stream::ClientCold => Stream::Cleaner,
            Stream::Cleaner | Stream::Cold => Stream::Cold,
            Stream::Colder | Stream::Coldest => Stream::Coldest,
            Stream::Capacity => Stream::Capacity,
        }
    }

    /// Whether this is one of the flash relocation streams.
    pub fn is_relocation(self) -> bool {
        RELOCATION_STREAMS.contains(&self)
    }

    /// The stream numbered `number` (its discriminant), if any.
    pub fn from_number(number: u8) -> Option<Stream> {
        [
            Stream::Client,
            Stream::Cleaner,
            Stream::Cold,
            Stream::Capacity,
            Stream::ClientCold,
            Stream::Colder,
            Stream::Coldest,
            Stream::ClientWarm,
        ]
        .into_iter()
        .find(|stream| *stream as u8 == number)
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

impl Head {
    /// Whether the segment still has room for a batch of one data block (its
    /// summary, the block and the summary's copy) in a segment of
    /// `segment_size_blocks`.
    pub fn has_room_for_a_data_block(&self, segment_size_blocks: u32) -> bool {
        self.next_block_in_segment + BATCH_OVERHEAD_BLOCKS < segment_size_blocks
    }
}

/// A batch being filled. Its sequence is given when it is sealed: with
/// several batches open at once, sealing order is replay order.
pub struct OpenBatch {
    pub stream: Stream,
    pub segment_index: u32,
    pub segment_sequence: u64,
    pub block_in_segment: u32,
    /// Device block of the summary; data block `k` is at `summary_block + 1 + k`.
    pub summary_block: u64,
    pub records: Vec<Record>,
    pub record_bytes: usize,
    /// Block 0 is reserved for the summary, then the data blocks, then room
    /// for the summary's copy.
    pub buffer: AlignedBuffer,
    pub data_count: usize,
    pub data_capacity: usize,
    /// The (volume, logical block) pairs its `Data` records write.
    pub data_blocks: HashSet<(u32, u64)>,
    /// Whether it holds a record without data (trim, snapshot, volume change).
    pub has_records_without_data: bool,
}

impl OpenBatch {
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
            } => {
                self.has_records_without_data
                    || self.data_blocks.contains(&(*volume_id, *logical_block))
            }
            Record::Relocate { .. } => false,
            _ => true,
        }
    }

    /// Whether `record` (and its data block, if it carries one) fits.
    pub fn has_room_for(&self, record: &Record) -> bool {
        self.record_bytes + record.encoded_bytes_max() <= SUMMARY_RECORD_BYTES_MAX
            && (!record.carries_data() || self.data_count < self.data_capacity)
    }

    fn push(&mut self, record: Record) {
        self.record_bytes += record.encoded_bytes_max();
        match &record {
            Record::Data {
                volume_id,
                logical_block,
                ..
            } => {
                self.data_blocks.insert((*volume_id, *logical_block));
            }
            Record::Relocate { .. } => {}
            _ => self.has_records_without_data = true,
        }
        self.records.push(record);
    }
}

/// A segment that died while batches were open: its `died_at` is the newest
/// of `sealed_through` then and the sequences those batches get.
#[derive(Clone, Copy, Debug)]
pub struct PendingDeath {
    pub segment_index: u32,
    pub died_at: u64,
    /// Per lane: whether the batch open there at the death is still open.
    pub waits_for: [bool; OPEN_BATCH_COUNT],
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
    /// Per lane ([`lane_of`]): the main batch (any stream but the two below),
    /// the cold client batch and the warm client batch.
    pub open_batches: [Option<OpenBatch>; OPEN_BATCH_COUNT],
    /// Segments that died while batches were open.
    pub pending_deaths: Vec<PendingDeath>,
    /// Whether client writes are split between the client streams by how
    /// often their blocks are rewritten (one-tier pools; a two-tier pool's
    /// flash is a FIFO, where separation saves no cleaning).
    pub separate_client_writes: bool,
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
    /// Bytes of flush markers written since the pool opened.
    pub marker_bytes_written: u64,
    /// Blocks the cleaner has relocated.
    pub relocated_blocks: u64,
    /// The write counters over the pool's life up to the checkpoint it was
    /// opened from; the three fields above count since then.
    pub counters_before_open: CountersImage,
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

    /// Whether records wait in an open batch.
    pub fn has_unsealed_records(&self) -> bool {
        self.open_batches
            .iter()
            .flatten()
            .any(|batch| !batch.records.is_empty())
    }

    /// Client blocks written over the pool's life (as far as checkpoints
    /// kept it): the clock that segment and block lifespans are counted in,
    /// which goes on across restarts with the placement hints.
    pub fn client_blocks_written(&self) -> u64 {
        (self.counters_before_open.client_bytes_written + self.client_bytes_written)
            / BLOCK_SIZE_BYTES
    }

    /// The write counters over the pool's life (those kept in its newest
    /// checkpoint when it opened, plus what was written since).
    pub fn lifetime_counters(&self) -> CountersImage {
        let before = self.counters_before_open;
        CountersImage {
            client_bytes_written: before.client_bytes_written + self.client_bytes_written,
            device_bytes_written: before.device_bytes_written
                + self.sealed_bytes_total
                + self.checkpoint_bytes_written
                + self.marker_bytes_written,
            cleaner_relocated_blocks: before.cleaner_relocated_blocks + self.relocated_blocks,
        }
    }

    /// Marks `segment_index` dead. Its blocks were released by sealed batches
    /// or by the batches open now, so it died at the newest of
    /// `sealed_through` and the sequences the open ones will get: until they
    /// are sealed its `died_at` is [`DEATH_PENDING`]. (Not the next sequence:
    /// with no batch open, it may not be sealed for a long time, and a blocked
    /// writer's reclaim would wait for it forever.)
    fn mark_dead(&mut self, segment_index: u32) {
        let waits_for = self.open_batches.each_ref().map(Option::is_some);
        let died_at = if waits_for.contains(&true) {
            self.pending_deaths.push(PendingDeath {
                segment_index,
                died_at: self.sealed_through,
                waits_for,
            });
            DEATH_PENDING
        } else {
            self.sealed_through
        };
        self.segments[segment_index as usize].state = SegmentState::Dead { died_at };
    }

    /// Accounts for a physical block that no map references any more.
    pub fn release_block(&mut self, physical_block: u64) {
        // A dead block's cached copy can never be read again: free its slot for
        // live data (otherwise overwrites fill the cache with garbage).
        if let Some(cache) = &self.cache {
            cache.invalidate_range(physical_block, 1);
        }
        let segment_index = self.geometry.segment_of(physical_block);
        let segment = &mut self.segments[segment_index as usize];
        assert!(
            segment.live_blocks > 0,
            "segment live count underflow at block {physical_block}"
        );
        segment.live_blocks -= 1;
        if segment.live_blocks == 0 && segment.state == SegmentState::Sealed {
            self.mark_dead(segment_index);
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

    /// Whether cleaning is the only way left to free space and the cleaner
    /// cannot start without a new segment: no relocation head has room, and
    /// no flash segment is dead (none that a flush or checkpoint would free).
    ///
    /// Recovery leaves this state when a crash interrupts the cleaner at the
    /// bottom of its reserve (issue 16): recovery seals every head, however
    /// much room it had, and the victims whose last relocations were not
    /// written keep a block or two, so nothing the cleaner was about to free
    /// is freed. The free segments are then exactly those the cleaner leaves
    /// (or fewer, once trims took the records' reserve), and before this rule
    /// it could never relocate again: every write failed with ENOSPC, across
    /// restarts. See [`State::cleaner_restart_reserve`].
    pub fn cleaner_must_restart(&self) -> bool {
        let segment_size_blocks = self.geometry.segment_size_blocks as u32;
        let head_has_room = RELOCATION_STREAMS.iter().any(|stream| {
            self.heads[*stream as usize]
                .is_some_and(|head| head.has_room_for_a_data_block(segment_size_blocks))
        });
        !head_has_room
            && !self.segments[..self.geometry.flash_segment_count as usize]
                .iter()
                .any(|segment| matches!(segment.state, SegmentState::Dead { .. }))
    }

    /// Free segments a cleaner that must restart
    /// ([`State::cleaner_must_restart`]) leaves: the records' reserve, and of
    /// the checkpoints' reserve what checkpoints may still take. That reserve
    /// counts three bodies (two durable, one being written); the durable
    /// ones' flash segments are already out of the free list, so only the
    /// rest of it is needed. Once cleaning has started, relocations leave the
    /// whole reserve again ([`State::reserve_for`]).
    pub fn cleaner_restart_reserve(&self) -> usize {
        let held_body_segment_count = self
            .durable_checkpoints
            .iter()
            .flat_map(|checkpoint| &checkpoint.body_segments)
            .filter(|segment| self.geometry.tier_of_segment(**segment) == Tier::Flash)
            .count();
        self.checkpoint_reserve_segment_count
            .saturating_sub(held_body_segment_count)
            + RECORD_RESERVE_SEGMENT_COUNT
    }

    /// Takes a free segment, leaving the reserves that `allocation` may not touch.
    pub fn take_free_segment(&mut self, allocation: Allocation) -> Option<u32> {
        let reserve = match allocation {
            Allocation::Cleaner if self.cleaner_must_restart() => self
                .cleaner_restart_reserve()
                .min(self.reserve_for(allocation)),
            _ => self.reserve_for(allocation),
        };
        if self.free_segments.len() <= reserve {
            return None;
        }
        let index = if allocation == Allocation::Checkpoint {
            self.free_segments.pop_front()?
        } else {
            let covered = self.covered_by_every_checkpoint();
            pop_free_keeping_settled(
                &mut self.free_segments,
                &self.segments,
                covered,
                self.checkpoint_reserve_segment_count,
            )?
        };
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
        let covered = self.covered_by_every_checkpoint();
        let index = pop_free_keeping_settled(
            &mut self.free_capacity_segments,
            &self.segments,
            covered,
            self.capacity_checkpoint_reserve_segment_count,
        )?;
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
            .is_some_and(|head| head.has_room_for_a_data_block(segment_size_blocks));
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
            if self.segments[head.segment_index as usize].live_blocks == 0 {
                self.mark_dead(head.segment_index);
            } else {
                self.segments[head.segment_index as usize].state = SegmentState::Sealed;
            }
        }
    }

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
            lane == 0 || record.carries_data(),
            "records without data go to the main batch"
        );
        for other in (0..OPEN_BATCH_COUNT).filter(|other| *other != lane) {
            if self.open_batches[other]
                .as_ref()
                .is_some_and(|batch| batch.conflicts_with(record))
            {
                sealed.extend(self.seal_lane(other));
            }
        }
        if let Some(batch) = &self.open_batches[lane] {
            if batch.stream == stream && batch.has_room_for(record) {
                return Ok(lane);
            }
            sealed.extend(self.seal_lane(lane));
        }
        self.open_batches[lane] = Some(self.new_batch(stream, record.carries_data())?);
        Ok(lane)
    }

    /// A new, empty batch at the head of `stream` (`stream` has none open),
    /// opening a new head segment when the current one has no room.
    fn new_batch(&mut self, stream: Stream, with_data: bool) -> Result<OpenBatch, EngineError> {
        let segment_size_blocks = self.geometry.segment_size_blocks as u32;
        if self.heads[stream as usize]
            .is_some_and(|head| !head.has_room_for_a_data_block(segment_size_blocks))
        {
            self.seal_head_segment(stream);
        }
        if self.heads[stream as usize].is_none() {
            // Records without data (trims, deletes) may use the cleaner's reserve:
            // they are tiny, and they are how a user frees a full pool.
            let allocation = match (stream, with_data) {
                (Stream::Client | Stream::ClientWarm | Stream::ClientCold, true) => {
                    Allocation::Client
                }
                (Stream::Client | Stream::ClientWarm | Stream::ClientCold, false) => {
                    Allocation::Record
                }
                (Stream::Capacity, _) => Allocation::Cleaner,
                (relocation, _) => {
                    assert!(relocation.is_relocation());
                    Allocation::Cleaner
                }
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
            self.segments[segment_index as usize].needed_by_replay = false;
            let now = self.client_blocks_written();
            self.placement.segment_opened(segment_index, stream, now);
            self.heads[stream as usize] = Some(Head {
                segment_index,
                segment_sequence,
                next_block_in_segment: 0,
            });
        }
        let head = self.heads[stream as usize].expect("head opened above");
        let remaining = (segment_size_blocks - head.next_block_in_segment) as usize;
        let data_capacity = BATCH_DATA_BLOCKS_MAX.min(remaining - BATCH_OVERHEAD_BLOCKS as usize);
        Ok(OpenBatch {
            stream,
            segment_index: head.segment_index,
            segment_sequence: head.segment_sequence,
            block_in_segment: head.next_block_in_segment,
            summary_block: self.geometry.segment_first_block(head.segment_index)
                + u64::from(head.next_block_in_segment),
            records: Vec::new(),
            record_bytes: 0,
            buffer: AlignedBuffer::zeroed(
                (BATCH_OVERHEAD_BLOCKS as usize + data_capacity) * BLOCK_SIZE_BYTES as usize,
            ),
            data_count: 0,
            data_capacity,
            data_blocks: HashSet::new(),
            has_records_without_data: false,
        })
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
        let batch = self.open_batches[lane].as_mut().expect("room made");
        batch.push(record.clone());
        self.segments[batch.segment_index as usize].needed_by_replay = true;
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
        // The block this write replaces steers the split and carries heat;
        // without either, its lookup is skipped (a write is the hot path).
        let replaced = if self.separate_client_writes || self.heat.is_some() {
            self.volumes
                .get(volume_id)
                .and_then(|volume| volume.map.get(logical_block))
                .map(|entry| entry.physical_block)
        } else {
            None
        };
        // A rewrite is an access: the new block starts with the heat of the
        // flash block it replaces.
        let replaced_counter = self
            .heat
            .as_ref()
            .and_then(|heat| Some(heat.counter(self.geometry.flash_data_index(replaced?)?)));
        let (stream, interval_level) = if self.separate_client_writes {
            let now = self.client_blocks_written();
            let placement = self.placement.client_placement(
                replaced.map(|block| (block, self.geometry.segment_of(block))),
                now,
            );
            (
                self.client_stream_with_room(placement.stream),
                Some(placement.interval_level),
            )
        } else {
            (Stream::Client, None)
        };
        let physical_block = self.append_block(stream, record, data, sealed)?;
        if let Some(level) = interval_level {
            self.placement.set_interval_level(physical_block, level);
        }
        self.client_bytes_written += BLOCK_SIZE_BYTES;
        self.set_heat(
            volume_id,
            physical_block,
            Heat::after_rewrite(replaced_counter),
        );
        Ok(())
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
        let short = self.free_segments.len() <= self.reserve_for(Allocation::Client);
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
        let short = self.free_segments.len()
            <= self.reserve_for(Allocation::Cleaner) + RELOCATION_STREAMS.len();
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
            .find(|stream| self.has_room_without_a_new_segment(*stream))
    }

    /// Whether a data block appended to `stream` now fits in its head
    /// segment.
    fn has_room_without_a_new_segment(&self, stream: Stream) -> bool {
        if let Some(batch) = &self.open_batches[lane_of(stream)]
            && batch.stream == stream
        {
            return batch.data_count < batch.data_capacity;
        }
        self.heads[stream as usize].is_some_and(|head| {
            head.has_room_for_a_data_block(self.geometry.segment_size_blocks as u32)
        })
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
        // A block only the writing volume's live map holds moves by a plain
        // `Data` record, which replay applies whatever it found before: the
        // record does not depend on the batch that put the block at its old
        // home, so the old segment needs no checkpoint before it is rewritten
        // (no later client write can come before it in sequence order: it
        // would have displaced the block, and this move would not be made).
        // Otherwise the conditional `Relocate` moves it in every map that
        // holds it, which replay can only do after the old home's batches.
        let sole_holder =
            self.volumes
                .sole_holder(family, volume_id, logical_block, from_physical_block);
        let record = if sole_holder {
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
        // Within flash the block keeps its heat (the cleaner has already
        // decremented it); a promoted block starts cold, as S3-FIFO's ghost
        // hits enter its main queue (measured +0.5 to +0.7 points of hit ratio
        // over starting at 1, with fewer relocations: docs/decisions/0004).
        let counter = match self.geometry.flash_data_index(from_physical_block) {
            Some(index) => self.heat.as_ref().map_or(0, |heat| heat.counter(index)),
            None => 0,
        };
        let physical_block = self.append_block(stream, record, data, sealed)?;
        if stream.is_relocation() {
            self.placement
                .relocated_into(self.geometry.segment_of(physical_block));
        }
        self.placement
            .move_interval_level(from_physical_block, physical_block);
        if !sole_holder {
            let from_segment_index = self.geometry.segment_of(from_physical_block);
            self.segments[from_segment_index as usize].needed_by_replay = true;
        }
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
        let lane = self.make_room(stream, &record, sealed)?;
        let batch = self.open_batches[lane].as_mut().expect("room made");
        let start = (1 + batch.data_count) * BLOCK_SIZE_BYTES as usize;
        batch.buffer[start..start + BLOCK_SIZE_BYTES as usize].copy_from_slice(data);
        let physical_block = batch.summary_block + 1 + batch.data_count as u64;
        batch.data_count += 1;
        batch.push(record.clone());
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

    /// Seals every open batch (for a flush or a checkpoint), in lane order.
    /// The caller must write them to the device.
    pub fn seal_open_batch(&mut self) -> Vec<Arc<InFlightBatch>> {
        (0..OPEN_BATCH_COUNT)
            .filter_map(|lane| self.seal_lane(lane))
            .collect()
    }

    /// Seals the open batch of `lane`, if any. Deaths that waited for it
    /// take its sequence (`sealed_through`, unless it was empty and took
    /// none), and those that wait for nothing more get their `died_at`.
    fn seal_lane(&mut self, lane: usize) -> Option<Arc<InFlightBatch>> {
        let batch = self.open_batches[lane].take()?;
        let sealed = self.seal_batch(batch);
        let sealed_through = self.sealed_through;
        let segments = &mut self.segments;
        self.pending_deaths.retain_mut(|death| {
            if std::mem::take(&mut death.waits_for[lane]) {
                death.died_at = death.died_at.max(sealed_through);
            }
            if death.waits_for.contains(&true) {
                return true;
            }
            let segment = &mut segments[death.segment_index as usize];
            assert_eq!(
                segment.state,
                SegmentState::Dead {
                    died_at: DEATH_PENDING
                },
                "segment {} left its pending death",
                death.segment_index
            );
            segment.state = SegmentState::Dead {
                died_at: death.died_at,
            };
            false
        });
        sealed
    }

    fn seal_batch(&mut self, mut batch: OpenBatch) -> Option<Arc<InFlightBatch>> {
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
        let block = BLOCK_SIZE_BYTES as usize;
        let block_count = BATCH_OVERHEAD_BLOCKS as usize + batch.data_count;
        batch.buffer[..block].copy_from_slice(&encoded);
        batch.buffer[(block_count - 1) * block..block_count * block].copy_from_slice(&encoded);
        batch.buffer.truncate(block_count * block);
        let stream = batch.stream;
        let head = self.heads[stream as usize]
            .as_mut()
            .expect("an open batch has a head");
        assert_eq!(head.segment_index, batch.segment_index);
        head.next_block_in_segment += block_count as u32;
        let head_full = !head.has_room_for_a_data_block(self.geometry.segment_size_blocks as u32);
        self.segments[batch.segment_index as usize].last_batch_sequence = sequence;
        let now_blocks = self.client_blocks_written();
        self.placement
            .segment_written(batch.segment_index, now_blocks);
        let in_flight = Arc::new(InFlightBatch {
            sequence,
            summary_block: batch.summary_block,
            buffer: Arc::new(batch.buffer),
        });
        self.in_flight
            .insert(batch.summary_block, in_flight.clone());
        self.in_flight_sequences.insert(sequence);
        self.sealed_through = sequence;
        self.sealed_bytes_total += block_count as u64 * BLOCK_SIZE_BYTES;
        // A full head is sealed now rather than when its stream next appends:
        // a stream that seldom appends (the cold one, a cleaner stream) would
        // otherwise keep a segment open whose blocks may all have died. (After
        // `sealed_through` moved: this batch may have released its blocks.)
        if head_full {
            self.seal_head_segment(stream);
        }
        Some(in_flight)
    }

    /// Copies block `physical_block` from memory if it has not reached the device
    /// yet (open batch or in flight). Returns false when it must be read from disk.
    pub fn copy_unwritten_block(&self, physical_block: u64, destination: &mut [u8]) -> bool {
        let block = BLOCK_SIZE_BYTES as usize;
        for batch in self.open_batches.iter().flatten() {
            if physical_block > batch.summary_block
                && physical_block <= batch.summary_block + batch.data_count as u64
            {
                let start = (physical_block - batch.summary_block) as usize * block;
                destination.copy_from_slice(&batch.buffer[start..start + block]);
                return true;
            }
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
                !self.dead_segment_waits_for_checkpoints(segment) && died_at <= self.durable_through
            }
            _ => false,
        }
    }

    /// Whether a dead segment needs checkpoints (and not only a flush) before
    /// it may be rewritten: some batch in it is newer than what both kept
    /// checkpoints cover, and replay needs its batches
    /// ([`SegmentInfo::needed_by_replay`]). Replay from a checkpoint that does
    /// not cover a segment of only overwritten data gets the same maps
    /// without it: each record it skips is replaced by a later, durable one.
    pub fn dead_segment_waits_for_checkpoints(&self, segment: &SegmentInfo) -> bool {
        segment.needed_by_replay && segment.last_batch_sequence > self.covered_by_every_checkpoint()
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
        segment.set_aside = false;
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

    /// Dead flash segments whose death a sealed batch covers (one that died in
    /// an open batch waits for that batch to be sealed): those a flush frees,
    /// and those that wait for checkpoints
    /// ([`State::dead_segment_waits_for_checkpoints`]).
    pub fn sealed_dead_flash_segment_counts(&self) -> DeadSegmentCounts {
        let newest_covered = self
            .durable_checkpoints
            .last()
            .map_or(0, |checkpoint| checkpoint.covered_batch_sequence);
        let mut counts = DeadSegmentCounts::default();
        for segment in &self.segments[..self.geometry.flash_segment_count as usize] {
            if matches!(segment.state, SegmentState::Dead { died_at } if died_at <= self.sealed_through)
            {
                if !self.dead_segment_waits_for_checkpoints(segment) {
                    counts.awaiting_flush += 1;
                } else {
                    counts.awaiting_checkpoints += 1;
                    if segment.last_batch_sequence > newest_covered {
                        counts.awaiting_two_checkpoints += 1;
                    }
                }
            }
        }
        counts
    }

    pub fn used_segment_count(&self) -> usize {
        self.segments.len() - self.free_segments.len() - self.free_capacity_segments.len()
    }
}

/// Takes a free segment from `free_list` for anything but a checkpoint body,
/// so that at least `settled_count_min` of those left are settled: their
/// batches are older than what both kept checkpoints cover (`covered`).
/// Recovery knows a free segment from a dead one only by that (it cannot tell
/// which dead segments replay does not need, see
/// [`State::dead_segment_waits_for_checkpoints`]), so an unsettled free
/// segment counts as dead after a crash, and only settled ones are there for
/// the checkpoints that recovery must take: the checkpoints' reserve must be
/// settled segments.
fn pop_free_keeping_settled(
    free_list: &mut VecDeque<u32>,
    segments: &[SegmentInfo],
    covered: u64,
    settled_count_min: usize,
) -> Option<u32> {
    let settled = |index: &u32| segments[*index as usize].last_batch_sequence <= covered;
    if free_list.front().is_some_and(settled) {
        let settled_count = free_list
            .iter()
            .filter(|index| settled(index))
            .take(settled_count_min + 1)
            .count();
        if settled_count <= settled_count_min
            && let Some(position) = free_list.iter().position(|index| !settled(index))
        {
            return free_list.remove(position);
        }
    }
    free_list.pop_front()
}
