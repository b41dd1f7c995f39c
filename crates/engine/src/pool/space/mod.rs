//! The space allocator: every segment's state and live count, the free lists
//! of both tiers with the reserves each kind of allocation must leave, the
//! deaths of segments and when a dead segment may be rewritten, and the
//! durable checkpoints whose bodies hold segments. It knows nothing of
//! batches or volumes: the log writer tells it how far the log is sealed and
//! durable and which batches are open, and it never waits on I/O.
//!
//! The reuse rule (docs/decisions/0006-segment-reuse.md): a dead segment is
//! rewritten only once every batch in it is covered by both kept checkpoints
//! (or replay does not need it) and the batches that killed it are durable.

pub(super) mod segment_shapes;

use std::collections::{BTreeSet, VecDeque};

use crate::BLOCK_SIZE_BYTES;
use crate::convert::{segment_index, to_usize};
use crate::log::batch::BATCH_OVERHEAD_BLOCKS;
use crate::log::checkpoint::Slot;
use crate::log::geometry::{Geometry, Tier};
use crate::log::location::{Location, UNITS_PER_BLOCK};

use crate::pool::io::stream::OPEN_BATCH_COUNT;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentState {
    Free,
    /// The log head: batches are being appended to it.
    Open,
    Sealed,
    /// No live blocks since batch `died_at`; reusable once the older of the two
    /// durable checkpoints covers every batch written into the segment and the
    /// batches that killed its blocks are durable (see
    /// [`SpaceAllocator::dead_segment_reusable`] and docs/decisions/0006-segment-reuse.md).
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
    /// Live data in 16-byte units (a whole block is 256, a fragment its
    /// unit count; format version 10, decision 0070).
    pub live_units: u32,
    /// The newest batch written into this segment (0 if none).
    pub last_batch_sequence: u64,
    /// Whether replay from a checkpoint that does not cover this incarnation
    /// needs its batches to rebuild the maps: a block was moved out of it (a
    /// relocation record names it as the block's old home), or its batches
    /// hold records without data. Otherwise every record in it only wrote
    /// data that later, durable records replaced, and it may be rewritten as
    /// soon as those are durable (see [`SpaceAllocator::dead_segment_reusable`]).
    /// True when unknown (after recovery).
    pub needed_by_replay: bool,
    /// Whether the cleaner set it aside: its summaries do not describe every
    /// block (both copies of one are damaged), so it cannot be cleaned; its
    /// live blocks are still served, and it is freed if they all die.
    pub set_aside: bool,
}

impl SegmentInfo {
    /// Live data in whole blocks, rounded up.
    pub fn live_blocks(&self) -> u32 {
        self.live_units.div_ceil(UNITS_PER_BLOCK)
    }
}

/// Dead segments by what frees them ([`SpaceAllocator::sealed_dead_flash_segment_counts`]).
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

/// Free capacity segments that demotions leave to the cleaning of capacity
/// segments, so that capacity space can always be reclaimed.
pub const CAPACITY_RESERVE_SEGMENT_COUNT: usize = 2;

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

/// A segment that died while batches were open: its `died_at` is the newest
/// of `sealed_through` then and the sequences those batches get.
#[derive(Clone, Copy, Debug)]
pub struct PendingDeath {
    pub segment_index: u32,
    pub died_at: u64,
    /// Per lane: whether the batch open there at the death is still open.
    pub waits_for: [bool; OPEN_BATCH_COUNT],
}

/// A checkpoint known to be durable, with the segments its body occupies.
#[derive(Clone, Debug)]
pub struct DurableCheckpoint {
    pub slot_index: usize,
    pub checkpoint_sequence: u64,
    pub covered_batch_sequence: u64,
    /// The first segment sequence after it: every incarnation from here on
    /// was opened after its copy of the maps, and recovery from it walks
    /// them. Lower than that when not known exactly (a checkpoint found at
    /// open whose body was not read on its own), never higher.
    pub next_segment_sequence: u64,
    pub body_segments: Vec<u32>,
    /// The bodies of the chain before it (base first; empty for a base),
    /// which recovery from it needs as well (format version 7).
    pub earlier_links: Vec<CheckpointBody>,
}

/// A body of an earlier link of a durable checkpoint's chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointBody {
    pub checkpoint_sequence: u64,
    pub body_segments: Vec<u32>,
}

impl DurableCheckpoint {
    /// The checkpoint a slot records, as the space allocator holds it: its
    /// body and its chain's. One conversion for the checkpoint just written
    /// and for those found at open.
    pub fn of_slot(slot_index: usize, slot: &Slot, next_segment_sequence: u64) -> Self {
        DurableCheckpoint {
            slot_index,
            checkpoint_sequence: slot.checkpoint_sequence,
            covered_batch_sequence: slot.covered_batch_sequence,
            next_segment_sequence,
            body_segments: slot.body_segments.clone(),
            earlier_links: slot
                .earlier_links
                .iter()
                .map(|link| CheckpointBody {
                    checkpoint_sequence: link.checkpoint_sequence,
                    body_segments: link.body_segments.clone(),
                })
                .collect(),
        }
    }

    /// Whether recovery from this checkpoint reads the body of checkpoint
    /// `checkpoint_sequence` (its own or an earlier link's).
    fn needs_body_of(&self, checkpoint_sequence: u64) -> bool {
        self.checkpoint_sequence == checkpoint_sequence
            || self
                .earlier_links
                .iter()
                .any(|link| link.checkpoint_sequence == checkpoint_sequence)
    }
}

/// Where the log stands when a segment dies or a dead segment is looked at:
/// the newest sealed and the newest durable batch, and which lanes have a
/// batch open (a death in an open batch waits for its sequence).
#[derive(Clone, Copy, Debug)]
pub struct LogProgress {
    pub sealed_through: u64,
    pub durable_through: u64,
    pub open_lanes: [bool; OPEN_BATCH_COUNT],
}

/// Free segments reserved for each use, fixed when the pool opens.
#[derive(Clone, Copy, Debug)]
struct Reserves {
    /// Free flash segments that only checkpoints may take, so that space can
    /// always be reclaimed even when clients have filled the pool (0 in a
    /// two-tier pool, whose checkpoints live on capacity).
    checkpoint_segment_count: usize,
    /// Free capacity segments that only checkpoints may take (two-tier pools).
    capacity_checkpoint_segment_count: usize,
    /// Free segments that clients leave to the cleaner, so that it can always
    /// relocate live blocks out of a victim before the victim is freed.
    cleaner_segment_count: usize,
}

/// The segment table, free lists, reserves and durable checkpoints.
pub struct SpaceAllocator {
    geometry: Geometry,
    segments: Vec<SegmentInfo>,
    /// Free flash segments (all free segments of a one-tier pool).
    free_flash: VecDeque<u32>,
    /// Free capacity segments.
    free_capacity: VecDeque<u32>,
    /// The tier of the victim the cleaner is moving blocks out of.
    cleaning_tier: Tier,
    reserves: Reserves,
    /// Segments that died while batches were open.
    pending_deaths: Vec<PendingDeath>,
    /// The segments in state `Dead`, so that the periodic looks for
    /// reusable dead segments cost what is dead, not the pool's segment
    /// count (an object tier's address space is large and mostly unwritten).
    dead_segments: BTreeSet<u32>,
    /// Oldest first, at most two.
    durable_checkpoints: Vec<DurableCheckpoint>,
    /// Test hook ([`crate::pool::TestHooks::reuse_freed_segments_first`]).
    reuse_freed_segments_first: bool,
    /// Segments freed since the pool opened: a clock for `freed_at`.
    free_events: u64,
    /// Per segment, `free_events` when it was last freed (0: never since
    /// open). A list of live blocks taken at `free_events` = F is still
    /// right about a block's contents while its segment's entry is ≤ F.
    freed_at: Vec<u64>,
    /// Locations (whole blocks and fragments) whose units are counted live:
    /// each block clients would read back, once however many maps share it.
    /// `pool status` reports it as the pool's logical bytes.
    live_location_count: u64,
}

/// Flash segments the cleaner keeps for relocating a victim's live blocks
/// (sized against the checkpoint body, see the cleaner). In a two-tier pool
/// the cleaner demotes most of what it moves, and checkpoints live on
/// capacity, so it keeps only room for one flash victim's hot blocks and a
/// little more: 2% of flash, at least 2 segments.
pub fn cleaner_reserve_segment_count(geometry: &Geometry) -> usize {
    if geometry.has_capacity_tier() {
        return (to_usize(geometry.flash_segment_count) / 50).max(2);
    }
    one_tier_cleaner_reserve_segment_count(geometry)
}

/// Checkpoint bodies' worth of segments that clients leave to the cleaner.
pub const CLEANER_RESERVE_CHECKPOINT_BODIES: u64 = 8;

/// Free segments that clients leave to the cleaner. A blocked writer's reclaim
/// round relocates into them, and every round costs a checkpoint, which writes
/// the whole map; unless a round frees several bodies' worth of space,
/// checkpoints dominate the device writes (at 85% live data, a 1% reserve made
/// checkpoints 2 of a total write amplification of 5.9; see
/// docs/decisions/0002-cleaner.md). So the reserve is
/// [`CLEANER_RESERVE_CHECKPOINT_BODIES`] bodies (a body takes about 12 bytes per
/// block of capacity, so about 2.5% of the pool), at least 1% of the pool and 2
/// segments.
fn one_tier_cleaner_reserve_segment_count(geometry: &Geometry) -> usize {
    let capacity_blocks = geometry.data_capacity_bytes() / BLOCK_SIZE_BYTES;
    let body_bytes = capacity_blocks * 12 + geometry.segment_count * 10;
    let segment_count = (CLEANER_RESERVE_CHECKPOINT_BODIES * body_bytes)
        .div_ceil(geometry.segment_size_bytes())
        .max(geometry.segment_count / 100)
        .max(2);
    usize::try_from(segment_count).expect("the reserve is smaller than the segment count")
}

/// Segments kept for checkpoint bodies: on flash in a one-tier pool, on
/// capacity in a two-tier pool (bodies are written and read sequentially, and
/// their size follows both tiers' mappings, which flash should not pay for).
pub fn checkpoint_reserve_segment_count(geometry: &Geometry) -> usize {
    // A base needs at most about 16 bytes per distinct mapping (entry index,
    // physical block and checksum as varints; shared chunks are stored once and
    // snapshots' chunks as differences) plus the segment table. The bodies that
    // can exist at once (the older kept checkpoint's chain, the newer one's
    // base when it started a new chain, the body being written: at most
    // CHECKPOINT_INCREMENTS_MAX + 3 bodies) hold at most three bases' bytes,
    // since a chain's increments hold at most half its base's; each body
    // also leaves part of its last segment unused.
    let capacity_blocks = geometry.data_capacity_bytes() / BLOCK_SIZE_BYTES;
    let body_bytes_max = capacity_blocks * 16 + geometry.segment_count * 10 + (64 << 10);
    let bodies_segments = (3 * body_bytes_max).div_ceil(geometry.segment_size_bytes());
    let body_count_max = crate::log::checkpoint::CHECKPOINT_INCREMENTS_MAX as u64 + 3;
    usize::try_from(bodies_segments + body_count_max + 1)
        .expect("the reserve is smaller than the segment count")
}

/// Takes a free segment from `free_list` for anything but a checkpoint body,
/// so that at least `settled_count_min` of those left are settled: their
/// batches are older than what both kept checkpoints cover (`covered`).
/// Recovery knows a free segment from a dead one only by that (it cannot tell
/// which dead segments replay does not need, see
/// [`SpaceAllocator::dead_segment_waits_for_checkpoints`]), so an unsettled free
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

/// What recovery found, from which the segment table is rebuilt.
pub struct RecoveredSegments<'a> {
    /// Live units per segment, from the recovered maps (see [`SegmentInfo::live_units`]).
    pub live_units: &'a [u32],
    /// Distinct locations the recovered maps hold (see
    /// [`SpaceAllocator::live_location_count`]).
    pub live_location_count: u64,
    /// Segments holding a kept checkpoint's body.
    pub held: &'a std::collections::HashSet<u32>,
    /// The batch both kept checkpoints cover: an empty segment written no
    /// later is free, a later one dead.
    pub fallback_covered: u64,
    /// The newest batch found: when the dead ones died.
    pub highest_sequence: u64,
}

impl SpaceAllocator {
    /// Every segment free, with the reserves `geometry` calls for.
    pub fn new(geometry: Geometry, reuse_freed_segments_first: bool) -> Self {
        let two_tiers = geometry.has_capacity_tier();
        let checkpoint_reserve = checkpoint_reserve_segment_count(&geometry);
        let flash_segment_count = segment_index(geometry.flash_segment_count);
        let segment_count = segment_index(geometry.segment_count);
        Self {
            geometry,
            segments: vec![
                SegmentInfo {
                    state: SegmentState::Free,
                    live_units: 0,
                    last_batch_sequence: 0,
                    needed_by_replay: true,
                    set_aside: false,
                };
                segment_count as usize
            ],
            free_flash: (0..flash_segment_count).collect(),
            free_capacity: (flash_segment_count..segment_count).collect(),
            cleaning_tier: Tier::Flash,
            reserves: Reserves {
                checkpoint_segment_count: if two_tiers { 0 } else { checkpoint_reserve },
                capacity_checkpoint_segment_count: if two_tiers { checkpoint_reserve } else { 0 },
                cleaner_segment_count: cleaner_reserve_segment_count(&geometry),
            },
            pending_deaths: Vec::new(),
            dead_segments: BTreeSet::new(),
            durable_checkpoints: Vec::new(),
            reuse_freed_segments_first,
            free_events: 0,
            freed_at: vec![0; segment_count as usize],
            live_location_count: 0,
        }
    }

    /// Locations whose units are counted live (see `live_location_count`).
    pub fn live_location_count(&self) -> u64 {
        self.live_location_count
    }

    /// Units counted live over every segment: the pool's stored data, each
    /// location once.
    pub fn live_unit_count(&self) -> u64 {
        self.segments
            .iter()
            .map(|segment| u64::from(segment.live_units))
            .sum()
    }

    /// Counts `segment_index` freed now (see `freed_at`).
    fn count_freed(&mut self, segment_index: u32) {
        self.free_events += 1;
        self.freed_at[segment_index as usize] = self.free_events;
    }

    /// Segments freed so far since the pool opened: remember it with a list
    /// of live blocks, for [`Self::freed_since`].
    pub fn free_events(&self) -> u64 {
        self.free_events
    }

    /// Whether `segment_index` was freed (so every block it held died, and it
    /// may have been written again) after `free_events` had the given value.
    pub fn freed_since(&self, segment_index: u32, free_events: u64) -> bool {
        self.freed_at[segment_index as usize] > free_events
    }

    /// Whether `dead_segments` names exactly the segments in state `Dead`
    /// (a walk of every segment: for debug assertions and tests).
    fn dead_set_matches_states(&self) -> bool {
        self.segments.iter().enumerate().all(|(index, segment)| {
            matches!(segment.state, SegmentState::Dead { .. })
                == self.dead_segments.contains(&segment_index(index as u64))
        })
    }

    pub fn segment(&self, segment_index: u32) -> &SegmentInfo {
        &self.segments[segment_index as usize]
    }

    pub fn segments(&self) -> &[SegmentInfo] {
        &self.segments
    }

    /// The segments of `tier`, with their indexes.
    pub fn segments_of(&self, tier: Tier) -> impl Iterator<Item = (u32, &SegmentInfo)> {
        self.segments
            .iter()
            .enumerate()
            .map(|(index, segment)| (segment_index(index as u64), segment))
            .filter(move |(index, _)| self.geometry.tier_of_segment(*index) == tier)
    }

    pub fn free_flash_segment_count(&self) -> usize {
        self.free_flash.len()
    }

    pub fn free_capacity_segment_count(&self) -> usize {
        self.free_capacity.len()
    }

    /// The free flash segments, next taken first.
    pub fn free_flash_segments(&self) -> impl Iterator<Item = u32> + '_ {
        self.free_flash.iter().copied()
    }

    pub fn cleaner_reserve_segment_count(&self) -> usize {
        self.reserves.cleaner_segment_count
    }

    pub fn capacity_checkpoint_reserve_segment_count(&self) -> usize {
        self.reserves.capacity_checkpoint_segment_count
    }

    pub fn cleaning_tier(&self) -> Tier {
        self.cleaning_tier
    }

    pub fn set_cleaning_tier(&mut self, tier: Tier) {
        self.cleaning_tier = tier;
    }

    /// The lowest segment sequence recovery from any durable checkpoint
    /// may start walking at: the segment openings record must list every
    /// segment opened from here on (0 before any checkpoint is durable).
    pub fn openings_floor_segment_sequence(&self) -> u64 {
        self.durable_checkpoints
            .iter()
            .map(|checkpoint| checkpoint.next_segment_sequence)
            .min()
            .unwrap_or(0)
    }

    pub fn durable_checkpoints(&self) -> &[DurableCheckpoint] {
        &self.durable_checkpoints
    }

    /// Every segment holding a body that a kept checkpoint's chain needs,
    /// once each.
    pub fn held_body_segments(&self) -> std::collections::BTreeSet<u32> {
        self.durable_checkpoints
            .iter()
            .flat_map(|checkpoint| {
                let earlier = checkpoint
                    .earlier_links
                    .iter()
                    .flat_map(|link| &link.body_segments);
                checkpoint.body_segments.iter().chain(earlier)
            })
            .copied()
            .collect()
    }

    /// Segments that hold blocks, checkpoint bodies or batches not yet reusable.
    pub fn used_segment_count(&self) -> usize {
        self.segments.len() - self.free_flash.len() - self.free_capacity.len()
    }

    /// Marks `segment_index` dead. Its blocks were released by sealed batches
    /// or by the batches open now, so it died at the newest of
    /// `sealed_through` and the sequences the open ones will get: until they
    /// are sealed its `died_at` is [`DEATH_PENDING`]. (Not the next sequence:
    /// with no batch open, it may not be sealed for a long time, and a blocked
    /// writer's reclaim would wait for it forever.)
    fn mark_dead(&mut self, segment_index: u32, progress: LogProgress) {
        let died_at = if progress.open_lanes.contains(&true) {
            self.pending_deaths.push(PendingDeath {
                segment_index,
                died_at: progress.sealed_through,
                waits_for: progress.open_lanes,
            });
            DEATH_PENDING
        } else {
            progress.sealed_through
        };
        self.segments[segment_index as usize].state = SegmentState::Dead { died_at };
        self.dead_segments.insert(segment_index);
    }

    /// Accounts for a location that no map references any more.
    pub fn release(&mut self, location: Location, progress: LogProgress) {
        let segment_index = self.geometry.segment_of(location.block());
        let segment = &mut self.segments[segment_index as usize];
        assert!(
            segment.live_units >= location.units(),
            "segment live count underflow at {location}"
        );
        segment.live_units -= location.units();
        assert!(
            self.live_location_count > 0,
            "live location count underflow at {location}"
        );
        self.live_location_count -= 1;
        if segment.live_units == 0 && segment.state == SegmentState::Sealed {
            self.mark_dead(segment_index, progress);
        }
    }

    /// Accounts for a whole block (256 units) or a fragment appended to
    /// `segment_index`.
    pub fn units_appended(&mut self, segment_index: u32, units: u32) {
        let segment = &mut self.segments[segment_index as usize];
        assert_eq!(
            segment.state,
            SegmentState::Open,
            "append to segment {segment_index}"
        );
        segment.live_units += units;
        self.live_location_count += 1;
        assert!(
            u64::from(segment.live_blocks()) < self.geometry.segment_size_blocks,
            "segment {segment_index} holds more live blocks than it has room for"
        );
    }

    /// Marks a segment whose batches replay needs (see
    /// [`SegmentInfo::needed_by_replay`]).
    pub fn needed_by_replay(&mut self, segment_index: u32) {
        self.segments[segment_index as usize].needed_by_replay = true;
    }

    /// Records that batch `sequence` was written into `segment_index`.
    pub fn batch_sealed_into(&mut self, segment_index: u32, sequence: u64) {
        let segment = &mut self.segments[segment_index as usize];
        assert!(
            sequence > segment.last_batch_sequence,
            "batch sequences go up"
        );
        segment.last_batch_sequence = sequence;
    }

    /// Recovery replayed batch `sequence` of `segment_index`.
    pub fn batch_replayed(&mut self, segment_index: u32, sequence: u64) {
        let segment = &mut self.segments[segment_index as usize];
        segment.last_batch_sequence = segment.last_batch_sequence.max(sequence);
    }

    /// Sets aside a segment the cleaner cannot clean (its summaries do not
    /// describe every block).
    pub fn set_aside(&mut self, segment_index: u32) {
        self.segments[segment_index as usize].set_aside = true;
    }
}

impl SpaceAllocator {
    /// Free segments that `allocation` must leave untouched.
    pub fn reserve_for(&self, allocation: Allocation) -> usize {
        let reserves = &self.reserves;
        match allocation {
            Allocation::Client => {
                reserves.checkpoint_segment_count
                    + RECORD_RESERVE_SEGMENT_COUNT
                    + reserves.cleaner_segment_count
            }
            Allocation::Cleaner => reserves.checkpoint_segment_count + RECORD_RESERVE_SEGMENT_COUNT,
            Allocation::Record => reserves.checkpoint_segment_count,
            Allocation::Checkpoint => 0,
        }
    }

    /// Whether cleaning is the only way left to free space and the cleaner
    /// cannot start without a new segment: no relocation head has room
    /// (`relocation_head_has_room`, from the log writer), and no flash
    /// segment is dead (none that a flush or checkpoint would free).
    ///
    /// Recovery leaves this state when a crash interrupts the cleaner at the
    /// bottom of its reserve (issue 16): recovery seals every head, however
    /// much room it had, and the victims whose last relocations were not
    /// written keep a block or two, so nothing the cleaner was about to free
    /// is freed. The free segments are then exactly those the cleaner leaves
    /// (or fewer, once trims took the records' reserve), and before this rule
    /// it could never relocate again: every write failed with ENOSPC, across
    /// restarts. See [`SpaceAllocator::cleaner_restart_reserve`].
    pub fn cleaner_must_restart(&self, relocation_head_has_room: bool) -> bool {
        !relocation_head_has_room
            && !self
                .dead_segments
                .iter()
                .any(|index| self.geometry.tier_of_segment(*index) == Tier::Flash)
    }

    /// Free segments a cleaner that must restart
    /// ([`SpaceAllocator::cleaner_must_restart`]) leaves: the records'
    /// reserve, and of the checkpoints' reserve what checkpoints may still
    /// take. That reserve counts three bodies (two durable, one being
    /// written); the durable ones' flash segments are already out of the free
    /// list, so only the rest of it is needed. Once cleaning has started,
    /// relocations leave the whole reserve again ([`SpaceAllocator::reserve_for`]).
    pub fn cleaner_restart_reserve(&self) -> usize {
        let held_body_segment_count = self
            .held_body_segments()
            .into_iter()
            .filter(|segment| self.geometry.tier_of_segment(*segment) == Tier::Flash)
            .count();
        self.reserves
            .checkpoint_segment_count
            .saturating_sub(held_body_segment_count)
            + RECORD_RESERVE_SEGMENT_COUNT
    }

    /// Takes a free flash segment, leaving the reserves that `allocation` may
    /// not touch; `relocation_head_has_room` as for
    /// [`SpaceAllocator::cleaner_must_restart`].
    pub fn take_free_segment(
        &mut self,
        allocation: Allocation,
        relocation_head_has_room: bool,
    ) -> Option<u32> {
        let reserve = match allocation {
            Allocation::Cleaner if self.cleaner_must_restart(relocation_head_has_room) => self
                .cleaner_restart_reserve()
                .min(self.reserve_for(allocation)),
            _ => self.reserve_for(allocation),
        };
        if self.free_flash.len() <= reserve {
            return None;
        }
        let index = if allocation == Allocation::Checkpoint {
            self.free_flash.pop_front()?
        } else {
            let covered = self.covered_by_every_checkpoint();
            pop_free_keeping_settled(
                &mut self.free_flash,
                &self.segments,
                covered,
                self.reserves.checkpoint_segment_count,
            )?
        };
        self.taken(index, Tier::Flash);
        Some(index)
    }

    /// Takes a free capacity segment. Demotions leave
    /// [`CAPACITY_RESERVE_SEGMENT_COUNT`] to the cleaning of capacity victims.
    pub fn take_free_capacity_segment(&mut self) -> Option<u32> {
        if self.free_capacity.len() <= self.capacity_reserve() {
            return None;
        }
        let covered = self.covered_by_every_checkpoint();
        let index = pop_free_keeping_settled(
            &mut self.free_capacity,
            &self.segments,
            covered,
            self.reserves.capacity_checkpoint_segment_count,
        )?;
        self.taken(index, Tier::Capacity);
        Some(index)
    }

    /// Free capacity segments a demotion must leave.
    fn capacity_reserve(&self) -> usize {
        self.reserves.capacity_checkpoint_segment_count
            + if self.cleaning_tier == Tier::Capacity {
                0
            } else {
                CAPACITY_RESERVE_SEGMENT_COUNT
            }
    }

    /// Whether a demotion that needs a new capacity segment would find one.
    pub fn capacity_segment_available_for_demotion(&self) -> bool {
        self.free_capacity.len()
            > CAPACITY_RESERVE_SEGMENT_COUNT + self.reserves.capacity_checkpoint_segment_count
    }

    /// Takes a free segment for a checkpoint body: any free flash segment in a
    /// one-tier pool, any free capacity segment in a two-tier pool.
    pub fn take_free_checkpoint_segment(&mut self) -> Option<u32> {
        if !self.geometry.has_capacity_tier() {
            return self.take_free_segment(Allocation::Checkpoint, true);
        }
        let index = self.free_capacity.pop_front()?;
        self.taken(index, Tier::Capacity);
        Some(index)
    }

    /// Checks a segment just taken from a free list.
    fn taken(&self, segment_index: u32, tier: Tier) {
        assert_eq!(
            self.segments[segment_index as usize].state,
            SegmentState::Free
        );
        assert_eq!(self.segments[segment_index as usize].live_units, 0);
        assert_eq!(self.geometry.tier_of_segment(segment_index), tier);
    }

    /// Takes free segment `segment_index` out of its free list so that it
    /// can be laid out again (`SegmentShapes::open`) with nothing writing
    /// it; false when it is not free (taken meanwhile). It goes back with
    /// [`SpaceAllocator::return_free_segment`].
    pub fn take_free_segment_to_lay_out(&mut self, segment_index: u32) -> bool {
        let free_list = match self.geometry.tier_of_segment(segment_index) {
            Tier::Flash => &mut self.free_flash,
            Tier::Capacity => &mut self.free_capacity,
        };
        match free_list.iter().position(|index| *index == segment_index) {
            Some(position) => {
                free_list.remove(position);
                true
            }
            None => false,
        }
    }

    /// `taken`, just taken from its free list, or, when `usable_now` is
    /// false for it, the first free segment of its tier for which it holds
    /// (`taken` goes back first in line): a segment that must be laid out
    /// again after a device loss is written only when no other is free.
    pub fn prefer_free_segment(&mut self, taken: u32, usable_now: impl Fn(u32) -> bool) -> u32 {
        if usable_now(taken) {
            return taken;
        }
        // Never a settled segment for an unsettled one: the checkpoints'
        // reserve of settled segments (`pop_free_keeping_settled`) stays.
        let covered = self.covered_by_every_checkpoint();
        let free_list = match self.geometry.tier_of_segment(taken) {
            Tier::Flash => &mut self.free_flash,
            Tier::Capacity => &mut self.free_capacity,
        };
        let segments = &self.segments;
        let settled = |index: u32| segments[index as usize].last_batch_sequence <= covered;
        let taken_settled = settled(taken);
        let Some(position) = free_list
            .iter()
            .position(|index| usable_now(*index) && (taken_settled || !settled(*index)))
        else {
            return taken;
        };
        let chosen = free_list.remove(position).expect("found above");
        free_list.push_front(taken);
        chosen
    }

    /// The free segments of both tiers.
    pub fn free_segments(&self) -> impl Iterator<Item = u32> + '_ {
        self.free_flash.iter().chain(&self.free_capacity).copied()
    }

    /// Gives back a free segment taken but not used, first in line again.
    pub fn return_free_segment(&mut self, segment_index: u32) {
        assert_eq!(
            self.segments[segment_index as usize].state,
            SegmentState::Free
        );
        match self.geometry.tier_of_segment(segment_index) {
            Tier::Flash => self.free_flash.push_front(segment_index),
            Tier::Capacity => self.free_capacity.push_front(segment_index),
        }
    }

    /// A free segment becomes a log head.
    pub fn open_head_segment(&mut self, segment_index: u32) {
        let segment = &mut self.segments[segment_index as usize];
        assert_eq!(segment.state, SegmentState::Free);
        segment.state = SegmentState::Open;
        segment.needed_by_replay = false;
    }

    /// A head segment is full or closed, `blocks_used` of it written: sealed,
    /// or dead if nothing in it lives.
    pub fn close_head_segment(
        &mut self,
        segment_index: u32,
        blocks_used: u32,
        progress: LogProgress,
    ) {
        let segment = &mut self.segments[segment_index as usize];
        assert_eq!(segment.state, SegmentState::Open);
        // Every batch takes its summary and its copy besides its data.
        assert!(
            segment.live_blocks() + BATCH_OVERHEAD_BLOCKS <= blocks_used.max(BATCH_OVERHEAD_BLOCKS),
            "segment {segment_index}: {} live blocks in {blocks_used} written",
            segment.live_blocks()
        );
        if segment.live_units == 0 {
            self.mark_dead(segment_index, progress);
        } else {
            segment.state = SegmentState::Sealed;
        }
    }

    /// Takes free segments enough to hold a body of `body_bytes` for
    /// checkpoint `checkpoint_sequence` (each segment holding
    /// `size_bytes(segment)`), or none when there are not that many.
    pub fn take_checkpoint_body_segments(
        &mut self,
        body_bytes: u64,
        size_bytes: impl Fn(u32) -> u64,
        checkpoint_sequence: u64,
    ) -> Option<Vec<u32>> {
        let mut taken = Vec::new();
        let mut held_bytes = 0;
        while held_bytes < body_bytes {
            match self.take_free_checkpoint_segment() {
                Some(index) => {
                    held_bytes += size_bytes(index);
                    taken.push(index);
                }
                None => {
                    for index in taken.into_iter().rev() {
                        self.return_free_segment(index);
                    }
                    return None;
                }
            }
        }
        for index in &taken {
            self.segments[*index as usize].state = SegmentState::Checkpoint {
                checkpoint_sequence,
            };
        }
        Some(taken)
    }

    /// Gives back the segments of a checkpoint body that no slot names (its
    /// write was abandoned): free again, first in line.
    pub fn return_checkpoint_body_segments(&mut self, body_segments: &[u32]) {
        for index in body_segments.iter().rev() {
            let segment = &mut self.segments[*index as usize];
            assert!(matches!(segment.state, SegmentState::Checkpoint { .. }));
            segment.state = SegmentState::Free;
            self.count_freed(*index);
            self.return_free_segment(*index);
        }
    }
}

impl SpaceAllocator {
    /// The batch of `lane` was sealed, taking sequence `sealed_through` (or
    /// none, if it was empty): deaths that waited for it take that sequence,
    /// and those that wait for nothing more get their `died_at`.
    pub fn lane_sealed(&mut self, lane: usize, sealed_through: u64) {
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
    }

    /// Records a durable checkpoint and frees what it makes reclaimable: the
    /// body segments of the checkpoint it displaced, and the dead segments
    /// that may now be reused. Returns the segments freed.
    pub fn checkpoint_became_durable(
        &mut self,
        checkpoint: DurableCheckpoint,
        durable_through: u64,
    ) -> Vec<u32> {
        assert!(
            self.durable_checkpoints.last().is_none_or(|newest| {
                newest.checkpoint_sequence < checkpoint.checkpoint_sequence
                    && newest.covered_batch_sequence <= checkpoint.covered_batch_sequence
            }),
            "checkpoints become durable in order"
        );
        self.durable_checkpoints.push(checkpoint);
        let mut freed = Vec::new();
        while self.durable_checkpoints.len() > 2 {
            let displaced = self.durable_checkpoints.remove(0);
            // Its bodies, and those of its chain that no kept checkpoint's
            // chain names (an increment's base stays while either needs it).
            let bodies = displaced.earlier_links.into_iter().chain([CheckpointBody {
                checkpoint_sequence: displaced.checkpoint_sequence,
                body_segments: displaced.body_segments,
            }]);
            for body in bodies {
                let still_needed = self
                    .durable_checkpoints
                    .iter()
                    .any(|kept| kept.needs_body_of(body.checkpoint_sequence));
                if still_needed {
                    continue;
                }
                for segment_index in body.body_segments {
                    self.free_segment(segment_index);
                    freed.push(segment_index);
                }
            }
        }
        freed.extend(self.free_reusable_dead_segments(durable_through));
        freed
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
    /// of every map are durable (`durable_through`), so that replay finds them
    /// and no recovered map points into the segment. A checkpoint taken after
    /// the death is not needed. docs/decisions/0006-segment-reuse.md gives the
    /// whole argument.
    pub fn dead_segment_reusable(&self, segment: &SegmentInfo, durable_through: u64) -> bool {
        match segment.state {
            SegmentState::Dead { died_at } => {
                !self.dead_segment_waits_for_checkpoints(segment) && died_at <= durable_through
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

    /// Frees every dead segment that [`SpaceAllocator::dead_segment_reusable`]
    /// allows. Called when a checkpoint becomes durable, and by the cleaner
    /// after the flushes that make its relocations durable. Returns the
    /// segments freed.
    pub fn free_reusable_dead_segments(&mut self, durable_through: u64) -> Vec<u32> {
        debug_assert!(self.dead_set_matches_states());
        let reusable: Vec<u32> = self
            .dead_segments
            .iter()
            .copied()
            .filter(|index| {
                self.dead_segment_reusable(&self.segments[*index as usize], durable_through)
            })
            .collect();
        for index in &reusable {
            self.free_segment(*index);
        }
        reusable
    }

    /// Puts a segment without live blocks on its tier's free list.
    pub fn free_segment(&mut self, segment_index: u32) {
        let segment = &mut self.segments[segment_index as usize];
        assert_eq!(
            segment.live_units, 0,
            "freeing segment {segment_index} with live blocks"
        );
        assert_ne!(
            segment.state,
            SegmentState::Free,
            "segment {segment_index} freed twice"
        );
        assert_ne!(
            segment.state,
            SegmentState::Open,
            "freeing the head segment {segment_index}"
        );
        segment.state = SegmentState::Free;
        segment.set_aside = false;
        self.dead_segments.remove(&segment_index);
        self.count_freed(segment_index);
        // Oldest freed first: a freed segment is rewritten as late as possible.
        // Tests that must see a segment rewritten soon after it is freed turn
        // the order around.
        let free_list = match self.geometry.tier_of_segment(segment_index) {
            Tier::Flash => &mut self.free_flash,
            Tier::Capacity => &mut self.free_capacity,
        };
        if self.reuse_freed_segments_first {
            free_list.push_front(segment_index);
        } else {
            free_list.push_back(segment_index);
        }
    }

    /// Dead flash segments whose death a sealed batch covers (one that died in
    /// an open batch waits for that batch to be sealed): those a flush frees,
    /// and those that wait for checkpoints
    /// ([`SpaceAllocator::dead_segment_waits_for_checkpoints`]).
    pub fn sealed_dead_flash_segment_counts(&self, sealed_through: u64) -> DeadSegmentCounts {
        let newest_covered = self
            .durable_checkpoints
            .last()
            .map_or(0, |checkpoint| checkpoint.covered_batch_sequence);
        let mut counts = DeadSegmentCounts::default();
        let dead_flash = self
            .dead_segments
            .iter()
            .filter(|index| self.geometry.tier_of_segment(**index) == Tier::Flash);
        for segment in dead_flash.map(|index| &self.segments[*index as usize]) {
            if matches!(segment.state, SegmentState::Dead { died_at } if died_at <= sealed_through)
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

    /// Dead segments of both tiers, whatever frees them.
    pub fn all_dead_segment_count(&self) -> usize {
        self.dead_segments.len()
    }

    /// Dead segments of `tier`, whatever frees them.
    pub fn dead_segment_count(&self, tier: Tier) -> usize {
        self.dead_segments
            .iter()
            .filter(|index| self.geometry.tier_of_segment(**index) == tier)
            .count()
    }

    /// Whether a dead segment waits for checkpoints to become free
    /// ([`SpaceAllocator::dead_segment_waits_for_checkpoints`]).
    pub fn any_dead_segment_waits_for_checkpoints(&self) -> bool {
        self.dead_segments
            .iter()
            .any(|index| self.dead_segment_waits_for_checkpoints(&self.segments[*index as usize]))
    }
}

impl SpaceAllocator {
    /// Sets each segment's newest batch, from a checkpoint's segment table.
    pub fn restore_last_batch_sequences(&mut self, last_batch_sequences: &[u64]) {
        if last_batch_sequences.len() != self.segments.len() {
            return;
        }
        for (segment, last) in self.segments.iter_mut().zip(last_batch_sequences) {
            segment.last_batch_sequence = *last;
        }
    }

    /// Rebuilds every segment's state and the free lists after replay:
    /// segments holding a kept body are checkpoint segments, those with live
    /// blocks sealed, empty ones free if both kept checkpoints cover them and
    /// dead otherwise.
    pub fn rebuild_after_recovery(&mut self, found: RecoveredSegments) {
        assert_eq!(found.live_units.len(), self.segments.len());
        self.free_flash.clear();
        self.free_capacity.clear();
        self.dead_segments.clear();
        self.live_location_count = found.live_location_count;
        for (index, segment) in self.segments.iter_mut().enumerate() {
            let index = segment_index(index as u64);
            segment.live_units = found.live_units[index as usize];
            segment.state = if found.held.contains(&index) {
                SegmentState::Checkpoint {
                    checkpoint_sequence: 0,
                }
            } else if segment.live_units > 0 {
                SegmentState::Sealed
            } else if segment.last_batch_sequence <= found.fallback_covered {
                SegmentState::Free
            } else {
                SegmentState::Dead {
                    died_at: found.highest_sequence,
                }
            };
            if matches!(segment.state, SegmentState::Dead { .. }) {
                self.dead_segments.insert(index);
            }
            if segment.state == SegmentState::Free {
                match self.geometry.tier_of_segment(index) {
                    Tier::Flash => self.free_flash.push_back(index),
                    Tier::Capacity => self.free_capacity.push_back(index),
                }
            }
        }
    }

    /// Restores the kept durable checkpoints, oldest first.
    pub fn restore_durable_checkpoints(&mut self, checkpoints: Vec<DurableCheckpoint>) {
        assert!(checkpoints.len() <= 2 && self.durable_checkpoints.is_empty());
        self.durable_checkpoints = checkpoints;
    }
}
