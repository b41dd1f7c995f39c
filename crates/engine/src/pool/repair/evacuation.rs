//! Restoring redundancy without a new device (issue 19, decision 0024): when
//! a device beneath the pool is lost (or being removed) and enough others
//! remain, every segment with a column on it is *degraded*. Rebuilding is
//! cleaning: the live blocks of each degraded segment are moved, through the
//! cleaner, into segments laid out over the devices in use (an array's rows
//! one column narrower), and the degraded segment is freed. Only live data
//! moves, checked against its checksums as the cleaner always checks it, so
//! the time follows the data stored. Free segments still laid out over the
//! lost device are laid out again first, so that nothing new is written with
//! less redundancy. It is paced by the shared background budget at the
//! rebuild's weight, shows its progress as the rebuild's, and needs no
//! record of its own to resume: after a restart the degraded segments are
//! still degraded, and the next pass takes them.
//!
//! When the pool has less redundancy than it was made with and no rebuild
//! can run (the devices left lack the room for the data at their narrower
//! width, they are too few to lay a segment out with full redundancy, or
//! `rebuild_automatic` is off), [`Pool::rebuild_blocked`] says why, so that
//! status, the log, `/metrics` and `device rebuild` can say it too.
//!
//! A **rebalance** (after a device is added to an array, `device add
//! --rebalance`) is the same movement with a wider choice of victims: every
//! segment not laid out over the devices in use now (narrower than the
//! array has become), so that existing data spreads over the new device and
//! each moved segment's space comes back at the new width.
//!
//! An evacuation is an [`Evacuation`], built with the pool it moves: the
//! core whose segments it reads and lays out (which it also flushes, and
//! asks whether a replacement is pending), the cleaner that moves each
//! victim, and the checkpointer that writes the checkpoints freeing what it
//! emptied. The front's `evacuate`, `rebalance`, `evacuation_need` and
//! `rebuild_blocked` delegate to it; a rebuild starts one on the core.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::BLOCK_SIZE_BYTES;
use crate::error::{EngineError, IoError};

use crate::log::geometry::Tier;
use crate::pool::budget::BackgroundWork;
use crate::pool::checkpoint::Checkpointer;
use crate::pool::cleaner::Cleaner;
use crate::pool::core::Core;
use crate::pool::repair::rebuild::progress::{RebuildKind, RebuildState, RebuildStatus};
use crate::pool::space::segment_shapes::SegmentLayout;
use crate::pool::space::{SegmentState, SpaceAllocator};

/// Passes in a row that move nothing before an evacuation gives up: a pass
/// moves every segment degraded when it starts; data written meanwhile into
/// segments laid out before the loss (when none other was free) is what the
/// next pass takes, and a pass that found no free space to move into
/// (clients writing faster than the cleaner frees) is followed by another
/// once the flush and checkpoints have freed what it emptied. Passes that
/// move data do not count: under steady writes the evacuation goes on as
/// long as it gains.
pub const EVACUATION_PASSES_WITHOUT_PROGRESS_MAX: usize = 8;

/// Free segments laid out again in one device update at most (one zone
/// table write on an array; 256 segments of the default 4 MiB are 1 GiB,
/// their table entries a fraction of one table block).
pub const FREE_SEGMENTS_LAID_OUT_PER_BATCH_MAX: usize = 256;

/// How long a pass that found no free space waits before the next, so that
/// the cleaner (which the evacuation's own cleaning holds off) frees some.
pub const EVACUATION_NO_SPACE_WAIT_MS: u64 = 200;

/// How often a replacement's rebuild looks whether the rebuild onto spare
/// space it takes over from has stopped.
pub const EVACUATION_YIELD_POLL_MS: u64 = 10;

/// Which segments an evacuation moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvacuationGoal {
    /// Those with a column on a device out of use (the rebuild).
    Redundancy,
    /// Those not laid out over exactly the devices in use: the degraded
    /// ones and those narrower than the array now is (the rebalance).
    Width,
}

impl EvacuationGoal {
    fn moves(self, layout: &SegmentLayout) -> bool {
        match self {
            Self::Redundancy => layout.degraded,
            Self::Width => layout.degraded || !layout.current,
        }
    }

    fn kind(self) -> RebuildKind {
        match self {
            Self::Redundancy => RebuildKind::DistributedSpare,
            Self::Width => RebuildKind::Rebalance,
        }
    }
}

/// What an evacuation would move now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EvacuationNeed {
    /// Segments in use (data or checkpoint bodies) that have a column on a
    /// device out of use.
    pub degraded_segment_count: usize,
    /// Their live blocks, in bytes.
    pub live_bytes: u64,
    /// Free segments to lay out again before they are written.
    pub free_segments_to_lay_out: usize,
    /// Bytes the free segments hold once laid out over the devices in use,
    /// less the reserves the cleaner and checkpoints keep.
    pub free_bytes: u64,
}

impl EvacuationNeed {
    pub fn is_empty(&self) -> bool {
        self.degraded_segment_count == 0 && self.free_segments_to_lay_out == 0
    }
}

/// Why no rebuild restores the redundancy the pool was made with, although
/// segments in use have less ([`Pool::rebuild_blocked`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RebuildBlocked {
    /// The devices left lack the room for the degraded segments' live data
    /// laid out over them alone (rows one column narrower hold less).
    NoRoom(EvacuationNeed),
    /// The devices in use are fewer than the redundancy needs: a segment
    /// laid out over them alone would have less, so only a new device in
    /// the lost one's place (`device replace`) restores it.
    TooFewDevices { degraded_segment_count: usize },
    /// `rebuild_automatic` is off: `lamina device rebuild` starts it.
    AutomaticOff(EvacuationNeed),
}

impl std::fmt::Display for RebuildBlocked {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoRoom(need) => write!(
                formatter,
                "not enough free space on the devices left to restore full redundancy \
                 (need {} to move, have {}): free space (delete volumes or snapshots, trim) \
                 or `lamina device replace` the lost device",
                mebibytes(need.live_bytes),
                mebibytes(need.free_bytes)
            ),
            Self::TooFewDevices {
                degraded_segment_count,
            } => write!(
                formatter,
                "too few devices left to lay {degraded_segment_count} degraded segments out \
                 with full redundancy: `lamina device replace` the lost device"
            ),
            Self::AutomaticOff(need) => write!(
                formatter,
                "rebuild_automatic is off ({} to move onto the devices left): \
                 run `lamina device rebuild`",
                mebibytes(need.live_bytes)
            ),
        }
    }
}

/// `bytes` in MiB with one decimal, for messages.
fn mebibytes(bytes: u64) -> String {
    const BYTES_PER_MEBIBYTE: f64 = 1_048_576.0;
    #[allow(clippy::cast_precision_loss)]
    let value = bytes as f64 / BYTES_PER_MEBIBYTE;
    format!("{value:.1} MiB")
}

/// An evacuation (or a rebalance) of the pool, built with the pool it
/// moves: the core whose segments it reads and lays out again (and flushes,
/// and whose rebuild progress it shares), the cleaner that moves each
/// victim and the checkpointer that frees what it emptied.
pub(in crate::pool) struct Evacuation<'a> {
    core: &'a Arc<Core>,
    cleaner: Cleaner,
    checkpointer: Checkpointer,
}

impl<'a> Evacuation<'a> {
    pub(in crate::pool) fn new(core: &'a Arc<Core>) -> Self {
        Self {
            core,
            cleaner: Cleaner::new(core),
            checkpointer: Checkpointer::new(core),
        }
    }

    /// What restoring redundancy by moving data would take now; nothing
    /// while the devices in use are too few to lay segments out without the
    /// lost one.
    pub(in crate::pool) fn need(&self) -> EvacuationNeed {
        self.need_for(EvacuationGoal::Redundancy)
    }

    /// Why no rebuild restores the pool's redundancy, when segments in use
    /// have less than the pool was made with and none runs, is pending or
    /// will start by itself; `None` otherwise (nothing is degraded, or a
    /// rebuild runs or starts at the next check).
    pub(in crate::pool) fn blocked(&self) -> Option<RebuildBlocked> {
        if self.core.rebuild().status().state == RebuildState::Rebuilding
            || self.core.device().rebuild_pending()
        {
            return None;
        }
        if !self.core.shapes().new_segments_redundant() {
            let degraded_segment_count = self.degraded_segments_in_use();
            return (degraded_segment_count > 0).then_some(RebuildBlocked::TooFewDevices {
                degraded_segment_count,
            });
        }
        let need = self.need();
        if need.is_empty() {
            return None;
        }
        if need.live_bytes > need.free_bytes {
            return Some(RebuildBlocked::NoRoom(need));
        }
        (!self.core.limits().rebuild_automatic).then_some(RebuildBlocked::AutomaticOff(need))
    }

    /// Segments not free with a column on a device out of use.
    fn degraded_segments_in_use(&self) -> usize {
        let shapes = self.core.shapes();
        let state = self.core.lock();
        (0..state.space().segments().len())
            .filter(|index| {
                let index = u32::try_from(*index).expect("segment indexes fit in u32");
                state.space().segment(index).state != SegmentState::Free
                    && shapes.layout(index).degraded
            })
            .count()
    }

    /// What moving the segments `goal` names would take now.
    pub(in crate::pool) fn need_for(&self, goal: EvacuationGoal) -> EvacuationNeed {
        let shapes = self.core.shapes();
        if !shapes.new_segments_redundant() {
            return EvacuationNeed::default();
        }
        let state = self.core.lock();
        let mut need = EvacuationNeed::default();
        for (index, segment) in state.space().segments().iter().enumerate() {
            let index = u32::try_from(index).expect("segment indexes fit in u32");
            // Checkpoint bodies too: they hold no live blocks, but move
            // only when an evacuation writes two checkpoints (an idle pool
            // writes none), and the pool needs them at its next open.
            let in_use = matches!(
                segment.state,
                SegmentState::Sealed | SegmentState::Open | SegmentState::Checkpoint { .. }
            );
            let moves = in_use && goal.moves(&shapes.layout(index));
            if moves {
                need.degraded_segment_count += 1;
                if !matches!(segment.state, SegmentState::Checkpoint { .. }) {
                    need.live_bytes += u64::from(segment.live_blocks()) * BLOCK_SIZE_BYTES;
                }
            }
        }
        let reserve_segment_count = state.space().cleaner_reserve_segment_count()
            + state
                .space()
                .reserve_for(crate::pool::space::Allocation::Client);
        need.free_segments_to_lay_out = state
            .space()
            .free_segments()
            .filter(|index| shapes.needs_layout(*index))
            .count();
        need.free_bytes = Self::room_for_moved_data(&state, goal, reserve_segment_count);
        need
    }

    /// The room the data of degraded segments can move into: every segment
    /// at the size one opened now holds (the degraded ones too, reused once
    /// emptied), less the reserves and the live data of the segments that
    /// are not degraded (the cleaner makes room of whatever else is dead or
    /// free).
    fn room_for_moved_data(
        state: &crate::pool::core::state::State,
        goal: EvacuationGoal,
        reserve_segment_count: usize,
    ) -> u64 {
        let shapes = state.shapes();
        let mut capacity_bytes = 0_u64;
        let mut live_elsewhere_bytes = 0_u64;
        for (index, segment) in state.space().segments().iter().enumerate() {
            let index = u32::try_from(index).expect("segment indexes fit in u32");
            capacity_bytes += shapes.new_size_bytes(index);
            if !goal.moves(&shapes.layout(index)) {
                live_elsewhere_bytes += u64::from(segment.live_blocks()) * BLOCK_SIZE_BYTES;
            }
        }
        let reserve_bytes = reserve_segment_count as u64 * shapes.geometry().segment_size_bytes();
        capacity_bytes.saturating_sub(reserve_bytes + live_elsewhere_bytes)
    }

    /// Moves the data of every segment `goal` names into segments laid out
    /// over the devices in use now. Refused while a rebuild runs.
    pub(in crate::pool) async fn run(
        &self,
        goal: EvacuationGoal,
    ) -> Result<RebuildStatus, EngineError> {
        if !self.core.rebuild().start(goal.kind()) {
            return Err(EngineError::Io(IoError::RebuildRunning));
        }
        tracing::warn!(?goal, need = ?self.need_for(goal), "moving data to segments laid out over the devices in use");
        let result = self.evacuate_all(goal).await;
        self.core.rebuild().end(result)
    }

    async fn evacuate_all(&self, goal: EvacuationGoal) -> Result<(), EngineError> {
        let mut passes_without_progress = 0;
        while passes_without_progress < EVACUATION_PASSES_WITHOUT_PROGRESS_MAX {
            // The metadata first: it is small, and every flush writes it.
            // Again at every pass, for a device lost during the last one.
            self.core
                .device()
                .restore_metadata_redundancy()
                .await
                .map_err(EngineError::Device)?;
            self.lay_out_free_segments().await?;
            let sealed = self
                .core
                .lock()
                .close_heads_where(|layout| goal.moves(layout));
            self.core.spawn_writes(sealed);
            // What is left to move, on top of what moved, counted once the
            // heads that `goal` moves are closed: until then clients write
            // into them (for as long as the free segments take to lay out),
            // and a total counted before ran behind what the pass then
            // moved (202% done behind the disk model).
            self.count_total_left(goal);
            let victims = self.victims(goal);
            if victims.is_empty() {
                // Checkpoint bodies in such segments move with the next two
                // checkpoints; then none is left.
                if self.checkpoint_bodies_to_move(goal) {
                    self.checkpointer.checkpoint_base().await?;
                    self.checkpointer.checkpoint_base().await?;
                    continue;
                }
                return Ok(());
            }
            let moved = self.evacuate_victims(victims).await?;
            let Some(moved) = moved else {
                tracing::warn!("rebuild onto spare space stopped: a replacement takes over");
                return Ok(());
            };
            // Emptied victims become free through the flush and checkpoints.
            self.core.flush_all().await?;
            self.checkpointer.checkpoint().await?;
            self.checkpointer.checkpoint().await?;
            if moved.emptied_count == 0 {
                passes_without_progress += 1;
            } else {
                passes_without_progress = 0;
            }
            if moved.out_of_space {
                tokio::time::sleep(std::time::Duration::from_millis(
                    EVACUATION_NO_SPACE_WAIT_MS,
                ))
                .await;
            }
        }
        let left = self.need_for(goal);
        if left.degraded_segment_count == 0 {
            return Ok(());
        }
        Err(EngineError::Io(IoError::EvacuationStalled {
            segment_count: left.degraded_segment_count,
            passes: EVACUATION_PASSES_WITHOUT_PROGRESS_MAX,
        }))
    }

    /// Sets the rebuild's total to what moved so far plus the live data of
    /// the segments `goal` moves now. Sealed segments only lose live data
    /// (nothing writes them), so the pass's moves stay within it.
    fn count_total_left(&self, goal: EvacuationGoal) {
        let need = self.need_for(goal);
        let done = self.core.rebuild().bytes_done.load(Ordering::Relaxed);
        self.core
            .rebuild()
            .bytes_total
            .store(done + need.live_bytes, Ordering::Relaxed);
    }

    /// Moves `victims` in order, until one finds no free space to move
    /// into (the rest would too). `None` when a replacement takes over.
    async fn evacuate_victims(&self, victims: Vec<u32>) -> Result<Option<PassMoves>, EngineError> {
        let mut moves = PassMoves::default();
        for victim in victims {
            if self.evacuation_must_stop()? {
                return Ok(None);
            }
            // Victims emptied earlier may have been freed since (by a
            // periodic checkpoint): laid out again before anything writes
            // them, they do not come back as victims of the next pass.
            self.lay_out_free_segments().await?;
            match self.evacuate_segment(victim).await? {
                SegmentMove::Emptied => moves.emptied_count += 1,
                SegmentMove::Partly => {}
                SegmentMove::OutOfSpace => {
                    moves.out_of_space = true;
                    break;
                }
            }
        }
        Ok(Some(moves))
    }

    /// Lays every free segment still laid out over the lost device out
    /// again, in batches (one device update each: an array writes its zone
    /// table once per batch, not once per segment, which behind a disk was
    /// minutes before the first byte moved). A batch's segments are out of
    /// the free list meanwhile, so nothing writes them; at most half of a
    /// tier's free segments go into one, so that writers keep some.
    async fn lay_out_free_segments(&self) -> Result<(), EngineError> {
        // As many as need it now: a segment that still does after its
        // batch (a device lost meanwhile) waits for the next call.
        let mut left = self
            .need_for(EvacuationGoal::Redundancy)
            .free_segments_to_lay_out;
        while left > 0 {
            if self.evacuation_must_stop()? {
                return Ok(());
            }
            let batch = self.take_free_segments_to_lay_out();
            if batch.is_empty() {
                return Ok(());
            }
            left = left.saturating_sub(batch.len());
            let opened = self.core.shapes().open_many(&batch).await;
            {
                let mut state = self.core.lock();
                for segment_index in &batch {
                    state.return_free_segment(*segment_index);
                }
            }
            opened.map_err(EngineError::Device)?;
        }
        Ok(())
    }

    /// Takes the next batch of free segments to lay out again out of the
    /// free lists: at most [`FREE_SEGMENTS_LAID_OUT_PER_BATCH_MAX`], and at
    /// most half of the free segments of their tier (at least one).
    fn take_free_segments_to_lay_out(&self) -> Vec<u32> {
        let shapes = self.core.shapes();
        let mut state = self.core.lock();
        let geometry = shapes.geometry();
        let half_of_free = |tier: Tier, space: &SpaceAllocator| {
            let free = match tier {
                Tier::Flash => space.free_flash_segment_count(),
                Tier::Capacity => space.free_capacity_segment_count(),
            };
            free.div_ceil(2)
        };
        let mut flash_left = half_of_free(Tier::Flash, state.space());
        let mut capacity_left = half_of_free(Tier::Capacity, state.space());
        let candidates: Vec<u32> = state
            .space()
            .free_segments()
            .filter(|index| shapes.needs_layout(*index))
            .collect();
        let mut batch = Vec::new();
        for segment_index in candidates {
            if batch.len() == FREE_SEGMENTS_LAID_OUT_PER_BATCH_MAX {
                break;
            }
            let left = match geometry.tier_of_segment(segment_index) {
                Tier::Flash => &mut flash_left,
                Tier::Capacity => &mut capacity_left,
            };
            if *left == 0 {
                continue;
            }
            if state.take_free_segment_to_lay_out(segment_index) {
                *left -= 1;
                batch.push(segment_index);
            }
        }
        batch
    }

    /// Sealed segments `goal` moves, fewest live blocks first (each frees
    /// the most space for its cost, so that the move needs the least room).
    fn victims(&self, goal: EvacuationGoal) -> Vec<u32> {
        let shapes = self.core.shapes();
        let state = self.core.lock();
        let mut victims: Vec<(u32, u32)> = state
            .space()
            .segments()
            .iter()
            .enumerate()
            .filter(|(_, segment)| segment.state == SegmentState::Sealed)
            .map(|(index, segment)| {
                let index = u32::try_from(index).expect("segment indexes fit in u32");
                (index, segment.live_blocks())
            })
            .filter(|(index, _)| goal.moves(&shapes.layout(*index)))
            .collect();
        victims.sort_by_key(|(index, live_blocks)| (*live_blocks, *index));
        victims.into_iter().map(|(index, _)| index).collect()
    }

    fn checkpoint_bodies_to_move(&self, goal: EvacuationGoal) -> bool {
        let shapes = self.core.shapes();
        let state = self.core.lock();
        state
            .space()
            .segments()
            .iter()
            .enumerate()
            .any(|(index, segment)| {
                let index = u32::try_from(index).expect("segment indexes fit in u32");
                matches!(segment.state, SegmentState::Checkpoint { .. })
                    && goal.moves(&shapes.layout(index))
            })
    }

    /// Whether the evacuation must stop: the pool closes, or a replacement
    /// was begun (its rebuild restores the lost member instead).
    fn evacuation_must_stop(&self) -> Result<bool, EngineError> {
        if self.core.supervisor().is_stopping() {
            return Err(EngineError::Io(IoError::RebuildInterrupted));
        }
        Ok(self.core.device().rebuild_pending())
    }

    /// Moves one segment's live blocks, paced by the budget; counts them
    /// done once the segment is empty.
    async fn evacuate_segment(&self, victim: u32) -> Result<SegmentMove, EngineError> {
        let live_bytes =
            u64::from(self.core.lock().space().segment(victim).live_blocks()) * BLOCK_SIZE_BYTES;
        self.core
            .budget()
            .acquire(BackgroundWork::Rebuild, live_bytes.max(BLOCK_SIZE_BYTES))
            .await;
        let _guard = self.core.cleaner_lock().lock().await;
        let moved = match self.cleaner.clean_degraded_victim(victim).await {
            Ok(true) => SegmentMove::Emptied,
            Ok(false) => SegmentMove::Partly,
            // The cleaner's reserve is used up: the flush and checkpoints
            // after this pass free what was emptied.
            Err(EngineError::Io(IoError::NoSpace)) => SegmentMove::OutOfSpace,
            Err(error) => return Err(error),
        };
        if moved == SegmentMove::Emptied {
            self.core
                .rebuild()
                .bytes_done
                .fetch_add(live_bytes, Ordering::Relaxed);
        }
        Ok(moved)
    }
}

/// What moving one segment did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SegmentMove {
    Emptied,
    /// Some blocks stayed (written to it meanwhile, or it could not all be
    /// read): the next pass takes it again.
    Partly,
    /// No free space to move into.
    OutOfSpace,
}

/// What a pass over the victims did.
#[derive(Clone, Copy, Debug, Default)]
struct PassMoves {
    emptied_count: usize,
    out_of_space: bool,
}
