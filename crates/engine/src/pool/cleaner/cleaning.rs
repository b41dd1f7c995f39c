//! The cleaner's passes ([`Cleaner`]): picking victims, reading each in
//! pieces, walking its batch chain, moving its live blocks to the streams
//! `placement` chooses, and a blocked writer's reclaim (flush, clean,
//! checkpoint, in rounds). The paced cleaner (`pacing`), the demoter,
//! evacuation and the flush-and-checkpoint loop build a `Cleaner` on the
//! core where they clean.

use futures::{StreamExt, TryStreamExt};
use lamina_device::AlignedBuffer;

use std::collections::HashMap;
use std::sync::Arc;

use super::victims::{VictimPolicy, pick_victims, pick_victims_in};
use crate::convert::to_usize;
use crate::error::{EngineError, IoError};
use crate::log::batch::block_checksum;
use crate::log::chain;
use crate::log::data_layout::Placement;
use crate::log::geometry::Tier;
use crate::log::location::{Location, UNIT_BYTES};
use crate::pool::budget::BackgroundWork;
use crate::pool::checkpoint::Checkpointer;
use crate::pool::core::Core;
use crate::pool::core::state::{Relocation, State};
use crate::pool::io::fragment_read;
use crate::pool::io::stream::Stream;
use crate::pool::io::writer::InFlightBatch;
use crate::pool::space::{Allocation, CAPACITY_RESERVE_SEGMENT_COUNT, SegmentState};
use crate::pool::tiering::cold_compression::{Recompressed, recompress};
use crate::{BLOCK_BYTES, BLOCK_SIZE_BYTES};

/// Free and dead capacity segments beyond the demotions' reserve under which
/// the cleaner cleans a capacity victim before demoting more.
const CAPACITY_SHORT_SEGMENT_COUNT: usize = 2;

/// Capacity victims cleaned before one pass over flash victims at most.
const CAPACITY_VICTIMS_PER_PASS_MAX: usize = 4;

/// Segments cleaned in one pass at most.
pub const CLEAN_PASS_SEGMENTS_MAX: usize = 16;

/// Clean-and-checkpoint rounds a blocked writer runs at least before giving up
/// (a victim is freed by the next round's flush, or up to two checkpoints after
/// it is emptied); pools with more segments than this get one round per segment.
const RECLAIM_ROUNDS_MAX: usize = 32;
/// A write that waited this long or longer for space is logged (debug):
/// what the pool looked like after the reclaim explains a latency spike.
const SPACE_WAIT_LOGGED_MS: u64 = 10;

/// Blocks relocated per hold of the state lock.
const RELOCATION_CHUNK_BLOCKS: usize = 64;

/// Live bytes of the victims a pass over at most `segment_count_max` would
/// take now: what background cleaning asks the budget for before it starts
/// (the victims may change by then; the budget needs the size, not the
/// segments).
pub(crate) fn next_victims_live_bytes(state: &State, segment_count_max: usize) -> u64 {
    pick_victims(state, segment_count_max, VictimPolicy::CostBenefit)
        .iter()
        .map(|victim| u64::from(state.space().segment(*victim).live_blocks()))
        .sum::<u64>()
        * BLOCK_SIZE_BYTES
}

/// Segments emptied and waiting for a flush or checkpoints to be freed.
fn dead_segment_count(state: &State) -> usize {
    state.space().all_dead_segment_count()
}

/// What `Pool::segment_table` returns.
#[doc(hidden)]
#[derive(Clone, Debug)]
pub struct SegmentTable {
    pub segments: Vec<crate::pool::space::SegmentInfo>,
    pub free_segments: Vec<u32>,
    pub client_reserve_segment_count: usize,
    /// Free segments the cleaner leaves to checkpoints and records.
    pub cleaner_reserve_floor_segment_count: usize,
    pub covered_by_every_checkpoint: u64,
    pub durable_through: u64,
}

/// A victim segment's contents, as read in pieces of equal size (whole blocks;
/// the last may be shorter).
struct VictimContents {
    pieces: Vec<AlignedBuffer>,
    piece_bytes: usize,
}

impl VictimContents {
    /// The block that starts `offset` bytes into the segment.
    fn block_at(&self, offset: usize) -> &[u8] {
        let block = BLOCK_BYTES;
        assert!(
            offset.is_multiple_of(block),
            "victim block offset {offset} is not block-aligned"
        );
        let within = offset % self.piece_bytes;
        &self.pieces[offset / self.piece_bytes][within..within + block]
    }

    /// A candidate's data: its whole block, or its fragment's units (which
    /// may continue into the next block, in the next piece).
    fn data_of(&self, candidate: &Candidate) -> std::borrow::Cow<'_, [u8]> {
        if !candidate.location.is_fragment() {
            return std::borrow::Cow::Borrowed(self.block_at(candidate.data_offset_bytes));
        }
        let length = candidate.location.units() as usize * UNIT_BYTES;
        let start = candidate.data_offset_bytes;
        let within = start % self.piece_bytes;
        let piece = &self.pieces[start / self.piece_bytes];
        if within + length <= piece.len() {
            return std::borrow::Cow::Borrowed(&piece[within..within + length]);
        }
        let mut bytes = piece[within..].to_vec();
        let rest = length - bytes.len();
        bytes.extend_from_slice(&self.pieces[start / self.piece_bytes + 1][..rest]);
        std::borrow::Cow::Owned(bytes)
    }

    fn block_at_mut(&mut self, offset: usize) -> &mut [u8] {
        let block = BLOCK_BYTES;
        let within = offset % self.piece_bytes;
        &mut self.pieces[offset / self.piece_bytes][within..within + block]
    }
}

/// A victim in memory as a walk reads it.
struct VictimBlocks<'a>(&'a VictimContents);

impl chain::SegmentBlocks for VictimBlocks<'_> {
    type Error = std::convert::Infallible;

    async fn read_blocks(
        &mut self,
        first_block_in_segment: u32,
        block_count: u32,
    ) -> Result<Vec<u8>, Self::Error> {
        let block = BLOCK_BYTES;
        let mut bytes = Vec::with_capacity(block_count as usize * block);
        for index in 0..block_count {
            let offset = (first_block_in_segment + index) as usize * block;
            bytes.extend_from_slice(self.0.block_at(offset));
        }
        Ok(bytes)
    }
}

/// What one round of a blocked writer's reclaim does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReclaimStep {
    /// The next round's flush frees enough dead segments.
    Flush,
    Checkpoint,
    Clean,
}

/// A data block a victim's summaries describe, and where relocating it
/// takes it (only if a map still points at it: most candidates of a good
/// victim are dead already).
#[derive(Clone, Copy, Debug)]
struct Candidate {
    volume_id: u32,
    logical_block: u64,
    /// Where the block or fragment is now, in the victim.
    location: Location,
    /// Where its data starts in the victim's [`VictimContents`].
    data_offset_bytes: usize,
    /// The checksum its batch's summary gives it.
    checksum: u32,
    /// The stream it goes to (a demotion to `Stream::Capacity` falls back to
    /// the cleaner's flash stream while capacity has no room).
    destination: Stream,
}

/// Where a record's data lies in a victim: its location, where it starts
/// in the victim's contents, and the last block it touches.
struct PlacedData {
    location: Location,
    data_offset_bytes: usize,
    last_block_in_segment: u32,
}

impl PlacedData {
    fn in_victim(first_block: u64, batch: &chain::ChainBatch, placement: Placement) -> PlacedData {
        let (data_index, unit_offset, unit_count) = match placement {
            Placement::WholeBlock { data_index } => (data_index, 0, 0),
            Placement::Fragment {
                data_index,
                unit_offset,
                unit_count,
            } => (data_index, unit_offset, unit_count),
        };
        let block_in_segment = batch.data_block_in_segment(data_index);
        let block = first_block + u64::from(block_in_segment);
        let location = if unit_count == 0 {
            Location::whole_block(block)
        } else {
            Location::fragment(block, unit_offset, unit_count)
        };
        PlacedData {
            location,
            data_offset_bytes: block_in_segment as usize * BLOCK_BYTES
                + unit_offset as usize * UNIT_BYTES,
            last_block_in_segment: block_in_segment + location.block_count() - 1,
        }
    }
}

/// Maps that may hold a block, per writing volume: the volume, its snapshots
/// and its clones ([`crate::volume::VolumeTable::family`]).
type Families = HashMap<u32, Vec<u32>>;

/// Candidates relocated in one hold of the state lock.
struct RelocationChunk<'a> {
    candidates: &'a [Candidate],
    contents: &'a VictimContents,
    victim_tier: Tier,
    /// Per candidate, its new form when it goes to the capacity tier
    /// encoded again (`tiering::cold_compression`); empty when the pool
    /// sets no cold codec.
    recompressed: &'a [Option<Recompressed>],
}

/// The new forms of a chunk's candidates bound for the capacity tier, in
/// the pool's cold codec (none when it is off), encoded before the state
/// lock is taken.
fn recompress_chunk(
    codec: lamina_reduction::Codec,
    candidates: &[Candidate],
    contents: &VictimContents,
) -> Vec<Option<Recompressed>> {
    if codec == lamina_reduction::Codec::Off {
        return Vec::new();
    }
    candidates
        .iter()
        .map(|candidate| {
            (candidate.destination == Stream::Capacity).then(|| {
                recompress(
                    codec,
                    candidate.location,
                    &contents.data_of(candidate),
                    candidate.checksum,
                )
            })?
        })
        .collect()
}

/// Relocates one chunk of candidates, collecting the batches it seals in
/// `sealed`; stops at the first error (the blocks before it stay relocated).
fn relocate_chunk(
    state: &mut State,
    chunk: RelocationChunk,
    families: &mut Families,
    sealed: &mut Vec<Arc<InFlightBatch>>,
) -> Result<(), EngineError> {
    for (index, candidate) in chunk.candidates.iter().enumerate() {
        let family = families
            .entry(candidate.volume_id)
            .or_insert_with(|| state.volumes().family(candidate.volume_id));
        // A full capacity tier keeps cold blocks on flash rather than leave
        // the victim uncleaned.
        let demotion =
            chunk.victim_tier == Tier::Flash && candidate.destination == Stream::Capacity;
        let stream = if demotion && !state.can_demote() {
            Stream::Cleaner
        } else {
            candidate.destination
        };
        let data = chunk.contents.data_of(candidate);
        let recompressed = chunk
            .recompressed
            .get(index)
            .and_then(Option::as_ref)
            .filter(|_| stream == Stream::Capacity);
        let relocation = Relocation {
            family,
            volume_id: candidate.volume_id,
            logical_block: candidate.logical_block,
            from: candidate.location,
            data: recompressed.map_or(&*data, |recompressed| recompressed.units.as_slice()),
            stream,
        };
        let moved = match recompressed {
            Some(recompressed) => {
                state.append_recompressed_relocation(relocation, recompressed.checksum, sealed)?
            }
            None => state.append_relocation(relocation, sealed)?,
        };
        if moved && demotion && stream == Stream::Capacity {
            state.tier_counters_of(candidate.volume_id).demoted_blocks += 1;
        }
    }
    Ok(())
}

/// The segment cleaner, built with an `Arc` of the core whose segments it
/// empties: its locks (`cleaner_lock`, one cleaning pass at a time;
/// `reclaim_lock`, one writer's reclaim at a time), the victims' placement
/// in the state, and the device it reads victims from. Building one is a
/// clone of the `Arc`, like the checkpointer: the paced cleaner, the
/// demoter, evacuation, the flush-and-checkpoint loop and writers that
/// found the pool full build one where they clean.
#[derive(Clone)]
pub(in crate::pool) struct Cleaner {
    core: Arc<Core>,
}

impl Cleaner {
    pub(in crate::pool) fn new(core: &Arc<Core>) -> Self {
        Self { core: core.clone() }
    }

    /// One cleaning pass over at most `segment_count_max` victims chosen by
    /// cost-benefit. Returns how many victims were emptied (they become free
    /// after the next checkpoints).
    pub(in crate::pool) async fn clean(
        &self,
        segment_count_max: usize,
    ) -> Result<usize, EngineError> {
        self.clean_with(segment_count_max, VictimPolicy::CostBenefit)
            .await
    }

    /// Victims cleaned so far and their live blocks, per stream that wrote them.
    pub(in crate::pool) fn cleaner_victim_counts(&self) -> super::placement::VictimCounts {
        self.core.lock().placement().counts()
    }

    /// The placement hints a checkpoint would keep now (tests).
    pub(in crate::pool) fn placement_image(&self) -> crate::log::checkpoint::PlacementImage {
        self.core.lock().placement().image()
    }

    /// Every segment's state and live count, with the free flash segments
    /// and the clients' reserve (tests and diagnostics).
    pub(in crate::pool) fn segment_table(&self) -> SegmentTable {
        let state = self.core.lock();
        SegmentTable {
            segments: state.space().segments().to_vec(),
            free_segments: state.space().free_flash_segments().collect(),
            client_reserve_segment_count: state.space().reserve_for(Allocation::Client),
            cleaner_reserve_floor_segment_count: state.space().reserve_for(Allocation::Cleaner),
            covered_by_every_checkpoint: state.space().covered_by_every_checkpoint(),
            durable_through: state.writer().durable_through(),
        }
    }

    /// The device block `logical_block` of `volume_id` is mapped to, if any
    /// (diagnostics).
    pub(in crate::pool) fn physical_block_of(
        &self,
        volume_id: u32,
        logical_block: u64,
    ) -> Option<u64> {
        let state = self.core.lock();
        let mapping = state.volumes().get(volume_id)?.map.get(logical_block)?;
        Some(mapping.location.block())
    }

    /// The segments the cleaner would take next, best first (tests).
    pub(in crate::pool) fn victim_order(&self, count: usize) -> Vec<u32> {
        pick_victims(&self.core.lock(), count, VictimPolicy::CostBenefit)
    }

    async fn clean_with(
        &self,
        segment_count_max: usize,
        policy: VictimPolicy,
    ) -> Result<usize, EngineError> {
        let _guard = self.core.cleaner_lock().lock().await;
        // Capacity victims are moved within capacity: not while its writes
        // are suspended (decision 0032).
        if self.core.geometry().has_capacity_tier() && !self.core.capacity_writes_suspended() {
            self.clean_capacity_if_short().await?;
        }
        let victims = pick_victims(&self.core.lock(), segment_count_max, policy);
        let mut emptied = 0;
        for victim in victims {
            match self.clean_victim(victim).await {
                Ok(true) => emptied += 1,
                Ok(false) => {}
                // The cleaner's reserve is used up: what was emptied so far must
                // be checkpointed free before cleaning can go on.
                Err(EngineError::Io(IoError::NoSpace)) => break,
                Err(error) => return Err(error),
            }
        }
        Ok(emptied)
    }

    /// Cleans capacity victims while free capacity space is short, so that
    /// demotions keep finding room. The caller holds the cleaner lock.
    async fn clean_capacity_if_short(&self) -> Result<(), EngineError> {
        for _ in 0..CAPACITY_VICTIMS_PER_PASS_MAX {
            let victim = {
                let state = self.core.lock();
                let dead = state.space().dead_segment_count(Tier::Capacity);
                if state.space().free_capacity_segment_count() + dead
                    > state.space().capacity_checkpoint_reserve_segment_count()
                        + CAPACITY_RESERVE_SEGMENT_COUNT
                        + CAPACITY_SHORT_SEGMENT_COUNT
                {
                    return Ok(());
                }
                match pick_victims_in(&state, Tier::Capacity, 1, VictimPolicy::CostBenefit).first()
                {
                    Some(victim) => *victim,
                    None => return Ok(()),
                }
            };
            match self.clean_victim(victim).await {
                Ok(_) => {}
                Err(EngineError::Io(IoError::NoSpace)) => return Ok(()),
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Cleans a segment the evacuation (`repair/evacuation.rs`) moves off a lost
    /// device; the caller holds the cleaner lock. Returns whether it is now
    /// empty.
    pub(in crate::pool) async fn clean_degraded_victim(
        &self,
        victim: u32,
    ) -> Result<bool, EngineError> {
        self.clean_victim(victim).await
    }

    /// Cleans one victim of either tier. Returns whether it is now empty.
    async fn clean_victim(&self, victim: u32) -> Result<bool, EngineError> {
        let tier = self.core.geometry().tier_of_segment(victim);
        self.core.lock().start_cleaning(victim, tier);
        let result = self.clean_segment(victim).await;
        self.core.lock().finish_cleaning();
        result
    }

    /// Reads victim segment `segment_index`. A flash victim is read in pieces
    /// of at most `cleaner_read_bytes_max` with at most
    /// `cleaner_in_flight_reads_max` in flight, so that a client read never
    /// queues behind more than that much cleaner reading. A capacity victim
    /// (a disk, where a client request between two pieces would cost a seek
    /// each) is read in one request.
    async fn read_victim(&self, segment_index: u32) -> Result<VictimContents, EngineError> {
        let geometry = self.core.geometry();
        let limits = self.core.limits();
        let offset = geometry.segment_first_block(segment_index) * BLOCK_SIZE_BYTES;
        // Only the blocks the segment's layout uses: on an array narrowed
        // after a loss, the rest of its address range holds nothing.
        let size_blocks = self.core.shapes().shape(segment_index).size_blocks;
        let length_bytes = to_usize(u64::from(size_blocks) * BLOCK_SIZE_BYTES);
        let block = BLOCK_BYTES;
        let piece_bytes_max = match geometry.tier_of_segment(segment_index) {
            // A limit past the address space reads whole segments, as
            // any limit above the segment size does.
            Tier::Flash => usize::try_from(limits.cleaner_read_bytes_max).unwrap_or(usize::MAX),
            Tier::Capacity => length_bytes,
        };
        // At least one block: `PoolLimits::validate` refuses less.
        let piece_bytes = piece_bytes_max / block * block;
        let device = self.core.device();
        let pieces: Vec<AlignedBuffer> =
            futures::stream::iter((0..length_bytes).step_by(piece_bytes).map(|start| {
                device.read(offset + start as u64, piece_bytes.min(length_bytes - start))
            }))
            .buffered(limits.cleaner_in_flight_reads_max)
            .try_collect()
            .await?;
        Ok(VictimContents {
            pieces,
            piece_bytes,
        })
    }

    /// A task that hands the sealed batches it receives to `spawn_writes`,
    /// at most `cleaner_in_flight_batches_max` of them at the device at once,
    /// in the order received; it ends once the sender is dropped and all are
    /// handed over. Being a task of its own, it writes every batch it received
    /// even if the cleaner that sent them goes away.
    fn spawn_relocation_writer(
        &self,
    ) -> (
        tokio::sync::mpsc::UnboundedSender<Arc<InFlightBatch>>,
        tokio::task::JoinHandle<()>,
    ) {
        let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel::<Arc<InFlightBatch>>();
        let core = self.core.clone();
        let writer = tokio::spawn(async move {
            let limit = core.limits().cleaner_in_flight_batches_max;
            let mut handed_over: Vec<u64> = Vec::new();
            while let Some(batch) = receiver.recv().await {
                core.wait_for(|state| {
                    handed_over
                        .iter()
                        .filter(|sequence| state.writer().is_in_flight(**sequence))
                        .count()
                        < limit
                        || state.writer().failed().is_some()
                })
                .await;
                {
                    let state = core.lock();
                    handed_over.retain(|sequence| state.writer().is_in_flight(*sequence));
                }
                handed_over.push(batch.sequence);
                core.spawn_writes(vec![batch]);
            }
        });
        (sender, writer)
    }

    /// Moves the live blocks out of one segment. Returns whether it is now empty.
    /// In a two-tier pool, blocks of a flash victim that heat keeps go to the
    /// cleaner's flash stream and the others are demoted to capacity (while
    /// capacity has room); blocks of a capacity victim stay on capacity.
    async fn clean_segment(&self, segment_index: u32) -> Result<bool, EngineError> {
        if !self.victim_written(segment_index).await {
            return Ok(false);
        }
        let mut contents = self.read_victim(segment_index).await?;
        let chain = self.walk_victim(segment_index, &contents).await;
        let mut candidates = self.list_candidates(segment_index, &chain);
        self.repair_damaged_candidates(&mut contents, &candidates)
            .await;
        self.choose_destinations(segment_index, &mut candidates);
        self.relocate(segment_index, &contents, &candidates).await?;
        Ok(self.finish_victim(segment_index, &chain.damaged))
    }

    /// Waits until every batch of the victim is written, so that reading it
    /// finds them all. Returns whether it is still a sealed segment (one that
    /// died meanwhile needs no cleaning).
    async fn victim_written(&self, segment_index: u32) -> bool {
        let last_batch = self
            .core
            .lock()
            .space()
            .segment(segment_index)
            .last_batch_sequence;
        self.core
            .wait_for(|state| {
                state.writer().written_through() >= last_batch || state.writer().failed().is_some()
            })
            .await;
        self.core.lock().space().segment(segment_index).state == SegmentState::Sealed
    }

    /// Walks the batch chain of a victim read into memory, counting the
    /// summaries that had to be read from their copies.
    async fn walk_victim(&self, segment_index: u32, contents: &VictimContents) -> chain::Chain {
        let shape = self.core.shapes().shape(segment_index);
        let chain = match chain::walk(&mut VictimBlocks(contents), shape, 0, None).await {
            Ok(chain) => chain,
            Err(never) => match never {},
        };
        let repaired = chain.batches.iter().filter(|batch| batch.from_copy).count();
        if repaired > 0 {
            tracing::warn!(
                segment_index,
                summaries = repaired,
                "damaged batch summaries in a cleaning victim; read from their copies"
            );
            self.core.integrity().summaries_repaired(repaired as u64);
        }
        chain
    }

    /// Every data block the victim's batch chain describes, in log order,
    /// each bound for the victim's own tier until destinations are chosen.
    /// Most may be dead already: relocating one moves it only if a map still
    /// points at it.
    fn list_candidates(&self, segment_index: u32, chain: &chain::Chain) -> Vec<Candidate> {
        let geometry = self.core.geometry();
        let first_block = geometry.segment_first_block(segment_index);
        let segment_size_blocks = self.core.shapes().shape(segment_index).size_blocks;
        let destination = match geometry.tier_of_segment(segment_index) {
            Tier::Flash => Stream::Cleaner,
            Tier::Capacity => Stream::Capacity,
        };
        let mut candidates = Vec::new();
        for batch in &chain.batches {
            let records = &batch.summary.records;
            let (placements, _) = batch.summary.placements();
            for (record_index, placement) in placements {
                let record = &records[record_index];
                let (volume_id, logical_block) = record.data_target().expect("a placed record");
                let checksum = record.data_checksum().expect("a placed record");
                let placed = PlacedData::in_victim(first_block, batch, placement);
                assert!(
                    placed.last_block_in_segment < segment_size_blocks,
                    "segment {segment_index}: data block {} beyond the segment",
                    placed.last_block_in_segment
                );
                let PlacedData {
                    location,
                    data_offset_bytes,
                    ..
                } = placed;
                candidates.push(Candidate {
                    volume_id,
                    logical_block,
                    location,
                    data_offset_bytes,
                    checksum,
                    destination,
                });
            }
        }
        candidates
    }

    /// Rebuilds, from the device's redundancy, the live blocks and fragments
    /// of the victim that fail their checksum (silent damage), before they
    /// move: data copied as it is would carry the damage to its new home,
    /// under fresh parity that could no longer repair it. One that cannot be
    /// rebuilt moves as it is (reading it stays an error, as it was).
    async fn repair_damaged_candidates(
        &self,
        contents: &mut VictimContents,
        candidates: &[Candidate],
    ) {
        let damaged: Vec<&Candidate> = candidates
            .iter()
            .filter(|candidate| crc32c_of_data(contents, candidate) != candidate.checksum)
            .collect();
        if damaged.is_empty() {
            return;
        }
        // Dead blocks (most candidates, and any a crash tore) stay as they are.
        let live: Vec<&Candidate> = {
            let state = self.core.lock();
            damaged
                .into_iter()
                .filter(|candidate| {
                    let family = state.volumes().family(candidate.volume_id);
                    state.volumes().holder_checksum(
                        &family,
                        candidate.logical_block,
                        candidate.location,
                    ) == Some(candidate.checksum)
                })
                .collect()
        };
        for candidate in live {
            if candidate.location.is_fragment() {
                self.repair_damaged_fragment(contents, candidate).await;
                continue;
            }
            if let Some(good) = self
                .core
                .recover_block(
                    candidate.location.whole_block_number(),
                    candidate.logical_block,
                    candidate.checksum,
                )
                .await
            {
                contents
                    .block_at_mut(candidate.data_offset_bytes)
                    .copy_from_slice(&good);
            }
        }
    }

    /// Rebuilds a live fragment of the victim that fails its checksum
    /// (`fragment_read::recover_fragment_blocks`) and puts its units, and
    /// only them, back in the victim's contents: the rest of the rebuilt
    /// blocks is vouched for by no check of this fragment's.
    async fn repair_damaged_fragment(&self, contents: &mut VictimContents, candidate: &Candidate) {
        let location = candidate.location;
        let units = location.byte_range();
        let first_block_offset = candidate.data_offset_bytes - units.start;
        let mut blocks = Vec::with_capacity(location.block_count() as usize * BLOCK_BYTES);
        for index in 0..location.block_count() as usize {
            blocks.extend_from_slice(contents.block_at(first_block_offset + index * BLOCK_BYTES));
        }
        let device = &**self.core.device();
        let recovery = fragment_read::recover_fragment_blocks(
            device,
            location,
            candidate.checksum,
            &mut blocks,
        )
        .await;
        if recovery == fragment_read::FragmentRecovery::Failed {
            return;
        }
        for (index, block) in (location.block()..)
            .take(location.block_count() as usize)
            .enumerate()
        {
            let part = location
                .part_in_block(block)
                .expect("a fragment touches each of its blocks");
            let rebuilt = &blocks[index * BLOCK_BYTES..(index + 1) * BLOCK_BYTES];
            contents.block_at_mut(first_block_offset + index * BLOCK_BYTES)[part.clone()]
                .copy_from_slice(&rebuilt[part]);
        }
    }

    /// Where each block of a flash victim goes (heat decides, in a two-tier
    /// pool; a capacity victim's blocks stay on capacity), and the order
    /// they go in: kept blocks first, then demotions, so that each stream's
    /// batches fill up instead of alternating.
    fn choose_destinations(&self, segment_index: u32, candidates: &mut [Candidate]) {
        if self.core.geometry().tier_of_segment(segment_index) == Tier::Capacity {
            return;
        }
        {
            let mut state = self.core.lock();
            // Pins are a preference: when writers are about to find flash
            // full, pinned blocks leave too rather than fail the writes.
            let flash_critical = state.space().free_flash_segment_count()
                <= state.space().reserve_for(Allocation::Client);
            // The fragments packed in a block share its heat (decision
            // 0074): the block is asked once per volume (whose policy
            // counts), and its fragments go where it says, rather than each
            // taking a step off its counter.
            let mut asked: Option<(u64, u32, Stream)> = None;
            for candidate in candidates.iter_mut() {
                let block = candidate.location.block();
                candidate.destination = match asked {
                    Some((asked_block, asked_volume_id, destination))
                        if candidate.location.is_fragment()
                            && asked_block == block
                            && asked_volume_id == candidate.volume_id =>
                    {
                        destination
                    }
                    _ => state.flash_victim_destination(candidate.volume_id, block, flash_critical),
                };
                asked = Some((block, candidate.volume_id, candidate.destination));
            }
        }
        // Stable: blocks keep their log order within each stream.
        candidates.sort_by_key(|candidate| candidate.destination == Stream::Capacity);
    }

    /// Relocates the candidates in chunks of [`RELOCATION_CHUNK_BLOCKS`], one
    /// hold of the state lock each, handing the batches they seal to the
    /// relocation writer; returns once it has handed them all to the device.
    async fn relocate(
        &self,
        segment_index: u32,
        contents: &VictimContents,
        candidates: &[Candidate],
    ) -> Result<(), EngineError> {
        let victim_tier = self.core.geometry().tier_of_segment(segment_index);
        // Maps that may hold a block, per writing volume: the volume, its
        // snapshots and its clones (computed once per victim).
        let mut families = Families::default();
        // The batches the relocations seal go to a writer that keeps few of
        // them at the device; relocating goes on meanwhile, so that client
        // writes arriving between two steps seldom split a relocation batch
        // (waiting here instead made batches smaller: more summary blocks per
        // segment, and more cleaning, decision 0009).
        let (relocated_batches, writer) = self.spawn_relocation_writer();
        for chunk in candidates.chunks(RELOCATION_CHUNK_BLOCKS) {
            let in_flight_limit = self.core.limits().in_flight_batches_max;
            self.core
                .wait_for(|state| {
                    state.writer().in_flight_count() < in_flight_limit
                        || state.writer().failed().is_some()
                })
                .await;
            let recompressed =
                recompress_chunk(self.core.limits().cold_compression, chunk, contents);
            let mut sealed = Vec::new();
            let result = relocate_chunk(
                &mut self.core.lock(),
                RelocationChunk {
                    candidates: chunk,
                    contents,
                    victim_tier,
                    recompressed: &recompressed,
                },
                &mut families,
                &mut sealed,
            );
            for batch in sealed {
                // The writer runs until the sender is dropped; should it be
                // gone all the same, the batch is written directly, never lost.
                if let Err(unsent) = relocated_batches.send(batch) {
                    self.core.spawn_writes(vec![unsent.0]);
                }
            }
            result?;
        }
        // The next victim starts once this one's batches are all handed to
        // the device (the last few still being written), so that the
        // cleaner's writes never pile up there.
        drop(relocated_batches);
        writer.await.expect("relocation writer task");
        Ok(())
    }

    /// After relocating: a victim with live blocks left holds blocks its
    /// summaries do not describe, and is set aside. Returns whether it is
    /// empty.
    fn finish_victim(&self, segment_index: u32, damaged: &[chain::DamagedRange]) -> bool {
        let segment = *self.core.lock().space().segment(segment_index);
        if segment.live_blocks() > 0 {
            self.set_aside(segment_index, damaged);
            return false;
        }
        // A sealed segment whose last block dies becomes dead at once.
        assert_ne!(
            segment.state,
            SegmentState::Sealed,
            "victim {segment_index} reported empty is still sealed"
        );
        true
    }

    /// Takes a segment whose summaries do not describe every live block out
    /// of the victims for as long as the pool is open (cleaning it again would
    /// find the same), logged once. Its live blocks are still served, and it
    /// is freed like any segment if they all die.
    fn set_aside(&self, segment_index: u32, damaged: &[chain::DamagedRange]) {
        let live_blocks = {
            let mut state = self.core.lock();
            let segment = *state.space().segment(segment_index);
            if segment.set_aside || segment.state != SegmentState::Sealed {
                return;
            }
            state.set_segment_aside(segment_index);
            segment.live_blocks()
        };
        tracing::error!(
            segment_index,
            live_blocks,
            ?damaged,
            "segment set aside: its batch summaries do not describe every live block \
             (both copies of a summary damaged); it will not be cleaned"
        );
    }

    /// Frees space for a write that found no free segment: waits for anyone else
    /// already doing it, then flushes, cleans and checkpoints as needed.
    /// Returns whether a client may now allocate a segment. Each call is
    /// counted with the time it took (`pool status`, "writes waited for
    /// space").
    pub(in crate::pool) async fn reclaim(&self) -> Result<bool, EngineError> {
        let started = tokio::time::Instant::now();
        let result = self.reclaim_untimed().await;
        let waited = started.elapsed();
        self.core.space_waits().record(waited);
        if waited >= std::time::Duration::from_millis(SPACE_WAIT_LOGGED_MS) {
            let state = self.core.lock();
            tracing::debug!(
                waited_ms = waited.as_millis(),
                free_segments = state.space().free_flash_segment_count(),
                client_reserve_segments = state.space().reserve_for(Allocation::Client),
                dead_segments = dead_segment_count(&state),
                "a write waited for space"
            );
        }
        result
    }

    async fn reclaim_untimed(&self) -> Result<bool, EngineError> {
        let _guard = self.core.reclaim_lock().lock().await;
        if client_has_room(&self.core.lock()) {
            return Ok(true);
        }
        // Each round first flushes: a dead segment whose batches both kept
        // checkpoints cover is free once its death is durable (decision 0006),
        // which is what cleaning old victims gives. Dead segments written since
        // the older checkpoint need checkpoints: one is taken when they would
        // be enough, or when the last pass emptied nothing (the cleaner's
        // reserve may be spent); otherwise a cleaning pass runs.
        // Each round either frees what earlier rounds emptied or empties a
        // victim (which gains at least 3% of a segment), so a pool with little
        // slack may need many rounds; they stop when neither happens.
        let rounds_max = RECLAIM_ROUNDS_MAX.max(to_usize(self.core.geometry().segment_count));
        let mut progress = ReclaimProgress {
            last_pass_emptied: true,
            fruitless_round: false,
        };
        for _ in 0..rounds_max {
            self.core.flush_all().await?;
            let Some(round) = reclaim_round(&mut self.core.lock(), &progress) else {
                return Ok(true);
            };
            match round.step {
                ReclaimStep::Flush => {}
                ReclaimStep::Checkpoint => {
                    let started = tokio::time::Instant::now();
                    Checkpointer::new(&self.core).checkpoint().await?;
                    tracing::debug!(
                        milliseconds = started.elapsed().as_millis(),
                        "a waiting write's reclaim took a checkpoint"
                    );
                    progress.last_pass_emptied = true;
                }
                ReclaimStep::Clean => {
                    if !self
                        .reclaim_by_cleaning(round.dead_sealed, &mut progress)
                        .await?
                    {
                        break;
                    }
                }
            }
        }
        Ok(client_has_room(&self.core.lock()))
    }

    /// A reclaim round's cleaning pass. Returns whether more rounds may help.
    async fn reclaim_by_cleaning(
        &self,
        dead_sealed: usize,
        progress: &mut ReclaimProgress,
    ) -> Result<bool, EngineError> {
        let emptied = self
            .clean_with(CLEAN_PASS_SEGMENTS_MAX, VictimPolicy::CostBenefit)
            .await?;
        progress.last_pass_emptied = emptied > 0;
        // Writers that still had room in the client head may have emptied
        // segments meanwhile: those need only a flush or checkpoints too.
        // A round that found nothing may have raced with the paced cleaner
        // (which held the cleaner lock and moved the victims this pass
        // would have taken): one more round after a checkpoint, which
        // frees whatever that left waiting, before giving up.
        if emptied == 0 && dead_sealed == 0 && dead_segment_count(&self.core.lock()) == 0 {
            if progress.fruitless_round {
                return Ok(false);
            }
            progress.fruitless_round = true;
            Checkpointer::new(&self.core).checkpoint().await?;
        } else {
            progress.fruitless_round = false;
        }
        Ok(true)
    }

    /// Background cleaning: frees dead segments whose deaths the background
    /// flush made durable; then, only when the paced cleaner is off and free
    /// space is under the low watermark, one pass, a flush that frees the
    /// victims both checkpoints cover, and the checkpoints that free the
    /// others if space is still short.
    pub(in crate::pool) async fn clean_in_background(&self) -> Result<(), EngineError> {
        // A two-tier pool's flash is kept free by the demoter (`tiering`),
        // with its own target; this watermark (a tenth of flash, at least 16
        // segments) would turn the flash FIFO over far too fast.
        if self.core.geometry().has_capacity_tier() {
            return Ok(());
        }
        let below_watermark = |state: &State| {
            let low_watermark = state.space().reserve_for(Allocation::Client)
                + (to_usize(state.geometry().flash_segment_count) / 10)
                    .max(CLEAN_PASS_SEGMENTS_MAX);
            state.space().free_flash_segment_count() < low_watermark
        };
        let pass_bytes = {
            let mut state = self.core.lock();
            state.free_reusable_dead_segments();
            // The paced cleaner cleans in step with client writes; a pass here
            // would clean up to 16 victims in one burst, which queues at the
            // device ahead of client reads and holds the space its relocations
            // take until its flush, so that writers ran out of free segments
            // (decision 0009).
            if self
                .core
                .limits()
                .cleaner_relocation_blocks_per_client_block_max
                > 0.0
                || !below_watermark(&state)
            {
                return Ok(());
            }
            next_victims_live_bytes(&state, CLEAN_PASS_SEGMENTS_MAX)
        };
        // Under the low watermark, not yet short: writers that find no free
        // segment clean for themselves, outside the budget. Not waiting: the
        // flush-and-checkpoint loop runs this, and its checkpoints must not
        // wait for the budget; the next tick tries again.
        if !self
            .core
            .budget()
            .try_acquire(BackgroundWork::Cleaner, pass_bytes)
        {
            return Ok(());
        }
        if self.clean(CLEAN_PASS_SEGMENTS_MAX).await? > 0 {
            self.core.flush_all().await?;
            for _ in 0..2 {
                let waiting = {
                    let mut state = self.core.lock();
                    state.free_reusable_dead_segments();
                    below_watermark(&state) && dead_segment_count(&state) > 0
                };
                if !waiting {
                    break;
                }
                Checkpointer::new(&self.core).checkpoint().await?;
            }
        }
        Ok(())
    }
}

/// Whether a client may allocate a flash segment without touching the
/// reserves.
fn client_has_room(state: &State) -> bool {
    state.space().free_flash_segment_count() > state.space().reserve_for(Allocation::Client)
}

/// What a blocked writer's reclaim has seen in its rounds so far.
struct ReclaimProgress {
    /// Whether the latest cleaning pass emptied a victim (true before any).
    last_pass_emptied: bool,
    /// Whether the latest round found nothing to free or empty.
    fruitless_round: bool,
}

/// What one reclaim round found after its flush.
struct ReclaimRound {
    /// Dead flash segments whose death a sealed batch covers.
    dead_sealed: usize,
    step: ReclaimStep,
}

/// Frees the dead segments the round's flush made reusable, and decides
/// what the round does next; `None` when a client has room now.
fn reclaim_round(state: &mut State, progress: &ReclaimProgress) -> Option<ReclaimRound> {
    state.free_reusable_dead_segments();
    if client_has_room(state) {
        return None;
    }
    // Dead segments whose death a sealed batch covers (one that died in an
    // open batch waits for it to be sealed, which cleaning makes): those
    // that other writers emptied since this round's flush need only the
    // next round's flush; the others need checkpoints. (Counting both as
    // needing a checkpoint took about 10 checkpoints a second under 16
    // concurrent writers, where none was needed.)
    let dead = state.sealed_dead_flash_segment_counts();
    let free = state.space().free_flash_segment_count();
    let reserve = state.space().reserve_for(Allocation::Client);
    // Enough is dead already: cleaning now would only spend the free
    // segments the next flush or checkpoints are about to add to.
    let step = if dead.awaiting_flush > 0 && free + dead.awaiting_flush > reserve {
        ReclaimStep::Flush
    } else if dead.awaiting_checkpoints > 0
        && (free + dead.total() > reserve || !progress.last_pass_emptied)
    {
        ReclaimStep::Checkpoint
    } else {
        ReclaimStep::Clean
    };
    Some(ReclaimRound {
        dead_sealed: dead.total(),
        step,
    })
}

/// The crc32c of what the victim holds where `candidate`'s data lies: its
/// whole block or its fragment's units.
fn crc32c_of_data(contents: &VictimContents, candidate: &Candidate) -> u32 {
    if candidate.location.is_fragment() {
        crc32c::crc32c(&contents.data_of(candidate))
    } else {
        block_checksum(contents.block_at(candidate.data_offset_bytes))
    }
}
