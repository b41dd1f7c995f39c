//! The read path: reads of any byte range of a volume or a snapshot, served
//! from memory (blocks not yet written, the memory cache) or from the device,
//! where every block is checked against its checksum; in a two-tier pool, the
//! promotion to flash of the capacity blocks that heat says are hot, with the
//! blocks that follow them on capacity; and the allocation map of a range.
//!
//! One read attempt runs in steps, each its own function: plan the read under
//! the state lock ([`ReadPlan`]: which blocks come from memory, which from the
//! device, which capacity blocks to promote and which of their neighbours come
//! along), coalesce the device blocks into runs, read the runs and the
//! neighbours at once, verify the checksums (a mismatch on a block that moved
//! meanwhile is a retry, otherwise damage), copy into the buffer, promote.

use std::ops::Range;
use std::sync::Arc;

use lamina_device::{AlignedBuffer, DeviceError};
use smallvec::SmallVec;

use super::fragment_read::{self, FragmentRead};
use super::stream::Stream;
use crate::convert::to_usize;
use crate::error::{EngineError, IoError, VolumeError};
use crate::log::batch::block_checksum;
use crate::log::fragment::fragment_units;
use crate::log::geometry::Tier;
use crate::log::location::{FRAGMENT_BLOCKS_MAX, Location};
use crate::pool::budget::ClientOperation;
use crate::pool::core::Core;
use crate::pool::core::state::{ReadParts, Relocation};
use crate::pool::space::{Allocation, SpaceAllocator};
use crate::tier::heat::VolumeTierCounters;
use crate::tier::memory_cache::{CacheGeneration, MemoryCache};
use crate::volume::map::{BlockMap, Mapping};
use crate::volume::{TierPolicy, View, ViewRef, VolumeTable};
use crate::{BLOCK_BYTES, BLOCK_SIZE_BYTES};

/// Times a read reads one block again because the block moved while the
/// read was in flight and its old place was rewritten meanwhile (each
/// attempt reads the block's new home from a fresh look in the map). Only
/// the blocks that moved are read again, one block each, so a long read
/// under a busy cleaner finishes; the bound only stops a read of a block
/// that never holds still (an error saying so, not a checksum mismatch).
/// Before retries were per block, a whole-volume read under the paced
/// cleaner on a loaded machine used up 4 whole-range attempts and reported
/// the block that moved as corrupt (CI, `cleaner_streams`).
const READ_MOVED_RETRY_COUNT_MAX: usize = 32;

/// Moved blocks one read attempt keeps without allocating.
const MOVED_BLOCKS_INLINE_COUNT: usize = 4;

/// The logical blocks of a read attempt whose device copy moved while it was
/// in flight: everything else the attempt copied is done.
type MovedBlocks = SmallVec<[u64; MOVED_BLOCKS_INLINE_COUNT]>;

/// Blocks after a promoted capacity block that are promoted with it when they
/// follow it both in the volume and on capacity (a 64 KiB window in all).
const PROMOTION_NEIGHBOUR_BLOCKS_MAX: u64 = 15;

/// Extents [`Pool::visit_extents_view`] and [`Pool::read_view_with_extents`]
/// gather without allocating: a read of one block has one, of a few blocks
/// rarely more than a hole and data.
const EXTENTS_INLINE_COUNT: usize = 4;

/// Blocks a read plans without allocating: up to 16 KiB.
const PLANNED_BLOCKS_INLINE_COUNT: usize = 4;

/// Free flash segments beyond the clients' reserve that promotions leave to
/// client writes: a promotion never pushes a writer into reclaiming.
pub(in crate::pool) const PROMOTION_HEADROOM_SEGMENT_COUNT: usize = 2;

/// One run of [`Pool::extents`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub length: u64,
    pub allocated: bool,
}

/// A block a read takes from the device. Ordered by logical block first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct DeviceBlock {
    /// Where the block is in the view read.
    logical_block: u64,
    /// Where it is on the device.
    physical_block: u64,
    /// The checksum its contents must have.
    checksum: u32,
    /// Its memory cache shard's generation when the read was planned: the
    /// block read is cached only if the shard has seen no invalidation since.
    generation: CacheGeneration,
}

/// Fills `span` of `buffer` with the block `fetch` gives: straight into
/// the buffer when the span is the whole block, else through a scratch
/// block of which the span's part is copied; whether `fetch` gave it (when
/// not, the span may hold anything and is to be read elsewhere).
fn serve_span(
    buffer: &mut [u8],
    span: BlockSpan,
    fetch: impl FnOnce(&mut [u8; BLOCK_BYTES]) -> bool,
) -> bool {
    if let Ok(whole) = <&mut [u8; BLOCK_BYTES]>::try_from(&mut buffer[span.request_range()]) {
        return fetch(whole);
    }
    let mut scratch = [0u8; BLOCK_BYTES];
    let served = fetch(&mut scratch);
    if served {
        buffer[span.request_range()].copy_from_slice(&scratch[span.block_range()]);
    }
    served
}

/// Where planning found a compressed block in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FragmentInMemory {
    Nowhere,
    /// In the open or an in-flight batch.
    Unwritten,
    /// Its packed blocks in the memory cache.
    Packed,
    /// Its decoded copy in the memory cache (decision 0075).
    Decoded,
}

/// A capacity block a read moves to flash: a whole block, or a fragment
/// moved as it is (decision 0074).
struct Promotion {
    logical_block: u64,
    from: Location,
    /// Its contents (a whole block's 4 KiB, a fragment's units), once read
    /// and checked; a block without them (its read did not happen) is not
    /// promoted.
    contents: Option<Box<[u8]>>,
}

/// The part of a byte request that falls in one logical block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::pool) struct BlockSpan {
    /// Where the part starts within the block.
    pub within_block: usize,
    /// Where it starts within the request.
    pub within_request: usize,
    pub length: usize,
}

impl BlockSpan {
    /// For a request of `request_length` bytes at byte `offset`, the part
    /// that falls in `logical_block`, which the request must touch.
    pub(in crate::pool) fn of(offset: u64, request_length: usize, logical_block: u64) -> Self {
        let block_start = logical_block * BLOCK_SIZE_BYTES;
        let start = offset.max(block_start);
        let end = (offset + request_length as u64).min(block_start + BLOCK_SIZE_BYTES);
        assert!(
            start < end,
            "block {logical_block} is outside the request of {request_length} bytes at {offset}"
        );
        let span = Self {
            within_block: to_usize(start - block_start),
            within_request: to_usize(start - offset),
            length: to_usize(end - start),
        };
        assert!(span.within_block + span.length <= BLOCK_BYTES);
        assert!(span.within_request + span.length <= request_length);
        span
    }

    /// The span's bytes within the block.
    pub(in crate::pool) fn block_range(&self) -> Range<usize> {
        self.within_block..self.within_block + self.length
    }

    /// The span's bytes within the request.
    pub(in crate::pool) fn request_range(&self) -> Range<usize> {
        self.within_request..self.within_request + self.length
    }
}

/// The view, if `length` bytes at `offset` lie inside it.
pub(in crate::pool) fn check_range(
    volumes: &VolumeTable,
    view: View,
    offset: u64,
    length: u64,
) -> Result<ViewRef<'_>, EngineError> {
    let found = volumes
        .view(view)
        .ok_or_else(|| EngineError::Volume(VolumeError::NoSuchVolume(format!("{view:?}"))))?;
    if offset
        .checked_add(length)
        .is_none_or(|end| end > found.size_bytes)
    {
        return Err(EngineError::Io(IoError::OutOfRange {
            volume: found.full_name(),
            offset,
            length,
            size_bytes: found.size_bytes,
        }));
    }
    Ok(found)
}

/// Whether flash has room for promotions: more free segments than the
/// clients' reserve plus the headroom promotions leave them.
fn flash_has_room_for_promotions(space: &SpaceAllocator) -> bool {
    space.free_flash_segment_count()
        > space.reserve_for(Allocation::Client) + PROMOTION_HEADROOM_SEGMENT_COUNT
}

/// A view's extents as gathered under the state lock, held inline for a read.
type GatheredExtents = SmallVec<[Extent; EXTENTS_INLINE_COUNT]>;

/// The allocation status of the bytes a read returned, as its own walk of the
/// map found it ([`Pool::read_view_with_extents`]), held inline.
pub type ReadExtents = GatheredExtents;

/// Adds `length` bytes of status `allocated` to `extents`, merged with the
/// last extent when the status repeats.
fn add_extent(extents: &mut GatheredExtents, length: u64, allocated: bool) {
    match extents.last_mut() {
        Some(last) if last.allocated == allocated => last.length += length,
        _ => extents.push(Extent { length, allocated }),
    }
}

/// Blocks a read plans to fetch, held inline for the short reads that are
/// most of a block device's traffic (a 4 KiB read is one block).
type PlannedBlocks = SmallVec<[DeviceBlock; PLANNED_BLOCKS_INLINE_COUNT]>;

/// What one read attempt does once the state lock is released.
struct ReadPlan {
    /// Blocks to read from the device, in logical order.
    from_device: PlannedBlocks,
    /// One-tier pools: blocks to take from the memory cache, or else from the
    /// device, in logical order (looked up once the state lock is released).
    from_cache_or_device: PlannedBlocks,
    /// Capacity blocks heat says to promote; those found in memory already
    /// have their contents.
    promotions: Vec<Promotion>,
    /// Capacity blocks after a promoted one, beyond the request, to promote
    /// with it.
    neighbours: Vec<DeviceBlock>,
    /// Compressed blocks to read from the device (`fragment_read`).
    fragments: Vec<FragmentRead>,
}

/// The walk of a view's map that plans one read attempt, under the state lock.
struct ReadPlanner<'a> {
    parts: ReadParts<'a>,
    cache: &'a MemoryCache,
    map: &'a BlockMap,
    policy: TierPolicy,
    /// The request's first byte.
    offset: u64,
    /// The request's last logical block.
    last_block: u64,
    view_block_count: u64,
    /// Whether promotions will find room (see [`Pool::promote`]), so that
    /// neighbours are worth reading.
    promotion_room: bool,
    /// Where this attempt's blocks were found.
    counters: VolumeTierCounters,
    plan: ReadPlan,
    /// The first block of the request marked lost, if any: the read fails.
    lost_block: Option<u64>,
    /// The request's allocation status, block by block as planned.
    extents: &'a mut ReadExtents,
}

impl<'a> ReadPlanner<'a> {
    /// Plans block `logical_block` of the request: zeros if unmapped, copied
    /// into `buffer` now if in memory, else read from the device; the heat
    /// learns of the access and may have it (and its neighbours) promoted.
    fn plan_block(&mut self, logical_block: u64, buffer: &mut [u8]) {
        let span = BlockSpan::of(self.offset, buffer.len(), logical_block);
        let mapping = self.map.get(logical_block);
        add_extent(self.extents, span.length as u64, mapping.is_some());
        let Some(mapping) = mapping else {
            buffer[span.request_range()].fill(0);
            return;
        };
        if mapping.is_lost() {
            self.lost_block.get_or_insert(logical_block);
            return;
        }
        if mapping.location.is_fragment() {
            self.plan_fragment(logical_block, mapping, span, buffer);
            return;
        }
        let tier = self.parts.geometry.tier_of_block(mapping.physical_block());
        let promote = self.heat_accessed(mapping.physical_block(), tier);
        let device_block = DeviceBlock {
            logical_block,
            physical_block: mapping.physical_block(),
            checksum: mapping.checksum,
            generation: self.cache.generation(mapping.physical_block()),
        };
        if self.parts.heat.is_none() {
            // One tier: no promotion and no tier counters wait for the cache's
            // answer, so the cache is asked after the state lock is released.
            if !self.copy_unwritten(mapping, span, buffer) {
                self.plan.from_cache_or_device.push(device_block);
            }
            return;
        }
        let mut scratch = [0u8; BLOCK_BYTES];
        let in_memory = self.copy_from_memory(mapping, &mut scratch);
        if promote {
            self.plan.promotions.push(Promotion {
                logical_block,
                from: mapping.location,
                contents: in_memory.then(|| Box::from(&scratch[..])),
            });
            if tier == Tier::Capacity && self.promotion_room {
                self.plan_neighbours(logical_block, mapping.physical_block());
            }
        }
        if in_memory {
            self.counters.memory_read_blocks += 1;
            buffer[span.request_range()].copy_from_slice(&scratch[span.block_range()]);
            return;
        }
        match tier {
            Tier::Flash => self.counters.flash_read_blocks += 1,
            Tier::Capacity => self.counters.capacity_read_blocks += 1,
        }
        self.plan.from_device.push(device_block);
    }

    /// Plans a compressed block: decoded now if it is in memory (its batch
    /// has not reached the device yet, or, in a two-tier pool, the memory
    /// cache holds the blocks it touches), else read from the device once
    /// the lock is released. In a two-tier pool heat learns of the access
    /// as for a whole block, and a capacity fragment it says to promote
    /// moves to flash as it is (decision 0074).
    fn plan_fragment(
        &mut self,
        logical_block: u64,
        mapping: Mapping,
        span: BlockSpan,
        buffer: &mut [u8],
    ) {
        let location = mapping.location;
        let tier = self.parts.geometry.tier_of_block(location.block());
        let promote = self.fragment_accessed(location, tier);
        let mut blocks = [0u8; FRAGMENT_BLOCKS_MAX as usize * BLOCK_BYTES];
        let touched = &mut blocks[..location.block_count() as usize * BLOCK_BYTES];
        let mut decoded = [0u8; BLOCK_BYTES];
        let found =
            self.fragment_in_memory(location, mapping.checksum, promote, touched, &mut decoded);
        let served = match found {
            FragmentInMemory::Nowhere => false,
            FragmentInMemory::Decoded => true,
            FragmentInMemory::Unwritten | FragmentInMemory::Packed => {
                fragment_read::decode(location, touched, mapping.checksum, &mut decoded).is_ok()
            }
        };
        if served {
            if found == FragmentInMemory::Packed {
                let generation = self.cache.generation(location.block());
                self.cache
                    .offer_decoded(location, mapping.checksum, &decoded, generation);
            }
            buffer[span.request_range()].copy_from_slice(&decoded[span.block_range()]);
            if self.parts.heat.is_some() {
                self.counters.memory_read_blocks += 1;
            }
            if promote {
                self.plan.promotions.push(Promotion {
                    logical_block,
                    from: location,
                    contents: fragment_units(location, touched).ok().map(Box::from),
                });
            }
            return;
        }
        if self.parts.heat.is_some() {
            match tier {
                Tier::Flash => self.counters.flash_read_blocks += 1,
                Tier::Capacity => self.counters.capacity_read_blocks += 1,
            }
        }
        let block = location.block();
        self.plan.fragments.push(FragmentRead {
            logical_block,
            location,
            checksum: mapping.checksum,
            generations: [
                self.cache.generation(block),
                self.cache.generation(block + 1),
            ],
            promote,
        });
    }

    /// Finds a fragment at `location` in memory: the blocks it touches,
    /// copied into `touched`, if they are not written yet; in two-tier pools
    /// (which count memory hits under the lock) its decoded copy, copied
    /// into `decoded` (not for a fragment to promote, which needs its
    /// units), or its packed blocks in the memory cache. A one-tier pool
    /// asks its cache after the lock is released (`read.rs`
    /// `take_decoded_from_cache`, `fragment_read`).
    fn fragment_in_memory(
        &self,
        location: Location,
        checksum: u32,
        promote: bool,
        touched: &mut [u8],
        decoded: &mut [u8; BLOCK_BYTES],
    ) -> FragmentInMemory {
        let writer = self.parts.writer;
        let unwritten = touched
            .chunks_exact_mut(BLOCK_BYTES)
            .zip(location.block()..)
            .all(|(block, physical_block)| writer.copy_unwritten_block(physical_block, block));
        if unwritten {
            return FragmentInMemory::Unwritten;
        }
        if self.parts.heat.is_none() {
            return FragmentInMemory::Nowhere;
        }
        if !promote && self.cache.get_decoded(location, checksum, decoded) {
            return FragmentInMemory::Decoded;
        }
        let packed = touched
            .chunks_exact_mut(BLOCK_BYTES)
            .zip(location.block()..)
            .all(|(block, physical_block)| self.cache.get(physical_block, block));
        if packed {
            FragmentInMemory::Packed
        } else {
            FragmentInMemory::Nowhere
        }
    }

    /// Tells the heat (two-tier pools) of an access to the fragment at
    /// `location` on `tier`; returns whether heat says to promote it. On
    /// flash the fragments packed in a block share its counter; on capacity
    /// the ghost remembers the fragment itself, so that reading one
    /// fragment of a block does not promote its neighbours on their first
    /// read.
    fn fragment_accessed(&mut self, location: Location, tier: Tier) -> bool {
        match tier {
            Tier::Flash => self.heat_accessed(location.block(), tier),
            Tier::Capacity => {
                let policy = self.policy;
                self.parts
                    .heat
                    .as_deref_mut()
                    .is_some_and(|heat| heat.admit_from_capacity(location.raw(), policy))
            }
        }
    }

    /// Copies the part `span` of the block `mapping` points to into `buffer`
    /// if the block has not reached the device yet; a whole block goes
    /// straight into `buffer`, without a scratch block to clear.
    fn copy_unwritten(&self, mapping: Mapping, span: BlockSpan, buffer: &mut [u8]) -> bool {
        let writer = self.parts.writer;
        if span.length == BLOCK_BYTES {
            return writer
                .copy_unwritten_block(mapping.physical_block(), &mut buffer[span.request_range()]);
        }
        let mut scratch = [0u8; BLOCK_BYTES];
        let copied = writer.copy_unwritten_block(mapping.physical_block(), &mut scratch);
        if copied {
            buffer[span.request_range()].copy_from_slice(&scratch[span.block_range()]);
        }
        copied
    }

    /// Tells the heat (two-tier pools) of an access to `physical_block` on
    /// `tier`; returns whether heat says to promote it.
    fn heat_accessed(&mut self, physical_block: u64, tier: Tier) -> bool {
        let geometry = self.parts.geometry;
        let Some(heat) = self.parts.heat.as_deref_mut() else {
            return false;
        };
        match tier {
            Tier::Flash => {
                let index = geometry
                    .flash_data_index(physical_block)
                    .expect("a flash block");
                heat.flash_accessed(index, self.policy);
                false
            }
            Tier::Capacity => heat.admit_from_capacity(physical_block, self.policy),
        }
    }

    /// Copies the block `mapping` points to into `scratch` if it is in memory:
    /// not written yet, or in the memory cache with the contents the map
    /// expects. Returns false when it must be read from the device.
    fn copy_from_memory(&self, mapping: Mapping, scratch: &mut [u8]) -> bool {
        self.parts
            .writer
            .copy_unwritten_block(mapping.physical_block(), scratch)
            || (self.cache.get(mapping.physical_block(), scratch)
                && block_checksum(scratch) == mapping.checksum)
    }

    /// Plans the promotion of the blocks after promoted capacity block
    /// `physical_block` that were demoted with it: next in the view (beyond
    /// the request) and next on capacity, or after one batch summary or
    /// segment boundary (capacity segments are adjacent). On a disk they cost
    /// only transfer time, and a working set returns to flash in a fraction
    /// of the reads.
    fn plan_neighbours(&mut self, logical_block: u64, physical_block: u64) {
        let mut previous = physical_block;
        for step in 1..=PROMOTION_NEIGHBOUR_BLOCKS_MAX {
            let neighbour = logical_block + step;
            if neighbour <= self.last_block || neighbour >= self.view_block_count {
                break;
            }
            let Some(next) = self
                .map
                .get(neighbour)
                .filter(|next| !next.location.is_fragment())
            else {
                break;
            };
            let follows = (previous + 1..=previous + 2).contains(&next.physical_block())
                && self.parts.geometry.tier_of_block(next.physical_block()) == Tier::Capacity;
            if !follows {
                break;
            }
            self.plan.neighbours.push(DeviceBlock {
                logical_block: neighbour,
                physical_block: next.physical_block(),
                checksum: next.checksum,
                generation: self.cache.generation(next.physical_block()),
            });
            previous = next.physical_block();
        }
    }
}

/// Splits `blocks` into runs of consecutive physical blocks of at most
/// `run_blocks_max` blocks, each read with one device read.
fn device_runs(blocks: &[DeviceBlock], run_blocks_max: u64) -> Vec<&[DeviceBlock]> {
    let mut runs: Vec<&[DeviceBlock]> = Vec::new();
    let mut start = 0;
    for index in 1..=blocks.len() {
        let breaks = index == blocks.len()
            || blocks[index].physical_block != blocks[index - 1].physical_block + 1
            || (index - start) as u64 >= run_blocks_max;
        if breaks {
            runs.push(&blocks[start..index]);
            start = index;
        }
    }
    for run in &runs {
        assert!(
            run.windows(2)
                .all(|pair| pair[1].physical_block == pair[0].physical_block + 1),
            "a device run's blocks are contiguous"
        );
    }
    runs
}

/// Splits sorted neighbours into spans whose blocks follow each other on the
/// device with gaps of at most one block (a batch summary), each read with
/// one device read.
fn neighbour_spans(neighbours: &[DeviceBlock]) -> Vec<&[DeviceBlock]> {
    let mut spans: Vec<&[DeviceBlock]> = Vec::new();
    let mut start = 0;
    for index in 1..=neighbours.len() {
        let span_ends = index == neighbours.len()
            || !(neighbours[index - 1].physical_block + 1
                ..=neighbours[index - 1].physical_block + 2)
                .contains(&neighbours[index].physical_block);
        if span_ends {
            spans.push(&neighbours[start..index]);
            start = index;
        }
    }
    spans
}

/// The blocks of `data`, the contents of `run` read from the device, beside
/// the blocks of `run`, leaving out those that `moved` (their bytes are
/// another block's).
fn run_contents<'a>(
    run: &'a [DeviceBlock],
    data: &'a [u8],
    moved: &'a [u64],
) -> impl Iterator<Item = (&'a DeviceBlock, &'a [u8])> {
    assert_eq!(
        data.len(),
        run.len() * BLOCK_BYTES,
        "a device read returns the run's blocks"
    );
    run.iter()
        .zip(data.chunks_exact(BLOCK_BYTES))
        .filter(|(block, _)| !moved.contains(&block.logical_block))
}

/// Copies the verified blocks of a run into the request's buffer.
fn copy_run(offset: u64, run: &[DeviceBlock], data: &[u8], buffer: &mut [u8], moved: &[u64]) {
    for (block, contents) in run_contents(run, data, moved) {
        let span = BlockSpan::of(offset, buffer.len(), block.logical_block);
        buffer[span.request_range()].copy_from_slice(&contents[span.block_range()]);
    }
}

/// Gives the promotions of a run's blocks the contents just read and verified.
fn attach_contents(promotions: &mut [Promotion], run: &[DeviceBlock], data: &[u8], moved: &[u64]) {
    for (block, contents) in run_contents(run, data, moved) {
        if let Some(promotion) = promotions.iter_mut().find(|promotion| {
            promotion.from == Location::whole_block(block.physical_block)
                && promotion.contents.is_none()
        }) {
            promotion.contents = Some(Box::from(contents));
        }
    }
}

impl Core {
    /// Reads like `Pool::read_view` and leaves in `extents` the allocation
    /// status of the bytes read, from the same walk of the map that planned
    /// the read: the NBD server sends holes as hole chunks without a second
    /// walk under the state lock, and the status is the one the data has.
    pub(in crate::pool) async fn read_view_with_extents(
        self: &Arc<Self>,
        view: View,
        offset: u64,
        buffer: &mut [u8],
        extents: &mut ReadExtents,
    ) -> Result<(), EngineError> {
        let started = tokio::time::Instant::now();
        let result = self.read_view_attempts(view, offset, buffer, extents).await;
        self.budget()
            .record_client_latency(ClientOperation::Read, started.elapsed());
        result
    }

    /// `Pool::read_view`'s attempts, untimed: the whole range once, then
    /// each block that moved under it again on its own.
    pub(in crate::pool) async fn read_view_attempts(
        self: &Arc<Self>,
        view: View,
        offset: u64,
        buffer: &mut [u8],
        extents: &mut ReadExtents,
    ) -> Result<(), EngineError> {
        let moved = self.read_view_once(view, offset, buffer, extents).await?;
        // A block moved (cleaned, demoted, promoted, overwritten) and its old
        // segment was rewritten while the read was in flight: the map has its
        // new home. The extents stay the first plan's: a block that is a hole
        // by now reads as zeros, which its data chunk carries as well.
        for logical_block in moved {
            self.read_moved_block(view, offset, buffer, logical_block)
                .await?;
        }
        Ok(())
    }

    /// Reads again the part of a request's `buffer` (at byte `offset`) that
    /// falls in `logical_block`, which moved under the first attempt, until
    /// it holds still long enough to be read.
    async fn read_moved_block(
        self: &Arc<Self>,
        view: View,
        offset: u64,
        buffer: &mut [u8],
        logical_block: u64,
    ) -> Result<(), EngineError> {
        let span = BlockSpan::of(offset, buffer.len(), logical_block);
        let part_offset = offset + span.within_request as u64;
        let part = &mut buffer[span.request_range()];
        let mut extents = ReadExtents::new();
        for _ in 0..READ_MOVED_RETRY_COUNT_MAX {
            let moved = self
                .read_view_once(view, part_offset, part, &mut extents)
                .await?;
            if moved.is_empty() {
                return Ok(());
            }
            assert_eq!(
                moved[..],
                [logical_block],
                "a one-block read moves its block"
            );
        }
        Err(EngineError::Io(IoError::KeptMoving {
            volume: self.view_name(view),
            logical_block,
            attempts: READ_MOVED_RETRY_COUNT_MAX,
        }))
    }

    /// One attempt of `Pool::read_view`: the blocks it could read are in
    /// `buffer`, those that moved under it are returned.
    async fn read_view_once(
        self: &Arc<Self>,
        view: View,
        offset: u64,
        buffer: &mut [u8],
        extents: &mut ReadExtents,
    ) -> Result<MovedBlocks, EngineError> {
        extents.clear();
        if buffer.is_empty() {
            return Ok(MovedBlocks::new());
        }
        let mut plan = self.plan_read(view, offset, buffer, extents)?;
        let mut fragments_moved = Vec::new();
        if !plan.fragments.is_empty() {
            self.take_decoded_from_cache(&mut plan, offset, buffer);
        }
        if !plan.fragments.is_empty() {
            let fragments = std::mem::take(&mut plan.fragments);
            let request_length = buffer.len();
            let mut copy = |logical_block: u64, block: &[u8; BLOCK_BYTES]| {
                let span = BlockSpan::of(offset, request_length, logical_block);
                buffer[span.request_range()].copy_from_slice(&block[span.block_range()]);
            };
            let read = self.read_fragments(view, &fragments, &mut copy).await?;
            fragments_moved = read.moved;
            plan.promotions
                .extend(read.promoted.into_iter().map(|promoted| Promotion {
                    logical_block: promoted.logical_block,
                    from: promoted.location,
                    contents: Some(promoted.units),
                }));
        }
        if !plan.from_cache_or_device.is_empty() {
            self.take_from_cache(&mut plan, offset, buffer);
        }
        if plan.neighbours.is_empty()
            && fragments_moved.is_empty()
            && let [block] = plan.from_device[..]
        {
            return self
                .read_one_block(view, offset, block, buffer, plan.promotions)
                .await;
        }
        let runs = device_runs(&plan.from_device, self.limits().read_run_blocks_max);
        // Neighbours of promoted blocks are read in the same go, issued right
        // after the blocks they follow, so that a disk serves them in sequence
        // instead of after every request queued meanwhile.
        plan.neighbours.sort_unstable();
        plan.neighbours.dedup();
        let (results, neighbour_promotions) = tokio::join!(
            self.read_runs(&runs),
            self.read_neighbours(&plan.neighbours)
        );
        plan.promotions.extend(neighbour_promotions);
        let mut moved: MovedBlocks = fragments_moved.into_iter().collect();
        for (run, result) in runs.iter().zip(results) {
            let run_moved = self
                .verify_and_copy(view, offset, run, result, buffer, &mut plan.promotions)
                .await?;
            moved.extend(run_moved);
        }
        // A moved block's promotion has no contents, and is skipped.
        if !plan.promotions.is_empty() {
            self.promote(view.volume_id(), plan.promotions);
        }
        Ok(moved)
    }

    /// The common cache miss: one block from the device and nothing read
    /// alongside it, so no runs to split and no reads to join.
    async fn read_one_block(
        self: &Arc<Self>,
        view: View,
        offset: u64,
        block: DeviceBlock,
        buffer: &mut [u8],
        mut promotions: Vec<Promotion>,
    ) -> Result<MovedBlocks, EngineError> {
        let run = [block];
        let result = self
            .device()
            .read(block.physical_block * BLOCK_SIZE_BYTES, BLOCK_BYTES)
            .await;
        let moved = self
            .verify_and_copy(view, offset, &run, result, buffer, &mut promotions)
            .await?;
        if moved.is_empty() && !promotions.is_empty() {
            self.promote(view.volume_id(), promotions);
        }
        Ok(moved)
    }

    /// Checks the blocks of a run just read, copies those that did not move
    /// into the request's buffer, gives their contents to the promotions
    /// waiting for them and returns those that moved.
    async fn verify_and_copy(
        self: &Arc<Self>,
        view: View,
        offset: u64,
        run: &[DeviceBlock],
        result: Result<AlignedBuffer, DeviceError>,
        buffer: &mut [u8],
        promotions: &mut [Promotion],
    ) -> Result<MovedBlocks, EngineError> {
        let mut data = result?;
        let moved = self.verify_run(view, run, &mut data).await?;
        copy_run(offset, run, &data, buffer, &moved);
        attach_contents(promotions, run, &data, &moved);
        for (block, contents) in run_contents(run, &data, &moved) {
            // Unless the block died since the read was planned.
            self.cache()
                .insert_read(block.physical_block, contents, block.generation);
        }
        Ok(moved)
    }

    /// Copies the blocks of `plan.from_cache_or_device` found in the memory
    /// cache (with the contents the map expected when planned) into
    /// `buffer`, outside the state lock; the others become the plan's device
    /// blocks, in the same order.
    fn take_from_cache(&self, plan: &mut ReadPlan, offset: u64, buffer: &mut [u8]) {
        assert!(
            plan.from_device.is_empty(),
            "a one-tier plan leaves every block to the cache or the device"
        );
        let cache = self.cache();
        plan.from_cache_or_device.retain(|block| {
            let span = BlockSpan::of(offset, buffer.len(), block.logical_block);
            // A failed check leaves bytes the device read overwrites.
            !serve_span(buffer, span, |contents| {
                cache.get(block.physical_block, contents)
                    && block_checksum(contents) == block.checksum
            })
        });
        plan.from_device = std::mem::take(&mut plan.from_cache_or_device);
    }

    /// Copies the compressed blocks of `plan.fragments` the memory cache
    /// holds decoded (decision 0075) into `buffer`, outside the state lock,
    /// and leaves the others to `fragment_read`. A fragment to promote needs
    /// its units, which a decoded copy lacks: it is left too.
    fn take_decoded_from_cache(&self, plan: &mut ReadPlan, offset: u64, buffer: &mut [u8]) {
        let cache = self.cache();
        plan.fragments.retain(|fragment| {
            if fragment.promote {
                return true;
            }
            let span = BlockSpan::of(offset, buffer.len(), fragment.logical_block);
            !serve_span(buffer, span, |contents| {
                cache.get_decoded(fragment.location, fragment.checksum, contents)
            })
        });
    }

    /// Plans a read under the state lock (see [`ReadPlanner`]): blocks in
    /// memory and unwritten blocks are copied into `buffer` now; the others
    /// are left to the plan. Counts where the blocks were found.
    fn plan_read(
        &self,
        view: View,
        offset: u64,
        buffer: &mut [u8],
        extents: &mut ReadExtents,
    ) -> Result<ReadPlan, EngineError> {
        let volume_id = view.volume_id();
        let mut state = self.lock();
        let parts = state.read_parts();
        let found = check_range(parts.volumes, view, offset, buffer.len() as u64)?;
        let two_tier = parts.heat.is_some();
        let first_block = offset / BLOCK_SIZE_BYTES;
        let last_block = (offset + buffer.len() as u64 - 1) / BLOCK_SIZE_BYTES;
        let mut planner = ReadPlanner {
            cache: self.cache(),
            map: found.map,
            policy: parts
                .volumes
                .get(volume_id)
                .map(|volume| volume.policy)
                .unwrap_or_default(),
            offset,
            last_block,
            view_block_count: found.size_bytes / BLOCK_SIZE_BYTES,
            promotion_room: flash_has_room_for_promotions(parts.space),
            counters: VolumeTierCounters::default(),
            plan: ReadPlan {
                from_device: PlannedBlocks::new(),
                from_cache_or_device: PlannedBlocks::new(),
                promotions: Vec::new(),
                neighbours: Vec::new(),
                fragments: Vec::new(),
            },
            parts,
            lost_block: None,
            extents,
        };
        for logical_block in first_block..=last_block {
            planner.plan_block(logical_block, buffer);
        }
        let ReadPlanner {
            counters,
            plan,
            lost_block,
            ..
        } = planner;
        if let Some(logical_block) = lost_block {
            drop(state);
            self.integrity().lost_block_read();
            return Err(EngineError::Io(IoError::BlockLost {
                volume: self.view_name(view),
                logical_block,
            }));
        }
        if two_tier {
            let total = state.tier_counters_of(volume_id);
            total.memory_read_blocks += counters.memory_read_blocks;
            total.flash_read_blocks += counters.flash_read_blocks;
            total.capacity_read_blocks += counters.capacity_read_blocks;
        }
        Ok(plan)
    }

    /// Reads runs of blocks from the device, all at once.
    async fn read_runs(
        self: &Arc<Self>,
        runs: &[&[DeviceBlock]],
    ) -> Vec<Result<AlignedBuffer, DeviceError>> {
        let reads = runs.iter().map(|run| {
            self.device().read(
                run[0].physical_block * BLOCK_SIZE_BYTES,
                run.len() * BLOCK_BYTES,
            )
        });
        futures::future::join_all(reads).await
    }

    /// Checks the blocks of a run just read against their checksums. A
    /// mismatch on a block the map no longer points to is a move (returned:
    /// the block is read again); on one it still points to, damage: rebuilt
    /// from the device's redundancy when it has any (and the bad copy
    /// rewritten), otherwise an error, counted.
    async fn verify_run(
        self: &Arc<Self>,
        view: View,
        run: &[DeviceBlock],
        data: &mut [u8],
    ) -> Result<MovedBlocks, EngineError> {
        assert_eq!(
            data.len(),
            run.len() * BLOCK_BYTES,
            "a device read returns the run's blocks"
        );
        let mut moved = MovedBlocks::new();
        for (block, contents) in run.iter().zip(data.chunks_exact_mut(BLOCK_BYTES)) {
            if block_checksum(contents) == block.checksum {
                continue;
            }
            if self.moved_since_planned(view, block) {
                moved.push(block.logical_block);
                continue;
            }
            if let Some(good) = self
                .recover_block(block.physical_block, block.logical_block, block.checksum)
                .await
            {
                contents.copy_from_slice(&good);
                continue;
            }
            let DeviceBlock {
                logical_block,
                physical_block,
                ..
            } = *block;
            // Named only now: a read that passes its checksums allocates no name.
            let view_name = self.view_name(view);
            tracing::error!(volume = %view_name, logical_block, physical_block, "checksum mismatch");
            self.integrity().read_checksum_error();
            return Err(EngineError::Io(IoError::ChecksumMismatch {
                volume: view_name,
                logical_block,
                physical_block,
            }));
        }
        Ok(moved)
    }

    /// A block (at `physical_block`, `logical_block` for the log) failed its
    /// checksum: its contents rebuilt from the device's redundancy and
    /// checked against `checksum` (the device rewrites the bad copy), or
    /// `None` when the device has none or cannot.
    pub(in crate::pool) async fn recover_block(
        self: &Arc<Self>,
        physical_block: u64,
        logical_block: u64,
        checksum: u32,
    ) -> Option<AlignedBuffer> {
        let is_valid = move |contents: &[u8]| block_checksum(contents) == checksum;
        let offset = physical_block * BLOCK_SIZE_BYTES;
        match self.device().recover_block(offset, &is_valid).await {
            Ok(Some(good)) => {
                // Checked in pairs: the device checked it, and so do we.
                assert_eq!(
                    block_checksum(&good),
                    checksum,
                    "a recovered block passes its checksum"
                );
                tracing::warn!(
                    physical_block,
                    logical_block,
                    "block failed its checksum and was repaired from redundancy"
                );
                self.integrity().checksum_error_repaired();
                Some(good)
            }
            Ok(None) => None,
            Err(error) => {
                tracing::error!(%error, physical_block, "rebuilding a damaged block failed");
                None
            }
        }
    }

    /// The full name of `view` (`VOL` or `VOL@SNAP`) for errors, or its
    /// identifier if it was deleted meanwhile.
    pub(in crate::pool) fn view_name(&self, view: View) -> String {
        let state = self.lock();
        state
            .volumes()
            .view(view)
            .map_or_else(|| format!("{view:?}"), |found| found.full_name())
    }

    /// Whether the view's map no longer points `block`'s logical block at its
    /// physical block with its checksum.
    fn moved_since_planned(&self, view: View, block: &DeviceBlock) -> bool {
        let state = self.lock();
        state
            .volumes()
            .view(view)
            .and_then(|found| found.map.get(block.logical_block))
            .is_none_or(|now| {
                now.location != Location::whole_block(block.physical_block)
                    || now.checksum != block.checksum
            })
    }

    /// Reads the neighbours of promoted blocks (spans with gaps of at most one
    /// block, one device read each, all at once) and returns those that pass
    /// their checksum, as promotions. A failed read or a mismatch only skips
    /// the block: the client did not ask for it.
    async fn read_neighbours(self: &Arc<Self>, neighbours: &[DeviceBlock]) -> Vec<Promotion> {
        let spans = neighbour_spans(neighbours);
        let reads = spans.iter().map(|span| {
            let first = span[0].physical_block;
            let span_blocks = to_usize(span[span.len() - 1].physical_block - first + 1);
            self.device()
                .read(first * BLOCK_SIZE_BYTES, span_blocks * BLOCK_BYTES)
        });
        let mut promotions = Vec::new();
        for (span, result) in spans.iter().zip(futures::future::join_all(reads).await) {
            let Ok(data) = result else { continue };
            let first = span[0].physical_block;
            for block in span.iter() {
                let position = to_usize(block.physical_block - first);
                assert!(
                    (position + 1) * BLOCK_BYTES <= data.len(),
                    "a neighbour lies inside its span's read"
                );
                let contents = &data[position * BLOCK_BYTES..(position + 1) * BLOCK_BYTES];
                if block_checksum(contents) == block.checksum {
                    promotions.push(Promotion {
                        logical_block: block.logical_block,
                        from: Location::whole_block(block.physical_block),
                        contents: Some(Box::from(contents)),
                    });
                }
            }
        }
        promotions
    }

    /// Moves blocks just read from capacity to flash (the read has checked
    /// their checksums), unless flash has no room for them now: promotion
    /// never makes a client wait for space. Each move is a relocation record,
    /// so a crash keeps either the old or the new home, never neither.
    fn promote(self: &Arc<Self>, volume_id: u32, promotions: Vec<Promotion>) {
        let in_flight_limit = self.limits().in_flight_batches_max;
        let mut sealed = Vec::new();
        {
            let mut state = self.lock();
            if state.writer().failed().is_some()
                || state.writer().in_flight_count() >= in_flight_limit
                || !flash_has_room_for_promotions(state.space())
            {
                return;
            }
            // The family of the volume that wrote the block: its origin's
            // root, whose family holds every map that can share it.
            let root = state.volumes().root_of(volume_id);
            let family = state.volumes().family(root);
            for promotion in promotions {
                let Some(contents) = promotion.contents else {
                    continue;
                };
                let relocation = Relocation {
                    family: &family,
                    volume_id: root,
                    logical_block: promotion.logical_block,
                    from: promotion.from,
                    data: &contents,
                    stream: Stream::Client,
                };
                match state.append_relocation(relocation, &mut sealed) {
                    Ok(true) => state.tier_counters_of(volume_id).promoted_blocks += 1,
                    Ok(false) => {}
                    Err(_) => break,
                }
            }
        }
        self.spawn_writes(sealed);
    }

    /// Allocation map of a volume or a snapshot (see `Pool::extents`).
    pub(in crate::pool) fn extents_view(
        &self,
        view: View,
        offset: u64,
        length: u64,
    ) -> Result<Vec<Extent>, EngineError> {
        // A long map has spilled to the heap: that allocation becomes the list.
        Ok(self.gather_extents(view, offset, length)?.into_vec())
    }

    /// The allocation map of `Pool::extents_view`, handed to `visit` extent
    /// by extent: the NBD server asks it on every read, to find holes, and a
    /// read's few extents are gathered without allocating. `visit` runs after
    /// the state lock is released, so it may call the pool.
    pub(in crate::pool) fn visit_extents_view(
        &self,
        view: View,
        offset: u64,
        length: u64,
        visit: impl FnMut(Extent),
    ) -> Result<(), EngineError> {
        self.gather_extents(view, offset, length)?
            .into_iter()
            .for_each(visit);
        Ok(())
    }

    /// Walks the view's map under the state lock, merging blocks of the same
    /// status into extents.
    fn gather_extents(
        &self,
        view: View,
        offset: u64,
        length: u64,
    ) -> Result<GatheredExtents, EngineError> {
        let mut extents = GatheredExtents::new();
        let state = self.lock();
        let map = check_range(state.volumes(), view, offset, length)?.map;
        let end = offset + length;
        let mut position = offset;
        while position < end {
            let logical_block = position / BLOCK_SIZE_BYTES;
            let next = ((logical_block + 1) * BLOCK_SIZE_BYTES).min(end);
            add_extent(
                &mut extents,
                next - position,
                map.get(logical_block).is_some(),
            );
            position = next;
        }
        Ok(extents)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device_block(logical_block: u64, physical_block: u64) -> DeviceBlock {
        DeviceBlock {
            logical_block,
            physical_block,
            checksum: 0,
            generation: CacheGeneration::default(),
        }
    }

    #[test]
    fn spans_cover_the_request_part_in_each_block() {
        // 100 bytes from 10 before the end of block 1 to 90 into block 2.
        let offset = 2 * BLOCK_SIZE_BYTES - 10;
        let first = BlockSpan::of(offset, 100, 1);
        assert_eq!(
            (first.within_block, first.within_request, first.length),
            (4086, 0, 10)
        );
        let second = BlockSpan::of(offset, 100, 2);
        assert_eq!(
            (second.within_block, second.within_request, second.length),
            (0, 10, 90)
        );
    }

    #[test]
    #[should_panic(expected = "outside the request")]
    fn a_span_of_a_block_outside_the_request_is_a_bug() {
        BlockSpan::of(0, 100, 1);
    }

    #[test]
    fn runs_break_at_gaps_and_at_the_run_length() {
        let blocks: Vec<_> = [10, 11, 12, 20, 21]
            .iter()
            .enumerate()
            .map(|(index, physical)| device_block(index as u64, *physical))
            .collect();
        let lengths: Vec<_> = device_runs(&blocks, 2)
            .iter()
            .map(|run| run.len())
            .collect();
        assert_eq!(lengths, [2, 1, 2]);
        assert!(device_runs(&[], 2).is_empty());
    }

    #[test]
    fn neighbour_spans_bridge_one_block_gaps() {
        let blocks = [
            device_block(1, 10),
            device_block(2, 12),
            device_block(3, 15),
        ];
        let lengths: Vec<_> = neighbour_spans(&blocks)
            .iter()
            .map(|span| span.len())
            .collect();
        assert_eq!(lengths, [2, 1]);
    }
}
